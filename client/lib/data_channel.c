/*
 * The data-channel transport (transport.h; protocol in core/rpc/dchan.h and
 * docs/data-channel.md): a request goes out on a connection kept open across batches, and
 * its response is read without blocking, frame by frame, each sample's bytes straight into
 * the place the sink gives. The transport's state is its own: the TLS context (the PEM files
 * are read once, when it is created), the pool of idle connections (a request that ended
 * cleanly leaves its connection there) and the data channels found unusable, whose workers
 * are asked over gRPC for a while. It sends no hello and no bearer token: with authentication
 * on, each request carries the lease's read grant (docs/data-channel.md, "Credentials"). A new
 * connection offers RUN frames with a FEATURES request ahead of its first request; workers
 * older than it are remembered and asked without it ("Versions"). With compression asked for,
 * the same FEATURES request asks for ZRUN frames, whose zstd frames are decompressed straight
 * into the samples' places in the batch ("Compression").
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zstd.h>

#include "common/log.h"
#include "common/util.h"
#include "rpc/dchan.h"
#include "transport.h"

/* A connection to one worker's data channel. */
typedef struct bw__dconn {
    bw_dsock s;
    char *address;
    bool reused;  /* taken from the idle list (the worker may have closed it meanwhile) */
    uint8_t *buf; /* received, not yet consumed: frame headers and small samples */
    size_t pos, len;
    /* Read ahead into buf only while samples are small: a large sample's bytes must go
     * straight to the batch, not through buf. */
    bool read_ahead;
    struct spec *spec; /* plain TCP, fixed-size samples: see spec_recv (allocated on use) */
    /* Versions (docs/data-channel.md, "Versions"): a fresh connection sends FEATURES ahead of
     * its first request; `hello` while the answer is due, then `features` are the bits the
     * worker uses on it (0: an older worker's frames). */
    bool hello;
    uint64_t features;
    bool in_runs; /* the last sample frame was a RUN of several: expect the next to be one */
    int lowat;    /* the socket's SO_RCVLOWAT (wait_more); 0 as 1, the kernel's default */
    uint64_t rx;  /* bytes received on it */
    /* ZRUN frames: the compressed bytes of the one being received, and the decompressor
     * (made on the first, kept with the connection) */
    uint8_t *zin;
    size_t zcap;
    ZSTD_DCtx *zd;
} bw__dconn;

/* Fixed-size samples are received many at a time, each frame header into a slot and each
 * sample's bytes straight into its place in the batch (spec_recv): at most SPEC_MAX samples a
 * read, each read posting about twice as many as the last one brought (from SPEC_START). */
enum { SPEC_MAX = 256, SPEC_START = 32 };

/* Inside a RUN frame (run_recv) a read posts about twice the samples the last one brought,
 * from RUN_POST_START to RUN_POST_MAX. */
enum { RUN_POST_START = 256, RUN_POST_MAX = 16384 };

/* Inside a RUN frame a receiving thread is woken once this many of the run's bytes have
 * arrived (wait_more). */
enum { LOWAT_MAX = 256 << 10 };

struct spec {
    uint8_t hdr[SPEC_MAX][BW_DCHAN_FRAME_HEADER];
    uint64_t key[SPEC_MAX];
    uint8_t *dest[SPEC_MAX];
    struct iovec iov[2 * SPEC_MAX + 2]; /* the sample in progress, slots, the read-ahead */
    size_t cap;                         /* samples the next read posts */
    /* run_recv: the pieces posted (each count[p] samples from dest[p]), and how many samples
     * of a run the next read posts */
    size_t count[SPEC_MAX];
    size_t runcap;
};

enum {
    BW_DCONN_BUF = 64 << 10,
    BW_DCONN_IDLE_MAX = 64,      /* idle connections kept */
    BW_DCONN_SUSPENDED_MAX = 64, /* unreachable data channels remembered */
    BW_DCONN_SUSPEND_MS = 30000, /* ... for this long when refused */
    BW_DCONN_RETRY_MS = 1000,    /* ... when unreachable: this long, doubled each time, to 30 s */
    BW_DCONN_OLD_MAX = 64,       /* workers found to know no FEATURES request, remembered */
    BW_DCONN_OLD_MS = 600000,    /* ... for this long (then asked again: it may be upgraded) */
    BW_DCONN_KNOWN_MAX = 256,    /* workers whose FEATURES answer is remembered */
};

/* The transport's state (one per loader). */
typedef struct dchan_state {
    struct ssl_ctx_st *tls; /* data channels speak TLS (the loader does); NULL: plain TCP */
    bw__grant_src grant;    /* each request's read grant */
    uint64_t offer;         /* the FEATURES bits a new connection asks for */
    pthread_mutex_t mu;     /* guards idle and suspended; held across no I/O */
    /* idle connections, most recently used last */
    size_t nidle;
    bw__dconn *idle[BW_DCONN_IDLE_MAX];
    /* data channels that could not be connected to: their workers are asked over gRPC until
     * `until` (monotonic ms) */
    size_t nsuspended;
    struct {
        char *address;
        uint64_t until;
        unsigned failed; /* connection attempts in a row that failed */
    } suspended[BW_DCONN_SUSPENDED_MAX];
    /* data channels of workers older than the FEATURES request: sent none until `until` */
    size_t nold;
    struct {
        char *address;
        uint64_t until;
    } old[BW_DCONN_OLD_MAX];
    /* what each data channel last answered a FEATURES request with (0 after refusing one):
     * requests of several datasets go only to workers that offered them or have not answered
     * yet (bw__transport_ops speaks; docs/data-channel.md, "Several datasets in one request") */
    size_t nknown;
    struct {
        char *address;
        uint64_t features;
    } known[BW_DCONN_KNOWN_MAX];
} dchan_state;

static void dconn_free(bw__dconn *c)
{
    if (!c)
        return;
    bw__dsock_close(&c->s);
    ZSTD_freeDCtx(c->zd);
    free(c->zin);
    free(c->spec);
    free(c->buf);
    free(c->address);
    free(c);
}

static void dconn_reached(dchan_state *s, const char *address);

static int dconn_get(dchan_state *s, const char *address, int timeout_ms, bw__dconn **out,
                     char *err, size_t errlen)
{
    *out = NULL;
    pthread_mutex_lock(&s->mu);
    for (size_t i = s->nidle; i-- > 0;)
        if (strcmp(s->idle[i]->address, address) == 0) {
            *out = s->idle[i];
            s->idle[i] = s->idle[--s->nidle];
            break;
        }
    pthread_mutex_unlock(&s->mu);
    if (*out) {
        (*out)->reused = true;
        return BW_OK;
    }
    /* Each attempt has its own deadlines, well inside the request's (dchan.h). */
    int connect_ms =
        timeout_ms < BW_DCHAN_CONNECT_TIMEOUT_MS ? timeout_ms : BW_DCHAN_CONNECT_TIMEOUT_MS;
    int handshake_ms =
        timeout_ms < BW_DCHAN_HANDSHAKE_TIMEOUT_MS ? timeout_ms : BW_DCHAN_HANDSHAKE_TIMEOUT_MS;
    bw_dsock sock = {-1, NULL};
    int rc = bw__sock_connect(address, connect_ms, &sock.fd, err, errlen);
    uint64_t deadline = bw__mono_ms() + (uint64_t)(handshake_ms > 0 ? handshake_ms : 1);
    if (rc == BW_OK && s->tls) {
        char host[256], port[16];
        rc = bw__sock_split(address, host, sizeof(host), port, sizeof(port));
        if (rc != BW_OK)
            snprintf(err, errlen, "address %s is not HOST:PORT", address);
        else
            rc = bw__dsock_tls(&sock, s->tls, host, deadline, err, errlen);
    }
    if (rc != BW_OK) {
        bw__dsock_close(&sock);
        return rc;
    }
    dconn_reached(s, address);
    bw__dconn *c = calloc(1, sizeof(*c));
    if (!c || !(c->address = strdup(address)) || !(c->buf = malloc(BW_DCONN_BUF))) {
        if (c)
            free(c->address);
        free(c);
        bw__dsock_close(&sock);
        snprintf(err, errlen, "out of memory for a connection");
        return BW_NOMEM;
    }
    c->s = sock;
    c->read_ahead = true;
    *out = c;
    return BW_OK;
}

/* One recvmsg into iov[0..n) without waiting: BW_OK with *got bytes (0: none yet), or
 * BW_UNAVAILABLE when the connection closed or failed. */
static int dconn_recvmsg(bw__dconn *c, struct iovec *iov, size_t n, size_t *got, char *err,
                         size_t errlen)
{
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = iov;
    mh.msg_iovlen = n;
    ssize_t r;
    do
        r = recvmsg(c->s.fd, &mh, MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    *got = r > 0 ? (size_t)r : 0;
    c->rx += *got;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return BW_OK;
    if (r <= 0) {
        snprintf(err, errlen, "%s", r == 0 ? "the worker closed the connection" : strerror(errno));
        return BW_UNAVAILABLE;
    }
    return BW_OK;
}

static int dconn_take(bw__dconn *c, uint8_t *dst, size_t n, bool direct, size_t *got, char *err,
                      size_t errlen)
{
    *got = 0;
    if (c->pos < c->len) {
        size_t take = c->len - c->pos < n ? c->len - c->pos : n;
        memcpy(dst, c->buf + c->pos, take);
        c->pos += take;
        *got = take;
        return BW_OK;
    }
    c->pos = c->len = 0;
    if (c->s.ssl) { /* decrypted straight into dst, or through the buffer */
        size_t want = direct             ? n
                      : c->read_ahead    ? BW_DCONN_BUF
                      : n < BW_DCONN_BUF ? n
                                         : BW_DCONN_BUF;
        int rc = bw__dsock_recv(&c->s, direct ? dst : c->buf, want, got, err, errlen);
        c->rx += *got;
        if (rc != BW_OK || direct)
            return rc;
        c->len = *got;
        *got = c->len < n ? c->len : n;
        memcpy(dst, c->buf, *got);
        c->pos = *got;
        return BW_OK;
    }
    /* Read ahead (frame headers, small samples) only while samples are small: a large
     * sample's bytes must land in the batch, not in the buffer. */
    size_t ahead = c->read_ahead ? BW_DCONN_BUF : BW_DCHAN_FRAME_HEADER;
    struct iovec iov[2] = {{dst, n}, {c->buf, ahead}};
    if (!direct)
        iov[0] = (struct iovec){c->buf, c->read_ahead || n > ahead ? BW_DCONN_BUF : n};
    size_t r;
    int rc = dconn_recvmsg(c, iov, direct ? 2 : 1, &r, err, errlen);
    if (rc != BW_OK || r == 0)
        return rc;
    if (direct) {
        *got = r < n ? r : n;
        c->len = r - *got;
        return BW_OK;
    }
    c->len = r;
    *got = c->len < n ? c->len : n;
    memcpy(dst, c->buf, *got);
    c->pos = *got;
    return BW_OK;
}

/* Sets the socket's wake mark (SO_RCVLOWAT: poll and the kernel wake its reader once v bytes
 * are in) unless it is v already. false: it could not be set, and is as it was. */
static bool dconn_lowat(bw__dconn *c, int v)
{
    if (v == (c->lowat ? c->lowat : 1))
        return true;
    if (setsockopt(c->s.fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) != 0)
        return false;
    c->lowat = v;
    return true;
}

static void dconn_put(dchan_state *s, bw__dconn *c, bool reusable)
{
    if (!c)
        return;
    reusable = reusable && c->pos == c->len; /* nothing may follow a response */
    c->pos = c->len = 0;
    /* the next request's first wait is for a frame header (wait_more) */
    reusable = reusable && dconn_lowat(c, 1);
    bw__dconn *drop = NULL;
    if (reusable) {
        pthread_mutex_lock(&s->mu);
        if (s->nidle == BW_DCONN_IDLE_MAX) { /* drop the oldest */
            drop = s->idle[0];
            memmove(s->idle, s->idle + 1, (s->nidle - 1) * sizeof(s->idle[0]));
            s->nidle--;
        }
        s->idle[s->nidle++] = c;
        pthread_mutex_unlock(&s->mu);
    } else {
        drop = c;
    }
    dconn_free(drop);
}

static void dconn_drop_idle(dchan_state *s, const char *address)
{
    bw__dconn *drop[BW_DCONN_IDLE_MAX];
    size_t n = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nidle;)
        if (strcmp(s->idle[i]->address, address) == 0) {
            drop[n++] = s->idle[i];
            s->idle[i] = s->idle[--s->nidle];
        } else {
            i++;
        }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++)
        dconn_free(drop[i]);
}

static void destroy(void *state)
{
    dchan_state *s = state;
    if (!s)
        return;
    for (size_t i = 0; i < s->nidle; i++)
        dconn_free(s->idle[i]);
    for (size_t i = 0; i < s->nsuspended; i++)
        free(s->suspended[i].address);
    for (size_t i = 0; i < s->nold; i++)
        free(s->old[i].address);
    for (size_t i = 0; i < s->nknown; i++)
        free(s->known[i].address);
    bw__dchan_tls_ctx_free(s->tls);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static int create(const bw__worker_opts *opts, void **state, char *err, size_t errlen)
{
    *state = NULL;
    dchan_state *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory for the data channel's state");
        return BW_NOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->grant = opts->grant;
    s->offer =
        BW_DCHAN_FEATURE_RUNS | BW_DCHAN_FEATURE_DATASETS | BW_DCHAN_FEATURE_FIXED | opts->compress;
    int rc = bw__tls_client_enabled(&opts->rpc.tls)
                 ? bw__dchan_tls_client_ctx(&opts->rpc.tls, &s->tls, err, errlen)
                 : BW_OK;
    if (rc != BW_OK) {
        destroy(s);
        return rc;
    }
    *state = s;
    return BW_OK;
}

/* The entry for address (NULL if none); s->mu held. */
static size_t find_suspended(dchan_state *s, const char *address)
{
    for (size_t i = 0; i < s->nsuspended; i++)
        if (strcmp(s->suspended[i].address, address) == 0)
            return i;
    return s->nsuspended;
}

/* Asks address's worker over gRPC for a while: 30 s after the worker refused a request on
 * its data channel (at its connection limit, or an older worker); after a connection attempt
 * that failed -- a silent or restarting host, a name not resolved yet, the trainer's own
 * network, a port not published -- for 1 s, doubled with each such attempt in a row up to
 * 30 s, so that a data channel is back within about a second of a heal, and a data port that
 * stays unreachable costs one connection attempt now and then (docs/data-channel.md). */
static void dconn_suspend(dchan_state *s, const char *address, const char *worker, const char *why,
                          bool connecting)
{
    uint64_t now = bw__mono_ms(), ms = BW_DCONN_SUSPEND_MS;
    pthread_mutex_lock(&s->mu);
    size_t i = find_suspended(s, address);
    bool fresh = i == s->nsuspended;
    if (fresh && s->nsuspended == BW_DCONN_SUSPENDED_MAX) { /* forget the oldest */
        free(s->suspended[0].address);
        memmove(s->suspended, s->suspended + 1, (s->nsuspended - 1) * sizeof(s->suspended[0]));
        i = --s->nsuspended;
    }
    if (fresh && !(s->suspended[i].address = strdup(address))) {
        pthread_mutex_unlock(&s->mu);
        return; /* out of memory: not remembered, so the next fetch tries the channel again */
    }
    if (fresh) {
        s->suspended[i].failed = 0;
        s->nsuspended++;
    }
    bool was_active = !fresh && s->suspended[i].until > now;
    unsigned k = s->suspended[i].failed;
    if (connecting && was_active) { /* a request started before the suspension: no new try */
        pthread_mutex_unlock(&s->mu);
        return;
    }
    if (connecting) {
        s->suspended[i].failed++;
        ms = (uint64_t)BW_DCONN_RETRY_MS << (k < 5 ? k : 5);
        if (ms > BW_DCONN_SUSPEND_MS)
            ms = BW_DCONN_SUSPEND_MS;
    } else {
        s->suspended[i].failed = 0;
    }
    s->suspended[i].until = now + ms;
    pthread_mutex_unlock(&s->mu);
    /* One warning per outage; its later retries are debug lines. */
    if (!was_active && (!connecting || k == 0))
        BW_WARN("worker=%s data_channel=%s unusable; fetching from this worker over gRPC for the "
                "next %.1f s%s (docs/data-channel.md) err=%s",
                worker, address, (double)ms / 1000.0,
                connecting ? ", then trying it again (1 s, doubling to 30 s)" : "", why);
    else if (!was_active)
        BW_DEBUG("worker=%s data_channel=%s still unusable (%u attempts); over gRPC for the next "
                 "%.1f s err=%s",
                 worker, address, k + 1, (double)ms / 1000.0, why);
}

/* A connection to address was made: it is no longer suspended, and the next timeout counts
 * from 1 s again. */
static void dconn_reached(dchan_state *s, const char *address)
{
    unsigned failed = 0;
    pthread_mutex_lock(&s->mu);
    size_t i = find_suspended(s, address);
    if (i < s->nsuspended) {
        failed = s->suspended[i].failed;
        free(s->suspended[i].address);
        s->suspended[i] = s->suspended[--s->nsuspended];
    }
    pthread_mutex_unlock(&s->mu);
    if (failed)
        BW_INFO("data_channel=%s reachable again after %u failed connection attempts", address,
                failed);
}

/* Whether address's worker is known to be older than the FEATURES request (s->mu not held). */
static bool dconn_old(dchan_state *s, const char *address)
{
    bool old = false;
    uint64_t now = bw__mono_ms();
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nold && !old; i++)
        old = s->old[i].until > now && strcmp(s->old[i].address, address) == 0;
    pthread_mutex_unlock(&s->mu);
    return old;
}

/* Remembers what address's worker answered a FEATURES request with (s->mu not held). Out of
 * memory: not remembered (its features are then unknown: none assumed). */
static void dconn_learned(dchan_state *s, const char *address, uint64_t features)
{
    pthread_mutex_lock(&s->mu);
    size_t i = 0;
    while (i < s->nknown && strcmp(s->known[i].address, address) != 0)
        i++;
    if (i == s->nknown) {
        char *copy = strdup(address);
        if (!copy) {
            pthread_mutex_unlock(&s->mu);
            return;
        }
        if (i == BW_DCONN_KNOWN_MAX) { /* forget the first learned */
            free(s->known[0].address);
            memmove(s->known, s->known + 1, (s->nknown - 1) * sizeof(s->known[0]));
            i = --s->nknown;
        }
        s->known[s->nknown++].address = copy;
    }
    s->known[i].features = features;
    pthread_mutex_unlock(&s->mu);
}

static bool usable(void *state, const bw__worker_ref *wr);

/*
 * Whether wr's data channel last offered `feature`, or has not answered a FEATURES request yet
 * (bw__transport_ops speaks). Before its first answer a request relying on it goes out all the
 * same, beside the FEATURES request on its fresh connection, and is ended unanswered when the
 * answer lacks it (refused): assuming no feature instead split a mixture's first batches into a
 * request per source and batch, each on a connection of its own (none is reused before its
 * answer), ~50 connections and worker threads per worker where 4 do (docs/performance.md,
 * "Mixture jobs, eighth pass").
 */
static bool speaks(void *state, const bw__worker_ref *wr, uint64_t feature)
{
    dchan_state *s = state;
    bool yes = true;
    if (!usable(s, wr))
        return false;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nknown; i++)
        if (strcmp(s->known[i].address, wr->data_address) == 0) {
            yes = (s->known[i].features & feature) == feature;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    return yes;
}

/* Remembers that address's worker refused the FEATURES request (an older worker): its
 * connections send none for BW_DCONN_OLD_MS. Out of memory: not remembered (asked again). */
static void dconn_mark_old(dchan_state *s, const char *address, const char *why)
{
    char *copy = strdup(address);
    if (!copy)
        return;
    uint64_t now = bw__mono_ms();
    pthread_mutex_lock(&s->mu);
    size_t i = 0;
    while (i < s->nold && strcmp(s->old[i].address, address) != 0 && s->old[i].until > now)
        i++;
    if (i == BW_DCONN_OLD_MAX) { /* forget the oldest */
        free(s->old[0].address);
        memmove(s->old, s->old + 1, (s->nold - 1) * sizeof(s->old[0]));
        i = --s->nold;
    }
    if (i == s->nold)
        s->nold++;
    else
        free(s->old[i].address);
    s->old[i].address = copy;
    s->old[i].until = now + BW_DCONN_OLD_MS;
    pthread_mutex_unlock(&s->mu);
    dconn_learned(s, address, 0);
    BW_DEBUG("data_channel=%s knows no FEATURES request (an older worker): its frames without "
             "runs for the next %d s err=%s",
             address, BW_DCONN_OLD_MS / 1000, why);
}

static bool dconn_suspended(dchan_state *s, const char *address)
{
    pthread_mutex_lock(&s->mu);
    size_t i = find_suspended(s, address);
    bool on = i < s->nsuspended && s->suspended[i].until > bw__mono_ms();
    pthread_mutex_unlock(&s->mu);
    return on;
}

/* ---- the transport ---- */

struct bw__xfer {
    dchan_state *s;
    bw__dconn *c;
    const char *wid, *address; /* borrowed from the placement, alive for the request */
    uint32_t kind;
    /* The FEATURES bits the packed request relies on: BW_DCHAN_FEATURE_DATASETS (a ReadSamples
     * request of several datasets), BW_DCHAN_FEATURE_FIXED (fixed-width indices) */
    uint64_t needs;
    uint8_t *req; /* kept for a resend on a fresh connection */
    size_t reqlen;
    int timeout_ms;
    enum { X_HDR, X_DATA, X_MSG, X_ZDATA } phase; /* X_ZDATA: a ZRUN frame's bytes */
    uint8_t hdr[BW_DCHAN_FRAME_HEADER];
    size_t hgot;
    bw_dchan_frame f;
    uint8_t *dest; /* X_DATA: the sample's place; X_MSG: msg */
    size_t need, got;
    uint64_t nsamples; /* samples completed (of SAMPLE and RUN frames) */
    /* ReadSamples: the request's indices, in the order the worker answers them */
    uint64_t *idx;
    size_t nidx;
    /* In a RUN frame: the samples after the one in progress, and their size. */
    uint64_t run_left, run_size;
    bool any, retried;
    char msg[BW_DCHAN_MAX_MESSAGE + 1];
};

static bool usable(void *state, const bw__worker_ref *wr)
{
    return wr->data_address[0] != '\0' && !dconn_suspended(state, wr->data_address);
}

/* Writes the request on x->c, on a fresh connection when `fresh` (the pooled one was found
 * closed: so are the other idle ones to this worker). */
static int send_req(bw__xfer *x, bool fresh, char *err, size_t errlen)
{
    if (fresh) {
        dconn_put(x->s, x->c, false);
        x->c = NULL;
        dconn_drop_idle(x->s, x->address);
    }
    int rc = x->c ? BW_OK : dconn_get(x->s, x->address, x->timeout_ms, &x->c, err, errlen);
    if (rc != BW_OK)
        return rc;
    /* A fresh connection says first which frames it understands, in the same write as its
     * request: no round trip (docs/data-channel.md, "Versions"). */
    uint8_t hello[BW_DCHAN_REQ_HEADER + BW_DCHAN_FEATURES_BODY];
    struct iovec iov[2] = {{hello, sizeof(hello)}, {x->req, x->reqlen}};
    bool ask = !x->c->reused && !x->c->hello && !x->c->features && !dconn_old(x->s, x->address);
    if (ask) {
        bw__dchan_put_req_header(hello, BW_DCHAN_KIND_FEATURES, BW_DCHAN_FEATURES_BODY);
        bw__put_le64(hello + BW_DCHAN_REQ_HEADER, x->s->offer);
        x->c->hello = true;
    }
    rc = bw__dsock_writev_all(&x->c->s, ask ? iov : iov + 1, ask ? 2 : 1,
                              bw__mono_ms() + (uint64_t)x->timeout_ms, err, errlen);
    if (rc != BW_OK && x->c->reused && !fresh) /* the worker closed an idle connection */
        return send_req(x, true, err, errlen);
    return rc;
}

static void xfer_free(bw__xfer *x)
{
    if (!x)
        return;
    dconn_put(x->s, x->c, false);
    free(x->req);
    free(x->idx);
    free(x);
}

/* rs in the fixed-width form into *out: a shallow copy borrowing rs's indices, a mixture's
 * per-index datasets as a byte each in *of (NULL without them; the caller frees it once the
 * request is packed). false: out of memory. */
static bool fixed_form(const Batchwire__V1__ReadSamplesRequest *rs,
                       Batchwire__V1__ReadSamplesRequest *out, uint8_t **of)
{
    *out = *rs;
    out->n_indices_fixed = rs->n_indices;
    out->indices_fixed = rs->indices;
    out->n_indices = 0;
    out->indices = NULL;
    *of = NULL;
    if (!rs->n_index_datasets)
        return true;
    if (!(*of = malloc(rs->n_index_datasets)))
        return false;
    uint32_t most = 0;
    for (size_t i = 0; i < rs->n_index_datasets; i++) {
        most |= rs->index_datasets[i];
        (*of)[i] = (uint8_t)rs->index_datasets[i];
    }
    /* positions in `datasets`: below BW__MIX_MAX_SOURCES (256), a byte each */
    BW_INVARIANT(most <= UINT8_MAX, "a request's datasets are at most 256");
    out->index_datasets_bytes = (ProtobufCBinaryData){rs->n_index_datasets, *of};
    out->n_index_datasets = 0;
    out->index_datasets = NULL;
    return true;
}

/*
 * Packs req for x's connection into x->req (after the request header). A ReadSamples request
 * goes with fixed-width indices -- packed fixed64, and a byte per index for its datasets --
 * where the connection's FEATURES answer offered them (docs/data-channel.md, "Fixed-width
 * indices": protobuf-c reads them with a copy where varints took ~75 instructions an index);
 * on a connection not answered yet, as varints. x->needs: the features the packed request
 * relies on. Keeps the indices in x->idx, in the order the worker answers them.
 */
static int pack(bw__xfer *x, const bw__read_req *req, const char *worker_id, bw__xres *res)
{
    bw__granted granted;
    const ProtobufCMessage *msg = bw__read_req_granted(req, &x->s->grant, worker_id, &granted);
    Batchwire__V1__ReadSamplesRequest fixed;
    uint8_t *of = NULL;
    const char *what = NULL;
    if (req->kind == BW_DCHAN_KIND_READ_SAMPLES) {
        /* A RUN frame names its first sample; the others are the request's next ones. */
        const Batchwire__V1__ReadSamplesRequest *rs =
            (const Batchwire__V1__ReadSamplesRequest *)msg;
        x->nidx = rs->n_indices;
        x->needs = rs->n_datasets ? BW_DCHAN_FEATURE_DATASETS : 0;
        if (x->nidx && !(x->idx = malloc(x->nidx * sizeof(*x->idx))))
            what = "indices";
        else if (x->nidx)
            memcpy(x->idx, rs->indices, x->nidx * sizeof(*x->idx));
        if (!what && x->c && (x->c->features & BW_DCHAN_FEATURE_FIXED)) {
            if (!fixed_form(rs, &fixed, &of))
                what = "datasets";
            msg = &fixed.base;
            x->needs |= BW_DCHAN_FEATURE_FIXED;
        }
    }
    size_t len = what ? 0 : protobuf_c_message_get_packed_size(msg);
    if (!what && !(x->req = malloc(BW_DCHAN_REQ_HEADER + len)))
        what = "the request";
    if (!what) {
        bw__dchan_put_req_header(x->req, req->kind, len);
        protobuf_c_message_pack(msg, x->req + BW_DCHAN_REQ_HEADER);
        x->reqlen = BW_DCHAN_REQ_HEADER + len;
    }
    bw__granted_wipe(&granted);
    free(of);
    if (!what)
        return BW_OK;
    snprintf(res->err, sizeof(res->err), "out of memory for a %zu-index request (%s)", x->nidx,
             what);
    return res->rc = BW_NOMEM;
}

static int start(void *state, const bw__worker_ref *wr, const bw__read_req *req, int timeout_ms,
                 bw__xfer **out, bw__xres *res)
{
    dchan_state *s = state;
    *out = NULL;
    bw__xfer *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(res->err, sizeof(res->err), "out of memory for a request");
        return res->rc = BW_NOMEM;
    }
    x->s = s;
    x->wid = wr->id;
    x->address = wr->data_address;
    x->kind = req->kind;
    x->timeout_ms = timeout_ms;
    char e[BW_XFER_ERRLEN];
    int rc = dconn_get(s, x->address, timeout_ms, &x->c, e, sizeof(e));
    if (rc != BW_OK && rc != BW_INTERRUPTED) {
        /* An unreachable data port (a firewall, a port not published): the worker may still
         * answer over gRPC. */
        dconn_suspend(s, x->address, wr->id, e, true);
        res->fallback = true;
    } else if (pack(x, req, wr->id, res) != BW_OK) {
        xfer_free(x);
        return res->rc;
    } else {
        rc = send_req(x, false, e, sizeof(e));
    }
    if (rc != BW_OK) {
        snprintf(res->err, sizeof(res->err), "worker %s data channel %s: %.700s", wr->id,
                 x->address, e);
        xfer_free(x);
        return res->rc = rc;
    }
    *out = x;
    return BW_OK;
}

static int xfd(bw__xfer *x)
{
    return x->c->s.fd;
}

/* Ends the response: the connection goes back to the pool when `reusable`. */
static bool end(bw__xfer *x, bw__xres *res, int rc, bool reusable, const char *why)
{
    res->rc = rc;
    dconn_put(x->s, x->c, reusable);
    x->c = NULL;
    if (rc != BW_OK)
        snprintf(res->err, sizeof(res->err), "worker %s data channel %s: %.900s", x->wid,
                 x->address, why);
    return true;
}

/* A request that relies on features (x->needs) went to a worker that does not offer `lacks` of
 * them (another, older worker at the address they were learned from, or behind a connection
 * made again): ended, for the fetch loop to ask again at once (res->fallback), now the old way
 * -- a request per dataset, varint indices -- since this worker's answer was learned
 * (docs/data-channel.md, "Several datasets in one request", "Fixed-width indices"). */
static bool refused(bw__xfer *x, bw__xres *res, uint64_t lacks, const char *why)
{
    char e[BW_XFER_ERRLEN];
    bool several = lacks & BW_DCHAN_FEATURE_DATASETS, fixed = lacks & BW_DCHAN_FEATURE_FIXED;
    snprintf(e, sizeof(e), "a request %s%s%s, but %s (an older worker): asked again %s%s%s",
             several ? "of several datasets" : "", several && fixed ? " and " : "",
             fixed ? "with fixed-width indices" : "", why, several ? "one dataset a request" : "",
             several && fixed ? " and " : "", fixed ? "with varint indices" : "");
    BW_DEBUG("worker=%s data_channel=%s %s", x->wid, x->address, e);
    res->fallback = true;
    return end(x, res, BW_UNAVAILABLE, false, e);
}

/* Starts receiving sample `key` of `size` bytes (of a SAMPLE frame, or the next of a RUN). */
static bool start_sample(bw__xfer *x, const bw__sink *sink, bw__xres *res, uint64_t key,
                         uint64_t size)
{
    char e[BW_XFER_ERRLEN];
    x->c->read_ahead = size < BW_DCONN_BUF / 4 && !x->c->in_runs;
    x->dest = NULL;
    x->got = 0;
    /* place() checks the key and size against what is due before anything is reserved: a
     * RUN frame longer than the samples due, or of other samples, ends here. */
    int rc = sink->place(sink->ctx, key, size, 0, size, &x->dest, e, sizeof(e));
    if (rc != BW_OK && x->f.type == BW_DCHAN_RUN) {
        char why[BW_XFER_ERRLEN];
        snprintf(why, sizeof(why), "in a RUN frame of %u samples from index %llu: %.800s",
                 x->f.code, (unsigned long long)x->f.a, e);
        return end(x, res, rc, false, why);
    }
    if (rc != BW_OK)
        return end(x, res, rc, false, e);
    x->need = (size_t)size;
    x->phase = X_DATA;
    return false;
}

/* The sample in progress has arrived whole: it counts, and the next one of its RUN starts. */
static bool sample_done(bw__xfer *x, const bw__sink *sink, bw__xres *res)
{
    sink->arrived(sink->ctx, x->need);
    x->nsamples++;
    x->phase = X_HDR;
    if (!x->run_left)
        return false;
    x->run_left--;
    return start_sample(x, sink, res, x->idx[x->nsamples], x->run_size);
}

/* ---- compression (docs/data-channel.md, "Compression") ---- */

/* A ZRUN frame's header: every field is checked before a byte of it is taken, as a RUN's (its
 * samples are the request's next ones from the one it names, of one size of at least 1 byte),
 * and its sizes are bounded -- at most BW_DCHAN_ZRUN_MAX bytes decompressed, fewer compressed --
 * before its compressed bytes are read into the connection's buffer. */
static bool zrun_start(bw__xfer *x, bw__xres *res)
{
    char e[BW_XFER_ERRLEN];
    const bw_dchan_frame *f = &x->f;
    uint64_t size = f->b >> 32, clen = f->b & 0xffffffffu;
    if (!(x->c->features & BW_DCHAN_FEATURE_ZSTD) || x->kind != BW_DCHAN_KIND_READ_SAMPLES) {
        snprintf(e, sizeof(e),
                 "sent a ZRUN frame (%u samples from index %llu) on a connection that did not ask "
                 "for them (features %#llx, request kind %u)",
                 f->code, (unsigned long long)f->a, (unsigned long long)x->c->features, x->kind);
        return end(x, res, BW_PROTOCOL, false, e);
    }
    uint64_t due = x->nsamples < x->nidx ? x->idx[x->nsamples] : 0;
    if (f->code == 0 || f->code > x->nidx - x->nsamples || f->a != due || size == 0 ||
        size > BW_DCHAN_ZRUN_MAX / f->code || clen == 0 || clen >= size * f->code) {
        snprintf(e, sizeof(e),
                 "sent a ZRUN frame of %u samples of %llu bytes from index %llu in %llu compressed "
                 "bytes where %llu samples were due from index %llu (a ZRUN holds 1 to the "
                 "samples due, from the one due, of at least 1 byte each, at most %d bytes in "
                 "all, compressed to fewer)",
                 f->code, (unsigned long long)size, (unsigned long long)f->a,
                 (unsigned long long)clen, (unsigned long long)(x->nidx - x->nsamples),
                 (unsigned long long)due, BW_DCHAN_ZRUN_MAX);
        return end(x, res, BW_PROTOCOL, false, e);
    }
    bw__dconn *c = x->c;
    if (clen > c->zcap) {
        uint8_t *p = realloc(c->zin, (size_t)clen);
        if (!p)
            return end(x, res, BW_NOMEM, false, "out of memory for a ZRUN frame");
        c->zin = p;
        c->zcap = (size_t)clen;
    }
    c->in_runs = true; /* the next header most likely starts another: read alone */
    c->read_ahead = clen < BW_DCONN_BUF / 4;
    x->dest = c->zin;
    x->need = (size_t)clen;
    x->got = 0;
    x->phase = X_ZDATA;
    return false;
}

/* A ZRUN frame's compressed bytes have arrived: each of its samples is decompressed straight
 * into its place in the batch, and counts once whole. A zstd frame that does not decompress
 * to exactly the samples' declared bytes, and end where the compressed bytes do, fails the
 * request with BW_CORRUPT naming the sample (a worker's bug or a hostile one: not retried
 * elsewhere); nothing is written past the places of the samples due, and the decompressor's
 * window is at most 2^BW_DCHAN_ZSTD_WINDOW_LOG_MAX bytes, whatever the frame asks. */
static bool zrun_decode(bw__xfer *x, const bw__sink *sink, bw__xres *res)
{
    char e[BW_XFER_ERRLEN], pe[BW_XFER_ERRLEN];
    bw__dconn *c = x->c;
    uint32_t n = x->f.code;
    uint64_t size = x->f.b >> 32, first = x->f.a, total = size * n;
    size_t clen = x->need;
    x->phase = X_HDR;
    if (!c->zd && (c->zd = ZSTD_createDCtx()) != NULL &&
        ZSTD_isError(
            ZSTD_DCtx_setParameter(c->zd, ZSTD_d_windowLogMax, BW_DCHAN_ZSTD_WINDOW_LOG_MAX))) {
        ZSTD_freeDCtx(c->zd);
        c->zd = NULL;
    }
    if (!c->zd)
        return end(x, res, BW_NOMEM, false, "out of memory for a zstd decompressor");
    ZSTD_DCtx_reset(c->zd, ZSTD_reset_session_only);
    unsigned long long cs = ZSTD_getFrameContentSize(c->zin, clen);
    if (cs != total) {
        char got[64];
        snprintf(got, sizeof(got), "declares %llu bytes", cs);
        snprintf(e, sizeof(e),
                 "sent a ZRUN frame of %u samples of %llu bytes from index %llu whose zstd frame "
                 "%s instead of %llu",
                 n, (unsigned long long)size, (unsigned long long)first,
                 cs == ZSTD_CONTENTSIZE_ERROR     ? "is not a zstd frame"
                 : cs == ZSTD_CONTENTSIZE_UNKNOWN ? "does not declare its size"
                                                  : got,
                 (unsigned long long)total);
        return end(x, res, BW_CORRUPT, false, e);
    }
    ZSTD_inBuffer in = {c->zin, clen, 0};
    size_t r = 1;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t key = x->idx[x->nsamples];
        uint8_t *d = NULL;
        int rc = sink->place(sink->ctx, key, size, 0, size, &d, pe, sizeof(pe));
        if (rc != BW_OK) {
            snprintf(e, sizeof(e), "in a ZRUN frame of %u samples from index %llu: %.800s", n,
                     (unsigned long long)first, pe);
            return end(x, res, rc, false, e);
        }
        ZSTD_outBuffer out = {d, (size_t)size, 0};
        const char *why = NULL;
        while (out.pos < out.size && !why) {
            size_t in0 = in.pos, out0 = out.pos;
            r = ZSTD_decompressStream(c->zd, &out, &in);
            if (ZSTD_isError(r))
                why = ZSTD_getErrorName(r);
            else if (out.pos < out.size && (r == 0 || (in.pos == in0 && out.pos == out0)))
                why = "the zstd frame ends before it";
        }
        if (why) {
            snprintf(e, sizeof(e),
                     "sample %llu (%u of the %u of a ZRUN frame from index %llu, %zu compressed "
                     "bytes) does not decompress to its %llu bytes: %s",
                     (unsigned long long)key, i + 1, n, (unsigned long long)first, clen,
                     (unsigned long long)size, why);
            return end(x, res, BW_CORRUPT, false, e);
        }
        sink->arrived(sink->ctx, size);
        x->nsamples++;
    }
    /* Then the frame must end (its checksum, if any, checked), with nothing after it. */
    uint8_t more;
    ZSTD_outBuffer out = {&more, 1, 0};
    while (r != 0 && !ZSTD_isError(r) && out.pos == 0) {
        size_t in0 = in.pos;
        r = ZSTD_decompressStream(c->zd, &out, &in);
        if (!ZSTD_isError(r) && r != 0 && in.pos == in0 && out.pos == 0)
            break; /* no progress: the frame is cut short */
    }
    if (ZSTD_isError(r) || r != 0 || out.pos || in.pos != in.size) {
        snprintf(e, sizeof(e),
                 "the zstd frame of a ZRUN frame of %u samples from index %llu (%zu compressed "
                 "bytes) does not end after the %llu bytes it declares: %s",
                 n, (unsigned long long)first, clen, (unsigned long long)total,
                 ZSTD_isError(r) ? ZSTD_getErrorName(r)
                 : out.pos       ? "it holds more"
                 : r != 0        ? "it is cut short"
                                 : "bytes follow it");
        return end(x, res, BW_CORRUPT, false, e);
    }
    return false;
}

/* The frame in x->hdr: starts its payload, or ends the response. */
static bool frame(bw__xfer *x, const bw__sink *sink, bw__xres *res)
{
    char e[BW_XFER_ERRLEN];
    bw_dchan_frame *f = &x->f;
    bw__dchan_get_frame(x->hdr, f);
    x->got = 0;
    if (x->c->hello && f->type != BW_DCHAN_ERROR) {
        /* The answer to FEATURES comes first: END, a = 0, b = features offered. */
        /* (the zstd level used may be another than the one asked for) */
        uint64_t may = x->s->offer | BW_DCHAN_ZSTD_LEVEL_MASK;
        if (f->type != BW_DCHAN_END || f->code || f->a || (f->b & ~may)) {
            snprintf(e, sizeof(e),
                     "answered the FEATURES request (offering %#llx) with frame type %u, code %u, "
                     "a %llu, b %#llx instead of END, 0, 0 and some of the features offered",
                     (unsigned long long)x->s->offer, f->type, f->code, (unsigned long long)f->a,
                     (unsigned long long)f->b);
            return end(x, res, BW_PROTOCOL, false, e);
        }
        x->c->hello = false;
        x->c->features = f->b;
        dconn_learned(x->s, x->address, f->b);
        if (x->needs & ~f->b)
            return refused(x, res, x->needs & ~f->b, "its FEATURES answer does not offer them");
        if (x->s->offer & BW_DCHAN_FEATURE_ZSTD)
            BW_DEBUG("worker=%s data_channel=%s compression: %s (features %#llx)", x->wid,
                     x->address,
                     !(f->b & BW_DCHAN_FEATURE_ZSTD)     ? "none (the worker does not offer it)"
                     : f->b & BW_DCHAN_FEATURE_ZSTD_AUTO ? "auto"
                                                         : "zstd",
                     (unsigned long long)f->b);
        x->c->in_runs = (f->b & BW_DCHAN_FEATURE_RUNS) != 0; /* its first header read alone */
        return false;
    }
    x->any = true;
    if (f->type == BW_DCHAN_ZRUN)
        return zrun_start(x, res);
    if (f->type == BW_DCHAN_SAMPLE) {
        x->c->in_runs = false;
        return start_sample(x, sink, res, f->a, f->b);
    }
    if (f->type == BW_DCHAN_RUN) {
        if (!(x->c->features & BW_DCHAN_FEATURE_RUNS) || x->kind != BW_DCHAN_KIND_READ_SAMPLES) {
            snprintf(e, sizeof(e),
                     "sent a RUN frame (%u samples from index %llu) on a connection that did not "
                     "ask for them (features %#llx, request kind %u)",
                     f->code, (unsigned long long)f->a, (unsigned long long)x->c->features,
                     x->kind);
            return end(x, res, BW_PROTOCOL, false, e);
        } /* Every field is checked before a byte of it is taken: its samples are the request's
           * next ones, the first the one it names, each of at least one byte. */
        uint64_t due = x->nsamples < x->nidx ? x->idx[x->nsamples] : 0;
        if (f->code == 0 || f->code > x->nidx - x->nsamples || f->a != due || f->b == 0) {
            snprintf(e, sizeof(e),
                     "sent a RUN frame of %u samples of %llu bytes from index %llu where %llu "
                     "samples were due from index %llu (a run holds 1 to the samples due, from "
                     "the one due, of at least 1 byte each)",
                     f->code, (unsigned long long)f->b, (unsigned long long)f->a,
                     (unsigned long long)(x->nidx - x->nsamples), (unsigned long long)due);
            return end(x, res, BW_PROTOCOL, false, e);
        }
        x->run_left = f->code - 1;
        x->run_size = f->b;
        x->c->in_runs = f->code > 1;
        return start_sample(x, sink, res, f->a, f->b);
    }
    if (f->type == BW_DCHAN_END) {
        if (f->a != x->nsamples) {
            snprintf(e, sizeof(e), "ended the request saying %llu samples after sending %llu",
                     (unsigned long long)f->a, (unsigned long long)x->nsamples);
            return end(x, res, BW_PROTOCOL, false, e);
        }
        if (x->kind == BW_DCHAN_KIND_READ_STREAM) {
            res->has_end_offset = true;
            res->end_offset = f->b;
        }
        return end(x, res, BW_OK, true, "");
    }
    if (f->type == BW_DCHAN_ERROR && f->a <= BW_DCHAN_MAX_MESSAGE) {
        x->dest = (uint8_t *)x->msg;
        x->need = (size_t)f->a;
        x->phase = X_MSG;
        return false;
    }
    snprintf(e, sizeof(e), "unexpected frame type %u (length %llu)", f->type,
             (unsigned long long)f->a);
    return end(x, res, BW_PROTOCOL, false, e);
}

/* The worker did not answer the FEATURES request sent ahead of the request (an older worker,
 * which refuses it and closes the connection; `why` says how it ended): the request is sent
 * again on a fresh connection, without FEATURES, as for such a worker. */
static bool resend_plain(bw__xfer *x, bw__xres *res, const char *why)
{
    char e[BW_XFER_ERRLEN];
    dconn_mark_old(x->s, x->address, why);
    if (x->needs)
        return refused(x, res, x->needs, "it knows no FEATURES request");
    x->phase = X_HDR;
    x->hgot = x->got = x->need = 0;
    x->run_left = 0;
    int rc = send_req(x, true, e, sizeof(e));
    return rc == BW_OK ? false : end(x, res, rc, false, e);
}

/* The ERROR frame's message has arrived. */
static bool error_frame(bw__xfer *x, bw__xres *res)
{
    char e[BW_XFER_ERRLEN];
    x->msg[x->need] = '\0';
    int code = (int)(int32_t)x->f.code;
    if (x->c->hello && code == BW_PROTOCOL)
        return resend_plain(x, res, x->msg);
    if (code >= 0 || strcmp(bw_err_name(code), "BW_UNKNOWN_ERROR") == 0) {
        snprintf(e, sizeof(e), "error frame with unknown code %d: %.900s", code, x->msg);
        return end(x, res, BW_PROTOCOL, false, e);
    }
    if (code == BW_BUSY)
        res->retry_after_ms = x->f.b > 60000 ? 60000 : (uint32_t)x->f.b;
    /* Refused before any sample because the worker is at its data-connection limit, or does
     * not know this kind of request (an older worker): not a failed worker -- ask it over
     * gRPC, at once. */
    if ((code == BW_UNAVAILABLE || code == BW_PROTOCOL || code == BW_UNIMPLEMENTED) &&
        x->nsamples == 0) {
        dconn_suspend(x->s, x->address, x->wid, x->msg, false);
        res->fallback = true;
        return end(x, res, code, false, x->msg);
    }
    return end(x, res, code, true, x->msg);
}

/* The bytes the first n of iov[from, niov) hold, as the connection's read-ahead buffer (at
 * most its size): what followed a frame header spec_recv did not expect, for frame() and the
 * reads after it. BW_NOMEM when no room could be had for them. */
static int respool(bw__dconn *c, const struct iovec *iov, size_t from, size_t niov, size_t n)
{
    size_t keep = n < BW_DCONN_BUF ? n : BW_DCONN_BUF; /* more: the worker broke the protocol */
    uint8_t *tmp = keep ? malloc(keep) : NULL;         /* the last iovec may be c->buf itself */
    if (keep && !tmp)
        return BW_NOMEM;
    size_t done = 0;
    for (size_t i = from; i < niov && done < keep; i++) {
        size_t take = iov[i].iov_len < keep - done ? iov[i].iov_len : keep - done;
        memcpy(tmp + done, iov[i].iov_base, take);
        done += take;
    }
    if (done)
        memcpy(c->buf, tmp, done);
    free(tmp);
    c->pos = 0;
    c->len = done;
    return BW_OK;
}

/* Plain TCP, fixed-size samples (the sink peeks): one recvmsg takes the rest of the sample in
 * progress (or of a header begun), then, for each of the next samples due, its frame header
 * into a slot and its bytes straight into its place in the batch, and -- once every sample due
 * is posted -- the END header into the read-ahead buffer. So small samples cost no copy in
 * user space and no read of their own (docs/performance.md, "Client"). A header that is not
 * the SAMPLE frame due (END, ERROR, another sample) goes to frame() as usual, the bytes after
 * it to the read-ahead buffer. *used: false when nothing could be posted (the caller reads the
 * usual way); *got: bytes received (0: none yet); *ended: the request ended. BW_OK, or the
 * connection's error (nothing was taken). */
static int spec_recv(bw__xfer *x, const bw__sink *sink, bw__xres *res, bool *used, bool *ended,
                     size_t *got, char *err, size_t errlen)
{
    bw__dconn *c = x->c;
    *used = *ended = false;
    *got = 0;
    if (!c->spec && (c->spec = malloc(sizeof(*c->spec))) != NULL)
        c->spec->cap = SPEC_START;
    struct spec *sp = c->spec;
    if (!sp)
        return BW_OK; /* out of memory: the usual way */
    size_t niov = 0, lead = x->phase == X_DATA, pre = lead ? 0 : x->hgot, m = 0;
    if (lead)
        sp->iov[niov++] = (struct iovec){x->dest + x->got, x->need - x->got};
    uint64_t size = 0, sz;
    bool all = false; /* every sample due is posted */
    /* Where the worker may send RUN frames, a header may turn out to be a RUN whose samples
     * then lie across the slots posted after it: respool moves what followed it to the
     * read-ahead buffer, so no more is posted after the first header than that holds. */
    bool capped = (c->features & BW_DCHAN_FEATURE_RUNS) != 0;
    uint64_t posted = 0; /* after the first header, with the END header's slot */
    for (; m < sp->cap; m++) {
        if (!sink->peek(sink->ctx, lead + m, &sp->key[m], &sz, &sp->dest[m]) || (m && sz != size)) {
            all = true;
            break;
        }
        posted += (m ? BW_DCHAN_FRAME_HEADER : 0) + sz;
        if (capped && (sz > BW_DCONN_BUF || posted + BW_DCHAN_FRAME_HEADER > BW_DCONN_BUF))
            break;
        size = sz;
        sp->iov[niov++] =
            (struct iovec){sp->hdr[m] + (m ? 0 : pre), BW_DCHAN_FRAME_HEADER - (m ? 0 : pre)};
        sp->iov[niov++] = (struct iovec){sp->dest[m], (size_t)sz};
    }
    if (m == 0)
        return BW_OK;
    *used = true;
    memcpy(sp->hdr[0], x->hdr, pre);
    if (all)
        sp->iov[niov++] = (struct iovec){c->buf, BW_DCHAN_FRAME_HEADER};
    size_t left = 0, done = 0, j = 0;
    int rc = dconn_recvmsg(c, sp->iov, niov, &left, err, errlen);
    if (rc != BW_OK || left == 0)
        return rc;
    *got = left;
    if (lead) {
        size_t take = left < x->need - x->got ? left : x->need - x->got;
        x->got += take;
        left -= take;
        if (x->got < x->need)
            return BW_OK;
        sink->arrived(sink->ctx, x->need);
        x->nsamples++;
        x->phase = X_HDR;
    }
    for (; j < m && left; j++) {
        size_t had = j ? 0 : pre, hl = BW_DCHAN_FRAME_HEADER - had;
        if (left < hl) { /* a header begun: the next read goes on with it */
            memcpy(x->hdr, sp->hdr[j], had + left);
            x->hgot = had + left;
            left = 0;
            break;
        }
        left -= hl;
        x->hgot = 0;
        bw__dchan_get_frame(sp->hdr[j], &x->f);
        if (x->f.type != BW_DCHAN_SAMPLE || x->f.a != sp->key[j] || x->f.b != size) {
            rc = respool(c, sp->iov, lead + 2 * j + 1, niov, left);
            memcpy(x->hdr, sp->hdr[j], sizeof(x->hdr));
            *ended = rc == BW_OK ? frame(x, sink, res)
                                 : end(x, res, rc, false, "out of memory for a frame");
            return BW_OK;
        }
        x->any = true;
        uint8_t *d = NULL;
        rc = sink->place(sink->ctx, x->f.a, size, 0, size, &d, err, errlen);
        if (rc == BW_OK && d != sp->dest[j]) {
            snprintf(err, errlen, "sample %llu's place moved while it was received",
                     (unsigned long long)x->f.a);
            rc = BW_INTERNAL;
        }
        if (rc != BW_OK) {
            *ended = end(x, res, rc, false, err);
            return BW_OK;
        }
        size_t take = left < size ? left : (size_t)size;
        left -= take;
        if (take < size) { /* the next read goes on with it */
            x->dest = d;
            x->need = (size_t)size;
            x->got = take;
            x->phase = X_DATA;
            break;
        }
        sink->arrived(sink->ctx, size);
        x->nsamples++;
        done++;
    }
    if (left) { /* past every slot: the END header (or what came instead) */
        c->pos = 0;
        c->len = left;
    }
    /* Post about twice what arrived: a read that posts far more than has arrived spends its
     * time on iovecs. */
    size_t cap = done == m && !all ? m * 2 : done * 2 > 8 ? done * 2 : 8;
    sp->cap = cap < SPEC_MAX ? cap : SPEC_MAX; /* the slots' arrays hold SPEC_MAX */
    return BW_OK;
}

/* The places of up to n samples of the RUN in progress after the one being received, from
 * `ahead` on (as peek counts): how many, from the first, lie back to back from *dest -- the
 * sink's span, else its peek a sample at a time. 0: not known ahead (place() judges each). */
static size_t run_span(const bw__xfer *x, const bw__sink *sink, size_t ahead, size_t n,
                       uint8_t **dest)
{
    const uint64_t *keys = x->idx + x->nsamples + ahead;
    if (sink->span)
        return sink->span(sink->ctx, ahead, keys, n, x->run_size, dest);
    size_t m = 0;
    for (uint8_t *next = NULL; m < n; m++) {
        uint64_t key, sz;
        uint8_t *d;
        if (!sink->peek(sink->ctx, ahead + m, &key, &sz, &d) || key != keys[m] ||
            sz != x->run_size || (m && d != next))
            break;
        if (!m)
            *dest = d;
        next = d + sz;
    }
    return m;
}

/* The place of the j-th sample posted in the pieces of sp (run_recv). */
static uint8_t *run_place(const struct spec *sp, size_t j, uint64_t size)
{
    size_t p = 0;
    while (j >= sp->count[p])
        j -= sp->count[p++];
    return sp->dest[p] + j * size;
}

/* The next k samples of the run, posted in sp's pieces, have landed whole: they count -- the
 * sink's landed, else place() (which must give each the place it was posted at) and arrived()
 * a sample at a time. BW_OK, or the error with a sentence in err. */
static int run_landed(bw__xfer *x, const bw__sink *sink, const struct spec *sp, size_t k, char *err,
                      size_t errlen)
{
    uint64_t size = x->run_size;
    if (sink->landed) {
        sink->landed(sink->ctx, k, size);
        x->nsamples += k;
        return BW_OK;
    }
    for (size_t j = 0; j < k; j++, x->nsamples++) {
        uint8_t *d = NULL;
        int rc = sink->place(sink->ctx, x->idx[x->nsamples], size, 0, size, &d, err, errlen);
        if (rc == BW_OK && d != run_place(sp, j, size)) {
            snprintf(err, errlen, "sample %llu's place moved while it was received",
                     (unsigned long long)x->idx[x->nsamples]);
            rc = BW_INTERNAL;
        }
        if (rc != BW_OK)
            return rc;
        sink->arrived(sink->ctx, size);
    }
    return BW_OK;
}

/* Plain TCP, fixed-size samples (the sink peeks), inside a RUN frame: one recvmsg takes the
 * rest of the sample in progress and the next samples of the run, each straight into its
 * place in the batch -- places that follow one another as one piece (plan order: neighbours in
 * the batch that the same worker holds), at most SPEC_MAX pieces and about twice the samples the
 * last read brought -- and, once the run's last sample is posted, the next frame header into the
 * read-ahead buffer. No copy in user space, no header and no call into the sink per sample
 * (span, landed; docs/data-channel.md, "RUN frames"; docs/performance.md, "Per-sample cost,
 * eighth pass"). The run's samples are the request's next ones (frame() checked its header);
 * each posted is the one due, of the run's size, or it is not posted and place() judges it
 * when it comes. *ended: the request ended; *got: bytes received (0: none yet). BW_OK, or the
 * connection's error. */
static int run_recv(bw__xfer *x, const bw__sink *sink, bw__xres *res, bool *ended, size_t *got,
                    char *err, size_t errlen)
{
    bw__dconn *c = x->c;
    *ended = false;
    *got = 0;
    if (!c->spec && (c->spec = malloc(sizeof(*c->spec))) != NULL) {
        c->spec->cap = SPEC_START;
        c->spec->runcap = RUN_POST_START;
    }
    struct spec *sp = c->spec;
    if (!sp) { /* out of memory: this sample alone */
        struct iovec one = {x->dest + x->got, x->need - x->got};
        int rc = dconn_recvmsg(c, &one, 1, got, err, errlen);
        if (rc == BW_OK && (x->got += *got) == x->need)
            *ended = sample_done(x, sink, res);
        return rc;
    }
    uint64_t size = x->run_size;
    size_t niov = 0, np = 0, posted = 0;
    size_t cap = x->run_left < sp->runcap ? (size_t)x->run_left : sp->runcap;
    sp->iov[niov++] = (struct iovec){x->dest + x->got, x->need - x->got};
    while (posted < cap && np < SPEC_MAX) {
        uint8_t *d = NULL;
        size_t k = run_span(x, sink, 1 + posted, cap - posted, &d);
        if (!k)
            break; /* not known ahead: place() judges it when it comes */
        struct iovec *last = &sp->iov[niov - 1];
        if ((uint8_t *)last->iov_base + last->iov_len == d)
            last->iov_len += k * (size_t)size;
        else
            sp->iov[niov++] = (struct iovec){d, k * (size_t)size};
        sp->dest[np] = d;
        sp->count[np++] = k;
        posted += k;
    }
    if (posted == x->run_left) /* the run's end is posted: then the next frame header */
        sp->iov[niov++] = (struct iovec){c->buf, BW_DCHAN_FRAME_HEADER};
    size_t left = 0;
    int rc = dconn_recvmsg(c, sp->iov, niov, &left, err, errlen);
    if (rc != BW_OK || left == 0)
        return rc;
    *got = left;
    size_t take = left < x->need - x->got ? left : x->need - x->got;
    x->got += take;
    left -= take;
    if (x->got < x->need)
        return BW_OK;
    /* The sample in progress is whole; then those posted after it that arrived whole. */
    sink->arrived(sink->ctx, x->need);
    x->nsamples++;
    x->phase = X_HDR;
    size_t whole = left / (size_t)size < posted ? left / (size_t)size : posted;
    if (whole && (rc = run_landed(x, sink, sp, whole, err, errlen)) != BW_OK) {
        *ended = end(x, res, rc, false, err);
        return BW_OK;
    }
    x->run_left -= whole;
    left -= whole * (size_t)size;
    size_t next = 2 * (whole + 1);
    sp->runcap = next < RUN_POST_START ? RUN_POST_START : next < RUN_POST_MAX ? next : RUN_POST_MAX;
    if (x->run_left) { /* the run's next sample starts: its bytes so far, where it was posted */
        x->run_left--;
        if ((*ended = start_sample(x, sink, res, x->idx[x->nsamples], size)))
            return BW_OK;
        if (whole < posted) {
            if (x->dest != run_place(sp, whole, size)) {
                snprintf(err, errlen, "sample %llu's place moved while it was received",
                         (unsigned long long)x->idx[x->nsamples]);
                *ended = end(x, res, BW_INTERNAL, false, err);
                return BW_OK;
            }
            x->got = left; /* less than a sample: whole counted every complete one */
            left = 0;
        }
    }
    if (left) { /* past the run: the next frame header (or part of it), in the buffer */
        c->pos = 0;
        c->len = left;
    }
    return BW_OK;
}

/* Waiting for more of the response: false (recv_some's "not ended"), with res->received
 * current. Inside a RUN frame on plain TCP the socket wakes its poller only once LOWAT_MAX
 * bytes of the run (or all that is left of it, if less) have arrived -- a RUN's header
 * promises its bytes, which the worker sends with it -- so a thread receiving a large run
 * wakes, and reads, a few times per run rather than for every segment that lands (the fetch
 * loop reads a quiet request now and then all the same: a worker sending slowly is alive --
 * fetch.c, receive); elsewhere (frame headers, messages, other frames) at the first byte, as
 * by default. A mark that cannot be set leaves the socket as it was: waking early is safe. */
static bool wait_more(bw__xfer *x, bw__xres *res)
{
    bw__dconn *c = x->c;
    res->received = c->rx;
    size_t want = 1;
    if (!c->s.ssl && x->phase == X_DATA && x->run_left && c->pos == c->len)
        want = (x->need - x->got) + (size_t)(x->run_left * x->run_size);
    dconn_lowat(c, want > LOWAT_MAX ? LOWAT_MAX : (int)want);
    return false;
}

static bool recv_some(bw__xfer *x, const bw__sink *sink, bw__xres *res)
{
    char e[BW_XFER_ERRLEN];
    for (;;) {
        bw__dconn *c = x->c;
        size_t got = 0;
        int rc = BW_OK;
        bool spec = false, ended = false;
        if (!c->s.ssl && c->pos == c->len && sink->peek && x->kind == BW_DCHAN_KIND_READ_SAMPLES &&
            x->phase == X_DATA && x->run_left) {
            rc = run_recv(x, sink, res, &ended, &got, e, sizeof(e));
            if (rc == BW_OK && ended)
                return true;
            if (rc != BW_OK)
                return end(x, res, rc, false, e);
            if (!got)
                return wait_more(x, res);
            continue;
        }
        if (!c->s.ssl && c->pos == c->len && sink->peek && x->kind == BW_DCHAN_KIND_READ_SAMPLES &&
            x->phase != X_MSG && x->phase != X_ZDATA && !c->hello && !c->in_runs && !x->run_left)
            rc = spec_recv(x, sink, res, &spec, &ended, &got, e, sizeof(e));
        if (spec || x->phase == X_HDR) {
            if (!spec)
                rc = dconn_take(c, x->hdr + x->hgot, sizeof(x->hdr) - x->hgot, false, &got, e,
                                sizeof(e));
            if (rc == BW_UNAVAILABLE && x->phase == X_HDR && !x->any && x->hgot == 0 && c->reused &&
                !x->retried) {
                /* An idle connection the worker had closed: ask again on a new one. */
                BW_DEBUG("worker=%s data_channel=%s an idle connection was closed; asking again "
                         "on a new one err=%s",
                         x->wid, x->address, e);
                x->retried = true;
                if ((rc = send_req(x, true, e, sizeof(e))) == BW_OK)
                    continue;
            }
            /* (x->c, not c: a failed resend above freed c) */
            if (rc == BW_UNAVAILABLE && x->c && x->c->hello)
                return resend_plain(x, res, e); /* an older worker closed it after FEATURES */
            if (rc != BW_OK)
                return end(x, res, rc, false, e);
            if (ended)
                return true;
            if (!got)
                return wait_more(x, res);
            if (spec)
                continue;
            if ((x->hgot += got) == sizeof(x->hdr)) {
                x->hgot = 0;
                if (frame(x, sink, res))
                    return true;
            }
            continue;
        }
        if (x->got < x->need) {
            size_t left = x->need - x->got;
            rc = dconn_take(c, x->dest + x->got, left,
                            x->phase != X_MSG && (left >= BW_DCONN_BUF / 4 || !c->read_ahead), &got,
                            e, sizeof(e));
            /* (x->c, not c: a failed resend above freed c) */
            if (rc == BW_UNAVAILABLE && x->c && x->c->hello)
                return resend_plain(x, res, e); /* an older worker closed it after FEATURES */
            if (rc != BW_OK)
                return end(x, res, rc, false, e);
            if (!got)
                return wait_more(x, res);
            x->got += got;
        }
        if (x->got == x->need) {
            if (x->phase == X_MSG)
                return error_frame(x, res);
            if (x->phase == X_ZDATA) {
                if (zrun_decode(x, sink, res))
                    return true;
                continue;
            }
            if (sample_done(x, sink, res))
                return true;
        }
    }
}

const bw__transport_ops bw__transport_dchan_ops = {
    "data channel", usable, start, xfd, recv_some, xfer_free, create, destroy, speaks};
