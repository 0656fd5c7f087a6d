/*
 * The worker's metrics (docs/operating.md, "Metrics"): what its read requests served, how long
 * they took, what is in flight, its errors and its datasets. Each event is counted once, by
 * the module that owns it: samples and bytes by the read path (read_path.c) as it yields
 * records; a request's arrival, end, status and latency by its transport (data_service.c for
 * gRPC, data_channel.c); opening and indexing a dataset by the cache (datasets.c); the bytes
 * in flight and the open datasets are read from the executor and the cache at each scrape.
 *
 * With metrics off the worker's pointer is NULL and every function here does nothing.
 * Thread-safe.
 */
#ifndef BW_WORKER_METRICS_H
#define BW_WORKER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "data.pb-c.h"
#include "metrics/metrics.h"

typedef enum { BW_WM_GRPC, BW_WM_DATA_CHANNEL, BW_WM_TRANSPORTS } bw__wm_transport;

typedef struct bw__wm bw__wm;

/* The worker's state as a scrape shows it. */
typedef struct bw__wm_state {
    uint64_t in_flight_bytes; /* held against the budget (bw__exec_held) */
    uint64_t budget_bytes;    /* --inflight-bytes */
    size_t datasets, files;   /* open in the cache (bw__ds_cache_counts) */
    size_t connections;       /* data channel (bw__dchan_server_connections) */
} bw__wm_state;

/* Fills *out at a scrape (on the HTTP server's thread), from the parts the daemon owns. */
typedef void (*bw__wm_state_fn)(void *user, bw__wm_state *out);

/* Registers the worker's families in reg (which must outlive the result) and a collector
 * that calls state(user) at each scrape. NULL when reg is NULL (metrics off) or out of
 * memory (*rc says which: BW_OK or BW_NOMEM). Free with bw__wm_free. */
bw__wm *bw__wm_new(bw_metrics *reg, bw__wm_state_fn state, void *user, int *rc);
void bw__wm_free(bw__wm *m);

/* A ReadSamples or ReadStream request (kind: BW_REQ_SAMPLES or BW_REQ_STREAM) arrived: it is
 * in flight until bw__wm_end. Returns its start (bw__mono_ns). */
uint64_t bw__wm_begin(bw__wm *m, bw__wm_transport t);

/* The request that began at t0 ended with status rc (BW_OK or the error its client got):
 * its latency, and an error by code. */
void bw__wm_end(bw__wm *m, bw__wm_transport t, uint32_t kind, uint64_t t0, int rc);

/* Where a read counts what it serves: samples and their bytes for one dataset and transport. */
typedef struct bw__wm_served {
    bw_series *samples, *bytes;
} bw__wm_served;

/* The counters of `spec`'s dataset over transport t (all NULL with metrics off). */
bw__wm_served bw__wm_served_for(bw__wm *m, bw__wm_transport t, const Batchwire__V1__Dataset *spec);

/* A dataset of `format` was opened (or reopened), or indexed, in the seconds since t0
 * (bw__mono_ns). */
void bw__wm_opened(bw__wm *m, const char *format, uint64_t t0);
void bw__wm_indexed(bw__wm *m, const char *format, uint64_t t0);

/* A sample's transform ran from t0 (bw__mono_ns) and ended with rc: its time, and a failure
 * by code (docs/transforms.md, "On the workers"). */
void bw__wm_transformed(bw__wm *m, uint64_t t0, int rc);

#endif
