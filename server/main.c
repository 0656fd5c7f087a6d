/* batchwire-coordinator: parses its settings, takes the state directory, serves, and stops
 * cleanly on SIGTERM/SIGINT. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commit_channel.h"
#include "common/util.h"
#include "coordinator.h"
#include "jobs_service.h"
#include "metrics.h"
#include "placement_service.h"

/* The settings: the coordinator's own, and when to compact its journal (only this file uses
 * those). */
typedef struct settings {
    bw_coordinator_config c;
    int64_t snapshot_records;
    int64_t snapshot_interval_s;
} settings;

#define C(field) offsetof(settings, c.field)

static const bw_opt options[] = {
    BW_DAEMON_OPTS(settings, c.common, "127.0.0.1:7700"),
    {"state-dir", BW_OPT_PATH, C(state_dir), NULL, 0, 0, NULL, BW_OPT_REQUIRED, "DIR",
     "directory for durable state (journal, snapshots, lock)"},
    {"heartbeat-ms", BW_OPT_INT, C(heartbeat_ms), "1000", 10, 600000, NULL, 0, "MS",
     "how often workers heartbeat"},
    {"dead-after", BW_OPT_INT, C(dead_after), "3", 1, 1000, NULL, 0, "N",
     "a worker that misses this many heartbeats in a row is marked dead"},
    {"max-workers", BW_OPT_INT, C(max_workers), "4096", 1, 1000000, NULL, 0, "N",
     "most worker ids the coordinator's table holds, live or dead (docs/security.md)"},
    {"max-workers-per-principal", BW_OPT_INT, C(max_workers_per_principal), "256", 1, 1000000, NULL,
     0, "N",
     "most worker ids one worker principal may register, live or dead (admins and an open "
     "service: only --max-workers)"},
    {"dead-worker-ttl", BW_OPT_INT, C(dead_worker_ttl_s), "3600", 1, 1LL << 32, NULL, 0, "SECONDS",
     "a worker dead this long leaves the worker table (and stops counting against "
     "--max-workers)"},
    {"lease-ms", BW_OPT_INT, C(lease_ms), "10000", 100, 3600000, NULL, 0, "MS",
     "a trainer's claim on a rank expires this long after its last heartbeat; then another "
     "trainer may take the rank"},
    {"max-heartbeats-per-second", BW_OPT_INT, C(max_heartbeats), "1000", 0, 1000000, NULL, 0, "N",
     "most lease heartbeats a second the coordinator asks of all trainers together: with more "
     "leases than --lease-ms allows at a heartbeat every third of it, each lease is made longer "
     "(docs/operating.md, \"Leases at scale\"); 0: every lease is --lease-ms"},
    {"max-jobs", BW_OPT_INT, C(max_jobs), "1024", 1, 1000000, NULL, 0, "N",
     "most jobs the coordinator holds"},
    {"max-jobs-per-principal", BW_OPT_INT, C(max_jobs_per_principal), "64", 1, 1000000, NULL, 0,
     "N", "most jobs one trainer principal may own (admins and an open service: only --max-jobs)"},
    {"job-ttl", BW_OPT_INT, C(job_ttl_s), "604800", 1, 1LL << 32, NULL, 0, "SECONDS",
     "a job without a live lease and without any change for this long is removed (its "
     "cursors stay valid for a job created again with the same configuration)"},
    {"max-world-size", BW_OPT_INT, C(max_world_size), "65536", 1, 1048576, NULL, 0, "N",
     "largest world size (ranks per job)"},
    {"snapshot-bytes", BW_OPT_INT, C(snapshot_bytes), "67108864", 1, 1LL << 40, NULL, 0, "BYTES",
     "compact (write a snapshot, drop the journal files it replaces) once the journal holds "
     "this many bytes of records, whether journaled now or found at start"},
    {"snapshot-records", BW_OPT_INT, offsetof(settings, snapshot_records), "500000", 0, 1LL << 40,
     NULL, 0, "N", "compact also once the journal holds this many records (0: no such limit)"},
    {"snapshot-interval-s", BW_OPT_INT, offsetof(settings, snapshot_interval_s), "600", 0, 604800,
     NULL, 0, "SECONDS",
     "compact also once the oldest record since the last snapshot is this old; an idle "
     "coordinator does not compact (0: no such limit)"},
    {"truncate-journal-at", BW_OPT_STRING, C(truncate_journal_at), NULL, 0, 0, NULL, BW_OPT_NO_ENV,
     "FILE:OFFSET",
     "after a corruption report: cut that journal file there, losing every change from that "
     "record on (the cut bytes are kept beside it)"},
    {"metrics-rank-series", BW_OPT_INT, C(metrics_rank_series), "64", 0, 1048576, NULL, 0, "N",
     "/metrics shows per-rank series for jobs of at most N ranks; a larger job's ranks are "
     "summarised per job (slowest, fastest, lag; docs/operating.md, \"Metrics\")"},
    {"commit-listen", BW_OPT_ADDR, C(commit_listen), NULL, 0, 0, NULL, 0, "HOST:PORT",
     "also take trainers' cursor commits and lease heartbeats on this address over the commit "
     "channel (framed TCP, TLS with --tls-cert, the same tokens; docs/operating.md, \"Commit "
     "channel\"); port 0 picks a free port (logged). Unset: off"},
    {"worker-tls-ca", BW_OPT_PATH, C(worker_tls_ca), NULL, 0, 0, NULL, 0, "FILE",
     "verify workers' certificates with this CA when calling them (dataset descriptions); "
     "--tls-cert/--tls-key are then the client certificate"},
    BW_OPT_END,
};

/* Writes a snapshot and drops the journal files it replaces; `done` says what happened, for
 * the log. */
static int compact(bw_jobs *jobs, const char *why, char *done, size_t donelen, char *err,
                   size_t errlen)
{
    uint64_t t0 = bw__mono_ms();
    int rc = bw__jobs_compact(jobs, 1, err, errlen);
    if (rc == BW_OK)
        snprintf(done, donelen, "%s; snapshot written and older journal files removed in %llu ms",
                 why, (unsigned long long)(bw__mono_ms() - t0));
    return rc;
}

int main(int argc, char **argv)
{
    bw__daemon_block_signals();
    settings all;
    memset(&all, 0, sizeof(all));
    bw_coordinator_config *cfg = &all.c;
    int status = bw__config_main("batchwire-coordinator", "--state-dir DIR [options]",
                                 "Owns batchwire jobs, worker membership and placement.", options,
                                 &all, argc, argv);
    if (status >= 0) {
        bw__config_free(options, &all);
        return status;
    }
    bw__daemon_logging(&cfg->common, "coordinator");

    char err[2048];
    int lock_fd = -1;
    bw_rpc_server *srv = NULL;
    bw_metrics *metrics = NULL;
    bw_metrics_http *metrics_http = NULL;
    bw__cm *cm = NULL;
    bw_cchan *cchan = NULL;
    char metrics_bound[300] = "", cchan_bound[300] = "";
    bw_coordinator coord;
    memset(&coord, 0, sizeof(coord));
    coord.cfg = cfg;
    coord.start_ms = bw__mono_ms();

    bw_journal_report report;
    memset(&report, 0, sizeof(report));
    int rc = bw__daemon_auth(&cfg->common, &coord.auth, &coord.token, err, sizeof(err));
    if (rc == BW_OK) { /* after the principals: the table checks their ids= bindings */
        const bw_membership_opts mo = {(uint32_t)cfg->heartbeat_ms,
                                       (uint32_t)cfg->dead_after,
                                       (uint64_t)cfg->dead_worker_ttl_s * 1000,
                                       (uint32_t)cfg->max_workers,
                                       (uint32_t)cfg->max_workers_per_principal,
                                       coord.auth};
        if (!(coord.members = bw__membership_new(&mo)) || !(coord.owners = bw__owner_cache_new())) {
            rc = BW_NOMEM;
            snprintf(err, sizeof(err), "out of memory for the worker table");
        }
    }
    if (rc == BW_OK)
        rc = bw__daemon_grants(&cfg->common, coord.auth, &coord.grants, err, sizeof(err));
    if (rc == BW_OK)
        rc = bw__state_dir_lock(cfg->state_dir, &lock_fd, err, sizeof(err));
    if (rc == BW_OK) {
        bw_jobs_opts jo = {cfg->state_dir,
                           cfg->truncate_journal_at,
                           (uint32_t)cfg->lease_ms,
                           (uint32_t)cfg->max_jobs,
                           (uint32_t)cfg->max_jobs_per_principal,
                           (uint32_t)cfg->max_world_size,
                           (uint32_t)cfg->max_heartbeats};
        rc = bw__jobs_open(&jo, &coord.jobs, &report, err, sizeof(err));
    }
    /* Compaction at start, before listening: a coordinator restarted more often than its
     * schedule fires would otherwise never compact (docs/operating.md, "Coordinator state"). */
    const bw_journal_policy policy = {(uint64_t)cfg->snapshot_bytes, (uint64_t)all.snapshot_records,
                                      (uint64_t)all.snapshot_interval_s * 1000};
    char start_compaction[512] = "", why[256];
    int start_rc = BW_OK;
    if (rc == BW_OK &&
        bw__journal_compaction_due(bw__jobs_journal(coord.jobs), &policy, why, sizeof(why))) {
        /* A failure leaves the journal as it was; the schedule tries again, and a failed
         * journal stops the coordinator in the loop below. */
        start_rc =
            compact(coord.jobs, why, start_compaction, sizeof(start_compaction), err, sizeof(err));
        if (start_rc != BW_OK)
            snprintf(start_compaction, sizeof(start_compaction), "%.500s", err);
    }
    if (rc == BW_OK)
        rc = bw__metrics_daemon_new(cfg->common.metrics_listen, &metrics, err, sizeof(err));
    if (rc == BW_OK && !(cm = bw__cm_new(metrics, &coord, &rc)) && rc != BW_OK)
        snprintf(err, sizeof(err), "out of memory for the metrics");
    bw_metrics_http_opts mo = {cfg->common.metrics_listen, cfg->common.metrics_auth,
                               cfg->common.tls_cert, cfg->common.tls_key,
                               cfg->common.tls_client_ca};
    if (rc == BW_OK && metrics)
        rc = bw__metrics_http_start(metrics, &mo, &metrics_http, metrics_bound,
                                    sizeof(metrics_bound), err, sizeof(err));
    if (rc == BW_OK) {
        bw__jobs_set_placement(coord.jobs, bw__jobs_placement_table, &coord);
        bw__jobs_set_grants(coord.jobs, coord.grants);
        /* Before the gRPC server: JoinJob answers carry its port. */
        if (cfg->commit_listen)
            rc = bw__cchan_start(&coord, cfg->commit_listen, &cchan, cchan_bound,
                                 sizeof(cchan_bound), err, sizeof(err));
        coord.commit_port = bw__cchan_port(cchan);
        bw_rpc_server_opts so;
        bw__daemon_server_opts(&cfg->common, "coordinator", &so);
        so.auth = coord.auth;
        if (rc == BW_OK)
            rc = bw__rpc_server_start(&so, bw__coordinator_handlers, bw__coordinator_nhandlers,
                                      &coord, &srv, coord.bound, sizeof(coord.bound), err,
                                      sizeof(err));
    }
    if (rc != BW_OK) {
        BW_ERROR("cannot start err=%s", err);
        status = 1;
    } else {
        BW_INFO("listening on %s (%s%s) state-dir=%s heartbeat=%lldms dead-after=%lld", coord.bound,
                cfg->common.tls_cert ? "TLS" : "plaintext",
                cfg->common.tls_client_ca ? ", client certificates required" : "", cfg->state_dir,
                (long long)cfg->heartbeat_ms, (long long)cfg->dead_after);
        /* After the first line, which tools wait for: what recovery found. */
        bw__daemon_auth_announce(&cfg->common, "coordinator", coord.auth,
                                 cfg->worker_tls_ca != NULL);
        BW_INFO("state: snapshot up to record %llu, %llu journal records replayed from %zu "
                "file(s); last record %llu",
                (unsigned long long)report.snapshot_seq,
                (unsigned long long)report.records_replayed, report.files,
                (unsigned long long)report.last_seq);
        if (cchan)
            BW_INFO("commit channel on %s (%s)", cchan_bound,
                    cfg->common.tls_cert ? "TLS" : "plaintext");
        if (metrics_http)
            BW_INFO("metrics on %s%s", metrics_bound,
                    cfg->common.metrics_auth ? " (bearer token required)" : "");
        if (report.notes[0])
            BW_WARN("state: %s", report.notes);
        if (start_compaction[0] && start_rc == BW_OK)
            BW_INFO("state: compacted at start: %s", start_compaction);
        else if (start_compaction[0])
            BW_WARN("snapshot at start failed; the journal keeps growing until one succeeds "
                    "err=%s",
                    start_compaction);
        /* Liveness sweeps run here, between signal waits: a quarter interval keeps the
         * "marked dead" log line within 25% of the deadline. */
        int tick = (int)(cfg->heartbeat_ms / 4 > 0 ? cfg->heartbeat_ms / 4 : 1);
        int sig;
        status = 0;
        uint64_t last_expiry = bw__mono_ms();
        while ((sig = bw__daemon_wait_signal(tick)) == 0 || sig == SIGHUP) {
            if (sig == SIGHUP) {
                bw__daemon_auth_reload(coord.auth);
                bw__daemon_grants_reload(coord.grants);
            }
            bw__membership_sweep(coord.members);
            /* Idle jobs are looked for every minute, or a quarter of a shorter --job-ttl. */
            uint64_t every = (uint64_t)cfg->job_ttl_s * 250;
            if (bw__mono_ms() - last_expiry >= (every < 60000 ? every : 60000)) {
                last_expiry = bw__mono_ms();
                bw__jobs_expire(coord.jobs, (uint64_t)cfg->job_ttl_s * 1000);
            }
            if (bw__journal_failed(bw__jobs_journal(coord.jobs))) {
                BW_ERROR("stopping: the journal failed; a restart recovers what is on disk");
                status = 1;
                break;
            }
            char done[512];
            if (bw__journal_compaction_due(bw__jobs_journal(coord.jobs), &policy, why,
                                           sizeof(why))) {
                if (compact(coord.jobs, why, done, sizeof(done), err, sizeof(err)) == BW_OK)
                    BW_INFO("state: compacted: %s", done);
                else
                    BW_WARN("snapshot failed; the journal keeps growing until one succeeds err=%s",
                            err);
            }
        }
        if (sig)
            BW_INFO("received %s; shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
        bw__jobs_service_drain();
        bw__rpc_server_stop(srv, (int)cfg->common.grace_ms);
        BW_INFO("stopped");
    }
    bw__cchan_stop(cchan, (int)cfg->common.grace_ms); /* its answers wait on the journal */
    bw__metrics_http_stop(metrics_http); /* its scrapes read the jobs and the worker table */
    bw__cm_free(cm);
    bw__jobs_close(coord.jobs); /* before the lock: nothing may write after it is released */
    if (lock_fd >= 0)
        close(lock_fd);
    bw__membership_free(coord.members);
    bw__owner_cache_free(coord.owners);
    bw__metrics_free(metrics);
    bw__auth_free(coord.auth);
    bw__grants_free(coord.grants);
    free(coord.token);
    bw__config_free(options, &all);
    return status;
}
