/* Internals of libbatchwire's loader: shared by options.c, session.c, fetch.c, loader.c and
 * batch.c. Nothing here is part of the public API. */
#ifndef BW_CLIENT_LOADER_INT_H
#define BW_CLIENT_LOADER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "batchwire/loader.h"
#include "common/arena.h"
#include "data.pb-c.h"
#include "jobs.pb-c.h"
#include "rpc/client.h"
#include "rpc/dchan.h"
#include "sampler/sampler.h"

enum {
    BW_LOADER_NUM_SHARDS = 256, /* storage shards samples are routed by (modulo) */
    BW_LOADER_MAX_NDIM = 16,
    BW_LOADER_ERRLEN = 1024,
    BW_DCONN_IDLE_MAX = 64,      /* idle data-channel connections kept per loader */
    BW_DCONN_SUSPENDED_MAX = 64, /* unreachable data channels remembered */
    BW_DCONN_SUSPEND_MS = 30000, /* ... for this long */
};

/* ---- options.c ---- */

/* The job's name, dataset and sampler settings as protobuf messages, owned by the loader. */
typedef struct bw__job_request {
    char *name;
    char *format;
    char **sources;
    size_t nsources;
    Batchwire__V1__Dataset dataset;
    Batchwire__V1__SamplerConfig sampler;
    Batchwire__V1__JobConfig config;
} bw__job_request;

/* Validates options, resolves rank and world size (options, then RANK/WORLD_SIZE, then
 * SLURM_PROCID/SLURM_NTASKS) and builds the job request. */
int bw__loader_parse_options(const bw_loader_options *o, bw__job_request *jr, int64_t *rank,
                             int64_t *world, char *err, size_t errlen);
void bw__job_request_free(bw__job_request *jr);

/* Whether sample bytes may use the workers' data channel: o->transport, else
 * BATCHWIRE_TRANSPORT, else "auto". BW_INVALID_ARGUMENT for another value. */
int bw__loader_transport(const bw_loader_options *o, bool *data_channel, char *err, size_t errlen);

/* ---- session.c: the coordinator side ---- */

typedef struct bw__worker_ref {
    char *id;
    char *address;
    char *data_address; /* the worker's data channel; "" when it offers none */
    bw_rpc_channel *ch; /* opened on first use */
    bool suspect;       /* failed recently: route around it until placement changes */
} bw__worker_ref;

/* One placement table, immutable once published; readers take a reference. */
typedef struct bw__placement {
    atomic_int refs;
    uint64_t version;
    size_t nworkers;
    bw__worker_ref *workers; /* sorted by id */
    uint32_t num_shards;
    uint32_t *owners; /* owners[shard] = index into workers */
} bw__placement;

void bw__placement_put(bw__placement *p);

typedef struct bw__session {
    bw_rpc_channel *coord;
    bw_rpc_channel_opts chopts; /* for worker channels (target replaced) */
    int timeout_ms;
    char *job;
    uint32_t rank, world;
    uint64_t lease_id;
    uint32_t heartbeat_ms;
    bw_arena job_arena; /* holds `summary` */
    Batchwire__V1__JobSummary *summary;
    ProtobufCBinaryData resume_cursor; /* where JoinJob says this rank resumes */

    pthread_mutex_t mu; /* guards placement, channel cache */
    pthread_cond_t cv;
    bw__placement *placement;
    atomic_uint_fast64_t seen_version; /* newest placement version announced */
    /* worker channels by address, kept across placement versions */
    size_t nchannels, capchannels;
    char **channel_addrs;
    bw_rpc_channel **channels;
    struct ssl_ctx_st *dchan_tls; /* data channels speak TLS (the loader does) */
    /* idle data-channel connections, most recently used last */
    size_t nidle;
    struct bw__dconn *idle[BW_DCONN_IDLE_MAX];
    /* data channels that could not be connected to: their workers are asked over gRPC until
     * `until` (monotonic ms) */
    size_t nsuspended;
    struct {
        char *address;
        uint64_t until;
    } suspended[BW_DCONN_SUSPENDED_MAX];

    pthread_t hb_thread;
    bool hb_started, stopping;
    char hb_err[BW_LOADER_ERRLEN];
} bw__session;

/* Connects, creates or joins the job, takes the rank's lease and fetches placement. */
int bw__session_open(bw__session *s, const bw_loader_options *o, const bw__job_request *jr,
                     uint32_t rank, uint32_t world, char *err, size_t errlen);
void bw__session_close(bw__session *s);

/* The current placement (a reference: release with bw__placement_put). Refreshes it first
 * when `refresh` is set or a newer version was announced; keeps the old table if the
 * coordinator cannot be reached. NULL when no table has ever been fetched. */
bw__placement *bw__session_placement(bw__session *s, bool refresh, char *err, size_t errlen);

/* The channel to a worker address (cached). */
bw_rpc_channel *bw__session_worker_channel(bw__session *s, const char *address, char *err,
                                           size_t errlen);

/* ---- data_channel.c: connections to the workers' data channels ---- */

typedef struct bw__dconn {
    bw_dsock s;
    char *address;
    bool reused;  /* taken from the idle list (the worker may have closed it meanwhile) */
    uint8_t *buf; /* received, not yet consumed: frame headers and small samples */
    size_t pos, len;
    /* Read ahead into buf only while samples are small: a large sample's bytes must go
     * straight to the batch, not through buf. */
    bool read_ahead;
} bw__dconn;

enum { BW_DCONN_BUF = 64 << 10 };

/* Up to n bytes of the current response for dst, without waiting (*got 0: none yet): what is
 * buffered, else from the socket -- with `direct` (the rest of a large sample) straight into
 * dst, the bytes after it into the buffer. BW_OK, or BW_UNAVAILABLE when the connection
 * closed or failed (a sentence in err). */
int bw__dconn_take(bw__dconn *c, uint8_t *dst, size_t n, bool direct, size_t *got, char *err,
                   size_t errlen);

/* An idle connection to `address`, or a new one. */
int bw__dconn_get(bw__session *s, const char *address, int timeout_ms, bw__dconn **out, char *err,
                  size_t errlen);
/* Back to the idle list when `reusable` (the last request ended with END or ERROR), else
 * closed. NULL is a no-op. */
void bw__dconn_put(bw__session *s, bw__dconn *c, bool reusable);
/* Closes the idle connections to `address` (one was found closed by the worker: a restarted
 * worker closed them all). */
void bw__dconn_drop_idle(bw__session *s, const char *address);
void bw__dconn_close_idle(bw__session *s);
/* A data channel that could not be connected to (a firewall, a port not published) while
 * its worker may still answer over gRPC: fetches from that worker use gRPC for
 * BW_DCONN_SUSPEND_MS. Logs the first time. */
void bw__dconn_suspend(bw__session *s, const char *address, const char *worker, const char *why);
bool bw__dconn_suspended(bw__session *s, const char *address);

/* Records a cursor durably with the coordinator. */
int bw__session_commit(bw__session *s, const uint8_t *cursor, size_t len, char *err, size_t errlen);

/* ---- batch.c ---- */

struct bw_batch {
    uint64_t epoch, step;
    size_t count, real;
    uint64_t *indices;
    uint8_t *padding;
    size_t *offsets, *sizes; /* per sample, into data */
    uint8_t *data;           /* host copy (pinned when delivering to a GPU) */
    size_t nbytes, cap;
    bool pinned;
    struct bw__gpu_stream *gpu; /* device delivery: the slot's stream, or NULL */
    int device;
    void *dev;
    size_t dev_cap;
    const char *dtype; /* npy: borrowed from the job summary */
    size_t ndim;
    uint64_t shape[BW_LOADER_MAX_NDIM];
    int rc; /* fetch result */
    char err[BW_LOADER_ERRLEN];
};

/* Sizes the per-sample arrays for up to max_count samples; with data_bytes > 0 and
 * `pinned`, allocates that much page-locked data memory up front. */
int bw__batch_init(bw_batch *b, size_t max_count, size_t data_bytes, bool pinned);
void bw__batch_free(bw_batch *b);
/* Makes room for nbytes of data (keeps the buffer when it is large enough). */
int bw__batch_reserve(bw_batch *b, size_t nbytes);
/* Copies the batch's data to its device (when it has one). */
int bw__batch_to_device(bw_batch *b);

/* ---- sample_decode.c ---- */

/* Called for each sample (or chunk of one) in a SampleBatch before its data is copied: checks
 * the header and sets *dest to where the len data bytes go (NULL: nowhere, len is 0). */
typedef int (*bw__sample_place_fn)(void *ctx, uint64_t index, uint64_t size, uint64_t chunk_offset,
                                   uint64_t len, uint8_t **dest, char *err, size_t errlen);

/* Decodes a SampleBatch straight from the received slices, copying each sample's bytes once
 * into the place `place` gives. BW_OK, BW_PROTOCOL for a malformed message, or place's error. */
struct grpc_byte_buffer;
int bw__decode_sample_batch(struct grpc_byte_buffer *bb, bw__sample_place_fn place, void *ctx,
                            char *err, size_t errlen);

/* ---- fetch.c ---- */

typedef struct bw__fetch_ctx {
    bw__session *session;
    const Batchwire__V1__Dataset *dataset;
    const char *fingerprint; /* the dataset's, checked by workers */
    uint64_t sample_bytes;   /* fixed sample size, 0 if samples differ */
    uint32_t max_message_bytes;
    int timeout_ms;
    bool data_channel; /* fetch over the workers' data channels where they offer one */
} bw__fetch_ctx;

/* Routing shared by map-style and stream fetches. A worker that failed during one fetch is
 * a suspect for the rest of it. */
enum { BW_MAX_SUSPECTS = 64 };
typedef struct bw__suspects {
    char *ids[BW_MAX_SUSPECTS];
    size_t n;
} bw__suspects;
bool bw__suspects_has(const bw__suspects *s, const char *id);
/* What a failure of worker `id` with a retryable `rc` means for the rest of the fetch: a
 * placement refusal (BW_WRONG_OWNER) asks for a fresh table; any other failure also makes the
 * worker a suspect. *refresh is set either way. Returns true when `id` became a suspect. */
bool bw__suspects_note(bw__suspects *s, const char *id, int rc, bool *refresh);
void bw__suspects_clear(bw__suspects *s);
/* The worker serving `shard`: its owner (*checked: route with the placement's version), or
 * -- when the owner is a suspect -- the owner among the others, which is where rendezvous
 * hashing moves the shard once the coordinator drops the failed worker (*checked false: no
 * ownership check). -1 when every worker is a suspect. */
long bw__fetch_pick_worker(const bw__placement *p, uint32_t shard, const bw__suspects *s,
                           bool *checked);
/* Errors after which another worker or a fresher placement may succeed. */
bool bw__fetch_retryable(int rc);

/* Fills b->data with the bytes of b->indices[0..count) in order, from the workers that own
 * them, failing over to other workers as placement changes. On error b->err says why. */
int bw__fetch_batch(const bw__fetch_ctx *ctx, bw_batch *b);

#endif
