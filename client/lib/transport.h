/*
 * Transports: how one read request reaches a worker and how its samples come back
 * (docs/architecture.md, "The client"). A transport is a table of operations -- create its
 * state, start a request, say which descriptor to wait on, receive what has arrived into the
 * places a sink gives, finish, destroy -- with two implementations: the workers' data channel
 * (TCP or TLS, data_channel.c, docs/data-channel.md) and gRPC (transport_grpc.c). Each owns its
 * state -- connection pools, suspensions, TLS contexts, channel caches -- and its wire's
 * quirks; nobody else touches them. Neither knows about batches, placement or retries: the
 * fetch loop (fetch.c) owns those, and unit tests drive it through a transport of their own.
 */
#ifndef BW_CLIENT_TRANSPORT_H
#define BW_CLIENT_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/crypto.h>
#include <protobuf-c/protobuf-c.h>

#include "auth/grant.h"
#include "data.pb-c.h"
#include "route.h"
#include "rpc/client.h"
#include "rpc/dchan.h"

enum { BW_XFER_ERRLEN = 1024 };

/* What a request asks for: BW_DCHAN_KIND_READ_SAMPLES (a ReadSamplesRequest) or
 * BW_DCHAN_KIND_READ_STREAM (a ReadStreamRequest); both transports carry the same message. */
typedef struct bw__read_req {
    uint32_t kind;
    const ProtobufCMessage *msg;
} bw__read_req;

/*
 * Read grants (docs/security.md, "Read grants"). With authentication on, the loader never
 * sends its bearer token to a worker: each request carries the lease's grant instead -- the
 * coordinator's claims, and a proof bound to the worker it goes to. The transports take both
 * from a grant source (the session's, given at create) for each request.
 */
typedef struct bw__grant_copy {
    size_t claims_len;
    uint8_t claims[BW_GRANT_CLAIMS_MAX];
    uint8_t proof[BW_GRANT_PROOF_BYTES];
} bw__grant_copy;

typedef struct bw__grant_src {
    /* Copies the current grant's claims and the proof for worker `worker_id` into *out: true,
     * or false when there is no grant (authentication off: the request goes as it is). Any
     * thread; never blocks on I/O. NULL: never a grant. */
    bool (*get)(void *ctx, const char *worker_id, bw__grant_copy *out);
    void *ctx;
} bw__grant_src;

/* What a transport is created from: the loader's settings for workers. */
typedef struct bw__worker_opts {
    /* TLS files and the message limit; the target is unset, and the token is never used: no
     * bearer token goes to a worker, whatever this holds. */
    bw_rpc_channel_opts rpc;
    bw__grant_src grant;
    /* The data channel's compression: the FEATURES bits asked for on top of RUN frames
     * (BW_DCHAN_FEATURE_ZSTD, _ZSTD_AUTO and a level; docs/data-channel.md, "Compression"), or
     * 0 for raw frames. gRPC ignores it. */
    uint64_t compress;
} bw__worker_opts;

/* The message a transport sends worker `worker_id` for req: req->msg itself without a grant,
 * else a shallow copy of it in *g carrying the grant (ReadGrant, field 20 of both request
 * messages), valid while *g is. Wipe *g with bw__granted_wipe once the message is packed. */
typedef struct bw__granted {
    union {
        Batchwire__V1__ReadSamplesRequest samples;
        Batchwire__V1__ReadStreamRequest stream;
    } m;
    Batchwire__V1__ReadGrant grant;
    bw__grant_copy copy;
    bool used;
} bw__granted;

static inline const ProtobufCMessage *bw__read_req_granted(const bw__read_req *req,
                                                           const bw__grant_src *src,
                                                           const char *worker_id, bw__granted *g)
{
    g->used = false;
    if (!src->get || !src->get(src->ctx, worker_id, &g->copy))
        return req->msg;
    g->used = true;
    g->grant = (Batchwire__V1__ReadGrant)BATCHWIRE__V1__READ_GRANT__INIT;
    g->grant.claims = (ProtobufCBinaryData){g->copy.claims_len, g->copy.claims};
    g->grant.proof = (ProtobufCBinaryData){sizeof(g->copy.proof), g->copy.proof};
    if (req->kind == BW_DCHAN_KIND_READ_STREAM) {
        g->m.stream = *(const Batchwire__V1__ReadStreamRequest *)req->msg;
        g->m.stream.grant = &g->grant;
        return &g->m.stream.base;
    }
    g->m.samples = *(const Batchwire__V1__ReadSamplesRequest *)req->msg;
    g->m.samples.grant = &g->grant;
    return &g->m.samples.base;
}

static inline void bw__granted_wipe(bw__granted *g)
{
    if (g->used)
        OPENSSL_cleanse(g->copy.proof, sizeof(g->copy.proof));
}

/*
 * Where received bytes go. For each sample the transport calls place() with its key (the
 * dataset index, or the record number in its source), its whole size, and the chunk it
 * carries (chunk_off, len): place() checks them against what the request asked, and sets
 * *dest to where the len bytes go (NULL only when len is 0). Returns BW_OK or an error with a
 * sentence in err; the transport then ends the request with that error.
 */
typedef struct bw__sink {
    int (*place)(void *ctx, uint64_t key, uint64_t size, uint64_t chunk_off, uint64_t len,
                 uint8_t **dest, char *err, size_t errlen);
    /* The len bytes of the chunk last placed have all landed: only then does the sample
     * count (a connection that ends inside a sample loses that sample, whole). */
    void (*arrived)(void *ctx, uint64_t len);
    void *ctx;
    /* May be NULL. The sample due `ahead` samples after the next one place() expects (0: that
     * one), when its key, size and place are known before its header arrives (fixed-size
     * samples): *key, *size and *dest as place() would give them, so that a transport may
     * receive several samples straight into their places with one read -- it still calls
     * place() and arrived() for each, in order, once its header has arrived and matched.
     * false: not known; place() decides. Changes nothing. */
    bool (*peek)(void *ctx, size_t ahead, uint64_t *key, uint64_t *size, uint8_t **dest);
    /* May be NULL (then landed is unused). Many samples at once, as peek gives one: of the n
     * samples due from `ahead` on (as peek counts), how many, from the first, are the samples
     * keys[0..n) names, of `size` bytes each, not begun, with places back to back from *dest
     * -- 0 when not even the first is (peek and place() then decide). Changes nothing. */
    size_t (*span)(void *ctx, size_t ahead, const uint64_t *keys, size_t n, uint64_t size,
                   uint8_t **dest);
    /* The next k samples due, each of `size` bytes, have all landed whole at the places span
     * gave them: they count, as place() and arrived() for each one would make them -- so a
     * RUN frame's samples cost the transport no call a sample (docs/performance.md,
     * "Per-sample cost, eighth pass"). */
    void (*landed)(void *ctx, size_t k, uint64_t size);
} bw__sink;

/* How a request ended. */
typedef struct bw__xres {
    int rc;                  /* BW_OK: the worker sent every sample and ended the request */
    bool fallback;           /* this worker may still answer over the other transport */
    uint32_t retry_after_ms; /* BW_BUSY: the worker's hint */
    bool has_end_offset;     /* streams: end_offset is where the record after the last */
    uint64_t end_offset;     /* complete one starts in its source */
    /* Changes whenever bytes of the response arrive (recv keeps it current while the request
     * is in flight): the sign of life of a request whose descriptor a transport keeps quiet
     * until many bytes are in (the data channel inside a RUN frame: wait_more). */
    uint64_t received;
    char err[BW_XFER_ERRLEN];
} bw__xres;

typedef struct bw__xfer bw__xfer; /* one request in flight */

typedef struct bw__transport_ops {
    const char *name;
    /* Whether this transport can reach worker wr now. */
    bool (*usable)(void *state, const bw__worker_ref *wr);
    /* Sends req to wr. BW_OK with *out in flight, or an error in res (res->fallback: try the
     * other transport for this worker). */
    int (*start)(void *state, const bw__worker_ref *wr, const bw__read_req *req, int timeout_ms,
                 bw__xfer **out, bw__xres *res);
    /* A descriptor to poll for input, or -1: recv then blocks until the request ends. */
    int (*fd)(bw__xfer *x);
    /* Receives what has arrived into sink (never blocks when fd() >= 0). Returns true once
     * the request has ended, with res filled in. */
    bool (*recv)(bw__xfer *x, const bw__sink *sink, bw__xres *res);
    /* Ends the request (cancels it when it has not ended) and frees x. NULL is a no-op. */
    void (*finish)(bw__xfer *x);
    /* Creates the transport's state from the loader's settings for workers (TLS files,
     * message limit, the grant source; borrowed for the call, but the grant source's ctx must
     * outlive the state): every file is read here, once. BW_OK, or an error with a sentence in
     * err. NULL: no state. */
    int (*create)(const bw__worker_opts *opts, void **state, char *err, size_t errlen);
    /* Closes its connections and frees the state; no request may be in flight. NULL state is
     * a no-op. */
    void (*destroy)(void *state);
    /* Whether a request relying on `feature` (BW_DCHAN_FEATURE_* bits) may go to worker wr on
     * this transport now: what it last said, or, before it has said anything, yes (the
     * transport ends such a request unanswered if the worker turns out to lack it, for the
     * fetch to ask again without it). Any thread. NULL: never. */
    bool (*speaks)(void *state, const bw__worker_ref *wr, uint64_t feature);
} bw__transport_ops;

typedef struct bw__transport {
    const bw__transport_ops *ops;
    void *state;
} bw__transport;

/* The two real transports. */
extern const bw__transport_ops bw__transport_dchan_ops; /* data_channel.c */
extern const bw__transport_ops bw__transport_grpc_ops;  /* transport_grpc.c */

/* Creates a transport of kind ops into *t (left {NULL, NULL} on error). */
static inline int bw__transport_open(const bw__transport_ops *ops, const bw__worker_opts *opts,
                                     bw__transport *t, char *err, size_t errlen)
{
    void *state = NULL;
    int rc = ops->create ? ops->create(opts, &state, err, errlen) : BW_OK;
    *t = rc == BW_OK ? (bw__transport){ops, state} : (bw__transport){NULL, NULL};
    return rc;
}

/* Destroys t's state and clears it; a transport never opened is a no-op. */
static inline void bw__transport_close(bw__transport *t)
{
    if (t->ops && t->ops->destroy)
        t->ops->destroy(t->state);
    *t = (bw__transport){NULL, NULL};
}

#endif
