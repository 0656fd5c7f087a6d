/* batchwire status: the coordinator's view of the cluster, as a table or JSON. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"
#include "commands.h"
#include "status_jobs.h"

typedef struct status_cfg {
    char *coordinator;
    bool json;
    int64_t timeout_ms;
    bw_cli_tls tls;
} status_cfg;

static const bw_opt options[] = {
    {"coordinator", BW_OPT_ADDR, offsetof(status_cfg, coordinator), NULL, 0, 0, NULL,
     BW_OPT_REQUIRED, "HOST:PORT", "the coordinator to ask"},
    {"json", BW_OPT_BOOL, offsetof(status_cfg, json), "false", 0, 0, NULL, 0, NULL,
     "print one JSON object instead of a table"},
    {"timeout-ms", BW_OPT_INT, offsetof(status_cfg, timeout_ms), "5000", 1, 3600000, NULL, 0, "MS",
     "deadline of each call"},
    BW_CLI_TLS_OPTS(status_cfg, tls),
    BW_OPT_END,
};

static const char *state_name(Batchwire__V1__WorkerState s)
{
    switch (s) {
    case BATCHWIRE__V1__WORKER_STATE__WORKER_STATE_ALIVE:
        return "alive";
    case BATCHWIRE__V1__WORKER_STATE__WORKER_STATE_DEAD:
        return "dead";
    default:
        return "unknown";
    }
}

static void print_json(const Batchwire__V1__InfoResponse *info,
                       const Batchwire__V1__ListWorkersResponse *lw, const bw_status_jobs *jobs,
                       const char *target)
{
    printf("{\"coordinator\":{\"address\":");
    bw__json_string(stdout, target);
    printf(",\"version\":");
    bw__json_string(stdout, info->version);
    printf(",\"hostname\":");
    bw__json_string(stdout, info->hostname);
    printf(",\"pid\":%" PRIu32 ",\"uptime_ms\":%" PRIu64 "}", info->pid, info->uptime_ms);
    printf(",\"heartbeat_interval_ms\":%" PRIu32 ",\"missed_heartbeats_dead\":%" PRIu32,
           lw->heartbeat_interval_ms, lw->missed_heartbeats_dead);
    printf(",\"workers\":[");
    for (size_t i = 0; i < lw->n_workers; i++) {
        const Batchwire__V1__WorkerInfo *w = lw->workers[i];
        printf("%s{\"id\":", i ? "," : "");
        bw__json_string(stdout, w->id);
        printf(",\"address\":");
        bw__json_string(stdout, w->address);
        printf(",\"data_address\":");
        bw__json_string(stdout, w->data_address ? w->data_address : "");
        printf(",\"state\":\"%s\",\"seconds_since_heartbeat\":%.3f,\"restarts\":%" PRIu32
               ",\"incarnation\":\"%016" PRIx64 "\"",
               state_name(w->state), (double)w->ms_since_heartbeat / 1000.0, w->restarts,
               w->incarnation);
        if (w->capabilities) {
            printf(",\"version\":");
            bw__json_string(stdout, w->capabilities->version);
            printf(",\"formats\":[");
            for (size_t f = 0; f < w->capabilities->n_formats; f++) {
                if (f)
                    putchar(',');
                bw__json_string(stdout, w->capabilities->formats[f]);
            }
            putchar(']');
        }
        putchar('}');
    }
    printf("],");
    bw__status_jobs_json(jobs);
    printf("}\n");
}

static void print_table(const Batchwire__V1__InfoResponse *info,
                        const Batchwire__V1__ListWorkersResponse *lw, const char *target)
{
    size_t alive = 0;
    for (size_t i = 0; i < lw->n_workers; i++)
        alive += lw->workers[i]->state == BATCHWIRE__V1__WORKER_STATE__WORKER_STATE_ALIVE;
    printf("coordinator %s  batchwire %s  up %.0fs  heartbeat %" PRIu32 " ms, dead after %" PRIu32
           " missed\n",
           target, info->version, (double)info->uptime_ms / 1000.0, lw->heartbeat_interval_ms,
           lw->missed_heartbeats_dead);
    printf("workers: %zu alive, %zu dead\n\n", alive, lw->n_workers - alive);
    if (lw->n_workers == 0) {
        printf("(no workers registered)\n");
        return;
    }
    int idw = 2, addrw = 7, dataw = 12;
    for (size_t i = 0; i < lw->n_workers; i++) {
        const Batchwire__V1__WorkerInfo *w = lw->workers[i];
        int a = (int)strlen(w->id), b = (int)strlen(w->address);
        int c = w->data_address ? (int)strlen(w->data_address) : 0;
        idw = a > idw ? a : idw;
        addrw = b > addrw ? b : addrw;
        dataw = c > dataw ? c : dataw;
    }
    printf("%-*s  %-*s  %-*s  %-5s  %14s  %8s\n", idw, "ID", addrw, "ADDRESS", dataw,
           "DATA CHANNEL", "STATE", "LAST HEARTBEAT", "RESTARTS");
    for (size_t i = 0; i < lw->n_workers; i++) {
        const Batchwire__V1__WorkerInfo *w = lw->workers[i];
        char ago[32];
        snprintf(ago, sizeof(ago), "%.1fs ago", (double)w->ms_since_heartbeat / 1000.0);
        const char *data = w->data_address && w->data_address[0] ? w->data_address : "-";
        printf("%-*s  %-*s  %-*s  %-5s  %14s  %8" PRIu32 "\n", idw, w->id, addrw, w->address, dataw,
               data, state_name(w->state), ago, w->restarts);
    }
}

int bw__cmd_status(int argc, char **argv)
{
    status_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    int status = bw__config_main("batchwire status", "--coordinator HOST:PORT [--json] [options]",
                                 "Shows the workers the coordinator knows (id, address, state, "
                                 "seconds since the last heartbeat) and its jobs with every "
                                 "rank's lease and committed progress.",
                                 options, &cfg, argc, argv);
    if (status >= 0) {
        bw__config_free(options, &cfg);
        return status;
    }
    char err[1024];
    bw_rpc_channel_opts co;
    bw__cli_channel_opts(&cfg.tls, cfg.coordinator, &co);
    bw_rpc_channel *ch = NULL;
    bw_arena arena;
    bw__arena_init(&arena, 0);
    ProtobufCMessage *info = NULL, *lw = NULL;
    Batchwire__V1__InfoRequest ireq = BATCHWIRE__V1__INFO_REQUEST__INIT;
    Batchwire__V1__ListWorkersRequest lreq = BATCHWIRE__V1__LIST_WORKERS_REQUEST__INIT;
    bw_status_jobs jobs;
    memset(&jobs, 0, sizeof(jobs));
    int rc = bw__rpc_channel_open(&co, &ch, err, sizeof(err));
    if (rc == BW_OK)
        rc = bw__rpc_call(ch, BW_METHOD(BW_M_COORDINATOR_INFO), &ireq.base, &arena, &info,
                          (int)cfg.timeout_ms, err, sizeof(err));
    if (rc == BW_OK)
        rc = bw__rpc_call(ch, BW_METHOD(BW_M_LIST_WORKERS), &lreq.base, &arena, &lw,
                          (int)cfg.timeout_ms, err, sizeof(err));
    if (rc == BW_OK)
        rc = bw__status_jobs_fetch(ch, &arena, (int)cfg.timeout_ms, &jobs, err, sizeof(err));
    if (rc == BW_OK) {
        if (cfg.json)
            print_json((const void *)info, (const void *)lw, &jobs, cfg.coordinator);
        else {
            print_table((const void *)info, (const void *)lw, cfg.coordinator);
            bw__status_jobs_table(&jobs);
        }
        status = 0;
    } else {
        fprintf(stderr, "batchwire status: %s\n", err);
        status = 1;
    }
    bw__arena_reset(&arena);
    bw__rpc_channel_close(ch);
    bw__config_free(options, &cfg);
    return status;
}
