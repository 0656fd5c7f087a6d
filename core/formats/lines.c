/* Text lines and JSON Lines: one record per line, without its '\n' (a '\r' before it is kept;
 * a last line without '\n' is a record). "jsonl" skips blank lines (JSON Lines allows them
 * nowhere, writers add them anyway); "text" keeps every line, empty ones included. Contents
 * are not parsed: a line is served as its bytes. */
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"

typedef struct lines {
    uint64_t *starts;
    uint64_t n;
} lines;

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

static int lines_open(bw__source *s, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    s->state = calloc(1, sizeof(lines));
    return s->state ? BW_OK : BW_NOMEM;
}

static int lines_index(bw__source *s, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    lines *st = s->state;
    uint64_t cap = 1024, n = 0, off = 0;
    uint64_t *starts = malloc(cap * sizeof(*starts));
    if (!starts)
        return BW_NOMEM;
    while (off < s->size) {
        uint64_t end, next;
        line_at(s, off, &end, &next);
        if (!skip_blank(s) || !is_blank(s->map->base + off, end - off)) {
            if (n == cap) {
                uint64_t *ns = realloc(starts, 2 * cap * sizeof(*ns));
                if (!ns) {
                    free(starts);
                    return BW_NOMEM;
                }
                starts = ns;
                cap *= 2;
            }
            starts[n++] = off;
        }
        off = next;
    }
    free(st->starts);
    st->starts = starts;
    st->n = n;
    s->count = n;
    s->indexed = true;
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
    const lines *st = s->state;
    if (i >= st->n)
        return bw__fmt_fail(s, BW_OUT_OF_RANGE, s->size, err, errlen,
                            "line %llu requested but the file has %llu", (unsigned long long)i,
                            (unsigned long long)st->n);
    uint64_t end, next;
    line_at(s, st->starts[i], &end, &next);
    fill(s, st->starts[i], end, r);
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

static void lines_close(bw__source *s)
{
    lines *st = s->state;
    if (st)
        free(st->starts);
    free(st);
    s->state = NULL;
}

static uint64_t lines_offset(const bw__source *s, uint64_t i)
{
    const lines *st = s->state;
    return i < st->n ? st->starts[i] : s->size;
}

const bw__format_ops bw__fmt_jsonl = {
    .name = "jsonl",
    .open = lines_open,
    .index = lines_index,
    .get = lines_get,
    .next = lines_next,
    .offset = lines_offset,
    .close = lines_close,
};

const bw__format_ops bw__fmt_text = {
    .name = "text",
    .open = lines_open,
    .index = lines_index,
    .get = lines_get,
    .next = lines_next,
    .offset = lines_offset,
    .close = lines_close,
};
