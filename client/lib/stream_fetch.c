/*
 * Streams (iterable mode): the batch's positions in the epoch's global stream order are
 * turned into runs of consecutive records of one source, and each run is read once, with
 * one ReadStream, from the worker that owns the source (placement by source). A record's
 * byte offset is sent when this loader knows it (a source's start, a next_offset received,
 * a cursor), so that worker reads from there with the format's `next`; otherwise the worker
 * seeks with its offset index. No record before a run is read. Failover as in fetch.c: a
 * worker that fails is routed around and the rest of the run is read again elsewhere.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "jobs/job_check.h"
#include "stream_fetch.h"
#include "placement/placement.h"

int bw__stream_open(bw__stream_ctx **out, const Batchwire__V1__JobSummary *job, uint32_t world,
                    char *err, size_t errlen)
{
    *out = NULL;
    const Batchwire__V1__DatasetInfo *info = job->dataset;
    const Batchwire__V1__Dataset *spec = job->config->dataset;
    const Batchwire__V1__SamplerConfig *smp = job->config->sampler;
    int rc = bw__job_check_data(job->config, info, world, err, errlen);
    if (rc != BW_OK)
        return rc;
    bw__stream_ctx *sc = calloc(1, sizeof(*sc));
    if (!sc)
        return BW_NOMEM;
    sc->pre_sharded = spec->pre_sharded;
    sc->shuffle_sources = smp->shuffle_sources;
    sc->seed = (uint64_t)smp->seed;
    sc->drop_last = smp->drop_last;
    sc->nsources = info->n_sources;
    sc->paths = calloc(sc->nsources, sizeof(*sc->paths));
    sc->counts = calloc(sc->nsources, sizeof(*sc->counts));
    sc->sizes = calloc(sc->nsources, sizeof(*sc->sizes));
    if (!sc->paths || !sc->counts || !sc->sizes) {
        bw__stream_free(sc);
        return BW_NOMEM;
    }
    for (size_t i = 0; i < sc->nsources; i++) {
        sc->paths[i] = info->sources[i]->path;
        sc->counts[i] = info->sources[i]->records;
        sc->sizes[i] = info->sources[i]->size_bytes;
    }
    pthread_mutex_init(&sc->mu, NULL);
    sc->epoch = UINT64_MAX;
    *out = sc;
    return BW_OK;
}

void bw__stream_free(bw__stream_ctx *sc)
{
    if (!sc)
        return;
    bw__stream_order_free(&sc->order);
    free(sc->paths);
    free(sc->counts);
    free(sc->sizes);
    pthread_mutex_destroy(&sc->mu);
    free(sc);
}

int bw__stream_set_epoch(bw__stream_ctx *sc, uint64_t epoch, uint32_t world, uint64_t b, char *err,
                         size_t errlen)
{
    bw__stream_order o;
    int rc = bw__stream_order_init(&o, sc->counts, sc->nsources, sc->shuffle_sources, sc->seed,
                                   epoch, err, errlen);
    if (rc != BW_OK)
        return rc;
    if (sc->pre_sharded && (rc = bw__preshard_init(&sc->ps, sc->counts, world, b, sc->drop_last,
                                                   err, errlen)) != BW_OK) {
        bw__stream_order_free(&o);
        return rc;
    }
    bw__stream_order_free(&sc->order);
    sc->order = o;
    sc->epoch = epoch;
    return BW_OK;
}

size_t bw__stream_preshard_batch(const bw__stream_ctx *sc, uint32_t rank, uint64_t step,
                                 uint64_t *indices, uint8_t *padding, size_t *real)
{
    size_t n = bw__preshard_batch(&sc->ps, rank, step, indices, padding, real);
    for (size_t i = 0; i < n; i++)
        indices[i] = bw__stream_order_position(&sc->order, rank, indices[i]);
    return n;
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

/* ---- routing ---- */

/* Opens ReadStream of `nrec` records of source src from record rec on worker wk. */
static int open_read(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, const bw__placement *p,
                     size_t wk, bool checked, uint32_t src, uint64_t rec, uint64_t nrec,
                     bool locate_only, bw_rpc_stream **st, char *err, size_t errlen)
{
    *st = NULL;
    bw_rpc_channel *ch =
        bw__session_worker_channel(ctx->session, p->workers[wk].address, err, errlen);
    if (!ch)
        return BW_UNAVAILABLE;
    Batchwire__V1__Routing rt = BATCHWIRE__V1__ROUTING__INIT;
    rt.placement_version = checked ? p->version : 0;
    rt.num_shards = p->num_shards;
    rt.shard_mode = BATCHWIRE__V1__SHARD_MODE__SHARD_MODE_MODULO;
    rt.by_source = true;
    Batchwire__V1__ReadStreamRequest req = BATCHWIRE__V1__READ_STREAM_REQUEST__INIT;
    req.dataset = (Batchwire__V1__Dataset *)ctx->dataset;
    req.source = src;
    req.first_record = rec;
    req.max_records = (uint32_t)nrec;
    req.locate_only = locate_only;
    uint64_t off;
    if (!locate_only && known_offset(sc, src, rec, &off))
        req.offset = off;
    else
        req.seek_record = true;
    req.routing = &rt;
    req.fingerprint = (char *)ctx->fingerprint;
    req.max_message_bytes = ctx->max_message_bytes;
    return bw__rpc_stream_open(ch, BW_METHOD(BW_M_DATA_READ_STREAM), &req.base, ctx->timeout_ms, st,
                               err, errlen);
}

/* ---- one batch ---- */

typedef struct item {
    uint32_t src;
    uint64_t rec;
    uint64_t size, got;
    uint8_t *buf;
    bool done;
} item;

typedef struct run {
    size_t first, n; /* items [first, first + n): consecutive records of one source */
    size_t k;        /* items received so far */
    long worker;
    bool tried; /* a stream was asked for in this round */
    bw_rpc_stream *st;
} run;

/* Reads a run's stream to its end. BW_OK or the error with a sentence in err. */
static int drain(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, run *r, item *items, char *err,
                 size_t errlen)
{
    (void)ctx;
    int rc;
    for (;;) {
        bw_arena a;
        bw__arena_init(&a, 0);
        ProtobufCMessage *msg = NULL;
        rc = bw__rpc_stream_next(r->st, &a, &msg, err, errlen);
        if (rc != BW_OK) {
            bw__arena_reset(&a);
            break;
        }
        const Batchwire__V1__SampleBatch *sb = (const void *)msg;
        for (size_t i = 0; i < sb->n_samples && rc == BW_OK; i++) {
            const Batchwire__V1__Sample *s = sb->samples[i];
            item *x = r->k < r->n ? &items[r->first + r->k] : NULL;
            if (!x || s->index != x->rec || s->chunk_offset != x->got ||
                s->chunk_offset + s->data.len > s->size) {
                snprintf(err, errlen,
                         "worker sent record %" PRIu64 " (chunk at %" PRIu64 ") where record "
                         "%" PRIu64 " of source %u was due",
                         s->index, s->chunk_offset, x ? x->rec : 0, x ? x->src : 0);
                rc = BW_PROTOCOL;
                break;
            }
            if (x->got == 0) {
                x->size = s->size;
                if (!(x->buf = malloc(s->size ? s->size : 1))) {
                    rc = BW_NOMEM;
                    break;
                }
                if (r->k == 0)
                    bw__stream_learn(sc, x->src, x->rec, s->offset);
            }
            memcpy(x->buf + s->chunk_offset, s->data.data, s->data.len);
            x->got += s->data.len;
            if (x->got == x->size) {
                x->done = true;
                r->k++;
                if (r->k == r->n) /* where the next reader of this source starts */
                    bw__stream_learn(sc, x->src, x->rec + 1, s->next_offset);
            }
        }
        bw__arena_reset(&a);
        if (rc != BW_OK)
            break;
    }
    if (rc == BW_RPC_STREAM_END) {
        if (r->k == r->n)
            return BW_OK;
        snprintf(err, errlen, "worker ended the stream after %zu of %zu records", r->k, r->n);
        return BW_PROTOCOL;
    }
    if (r->k < r->n) { /* a partial record starts over */
        item *x = &items[r->first + r->k];
        free(x->buf);
        x->buf = NULL;
        x->got = 0;
    }
    return rc;
}

static int pack(bw_batch *b, item *items)
{
    size_t total = 0;
    for (size_t i = 0; i < b->count; i++)
        total += (size_t)items[i].size;
    int rc = bw__batch_reserve(b, total);
    if (rc != BW_OK)
        return rc;
    size_t off = 0;
    for (size_t i = 0; i < b->count; i++) {
        b->offsets[i] = off;
        b->sizes[i] = (size_t)items[i].size;
        memcpy(b->data + off, items[i].buf, (size_t)items[i].size);
        off += (size_t)items[i].size;
    }
    b->nbytes = total;
    return BW_OK;
}

int bw__stream_fetch_batch(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, bw_batch *b)
{
    b->err[0] = '\0';
    size_t n = b->count;
    item *items = calloc(n ? n : 1, sizeof(*items));
    run *runs = calloc(n ? n : 1, sizeof(*runs));
    size_t nruns = 0;
    int rc = items && runs ? BW_OK : BW_NOMEM;
    for (size_t i = 0; i < n && rc == BW_OK; i++) {
        if (bw__stream_order_locate(&sc->order, b->indices[i], &items[i].src, &items[i].rec) !=
            BW_OK) {
            snprintf(b->err, sizeof(b->err),
                     "position %" PRIu64 " is past the end of the stream (%" PRIu64 " records)",
                     b->indices[i], sc->order.total);
            rc = BW_INTERNAL;
            break;
        }
        if (nruns && items[i].src == items[i - 1].src && items[i].rec == items[i - 1].rec + 1 &&
            runs[nruns - 1].n < UINT32_MAX)
            runs[nruns - 1].n++;
        else
            runs[nruns++] = (run){.first = i, .n = 1};
    }
    bw__suspects suspects = {{NULL}, 0};
    bool refresh = false;
    uint64_t start = bw__mono_ms(), backoff = 20;
    char err[BW_LOADER_ERRLEN] = "";
    size_t remaining = nruns;
    while (rc == BW_OK && remaining > 0) {
        bw__placement *p = bw__session_placement(ctx->session, refresh, err, sizeof(err));
        refresh = false;
        int round_rc = BW_OK;
        if (!p || p->nworkers == 0) {
            round_rc = BW_UNAVAILABLE;
            if (!err[0] || p)
                snprintf(err, sizeof(err), "no storage worker is alive");
        }
        /* Ask every owner at once, then read the answers in order. */
        for (size_t ri = 0; ri < nruns; ri++)
            runs[ri].tried = false;
        for (size_t ri = 0; ri < nruns && round_rc == BW_OK; ri++) {
            run *r = &runs[ri];
            if (r->k == r->n)
                continue;
            const item *x = &items[r->first + r->k];
            uint32_t shard = bw__placement_stream_shard(x->src, sc->paths[x->src], p->num_shards,
                                                        BW_SHARD_MODULO);
            bool checked;
            r->worker = bw__fetch_pick_worker(p, shard, &suspects, &checked);
            if (r->worker < 0) {
                round_rc = BW_UNAVAILABLE;
                snprintf(err, sizeof(err), "every storage worker failed: %.900s",
                         b->err[0] ? b->err : "no worker left");
                break;
            }
            char e[BW_LOADER_ERRLEN];
            r->tried = true;
            if (open_read(ctx, sc, p, (size_t)r->worker, checked, x->src, x->rec, r->n - r->k,
                          false, &r->st, e, sizeof(e)) != BW_OK)
                r->st = NULL;
        }
        for (size_t ri = 0; ri < nruns; ri++) {
            run *r = &runs[ri];
            if (!r->tried)
                continue;
            const char *wid = p->workers[r->worker].id;
            int src = r->st ? drain(ctx, sc, r, items, err, sizeof(err)) : BW_UNAVAILABLE;
            if (!r->st)
                snprintf(err, sizeof(err), "worker %s: cannot open a stream", wid);
            bw__rpc_stream_close(r->st);
            r->st = NULL;
            if (src == BW_OK)
                continue;
            snprintf(b->err, sizeof(b->err), "%s", err);
            if (!bw__fetch_retryable(src)) {
                round_rc = src; /* the data itself is bad: no other worker will differ */
                continue;
            }
            if (bw__suspects_note(&suspects, wid, src, &refresh))
                BW_INFO("worker=%s failed while serving a stream; reading its records "
                        "elsewhere: %s",
                        wid, err);
            if (round_rc == BW_OK)
                round_rc = src;
        }
        bw__placement_put(p);
        size_t before = remaining;
        remaining = 0;
        for (size_t ri = 0; ri < nruns; ri++)
            remaining += runs[ri].k < runs[ri].n;
        if (round_rc != BW_OK && !bw__fetch_retryable(round_rc)) {
            rc = round_rc;
            break;
        }
        if (remaining == 0)
            break;
        if (bw__mono_ms() - start > (uint64_t)ctx->timeout_ms) {
            rc = BW_UNAVAILABLE;
            snprintf(b->err, sizeof(b->err),
                     "%zu record runs of step %" PRIu64 " could not be read in %d ms: %.900s",
                     remaining, b->step, ctx->timeout_ms, err);
            break;
        }
        if (remaining == before) {
            usleep((useconds_t)(backoff * 1000));
            backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
            refresh = true;
        }
    }
    if (rc == BW_OK)
        rc = pack(b, items);
    else if (!b->err[0])
        snprintf(b->err, sizeof(b->err), "%s", err[0] ? err : bw_strerror(rc));
    for (size_t i = 0; items && i < n; i++)
        free(items[i].buf);
    bw__suspects_clear(&suspects);
    free(items);
    free(runs);
    return b->rc = rc;
}

/* ---- cursors ---- */

/* The byte offset of record rec of source src: known, else asked of the source's owner
 * (from its index; nothing is read). */
static int locate(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, uint32_t src, uint64_t rec,
                  uint64_t *off, char *err, size_t errlen)
{
    if (known_offset(sc, src, rec, off))
        return BW_OK;
    bw__suspects suspects = {{NULL}, 0};
    int rc = BW_UNAVAILABLE;
    snprintf(err, errlen, "no storage worker is alive");
    for (int attempt = 0; attempt < 4 && rc != BW_OK; attempt++) {
        bw__placement *p = bw__session_placement(ctx->session, attempt > 0, err, errlen);
        if (!p || p->nworkers == 0) {
            bw__placement_put(p);
            usleep(100 * 1000);
            continue;
        }
        uint32_t shard =
            bw__placement_stream_shard(src, sc->paths[src], p->num_shards, BW_SHARD_MODULO);
        bool checked;
        long wk = bw__fetch_pick_worker(p, shard, &suspects, &checked);
        bw_rpc_stream *st = NULL;
        if (wk >= 0 && (rc = open_read(ctx, sc, p, (size_t)wk, checked, src, rec, 0, true, &st, err,
                                       errlen)) == BW_OK) {
            bw_arena a;
            bw__arena_init(&a, 0);
            ProtobufCMessage *msg = NULL;
            rc = bw__rpc_stream_next(st, &a, &msg, err, errlen);
            const Batchwire__V1__SampleBatch *sb = (const void *)msg;
            if (rc == BW_OK && (sb->n_samples != 1 || sb->samples[0]->index != rec)) {
                snprintf(err, errlen, "worker answered a locate with %zu samples", sb->n_samples);
                rc = BW_PROTOCOL;
            }
            if (rc == BW_OK)
                *off = sb->samples[0]->offset;
            else if (rc == BW_RPC_STREAM_END)
                rc = BW_PROTOCOL;
            bw__arena_reset(&a);
        }
        bw__rpc_stream_close(st);
        bool unused;
        if (rc != BW_OK && wk >= 0)
            bw__suspects_note(&suspects, p->workers[wk].id, rc, &unused);
        bw__placement_put(p);
        if (rc != BW_OK && !bw__fetch_retryable(rc))
            break;
    }
    bw__suspects_clear(&suspects);
    if (rc == BW_OK)
        bw__stream_learn(sc, src, rec, *off);
    return rc;
}

uint64_t bw__stream_position(const bw__stream_ctx *sc, uint32_t rank, uint64_t step, uint64_t g)
{
    if (sc->pre_sharded)
        return bw__stream_order_position(&sc->order, rank,
                                         bw__preshard_consumed(&sc->ps, rank, step));
    uint64_t total = sc->order.total;
    return g && step > total / g ? total : (step * g < total ? step * g : total);
}

int bw__stream_cursor_fill(const bw__fetch_ctx *ctx, bw__stream_ctx *sc, uint32_t rank,
                           uint64_t step, uint64_t g, Batchwire__V1__Cursor *c, char *err,
                           size_t errlen)
{
    size_t n = sc->nsources;
    c->source_offsets = calloc(n, sizeof(uint64_t));
    c->source_records = calloc(n, sizeof(uint64_t));
    if (!c->source_offsets || !c->source_records)
        return BW_NOMEM;
    c->n_source_offsets = c->n_source_records = n;
    c->stream_position = bw__stream_position(sc, rank, step, g);
    for (size_t j = 0; j < n; j++) {
        if (sc->pre_sharded && j != rank)
            continue; /* a pre-sharded rank's cursor carries its own source only */
        uint64_t rec = sc->pre_sharded
                           ? bw__preshard_consumed(&sc->ps, rank, step)
                           : bw__stream_order_consumed(&sc->order, (uint32_t)j, c->stream_position);
        c->source_records[j] = rec;
        int rc = locate(ctx, sc, (uint32_t)j, rec, &c->source_offsets[j], err, errlen);
        if (rc != BW_OK)
            return rc;
    }
    return BW_OK;
}

int bw__stream_cursor_check(bw__stream_ctx *sc, const Batchwire__V1__Cursor *c, uint32_t rank,
                            uint64_t g, char *err, size_t errlen)
{
    size_t n = sc->nsources;
    if (c->n_source_offsets == 0 && c->n_source_records == 0 && c->step == 0)
        return BW_OK; /* the start of an epoch needs no offsets */
    if (c->n_source_offsets != n || c->n_source_records != n) {
        snprintf(err, errlen,
                 "cursor refused: it carries %zu stream offsets and %zu record counts for a "
                 "stream of %zu sources",
                 c->n_source_offsets, c->n_source_records, n);
        return BW_MISMATCH;
    }
    uint64_t pos = bw__stream_position(sc, rank, c->step, g);
    if (c->stream_position != pos) {
        snprintf(err, errlen,
                 "cursor refused: its stream position %" PRIu64 " is not where step %" PRIu64
                 " of rank %u starts (%" PRIu64 ")",
                 c->stream_position, c->step, rank, pos);
        return BW_MISMATCH;
    }
    for (size_t j = 0; j < n; j++) {
        if (sc->pre_sharded && j != rank)
            continue;
        uint64_t rec = sc->pre_sharded ? bw__preshard_consumed(&sc->ps, rank, c->step)
                                       : bw__stream_order_consumed(&sc->order, (uint32_t)j, pos);
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
