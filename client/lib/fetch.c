/* Fetching one batch's samples from the storage workers that own them, in plan order, with
 * failover: a worker that fails or refuses is routed around and the missing samples are
 * fetched again, so the trainer sees neither loss, duplication nor reordering. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "common/log.h"
#include "common/util.h"
#include "rpc/dchan.h"
#include "loader_int.h"
#include "placement/placement.h"

/* One distinct sample of the batch (padding repeats an index; it is fetched once). */
typedef struct want {
    uint64_t index;
    size_t first; /* first position in the batch */
    uint64_t size, got;
    uint8_t *buf; /* variable-size samples: its own buffer until the batch is packed */
    bool done;
} want;

typedef struct route {
    size_t worker; /* index into the placement's workers */
    bool checked;  /* routed by the placement (send its version) or around a suspect (0) */
    size_t *wants; /* indices into the want array, in request order */
    size_t n;
    bw_rpc_stream *st; /* gRPC ReadSamples, or: */
    bw__dconn *dc;     /* the worker's data channel, with the request sent on it */
    uint8_t *req;
    size_t reqlen;
    char open_err[640]; /* why neither could be opened */
    struct dread *dr;   /* the data channel's response, once read */
} route;

static int cmp_u64_pos(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

/* Distinct indices of the batch with their first position; uid[pos] = want number. */
static int dedupe(const bw_batch *b, want **out, size_t *nout, size_t *uid)
{
    size_t n = b->count;
    uint64_t *pairs = malloc((n ? n : 1) * 2 * sizeof(uint64_t));
    want *w = calloc(n ? n : 1, sizeof(*w));
    if (!pairs || !w) {
        free(pairs);
        free(w);
        return BW_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        pairs[2 * i] = b->indices[i];
        pairs[2 * i + 1] = i;
    }
    qsort(pairs, n, 2 * sizeof(uint64_t), cmp_u64_pos);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || pairs[2 * i] != pairs[2 * i - 2]) {
            w[m].index = pairs[2 * i];
            w[m].first = (size_t)pairs[2 * i + 1];
            m++;
        }
        uid[pairs[2 * i + 1]] = m - 1;
    }
    free(pairs);
    *out = w;
    *nout = m;
    return BW_OK;
}

bool bw__suspects_has(const bw__suspects *s, const char *id)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->ids[i], id) == 0)
            return true;
    return false;
}

bool bw__suspects_note(bw__suspects *s, const char *id, int rc, bool *refresh)
{
    *refresh = true;
    if (rc == BW_WRONG_OWNER || s->n == BW_MAX_SUSPECTS || bw__suspects_has(s, id))
        return false;
    s->ids[s->n++] = strdup(id);
    return true;
}

void bw__suspects_clear(bw__suspects *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->ids[i]);
    s->n = 0;
}

long bw__fetch_pick_worker(const bw__placement *p, uint32_t shard, const bw__suspects *s,
                           bool *checked)
{
    size_t owner = p->owners[shard];
    if (!bw__suspects_has(s, p->workers[owner].id)) {
        *checked = true;
        return (long)owner;
    }
    *checked = false;
    const char **ids = malloc(p->nworkers * sizeof(*ids));
    size_t *map = malloc(p->nworkers * sizeof(*map)), m = 0;
    if (!ids || !map)
        abort();
    for (size_t i = 0; i < p->nworkers; i++)
        if (!bw__suspects_has(s, p->workers[i].id)) {
            ids[m] = p->workers[i].id;
            map[m++] = i;
        }
    long pick = m ? (long)map[bw__placement_owner(ids, m, shard)] : -1;
    free(ids);
    free(map);
    return pick;
}

/* Where the samples of one route's stream go, in request order. */
typedef struct placer {
    route *r;
    want *w;
    const bw__fetch_ctx *ctx;
    bw_batch *b;
    size_t k; /* the route's next expected sample */
} placer;

static int place(void *arg, uint64_t index, uint64_t size, uint64_t chunk_offset, uint64_t len,
                 uint8_t **dest, char *err, size_t errlen)
{
    placer *pl = arg;
    want *x = pl->k < pl->r->n ? &pl->w[pl->r->wants[pl->k]] : NULL;
    if (!x || index != x->index || chunk_offset != x->got || chunk_offset + len > size ||
        (pl->ctx->sample_bytes && size != pl->ctx->sample_bytes) ||
        (x->got > 0 && size != x->size)) {
        snprintf(err, errlen,
                 "worker sent sample %llu (chunk at %llu of %llu bytes) where sample %llu at "
                 "%llu was due",
                 (unsigned long long)index, (unsigned long long)chunk_offset,
                 (unsigned long long)size, x ? (unsigned long long)x->index : 0ull,
                 x ? (unsigned long long)x->got : 0ull);
        return BW_PROTOCOL;
    }
    if (x->got == 0) {
        x->size = size;
        if (!pl->ctx->sample_bytes && !(x->buf = malloc(size ? size : 1)))
            return BW_NOMEM;
    }
    uint8_t *base = pl->ctx->sample_bytes ? pl->b->data + x->first * pl->ctx->sample_bytes : x->buf;
    *dest = base + chunk_offset;
    x->got += len;
    if (x->got == x->size) {
        x->done = true;
        pl->k++;
    }
    return BW_OK;
}

/* Reads a route's stream to the end, storing what arrives. Returns BW_OK or the stream's
 * error with a sentence in err. */
static int drain(route *r, want *w, const bw__fetch_ctx *ctx, bw_batch *b, char *err, size_t errlen)
{
    placer pl = {r, w, ctx, b, 0};
    int rc;
    for (;;) {
        grpc_byte_buffer *msg = NULL;
        rc = bw__rpc_stream_next_raw(r->st, &msg, err, errlen);
        if (rc != BW_OK)
            break;
        rc = bw__decode_sample_batch(msg, place, &pl, err, errlen);
        grpc_byte_buffer_destroy(msg);
        if (rc != BW_OK)
            break;
    }
    if (rc == BW_RPC_STREAM_END) {
        if (pl.k == r->n)
            return BW_OK;
        snprintf(err, errlen, "worker ended the stream after %zu of %zu samples", pl.k, r->n);
        return BW_PROTOCOL;
    }
    /* Samples completed before the failure are kept; a partial one starts over. */
    if (pl.k < r->n && !w[r->wants[pl.k]].done) {
        free(w[r->wants[pl.k]].buf);
        w[r->wants[pl.k]].buf = NULL;
        w[r->wants[pl.k]].got = 0;
    }
    return rc;
}

/* ---- the data channel ---- */

/* Packs the request once (kept for a resend on a fresh connection). */
static void dchan_pack(route *r, const Batchwire__V1__ReadSamplesRequest *req)
{
    size_t len = batchwire__v1__read_samples_request__get_packed_size(req);
    r->req = malloc(BW_DCHAN_REQ_HEADER + len);
    if (!r->req)
        abort();
    bw__dchan_put_req_header(r->req, BW_DCHAN_KIND_READ_SAMPLES, len);
    batchwire__v1__read_samples_request__pack(req, r->req + BW_DCHAN_REQ_HEADER);
    r->reqlen = BW_DCHAN_REQ_HEADER + len;
}

static int dchan_send(bw__session *sess, route *r, const char *address, int timeout_ms, bool fresh,
                      char *err, size_t errlen)
{
    if (fresh) { /* r->dc was found closed: so are the other idle ones to this worker */
        bw__dconn_put(sess, r->dc, false);
        r->dc = NULL;
        bw__dconn_drop_idle(sess, address);
    }
    int rc = r->dc ? BW_OK : bw__dconn_get(sess, address, timeout_ms, &r->dc, err, errlen);
    if (rc != BW_OK)
        return rc;
    struct iovec iov = {r->req, r->reqlen};
    rc =
        bw__dsock_writev_all(&r->dc->s, &iov, 1, bw__mono_ms() + (uint64_t)timeout_ms, err, errlen);
    if (rc != BW_OK && r->dc->reused && !fresh) /* the worker closed an idle connection */
        return dchan_send(sess, r, address, timeout_ms, true, err, errlen);
    return rc;
}

/* One data-channel response, read without blocking alongside the round's other responses:
 * the connection that has data is served, so no worker waits behind another. */
typedef struct dread {
    route *r;
    placer pl;
    const char *wid, *address;
    enum { D_HDR, D_DATA, D_MSG, D_DONE } phase;
    uint8_t hdr[BW_DCHAN_FRAME_HEADER];
    size_t hgot;
    bw_dchan_frame f;
    uint8_t *dest; /* D_DATA: the sample's place; D_MSG: msg */
    size_t need, got, k;
    bool any, retried;
    bool busy; /* refused before any sample: the worker is at its data-connection limit */
    int rc;
    char msg[BW_DCHAN_MAX_MESSAGE + 1];
    char err[BW_LOADER_ERRLEN];
} dread;

static void dread_finish(dread *d, const bw__fetch_ctx *ctx, int rc, bool reusable, const char *e)
{
    d->phase = D_DONE;
    d->rc = rc;
    bw__dconn_put(ctx->session, d->r->dc, reusable);
    d->r->dc = NULL;
    if (rc != BW_OK)
        snprintf(d->err, sizeof(d->err), "worker %s data channel %s: %.900s", d->wid, d->address,
                 e);
}

/* The frame in d->hdr: starts its payload, or finishes the response. */
static void dread_frame(dread *d, const bw__fetch_ctx *ctx)
{
    char e[BW_LOADER_ERRLEN];
    bw_dchan_frame *f = &d->f;
    bw__dchan_get_frame(d->hdr, f);
    d->any = true;
    d->got = 0;
    if (f->type == BW_DCHAN_SAMPLE) {
        d->r->dc->read_ahead = f->b < BW_DCONN_BUF / 4;
        d->k = d->pl.k;
        d->dest = NULL;
        int rc = place(&d->pl, f->a, f->b, 0, f->b, &d->dest, e, sizeof(e));
        if (rc != BW_OK)
            return dread_finish(d, ctx, rc, false, e);
        d->need = (size_t)f->b;
        d->phase = D_DATA;
    } else if (f->type == BW_DCHAN_END) {
        if (d->pl.k != d->r->n || f->a != d->r->n) {
            snprintf(e, sizeof(e), "ended the request after %zu of %zu samples", d->pl.k, d->r->n);
            return dread_finish(d, ctx, BW_PROTOCOL, true, e);
        }
        dread_finish(d, ctx, BW_OK, true, "");
    } else if (f->type == BW_DCHAN_ERROR && f->a <= BW_DCHAN_MAX_MESSAGE) {
        d->dest = (uint8_t *)d->msg;
        d->need = (size_t)f->a;
        d->phase = D_MSG;
    } else {
        snprintf(e, sizeof(e), "unexpected frame type %u", f->type);
        dread_finish(d, ctx, BW_PROTOCOL, false, e);
    }
}

/* The ERROR frame's message has arrived. */
static void dread_error(dread *d, const bw__fetch_ctx *ctx)
{
    char e[BW_LOADER_ERRLEN];
    d->msg[d->need] = '\0';
    int code = (int)(int32_t)d->f.code;
    if (code >= 0 || strcmp(bw_err_name(code), "BW_UNKNOWN_ERROR") == 0) {
        snprintf(e, sizeof(e), "error frame with unknown code %d: %.900s", code, d->msg);
        return dread_finish(d, ctx, BW_PROTOCOL, true, e);
    }
    d->busy = code == BW_UNAVAILABLE && d->pl.k == 0;
    dread_finish(d, ctx, code, !d->busy, d->msg);
}

/* Reads what has arrived for d (never waits). */
static void dread_step(dread *d, const bw__fetch_ctx *ctx, want *w)
{
    char e[BW_LOADER_ERRLEN];
    while (d->phase != D_DONE) {
        bw__dconn *c = d->r->dc;
        size_t got = 0;
        int rc;
        if (d->phase == D_HDR) {
            rc = bw__dconn_take(c, d->hdr + d->hgot, sizeof(d->hdr) - d->hgot, false, &got, e,
                                sizeof(e));
            if (rc == BW_UNAVAILABLE && !d->any && d->hgot == 0 && c->reused && !d->retried) {
                /* An idle connection the worker had closed: ask again on a new one. */
                BW_DEBUG("worker=%s data channel %s: an idle connection was closed (%s); asking "
                         "again on a new one",
                         d->wid, d->address, e);
                d->retried = true;
                rc =
                    dchan_send(ctx->session, d->r, d->address, ctx->timeout_ms, true, e, sizeof(e));
                if (rc == BW_OK)
                    continue;
            }
            if (rc != BW_OK)
                return dread_finish(d, ctx, rc, false, e);
            if (!got)
                return;
            if ((d->hgot += got) == sizeof(d->hdr)) {
                d->hgot = 0;
                dread_frame(d, ctx);
            }
            continue;
        }
        if (d->got < d->need) {
            size_t left = d->need - d->got;
            rc = bw__dconn_take(c, d->dest + d->got, left,
                                d->phase == D_DATA && (left >= BW_DCONN_BUF / 4 || !c->read_ahead),
                                &got, e, sizeof(e));
            if (rc != BW_OK && d->phase == D_DATA) { /* the sample starts over */
                want *x = &w[d->r->wants[d->k]];
                free(x->buf);
                x->buf = NULL;
                x->got = 0;
                x->done = false;
                d->pl.k = d->k;
            }
            if (rc != BW_OK)
                return dread_finish(d, ctx, rc, false, e);
            if (!got)
                return;
            d->got += got;
        }
        if (d->got == d->need) {
            if (d->phase == D_MSG)
                dread_error(d, ctx);
            else
                d->phase = D_HDR;
        }
    }
}

/* Reads every data-channel response of a round to its end, serving whichever connection
 * has data; each sample's bytes go straight to where `place` says. */
static void dread_all(dread *ds, size_t n, const bw__fetch_ctx *ctx, want *w)
{
    uint64_t deadline = bw__mono_ms() + (uint64_t)ctx->timeout_ms;
    struct pollfd *pf = malloc((n ? n : 1) * sizeof(*pf));
    size_t *who = malloc((n ? n : 1) * sizeof(*who));
    if (!pf || !who)
        abort();
    for (size_t i = 0; i < n; i++)
        dread_step(&ds[i], ctx, w);
    for (;;) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (ds[i].phase != D_DONE) {
                pf[m] = (struct pollfd){ds[i].r->dc->s.fd, POLLIN, 0};
                who[m++] = i;
            }
        if (m == 0)
            break;
        uint64_t now = bw__mono_ms();
        int ready = now < deadline ? poll(pf, m, (int)(deadline - now)) : 0;
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0) {
            for (size_t j = 0; j < m; j++)
                dread_finish(&ds[who[j]], ctx, BW_TIMEOUT, false,
                             ready == 0 ? "no data before the deadline" : strerror(errno));
            break;
        }
        for (size_t j = 0; j < m; j++)
            if (pf[j].revents)
                dread_step(&ds[who[j]], ctx, w);
    }
    free(pf);
    free(who);
}

/* Errors after which another worker (or a fresher placement) may succeed. */
bool bw__fetch_retryable(int rc)
{
    return rc == BW_UNAVAILABLE || rc == BW_TIMEOUT || rc == BW_WRONG_OWNER || rc == BW_CANCELLED ||
           rc == BW_ABORTED || rc == BW_PROTOCOL || rc == BW_INTERNAL;
}

/* Lays variable-size samples out in batch order. */
static int pack(bw_batch *b, want *w, const size_t *uid, const bw__fetch_ctx *ctx)
{
    size_t total = 0;
    for (size_t i = 0; i < b->count; i++)
        total += (size_t)w[uid[i]].size;
    int rc = bw__batch_reserve(b, total);
    if (rc != BW_OK)
        return rc;
    size_t off = 0;
    for (size_t i = 0; i < b->count; i++) {
        want *x = &w[uid[i]];
        b->offsets[i] = off;
        b->sizes[i] = (size_t)x->size;
        if (ctx->sample_bytes) {
            if (x->first != i)
                memcpy(b->data + off, b->data + x->first * ctx->sample_bytes, (size_t)x->size);
        } else {
            memcpy(b->data + off, x->buf, (size_t)x->size);
        }
        off += (size_t)x->size;
    }
    b->nbytes = total;
    return BW_OK;
}

int bw__fetch_batch(const bw__fetch_ctx *ctx, bw_batch *b)
{
    b->err[0] = '\0';
    size_t *uid = malloc((b->count ? b->count : 1) * sizeof(*uid));
    want *w = NULL;
    size_t nw = 0;
    int rc = uid ? dedupe(b, &w, &nw, uid) : BW_NOMEM;
    if (rc == BW_OK && ctx->sample_bytes)
        rc = bw__batch_reserve(b, b->count * (size_t)ctx->sample_bytes);
    if (rc != BW_OK) {
        free(uid);
        snprintf(b->err, sizeof(b->err), "out of memory for a batch of %zu samples", b->count);
        return b->rc = rc;
    }
    bw__suspects suspects = {{NULL}, 0};
    bool refresh = false;
    uint64_t start = bw__mono_ms(), backoff = 20;
    char err[BW_LOADER_ERRLEN] = "";
    size_t remaining = nw;
    while (remaining > 0) {
        bw__placement *p = bw__session_placement(ctx->session, refresh, err, sizeof(err));
        refresh = false;
        bool busy = false; /* a worker's data channel was full: it is asked over gRPC now */
        route *routes = NULL;
        size_t nroutes = 0;
        int round_rc = BW_OK;
        if (!p || p->nworkers == 0) {
            round_rc = BW_UNAVAILABLE;
            if (!err[0] || p)
                snprintf(err, sizeof(err), "no storage worker is alive");
        } else {
            /* Group the missing samples by the worker that serves them: route 2w for
             * worker w as placed, 2w+1 for samples routed around a failed owner. */
            nroutes = p->nworkers * 2;
            routes = calloc(nroutes, sizeof(*routes));
            size_t *slots = malloc(remaining * sizeof(size_t));
            size_t *rof = malloc(nw * sizeof(size_t));
            if (!routes || !slots || !rof)
                abort();
            for (size_t u = 0; u < nw && round_rc == BW_OK; u++) {
                if (w[u].done)
                    continue;
                uint32_t shard = bw__placement_shard(w[u].index, p->num_shards, BW_SHARD_MODULO);
                bool checked;
                long wk = bw__fetch_pick_worker(p, shard, &suspects, &checked);
                if (wk < 0) {
                    round_rc = BW_UNAVAILABLE;
                    snprintf(err, sizeof(err), "every storage worker failed: %.900s",
                             b->err[0] ? b->err : "no worker left");
                    break;
                }
                rof[u] = (size_t)wk * 2 + (checked ? 0 : 1);
                routes[rof[u]].worker = (size_t)wk;
                routes[rof[u]].checked = checked;
                routes[rof[u]].n++;
            }
            size_t off = 0;
            for (size_t ri = 0; ri < nroutes; ri++) {
                routes[ri].wants = slots + off;
                off += routes[ri].n;
                routes[ri].n = 0;
            }
            for (size_t u = 0; u < nw && round_rc == BW_OK; u++)
                if (!w[u].done)
                    routes[rof[u]].wants[routes[rof[u]].n++] = u;
            free(rof);
            if (round_rc != BW_OK)
                nroutes = 0;
            /* Ask every worker at once, then read the answers. */
            for (size_t ri = 0; ri < nroutes; ri++) {
                route *r = &routes[ri];
                if (!r->n)
                    continue;
                const bw__worker_ref *wr = &p->workers[r->worker];
                char e[BW_LOADER_ERRLEN];
                bool dchan = ctx->data_channel && wr->data_address[0] &&
                             !bw__dconn_suspended(ctx->session, wr->data_address);
                uint64_t *idx = malloc(r->n * sizeof(uint64_t));
                if (!idx)
                    abort();
                for (size_t i = 0; i < r->n; i++)
                    idx[i] = w[r->wants[i]].index;
                Batchwire__V1__Routing rt = BATCHWIRE__V1__ROUTING__INIT;
                rt.placement_version = r->checked ? p->version : 0;
                rt.num_shards = p->num_shards;
                rt.shard_mode = BATCHWIRE__V1__SHARD_MODE__SHARD_MODE_MODULO;
                Batchwire__V1__ReadSamplesRequest req = BATCHWIRE__V1__READ_SAMPLES_REQUEST__INIT;
                req.dataset = (Batchwire__V1__Dataset *)ctx->dataset;
                req.n_indices = r->n;
                req.indices = idx;
                req.routing = &rt;
                req.fingerprint = (char *)ctx->fingerprint;
                req.max_message_bytes = ctx->max_message_bytes;
                if (dchan && bw__dconn_get(ctx->session, wr->data_address, ctx->timeout_ms, &r->dc,
                                           e, sizeof(e)) != BW_OK) {
                    /* Unreachable data port: the worker may still answer over gRPC. */
                    bw__dconn_suspend(ctx->session, wr->data_address, wr->id, e);
                    dchan = false;
                }
                if (dchan) {
                    dchan_pack(r, &req);
                    if (dchan_send(ctx->session, r, wr->data_address, ctx->timeout_ms, false, e,
                                   sizeof(e)) != BW_OK) {
                        bw__dconn_put(ctx->session, r->dc, false);
                        r->dc = NULL;
                        snprintf(r->open_err, sizeof(r->open_err), "data channel %.200s: %.400s",
                                 wr->data_address, e);
                    }
                } else {
                    bw_rpc_channel *ch =
                        bw__session_worker_channel(ctx->session, wr->address, e, sizeof(e));
                    if (ch)
                        bw__rpc_stream_open(ch, BW_METHOD(BW_M_DATA_READ_SAMPLES), &req.base,
                                            ctx->timeout_ms, &r->st, e, sizeof(e));
                }
                if (!r->st && !r->dc && !r->open_err[0])
                    snprintf(r->open_err, sizeof(r->open_err), "%.500s", e);
                free(idx);
            }
            /* Data channels first, all at once (gRPC streams buffer on their own meanwhile). */
            size_t nd = 0;
            for (size_t ri = 0; ri < nroutes; ri++)
                nd += routes[ri].dc != NULL;
            dread *ds = calloc(nd ? nd : 1, sizeof(*ds));
            if (!ds)
                abort();
            for (size_t ri = 0, j = 0; ri < nroutes; ri++)
                if (routes[ri].dc) {
                    routes[ri].dr = &ds[j];
                    ds[j++] = (dread){.r = &routes[ri],
                                      .pl = {&routes[ri], w, ctx, b, 0},
                                      .wid = p->workers[routes[ri].worker].id,
                                      .address = p->workers[routes[ri].worker].data_address};
                }
            dread_all(ds, nd, ctx, w);
            for (size_t ri = 0; ri < nroutes; ri++) {
                route *r = &routes[ri];
                if (!r->n)
                    continue;
                const char *wid = p->workers[r->worker].id;
                int src = r->dr   ? r->dr->rc
                          : r->st ? drain(r, w, ctx, b, err, sizeof(err))
                                  : BW_UNAVAILABLE;
                if (r->dr && src != BW_OK)
                    snprintf(err, sizeof(err), "%s", r->dr->err);
                if (r->dr && r->dr->busy) {
                    /* Not a failed worker: ask it over gRPC, at once. */
                    bw__dconn_suspend(ctx->session, r->dr->address, wid, r->dr->msg);
                    busy = true;
                    free(r->req);
                    r->req = NULL;
                    continue;
                }
                if (r->dr)
                    ; /* its message is set */
                else if (!r->st && src == BW_UNAVAILABLE && r->open_err[0])
                    snprintf(err, sizeof(err), "worker %s: %s", wid, r->open_err);
                else if (!r->st && src == BW_UNAVAILABLE)
                    snprintf(err, sizeof(err), "worker %s: cannot open a stream", wid);
                bw__rpc_stream_close(r->st);
                r->st = NULL;
                free(r->req);
                r->req = NULL;
                if (src == BW_OK)
                    continue;
                if (!bw__fetch_retryable(src)) {
                    round_rc = src; /* the data itself is bad: no other worker will differ */
                    snprintf(b->err, sizeof(b->err), "%s", err);
                    break;
                }
                if (bw__suspects_note(&suspects, wid, src, &refresh))
                    BW_INFO("worker=%s failed while serving a batch; fetching its samples "
                            "elsewhere: %s",
                            wid, err);
                snprintf(b->err, sizeof(b->err), "%s", err);
                if (round_rc == BW_OK)
                    round_rc = src;
            }
            /* Routes not read because a bad sample ended the round early. */
            for (size_t ri = 0; ri < nroutes; ri++) {
                bw__rpc_stream_close(routes[ri].st);
                bw__dconn_put(ctx->session, routes[ri].dc, false);
                free(routes[ri].req);
            }
            free(ds);
            free(slots);
        }
        free(routes);
        bw__placement_put(p);
        size_t before = remaining;
        remaining = 0;
        for (size_t u = 0; u < nw; u++)
            remaining += !w[u].done;
        if (round_rc != BW_OK && !bw__fetch_retryable(round_rc)) {
            rc = round_rc;
            break;
        }
        if (remaining == 0)
            break;
        if (bw__mono_ms() - start > (uint64_t)ctx->timeout_ms) {
            rc = BW_UNAVAILABLE;
            snprintf(b->err, sizeof(b->err),
                     "%zu samples of step %llu could not be fetched in "
                     "%d ms: %.900s",
                     remaining, (unsigned long long)b->step, ctx->timeout_ms, err);
            break;
        }
        if (remaining == before && !busy) {
            usleep((useconds_t)(backoff * 1000));
            backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
            refresh = true;
        }
    }
    if (rc == BW_OK)
        rc = pack(b, w, uid, ctx);
    for (size_t u = 0; u < nw; u++)
        free(w[u].buf);
    bw__suspects_clear(&suspects);
    free(w);
    free(uid);
    return b->rc = rc;
}
