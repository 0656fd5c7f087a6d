/* The global order of a multi-source stream and the per-rank layout of a pre-sharded one
 * (stream_order.h, docs/streams.md). Pure. */
#include "jobs/stream_order.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "sampler/randperm.h"

int bw__stream_order_init(bw__stream_order *o, const uint64_t *counts, size_t n,
                          bool shuffle_sources, uint64_t seed, uint64_t epoch, char *err,
                          size_t errlen)
{
    memset(o, 0, sizeof(*o));
    if (n == 0 || (uint64_t)n > UINT32_MAX) {
        snprintf(err, errlen, "a stream needs 1 to %u sources, not %zu", UINT32_MAX, n);
        return BW_INVALID_ARGUMENT;
    }
    o->nsources = n;
    o->order = malloc(n * sizeof(*o->order));
    o->place = malloc(n * sizeof(*o->place));
    o->counts = malloc(n * sizeof(*o->counts));
    o->start = malloc((n + 1) * sizeof(*o->start));
    if (!o->order || !o->place || !o->counts || !o->start) {
        bw__stream_order_free(o);
        snprintf(err, errlen, "out of memory for the order of %zu sources", n);
        return BW_NOMEM;
    }
    memcpy(o->counts, counts, n * sizeof(*counts));
    if (shuffle_sources)
        /* seed + epoch wraps as the 64-bit value torch receives (as the sampler does). */
        bw__randperm_u32(o->order, n, seed + epoch, BW__RANDPERM_AUTO);
    else
        for (size_t k = 0; k < n; k++)
            o->order[k] = (uint32_t)k;
    uint64_t total = 0;
    for (size_t k = 0; k < n; k++) {
        o->place[o->order[k]] = (uint32_t)k;
        o->start[k] = total;
        if (counts[o->order[k]] > UINT64_MAX / 2 - total) {
            bw__stream_order_free(o);
            snprintf(err, errlen, "the stream's sources hold too many records");
            return BW_INVALID_ARGUMENT;
        }
        total += counts[o->order[k]];
    }
    o->start[n] = total;
    o->total = total;
    return BW_OK;
}

void bw__stream_order_free(bw__stream_order *o)
{
    free(o->order);
    free(o->place);
    free(o->counts);
    free(o->start);
    memset(o, 0, sizeof(*o));
}

int bw__stream_order_locate(const bw__stream_order *o, uint64_t pos, uint32_t *src, uint64_t *rec)
{
    if (pos >= o->total)
        return BW_OUT_OF_RANGE;
    /* The last place whose start <= pos and that holds records (empty sources share their
     * start with the next one). */
    size_t lo = 0, hi = o->nsources;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (o->start[mid] <= pos)
            lo = mid;
        else
            hi = mid;
    }
    *src = o->order[lo];
    *rec = pos - o->start[lo];
    return BW_OK;
}

uint64_t bw__stream_order_position(const bw__stream_order *o, uint32_t src, uint64_t rec)
{
    return o->start[o->place[src]] + rec;
}

uint64_t bw__stream_order_consumed(const bw__stream_order *o, uint32_t src, uint64_t pos)
{
    uint64_t first = o->start[o->place[src]];
    if (pos <= first)
        return 0;
    uint64_t done = pos - first;
    return done < o->counts[src] ? done : o->counts[src];
}

/* ---- pre-sharded ---- */

int bw__preshard_init(bw__preshard *p, const uint64_t *counts, size_t world, uint64_t b,
                      bool drop_last, char *err, size_t errlen)
{
    memset(p, 0, sizeof(*p));
    if (world == 0 || b == 0) {
        snprintf(err, errlen, "a pre-sharded stream needs at least one rank and a batch size");
        return BW_INVALID_ARGUMENT;
    }
    uint64_t most = 0, least = UINT64_MAX;
    for (size_t r = 0; r < world; r++) {
        uint64_t s = drop_last ? counts[r] / b : counts[r] / b + (counts[r] % b != 0);
        most = s > most ? s : most;
        least = s < least ? s : least;
    }
    p->world = world;
    p->counts = counts;
    p->b = b;
    p->steps = drop_last ? least : most;
    for (size_t r = 0; r < world && !drop_last; r++)
        if (counts[r] == 0 && p->steps > 0) {
            snprintf(err, errlen,
                     "pre-sharded source %zu (rank %zu's) has no records while other ranks have "
                     "%llu batches: its rank cannot be padded to the same number of batches "
                     "(use drop_last, or give every rank records)",
                     r, r, (unsigned long long)p->steps);
            return BW_INVALID_ARGUMENT;
        }
    return BW_OK;
}

size_t bw__preshard_batch(const bw__preshard *p, size_t rank, uint64_t step, uint64_t *rec,
                          uint8_t *pad, size_t *real)
{
    *real = 0;
    if (rank >= p->world || step >= p->steps)
        return 0;
    uint64_t c = p->counts[rank];
    for (uint64_t i = 0; i < p->b; i++) {
        uint64_t j = step * p->b + i;
        bool is_pad = j >= c;
        /* Padding cycles the rank's own stream from its start (as IterableDatasetShard
         * completes the last batch from the first). */
        rec[i] = is_pad ? (j - c) % c : j;
        if (pad)
            pad[i] = is_pad;
        *real += !is_pad;
    }
    return (size_t)p->b;
}

uint64_t bw__preshard_consumed(const bw__preshard *p, size_t rank, uint64_t steps)
{
    uint64_t done = steps * p->b, c = p->counts[rank];
    return done < c ? done : c;
}
