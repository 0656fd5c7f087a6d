/* Internals of libbatchwire's loader: options, the session with the coordinator, batches and
 * the gRPC reply decoder. Routing, transports and the fetch loop have headers of their own
 * (route.h, transport.h, fetch.h). Nothing here is part of the public API. */
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
#include "route.h"
#include "sample_decode.h"
#include "sampler/sampler.h"

enum {
    BW_LOADER_NUM_SHARDS = 256, /* storage shards samples are routed by (modulo) */
    BW_LOADER_MAX_NDIM = 16,
    BW_LOADER_ERRLEN = 1024,
};

/* ---- options.c ---- */

/* The job's name, dataset and sampler settings as protobuf messages, owned by the loader. */
typedef struct bw__job_request {
    char *name;
    char *format;
    char **sources;
    size_t nsources;
    Batchwire__V1__Dataset dataset;
    /* named arrays (bw_loader_options.dataset_fields): format "fields", one message each */
    size_t nfields;
    Batchwire__V1__DatasetField *fields;
    Batchwire__V1__DatasetField **field_ptrs;
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

/* What the loader has handed out, written by loader.c and read by the heartbeat thread (which
 * reports it as RankLive) and by bw_loader_get_stats. */
typedef struct bw__live {
    atomic_uint_fast64_t epoch, step, epoch_steps; /* the next batch to hand out */
    atomic_uint_fast64_t batches, samples, bytes, wait_ns;
} bw__live;

typedef struct bw__session {
    bw_rpc_channel *coord;
    bw_rpc_channel_opts chopts; /* TLS settings and token, also for workers (target unset) */
    int timeout_ms;
    int retry_ms; /* joins and commits retry this long while the coordinator is away */
    /* The coordinator has answered this session once: from then on a host name that does
     * not resolve is an outage (retried), not a mistyped address (refused at once). */
    atomic_bool reached;
    char *job;
    uint32_t rank, world;
    uint64_t lease_id, lease_id_hi; /* 128 bits: docs/security.md, "Leases" */
    char *token;                    /* bearer token (--token-file), or NULL */
    bool finished;                  /* the last epoch was delivered: leave saying so */
    uint32_t heartbeat_ms;
    bw_arena job_arena; /* holds `summary` */
    Batchwire__V1__JobSummary *summary;
    ProtobufCBinaryData resume_cursor; /* where JoinJob says this rank resumes */

    pthread_mutex_t mu; /* guards placement and the heartbeat's state; held across no I/O */
    pthread_cond_t cv;
    bw__placement *placement;
    atomic_uint_fast64_t seen_version; /* newest placement version announced */

    bw__live live;       /* reported with each heartbeat */
    uint32_t holder_pid; /* the trainer process named as the lease's holder */
    /* Fencing (docs/client.md, "Fencing"). `claimed`: this session joined the rank (it reports
     * live counters and leaves on close); a share given the rank's lease (bw_loader_options.
     * lease) only confirms it. `confirms`: there is a lease to confirm (either case); the
     * heartbeat thread runs. */
    bool claimed, confirms;
    pthread_t hb_thread;
    bool hb_started, stopping; /* under mu */
    /* Heartbeats begun and ended, and the newest one's outcome (under mu; cv announces each). */
    uint64_t hb_begun, hb_ended;
    int hb_rc;
    char hb_err[BW_LOADER_ERRLEN];
    /* The coordinator said the lease is no longer ours (another process took the rank over):
     * set once, by whichever thread heard it; lost_err (under mu) says who holds it now. */
    atomic_bool lease_lost;
    char lost_err[BW_LOADER_ERRLEN];
    /* The lease's length (from the coordinator's last answer), and when the newest request the
     * coordinator answered with a renewal was *sent* (monotonic ms): the lease is proven until
     * vouched_ms + lease_ms, less a margin; past that, nothing is handed out until the
     * coordinator confirms it (bw__session_lease_wait). */
    atomic_uint_least32_t lease_ms;
    atomic_uint_fast64_t vouched_ms;
    atomic_bool cancelled; /* the loader is closing: waits for the lease end (BW_CANCELLED) */
} bw__session;

/* How a loader joins its job. */
typedef struct bw__join {
    bool claim;    /* take the rank's lease (false: a share of the rank other than share 0) */
    bool elastic;  /* first resize the job to this world size (bw_loader_open_elastic) */
    bool describe; /* with claim false: only create or describe the job (summary), nothing else
                    * (no placement, no lease: bw_loader_rank_steps) */
    const void *const *cursors; /* ... from these cursors of the old world (lens[i] 0: */
    const size_t *lens;         /* text); ncursors 0: every rank's committed cursor */
    size_t ncursors;
} bw__join;

/* Connects, creates or joins the job (how NULL: claims the rank), takes the rank's lease and
 * fetches placement. jr NULL: connects to the coordinator only. */
int bw__session_open(bw__session *s, const bw_loader_options *o, const bw__job_request *jr,
                     uint32_t rank, uint32_t world, const bw__join *how, char *err, size_t errlen);

/* Every rank's committed cursor of `job` (GetJob), in rank order, into arena a.
 * BW_FAILED_PRECONDITION naming a rank that has none. */
int bw__session_committed(bw__session *s, const char *job, bw_arena *a, ProtobufCBinaryData **out,
                          size_t *n, char *err, size_t errlen);
void bw__session_close(bw__session *s);

/* The current placement (a reference: release with bw__placement_put). Refreshes it first
 * when `refresh` is set or a newer version was announced; keeps the old table if the
 * coordinator cannot be reached. NULL when no table has ever been fetched. */
bw__placement *bw__session_placement(bw__session *s, bool refresh, char *err, size_t errlen);

/* BW_LEASE_LOST with the coordinator's sentence in err once the lease was taken over, else
 * BW_OK: a loader that lost its rank hands out no more batches and commits nothing. Does not
 * wait. */
int bw__session_lease_check(bw__session *s, char *err, size_t errlen);

/* Whether the coordinator has vouched for the lease within the last lease period (less a
 * margin), measured from when the vouching request was sent; always true without a lease to
 * confirm. False once the lease is lost. */
bool bw__session_lease_fresh(bw__session *s);

/* The monotonic time (ms) until which the lease is proven, margin included (what
 * bw__session_lease_fresh compares with): UINT64_MAX without a lease to confirm or when the
 * coordinator states no lease length, 0 once the lease is lost. Atomics only; any thread. */
uint64_t bw__session_proven_until(bw__session *s);

/* Returns BW_OK at once while the lease is fresh; else waits (polling every 100 ms at most)
 * until the coordinator confirms it (BW_OK), refuses it (BW_LEASE_LOST, for good), the loader
 * closes (BW_CANCELLED), or confirming has failed for the session's retry_ms with at least
 * one attempt since the call (the last error: BW_UNAVAILABLE while the coordinator is
 * unreachable); err says why. Any thread. */
int bw__session_lease_wait(bw__session *s, char *err, size_t errlen);

/* Ends every bw__session_lease_wait with BW_CANCELLED (the loader is closing). */
void bw__session_cancel(bw__session *s);

/* The lease as text ("bwl1:" and 32 hex digits) for the session that claimed the rank:
 * BW_FAILED_PRECONDITION without one, BW_LEASE_LOST once lost, BW_TOO_BIG. */
int bw__session_lease_text(bw__session *s, char *buf, size_t buflen, char *err, size_t errlen);

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
    /* Named arrays (bw_batch_array): one tensor per field in data, one after the other; the
     * samples arrive whole (row i of every field) in `scratch` and are split by field there
     * (bw__batch_unpack_arrays). */
    size_t narrays;
    struct bw__array *arrays;
    uint8_t *scratch;
    size_t scratch_cap;
    /* bw_batch_fields (fields.c), with bw_loader_options.fields: sample i's fields are
     * fields[field_first[i] .. field_first[i + 1]); names point into field_names. */
    bool has_fields;
    bw_field *fields;
    size_t *field_first;
    size_t nfields, capfields;
    char *field_names;
    size_t names_len, names_cap;
};

/* Sizes the per-sample arrays for up to max_count samples; with data_bytes > 0 and
 * `pinned`, allocates that much page-locked data memory up front. */
int bw__batch_init(bw_batch *b, size_t max_count, size_t data_bytes, bool pinned);
void bw__batch_free(bw_batch *b);
/* Makes room for nbytes of data (keeps the buffer when it is large enough). */
int bw__batch_reserve(bw_batch *b, size_t nbytes);
/* Copies the batch's data to its device (when it has one). */
int bw__batch_to_device(bw_batch *b);

/* ---- arrays.c: batches of named arrays (bw_batch_array) ---- */

/* One field of a batch of named arrays: name and dtype borrowed from the job's description. */
typedef struct bw__array {
    const char *name, *dtype;
    size_t ndim; /* with the batch's count first */
    uint64_t shape[BW_LOADER_MAX_NDIM];
    uint64_t row_bytes; /* one sample's bytes of this field */
    size_t offset;      /* in data */
} bw__array;

/* Checks that the job's fields can be batches here (every layout fixed, few enough dims). */
int bw__arrays_check(const Batchwire__V1__DatasetInfo *info, char *err, size_t errlen);
/* Lays out b's arrays for its count samples (after planning): shapes and offsets. BW_NOMEM. */
int bw__batch_plan_arrays(bw_batch *b, const Batchwire__V1__DatasetInfo *info);
/* After a fetch into b->scratch (sample `from[i]` whole at scratch + from[i] * sample_bytes
 * for position i): each field's rows to its tensor in b->data. BW_NOMEM. */
int bw__batch_unpack_arrays(bw_batch *b, const size_t *from, uint64_t sample_bytes);

/* ---- fields.c: the fields of tar and JSON Lines samples (bw_batch_fields) ---- */

enum bw__fields_kind { BW_FIELDS_NONE, BW_FIELDS_TABLE, BW_FIELDS_JSON };

/* The fields kind of a dataset format when `wanted`: tar samples come with field tables,
 * JSON Lines samples are scanned; BW_INVALID_ARGUMENT for a format without fields. */
int bw__fields_kind_of(const char *format, bool wanted, enum bw__fields_kind *kind, char *err,
                       size_t errlen);
/* After a fetch: records every sample's fields -- for tables, strips each sample's table
 * from the batch's bytes. BW_CORRUPT (with b->err) for a malformed table or a JSON Lines
 * sample that is not an object. */
int bw__batch_split_fields(bw_batch *b, enum bw__fields_kind kind);
/* Frees the field arrays. */
void bw__batch_fields_free(bw_batch *b);

/* ---- hold.c: batch bytes kept past the loader's next batch (bw_loader_hold) ---- */

typedef struct bw__holds bw__holds;

/* The holds of one loader (a reference for the loader); BW_NOMEM. */
int bw__holds_new(bw__holds **out);
/* The loader is closing: drops its reference; buffers released later are freed. */
void bw__holds_close(bw__holds *p);
/* A reference to the hold of the batch in a slot (*slot_hold, created when NULL). */
int bw__hold_take(bw__holds *p, bw_hold **slot_hold, const bw_batch *b, bw_hold **out);
/* The loader reuses the slot of b: a hold still referenced takes b's buffer, and b continues
 * with a spare buffer or none. Clears *slot_hold; NULL is a no-op. */
void bw__hold_leave_slot(bw_hold **slot_hold, bw_batch *b);

#endif
