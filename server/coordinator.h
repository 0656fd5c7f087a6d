/* The coordinator daemon: state shared by its RPC handlers. */
#ifndef BW_SERVER_COORDINATOR_H
#define BW_SERVER_COORDINATOR_H

#include <stdint.h>

#include "jobs.h"
#include "membership.h"
#include "rpc/daemon.h"
#include "rpc/server.h"
#include "state_dir.h"

typedef struct bw_coordinator_config {
    bw_daemon_common common;
    char *state_dir;
    int64_t heartbeat_ms;
    int64_t dead_after;
    /* jobs and their journal */
    char *truncate_journal_at;
    int64_t lease_ms;
    int64_t max_heartbeats;
    int64_t max_jobs;
    int64_t max_world_size;
    int64_t snapshot_bytes;
    char *worker_tls_ca;
    int64_t max_jobs_per_principal;
    int64_t job_ttl_s;
    /* the worker table (docs/security.md, "Worker ids") */
    int64_t max_workers;
    int64_t max_workers_per_principal;
    int64_t dead_worker_ttl_s;
    /* /metrics: per-rank series only for jobs of at most this many ranks; larger jobs are
     * summarised per job (server/metrics.c, docs/operating.md "Metrics") */
    int64_t metrics_rank_series;
    /* the commit channel (commit_channel.h); NULL: off */
    char *commit_listen;
} bw_coordinator_config;

typedef struct bw_owner_cache bw_owner_cache;

typedef struct bw_coordinator {
    const bw_coordinator_config *cfg;
    bw_membership *members;
    bw_owner_cache *owners; /* Placement.Get's owners per version (placement_service.h); NULL:
                               computed per call */
    bw_jobs *jobs;
    bw_auth *auth;     /* who may call (--auth-tokens) */
    char *token;       /* our bearer token (--token-file), or NULL; never sent to workers with
                        * grants on */
    bw_grants *grants; /* --grant-key: read grants and our proof to workers; NULL: auth off */
    char bound[256];
    int commit_port; /* the commit channel's (JoinJobResponse.commit_port); 0: off */
    uint64_t start_ms;
} bw_coordinator;

/* The coordinator's RPC handlers (coordinator_service.c). */
extern const bw_rpc_handler bw__coordinator_handlers[];
extern const size_t bw__coordinator_nhandlers;

#endif
