/* Shared by the reader fuzz targets: open a source over the input, build its index, read
 * every record by index and walk it as a stream, touching every byte returned (so ASan sees
 * any read outside the input). */
#ifndef BW_FUZZ_READER_H
#define BW_FUZZ_READER_H

#include <stddef.h>
#include <stdint.h>

#include "formats/formats.h"

static volatile uint8_t bw_fuzz_sink;

static void bw_fuzz_touch(const bw__record *r)
{
    uint8_t x = 0;
    for (size_t i = 0; i < r->nparts; i++)
        for (size_t k = 0; k < r->parts[i].len; k++)
            x ^= r->parts[i].p[k];
    if (r->has_names)
        for (size_t i = 0; i < r->nparts; i++)
            x ^= (uint8_t)r->text[r->names[i]];
    bw_fuzz_sink = x;
}

static void bw_fuzz_reader(const bw__format_ops *ops, const uint8_t *data, size_t size)
{
    char err[1024];
    bw__source *s = NULL;
    if (bw__source_from_memory(ops, "fuzz", data, size, &s, err, sizeof(err)) != BW_OK)
        return;
    bw__record r;
    if (ops->index(s, err, sizeof(err)) == BW_OK) {
        for (uint64_t i = 0; i < s->count && i < 4096; i++)
            if (ops->get(s, i, &r, err, sizeof(err)) == BW_OK) {
                bw_fuzz_touch(&r);
                bw__record_release(&r);
            }
        ops->get(s, s->count, &r, err, sizeof(err));
    }
    if (ops->next) {
        uint64_t off = 0, next = 0;
        for (int steps = 0; steps < 4096; steps++) {
            if (ops->next(s, off, &r, &next, err, sizeof(err)) != BW_OK)
                break;
            bw_fuzz_touch(&r);
            if (next <= off)
                __builtin_trap(); /* a stream must always advance */
            off = next;
        }
        /* arbitrary resume points */
        for (uint64_t o = 1; o < size; o = o * 3 + 1)
            if (ops->next(s, o, &r, &next, err, sizeof(err)) == BW_OK)
                bw_fuzz_touch(&r);
    }
    bw__source_free(s);
}

#endif
