/* The worker's data plane: the dataset cache, its view of placement and the Data service. */
#ifndef BW_WORKER_DATA_H
#define BW_WORKER_DATA_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "formats/dataset.h"
#include "rpc/server.h"

typedef struct bw_worker bw_worker;

/* Caps on what one request may ask for. */
enum {
    BW_DATA_MAX_INDICES = 1 << 20,  /* indices per ReadSamples */
    BW_DATA_MAX_SHARDS = 1 << 20,   /* Routing.num_shards */
    BW_DATA_MIN_MESSAGE = 64 << 10, /* smallest message limit a client may ask for */
    BW_DATA_MAX_DATASETS = 256,     /* ReadSamplesRequest.datasets (a mixture's sources) */
};

/* ---- datasets.c: open datasets, shared by concurrent requests ---- */

typedef struct bw__wds bw__wds;
typedef struct bw__ds_cache bw__ds_cache;

/* NULL when out of memory. No limits until bw__ds_cache_set_limits. */
bw__ds_cache *bw__ds_cache_new(const char *root);
void bw__ds_cache_free(bw__ds_cache *c);

/* The worker's budgets for its open datasets (docs/operating.md, "Worker budgets"); 0: none. */
typedef struct bw__ds_limits {
    uint64_t max_open_files;  /* --max-open-files: descriptors the cached datasets hold */
    uint64_t memory_bytes;    /* --dataset-memory-bytes: their sources and record indexes */
    size_t max_sources;       /* --max-sources: a dataset's files after glob expansion */
    uint64_t open_timeout_ms; /* --open-timeout-ms: longest directory walk for one request */
} bw__ds_limits;
/* Call before any request. */
void bw__ds_cache_set_limits(bw__ds_cache *c, const bw__ds_limits *lim);

/* The open dataset for `spec` (opened on first use; reopened when a source changed), keyed by
 * its canonical file set: every spelling of the same files is one entry. The caller holds a
 * reference until bw__ds_put. Opens without holding the cache's lock: a second request for a
 * dataset being opened waits for that open and shares its result. Over a budget: BW_TOO_BIG
 * (the dataset alone is over it) or BW_BUSY (datasets in use hold it), with a sentence naming
 * the budget and its flag; a non-regular file, a path leading outside the root: refused,
 * naming nothing outside the root. Directory walks stop at deadline_ms (bw__mono_ms clock; 0:
 * none) or --open-timeout-ms from now, whichever is sooner (BW_TIMEOUT). */
int bw__ds_get_until(bw__ds_cache *c, const Batchwire__V1__Dataset *spec, uint64_t deadline_ms,
                     bw__wds **out, char *err, size_t errlen);
/* bw__ds_get_until without a deadline of the request's own. */
int bw__ds_get(bw__ds_cache *c, const Batchwire__V1__Dataset *spec, bw__wds **out, char *err,
               size_t errlen);
bw__dataset *bw__ds_dataset(bw__wds *e);
/* The first source a dataset request names (named arrays: the first field's), "" when none:
 * how messages and metrics name a dataset ("FORMAT:FIRST_SOURCE"). */
static inline const char *bw__ds_spec_first(const Batchwire__V1__Dataset *spec)
{
    if (spec && spec->n_sources)
        return spec->sources[0];
    if (spec && spec->n_fields && spec->fields[0]->n_sources)
        return spec->fields[0]->sources[0];
    return "";
}
/* Why e was opened again ("source x.npy changed size from ..."), or "" when it was not. */
const char *bw__ds_changed(const bw__wds *e);
void bw__ds_put(bw__wds *e);
/* A read found a file of e's dataset changed (bw__dataset_check): the next bw__ds_get for it
 * compares it with its files at once instead of within the second. Thread-safe. */
void bw__ds_stale(bw__wds *e);

/* Indexes e's dataset (bw__dataset_index); the first call for an entry is timed into the
 * cache's metrics. BW_OK or the error with a sentence. */
int bw__ds_index(bw__wds *e, char *err, size_t errlen);

/* Times opening and indexing into m (metrics.h; NULL: not timed). Call before any request. */
struct bw__wm;
void bw__ds_cache_set_metrics(bw__ds_cache *c, struct bw__wm *m);

/* The datasets the cache holds open now, and their files. Thread-safe. */
void bw__ds_cache_counts(bw__ds_cache *c, size_t *datasets, size_t *files);

/* Whether bw__ds_get for `spec` would find it open and recently checked, so that getting it
 * does no file I/O (a hint: it may change right after). */
bool bw__ds_ready(bw__ds_cache *c, const Batchwire__V1__Dataset *spec);

/* ---- placement_view.c: the placement table this worker last fetched ---- */

typedef struct bw__pview {
    pthread_mutex_t mu;
    uint64_t version;
    size_t n;
    char **ids; /* live worker ids at `version` */
    bool stale; /* a request carried a newer version: fetch soon */
    /* Whose each shard is under this table, as bw__pview_check found it (0 not yet, 1 self's,
     * 2 another's), for `owners_shards` shards and the worker `owners_self`; reset with the
     * table. A request's shards take a lookup each, not a rendezvous score per worker. */
    uint8_t *owners;
    uint32_t owners_shards;
    char *owners_self;
} bw__pview;

void bw__pview_init(bw__pview *v);
void bw__pview_destroy(bw__pview *v);

/* Replaces the table (copies ids). BW_NOMEM leaves the old table in place. */
int bw__pview_set(bw__pview *v, uint64_t version, const char *const *ids, size_t n);

/* Checks that worker `self` owns every shard in shards[0..n) (shards < rt->num_shards) under
 * the newest placement it knows. BW_OK when it does, when the request carries no version, or
 * when the request's version is newer than this worker's table (the client has seen a change
 * this worker has not yet: it serves and refreshes). Otherwise BW_WRONG_OWNER naming the
 * shard, its owner and both versions. */
int bw__pview_check(bw__pview *v, const char *self, const Batchwire__V1__Routing *rt,
                    const uint32_t *shards, size_t n, char *err, size_t errlen);

/* ---- data_service.c: Describe, ReadSamples, ReadStream over gRPC ----
 * Each runs on the executor (executor.h), never on a completion-queue thread. ReadSamples and
 * ReadStream are raw methods (bw__data_raw_methods): their requests are decoded there, bounded
 * by their charge (request.h), and read through the read path (read_path.h). */

int bw__data_describe(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                      ProtobufCMessage **resp);
int bw__data_read_samples(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                          ProtobufCMessage **resp);
int bw__data_read_stream(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                         ProtobufCMessage **resp);
extern const bw_rpc_method *const bw__data_raw_methods[];
extern const size_t bw__data_nraw_methods;

/* ---- data_channel.c: ReadSamples and ReadStream over TCP or TLS (core/rpc/dchan.h,
 * docs/data-channel.md) ---- */

typedef struct bw__dchan_server bw__dchan_server;

/* Listens on `listen` (HOST:PORT, port 0: any) and serves each connection on a thread of its
 * own, over TLS when `tls` is set (taken over: freed with the server, also on failure); *port
 * is the port bound. */
struct ssl_ctx_st;
int bw__dchan_server_start(bw_worker *w, const char *listen, struct ssl_ctx_st *tls,
                           bw__dchan_server **out, int *port, char *err, size_t errlen);
/* Stops accepting, ends every connection and joins the threads. NULL is a no-op. */
void bw__dchan_server_stop(bw__dchan_server *s);

/* Connections open now (0 for NULL). Thread-safe. */
size_t bw__dchan_server_connections(bw__dchan_server *s);

/* Counters of what the Data service read (Data.Stats). */
typedef struct bw__data_stats {
    atomic_uint_fast64_t records_read, record_bytes_read, records_located;
} bw__data_stats;

int bw__data_get_stats(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                       ProtobufCMessage **resp);

/* ---- sample_stream.c: SampleBatch messages built around mapped file memory ---- */

typedef struct bw__sstream bw__sstream;
typedef struct bw__rp bw__rp;

/* A producer of SampleBatch messages for an open read (read_path.h; taken over, also when this
 * fails): ReadSamples, ReadStream (samples carry offsets) or a ReadStream with locate_only (one
 * empty sample carrying first_record's offset). Each message stays below limit bytes; a sample
 * larger than that is sent in chunks. NULL when out of memory. */
bw__sstream *bw__sstream_new(bw__rp *rp, size_t limit);

/* The same over an open dataset without checks (tests): ReadSamples of indices (borrowed) or
 * ReadStream from source src at offset. Takes over e. Counts into stats (may be NULL). */
bw__sstream *bw__sstream_samples(bw__wds *e, const uint64_t *indices, size_t n, size_t limit,
                                 bw__data_stats *stats);
bw__sstream *bw__sstream_records(bw__wds *e, uint32_t src, uint64_t offset, uint64_t first_record,
                                 uint64_t max_records, size_t limit, bw__data_stats *stats);
int bw__sstream_next(void *state, bw_rpc_call *call, bw_rpc_out *out);
void bw__sstream_free(void *state);

/* For tests and benchmarks: the next message as a byte buffer, BW_RPC_END, or an error with
 * a sentence in err. */
int bw__sstream_produce(bw__sstream *st, struct grpc_byte_buffer **out, char *err, size_t errlen);

#endif
