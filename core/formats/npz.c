/* NumPy .npz archives (np.savez): a zip file whose members are .npy files. This file owns the
 * zip parsing -- the end of central directory (zip64 too: numpy writes every member with
 * force_zip64), the central directory and the local headers -- and the npz format, one array
 * of an archive (bw__source.member) served in place with the .npy reader (npy.c). Only stored
 * (uncompressed) members can be served from the mapping: a compressed archive
 * (np.savez_compressed) is refused with a sentence saying how to write one that is not.
 * dataset.c makes every array of the archives a field (docs/formats.md, "Named arrays"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"

enum {
    EOCD_SIZE = 22,
    EOCD64_LOC_SIZE = 20,
    EOCD64_SIZE = 56,
    CDH_SIZE = 46,
    LFH_SIZE = 30,
    MAX_COMMENT = 65535,
};

static uint16_t u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t u64(const uint8_t *p)
{
    return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32;
}

/* The central directory: where it starts and how many entries it has. */
typedef struct zip_dir {
    uint64_t off, size, entries;
} zip_dir;

static int find_dir(const bw__source *s, zip_dir *z, char *err, size_t errlen)
{
    const uint8_t *b = s->map->base;
    uint64_t len = s->size;
    if (len < EOCD_SIZE)
        return bw__fmt_fail(s, BW_CORRUPT, 0, err, errlen,
                            "not a .npz file (too short for a zip archive)");
    uint64_t lo = len - EOCD_SIZE > MAX_COMMENT ? len - EOCD_SIZE - MAX_COMMENT : 0;
    uint64_t at = len - EOCD_SIZE;
    bool found = false;
    for (;; at--) { /* the record whose comment ends the file, searched from the end */
        if (u32(b + at) == 0x06054b50 && at + EOCD_SIZE + u16(b + at + 20) == len) {
            found = true;
            break;
        }
        if (at == lo)
            break;
    }
    if (!found)
        return bw__fmt_fail(s, BW_CORRUPT, len, err, errlen,
                            "not a .npz file (no zip end of central directory record)");
    const uint8_t *e = b + at;
    z->entries = u16(e + 10);
    z->size = u32(e + 12);
    z->off = u32(e + 16);
    if (z->entries == 0xffff || z->size == 0xffffffffu || z->off == 0xffffffffu) {
        /* zip64: the locator just before, pointing at the zip64 end record */
        if (at < EOCD64_LOC_SIZE || u32(b + at - EOCD64_LOC_SIZE) != 0x07064b50)
            return bw__fmt_fail(s, BW_CORRUPT, at, err, errlen,
                                "zip64 archive without a zip64 end of central directory locator");
        uint64_t off64 = u64(b + at - EOCD64_LOC_SIZE + 8);
        if (off64 > len - EOCD64_SIZE || u32(b + off64) != 0x06064b50)
            return bw__fmt_fail(s, BW_CORRUPT, at - EOCD64_LOC_SIZE, err, errlen,
                                "the zip64 end of central directory record is missing");
        z->entries = u64(b + off64 + 32);
        z->size = u64(b + off64 + 40);
        z->off = u64(b + off64 + 48);
    }
    if (z->off > len || z->size > len - z->off)
        return bw__fmt_fail(s, BW_CORRUPT, at, err, errlen,
                            "the central directory (%llu bytes at %llu) is outside the file",
                            (unsigned long long)z->size, (unsigned long long)z->off);
    return BW_OK;
}

/* One member, from its central directory entry at *pos (advanced past it). */
typedef struct zip_member {
    const char *name;
    size_t name_len;
    uint16_t method, flags;
    uint64_t csize, usize, header; /* header: its local header's offset */
} zip_member;

static int next_member(const bw__source *s, const zip_dir *z, uint64_t *pos, zip_member *m,
                       char *err, size_t errlen)
{
    const uint8_t *b = s->map->base;
    uint64_t end = z->off + z->size;
    if (*pos > end || end - *pos < CDH_SIZE || u32(b + *pos) != 0x02014b50)
        return bw__fmt_fail(s, BW_CORRUPT, *pos, err, errlen,
                            "malformed zip central directory entry");
    const uint8_t *h = b + *pos;
    size_t nl = u16(h + 28), xl = u16(h + 30), cl = u16(h + 32);
    if (end - *pos - CDH_SIZE < (uint64_t)nl + xl + cl)
        return bw__fmt_fail(s, BW_CORRUPT, *pos, err, errlen,
                            "zip central directory entry runs past the directory");
    m->flags = u16(h + 8);
    m->method = u16(h + 10);
    m->csize = u32(h + 20);
    m->usize = u32(h + 24);
    m->header = u32(h + 42);
    m->name = (const char *)h + CDH_SIZE;
    m->name_len = nl;
    /* zip64 extra field: the 64-bit values of the fields that are 0xffffffff, in order */
    const uint8_t *x = h + CDH_SIZE + nl, *xe = x + xl;
    while (xe - x >= 4) {
        uint16_t id = u16(x), sz = u16(x + 2);
        if ((size_t)(xe - x - 4) < sz)
            break;
        if (id == 0x0001) {
            const uint8_t *v = x + 4, *ve = v + sz;
            uint64_t *fields[3] = {&m->usize, &m->csize, &m->header};
            for (size_t i = 0; i < 3; i++)
                if (*fields[i] == 0xffffffffu) {
                    if (ve - v < 8)
                        return bw__fmt_fail(s, BW_CORRUPT, *pos, err, errlen,
                                            "truncated zip64 extra field");
                    *fields[i] = u64(v);
                    v += 8;
                }
        }
        x += 4 + sz;
    }
    *pos += CDH_SIZE + nl + xl + cl;
    return BW_OK;
}

/* A member that can be served in place: stored, not encrypted, "NAME.npy". */
static int check_member(const bw__source *s, const zip_member *m, uint64_t at, char *err,
                        size_t errlen)
{
    if (m->flags & 1)
        return bw__fmt_fail(s, BW_UNIMPLEMENTED, at, err, errlen, "member '%.*s' is encrypted",
                            (int)m->name_len, m->name);
    if (m->method != 0 || m->csize != m->usize)
        return bw__fmt_fail(
            s, BW_UNIMPLEMENTED, at, err, errlen,
            "member '%.*s' is compressed (zip method %u): batchwire serves arrays in place and "
            "reads only uncompressed archives; write it with np.savez (not "
            "np.savez_compressed), or save each array with np.save",
            (int)m->name_len, m->name, m->method);
    if (m->name_len <= 4 || memcmp(m->name + m->name_len - 4, ".npy", 4) != 0)
        return bw__fmt_fail(s, BW_UNIMPLEMENTED, at, err, errlen,
                            "member '%.*s' is not a .npy array (an .npz holds NAME.npy members)",
                            (int)m->name_len, m->name);
    return BW_OK;
}

int bw__npz_members(const bw__source *s, char *names, size_t cap, size_t *n, char *err,
                    size_t errlen)
{
    zip_dir z = {0}; /* read below also when find_dir failed */
    *n = 0;
    int rc = find_dir(s, &z, err, errlen);
    uint64_t pos = z.off;
    size_t used = 0;
    for (uint64_t i = 0; rc == BW_OK && i < z.entries; i++) {
        zip_member m = {0};
        uint64_t at = pos;
        if ((rc = next_member(s, &z, &pos, &m, err, errlen)) != BW_OK ||
            (rc = check_member(s, &m, at, err, errlen)) != BW_OK)
            break;
        if (used + m.name_len - 4 + 1 > cap || *n == BW_FMT_MAX_FIELDS)
            return bw__fmt_fail(s, BW_TOO_BIG, at, err, errlen,
                                "more arrays (or longer names) than a dataset's %d fields",
                                BW_FMT_MAX_FIELDS);
        memcpy(names + used, m.name, m.name_len - 4);
        used += m.name_len - 4;
        names[used++] = '\0';
        (*n)++;
    }
    if (rc == BW_OK && *n == 0)
        rc =
            bw__fmt_fail(s, BW_INVALID_ARGUMENT, z.off, err, errlen, "the archive holds no arrays");
    return rc;
}

/* Finds s->member and opens the array in it; without a member, only checks that the archive
 * lists servable arrays (dataset.c opens it so to learn its fields). */
static int npz_open(bw__source *s, char *err, size_t errlen)
{
    if (!s->member[0]) {
        char names[4096];
        size_t n;
        return bw__npz_members(s, names, sizeof(names), &n, err, errlen);
    }
    zip_dir z = {0}; /* read below also when find_dir failed */
    int rc = find_dir(s, &z, err, errlen);
    uint64_t pos = z.off;
    size_t want = strlen(s->member);
    for (uint64_t i = 0; rc == BW_OK && i < z.entries; i++) {
        zip_member m = {0};
        uint64_t at = pos;
        if ((rc = next_member(s, &z, &pos, &m, err, errlen)) != BW_OK)
            break;
        if (m.name_len != want || (want && memcmp(m.name, s->member, want) != 0))
            continue;
        if ((rc = check_member(s, &m, at, err, errlen)) != BW_OK)
            return rc;
        const uint8_t *b = s->map->base;
        if (m.header > s->size || s->size - m.header < LFH_SIZE || u32(b + m.header) != 0x04034b50)
            return bw__fmt_fail(s, BW_CORRUPT, m.header, err, errlen,
                                "member '%s': no local file header", s->member);
        uint64_t data = m.header + LFH_SIZE + u16(b + m.header + 26) + u16(b + m.header + 28);
        if (data > s->size || m.usize > s->size - data)
            return bw__fmt_fail(s, BW_CORRUPT, m.header, err, errlen,
                                "member '%s': its %llu bytes run past the end of the file",
                                s->member, (unsigned long long)m.usize);
        return bw__npy_open_at(s, data, m.usize, err, errlen);
    }
    if (rc == BW_OK)
        rc = bw__fmt_fail(s, BW_NOT_FOUND, z.off, err, errlen, "the archive has no member '%s'",
                          s->member);
    return rc;
}

/* An archive opened without a member (listed only) has no rows. */
static int npz_index(bw__source *s, char *err, size_t errlen)
{
    if (!s->state)
        return bw__fmt_fail(s, BW_FAILED_PRECONDITION, 0, err, errlen,
                            "an .npz archive is read one member (array) at a time");
    return bw__npy_index(s, err, errlen);
}

const bw__format_ops bw__fmt_npz = {
    .name = "npz",
    .open = npz_open,
    .index = npz_index,
    .get = bw__npy_get,
    .next = NULL,
    .locate = bw__npy_locate,
    .back_to_back = true,
    .close = bw__npy_close,
};
