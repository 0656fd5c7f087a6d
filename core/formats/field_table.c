/* Field tables: built by the worker in front of a tar sample's fields, parsed (and stripped)
 * by the client. The format is in field_table.h. */
#include "formats/field_table.h"

#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int bw__field_table_prepend(bw__record *r, char *err, size_t errlen)
{
    if (!r->has_names)
        return BW_OK;
    size_t need = 8;
    for (size_t i = 0; i < r->nparts; i++)
        need += 12 + strlen(r->text + r->names[i]);
    size_t room = sizeof(r->text) - r->textlen;
    if (need > room || r->nparts >= BW_FMT_MAX_FIELDS + 1) {
        snprintf(err, errlen,
                 "sample '%s': its %zu fields' table needs %zu bytes, more than a sample's "
                 "names may take",
                 r->text + r->key, r->nparts, need);
        return BW_TOO_BIG;
    }
    uint8_t *t = (uint8_t *)r->text + r->textlen, *w = t;
    memcpy(w, BW_FIELD_TABLE_MAGIC, 4);
    put_u32(w + 4, (uint32_t)r->nparts);
    w += 8;
    for (size_t i = 0; i < r->nparts; i++) {
        const char *name = r->text + r->names[i];
        size_t nl = strlen(name);
        put_u64(w, r->parts[i].len);
        put_u32(w + 8, (uint32_t)nl);
        memcpy(w + 12, name, nl);
        w += 12 + nl;
    }
    r->textlen += (uint32_t)need;
    memmove(&r->parts[1], &r->parts[0], r->nparts * sizeof(r->parts[0]));
    if (r->per_part_owner) /* a member a transform replaced has an owner of its own */
        memmove(&r->owners[1], &r->owners[0], r->nparts * sizeof(r->owners[0]));
    r->parts[0].p = t;
    r->parts[0].len = need;
    r->nparts++;
    r->size += need;
    r->has_names = false;
    return BW_OK;
}

int bw__field_table_parse(const uint8_t *p, size_t len, size_t *table_len, bw__field_ref *out,
                          size_t cap, size_t *n, char *err, size_t errlen)
{
    *n = 0;
    if (len < 8 || memcmp(p, BW_FIELD_TABLE_MAGIC, 4) != 0) {
        snprintf(err, errlen, "the sample does not start with a field table (%zu bytes)", len);
        return BW_CORRUPT;
    }
    uint32_t count = get_u32(p + 4);
    size_t at = 8;
    uint64_t data = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (len - at < 12) {
            snprintf(err, errlen, "field table: entry %u of %u runs past the sample", i, count);
            return BW_CORRUPT;
        }
        uint64_t size = get_u64(p + at);
        uint32_t nl = get_u32(p + at + 8);
        if (len - at - 12 < nl || size > len) {
            snprintf(err, errlen, "field table: entry %u of %u runs past the sample", i, count);
            return BW_CORRUPT;
        }
        if (i >= cap) {
            snprintf(err, errlen, "field table: %u fields, more than %zu", count, cap);
            return BW_TOO_BIG;
        }
        out[i] = (bw__field_ref){(const char *)p + at + 12, nl, size};
        if ((data += size) > len) {
            snprintf(err, errlen,
                     "field table: its fields hold more than the sample's %zu "
                     "bytes",
                     len);
            return BW_CORRUPT;
        }
        at += 12 + nl;
    }
    if (data != len - at) {
        snprintf(err, errlen, "field table: its %u fields hold %llu bytes but %zu follow the table",
                 count, (unsigned long long)data, len - at);
        return BW_CORRUPT;
    }
    *n = count;
    *table_len = at;
    return BW_OK;
}
