/*
 * Streams (iterable mode): the batch's positions in the epoch's global stream order are
 * turned into runs of consecutive records of one source, and each run is read once, with
 * one ReadStream, from the worker that owns the source (placement by source). A record's
 * byte offset is sent when this loader knows it (a source's start, the end of an earlier
 * read, a cursor), so that worker reads from there with the format's `next`; otherwise the
 * worker seeks with its offset index. No record before a run is read. The reads go through
 * the one fetch loop (fetch.c): the same transports, failover and retries as map-style.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "fetch.h"
#include "rpc/dchan.h"
#include "stream_fetch.h"
#include "placement/placement.h"

int bw__stream_open(bw__stream_ctx **out, const Batchwire__V1__JobSummary *job, char *err,
                    size_t errlen)
{
    return bw__stream_open_info(out, job->dataset, err, errlen);
}

int bw__stream_open_info(bw__stream_ctx **out, const Batchwire__V1__DatasetInfo *info, char *err,
                         size_t errlen)
{
    *out = NULL;
    bw__stream_ctx *sc = calloc(1, sizeof(*sc));
    if (sc) {
        sc->nsources = info->n_sources;
        sc->paths = calloc(sc->nsources ? sc->nsources : 1, sizeof(*sc->paths));
        sc->counts = calloc(sc->nsources ? sc->nsources : 1, sizeof(*sc->counts));
        sc->sizes = calloc(sc->nsources ? sc->nsources : 1, sizeof(*sc->sizes));
    }
    if (!sc || !sc->paths || !sc->counts || !sc->sizes) {
        if (sc) {
            free(sc->paths);
            free(sc->counts);
            free(sc->sizes);
        }
        free(sc);
        snprintf(err, errlen, "out of memory for a stream of %zu sources", info->n_sources);
        return BW_NOMEM;
    }
    for (size_t i = 0; i < sc->nsources; i++) {
        sc->paths[i] = info->sources[i]->path;
        sc->counts[i] = info->sources[i]->records;
        sc->sizes[i] = info->sources[i]->size_bytes;
    }
    pthread_mutex_init(&sc->mu, NULL);
    *out = sc;
    return BW_OK;
}

void bw__stream_free(bw__stream_ctx *sc)
{
    if (!sc)
        return;
    free(sc->paths);
    free(sc->counts);
    free(sc->sizes);
    pthread_mutex_destroy(&sc->mu);
    free(sc);
}

/* ---- offsets this loader has learned: (source, record) -> byte offset ---- */

void bw__stream_learn(bw__stream_ctx *sc, uint32_t src, uint64_t rec, uint64_t off)
{
    pthread_mutex_lock(&sc->mu);
    size_t slot = sc->cache_next;
    for (size_t i = 0; i < BW_STREAM_CACHE; i++)
        if (sc->cache[i].valid && sc->cache[i].src == src && sc->cache[i].rec == rec) {
            slot = i;
            break;
        }
    if (slot == sc->cache_next)
        sc->cache_next = (sc->cache_next + 1) % BW_STREAM_CACHE;
    sc->cache[slot].valid = true;
    sc->cache[slot].src = src;
    sc->cache[slot].rec = rec;
    sc->cache[slot].off = off;
    pthread_mutex_unlock(&sc->mu);
}

/* The offset of (src, rec) when known without asking: a source's ends, or learned. */
static bool known_offset(bw__stream_ctx *sc, uint32_t src, uint64_t rec, uint64_t *off)
{
    if (rec == 0) {
        *off = 0;
        return true;
    }
    if (rec == sc->counts[src]) {
        *off = sc->sizes[src];
        return true;
    }
    bool found = false;
    pthread_mutex_lock(&sc->mu);
    for (size_t i = 0; i < BW_STREAM_CACHE && !found; i++)
        if (sc->cache[i].valid && sc->cache[i].src == src && sc->cache[i].rec == rec) {
            *off = sc->cache[i].off;
            found = true;
        }
    pthread_mutex_unlock(&sc->mu);
    return found;
}

/* ---- the stream kind of read (fetch.h) ---- */

typedef struct stream_kind {
    const bw__fetch_ctx *ctx;
    bw__stream_ctx *sc;
    const bw__stream_map *map; /* several streams (a mixture's); NULL: ctx's, src the source */
    bool located;              /* a probe's request succeeded: `offset` is its record's */
    uint64_t offset;
} stream_kind;

/* The dataset's settings, the stream and the source an item of src reads. */
static void item_of(const stream_kind *k, uint32_t src, const bw__fetch_ctx **ctx,
                    bw__stream_ctx **sc, uint32_t *source)
{
    if (k->map) {
        k->map->of(k->map->arg, src, ctx, sc, source);
        return;
    }
    *ctx = k->ctx;
    *sc = k->sc;
    *source = src;
}

static uint32_t stream_shard(void *kctx, const bw__fetch_item *it, uint32_t num_shards)
{
    const bw__fetch_ctx *ctx;
    bw__stream_ctx *sc;
    uint32_t src;
    item_of(kctx, it->src, &ctx, &sc, &src);
    return bw__placement_stream_shard(src, sc->paths[src], num_shards, BW_SHARD_MODULO);
}

/* One ReadStream reads consecutive records of one source; a probe (locate_only) is a request
 * of its own. */
static bool stream_join(const bw__fetch_item *a, const bw__fetch_item *b)
{
    return !a->probe && !b->probe && a->src == b->src && b->key == a->key + 1;
}

static int stream_message(void *kctx, bw__fetch_item *const *items, size_t n,
                          const bw__placement *p, bool checked, bw_arena *a, ProtobufCMessage **out)
{
    const bw__fetch_ctx *ctx;
    bw__stream_ctx *sc;
    uint32_t src;
    item_of(kctx, items[0]->src, &ctx, &sc, &src);
    Batchwire__V1__ReadStreamRequest *req = bw__arena_alloc(a, sizeof(*req));
    Batchwire__V1__Routing *rt = bw__arena_alloc(a, sizeof(*rt));
    if (!req || !rt)
        return BW_NOMEM;
    batchwire__v1__routing__init(rt);
    rt->placement_version = checked ? p->version : 0;
    rt->num_shards = p->num_shards;
    rt->shard_mode = BATCHWIRE__V1__SHARD_MODE__SHARD_MODE_MODULO;
    rt->by_source = true;
    batchwire__v1__read_stream_request__init(req);
    req->dataset = (Batchwire__V1__Dataset *)ctx->dataset;
    req->source = src;
    req->first_record = items[0]->key;
    req->locate_only = items[0]->probe;
    req->max_records = items[0]->probe ? 0 : (uint32_t)n;
    /* A record's offset when this loader knows it (a source's start, an END received, a
     * cursor): the worker reads from there; otherwise it seeks with its offset index. */
    uint64_t off;
    if (!req->locate_only && known_offset(sc, req->source, req->first_record, &off))
        req->offset = off;
    else
        req->seek_record = true;
    req->routing = rt;
    req->fingerprint = (char *)ctx->fingerprint;
    req->max_message_bytes = ctx->max_message_bytes;
    req->field_table = ctx->field_table && !req->locate_only;
    *out = &req->base;
    return BW_OK;
}

/* Where the record after the last complete one starts: the next reader of the source
 * begins there without a seek. */
static void stream_finished(void *kctx, bw__fetch_item *const *items, size_t k, const bw__xres *res)
{
    stream_kind *sk = kctx;
    const bw__fetch_ctx *ctx;
    bw__stream_ctx *sc;
    uint32_t src;
    item_of(sk, items[0]->src, &ctx, &sc, &src);
    if (!res->has_end_offset || res->end_offset > sc->sizes[src])
        return;
    bw__stream_learn(sc, src, items[0]->key + k, res->end_offset);
    if (items[0]->probe && res->rc == BW_OK) {
        sk->located = true;
        sk->offset = res->end_offset;
    }
}

static bw__fetch_kind stream_kind_of(stream_kind *k)
{
    return (bw__fetch_kind){
        BW_DCHAN_KIND_READ_STREAM, stream_shard, stream_join, stream_message, stream_finished, k};
}

int bw__stream_fetch_batch(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, const bw__plan *plan,
                           bw_batch *b)
{
    const bw__stream_order *order = bw__plan_stream_order(plan);
    b->err[0] = '\0';
    size_t n = b->count;
    bw__fetch_item *items = calloc(n ? n : 1, sizeof(*items));
    int rc = items ? BW_OK : BW_NOMEM;
    if (!items)
        snprintf(b->err, sizeof(b->err), "out of memory for a batch of %zu records", n);
    for (size_t i = 0; i < n && rc == BW_OK; i++) {
        if (bw__stream_order_locate(order, b->indices[i], &items[i].src, &items[i].key) != BW_OK) {
            snprintf(b->err, sizeof(b->err),
                     "position %" PRIu64 " is past the end of the stream (%" PRIu64 " records)",
                     b->indices[i], order->total);
            rc = BW_INTERNAL;
            break;
        }
        items[i].first = i;
        items[i].max_size = sc->sizes[items[i].src];
    }
    stream_kind k = {ctx, sc, NULL, false, 0};
    bw__fetch_kind kind = stream_kind_of(&k);
    bw__fetch_dest dest = {b, 0, 0, 0, NULL, NULL, 0, NULL, NULL};
    if (rc == BW_OK)
        rc = bw__fetch_items(ctx, &kind, items, n, &dest, b->err, sizeof(b->err));
    if (rc == BW_OK)
        rc = bw__fetch_pack(b, items, NULL, &dest);
    bw__fetch_items_free(items, n);
    free(items);
    return b->rc = rc;
}

int bw__stream_fetch_map(const bw__fetch_ctx *ctx, const bw__stream_map *map, bw__fetch_item *items,
                         size_t n, bw__fetch_dest *dest, char *err, size_t errlen)
{
    stream_kind k = {ctx, NULL, map, false, 0};
    bw__fetch_kind kind = stream_kind_of(&k);
    return bw__fetch_items(ctx, &kind, items, n, dest, err, errlen);
}

/* ---- cursors ---- */

int bw__stream_locate(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, uint32_t src, uint64_t rec,
                      uint64_t *off, char *err, size_t errlen)
{
    if (known_offset(sc, src, rec, off))
        return BW_OK;
    bw__fetch_item probe = {.key = rec, .src = src, .probe = true};
    stream_kind k = {ctx, sc, NULL, false, 0};
    bw__fetch_kind kind = stream_kind_of(&k);
    int rc = bw__fetch_items(ctx, &kind, &probe, 1, NULL, err, errlen);
    if (rc == BW_OK && !k.located) {
        snprintf(err, errlen, "the worker answered no offset for record %" PRIu64 " of %s", rec,
                 sc->paths[src]);
        rc = BW_PROTOCOL;
    }
    if (rc == BW_OK)
        *off = k.offset;
    return rc;
}

int bw__stream_cursor_fill(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, const bw__plan *plan,
                           uint32_t rank, uint64_t step, Batchwire__V1__Cursor *c, char *err,
                           size_t errlen)
{
    size_t n = sc->nsources;
    c->source_offsets = calloc(n, sizeof(uint64_t));
    c->source_records = calloc(n, sizeof(uint64_t));
    if (!c->source_offsets || !c->source_records) {
        snprintf(err, errlen, "out of memory for a cursor of %zu sources", n);
        return BW_NOMEM;
    }
    c->n_source_offsets = c->n_source_records = n;
    c->stream_position = bw__plan_stream_position(plan, rank, step);
    for (size_t j = 0; j < n; j++) {
        if (bw__plan_pre_sharded(plan) && j != rank)
            continue; /* a pre-sharded rank's cursor carries its own source only */
        uint64_t rec = bw__plan_source_records(plan, rank, (uint32_t)j, step);
        c->source_records[j] = rec;
        int rc = bw__stream_locate(ctx, sc, (uint32_t)j, rec, &c->source_offsets[j], err, errlen);
        if (rc != BW_OK)
            return rc;
    }
    return BW_OK;
}

int bw__stream_cursor_header(const Batchwire__V1__Cursor *c, size_t n, uint64_t pos,
                             const char *what, uint32_t rank, char *err, size_t errlen)
{
    if (c->n_source_offsets != n || c->n_source_records != n) {
        snprintf(err, errlen,
                 "cursor refused: it carries %zu stream offsets and %zu record counts for a "
                 "%s of %zu sources",
                 c->n_source_offsets, c->n_source_records, what, n);
        return BW_MISMATCH;
    }
    if (c->stream_position != pos) {
        snprintf(err, errlen,
                 "cursor refused: its %s position %" PRIu64 " is not where step %" PRIu64
                 " of rank %u starts (%" PRIu64 ")",
                 what, c->stream_position, c->step, rank, pos);
        return BW_MISMATCH;
    }
    return BW_OK;
}

int bw__stream_cursor_check(bw__stream_ctx *sc, const bw__plan *plan,
                            const Batchwire__V1__Cursor *c, uint32_t rank, char *err, size_t errlen)
{
    size_t n = sc->nsources;
    if (c->n_source_offsets == 0 && c->n_source_records == 0 && c->step == 0)
        return BW_OK; /* the start of an epoch needs no offsets */
    int rc = bw__stream_cursor_header(c, n, bw__plan_stream_position(plan, rank, c->step), "stream",
                                      rank, err, errlen);
    if (rc != BW_OK)
        return rc;
    for (size_t j = 0; j < n; j++) {
        if (bw__plan_pre_sharded(plan) && j != rank)
            continue;
        uint64_t rec = bw__plan_source_records(plan, rank, (uint32_t)j, c->step);
        if (c->source_records[j] != rec || c->source_offsets[j] > sc->sizes[j]) {
            snprintf(err, errlen,
                     "cursor refused: source %zu (%s) is at record %" PRIu64 " (offset %" PRIu64
                     ") in the cursor; step %" PRIu64 " is at record %" PRIu64,
                     j, sc->paths[j], c->source_records[j], c->source_offsets[j], c->step, rec);
            return BW_MISMATCH;
        }
        /* Where this source resumes: a seek, not a replay. */
        if (rec > 0 && rec < sc->counts[j])
            bw__stream_learn(sc, (uint32_t)j, rec, c->source_offsets[j]);
    }
    return BW_OK;
}
