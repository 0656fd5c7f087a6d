/* Internals of libbatchwire's loader for iterable jobs (streams): stream_fetch.c, used by
 * loader.c. Nothing here is part of the public API. */
#ifndef BW_CLIENT_STREAM_FETCH_H
#define BW_CLIENT_STREAM_FETCH_H

#include "jobs/stream_order.h"
#include "fetch.h"
#include "loader_int.h"

typedef struct bw__stream_ctx bw__stream_ctx;

enum { BW_STREAM_CACHE = 256 };

struct bw__stream_ctx {
    bool pre_sharded, shuffle_sources, drop_last;
    uint64_t seed, epoch;
    size_t nsources;
    const char **paths; /* borrowed from the job summary */
    uint64_t *counts, *sizes;
    bw__stream_order order; /* of `epoch`; replaced only while no fetch runs */
    bw__preshard ps;        /* pre-sharded: the layout of `epoch` */
    pthread_mutex_t mu;     /* guards the offset cache */
    struct {
        bool valid;
        uint32_t src;
        uint64_t rec, off;
    } cache[BW_STREAM_CACHE];
    size_t cache_next;
};

/* The stream of an iterable job (checks the format, pre-sharding and world size). */
int bw__stream_open(bw__stream_ctx **out, const Batchwire__V1__JobSummary *job, uint32_t world,
                    char *err, size_t errlen);
void bw__stream_free(bw__stream_ctx *sc);
/* Lays out `epoch` (source order; pre-sharded batches of b records at world size world). */
int bw__stream_set_epoch(bw__stream_ctx *sc, uint64_t epoch, uint32_t world, uint64_t b, char *err,
                         size_t errlen);
/* Pre-sharded: batch `step` of `rank` as positions in the epoch's stream. */
size_t bw__stream_preshard_batch(const bw__stream_ctx *sc, uint32_t rank, uint64_t step,
                                 uint64_t *indices, uint8_t *padding, size_t *real);
/* Records that byte offset off starts record rec of source src. */
void bw__stream_learn(bw__stream_ctx *sc, uint32_t src, uint64_t rec, uint64_t off);
/* Reads b->indices (positions) into b, source by source. */
int bw__stream_fetch_batch(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, bw_batch *b);
/* The global stream position once `step` steps of `rank` (g positions a step) are consumed. */
uint64_t bw__stream_position(const bw__stream_ctx *sc, uint32_t rank, uint64_t step, uint64_t g);
/* Fills a cursor's stream fields for `step` (arrays malloc'ed: free them). */
int bw__stream_cursor_fill(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, uint32_t rank,
                           uint64_t step, uint64_t g, Batchwire__V1__Cursor *c, char *err,
                           size_t errlen);
/* Checks a cursor's stream fields against its step and learns its offsets. */
int bw__stream_cursor_check(bw__stream_ctx *sc, const Batchwire__V1__Cursor *c, uint32_t rank,
                            uint64_t g, char *err, size_t errlen);

#endif
