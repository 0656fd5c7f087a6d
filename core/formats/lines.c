/* Text lines and JSON Lines: one record per line, without its '\n' (a '\r' before it is kept;
 * a last line without '\n' is a record). "jsonl" skips blank lines (JSON Lines allows them
 * nowhere, writers add them anyway); "text" keeps every line, empty ones included. Contents
 * are not parsed: a line is served as its bytes. */
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"

static bool skip_blank(const bw__source *s)
{
    return s->ops == &bw__fmt_jsonl;
}

static bool is_blank(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r')
            return false;
    return true;
}

/* The line at off: [off, *end) and the offset after its newline. */
static void line_at(const bw__source *s, uint64_t off, uint64_t *end, uint64_t *next)
{
    const uint8_t *b = s->map->base;
    const uint8_t *nl = memchr(b + off, '\n', s->size - off);
    *end = nl ? (uint64_t)(nl - b) : s->size;
    *next = nl ? *end + 1 : s->size;
}

/* The index is 8 bytes a line, charged to the worker's dataset memory as it grows
 * (bw__starts_push): a file of short lines costs many times its size. */
static int lines_index(bw__source *s, char *err, size_t errlen)
{
    bw__starts b = {NULL, 0, 0};
    for (uint64_t off = 0; off < s->size;) {
        uint64_t end, next;
        line_at(s, off, &end, &next);
        int rc = BW_OK;
        if ((!skip_blank(s) || !is_blank(s->map->base + off, end - off)) &&
            (rc = bw__starts_push(s, &b, off, err, errlen)) != BW_OK) {
            free(b.at);
            return rc;
        }
        off = next;
        bw__source_progress(s, off);
    }
    bw__starts_install(s, &b);
    return BW_OK;
}

static void fill(const bw__source *s, uint64_t off, uint64_t end, bw__record *r)
{
    r->nparts = 1;
    r->parts[0].p = s->map->base + off;
    r->parts[0].len = end - off;
    r->size = end - off;
    r->owner = s->map;
}

static int lines_get(bw__source *s, uint64_t i, bw__record *r, char *err, size_t errlen)
{
    bw__record_init(r);
    const bw__starts *st = s->state;
    if (i >= st->n)
        return bw__fmt_fail(s, BW_OUT_OF_RANGE, s->size, err, errlen,
                            "line %llu requested but the file has %llu", (unsigned long long)i,
                            (unsigned long long)st->n);
    uint64_t end, next;
    line_at(s, st->at[i], &end, &next);
    fill(s, st->at[i], end, r);
    return BW_OK;
}

static int lines_next(bw__source *s, uint64_t off, bw__record *r, uint64_t *next, char *err,
                      size_t errlen)
{
    bw__record_init(r);
    if (off > s->size)
        return bw__fmt_fail(s, BW_OUT_OF_RANGE, off, err, errlen,
                            "offset past the end (%llu bytes)", (unsigned long long)s->size);
    if (off > 0 && off < s->size && s->map->base[off - 1] != '\n')
        return bw__fmt_fail(s, BW_INVALID_ARGUMENT, off, err, errlen,
                            "not the start of a line (resume only from an offset received)");
    for (;;) {
        if (off >= s->size)
            return BW_FMT_END;
        uint64_t end;
        line_at(s, off, &end, next);
        if (!skip_blank(s) || !is_blank(s->map->base + off, end - off)) {
            fill(s, off, end, r);
            return BW_OK;
        }
        off = *next;
    }
}

const bw__format_ops bw__fmt_jsonl = {
    .name = "jsonl",
    .open = bw__starts_open,
    .index = lines_index,
    .get = lines_get,
    .next = lines_next,
    .offset = bw__starts_offset,
    .close = bw__starts_close,
};

const bw__format_ops bw__fmt_text = {
    .name = "text",
    .open = bw__starts_open,
    .index = lines_index,
    .get = lines_get,
    .next = lines_next,
    .offset = bw__starts_offset,
    .close = bw__starts_close,
};
