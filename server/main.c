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

#include "common/util.h"
#include "coordinator.h"
#include "jobs_service.h"

static const bw_opt options[] = {
    BW_DAEMON_OPTS(bw_coordinator_config, common, "127.0.0.1:7700"),
    {"state-dir", BW_OPT_PATH, offsetof(bw_coordinator_config, state_dir), NULL, 0, 0, NULL,
     BW_OPT_REQUIRED, "DIR", "directory for durable state (journal, snapshots, lock)"},
    {"heartbeat-ms", BW_OPT_INT, offsetof(bw_coordinator_config, heartbeat_ms), "1000", 10, 600000,
     NULL, 0, "MS", "how often workers heartbeat"},
    {"dead-after", BW_OPT_INT, offsetof(bw_coordinator_config, dead_after), "3", 1, 1000, NULL, 0,
     "N", "a worker that misses this many heartbeats in a row is marked dead"},
    {"lease-ms", BW_OPT_INT, offsetof(bw_coordinator_config, lease_ms), "10000", 100, 3600000, NULL,
     0, "MS",
     "a trainer's claim on a rank expires this long after its last heartbeat; then another "
     "trainer may take the rank"},
    {"max-jobs", BW_OPT_INT, offsetof(bw_coordinator_config, max_jobs), "1024", 1, 1000000, NULL, 0,
     "N", "most jobs the coordinator holds"},
    {"max-world-size", BW_OPT_INT, offsetof(bw_coordinator_config, max_world_size), "65536", 1,
     1048576, NULL, 0, "N", "largest world size (ranks per job)"},
    {"snapshot-bytes", BW_OPT_INT, offsetof(bw_coordinator_config, snapshot_bytes), "67108864", 1,
     1LL << 40, NULL, 0, "BYTES",
     "write a snapshot and drop the journal it replaces once this much was journaled"},
    {"truncate-journal-at", BW_OPT_STRING, offsetof(bw_coordinator_config, truncate_journal_at),
     NULL, 0, 0, NULL, BW_OPT_NO_ENV, "FILE:OFFSET",
     "after a corruption report: cut that journal file there, losing every change from that "
     "record on (the cut bytes are kept beside it)"},
    {"worker-tls-ca", BW_OPT_PATH, offsetof(bw_coordinator_config, worker_tls_ca), NULL, 0, 0, NULL,
     0, "FILE",
     "verify workers' certificates with this CA when calling them (dataset descriptions); "
     "--tls-cert/--tls-key are then the client certificate"},
    BW_OPT_END,
};

int main(int argc, char **argv)
{
    bw__daemon_block_signals();
    bw_coordinator_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    int status = bw__config_main("batchwire-coordinator", "--state-dir DIR [options]",
                                 "Owns batchwire jobs, worker membership and placement.", options,
                                 &cfg, argc, argv);
    if (status >= 0) {
        bw__config_free(options, &cfg);
        return status;
    }
    bw__log_to_stderr("coordinator", (bw_log_level)cfg.common.log_level);
    bw__daemon_route_grpc_logs((bw_log_level)cfg.common.log_level);

    char err[2048];
    int lock_fd = -1;
    bw_rpc_server *srv = NULL;
    bw_coordinator coord;
    memset(&coord, 0, sizeof(coord));
    coord.cfg = &cfg;
    coord.start_ms = bw__mono_ms();
    coord.members = bw__membership_new((uint32_t)cfg.heartbeat_ms, (uint32_t)cfg.dead_after);

    bw_journal_report report;
    memset(&report, 0, sizeof(report));
    int rc = coord.members ? BW_OK : BW_NOMEM;
    if (rc != BW_OK)
        snprintf(err, sizeof(err), "out of memory for the worker table");
    if (rc == BW_OK)
        rc = bw__state_dir_lock(cfg.state_dir, &lock_fd, err, sizeof(err));
    if (rc == BW_OK) {
        bw_jobs_opts jo = {cfg.state_dir, cfg.truncate_journal_at, (uint32_t)cfg.lease_ms,
                           (uint32_t)cfg.max_jobs, (uint32_t)cfg.max_world_size};
        rc = bw__jobs_open(&jo, &coord.jobs, &report, err, sizeof(err));
    }
    if (rc == BW_OK) {
        bw__jobs_set_placement(coord.jobs, bw__jobs_placement_table, &coord);
        bw_rpc_server_opts so;
        bw__daemon_server_opts(&cfg.common, "coordinator", &so);
        rc = bw__rpc_server_start(&so, bw__coordinator_handlers, bw__coordinator_nhandlers, &coord,
                                  &srv, coord.bound, sizeof(coord.bound), err, sizeof(err));
    }
    if (rc != BW_OK) {
        BW_ERROR("cannot start: %s", err);
        status = 1;
    } else {
        BW_INFO("listening on %s (%s%s) state-dir=%s heartbeat=%lldms dead-after=%lld", coord.bound,
                cfg.common.tls_cert ? "TLS" : "plaintext",
                cfg.common.tls_client_ca ? ", client certificates required" : "", cfg.state_dir,
                (long long)cfg.heartbeat_ms, (long long)cfg.dead_after);
        /* After the first line, which tools wait for: what recovery found. */
        BW_INFO("state: snapshot up to record %llu, %llu journal records replayed from %zu "
                "file(s); last record %llu",
                (unsigned long long)report.snapshot_seq,
                (unsigned long long)report.records_replayed, report.files,
                (unsigned long long)report.last_seq);
        if (report.notes[0])
            BW_WARN("state: %s", report.notes);
        /* Liveness sweeps run here, between signal waits: a quarter interval keeps the
         * "marked dead" log line within 25% of the deadline. */
        int tick = (int)(cfg.heartbeat_ms / 4 > 0 ? cfg.heartbeat_ms / 4 : 1);
        int sig;
        status = 0;
        while ((sig = bw__daemon_wait_signal(tick)) == 0) {
            bw__membership_sweep(coord.members);
            if (bw__journal_failed(bw__jobs_journal(coord.jobs))) {
                BW_ERROR("stopping: the journal failed; a restart recovers what is on disk");
                status = 1;
                break;
            }
            if (bw__jobs_compact(coord.jobs, (uint64_t)cfg.snapshot_bytes, err, sizeof(err)) !=
                BW_OK)
                BW_WARN("snapshot: %s; the journal keeps growing until one succeeds", err);
        }
        if (sig)
            BW_INFO("received %s; shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
        bw__jobs_service_drain();
        bw__rpc_server_stop(srv, (int)cfg.common.grace_ms);
        BW_INFO("stopped");
    }
    bw__jobs_close(coord.jobs); /* before the lock: nothing may write after it is released */
    if (lock_fd >= 0)
        close(lock_fd);
    bw__membership_free(coord.members);
    bw__config_free(options, &cfg);
    return status;
}
