/* batchwire status: the coordinator's view of the cluster -- workers with what they serve,
 * jobs with every rank's progress, rates and lag -- as a table or JSON, once or every few
 * seconds (--watch). Everything comes from the coordinator: rates are its own, over windows
 * between the heartbeats that carry the counters (core/common/rate.h). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/json.h"
#include "common/text.h"
#include "commands.h"
#include "status_jobs.h"
#include "text_safe.h"

typedef struct status_cfg {
    char *coordinator, *job, *ranks;
    bool json;
    int64_t timeout_ms, watch, limit;
    bw_cli_tls tls;
    bw_status_view view; /* from --limit and --ranks */
} status_cfg;

enum { WATCH_DEFAULT_S = 2 };

static const bw_opt options[] = {
    {"coordinator", BW_OPT_ADDR, offsetof(status_cfg, coordinator), NULL, 0, 0, NULL,
     BW_OPT_REQUIRED, "HOST:PORT", "the coordinator to ask"},
    {"job", BW_OPT_STRING, offsetof(status_cfg, job), NULL, 0, 0, NULL, BW_OPT_NO_ENV, "NAME",
     "show only this job and its ranks (no workers); --json then prints the job's object, as "
     "in the full status's \"jobs\" list; an unknown job is an error (exit 1)"},
    {"json", BW_OPT_BOOL, offsetof(status_cfg, json), "false", 0, 0, NULL, 0, NULL,
     "print one JSON object instead of a table (with --watch: one per line, per refresh)"},
    {"watch", BW_OPT_INT, offsetof(status_cfg, watch), "0", 0, 86400, NULL, BW_OPT_NO_ENV,
     "[SECONDS]", "show the status again every SECONDS (2 when none is given) until interrupted"},
    {"limit", BW_OPT_INT, offsetof(status_cfg, limit), "32", 0, 1 << 30, NULL, 0, "N",
     "the table lists at most N ranks of a job, the unusual first (lease expired or none, then "
     "the furthest behind), after a summary of all of them; 0 lists every rank (JSON always "
     "has every rank)"},
    {"ranks", BW_OPT_STRING, offsetof(status_cfg, ranks), NULL, 0, 0, NULL, BW_OPT_NO_ENV,
     "FROM-TO",
     "list exactly these ranks (inclusive, e.g. 0-99, or one rank: 7), in the table "
     "and in JSON: pages through a large job"},
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

static bool alive(const Batchwire__V1__WorkerInfo *w)
{
    return w->state == BATCHWIRE__V1__WORKER_STATE__WORKER_STATE_ALIVE;
}

static const char *commit_of(const Batchwire__V1__WorkerInfo *w)
{
    return w->capabilities && w->capabilities->commit && w->capabilities->commit[0]
               ? w->capabilities->commit
               : "unknown";
}

static const char *version_of(const Batchwire__V1__WorkerInfo *w)
{
    return w->capabilities && w->capabilities->version ? w->capabilities->version : "";
}

/* Whether a live worker runs another build than the coordinator: another version, or another
 * commit when both say theirs. */
static bool differs(const Batchwire__V1__InfoResponse *info, const Batchwire__V1__WorkerInfo *w)
{
    if (!alive(w) || !w->capabilities)
        return false;
    const char *c = w->capabilities->commit;
    return strcmp(version_of(w), info->version) != 0 ||
           (c && c[0] && info->commit && info->commit[0] && strcmp(c, info->commit) != 0);
}

static size_t mixed_versions(const Batchwire__V1__InfoResponse *info,
                             const Batchwire__V1__ListWorkersResponse *lw)
{
    size_t n = 0;
    for (size_t i = 0; i < lw->n_workers; i++)
        n += differs(info, lw->workers[i]);
    return n;
}

static void print_json(const Batchwire__V1__InfoResponse *info,
                       const Batchwire__V1__ListWorkersResponse *lw, const bw_status_jobs *jobs,
                       const char *target, const bw_status_view *view)
{
    printf("{\"coordinator\":{\"address\":");
    bw__json_string(stdout, target);
    printf(",\"version\":");
    bw__json_string(stdout, info->version);
    printf(",\"commit\":");
    bw__json_string(stdout, info->commit ? info->commit : "");
    printf(",\"build_type\":");
    bw__json_string(stdout, info->build_type ? info->build_type : "");
    printf(",\"features\":[");
    for (size_t f = 0; f < info->n_features; f++) {
        if (f)
            putchar(',');
        bw__json_string(stdout, info->features[f]);
    }
    printf("],\"hostname\":");
    bw__json_string(stdout, info->hostname);
    printf(",\"pid\":%" PRIu32 ",\"uptime_ms\":%" PRIu64 ",\"auth\":\"%s\"}", info->pid,
           info->uptime_ms, info->auth_enabled ? "on" : "off");
    printf(",\"heartbeat_interval_ms\":%" PRIu32 ",\"missed_heartbeats_dead\":%" PRIu32,
           lw->heartbeat_interval_ms, lw->missed_heartbeats_dead);
    printf(",\"mixed_versions\":%s", mixed_versions(info, lw) ? "true" : "false");
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
        printf(",\"served_samples\":%" PRIu64 ",\"served_bytes\":%" PRIu64
               ",\"samples_per_s\":%.1f,\"bytes_per_s\":%.0f",
               w->served_samples, w->served_bytes, w->samples_per_s, w->bytes_per_s);
        if (w->capabilities) {
            printf(",\"version\":");
            bw__json_string(stdout, w->capabilities->version);
            printf(",\"commit\":");
            bw__json_string(stdout, w->capabilities->commit ? w->capabilities->commit : "");
            printf(",\"version_differs\":%s", differs(info, w) ? "true" : "false");
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
    bw__status_jobs_json(jobs, view);
    printf("}\n");
}

static void print_table(const Batchwire__V1__InfoResponse *info,
                        const Batchwire__V1__ListWorkersResponse *lw, const char *target)
{
    size_t nalive = 0;
    double samples = 0, bytes = 0;
    for (size_t i = 0; i < lw->n_workers; i++)
        if (alive(lw->workers[i])) {
            nalive++;
            samples += lw->workers[i]->samples_per_s;
            bytes += lw->workers[i]->bytes_per_s;
        }
    printf("coordinator %s  batchwire %s (%s)  up %.0fs  heartbeat %" PRIu32
           " ms, dead after %" PRIu32 " missed\n",
           target, info->version, info->commit && info->commit[0] ? info->commit : "unknown",
           (double)info->uptime_ms / 1000.0, lw->heartbeat_interval_ms, lw->missed_heartbeats_dead);
    size_t open = 0;
    for (size_t i = 0; i < lw->n_workers; i++)
        open += alive(lw->workers[i]) &&
                !(lw->workers[i]->capabilities && lw->workers[i]->capabilities->auth_enabled);
    /* docs/security.md: a daemon without --auth-tokens lets anyone do anything. */
    if (info->auth_enabled && !open)
        printf("auth: on\n");
    else if (info->auth_enabled)
        printf("auth: on at the coordinator, OFF at %zu live worker(s) (anyone may read their "
               "data)\n",
               open);
    else
        printf("auth: off (anyone who reaches the coordinator may do anything; "
               "docs/security.md)\n");
    printf("workers: %zu alive, %zu dead; serving %.0f samples/s, %.1f MiB/s\n\n", nalive,
           lw->n_workers - nalive, samples, bytes / (1 << 20));
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
    printf("%-*s  %-*s  %-*s  %-5s  %14s  %8s  %10s  %8s\n", idw, "ID", addrw, "ADDRESS", dataw,
           "DATA CHANNEL", "STATE", "LAST HEARTBEAT", "RESTARTS", "SAMPLES/S", "MIB/S");
    for (size_t i = 0; i < lw->n_workers; i++) {
        const Batchwire__V1__WorkerInfo *w = lw->workers[i];
        char ago[32], sps[32] = "-", mibs[32] = "-";
        snprintf(ago, sizeof(ago), "%.1fs ago", (double)w->ms_since_heartbeat / 1000.0);
        if (alive(w)) {
            snprintf(sps, sizeof(sps), "%.0f", w->samples_per_s);
            snprintf(mibs, sizeof(mibs), "%.1f", w->bytes_per_s / (1 << 20));
        }
        const char *data = w->data_address && w->data_address[0] ? w->data_address : "-";
        printf("%-*s  %-*s  %-*s  %-5s  %14s  %8" PRIu32 "  %10s  %8s\n", idw, w->id, addrw,
               w->address, dataw, data, state_name(w->state), ago, w->restarts, sps, mibs);
    }
    if (mixed_versions(info, lw)) {
        printf("\nMIXED VERSIONS: the coordinator runs %s (%s); these live workers differ:\n",
               info->version, info->commit && info->commit[0] ? info->commit : "unknown");
        for (size_t i = 0; i < lw->n_workers; i++)
            if (differs(info, lw->workers[i]))
                printf("  %s: %s (%s)\n", lw->workers[i]->id, version_of(lw->workers[i]),
                       commit_of(lw->workers[i]));
    }
}

/* The table prints what daemons report (ids, addresses, versions, host names): escaped first
 * (text_safe.h). */
static int make_safe(ProtobufCMessage *info, ProtobufCMessage *lw, const bw_status_jobs *jobs,
                     bw_arena *arena, char *err, size_t errlen)
{
    bool ok = bw__cli_safe_message(info, arena) && bw__cli_safe_message(lw, arena);
    for (size_t i = 0; ok && i < jobs->n; i++)
        ok = bw__cli_safe_message((ProtobufCMessage *)jobs->jobs[i], arena);
    if (!ok)
        snprintf(err, errlen, "out of memory");
    return ok ? BW_OK : BW_NOMEM;
}

/* err, escaped, to stderr after "batchwire status: " (a daemon's sentence may hold anything). */
static void print_error(const char *err, const char *suffix)
{
    char safe[4200];
    bw__cli_safe_text(safe, sizeof(safe), err);
    fprintf(stderr, "batchwire status: %s%s\n", safe, suffix);
}

/* One look at the cluster: BW_OK after printing it, or an error with a sentence in err. */
static int show(const status_cfg *cfg, bw_rpc_channel *ch, char *err, size_t errlen)
{
    bw_arena arena;
    bw__arena_init(&arena, 0);
    ProtobufCMessage *info = NULL, *lw = NULL;
    Batchwire__V1__InfoRequest ireq = BATCHWIRE__V1__INFO_REQUEST__INIT;
    Batchwire__V1__ListWorkersRequest lreq = BATCHWIRE__V1__LIST_WORKERS_REQUEST__INIT;
    bw_status_jobs jobs;
    memset(&jobs, 0, sizeof(jobs));
    int rc;
    if (cfg->job) { /* one job: nothing else is asked for */
        rc = bw__status_job_fetch(ch, &arena, (int)cfg->timeout_ms, cfg->job, cfg->coordinator,
                                  &jobs, err, errlen);
        if (rc == BW_OK && cfg->json) {
            bw__status_job_json(jobs.jobs[0], &cfg->view);
            putchar('\n');
        } else if (rc == BW_OK &&
                   (rc = make_safe(NULL, NULL, &jobs, &arena, err, errlen)) == BW_OK) {
            if (cfg->watch && isatty(STDOUT_FILENO))
                printf("\033[H\033[2J");
            printf("coordinator %s\n\n", cfg->coordinator);
            bw__status_job_table(jobs.jobs[0], &cfg->view);
        }
        fflush(stdout);
        bw__arena_reset(&arena);
        return rc;
    }
    rc = bw__rpc_call(ch, BW_METHOD(BW_M_COORDINATOR_INFO), &ireq.base, &arena, &info,
                      (int)cfg->timeout_ms, err, errlen);
    if (rc == BW_OK)
        rc = bw__rpc_call(ch, BW_METHOD(BW_M_LIST_WORKERS), &lreq.base, &arena, &lw,
                          (int)cfg->timeout_ms, err, errlen);
    if (rc == BW_OK)
        rc = bw__status_jobs_fetch(ch, &arena, (int)cfg->timeout_ms, &jobs, err, errlen);
    if (rc == BW_OK && cfg->json) {
        print_json((const void *)info, (const void *)lw, &jobs, cfg->coordinator, &cfg->view);
    } else if (rc == BW_OK && (rc = make_safe(info, lw, &jobs, &arena, err, errlen)) == BW_OK) {
        if (cfg->watch && isatty(STDOUT_FILENO))
            printf("\033[H\033[2J"); /* a refresh replaces the screen */
        print_table((const void *)info, (const void *)lw, cfg->coordinator);
        bw__status_jobs_table(&jobs, &cfg->view);
    }
    fflush(stdout);
    bw__arena_reset(&arena);
    return rc;
}

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* --ranks FROM-TO (or one rank) into v; BW_OK or BW_INVALID_ARGUMENT with a sentence. */
static int parse_ranks(const char *text, bw_status_view *v, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    unsigned long long from = strtoull(text, &end, 10), to = from;
    bool ok = errno == 0 && end != text && text[0] != '-';
    if (ok && *end == '-') {
        const char *t = end + 1;
        to = strtoull(t, &end, 10);
        ok = errno == 0 && end != t && t[0] != '-';
    }
    if (!ok || *end || from > to || to > UINT32_MAX) {
        snprintf(err, errlen,
                 "--ranks '%.100s': expected FROM-TO with FROM <= TO (e.g. 0-99) or one rank",
                 text);
        return BW_INVALID_ARGUMENT;
    }
    v->range = true;
    v->from = (uint32_t)from;
    v->to = (uint32_t)to;
    return BW_OK;
}

/* `--watch` may be given without a value: it then means --watch=WATCH_DEFAULT_S. */
static char **watch_default(int argc, char **argv)
{
    static char bare[32];
    snprintf(bare, sizeof(bare), "--watch=%d", WATCH_DEFAULT_S);
    char **out = calloc((size_t)argc + 1, sizeof(char *));
    if (!out)
        return NULL;
    for (int i = 0; i < argc; i++) {
        bool last = i + 1 == argc || strncmp(argv[i + 1], "--", 2) == 0;
        out[i] = strcmp(argv[i], "--watch") == 0 && last ? bare : argv[i];
    }
    return out;
}

int bw__cmd_status(int argc, char **argv)
{
    status_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    char **args = watch_default(argc, argv);
    if (!args) {
        fprintf(stderr, "batchwire status: out of memory\n");
        return 1;
    }
    int status = bw__config_main(
        "batchwire status",
        "--coordinator HOST:PORT [--job NAME] [--json] [--watch [SECONDS]] [options]",
        "Shows the workers the coordinator knows (id, address, state, seconds since the last "
        "heartbeat, samples and MiB served per second) and its jobs with every rank's lease, "
        "committed progress, position, lag behind the fastest rank and rates (a summary of a "
        "job's ranks by lease and lag, then at most --limit ranks, the unusual first; --ranks "
        "FROM-TO pages). Rates are the "
        "coordinator's, over the last window of at least a second between the heartbeats that "
        "carry each worker's and loader's counters. A live worker whose version or commit "
        "differs from the coordinator's is flagged (MIXED VERSIONS). --job NAME shows that job "
        "alone.",
        options, &cfg, argc, args);
    free(args);
    char err[1024];
    if (status < 0 && cfg.job &&
        bw__check_name("--job", cfg.job, BW_JOB_NAME_MAX, err, sizeof(err)) != BW_OK) {
        fprintf(stderr, "batchwire status: %s\n", err);
        status = 2;
    }
    if (status < 0 && cfg.ranks && parse_ranks(cfg.ranks, &cfg.view, err, sizeof(err)) != BW_OK) {
        fprintf(stderr, "batchwire status: %s\n", err);
        status = 2;
    }
    cfg.view.limit = (size_t)cfg.limit;
    if (status >= 0) {
        bw__config_free(options, &cfg);
        return status;
    }
    bw_rpc_channel_opts co;
    bw_rpc_channel *ch = NULL;
    int rc = bw__cli_channel_opts(&cfg.tls, cfg.coordinator, &co, err, sizeof(err));
    if (rc == BW_OK)
        rc = bw__rpc_channel_open(&co, &ch, err, sizeof(err));
    if (rc == BW_OK && cfg.watch) {
        signal(SIGINT, on_interrupt);
        signal(SIGTERM, on_interrupt);
    }
    while (rc == BW_OK) {
        rc = show(&cfg, ch, err, sizeof(err));
        if (rc != BW_OK && cfg.watch && !interrupted) {
            /* The coordinator may be restarting: say so and look again. */
            print_error(err, " (trying again)");
            rc = BW_OK;
        }
        if (!cfg.watch || interrupted)
            break;
        for (int64_t ms = 0; ms < cfg.watch * 1000 && !interrupted; ms += 100)
            usleep(100 * 1000);
        if (interrupted)
            break;
    }
    status = 0;
    if (rc != BW_OK) {
        print_error(err, "");
        status = 1;
    }
    bw__rpc_channel_close(ch);
    bw__config_free(options, &cfg);
    return status;
}
