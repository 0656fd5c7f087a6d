/*
 * The global order of a stream made of several sources, and the per-rank layout of a
 * pre-sharded stream (docs/streams.md). Pure: no I/O, no threads, no globals.
 *
 * Order of an epoch: the sources in their declared (glob-expanded) order, or with
 * shuffle_sources the order torch.randperm(nsources, Generator().manual_seed(seed + epoch))
 * gives; the records of each source in file order. Position p of the epoch's stream is
 * record p - start[k] of the k-th source of that order. The sampler's iterable mode decides
 * which positions rank r receives at step s; this module turns positions into (source,
 * record) and back, so order stays separate from placement (docs/semantics.md).
 *
 * Pre-sharded streams: rank r reads source r alone, in batches of b records; every rank has
 * the same number of steps: the largest ceil(count / b) (a shorter source is padded by
 * cycling it from its start, flagged), or with drop_last the smallest floor(count / b).
 */
#ifndef BW_JOBS_STREAM_ORDER_H
#define BW_JOBS_STREAM_ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bw__stream_order {
    size_t nsources;
    uint32_t *order;  /* order[k]: the source at place k of this epoch */
    uint32_t *place;  /* place[src]: where source src is in the order */
    uint64_t *counts; /* records of each source (by source number) */
    uint64_t *start;  /* start[k]: position of the first record of order[k]; start[n] = total */
    uint64_t total;
} bw__stream_order;

/*
 * Lays out the epoch's order over counts[0..n) (n >= 1, at most 2^32 sources). Returns BW_OK,
 * or BW_INVALID_ARGUMENT / BW_NOMEM with a sentence in err (then *o holds nothing).
 * Free with bw__stream_order_free.
 */
int bw__stream_order_init(bw__stream_order *o, const uint64_t *counts, size_t n,
                          bool shuffle_sources, uint64_t seed, uint64_t epoch, char *err,
                          size_t errlen);

/* Accepts a zeroed or freed order. */
void bw__stream_order_free(bw__stream_order *o);

/* The source and record at position pos (< total) in O(log n). BW_OUT_OF_RANGE past the end. */
int bw__stream_order_locate(const bw__stream_order *o, uint64_t pos, uint32_t *src, uint64_t *rec);

/* The position of record rec of source src. */
uint64_t bw__stream_order_position(const bw__stream_order *o, uint32_t src, uint64_t rec);

/* Records of source src consumed once the positions [0, pos) have been. */
uint64_t bw__stream_order_consumed(const bw__stream_order *o, uint32_t src, uint64_t pos);

/* ---- pre-sharded streams ---- */

typedef struct bw__preshard {
    size_t world;           /* one source per rank */
    const uint64_t *counts; /* borrowed: records of source r = rank r */
    uint64_t b;             /* records per batch */
    uint64_t steps;         /* steps every rank has */
} bw__preshard;

/*
 * Lays out world sources (counts[r] records for rank r) in batches of b. Refuses, with a
 * sentence in err, a source without records when another rank has a batch to pad (it could
 * not be padded). Returns BW_OK or BW_INVALID_ARGUMENT.
 */
int bw__preshard_init(bw__preshard *p, const uint64_t *counts, size_t world, uint64_t b,
                      bool drop_last, char *err, size_t errlen);

/* Records of batch `step` of `rank`: rec[i] record numbers of source `rank`, pad[i] = 1 for a
 * padding duplicate. Returns the count (0 when the rank has no such step); *real the real
 * ones. rec and pad need b slots. */
size_t bw__preshard_batch(const bw__preshard *p, size_t rank, uint64_t step, uint64_t *rec,
                          uint8_t *pad, size_t *real);

/* Records of source `rank` consumed after `steps` steps. */
uint64_t bw__preshard_consumed(const bw__preshard *p, size_t rank, uint64_t steps);

#endif
