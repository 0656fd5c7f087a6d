/* The stream kind of read (stream_fetch.c) for iterable jobs: record runs through the one
 * fetch loop (fetch.h), learned byte offsets, cursors' stream fields; used by the loader
 * (loader.c, loader_cursor.c). Nothing here is part of the public API. */
#ifndef BW_CLIENT_STREAM_FETCH_H
#define BW_CLIENT_STREAM_FETCH_H

#include "jobs/plan.h"
#include "fetch.h"
#include "batch_int.h"

typedef struct bw__stream_ctx bw__stream_ctx;

enum { BW_STREAM_CACHE = 256 };

struct bw__stream_ctx {
    size_t nsources;
    const char **paths; /* borrowed from the job summary */
    uint64_t *counts, *sizes;
    pthread_mutex_t mu; /* guards the offset cache */
    struct {
        bool valid;
        uint32_t src;
        uint64_t rec, off;
    } cache[BW_STREAM_CACHE];
    size_t cache_next;
};

/* The sources of an iterable job (the planner checked the job: jobs/plan.h). */
int bw__stream_open(bw__stream_ctx **out, const Batchwire__V1__JobSummary *job, char *err,
                    size_t errlen);
/* The same for one dataset's description (a mixture's stream source: docs/semantics.md,
 * "Streams in a mixture"); info is borrowed and must outlive the context. */
int bw__stream_open_info(bw__stream_ctx **out, const Batchwire__V1__DatasetInfo *info, char *err,
                         size_t errlen);
void bw__stream_free(bw__stream_ctx *sc);
/* Several streams read in one fetch (a mixture's stream sources, mix_stream.c): for an item's
 * src, `of` names the fetch settings of its dataset (dataset, fingerprint, message size, field
 * table), its stream context and its source (file) in that dataset. */
typedef struct bw__stream_map {
    void (*of)(void *arg, uint32_t src, const bw__fetch_ctx **ctx, bw__stream_ctx **sc,
               uint32_t *source);
    void *arg;
} bw__stream_map;
/* Reads items[0..n) -- records: src mapped by `map`, key the record -- into dest
 * (bw__fetch_items; ctx gives the transports, placement and deadlines), consecutive records of
 * a source in one ReadStream. BW_OK or an error with a sentence in err. */
int bw__stream_fetch_map(const bw__fetch_ctx *ctx, const bw__stream_map *map, bw__fetch_item *items,
                         size_t n, bw__fetch_dest *dest, char *err, size_t errlen);
/* The byte offset of record rec (<= its count) of source src: known (a source's ends,
 * learned), else asked of the source's owner (from its offset index; nothing is read). */
int bw__stream_locate(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, uint32_t src, uint64_t rec,
                      uint64_t *off, char *err, size_t errlen);
/* Records that byte offset off starts record rec of source src. */
void bw__stream_learn(bw__stream_ctx *sc, uint32_t src, uint64_t rec, uint64_t off);
/* Reads b->indices (positions in the epoch's stream order, from `plan`) into b. */
int bw__stream_fetch_batch(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, const bw__plan *plan,
                           bw_batch *b);
/* Fills a cursor's stream fields for `step` of `rank` (arrays malloc'ed: free them). */
int bw__stream_cursor_fill(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, const bw__plan *plan,
                           uint32_t rank, uint64_t step, Batchwire__V1__Cursor *c, char *err,
                           size_t errlen);
/* A cursor's stream fields have n entries each and its stream_position is pos (where its
 * step starts): BW_OK, or BW_MISMATCH with a sentence (`what`: "stream" or "mixture"). */
int bw__stream_cursor_header(const Batchwire__V1__Cursor *c, size_t n, uint64_t pos,
                             const char *what, uint32_t rank, char *err, size_t errlen);
/* Checks a cursor's stream fields against its step and learns its offsets. */
int bw__stream_cursor_check(bw__stream_ctx *sc, const bw__plan *plan,
                            const Batchwire__V1__Cursor *c, uint32_t rank, char *err,
                            size_t errlen);

#endif
