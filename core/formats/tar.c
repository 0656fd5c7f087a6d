/* WebDataset-style tar: POSIX ustar / pax / GNU archives whose regular files are grouped into
 * samples by key. A member "dir/abc.seg.png" has key "dir/abc" (the path up to the first '.' of
 * its file name) and field "seg.png"; consecutive members with the same key form one sample.
 * Members that are not regular files, or whose file name has no '.', are skipped (as
 * WebDataset does). Each header's checksum is verified; sizes and pax records are bounds-
 * checked. A sample's record offset is the offset of its first member's first header. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"

typedef struct member {
    uint64_t hdr_off; /* first header, extended headers included */
    uint64_t data_off, size;
    uint64_t next; /* offset of the following header */
    char name[4096];
} member;

static uint64_t octal(const uint8_t *p, size_t n, bool *ok)
{
    if (p[0] & 0x80) { /* GNU base-256 */
        if (p[0] != 0x80) {
            *ok = false; /* negative or more than 64 bits */
            return 0;
        }
        uint64_t v = 0;
        for (size_t i = 1; i < n; i++) {
            if (v >> 56) {
                *ok = false;
                return 0;
            }
            v = v << 8 | p[i];
        }
        return v;
    }
    size_t i = 0;
    while (i < n && p[i] == ' ')
        i++;
    uint64_t v = 0;
    bool digits = false;
    for (; i < n && p[i] >= '0' && p[i] <= '7'; i++) {
        if (v >> 60) {
            *ok = false;
            return 0;
        }
        v = v * 8 + (uint64_t)(p[i] - '0');
        digits = true;
    }
    for (; i < n; i++)
        if (p[i] != ' ' && p[i] != '\0')
            *ok = false;
    if (!digits)
        *ok = false;
    return v;
}

static bool zero_block(const uint8_t *p)
{
    for (int i = 0; i < 512; i++)
        if (p[i])
            return false;
    return true;
}

static void copy_name(char *out, size_t outlen, const uint8_t *p, size_t n)
{
    size_t len = strnlen((const char *)p, n);
    if (len >= outlen)
        len = outlen - 1;
    memcpy(out, p, len);
    out[len] = '\0';
}

/* Parses pax records "LEN key=value\n" for path and size. */
static int pax(const bw__source *s, uint64_t off, const uint8_t *p, uint64_t n, char *path,
               size_t pathlen, uint64_t *size, bool *has_size, char *err, size_t errlen)
{
    uint64_t i = 0;
    while (i < n) {
        uint64_t len = 0, j = i;
        while (j < n && p[j] >= '0' && p[j] <= '9' && len < (1u << 30))
            len = len * 10 + (uint64_t)(p[j++] - '0');
        if (j == i || j >= n || p[j] != ' ' || len < j - i + 3 || len > n - i ||
            p[i + len - 1] != '\n')
            return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen, "malformed pax record");
        const uint8_t *kv = p + j + 1, *end = p + i + len - 1;
        const uint8_t *eq = memchr(kv, '=', (size_t)(end - kv));
        if (!eq)
            return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen, "pax record without '='");
        size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
        if (klen == 4 && memcmp(kv, "path", 4) == 0) {
            if (vlen >= pathlen)
                return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen, "pax path too long");
            memcpy(path, eq + 1, vlen);
            path[vlen] = '\0';
        } else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
            uint64_t v = 0;
            if (vlen == 0 || vlen > 19)
                return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen, "bad pax size");
            for (size_t k = 0; k < vlen; k++) {
                if (eq[1 + k] < '0' || eq[1 + k] > '9')
                    return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen, "bad pax size");
                v = v * 10 + (uint64_t)(eq[1 + k] - '0');
            }
            *size = v;
            *has_size = true;
        }
        i += len;
    }
    return BW_OK;
}

/* The next regular-file member at or after off: BW_OK, BW_FMT_END or an error. */
static int next_member(const bw__source *s, uint64_t off, member *m, char *err, size_t errlen)
{
    const uint8_t *b = s->map->base;
    char long_name[4096] = "";
    bool has_long = false, has_size = false;
    uint64_t pax_size = 0;
    m->hdr_off = off;
    for (;;) {
        if (off == s->size)
            return BW_FMT_END; /* no end-of-archive blocks: accepted */
        if (off > s->size || s->size - off < 512)
            return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen,
                                "truncated tar header: %llu bytes left, 512 needed",
                                (unsigned long long)(s->size - (off < s->size ? off : s->size)));
        const uint8_t *h = b + off;
        if (zero_block(h))
            return BW_FMT_END;
        bool ok = true;
        uint64_t want = octal(h + 148, 8, &ok);
        uint64_t sum = 0;
        int64_t ssum = 0;
        for (int i = 0; i < 512; i++) {
            uint8_t c = (i >= 148 && i < 156) ? ' ' : h[i];
            sum += c;
            ssum += (int8_t)c;
        }
        if (!ok || (want != sum && (int64_t)want != ssum))
            return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen,
                                "tar header checksum mismatch (stored %llo, computed %llo)",
                                (unsigned long long)want, (unsigned long long)sum);
        uint64_t size = octal(h + 124, 12, &ok);
        if (!ok)
            return bw__fmt_fail(s, BW_CORRUPT, off + 124, err, errlen, "bad size field");
        char type = (char)h[156];
        if (has_size && type != 'x' && type != 'g' && type != 'L' && type != 'K')
            size = pax_size;
        uint64_t data = off + 512;
        if (size > s->size - data)
            return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen,
                                "truncated tar member: %llu bytes announced, %llu left",
                                (unsigned long long)size, (unsigned long long)(s->size - data));
        uint64_t padded = (size + 511) & ~(uint64_t)511;
        uint64_t next = s->size - data >= padded ? data + padded : s->size;
        if (type == 'x') {
            int rc = pax(s, off, b + data, size, long_name, sizeof(long_name), &pax_size, &has_size,
                         err, errlen);
            if (rc != BW_OK)
                return rc;
            has_long = long_name[0] != '\0';
        } else if (type == 'L') {
            copy_name(long_name, sizeof(long_name), b + data, (size_t)size);
            has_long = true;
        } else if (type == '0' || type == '\0' || type == '7') {
            if (has_long) {
                memcpy(m->name, long_name, sizeof(long_name));
            } else if (memcmp(h + 257, "ustar", 5) == 0 && h[345]) {
                char prefix[160], name[104];
                copy_name(prefix, sizeof(prefix), h + 345, 155);
                copy_name(name, sizeof(name), h, 100);
                snprintf(m->name, sizeof(m->name), "%s/%s", prefix, name);
            } else {
                copy_name(m->name, sizeof(m->name), h, 100);
            }
            m->data_off = data;
            m->size = size;
            m->next = next;
            return BW_OK;
        } else if (type != 'g' && type != 'K') {
            /* directories, links, devices: not samples; start over after them */
            has_long = has_size = false;
            long_name[0] = '\0';
            m->hdr_off = next;
        }
        off = next;
    }
}

/* Splits "dir/abc.seg.png" into key length and extension; false when the file name has no
 * '.'. */
static bool split(const char *name, size_t *keylen, const char **ext)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    const char *dot = strchr(base, '.');
    if (!dot || dot == base)
        return false;
    *keylen = (size_t)(dot - name);
    *ext = dot + 1;
    return true;
}

static int add_text(bw__record *r, const char *p, size_t len, uint32_t *at)
{
    if (len + 1 > sizeof(r->text) - r->textlen)
        return -1;
    *at = r->textlen;
    memcpy(r->text + r->textlen, p, len);
    r->text[r->textlen + len] = '\0';
    r->textlen += (uint32_t)len + 1;
    return 0;
}

/* The sample starting at off (skipping unusable members); *next is where the next begins. */
static int sample_at(const bw__source *s, uint64_t off, bw__record *r, uint64_t *next,
                     uint64_t *start, char *err, size_t errlen)
{
    bw__record_init(r);
    member m = {0};
    size_t keylen = 0;
    const char *ext;
    int rc;
    for (;;) {
        rc = next_member(s, off, &m, err, errlen);
        if (rc != BW_OK)
            return rc;
        if (split(m.name, &keylen, &ext))
            break;
        off = m.next;
    }
    *start = m.hdr_off;
    r->nparts = 0;
    r->size = 0;
    r->textlen = 0;
    r->has_names = true;
    r->owner = s->map;
    if (add_text(r, m.name, keylen, &r->key) != 0)
        return bw__fmt_fail(s, BW_CORRUPT, m.hdr_off, err, errlen, "sample key too long");
    char key[4096];
    memcpy(key, m.name, keylen);
    key[keylen] = '\0';
    for (;;) {
        if (r->nparts == BW_FMT_MAX_FIELDS)
            return bw__fmt_fail(s, BW_TOO_BIG, m.hdr_off, err, errlen,
                                "sample '%s' has more than %d fields", key, BW_FMT_MAX_FIELDS);
        for (size_t i = 0; i < r->nparts; i++)
            if (strcmp(r->text + r->names[i], ext) == 0)
                return bw__fmt_fail(s, BW_CORRUPT, m.hdr_off, err, errlen,
                                    "sample '%s' has field '%s' twice", key, ext);
        if (add_text(r, ext, strlen(ext), &r->names[r->nparts]) != 0)
            return bw__fmt_fail(s, BW_CORRUPT, m.hdr_off, err, errlen, "field names too long");
        r->parts[r->nparts].p = s->map->base + m.data_off;
        r->parts[r->nparts].len = m.size;
        r->nparts++;
        r->size += m.size;
        /* Peek at the next usable member: same key, same sample. */
        uint64_t after = m.next;
        size_t kl;
        for (;;) {
            rc = next_member(s, after, &m, err, errlen);
            if (rc == BW_FMT_END) {
                *next = m.hdr_off;
                return BW_OK;
            }
            if (rc != BW_OK)
                return rc;
            if (split(m.name, &kl, &ext))
                break;
            after = m.next;
        }
        if (kl != keylen || memcmp(m.name, key, keylen) != 0) {
            *next = m.hdr_off;
            return BW_OK;
        }
    }
}

static int tar_index(bw__source *s, char *err, size_t errlen)
{
    bw__starts b = {NULL, 0, 0};
    bw__record *r = malloc(sizeof(*r));
    int rc = r ? BW_OK : BW_NOMEM;
    for (uint64_t off = 0; rc == BW_OK;) {
        uint64_t next, start;
        rc = sample_at(s, off, r, &next, &start, err, errlen);
        if (rc == BW_OK)
            rc = bw__starts_push(s, &b, start, err, errlen);
        off = next;
        bw__source_progress(s, off);
    }
    free(r);
    if (rc != BW_FMT_END) {
        free(b.at);
        return rc;
    }
    bw__starts_install(s, &b);
    return BW_OK;
}

static int tar_get(bw__source *s, uint64_t i, bw__record *r, char *err, size_t errlen)
{
    const bw__starts *st = s->state;
    if (i >= st->n)
        return bw__fmt_fail(s, BW_OUT_OF_RANGE, s->size, err, errlen,
                            "sample %llu requested but the archive has %llu", (unsigned long long)i,
                            (unsigned long long)st->n);
    uint64_t next, start;
    int rc = sample_at(s, st->at[i], r, &next, &start, err, errlen);
    if (rc == BW_FMT_END)
        rc = bw__fmt_fail(s, BW_CORRUPT, st->at[i], err, errlen, "sample vanished");
    return rc;
}

static int tar_next(bw__source *s, uint64_t off, bw__record *r, uint64_t *next, char *err,
                    size_t errlen)
{
    if (off > s->size)
        return bw__fmt_fail(s, BW_OUT_OF_RANGE, off, err, errlen,
                            "offset past the end (%llu bytes)", (unsigned long long)s->size);
    if (off % 512)
        return bw__fmt_fail(s, BW_INVALID_ARGUMENT, off, err, errlen,
                            "not a tar block boundary (resume only from an offset received)");
    uint64_t start;
    return sample_at(s, off, r, next, &start, err, errlen);
}

const bw__format_ops bw__fmt_tar = {
    .name = "tar",
    .open = bw__starts_open,
    .index = tar_index,
    .get = tar_get,
    .next = tar_next,
    .offset = bw__starts_offset,
    .close = bw__starts_close,
};
