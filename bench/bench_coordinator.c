/*
 * Coordinator benchmark: starts build/bin/batchwire-coordinator on a fresh state directory
 * and measures, over gRPC on loopback,
 *   1. acknowledged CommitCursor calls per second (each acknowledged only after fdatasync;
 *      concurrent commits share one fsync) with 1 and with T concurrent trainers;
 *   2. the time for 1,000 ranks to join one job, then 1,000 ranks heartbeating at the
 *      interval the coordinator asks for, for --seconds (default 10; --seconds 60 for the
 *      full minute), counting failed heartbeats and ranks whose lease lapsed.
 *
 * Usage: bench_coordinator [--bin DIR] [--state DIR] [--threads T] [--commit-seconds S]
 *                          [--ranks N] [--seconds S] [--lease-ms MS]
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/util.h"
#include "common/version.h"
#include "cursor/cursor.h"
#include "rpc/client.h"

static char bin_dir[1024] = "build/bin";
static char state_dir[1024] = "";
static int threads = 16, commit_seconds = 5, nranks = 1000, hb_seconds = 10, lease_ms = 10000;
static char addr[256];
static uint64_t fingerprint;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static pid_t start_coordinator(void)
{
    int fds[2];
    if (pipe(fds) != 0)
        abort();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        char exe[1100], lease[32];
        snprintf(exe, sizeof(exe), "%s/batchwire-coordinator", bin_dir);
        snprintf(lease, sizeof(lease), "%d", lease_ms);
        execl(exe, exe, "--listen", "127.0.0.1:0", "--state-dir", state_dir, "--lease-ms", lease,
              "--threads", "2", "--max-world-size", "100000", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    /* The first line is "... listening on ADDR ..."; the rest goes to STATE/coordinator.log. */
    FILE *f = fdopen(fds[0], "r");
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "listening on ");
        if (p) {
            sscanf(p + 13, "%255s", addr);
            break;
        }
    }
    /* Keep draining stderr in the background so the coordinator never blocks on it. */
    if (fork() == 0) {
        char path[1100];
        snprintf(path, sizeof(path), "%s/coordinator.log", state_dir);
        FILE *out = fopen(path, "w");
        while (fgets(line, sizeof(line), f))
            if (out)
                fputs(line, out);
        _exit(0);
    }
    fclose(f);
    return pid;
}

static bw_rpc_channel *channel(void)
{
    bw_rpc_channel_opts o;
    memset(&o, 0, sizeof(o));
    o.target = addr;
    bw_rpc_channel *ch;
    char err[512];
    if (bw__rpc_channel_open(&o, &ch, err, sizeof(err)) != BW_OK) {
        fprintf(stderr, "bench: %s\n", err);
        exit(1);
    }
    return ch;
}

static void must(int rc, const char *what, const char *err)
{
    if (rc != BW_OK) {
        fprintf(stderr, "bench: %s: %s\n", what, err);
        exit(1);
    }
}

static void create(bw_rpc_channel *ch, const char *name, uint32_t world)
{
    Batchwire__V1__SamplerConfig sc = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    sc.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH;
    sc.batch_size = 1;
    Batchwire__V1__JobConfig cfg = BATCHWIRE__V1__JOB_CONFIG__INIT;
    cfg.sampler = &sc;
    cfg.synthetic_samples = 1000000000ull;
    Batchwire__V1__GetOrCreateJobRequest req = BATCHWIRE__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
    req.name = (char *)name;
    req.config = &cfg;
    req.world_size = world;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp;
    char err[1024];
    must(bw__rpc_call(ch, BW_METHOD(BW_M_JOBS_GET_OR_CREATE), &req.base, &a, &resp, 10000, err,
                      sizeof(err)),
         "GetOrCreateJob", err);
    fingerprint = ((Batchwire__V1__GetOrCreateJobResponse *)resp)->job->fingerprint;
    bw__arena_reset(&a);
}

/* A lease id: 128 bits (lo, hi). */
typedef struct lease_id {
    uint64_t lo, hi;
} lease_id;

static int join(bw_rpc_channel *ch, const char *job, uint32_t rank, uint32_t world, lease_id *lease,
                uint32_t *hb_ms, char *err, size_t errlen)
{
    Batchwire__V1__Holder h = BATCHWIRE__V1__HOLDER__INIT;
    h.host = "bench";
    h.pid = 100000 + rank;
    Batchwire__V1__JoinJobRequest req = BATCHWIRE__V1__JOIN_JOB_REQUEST__INIT;
    req.job = (char *)job;
    req.rank = rank;
    req.world_size = world;
    req.holder = &h;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp;
    int rc = bw__rpc_call(ch, BW_METHOD(BW_M_JOBS_JOIN), &req.base, &a, &resp, 30000, err, errlen);
    if (rc == BW_OK) {
        lease->lo = ((Batchwire__V1__JoinJobResponse *)resp)->lease_id;
        lease->hi = ((Batchwire__V1__JoinJobResponse *)resp)->lease_id_hi;
        *hb_ms = ((Batchwire__V1__JoinJobResponse *)resp)->heartbeat_ms;
    }
    bw__arena_reset(&a);
    return rc;
}

/* ---- 1. commits ---- */

typedef struct committer {
    bw_rpc_channel *ch;
    uint32_t rank, world;
    double until;
    uint64_t done;
    double *lat;
    size_t nlat, cap;
} committer;

static void *commit_loop(void *arg)
{
    committer *c = arg;
    lease_id lease;
    uint32_t hb;
    char err[1024];
    char job[32];
    snprintf(job, sizeof(job), "commits-%u", c->world);
    must(join(c->ch, job, c->rank, c->world, &lease, &hb, err, sizeof(err)), "JoinJob", err);
    for (uint64_t step = 1; now_s() < c->until; step++) {
        Batchwire__V1__Cursor cur = BATCHWIRE__V1__CURSOR__INIT;
        cur.job = job;
        cur.job_fingerprint = fingerprint;
        cur.rank = c->rank;
        cur.world_size = c->world;
        cur.step = step;
        size_t len;
        uint8_t *bin = bw__cursor_encode(&cur, &len);
        Batchwire__V1__CommitCursorRequest req = BATCHWIRE__V1__COMMIT_CURSOR_REQUEST__INIT;
        req.job = job;
        req.rank = c->rank;
        req.lease_id = lease.lo;
        req.lease_id_hi = lease.hi;
        req.cursor.data = bin;
        req.cursor.len = len;
        bw_arena a;
        bw__arena_init(&a, 0);
        ProtobufCMessage *resp;
        double t0 = now_s();
        must(bw__rpc_call(c->ch, BW_METHOD(BW_M_JOBS_COMMIT_CURSOR), &req.base, &a, &resp, 10000,
                          err, sizeof(err)),
             "CommitCursor", err);
        double dt = now_s() - t0;
        bw__arena_reset(&a);
        free(bin);
        if (c->nlat == c->cap) {
            c->cap = c->cap ? c->cap * 2 : 1024;
            c->lat = realloc(c->lat, c->cap * sizeof(double));
        }
        c->lat[c->nlat++] = dt;
        c->done++;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench_commits(uint32_t world)
{
    bw_rpc_channel *chs[4];
    for (int i = 0; i < 4; i++)
        chs[i] = channel();
    char job[32];
    snprintf(job, sizeof(job), "commits-%u", world);
    fingerprint = 0;
    create(chs[0], job, world);
    committer *cs = calloc(world, sizeof(*cs));
    pthread_t *ts = calloc(world, sizeof(*ts));
    double t0 = now_s();
    for (uint32_t i = 0; i < world; i++) {
        cs[i] = (committer){chs[i % 4], i, world, t0 + commit_seconds, 0, NULL, 0, 0};
        pthread_create(&ts[i], NULL, commit_loop, &cs[i]);
    }
    uint64_t total = 0;
    size_t nl = 0;
    for (uint32_t i = 0; i < world; i++) {
        pthread_join(ts[i], NULL);
        total += cs[i].done;
        nl += cs[i].nlat;
    }
    double el = now_s() - t0;
    double *all = malloc((nl ? nl : 1) * sizeof(double));
    size_t k = 0;
    for (uint32_t i = 0; i < world; i++) {
        memcpy(all + k, cs[i].lat, cs[i].nlat * sizeof(double));
        k += cs[i].nlat;
        free(cs[i].lat);
    }
    qsort(all, nl, sizeof(double), cmp_double);
    printf("commits, %3u concurrent trainers: %8.0f acknowledged commits/s (%" PRIu64
           " in %.1f s), latency p50 %.2f ms, p99 %.2f ms\n",
           world, (double)total / el, total, el, nl ? all[nl / 2] * 1e3 : 0.0,
           nl ? all[nl * 99 / 100] * 1e3 : 0.0);
    free(all);
    free(cs);
    free(ts);
    for (int i = 0; i < 4; i++)
        bw__rpc_channel_close(chs[i]);
}

/* ---- 2. 1,000 ranks ---- */

typedef struct ranker {
    bw_rpc_channel *ch;
    uint32_t first, count;
    lease_id *leases;
    uint32_t hb_ms;
    double hb_until;
    uint64_t beats, failures;
    double max_lat;
    pthread_barrier_t *joined, *go;
} ranker;

static void *rank_loop(void *arg)
{
    ranker *r = arg;
    char err[1024];
    for (uint32_t i = 0; i < r->count; i++)
        must(join(r->ch, "ranks", r->first + i, (uint32_t)nranks, &r->leases[i], &r->hb_ms, err,
                  sizeof(err)),
             "JoinJob", err);
    pthread_barrier_wait(r->joined);
    pthread_barrier_wait(r->go); /* hb_until is set between the two */
    /* Each rank heartbeats every hb_ms; this thread spreads its ranks over the interval. */
    double start = now_s();
    double period = r->hb_ms / 1000.0;
    for (uint64_t round = 0;; round++) {
        for (uint32_t i = 0; i < r->count; i++) {
            double due = start + (double)round * period + period * i / r->count;
            double now = now_s();
            if (due >= r->hb_until)
                return NULL;
            if (due > now)
                usleep((useconds_t)((due - now) * 1e6));
            Batchwire__V1__LeaseHeartbeatRequest req = BATCHWIRE__V1__LEASE_HEARTBEAT_REQUEST__INIT;
            req.job = "ranks";
            req.rank = r->first + i;
            req.lease_id = r->leases[i].lo;
            req.lease_id_hi = r->leases[i].hi;
            bw_arena a;
            bw__arena_init(&a, 0);
            ProtobufCMessage *resp;
            double t0 = now_s();
            int rc = bw__rpc_call(r->ch, BW_METHOD(BW_M_JOBS_LEASE_HEARTBEAT), &req.base, &a, &resp,
                                  10000, err, sizeof(err));
            double dt = now_s() - t0;
            bw__arena_reset(&a);
            r->beats++;
            r->failures += rc != BW_OK;
            r->max_lat = dt > r->max_lat ? dt : r->max_lat;
        }
    }
}

static void bench_ranks(void)
{
    enum { T = 20 };
    bw_rpc_channel *chs[4];
    for (int i = 0; i < 4; i++)
        chs[i] = channel();
    create(chs[0], "ranks", (uint32_t)nranks);
    ranker rs[T];
    pthread_t ts[T];
    pthread_barrier_t joined, go;
    pthread_barrier_init(&joined, NULL, T + 1);
    pthread_barrier_init(&go, NULL, T + 1);
    double t0 = now_s();
    for (int i = 0; i < T; i++) {
        uint32_t per = (uint32_t)nranks / T, first = per * (uint32_t)i;
        uint32_t count = i == T - 1 ? (uint32_t)nranks - first : per;
        rs[i] = (ranker){chs[i % 4], first,   count, calloc(count, sizeof(lease_id)), 0, 0, 0, 0,
                         0,          &joined, &go};
        pthread_create(&ts[i], NULL, rank_loop, &rs[i]);
    }
    pthread_barrier_wait(&joined);
    double join_s = now_s() - t0;
    double hb_until = now_s() + hb_seconds;
    for (int i = 0; i < T; i++)
        rs[i].hb_until = hb_until;
    pthread_barrier_wait(&go);
    printf("ranks: %d ranks joined one job in %.3f s (%.0f joins/s, each journaled and fsynced)\n",
           nranks, join_s, nranks / join_s);
    uint64_t beats = 0, failures = 0;
    double max_lat = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(ts[i], NULL);
        beats += rs[i].beats;
        failures += rs[i].failures;
        max_lat = rs[i].max_lat > max_lat ? rs[i].max_lat : max_lat;
        free(rs[i].leases);
    }
    /* Every lease must still be live. */
    Batchwire__V1__GetJobRequest g = BATCHWIRE__V1__GET_JOB_REQUEST__INIT;
    g.name = "ranks";
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp;
    char err[1024];
    must(
        bw__rpc_call(chs[0], BW_METHOD(BW_M_JOBS_GET), &g.base, &a, &resp, 10000, err, sizeof(err)),
        "GetJob", err);
    const Batchwire__V1__GetJobResponse *gr = (const void *)resp;
    size_t live = 0;
    for (size_t i = 0; i < gr->n_ranks; i++)
        live += gr->ranks[i]->lease == BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_LIVE;
    printf("ranks: %d ranks heartbeating every %u ms for %d s: %" PRIu64
           " heartbeats (%.0f/s), %" PRIu64 " failed, slowest %.2f ms; %zu of %d leases live "
           "at the end\n",
           nranks, rs[0].hb_ms, hb_seconds, beats, (double)beats / hb_seconds, failures,
           max_lat * 1e3, live, nranks);
    bw__arena_reset(&a);
    pthread_barrier_destroy(&joined);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < 4; i++)
        bw__rpc_channel_close(chs[i]);
}

int main(int argc, char **argv)
{
    if (bw__version_flag(argc, argv, "bench_coordinator"))
        return 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bin"))
            snprintf(bin_dir, sizeof(bin_dir), "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--state"))
            snprintf(state_dir, sizeof(state_dir), "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = (int)strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--commit-seconds"))
            commit_seconds = (int)strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--ranks"))
            nranks = (int)strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seconds"))
            hb_seconds = (int)strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--lease-ms"))
            lease_ms = (int)strtol(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "bench_coordinator: unknown option %s (see the comment at the top)\n",
                    argv[i]);
            return 2;
        }
    }
    if (threads < 1 || nranks < 20 || hb_seconds < 1 || commit_seconds < 1) {
        fprintf(stderr, "bench_coordinator: --threads >= 1, --ranks >= 20, --seconds >= 1\n");
        return 2;
    }
    if (!state_dir[0]) {
        snprintf(state_dir, sizeof(state_dir), "/var/tmp/bw-bench-coord-XXXXXX");
        if (!mkdtemp(state_dir)) {
            fprintf(stderr, "bench_coordinator: mkdtemp: %s\n", strerror(errno));
            return 1;
        }
    }
    pid_t pid = start_coordinator();
    if (!addr[0]) {
        fprintf(stderr, "bench_coordinator: the coordinator did not start\n");
        return 1;
    }
    printf("coordinator %s, state directory %s\n", addr, state_dir);
    bench_commits(1);
    bench_commits((uint32_t)threads);
    bench_ranks();
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    return 0;
}
