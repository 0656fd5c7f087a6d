/* TFRecord: records of [u64 length][u32 masked CRC32C of length][data][u32 masked CRC32C of
 * data], little endian. Both CRCs are checked on every read. The offset index is built on
 * first open by walking the length headers; it is kept in memory and, when the directory is
 * writable, in a sidecar file PATH.bwidx that is validated before use (see load_sidecar). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "common/util.h"
#include "formats/formats.h"
#include "formats/tfrecord.h"

typedef struct tfr {
    uint64_t *offsets;
    uint64_t n;
} tfr;

/* Checks the header at off; on success *len is the data length (0 on failure). */
static int header(const bw__source *s, uint64_t off, uint64_t *len, char *err, size_t errlen)
{
    *len = 0;
    const uint8_t *b = s->map->base;
    if (s->size - off < 12)
        return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen,
                            "truncated record header: %llu bytes left, 12 needed",
                            (unsigned long long)(s->size - off));
    uint32_t want = bw__get_le32(b + off + 8), got = bw__crc32c_mask(bw__crc32c(0, b + off, 8));
    if (want != got)
        return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen,
                            "length CRC mismatch (stored 0x%08x, computed 0x%08x): not a record "
                            "boundary or corrupt",
                            want, got);
    uint64_t l = bw__get_le64(b + off);
    if (l > s->size - off - 12 || s->size - off - 12 - l < 4)
        return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen,
                            "truncated record: length %llu announced, %llu bytes left",
                            (unsigned long long)l, (unsigned long long)(s->size - off - 12));
    *len = l;
    return BW_OK;
}

static int record_at(const bw__source *s, uint64_t off, bw__record *r, uint64_t *next, char *err,
                     size_t errlen)
{
    bw__record_init(r);
    *next = off; /* until the record is known good */
    uint64_t len;
    int rc = header(s, off, &len, err, errlen);
    if (rc != BW_OK)
        return rc;
    const uint8_t *data = s->map->base + off + 12;
    uint32_t want = bw__get_le32(data + len), got = bw__crc32c_mask(bw__crc32c(0, data, len));
    if (want != got)
        return bw__fmt_fail(s, BW_CORRUPT, off, err, errlen,
                            "data CRC mismatch in a record of %llu bytes (stored 0x%08x, "
                            "computed 0x%08x)",
                            (unsigned long long)len, want, got);
    r->nparts = 1;
    r->parts[0].p = data;
    r->parts[0].len = len;
    r->size = len;
    r->owner = s->map;
    *next = off + 16 + len;
    return BW_OK;
}

static int tfr_open(bw__source *s, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    s->state = calloc(1, sizeof(tfr));
    return s->state ? BW_OK : BW_NOMEM;
}

enum { SIDECAR_HEAD = 32 };
static const char sidecar_magic[8] = {'B', 'W', 'T', 'F', 'I', 'D', 'X', '1'};

int bw__tfrecord_index_parse(bw__source *s, const uint8_t *b, size_t len, char *why, size_t whylen)
{
    tfr *st = s->state;
    if (len < SIDECAR_HEAD + 4 || memcmp(b, sidecar_magic, 8) != 0) {
        snprintf(why, whylen, "bad magic or too short");
        return BW_CORRUPT;
    }
    uint64_t size = bw__get_le64(b + 8), mtime = bw__get_le64(b + 16), n = bw__get_le64(b + 24);
    if (size != s->size || (int64_t)mtime != s->mtime_ns) {
        snprintf(why, whylen, "made for another version of the file (size or mtime differ)");
        return BW_CORRUPT;
    }
    if (n > (len - SIDECAR_HEAD - 4) / 8 || SIDECAR_HEAD + 8 * n + 4 != len) {
        snprintf(why, whylen, "length does not match its record count");
        return BW_CORRUPT;
    }
    if (bw__get_le32(b + len - 4) != bw__crc32c(0, b, len - 4)) {
        snprintf(why, whylen, "CRC mismatch");
        return BW_CORRUPT;
    }
    uint64_t *offs = malloc((n ? n : 1) * sizeof(*offs));
    if (!offs)
        return BW_NOMEM;
    uint64_t prev = 0;
    for (uint64_t i = 0; i < n; i++) {
        offs[i] = bw__get_le64(b + SIDECAR_HEAD + 8 * i);
        /* Records are at least 16 bytes apart and start at 0; ->get rechecks each header and
         * that it ends where the next one starts, so a wrong index cannot give wrong data. */
        if ((i == 0 && offs[i] != 0) || (i > 0 && offs[i] - prev < 16) || offs[i] < prev ||
            s->size < 16 || offs[i] > s->size - 16) {
            snprintf(why, whylen, "offset %llu of record %llu is impossible",
                     (unsigned long long)offs[i], (unsigned long long)i);
            free(offs);
            return BW_CORRUPT;
        }
        prev = offs[i];
    }
    /* The last record must end at the end of the file. */
    uint64_t len_last;
    char e2[256];
    if ((n == 0 && s->size != 0) ||
        (n > 0 && (header(s, offs[n - 1], &len_last, e2, sizeof(e2)) != BW_OK ||
                   offs[n - 1] + 16 + len_last != s->size))) {
        free(offs);
        snprintf(why, whylen, "its last record does not end at the end of the file");
        return BW_CORRUPT;
    }
    free(st->offsets);
    st->offsets = offs;
    st->n = n;
    return BW_OK;
}

static void sidecar_path(const bw__source *s, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s.bwidx", s->abspath);
}

static bool load_sidecar(bw__source *s)
{
    char path[4200];
    sidecar_path(s, path, sizeof(path));
    /* O_NONBLOCK: a FIFO in the sidecar's place must not block the opening thread (it is
     * refused by the fstat below). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return false;
    struct stat st;
    bool ok = false;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        (uint64_t)st.st_size <= 8 * s->size + 64) {
        bw__mapping *m = bw__mapping_map(fd, (size_t)st.st_size);
        char why[256];
        if (m) {
            ok = bw__tfrecord_index_parse(s, m->base, m->len, why, sizeof(why)) == BW_OK;
            if (!ok)
                BW_WARN("ignoring the index sidecar; rebuilding it source=%s sidecar=%s err=%s",
                        s->path, path, why);
            bw__mapping_unref(m);
        }
    }
    close(fd);
    return ok;
}

static void save_sidecar(const bw__source *s)
{
    const tfr *st = s->state;
    size_t len = SIDECAR_HEAD + 8 * st->n + 4;
    uint8_t *b = malloc(len);
    if (!b)
        return;
    memcpy(b, sidecar_magic, 8);
    bw__put_le64(b + 8, s->size);
    bw__put_le64(b + 16, (uint64_t)s->mtime_ns);
    bw__put_le64(b + 24, st->n);
    for (uint64_t i = 0; i < st->n; i++)
        bw__put_le64(b + SIDECAR_HEAD + 8 * i, st->offsets[i]);
    uint32_t crc = bw__crc32c(0, b, len - 4);
    for (int i = 0; i < 4; i++)
        b[len - 4 + i] = (uint8_t)(crc >> (8 * i));
    char path[4200], tmp[4300];
    sidecar_path(s, path, sizeof(path));
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) {
        bool ok = write(fd, b, len) == (ssize_t)len;
        ok = close(fd) == 0 && ok;
        if (ok && rename(tmp, path) == 0)
            BW_DEBUG("wrote the index sidecar source=%s sidecar=%s records=%llu", s->path, path,
                     (unsigned long long)st->n);
        else
            unlink(tmp);
    }
    free(b);
}

static int tfr_index(bw__source *s, char *err, size_t errlen)
{
    tfr *st = s->state;
    if (s->sidecar_writable && s->abspath[0] && load_sidecar(s)) {
        s->count = st->n;
        s->indexed = true;
        return bw__source_charge(s, st->n * sizeof(uint64_t), err, errlen);
    }
    uint64_t cap = 1024, n = 0, off = 0;
    int crc = bw__source_charge(s, cap * sizeof(uint64_t), err, errlen);
    if (crc != BW_OK)
        return crc;
    uint64_t *offs = malloc(cap * sizeof(*offs));
    if (!offs)
        return BW_NOMEM;
    while (off < s->size) {
        uint64_t len;
        int rc = header(s, off, &len, err, errlen);
        if (rc != BW_OK) {
            free(offs);
            return rc;
        }
        if (n == cap) {
            if ((rc = bw__source_charge(s, cap * sizeof(*offs), err, errlen)) != BW_OK) {
                free(offs);
                return rc;
            }
            uint64_t *no = realloc(offs, 2 * cap * sizeof(*offs));
            if (!no) {
                free(offs);
                return BW_NOMEM;
            }
            offs = no;
            cap *= 2;
        }
        offs[n++] = off;
        off += 16 + len;
        bw__source_progress(s, off);
    }
    free(st->offsets);
    st->offsets = offs;
    st->n = n;
    s->count = n;
    s->indexed = true;
    if (s->sidecar_writable && s->abspath[0])
        save_sidecar(s);
    return BW_OK;
}

static int tfr_get(bw__source *s, uint64_t i, bw__record *r, char *err, size_t errlen)
{
    const tfr *st = s->state;
    if (i >= st->n)
        return bw__fmt_fail(s, BW_OUT_OF_RANGE, s->size, err, errlen,
                            "record %llu requested but the file has %llu", (unsigned long long)i,
                            (unsigned long long)st->n);
    uint64_t next;
    int rc = record_at(s, st->offsets[i], r, &next, err, errlen);
    if (rc == BW_OK && next != (i + 1 < st->n ? st->offsets[i + 1] : s->size))
        return bw__fmt_fail(s, BW_CORRUPT, st->offsets[i], err, errlen,
                            "record %llu does not end where the index says the next begins",
                            (unsigned long long)i);
    return rc;
}

static int tfr_next(bw__source *s, uint64_t off, bw__record *r, uint64_t *next, char *err,
                    size_t errlen)
{
    if (off == s->size)
        return BW_FMT_END;
    if (off > s->size)
        return bw__fmt_fail(s, BW_OUT_OF_RANGE, off, err, errlen,
                            "offset past the end (%llu bytes)", (unsigned long long)s->size);
    return record_at(s, off, r, next, err, errlen);
}

static void tfr_close(bw__source *s)
{
    tfr *st = s->state;
    if (st)
        free(st->offsets);
    free(st);
    s->state = NULL;
}

static uint64_t tfr_offset(const bw__source *s, uint64_t i)
{
    const tfr *st = s->state;
    return i < st->n ? st->offsets[i] : s->size;
}

const bw__format_ops bw__fmt_tfrecord = {
    .name = "tfrecord",
    .open = tfr_open,
    .index = tfr_index,
    .get = tfr_get,
    .next = tfr_next,
    .offset = tfr_offset,
    .close = tfr_close,
};
