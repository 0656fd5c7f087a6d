/*
 * The client's one fetch loop (client/lib/fetch.c: bw__fetch_items, through samples_fetch.c's
 * bw__fetch_batch) driven through two fake transports over a fake cluster, with real placement
 * tables. Each fake worker serves deterministic bytes per index (size and content a function of it)
 * and has a behaviour: healthy, dying after k samples, ending short, sending a wrong key, chunk or
 * size, refusing with a non-retryable error, busy, refusing the preferred transport, slow, leaving
 * the placement. Every case checks the batch handed back -- each position's bytes and size, in
 * plan order -- and, where it is the point, which worker was asked for what and how often.
 *
 * The preferred fake mirrors the data channel: a descriptor to poll (a timerfd, so a slow
 * worker is not readable before its delay), each sample placed whole before its bytes arrive,
 * the bytes copied over later recv calls. The fallback fake mirrors gRPC: no descriptor, recv
 * blocks to the end, each sample placed chunk by chunk as its bytes arrive.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "../../client/lib/fetch.h"
#include "../../client/lib/samples_fetch.h"
#include "../../client/lib/batch_int.h"
#include "common/util.h"
#include "placement/placement.h"
#include "rpc/dchan.h"

enum {
    NSHARDS = 256, /* as the loader routes (BW_LOADER_NUM_SHARDS) */
    BLOCK = 2,     /* neighbouring samples placed together (bw__fetch_ctx.block) */
    MAXW = 4,
    MAXIDX = 1024,
    MAXREQ = 16,
};

/* ---- the fake cluster ---- */

typedef enum behave {
    HEALTHY,
    DIE_AFTER,    /* k samples (and with `mid` half of the next), then the connection fails */
    SHORT_AFTER,  /* k samples, then ends the request as if complete */
    WRONG_KEY,    /* after k samples, announces the next one under another index */
    BAD_CHUNK,    /* after k samples, a chunk that does not fit the sample */
    OVER_MAX,     /* after k samples, announces 7*10^18 bytes */
    WRONG_SIZE,   /* after k samples, announces one byte more than sample_bytes */
    CORRUPT,      /* after k samples, BW_CORRUPT: the data itself is bad */
    BUSY_ONCE,    /* its first request: BW_BUSY with a retry-after hint; then healthy */
    REFUSE_START, /* the preferred transport's start refuses it with res->fallback */
    REFUSE_FRAME, /* the preferred transport ends with res->fallback before any sample */
    SLOW,         /* answers delay_ms after a request starts */
    DOWN,         /* every request fails at once with BW_UNAVAILABLE */
    FAIL_LATE,    /* every request fails with BW_UNAVAILABLE after delay_ms */
    HANG_LATER,   /* serves its first request; later ones never answer (blocking: until the
                     timeout the transport was given, then BW_TIMEOUT) */
    LIE_THEN_DIE, /* after k samples, announces the next one 10 bytes longer (with `mid`: half
                     as long) than it is, sends part of it and fails */
    TRICKLE,      /* its descriptor never gets ready, but each read finds a little more (bytes
                     below a transport's wake mark: transport.h, `received`) */
} behave;

typedef enum sizes { SZ_FIXED, SZ_MIXED, SZ_EMPTY } sizes;

typedef struct fworker {
    const char *id;
    behave b;
    size_t k;
    bool mid;
    uint32_t delay_ms, retry_after_ms;
    bool pref_off; /* refused the preferred transport: reached over the fallback from now on */
    int reqs[2];   /* requests started over preferred [0], fallback [1] */
    int nreq;
    bool checked[MAXREQ]; /* request i carried a placement version */
    uint64_t version[MAXREQ];
    uint64_t t_start[MAXREQ], t_end[MAXREQ];
    int timeout_ms[MAXREQ];
    size_t served; /* samples sent whole */
} fworker;

typedef struct cluster {
    fworker w[MAXW];
    size_t nw;
    sizes sz;
    uint64_t fixed;
    bw__placement *current; /* the coordinator's table */
    bw__placement *cached;  /* the client's: replaced only when it asks for a refresh */
    int placement_calls, refreshes;
    int leaver;       /* the worker dropped from placement on its first request; -1: none */
    bool leaver_dead; /* ... and then answers UNAVAILABLE instead of WRONG_OWNER */
    int asked[MAXIDX];
    int served_by[MAXIDX];
} cluster;

static uint64_t sample_size(const cluster *c, uint64_t idx)
{
    switch (c->sz) {
    case SZ_FIXED:
        return c->fixed;
    case SZ_EMPTY:
        return 0;
    case SZ_MIXED:
    default:
        return idx % 3 == 0 ? 0 : 1 + (idx * 37) % 300;
    }
}

static uint8_t sample_byte(uint64_t idx, uint64_t j)
{
    return (uint8_t)(idx * 131u + j * 7u + (j >> 8) + 1u);
}

static const char *const IDS[MAXW] = {"w1", "w2", "w3", "w4"};

/* A placement table as the coordinator builds it: workers sorted by id, owners by rendezvous
 * hashing of the ids (server/placement_service.c), with `skip` left out (-1: none). */
static bw__placement *make_table(uint64_t version, size_t n, int skip)
{
    bw__placement *p = calloc(1, sizeof(*p));
    assert_non_null(p);
    atomic_init(&p->refs, 1);
    p->version = version;
    p->num_shards = NSHARDS;
    p->workers = calloc(n, sizeof(*p->workers));
    p->owners = calloc(NSHARDS, sizeof(*p->owners));
    const char *ids[MAXW];
    for (size_t i = 0; i < n; i++) {
        if ((int)i == skip)
            continue;
        char addr[64];
        bw__worker_ref *wr = &p->workers[p->nworkers];
        ids[p->nworkers++] = IDS[i];
        wr->id = strdup(IDS[i]);
        snprintf(addr, sizeof(addr), "grpc-%s:1", IDS[i]);
        wr->address = strdup(addr);
        snprintf(addr, sizeof(addr), "data-%s:2", IDS[i]);
        wr->data_address = strdup(addr);
    }
    for (uint32_t s = 0; s < NSHARDS; s++)
        p->owners[s] = (uint32_t)bw__placement_owner(ids, p->nworkers, s);
    return p;
}

static void cluster_init(cluster *c, size_t nw, sizes sz, uint64_t fixed)
{
    memset(c, 0, sizeof(*c));
    c->nw = nw;
    c->sz = sz;
    c->fixed = fixed;
    for (size_t i = 0; i < nw; i++)
        c->w[i].id = IDS[i];
    c->current = make_table(1, nw, -1);
    c->cached = c->current;
    atomic_fetch_add(&c->cached->refs, 1);
    c->leaver = -1;
    for (size_t i = 0; i < MAXIDX; i++)
        c->served_by[i] = -1;
}

static void cluster_free(cluster *c)
{
    bw__placement_put(c->current);
    bw__placement_put(c->cached);
}

/* The worker that owns index idx under table p, leaving out the workers in `gone` (a bit
 * mask of cluster indices): where the loop must fail over to. */
static int owner_of(uint64_t idx, unsigned gone)
{
    const char *ids[MAXW];
    int map[MAXW];
    size_t m = 0;
    for (int i = 0; i < MAXW; i++)
        if (!(gone & (1u << i))) {
            ids[m] = IDS[i];
            map[m++] = i;
        }
    return map[bw__placement_owner(ids, m,
                                   bw__placement_shard(idx, BLOCK, NSHARDS, BW_SHARD_MODULO))];
}

static bw__placement *fake_placement(void *arg, bool refresh, char *err, size_t errlen)
{
    cluster *c = arg;
    c->placement_calls++;
    if (refresh) {
        c->refreshes++;
        if (c->cached != c->current) {
            bw__placement_put(c->cached);
            c->cached = c->current;
            atomic_fetch_add(&c->cached->refs, 1);
        }
    }
    if (!c->cached) {
        snprintf(err, errlen, "no placement");
        return NULL;
    }
    atomic_fetch_add(&c->cached->refs, 1);
    return c->cached;
}

/* ---- the fake transports ---- */

typedef struct ftransport {
    cluster *c;
    int which; /* 0: preferred (pollable, whole samples); 1: fallback (blocking, chunks) */
} ftransport;

struct bw__xfer {
    cluster *c;
    fworker *w;
    int wi, which, reqno;
    uint64_t *idx;
    size_t n, pos; /* samples asked; the one being sent */
    uint64_t off;  /* its bytes sent */
    uint64_t size; /* its announced size (whole mode: placed) */
    bool placed;
    uint8_t *dest;
    int fd;
    int end_rc; /* decided at start (a placement refusal); 0: serve */
    char end_err[256];
    int timeout_ms;
};

static fworker *find_worker(cluster *c, const char *id, int *wi)
{
    for (size_t i = 0; i < c->nw; i++)
        if (strcmp(c->w[i].id, id) == 0) {
            *wi = (int)i;
            return &c->w[i];
        }
    fail_msg("the loop asked unknown worker %s", id);
    return NULL;
}

static bool fusable(void *state, const bw__worker_ref *wr)
{
    ftransport *t = state;
    int wi;
    fworker *w = find_worker(t->c, wr->id, &wi);
    return t->which == 0 ? wr->data_address[0] && !w->pref_off : wr->address[0] != '\0';
}

static const Batchwire__V1__Dataset *g_dataset;
static const char *g_fingerprint;

static int fstart(void *state, const bw__worker_ref *wr, const bw__read_req *req, int timeout_ms,
                  bw__xfer **out, bw__xres *res)
{
    ftransport *t = state;
    cluster *c = t->c;
    int wi;
    fworker *w = find_worker(c, wr->id, &wi);
    *out = NULL;
    assert_int_equal(req->kind, BW_DCHAN_KIND_READ_SAMPLES);
    /* The request as a worker gets it: packed, then unpacked. */
    size_t len = protobuf_c_message_get_packed_size(req->msg);
    uint8_t *buf = malloc(len ? len : 1);
    assert_non_null(buf);
    protobuf_c_message_pack(req->msg, buf);
    Batchwire__V1__ReadSamplesRequest *r =
        batchwire__v1__read_samples_request__unpack(NULL, len, buf);
    free(buf);
    assert_non_null(r);
    assert_non_null(r->dataset);
    assert_string_equal(r->dataset->format, g_dataset->format);
    assert_string_equal(r->fingerprint, g_fingerprint);
    assert_non_null(r->routing);
    assert_int_equal(r->routing->num_shards, NSHARDS);
    assert_int_equal(r->routing->block_samples, BLOCK);
    assert_true(r->n_indices > 0);

    int reqno = w->nreq++;
    assert_true(reqno < MAXREQ);
    w->reqs[t->which]++;
    w->checked[reqno] = r->routing->placement_version != 0;
    w->version[reqno] = r->routing->placement_version;
    w->t_start[reqno] = bw__mono_ms();
    w->timeout_ms[reqno] = timeout_ms;
    for (size_t i = 0; i < r->n_indices; i++) {
        assert_true(r->indices[i] < MAXIDX);
        c->asked[r->indices[i]]++;
    }
    if (t->which == 0 && w->b == REFUSE_START) {
        w->pref_off = true;
        batchwire__v1__read_samples_request__free_unpacked(r, NULL);
        res->fallback = true;
        snprintf(res->err, sizeof(res->err), "fake %s: data port refused", w->id);
        return res->rc = BW_UNAVAILABLE;
    }
    if (c->leaver == wi && reqno == 0) { /* the coordinator drops it: a new version */
        bw__placement *p = make_table(c->current->version + 1, c->nw, wi);
        bw__placement_put(c->current);
        c->current = p;
    }

    bw__xfer *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    x->c = c;
    x->w = w;
    x->wi = wi;
    x->which = t->which;
    x->reqno = reqno;
    x->timeout_ms = timeout_ms;
    x->n = r->n_indices;
    x->idx = malloc(x->n * sizeof(*x->idx));
    assert_non_null(x->idx);
    memcpy(x->idx, r->indices, x->n * sizeof(*x->idx));
    x->fd = -1;
    /* A worker checks ownership under its own (the coordinator's current) placement when the
     * request carries a version, as worker/placement_view.c does. */
    if (r->routing->placement_version) {
        const bw__placement *p = c->current;
        long mine = -1;
        for (size_t i = 0; i < p->nworkers; i++)
            if (strcmp(p->workers[i].id, w->id) == 0)
                mine = (long)i;
        for (size_t i = 0; i < x->n && !x->end_rc; i++) {
            uint32_t s =
                bw__placement_shard(x->idx[i], r->routing->block_samples, NSHARDS, BW_SHARD_MODULO);
            if ((long)p->owners[s] != mine) {
                x->end_rc = BW_WRONG_OWNER;
                snprintf(x->end_err, sizeof(x->end_err),
                         "fake %s: shard %u is not mine under placement version %" PRIu64, w->id, s,
                         p->version);
            }
        }
    }
    if (c->leaver == wi && c->leaver_dead) {
        x->end_rc = BW_UNAVAILABLE;
        snprintf(x->end_err, sizeof(x->end_err), "fake %s: shutting down", w->id);
    }
    batchwire__v1__read_samples_request__free_unpacked(r, NULL);
    if (t->which == 0) {
        x->fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
        assert_true(x->fd >= 0);
        uint32_t ms = w->b == SLOW || w->b == FAIL_LATE ? w->delay_ms : 0;
        struct itimerspec its = {{0, 0}, {ms / 1000, (long)(ms % 1000) * 1000000L + 1}};
        if ((w->b == HANG_LATER && reqno > 0) || w->b == TRICKLE)
            its.it_value = (struct timespec){3600, 0};
        assert_int_equal(timerfd_settime(x->fd, 0, &its, NULL), 0);
    }
    *out = x;
    return BW_OK;
}

static int ffd(bw__xfer *x)
{
    return x->fd;
}

static bool ended(bw__xfer *x, bw__xres *res, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bool ended(bw__xfer *x, bw__xres *res, int rc, const char *fmt, ...)
{
    res->rc = rc;
    va_list ap;
    va_start(ap, fmt);
    /* va_start is the line above: clang-analyzer 14 loses it on some callers' paths. */
    vsnprintf(res->err, sizeof(res->err), fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
    va_end(ap);
    x->w->t_end[x->reqno] = bw__mono_ms();
    return true;
}

/* place() failed: the transport ends the request with its error, as both real ones do. */
static bool refused(bw__xfer *x, bw__xres *res, int rc, const char *e)
{
    return ended(x, res, rc, "worker %s: %s", x->w->id, e);
}

/* One step of the answer: place a sample (or chunk) or copy bytes, or end. True once the
 * request has ended. */
static bool step(bw__xfer *x, const bw__sink *sink, bw__xres *res)
{
    fworker *w = x->w;
    cluster *c = x->c;
    char e[BW_XFER_ERRLEN];
    if (x->end_rc)
        return ended(x, res, x->end_rc, "%s", x->end_err);
    bool first = x->reqno == 0;
    if (w->b == DOWN || w->b == FAIL_LATE)
        return ended(x, res, BW_UNAVAILABLE, "fake %s: connection refused", w->id);
    if (w->b == BUSY_ONCE && first) {
        res->retry_after_ms = w->retry_after_ms;
        return ended(x, res, BW_BUSY, "fake %s: over its in-flight budget", w->id);
    }
    if (w->b == REFUSE_FRAME && x->which == 0) {
        w->pref_off = true;
        res->fallback = true;
        return ended(x, res, BW_UNAVAILABLE, "fake %s: at its limit of 1 connections", w->id);
    }
    if (w->b == HANG_LATER && !first) { /* blocking: until the transport's own deadline */
        uint64_t until = w->t_start[x->reqno] + (uint64_t)x->timeout_ms, now = bw__mono_ms();
        if (now < until)
            usleep((useconds_t)(until - now) * 1000);
        return ended(x, res, BW_TIMEOUT, "fake %s: deadline exceeded", w->id);
    }
    if (x->pos == x->n)
        return ended(x, res, BW_OK, "%s", "");
    uint64_t key = x->idx[x->pos], size = sample_size(c, key);
    bool at_k = first && x->pos == w->k && !x->placed && x->off == 0;
    if (at_k) {
        switch (w->b) {
        case DIE_AFTER: /* inside the sample when it has bytes to cut */
            if (!w->mid || size <= 1)
                return ended(x, res, BW_UNAVAILABLE, "fake %s: connection reset after %zu samples",
                             w->id, w->k);
            break;
        case SHORT_AFTER:
            return ended(x, res, BW_OK, "%s", "");
        case CORRUPT:
            return ended(x, res, BW_CORRUPT, "fake %s: record %" PRIu64 " fails its checksum",
                         w->id, key);
        case WRONG_KEY:
            key += 1000;
            break;
        case OVER_MAX:
            size = 7000000000000000000ull;
            break;
        case WRONG_SIZE:
            size += 1;
            break;
        case LIE_THEN_DIE:
            size = w->mid ? size / 2 : size + 10;
            break;
        default:
            break;
        }
    }
    if (first && x->pos == w->k && w->b == LIE_THEN_DIE && x->off > 0)
        return ended(x, res, BW_UNAVAILABLE, "fake %s: connection reset inside sample %" PRIu64,
                     w->id, key);
    if (first && x->pos == w->k && w->b == DIE_AFTER && w->mid && x->off >= (size + 1) / 2 &&
        size > 1)
        return ended(x, res, BW_UNAVAILABLE, "fake %s: connection reset inside sample %" PRIu64,
                     w->id, key);
    if (x->which == 0) { /* the data channel's way: the whole sample placed, then its bytes */
        if (!x->placed) {
            uint64_t len = at_k && w->b == BAD_CHUNK ? size + 1 : size;
            int rc = sink->place(sink->ctx, key, size, 0, len, &x->dest, e, sizeof(e));
            if (rc != BW_OK)
                return refused(x, res, rc, e);
            assert_true(x->dest != NULL || size == 0);
            x->placed = true;
            x->size = size;
            x->off = 0;
        }
        uint64_t half = (x->size + 1) / 2, take = x->off < half ? half - x->off : x->size - x->off;
        for (uint64_t j = 0; j < take; j++)
            x->dest[x->off + j] = sample_byte(key, x->off + j);
        x->off += take;
        if (x->off == x->size) /* every byte has landed */
            sink->arrived(sink->ctx, x->size);
    } else { /* gRPC's way: each chunk placed as it arrives */
        uint64_t chunk = size / 3 + 1, off = x->off;
        uint64_t len = size - off < chunk ? size - off : chunk;
        if (at_k && w->b == BAD_CHUNK)
            off += 1;
        uint8_t *dest = NULL;
        int rc = sink->place(sink->ctx, key, size, off, len, &dest, e, sizeof(e));
        if (rc != BW_OK)
            return refused(x, res, rc, e);
        assert_true(dest != NULL || len == 0);
        for (uint64_t j = 0; j < len; j++)
            dest[j] = sample_byte(key, off + j);
        sink->arrived(sink->ctx, len);
        x->off += len;
        x->placed = true;
        x->size = size;
    }
    if (x->off == x->size) { /* the sample is complete */
        c->served_by[x->idx[x->pos]] = x->wi;
        w->served++;
        x->pos++;
        x->off = 0;
        x->placed = false;
        x->dest = NULL;
    }
    return false;
}

static bool frecv(bw__xfer *x, const bw__sink *sink, bw__xres *res)
{
    if (x->which == 0 && x->w->b == TRICKLE) { /* a step a read, the descriptor quiet */
        res->received++;
        return step(x, sink, res);
    }
    if (x->which == 0) { /* a few steps per readiness, as bytes trickle in (none before) */
        struct pollfd p = {x->fd, POLLIN, 0};
        if (poll(&p, 1, 0) != 1)
            return false;
        for (int i = 0; i < 3; i++)
            if (step(x, sink, res))
                return true;
        return false;
    }
    if ((x->w->b == SLOW || x->w->b == FAIL_LATE) && x->w->delay_ms)
        usleep(x->w->delay_ms * 1000u);
    while (!step(x, sink, res))
        ;
    return true;
}

static void ffinish(bw__xfer *x)
{
    if (!x)
        return;
    if (x->fd >= 0)
        close(x->fd);
    free(x->idx);
    free(x);
}

static const bw__transport_ops fake_ops = {"fake",  fusable, fstart, ffd, frecv,
                                           ffinish, NULL,    NULL,   NULL};

/* ---- a fetch ---- */

typedef struct rig {
    cluster c;
    ftransport pref, fb;
    Batchwire__V1__Dataset ds;
    char *sources[1];
    bw__fetch_ctx ctx;
    bw_batch b;
    size_t room; /* bytes the batch buffer holds before the fetch (a slot used before) */
    uint64_t took_ms;
} rig;

/* Rigs not yet freed: a failed assertion leaves its test early, and the teardown frees them
 * (so that the sanitizer build reports leaks of the library, not of a failed case). */
static rig *g_live[4];

static rig *rig_new(size_t nw, sizes sz, uint64_t fixed)
{
    rig *g = calloc(1, sizeof(*g));
    assert_non_null(g);
    for (size_t i = 0; i < 4; i++)
        if (!g_live[i]) {
            g_live[i] = g;
            break;
        }
    cluster_init(&g->c, nw, sz, fixed);
    g->pref = (ftransport){&g->c, 0};
    g->fb = (ftransport){&g->c, 1};
    batchwire__v1__dataset__init(&g->ds);
    g->ds.format = sz == SZ_FIXED ? "npy" : "tfrecord";
    g->sources[0] = "part-0";
    g->ds.n_sources = 1;
    g->ds.sources = g->sources;
    g_dataset = &g->ds;
    g_fingerprint = "fp-test";
    g->ctx.placement = fake_placement;
    g->ctx.block = BLOCK;
    g->ctx.placement_arg = &g->c;
    g->ctx.preferred = (bw__transport){&fake_ops, &g->pref};
    g->ctx.fallback = (bw__transport){&fake_ops, &g->fb};
    g->ctx.dataset = &g->ds;
    g->ctx.fingerprint = g_fingerprint;
    g->ctx.sample_bytes = sz == SZ_FIXED ? fixed : 0;
    g->ctx.max_sample_bytes = 1 << 20;
    g->ctx.max_message_bytes = 4u << 20;
    g->ctx.timeout_ms = 3000;
    return g;
}

static int rig_fetch(rig *g, const uint64_t *indices, size_t n)
{
    assert_int_equal(bw__batch_init(&g->b, n, 0, false), BW_OK);
    memcpy(g->b.indices, indices, n * sizeof(*indices));
    g->b.count = g->b.real = n;
    if (g->room) { /* a slot's buffer from an earlier batch: room for exactly g->room bytes */
        assert_int_equal(bw__batch_reserve(&g->b, g->room), BW_OK);
        g->b.cap = g->room;
    }
    uint64_t t0 = bw__mono_ms();
    int rc = bw__fetch_batch(&g->ctx, &g->b);
    g->took_ms = bw__mono_ms() - t0;
    return rc;
}

static void rig_free(rig *g)
{
    bw__batch_free(&g->b);
    cluster_free(&g->c);
    for (size_t i = 0; i < 4; i++)
        if (g_live[i] == g)
            g_live[i] = NULL;
    free(g);
}

static int free_rigs(void **state)
{
    (void)state;
    for (size_t i = 0; i < 4; i++)
        if (g_live[i])
            rig_free(g_live[i]);
    return 0;
}

/* Batch b holds every position's bytes, in plan order, and nothing else. */
static void check_one(const cluster *c, const bw_batch *b)
{
    size_t total = 0;
    for (size_t i = 0; i < b->count; i++) {
        uint64_t idx = b->indices[i], want = sample_size(c, idx);
        const void *data = NULL;
        size_t size = 0;
        assert_int_equal(bw_batch_sample(b, i, &data, &size), BW_OK);
        if (size != want)
            fail_msg("position %zu (index %" PRIu64 "): %zu bytes, want %" PRIu64, i, idx, size,
                     want);
        assert_int_equal(b->offsets[i], total);
        for (uint64_t j = 0; j < want; j++)
            if (((const uint8_t *)data)[j] != sample_byte(idx, j))
                fail_msg("position %zu (index %" PRIu64 "): byte %" PRIu64 " is %u, want %u", i,
                         idx, j, ((const uint8_t *)data)[j], sample_byte(idx, j));
        total += size;
    }
    assert_int_equal(bw_batch_nbytes(b), total);
}

static void check_batch(const rig *g)
{
    check_one(&g->c, &g->b);
}

static void check_asked_once(const rig *g)
{
    for (size_t i = 0; i < g->b.count; i++)
        if (g->c.asked[g->b.indices[i]] != 1)
            fail_msg("index %" PRIu64 " was asked %d times, want once", g->b.indices[i],
                     g->c.asked[g->b.indices[i]]);
}

/* 24 distinct indices spread over the workers, in a shuffled plan order. */
static const uint64_t PLAN[24] = {17,  3,   250, 42, 99,  128, 7,   300, 511, 64,  1,   77,
                                  200, 145, 9,   33, 402, 18,  255, 256, 90,  610, 123, 5};

/* Samples of differing sizes land in the batch buffer as they come when it has room: cases
 * run with none, with room for some, and with room for all. */
static const size_t ROOMS[3] = {0, 700, 1 << 16};

/* ---- cases ---- */

static void test_all_healthy(void **state)
{
    (void)state;
    sizes kinds[4] = {SZ_FIXED, SZ_MIXED, SZ_MIXED, SZ_MIXED};
    for (int k = 0; k < 4; k++) {
        rig *g = rig_new(3, kinds[k], 48);
        g->room = k > 0 ? ROOMS[k - 1] : 0;
        assert_int_equal(rig_fetch(g, PLAN, 24), BW_OK);
        check_batch(g);
        check_asked_once(g);
        for (size_t i = 0; i < 3; i++) {
            /* one checked request per worker, over the preferred transport */
            assert_int_equal(g->c.w[i].nreq, 1);
            assert_int_equal(g->c.w[i].reqs[0], 1);
            assert_true(g->c.w[i].checked[0]);
            assert_int_equal(g->c.w[i].version[0], 1);
        }
        for (size_t i = 0; i < 24; i++)
            assert_int_equal(g->c.served_by[PLAN[i]], owner_of(PLAN[i], 1u << 3));
        rig_free(g);
    }
}

static void test_padding_fetched_once(void **state)
{
    (void)state;
    /* the last global batch completed by cycling: indices repeat, flagged as padding */
    const uint64_t plan[10] = {40, 41, 300, 7, 40, 41, 300, 7, 40, 41};
    for (int k = 0; k < 4; k++) {
        rig *g = k == 0 ? rig_new(3, SZ_FIXED, 32) : rig_new(3, SZ_MIXED, 0);
        g->room = k > 0 ? ROOMS[k - 1] : 0;
        assert_int_equal(rig_fetch(g, plan, 10), BW_OK);
        check_batch(g);
        assert_int_equal(g->c.asked[40] + g->c.asked[41] + g->c.asked[300] + g->c.asked[7], 4);
        rig_free(g);
    }
}

/* Worker w (cluster index) misbehaves on its first request after k samples; everything it
 * did not complete must come from the next owner, once, and the batch be exact. */
static void failover_once(sizes sz, int which, behave b, size_t k, bool mid, size_t room)
{
    rig *g = rig_new(3, sz, 40);
    g->room = room;
    int victim = 1;
    fworker *w = &g->c.w[victim];
    w->b = b;
    w->k = k;
    w->mid = mid;
    if (which == 1) /* everything over the fallback transport */
        g->ctx.preferred = (bw__transport){NULL, NULL};
    int rc = rig_fetch(g, PLAN, 24);
    if (rc != BW_OK)
        fail_msg("behaviour %d after %zu samples, room %zu: %s (%s)", b, k, room, bw_err_name(rc),
                 g->b.err);
    check_batch(g);
    /* asked once, and the victim's unfinished samples once more: never served twice */
    size_t again = 0;
    bool took[MAXW] = {false};
    for (size_t i = 0; i < 24; i++) {
        uint64_t idx = PLAN[i];
        int owner = owner_of(idx, 1u << 3);
        if (owner == victim && g->c.served_by[idx] != victim) {
            /* moved: to the owner among the others */
            int heir = owner_of(idx, (1u << 3) | (1u << victim));
            assert_int_equal(g->c.served_by[idx], heir);
            assert_int_equal(g->c.asked[idx], 2);
            took[heir] = true;
            again++;
        } else {
            assert_int_equal(g->c.served_by[idx], owner);
            assert_int_equal(g->c.asked[idx], 1);
        }
    }
    assert_int_equal(w->served, k);
    assert_true(again > 0);
    assert_int_equal(w->nreq, 1); /* a suspect for the rest of the fetch */
    for (int i = 0; i < 3; i++)
        if (i != victim) {
            /* its own samples checked; the victim's by a request without ownership check */
            assert_int_equal(g->c.w[i].nreq, took[i] ? 2 : 1);
            assert_true(g->c.w[i].checked[0]);
            if (took[i])
                assert_false(g->c.w[i].checked[1]);
        }
    rig_free(g);
}

static void failover_case(sizes sz, int which, behave b, size_t k, bool mid)
{
    for (size_t i = 0; i < (sz == SZ_FIXED ? 1 : 3); i++)
        failover_once(sz, which, b, k, mid, ROOMS[i]);
}

static void test_worker_dies_mid_batch(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++)
        for (size_t k = 0; k < 4; k++) {
            failover_case(SZ_FIXED, which, DIE_AFTER, k, false);
            failover_case(SZ_MIXED, which, DIE_AFTER, k, false);
        }
    /* ... inside a sample whose chunks are placed as they arrive (gRPC's way) */
    for (size_t k = 0; k < 3; k++) {
        failover_case(SZ_FIXED, 1, DIE_AFTER, k, true);
        failover_case(SZ_MIXED, 1, DIE_AFTER, k, true);
    }
}

static void test_short_reply(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++)
        for (size_t k = 0; k < 3; k++) {
            failover_case(SZ_FIXED, which, SHORT_AFTER, k, false);
            failover_case(SZ_MIXED, which, SHORT_AFTER, k, false);
        }
}

static void test_bad_data_fails_the_worker(void **state)
{
    (void)state;
    behave bad[] = {WRONG_KEY, BAD_CHUNK, OVER_MAX};
    for (int which = 0; which < 2; which++)
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
            for (size_t k = 0; k < 2; k++) {
                failover_case(SZ_FIXED, which, bad[i], k, false);
                failover_case(SZ_MIXED, which, bad[i], k, false);
            }
    /* a size other than the dataset's fixed sample size */
    for (int which = 0; which < 2; which++)
        for (size_t k = 0; k < 2; k++)
            failover_case(SZ_FIXED, which, WRONG_SIZE, k, false);
}

static void test_corrupt_is_fatal(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        rig *g = rig_new(3, SZ_MIXED, 0);
        g->c.w[2].b = CORRUPT;
        g->c.w[2].k = 1;
        if (which == 1)
            g->ctx.preferred = (bw__transport){NULL, NULL};
        assert_int_equal(rig_fetch(g, PLAN, 24), BW_CORRUPT);
        assert_int_equal(g->b.rc, BW_CORRUPT);
        if (!strstr(g->b.err, "fails its checksum") || !strstr(g->b.err, "w3"))
            fail_msg("the error does not say what failed: '%s'", g->b.err);
        /* no other worker is asked for the bad data: it is bad wherever it is read */
        assert_int_equal(g->c.w[2].nreq, 1);
        assert_true(g->took_ms < 1000);
        rig_free(g);
    }
}

static void placement_change(bool dead, int which)
{
    rig *g = rig_new(3, SZ_MIXED, 0);
    g->c.leaver = 0; /* w1 */
    g->c.leaver_dead = dead;
    if (which == 1)
        g->ctx.preferred = (bw__transport){NULL, NULL};
    assert_int_equal(rig_fetch(g, PLAN, 24), BW_OK);
    check_batch(g);
    assert_int_equal(g->c.w[0].nreq, 1);
    assert_int_equal(g->c.w[0].served, 0);
    assert_true(g->c.refreshes >= 1);
    /* everything of w1's went to its new owners under version 2 */
    for (size_t i = 0; i < 24; i++) {
        uint64_t idx = PLAN[i];
        assert_int_equal(g->c.served_by[idx], owner_of(idx, (1u << 3) | 1u));
    }
    for (int i = 1; i < 3; i++) {
        fworker *w = &g->c.w[i];
        bool took = false;
        for (size_t j = 0; j < 24; j++)
            took |= owner_of(PLAN[j], 1u << 3) == 0 && g->c.served_by[PLAN[j]] == i;
        assert_int_equal(w->nreq, took ? 2 : 1);
        if (took) /* routed under the refreshed table, and checked against it */
            assert_int_equal(w->version[1], 2);
    }
    rig_free(g);
}

static void test_placement_changes_mid_epoch(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        placement_change(false, which); /* BW_WRONG_OWNER */
        placement_change(true, which);  /* BW_UNAVAILABLE */
    }
}

/* Without a refresh, the client's table is never replaced: a loop that did not ask for one
 * after BW_WRONG_OWNER would route to w1 until the deadline. The refresh is what mends it. */
static void test_wrong_owner_refreshes(void **state)
{
    (void)state;
    rig *g = rig_new(3, SZ_FIXED, 16);
    /* the coordinator moved on before the fetch: version 2 without w2; w2 refuses */
    bw__placement *p = make_table(2, 3, 1);
    bw__placement_put(g->c.current);
    g->c.current = p;
    assert_int_equal(rig_fetch(g, PLAN, 24), BW_OK);
    check_batch(g);
    assert_int_equal(g->c.w[1].nreq, 1);
    assert_int_equal(g->c.w[1].served, 0);
    assert_true(g->c.refreshes >= 1);
    rig_free(g);
}

static void test_busy_waits_for_hint(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        rig *g = rig_new(3, SZ_FIXED, 24);
        fworker *w = &g->c.w[2];
        w->b = BUSY_ONCE;
        w->retry_after_ms = 150;
        if (which == 1)
            g->ctx.preferred = (bw__transport){NULL, NULL};
        assert_int_equal(rig_fetch(g, PLAN, 24), BW_OK);
        check_batch(g);
        /* asked again, checked (not routed around as a failed worker), after about the hint */
        assert_int_equal(w->nreq, 2);
        assert_true(w->checked[1]);
        uint64_t gap = w->t_start[1] - w->t_end[0];
        if (gap < 148 || gap > 150 + 1000)
            fail_msg("asked again %" PRIu64 " ms after BW_BUSY with a 150 ms hint", gap);
        for (size_t i = 0; i < 24; i++)
            assert_int_equal(g->c.served_by[PLAN[i]], owner_of(PLAN[i], 1u << 3));
        assert_int_equal(g->c.w[0].nreq, 1);
        assert_int_equal(g->c.w[1].nreq, 1);
        rig_free(g);
    }
}

static void refuse_preferred(behave b)
{
    rig *g = rig_new(3, SZ_MIXED, 0);
    fworker *w = &g->c.w[0];
    w->b = b;
    assert_int_equal(rig_fetch(g, PLAN, 24), BW_OK);
    check_batch(g);
    /* the same worker, over the fallback, for the same samples; nobody else asked twice */
    assert_int_equal(w->reqs[0], 1);
    assert_int_equal(w->reqs[1], 1);
    assert_true(w->checked[1]);
    for (size_t i = 0; i < 24; i++)
        assert_int_equal(g->c.served_by[PLAN[i]], owner_of(PLAN[i], 1u << 3));
    for (int i = 1; i < 3; i++) {
        assert_int_equal(g->c.w[i].nreq, 1);
        assert_int_equal(g->c.w[i].reqs[1], 0);
    }
    rig_free(g);
}

static void test_preferred_refusal_falls_back(void **state)
{
    (void)state;
    refuse_preferred(REFUSE_START);
    refuse_preferred(REFUSE_FRAME);
}

static void test_slow_worker(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        rig *g = rig_new(3, SZ_MIXED, 0);
        g->c.w[1].b = SLOW;
        g->c.w[1].delay_ms = 200;
        g->ctx.timeout_ms = 2000;
        if (which == 1)
            g->ctx.preferred = (bw__transport){NULL, NULL};
        assert_int_equal(rig_fetch(g, PLAN, 24), BW_OK);
        check_batch(g);
        check_asked_once(g);
        assert_int_equal(g->c.w[1].nreq, 1);
        assert_true(g->took_ms >= 200);
        rig_free(g);
    }
}

/* A worker whose bytes keep coming while its descriptor stays quiet (below the transport's
 * wake mark) is read every half attempt and is alive: its request is never timed out and
 * asked elsewhere, though it takes several attempts' time. */
static void test_quiet_worker_is_alive(void **state)
{
    (void)state;
    rig *g = rig_new(3, SZ_MIXED, 0);
    g->c.w[1].b = TRICKLE;
    g->ctx.attempt_ms = 120;
    g->ctx.timeout_ms = 20000;
    assert_int_equal(rig_fetch(g, PLAN, 24), BW_OK);
    check_batch(g);
    check_asked_once(g);
    assert_int_equal(g->c.w[1].nreq, 1);
    assert_true(g->c.w[1].served > 1);
    assert_true(g->took_ms >= 2 * 120); /* several attempts' time: read at half of each */
    rig_free(g);
}

static void test_every_worker_fails(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        rig *g = rig_new(3, SZ_FIXED, 8);
        for (int i = 0; i < 3; i++)
            g->c.w[i].b = DOWN;
        g->ctx.timeout_ms = 400;
        if (which == 1)
            g->ctx.preferred = (bw__transport){NULL, NULL};
        assert_int_equal(rig_fetch(g, PLAN, 24), BW_UNAVAILABLE);
        if (g->took_ms < 390 || g->took_ms > 400 + 600)
            fail_msg("gave up after %" PRIu64 " ms with a 400 ms timeout", g->took_ms);
        /* ... naming the failures once: a worker and its error */
        const char *every = strstr(g->b.err, "every storage worker failed: ");
        if (!strstr(g->b.err, "24 of 24 samples could not be fetched in 400 ms") || !every ||
            strstr(every + 1, "every storage worker failed") ||
            !strstr(g->b.err, "connection refused") || !strstr(g->b.err, "fake w"))
            fail_msg("error: '%s'", g->b.err);
        /* once every worker has failed, all are asked again after a backoff (the trainer's
         * own network is the likelier culprit): more than once each, but with backoff */
        for (int i = 0; i < 3; i++)
            if (g->c.w[i].nreq < 2 || g->c.w[i].nreq > 8)
                fail_msg("worker %d asked %d times in 400 ms", i, (int)g->c.w[i].nreq);
        rig_free(g);
    }
}

static void test_empty_samples(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        rig *g = rig_new(3, SZ_EMPTY, 0);
        if (which == 1)
            g->ctx.preferred = (bw__transport){NULL, NULL};
        assert_int_equal(rig_fetch(g, PLAN, 24), BW_OK);
        check_batch(g);
        assert_int_equal(bw_batch_nbytes(&g->b), 0);
        rig_free(g);
        /* mixed: every third index is empty */
        for (size_t r = 0; r < 3; r++) {
            g = rig_new(3, SZ_MIXED, 0);
            g->room = ROOMS[r];
            if (which == 1)
                g->ctx.preferred = (bw__transport){NULL, NULL};
            const uint64_t plan[8] = {3, 4, 6, 0, 5, 9, 3, 1};
            assert_int_equal(rig_fetch(g, plan, 8), BW_OK);
            check_batch(g);
            assert_int_equal(g->b.sizes[0], 0);
            assert_int_equal(g->b.sizes[1], sample_size(&g->c, 4));
            rig_free(g);
        }
    }
}

/* A sample that took its place in the batch buffer, then failed part-way, is asked again
 * elsewhere. The retry may announce another size (the first worker lied about it): the samples
 * placed after it then move, and the batch is still exact; with the same size it is written
 * again where it was. Two workers, the blocking transport (w1's answer is read before w2's):
 * position 0 is w1's, the rest w2's, in increasing order, so each lands in place as it comes. */
static void retry_case(behave b, bool mid, size_t room)
{
    rig *g = rig_new(2, SZ_MIXED, 0);
    g->room = room;
    g->ctx.preferred = (bw__transport){NULL, NULL};
    const unsigned two = (1u << 2) | (1u << 3);
    uint64_t plan[11];
    size_t n = 0;
    for (uint64_t idx = 1; n == 0; idx++) /* w1's first sample of 8 bytes or more */
        if (owner_of(idx, two) == 0 && sample_size(&g->c, idx) >= 8)
            plan[n++] = idx;
    for (uint64_t idx = plan[0] + 1; n < 11; idx++)
        if (owner_of(idx, two) == 1)
            plan[n++] = idx;
    g->c.w[0].b = b;
    g->c.w[0].k = 0;
    g->c.w[0].mid = mid;
    int rc = rig_fetch(g, plan, n);
    if (rc != BW_OK)
        fail_msg("behaviour %d, room %zu: %s (%s)", b, room, bw_err_name(rc), g->b.err);
    check_batch(g);
    assert_int_equal(g->c.served_by[plan[0]], 1);
    assert_int_equal(g->c.w[0].served, 0);
    assert_int_equal(g->c.w[1].nreq, 2);
    rig_free(g);
}

static void test_retry_in_place_or_moved(void **state)
{
    (void)state;
    for (size_t r = 0; r < 3; r++) {
        retry_case(LIE_THEN_DIE, false, ROOMS[r]); /* a larger size on the retry */
        retry_case(LIE_THEN_DIE, true, ROOMS[r]);  /* a smaller one */
        retry_case(DIE_AFTER, true, ROOMS[r]);     /* the same size */
    }
}

/* A connection that ends inside a sample loses only that sample (docs/data-channel.md): the
 * data channel places a sample whole before its bytes arrive, so the sample it was receiving
 * must be fetched again, not kept with its bytes missing. */
static void test_dies_inside_whole_sample(void **state)
{
    (void)state;
    for (size_t k = 0; k < 3; k++) {
        failover_case(SZ_FIXED, 0, DIE_AFTER, k, true);
        failover_case(SZ_MIXED, 0, DIE_AFTER, k, true);
    }
}

/* timeout_ms is "for one batch, all retries included" (fetch.h): a request started late in
 * the fetch must not get the whole timeout again. w2 fails after 300 ms of a 1000 ms fetch;
 * its samples go to w1, which now never answers: the fetch must end at about 1000 ms. */
static void test_deadline_covers_retries(void **state)
{
    (void)state;
    rig *g = rig_new(2, SZ_FIXED, 8);
    g->ctx.preferred = (bw__transport){NULL, NULL};
    g->ctx.timeout_ms = 1000;
    g->c.w[1].b = FAIL_LATE;
    g->c.w[1].delay_ms = 300;
    g->c.w[0].b = HANG_LATER;
    assert_int_equal(rig_fetch(g, PLAN, 24), BW_UNAVAILABLE);
    if (g->took_ms > 1000 + 150)
        fail_msg("a fetch with timeout_ms 1000 took %" PRIu64 " ms (w1's second request was "
                 "given %d ms)",
                 g->took_ms, g->c.w[0].timeout_ms[1]);
    rig_free(g);
}

/* What a group's done callback saw: the batches handed over, in order, and how many samples
 * the slow worker had sent at each hand-over. */
typedef struct handed {
    const cluster *c;
    bw_batch *got[4];
    size_t slow_served[4];
    size_t n;
} handed;

static void on_done(void *arg, bw_batch *b)
{
    handed *h = arg;
    assert_true(h->n < 4);
    assert_int_equal(b->rc, BW_OK);
    check_one(h->c, b); /* whole and in place when handed over */
    h->slow_served[h->n] = h->c->w[1].served;
    h->got[h->n++] = b;
}

/* Batches read together (bw__fetch_batches) are handed over each as soon as its own samples
 * are in, in order: batch 0, all of its samples on w1, before w2 -- slow, holding batch 1 --
 * has sent anything; then batch 1 and batch 2 (w1's again, waiting for batch 1 only). Read
 * under 10 % packet loss, a group held its first batches back until its slowest request
 * ended (docs/operating.md, "Measured recovery"). */
static void test_group_hands_over_each_batch(void **state)
{
    (void)state;
    rig *g = rig_new(2, SZ_FIXED, 16);
    g->c.w[1].b = SLOW;
    g->c.w[1].delay_ms = 1500;
    g->ctx.timeout_ms = 10000;
    const unsigned two = (1u << 2) | (1u << 3); /* w3, w4 are not in this cluster */
    bw_batch bs[3];
    bw_batch *ptrs[3] = {&bs[0], &bs[1], &bs[2]};
    const int owner[3] = {0, 1, 0};
    uint64_t next = 0;
    for (int j = 0; j < 3; j++) {
        assert_int_equal(bw__batch_init(&bs[j], 4, 0, false), BW_OK);
        for (size_t i = 0; i < 4; i++) {
            while (owner_of(next, two) != owner[j])
                next++;
            bs[j].indices[i] = next++;
        }
        bs[j].count = bs[j].real = 4;
    }
    handed h = {.c = &g->c};
    assert_int_equal(bw__fetch_batches(&g->ctx, ptrs, 3, on_done, &h), BW_OK);
    assert_int_equal(h.n, 3);
    for (int j = 0; j < 3; j++) {
        assert_ptr_equal(h.got[j], &bs[j]);
        check_one(&g->c, &bs[j]);
    }
    if (h.slow_served[0] != 0)
        fail_msg("batch 0 was handed over after the slow worker had sent %zu samples: it waited "
                 "for the rest of its group",
                 h.slow_served[0]);
    assert_int_equal(h.slow_served[1], 4);
    assert_int_equal(g->c.w[0].nreq, 1); /* still one request per worker for the group */
    assert_int_equal(g->c.w[1].nreq, 1);
    for (int j = 0; j < 3; j++)
        bw__batch_free(&bs[j]);
    rig_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_all_healthy, free_rigs),
        cmocka_unit_test_teardown(test_padding_fetched_once, free_rigs),
        cmocka_unit_test_teardown(test_worker_dies_mid_batch, free_rigs),
        cmocka_unit_test_teardown(test_short_reply, free_rigs),
        cmocka_unit_test_teardown(test_bad_data_fails_the_worker, free_rigs),
        cmocka_unit_test_teardown(test_corrupt_is_fatal, free_rigs),
        cmocka_unit_test_teardown(test_placement_changes_mid_epoch, free_rigs),
        cmocka_unit_test_teardown(test_wrong_owner_refreshes, free_rigs),
        cmocka_unit_test_teardown(test_busy_waits_for_hint, free_rigs),
        cmocka_unit_test_teardown(test_preferred_refusal_falls_back, free_rigs),
        cmocka_unit_test_teardown(test_slow_worker, free_rigs),
        cmocka_unit_test_teardown(test_quiet_worker_is_alive, free_rigs),
        cmocka_unit_test_teardown(test_every_worker_fails, free_rigs),
        cmocka_unit_test_teardown(test_empty_samples, free_rigs),
        cmocka_unit_test_teardown(test_retry_in_place_or_moved, free_rigs),
        cmocka_unit_test_teardown(test_dies_inside_whole_sample, free_rigs),
        cmocka_unit_test_teardown(test_deadline_covers_retries, free_rigs),
        cmocka_unit_test_teardown(test_group_hands_over_each_batch, free_rigs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
