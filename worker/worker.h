/* The storage worker daemon. */
#ifndef BW_WORKER_WORKER_H
#define BW_WORKER_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "data.h"
#include "executor.h"
#include "metrics.h"
#include "transform_pool.h"
#include "rpc/client.h"
#include "rpc/daemon.h"
#include "rpc/server.h"

typedef struct bw_worker_config {
    bw_daemon_common common;
    char *coordinator;
    char *data_root;
    char *id;
    char *advertise;
    char *data_listen;
    char *data_advertise;
    char *tls_ca;
    char *tls_server_name;
    int64_t rpc_timeout_ms;
    int64_t data_max_connections;
    int64_t data_idle_timeout_ms;
    int64_t max_request_bytes;
    int64_t inflight_bytes;
    int64_t read_threads;
    int64_t transform_threads;    /* 0: the cores online */
    int64_t transform_max_pixels; /* per decoded image */
    /* budgets (docs/operating.md, "Worker budgets") */
    int64_t max_open_files; /* 0: the descriptor limit less sockets' headroom */
    int64_t dataset_memory_bytes;
    int64_t max_sources;
    int64_t open_timeout_ms;
    int64_t data_hello_timeout_ms;
    int64_t data_max_connections_per_peer;
    int64_t data_compress_max_level; /* 0: ZRUN frames never (docs/data-channel.md) */
    bool takeover;                   /* --takeover: replace a live worker holding the id */
} bw_worker_config;

/* How long a request waits for room in the in-flight budget before BW_BUSY. */
enum { BW_WORKER_ADMIT_WAIT_MS = 1000 };

struct bw_worker {
    const bw_worker_config *cfg;
    char id[256];
    char data_root[4096]; /* resolved */
    char bound[256];
    char advertise[256];
    char data_advertise[256]; /* empty: no data channel */
    uint64_t incarnation;
    uint64_t start_ms;
    bw_auth *auth;     /* who may call (--auth-tokens); checked for gRPC and the data channel */
    char *token;       /* our bearer token for the coordinator (--token-file), or NULL */
    bw_grants *grants; /* --grant-key: read grants and the coordinator's proof; NULL: auth off */

    /* membership: the heartbeat thread */
    bw_rpc_channel *coord;
    pthread_t hb_thread;
    bool hb_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    atomic_int fatal; /* set when the worker must exit (id refused or taken over) */

    /* data plane */
    bw__ds_cache *datasets;
    bw__pview placement;
    bw__data_stats stats; /* Data.Stats */
    bw__dchan_server *dchan;
    bw__exec *exec;     /* opens datasets and admits requests by bytes, for both transports */
    bw__tfpool *tfpool; /* runs jobs' transforms (transform_pool.h) */
    bw__wm *metrics;    /* metrics.h; NULL: --metrics-listen unset */
};

extern const bw_rpc_handler bw__worker_handlers[];
extern const size_t bw__worker_nhandlers;

/* With read grants on (w->grants), whether a caller of `role` may read what `req` asks (a
 * decoded ReadSamplesRequest or ReadStreamRequest): admins may; a caller without credentials
 * or a trainer only with a grant that verifies for this worker and the request's dataset
 * (grant_check.c). BW_OK, or BW_PERMISSION_DENIED with "METHOD: what failed" in err (logged,
 * at most once a second). Call before anything is opened. */
int bw__worker_grant_check(bw_worker *w, bw_role role, const ProtobufCMessage *req,
                           const char *peer, char *err, size_t errlen);

/* Opens the channel to the coordinator (checks the client TLS files). */
int bw__worker_connect(bw_worker *w, char *err, size_t errlen);

/* Starts the thread that registers with the coordinator and heartbeats. */
int bw__worker_membership_start(bw_worker *w, char *err, size_t errlen);

/* Stops and joins it and closes the channel; safe when only connected. */
void bw__worker_membership_stop(bw_worker *w);

#endif
