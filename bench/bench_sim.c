/*
 * Coordinator scale simulator (issue 26, item 3): drives the coordinator's own code in this
 * process -- the jobs state and its journal on a real state directory (server/jobs.h,
 * core/journal), the worker table (server/membership.h), the placement table handed to
 * trainers (bw__jobs_placement_table) and rendezvous placement (core/placement) -- with W
 * simulated storage workers and R simulated ranks. Only the callers are simulated: each
 * operation is the call an RPC handler makes (server/coordinator_service.c,
 * server/jobs_service.c, server/placement_service.c), minus gRPC and protobuf decoding, in a
 * tight loop on one thread; the journal's writer thread group-commits as it does in the
 * daemon, and each phase ends when its last record is durable. The clock is the real one
 * (membership and leases read bw__mono_ms), so a phase that takes longer than a heartbeat
 * interval also carries the workers' heartbeats, as the real coordinator would.
 *
 * For each scale point (W workers, R ranks in jobs of --world ranks) it measures CPU time
 * (getrusage: this process, all threads) and wall time per operation class, RSS, journal
 * bytes per record, compaction, replay (restart) and a failover storm after the restart; and
 * placement churn when 1 % of the workers die or join, checked against rendezvous hashing's
 * promise (docs/architecture.md; core/placement/placement.h): no shard moves between two
 * surviving workers, and the shards that move are the lost workers' (expected k/N of them,
 * bound k/N + 4 sigma of the binomial count). A broken bound makes the exit status 1.
 *
 * Usage: bench_sim [--quick] [--points W:R,W:R,...] [--world N] [--shards S] [--state DIR]
 *                  [--sample N] [--log-info]
 * Output: a table per point on stdout and one JSON line per point ("bench_sim {...}").
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/util.h"
#include "common/version.h"
#include "cursor/cursor.h"
#include "placement/placement.h"
#include "server/coordinator.h"
#include "server/jobs_int.h"
#include "server/jobs_service.h"
#include "server/placement_service.h"

enum {
    MAX_POINTS = 8,
    LOADER_SHARDS = 256, /* BW_LOADER_NUM_SHARDS (client/lib/loader_limits.h) */
    HEARTBEAT_MS = 1000, /* the coordinator's defaults (server/main.c) */
    DEAD_AFTER = 3,
    LEASE_MS = 10000,
    LEASE_BEAT_MS = LEASE_MS / 3, /* a rank's heartbeat interval (JoinJob's heartbeat_ms) */
    TICK_EVERY = 16,              /* operations between looks at the clock (a Placement.Get at 1,000
                                   * workers takes milliseconds) */
};

static const bw_principal anyone = {BW_ROLE_OPEN, ""};

/* ---- options ---- */

static struct {
    uint32_t workers[MAX_POINTS], ranks[MAX_POINTS];
    size_t npoints;
    uint32_t world;  /* ranks per job; 0: one job of all R ranks */
    uint32_t shards; /* shards for the churn measurement */
    uint32_t sample; /* operations timed for the per-call costs that do not depend on R */
    char state[512];
    bool log_info, quick;
} opt = {.shards = 0, .sample = 0}; /* 0: the default of the mode (main) */

static void usage(void)
{
    fprintf(stderr, "usage: bench_sim [--quick] [--points W:R,W:R,...] [--world N] [--shards S] "
                    "[--state DIR] [--sample N] [--log-info]\n");
    exit(2);
}

static uint32_t parse_u32(const char *what, const char *s, uint32_t lo, uint32_t hi)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "bench_sim: %s '%s' must be a number from %u to %u\n", what, s, lo, hi);
        exit(2);
    }
    return (uint32_t)v;
}

static void parse_points(const char *s)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    opt.npoints = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        if (!colon || opt.npoints == MAX_POINTS) {
            fprintf(stderr, "bench_sim: --points wants up to %d W:R pairs (got '%s')\n", MAX_POINTS,
                    s);
            exit(2);
        }
        *colon = 0;
        opt.workers[opt.npoints] = parse_u32("workers", tok, 2, 100000);
        opt.ranks[opt.npoints] = parse_u32("ranks", colon + 1, 1, 1000000);
        opt.npoints++;
    }
    if (!opt.npoints)
        usage();
}

/* ---- measuring ---- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* VmRSS or VmHWM from /proc/self/status, in MiB. */
static double proc_mib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    size_t klen = strlen(key);
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, key, klen) == 0 && line[klen] == ':')
            kb = strtod(line + klen + 1, NULL);
    if (f)
        fclose(f);
    return kb / 1024.0;
}

typedef struct phase {
    const char *name;
    uint64_t ops;     /* operations timed */
    uint64_t total;   /* operations the figures stand for (> ops: extrapolated per call) */
    double wall, cpu; /* seconds for `ops` */
    double rss;       /* MiB after */
    uint64_t jbytes;  /* journal bytes written */
} phase;

typedef struct mark {
    double wall, cpu;
    uint64_t jbytes;
    bool counted; /* the journal was open at the start (restarts and compaction: no growth) */
} mark;

/* ---- the simulated coordinator ---- */

typedef struct sim {
    uint32_t W, R, world, njobs;
    char dir[600];
    bw_jobs *jobs;
    bw_membership *members;
    bw_coordinator coord;
    bw_coordinator_config cfg;
    uint64_t *incarnation; /* per worker */
    bw_lease *leases;      /* per rank (job r / world, rank r % world) */
    uint64_t *fingerprint; /* per job, as GetOrCreateJob answered it (cursors carry it) */
    double last_round;     /* the workers' last heartbeat round */
    uint64_t worker_rounds;
    phase ph[24];
    size_t nph;
} sim;

__attribute__((noreturn)) static void die(const char *what, int rc, const char *err)
{
    fprintf(stderr, "bench_sim: %s: %s (%s)\n", what, err, bw_err_name(rc));
    exit(1);
}

static uint64_t journal_bytes(sim *S)
{
    return bw__journal_bytes_since_snapshot(bw__jobs_journal(S->jobs));
}

static mark start(sim *S)
{
    return (mark){now_s(), cpu_s(), S->jobs ? journal_bytes(S) : 0, S->jobs != NULL};
}

static void print_phase(const phase *p)
{
    double per = p->ops ? p->cpu / (double)p->ops * 1e6 : 0;
    double tot_cpu = p->ops ? p->cpu * (double)p->total / (double)p->ops : 0;
    printf("  %-34s %9" PRIu64 " %9" PRIu64 " %9.3f %9.3f %10.2f %10.2f %9.1f %9.1f\n", p->name,
           p->ops, p->total, p->wall, p->cpu, per, tot_cpu, p->rss,
           p->ops ? (double)p->jbytes / (double)p->ops : 0);
}

static phase *finish(sim *S, mark m, const char *name, uint64_t ops, uint64_t total)
{
    phase *p = &S->ph[S->nph++];
    p->name = name;
    p->ops = ops;
    p->total = total;
    p->wall = now_s() - m.wall;
    p->cpu = cpu_s() - m.cpu;
    p->rss = proc_mib("VmRSS");
    uint64_t now_bytes = S->jobs ? journal_bytes(S) : 0;
    p->jbytes = m.counted && now_bytes >= m.jbytes ? now_bytes - m.jbytes : 0;
    print_phase(p);
    fflush(stdout);
    return p;
}

static void worker_id(uint32_t i, char *out, size_t len)
{
    snprintf(out, len, "worker-%05u", i);
}

static void job_name(uint32_t j, char *out, size_t len)
{
    snprintf(out, len, "sim-job-%04u", j);
}

static int register_worker(bw_membership *m, uint32_t i, uint64_t incarnation, char *err,
                           size_t errlen)
{
    char id[32], addr[64], daddr[64];
    worker_id(i, id, sizeof(id));
    snprintf(addr, sizeof(addr), "10.%u.%u.%u:7070", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    snprintf(daddr, sizeof(daddr), "10.%u.%u.%u:7071", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    char *formats[] = {"npy", "npz", "tfrecord", "files", "jsonl", "text", "tar", "fields"};
    Batchwire__V1__WorkerCapabilities caps = BATCHWIRE__V1__WORKER_CAPABILITIES__INIT;
    caps.version = "0.0.0-sim";
    caps.commit = "sim";
    caps.formats = formats;
    caps.n_formats = sizeof(formats) / sizeof(formats[0]);
    caps.max_message_bytes = 64u << 20;
    Batchwire__V1__RegisterWorkerRequest req = BATCHWIRE__V1__REGISTER_WORKER_REQUEST__INIT;
    req.id = id;
    req.address = addr;
    req.data_address = daddr;
    req.capabilities = &caps;
    req.incarnation = incarnation;
    return bw__membership_register(m, &anyone, &req, addr, err, errlen);
}

/* What the Heartbeat handler does (server/coordinator_service.c, on_heartbeat; no grants). */
static void worker_heartbeat(bw_membership *m, uint32_t i, uint64_t incarnation, bool *known)
{
    char id[32], err[512];
    worker_id(i, id, sizeof(id));
    int rc = bw__membership_heartbeat(m, &anyone, id, incarnation, known, err, sizeof(err));
    if (rc != BW_OK)
        die("worker heartbeat", rc, err);
    if (*known)
        bw__membership_served(m, id, incarnation, 1000u * i, 4096000u * i);
    (void)bw__membership_version(m);
}

/* Worker i heartbeats; told it is unknown (after a coordinator restart), it registers again,
 * as worker/ does on known = false. */
static void worker_beat(sim *S, uint32_t i)
{
    bool known;
    worker_heartbeat(S->members, i, S->incarnation[i], &known);
    if (!known) {
        char err[512];
        int rc = register_worker(S->members, i, S->incarnation[i], err, sizeof(err));
        if (rc != BW_OK)
            die("worker re-registration", rc, err);
    }
}

static void worker_round(sim *S)
{
    for (uint32_t i = 0; i < S->W; i++)
        worker_beat(S, i);
    S->last_round = now_s();
    S->worker_rounds++;
}

/* Called every TICK_EVERY operations of a long phase: the workers keep heartbeating. */
static void tick(sim *S)
{
    if (now_s() - S->last_round >= HEARTBEAT_MS / 1000.0)
        worker_round(S);
}

static void open_state(sim *S, bw_journal_report *rep)
{
    bw_jobs_opts o = {S->dir, NULL, LEASE_MS, 100000, 100000, 1048576, 0};
    char err[1024];
    int rc = bw__jobs_open(&o, &S->jobs, rep, err, sizeof(err));
    if (rc != BW_OK)
        die("open the jobs state", rc, err);
    bw__jobs_set_placement(S->jobs, bw__jobs_placement_table, &S->coord);
    S->coord.jobs = S->jobs;
}

static void new_members(sim *S)
{
    bw_membership_opts mo = {HEARTBEAT_MS, DEAD_AFTER, 3600000, 0, 0, NULL};
    S->members = bw__membership_new(&mo);
    bw__owner_cache_free(S->coord.owners); /* a restart forgets what it had computed */
    S->coord.owners = bw__owner_cache_new();
    if (!S->members || !S->coord.owners)
        die("membership", BW_NOMEM, "out of memory");
    S->coord.members = S->members;
}

static void sync_all(sim *S)
{
    bw_journal *j = bw__jobs_journal(S->jobs);
    int rc = bw__journal_sync(j, bw__journal_next_seq(j) - 1);
    if (rc != BW_OK)
        die("journal sync", rc, "the journal failed");
}

static void create_jobs(sim *S)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__SamplerConfig sc = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    sc.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH;
    sc.batch_size = 1;
    sc.shuffle = true;
    Batchwire__V1__JobConfig cfg = BATCHWIRE__V1__JOB_CONFIG__INIT;
    cfg.sampler = &sc;
    for (uint32_t j = 0; j < S->njobs; j++) {
        uint32_t world = S->world;
        if ((uint64_t)(j + 1) * S->world > S->R)
            world = S->R - j * S->world;
        cfg.synthetic_samples = 4ull * world; /* 4 steps per rank and epoch */
        char name[64], err[1024];
        job_name(j, name, sizeof(name));
        Batchwire__V1__GetOrCreateJobRequest req = BATCHWIRE__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
        req.name = name;
        req.config = &cfg;
        req.world_size = world;
        Batchwire__V1__GetOrCreateJobResponse *resp;
        uint64_t ws;
        bool need = false;
        int rc = bw__jobs_lookup(S->jobs, &anyone, &req, &a, &resp, &need, &ws, err, sizeof(err));
        if (rc == BW_OK && need)
            rc = bw__jobs_create(S->jobs, &anyone, &req,
                                 bw__jobs_synthetic_info(&a, cfg.synthetic_samples), &a, &resp, &ws,
                                 err, sizeof(err));
        if (rc != BW_OK)
            die("create a job", rc, err);
        S->fingerprint[j] = resp->job->fingerprint;
        bw__arena_reset(&a);
    }
    sync_all(S);
}

static uint32_t world_of(const sim *S, uint32_t job)
{
    uint64_t end = (uint64_t)(job + 1) * S->world;
    return end > S->R ? S->R - job * S->world : S->world;
}

/* JoinJob for global rank g (job g / world), as the handler calls it. */
static void join(sim *S, uint32_t g, bw_arena *a)
{
    uint32_t job = g / S->world, rank = g % S->world;
    char name[64], host[64], err[1024];
    job_name(job, name, sizeof(name));
    snprintf(host, sizeof(host), "node-%05u.sim", g / 8); /* 8 ranks a host */
    Batchwire__V1__Holder h = BATCHWIRE__V1__HOLDER__INIT;
    h.host = host;
    h.pid = 1000 + g % 8;
    Batchwire__V1__JoinJobRequest req = BATCHWIRE__V1__JOIN_JOB_REQUEST__INIT;
    req.job = name;
    req.rank = rank;
    req.world_size = world_of(S, job);
    req.holder = &h;
    Batchwire__V1__JoinJobResponse *resp = NULL;
    uint64_t ws;
    int rc = bw__jobs_join(S->jobs, &anyone, &req, a, &resp, &ws, err, sizeof(err));
    if (rc != BW_OK)
        die("join", rc, err);
    S->leases[g] = (bw_lease){resp->lease_id, resp->lease_id_hi};
}

static void lease_heartbeat(sim *S, uint32_t g, bw_arena *a)
{
    uint32_t job = g / S->world;
    char name[64], err[1024];
    job_name(job, name, sizeof(name));
    Batchwire__V1__RankLive live = BATCHWIRE__V1__RANK_LIVE__INIT;
    live.epoch = 0;
    live.step = 1;
    live.epoch_steps = 4;
    live.batches = 1;
    live.samples = 256;
    live.bytes = 1 << 20;
    Batchwire__V1__LeaseHeartbeatRequest req = BATCHWIRE__V1__LEASE_HEARTBEAT_REQUEST__INIT;
    req.job = name;
    req.rank = g % S->world;
    req.lease_id = S->leases[g].lo;
    req.lease_id_hi = S->leases[g].hi;
    req.live = &live;
    Batchwire__V1__LeaseHeartbeatResponse *resp = NULL;
    uint64_t ws;
    int rc = bw__jobs_heartbeat(S->jobs, &anyone, &req, a, &resp, &ws, err, sizeof(err));
    if (rc != BW_OK)
        die("lease heartbeat", rc, err);
}

static void commit(sim *S, uint32_t g, uint64_t step, bw_arena *a)
{
    uint32_t job = g / S->world;
    char name[64], err[1024];
    job_name(job, name, sizeof(name));
    Batchwire__V1__Cursor c = BATCHWIRE__V1__CURSOR__INIT;
    c.job_fingerprint = S->fingerprint[job];
    c.rank = g % S->world;
    c.world_size = world_of(S, job);
    c.step = step;
    size_t len;
    uint8_t *bin = bw__cursor_encode(&c, &len);
    if (!bin)
        die("commit", BW_NOMEM, "out of memory encoding a cursor");
    Batchwire__V1__CommitCursorRequest req = BATCHWIRE__V1__COMMIT_CURSOR_REQUEST__INIT;
    req.job = name;
    req.rank = c.rank;
    req.lease_id = S->leases[g].lo;
    req.lease_id_hi = S->leases[g].hi;
    req.cursor.data = bin;
    req.cursor.len = len;
    Batchwire__V1__CommitCursorResponse *resp = NULL;
    uint64_t ws;
    int rc = bw__jobs_commit(S->jobs, &anyone, &req, a, &resp, &ws, err, sizeof(err));
    free(bin);
    if (rc != BW_OK)
        die("commit", rc, err);
}

/* Placement.Get with the loader's shard count: what server/placement_service.c computes per
 * call (the live workers' snapshot, then the owner of every shard by core/placement). */
static void placement_get(sim *S, bw_arena *a, uint32_t num_shards, uint32_t *owners)
{
    uint64_t version;
    char **ids, **addrs, **daddrs;
    size_t n;
    int rc = bw__membership_live(S->members, a, &version, &ids, &addrs, &daddrs, &n);
    if (rc != BW_OK || n == 0)
        die("placement", rc == BW_OK ? BW_UNAVAILABLE : rc, "no live workers");
    for (uint32_t s = 0; s < num_shards; s++)
        owners[s] = (uint32_t)bw__placement_owner((const char *const *)ids, n, s);
}

/* Runs op(S, g, a) for g in [0, count) (g modulo R), resetting the arena as an RPC does. */
typedef void (*op_fn)(sim *S, uint32_t g, bw_arena *a);

static void run_ops(sim *S, op_fn op, uint64_t count)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    for (uint64_t i = 0; i < count; i++) {
        op(S, (uint32_t)(i % S->R), &a);
        bw__arena_reset(&a);
        if (i % TICK_EVERY == TICK_EVERY - 1)
            tick(S);
    }
}

static void op_commit1(sim *S, uint32_t g, bw_arena *a)
{
    commit(S, g, 1, a);
}

/* Placement.Get's own table builder (server/placement_service.h), with the coordinator's
 * cache of owners per placement version. */
static void op_placement(sim *S, uint32_t g, bw_arena *a)
{
    (void)g;
    Batchwire__V1__PlacementTable *t = NULL;
    int rc = bw__placement_table(&S->coord, a, LOADER_SHARDS, &t);
    if (rc != BW_OK || !t->n_owners)
        die("placement", rc == BW_OK ? BW_UNAVAILABLE : rc, "no live workers");
}

/* ---- placement churn ---- */

typedef struct churn {
    uint32_t n, k, shards;
    uint64_t moved;          /* shards whose owner changed */
    uint64_t moved_wrong;    /* ... between two workers that were live before and after */
    double expected, bound;  /* fractions */
    uint64_t max_per_worker; /* most shards a single lost/new worker took or gave */
    double max_load_ratio;   /* most shards on one worker / (shards / n), before */
    uint32_t used256;        /* workers owning at least one of the loader's 256 shards */
    double wall_ms;          /* one full owner computation (shards x n scores) */
    bool ok;
} churn;

static uint32_t worker_num(const char *id)
{
    return (uint32_t)strtoul(id + strlen("worker-"), NULL, 10);
}

/* The owner (worker number) of each of `shards` shards under membership m's live workers. */
static double owners_now(bw_membership *m, uint32_t shards, uint32_t *owner, size_t *nlive)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    uint64_t version;
    char **ids, **addrs, **daddrs;
    size_t n;
    int rc = bw__membership_live(m, &a, &version, &ids, &addrs, &daddrs, &n);
    if (rc != BW_OK || n == 0)
        die("churn", rc == BW_OK ? BW_UNAVAILABLE : rc, "no live workers");
    double t0 = now_s();
    for (uint32_t s = 0; s < shards; s++)
        owner[s] = worker_num(ids[bw__placement_owner((const char *const *)ids, n, s)]);
    double ms = (now_s() - t0) * 1e3;
    *nlive = n;
    bw__arena_reset(&a);
    return ms;
}

/* 1 % of N workers (at least one) die (`die_`) or join, in a membership of its own with a short
 * heartbeat so that the real sweep marks the silent ones dead within milliseconds. */
static churn measure_churn(uint32_t N, uint32_t shards, bool die_)
{
    churn c = {.n = N, .shards = shards};
    if (N < 2 || shards == 0)
        die("churn", BW_INVALID_ARGUMENT, "needs 2 or more workers and 1 or more shards");
    c.k = N / 100 ? N / 100 : 1;
    /* Dying: dead after 2 x 100 ms of silence (long enough for N registrations, short enough
     * to wait for); joining: nobody may die, however long the owner computation takes (seconds
     * at 1,000 workers on a busy machine). */
    const uint32_t hb = die_ ? 100 : 3600000, dead_after = 2;
    bw_membership_opts mo = {hb, dead_after, 3600000, 0, 0, NULL};
    bw_membership *m = bw__membership_new(&mo);
    uint32_t total = die_ ? N : N + c.k;
    bool *gone = calloc(total, 1);
    uint32_t *before = malloc(shards * sizeof(*before)), *after = malloc(shards * sizeof(*after));
    uint64_t *per = calloc(total, sizeof(*per));
    if (!m || !gone || !before || !after || !per)
        die("churn", BW_NOMEM, "out of memory");
    char err[512];
    for (uint32_t i = 0; i < N; i++)
        if (register_worker(m, i, 1 + i, err, sizeof(err)) != BW_OK)
            die("churn registration", BW_INTERNAL, err);
    size_t nlive;
    c.wall_ms = owners_now(m, shards, before, &nlive);
    if (nlive != N) {
        fprintf(stderr, "bench_sim: churn: %zu of %u workers live after registering them\n", nlive,
                N);
        exit(1);
    }
    for (uint32_t s = 0; s < shards; s++)
        per[before[s]]++;
    uint64_t most = 0;
    for (uint32_t i = 0; i < N; i++)
        most = per[i] > most ? per[i] : most;
    c.max_load_ratio = (double)most / ((double)shards / N);
    memset(per, 0, total * sizeof(*per)); /* per[] as a set: the owners of shards 0..255 */
    for (uint32_t s = 0; s < shards && s < LOADER_SHARDS; s++)
        per[before[s]] = 1;
    for (uint32_t i = 0; i < N; i++)
        c.used256 += per[i] != 0;
    memset(per, 0, total * sizeof(*per));
    if (die_) {
        /* k distinct victims, spread deterministically (a stride prime to N) */
        uint32_t stride = 7919 % N ? 7919 : 7907;
        for (uint32_t j = 0, v = 13 % N; j < c.k; j++, v = (v + stride) % N)
            gone[v] = true;
        double until = now_s() + (double)hb * (dead_after + 1) / 1000.0 + 0.01;
        while (now_s() < until) { /* the survivors keep heartbeating */
            for (uint32_t i = 0; i < N; i++) {
                bool known;
                char id[32];
                worker_id(i, id, sizeof(id));
                if (!gone[i] && bw__membership_heartbeat(m, &anyone, id, 1 + i, &known, err,
                                                         sizeof(err)) != BW_OK)
                    die("churn heartbeat", BW_INTERNAL, err);
            }
            usleep(2000);
        }
        bw__membership_sweep(m);
    } else {
        for (uint32_t i = N; i < total; i++)
            if (register_worker(m, i, 1 + i, err, sizeof(err)) != BW_OK)
                die("churn registration", BW_INTERNAL, err);
    }
    owners_now(m, shards, after, &nlive);
    if (nlive != (die_ ? N - c.k : N + c.k)) {
        fprintf(stderr, "bench_sim: churn: %zu live workers, expected %u\n", nlive,
                die_ ? N - c.k : N + c.k);
        exit(1);
    }
    for (uint32_t s = 0; s < shards; s++) {
        if (before[s] == after[s])
            continue;
        c.moved++;
        /* dying: only a lost worker's shard may move; joining: only to a new worker */
        bool allowed = die_ ? gone[before[s]] : after[s] >= N;
        c.moved_wrong += !allowed;
        per[die_ ? before[s] : after[s]]++;
    }
    for (uint32_t i = 0; i < total; i++)
        c.max_per_worker = per[i] > c.max_per_worker ? per[i] : c.max_per_worker;
    /* Each shard's owner is an independent uniform draw over the workers (rendezvous with a
     * good hash), so the moved count is Binomial(shards, p): p = k/N when k of N die, and
     * k/(N+k) when k join. The promise is at most 1/N per lost worker: k/N. */
    double p = die_ ? (double)c.k / N : (double)c.k / (N + c.k);
    c.expected = p;
    c.bound = (double)c.k / N + 4.0 * sqrt(p * (1 - p) / shards);
    c.ok = c.moved_wrong == 0 && (double)c.moved / shards <= c.bound;
    bw__membership_free(m);
    free(gone);
    free(before);
    free(after);
    free(per);
    return c;
}

/* ---- one scale point ---- */

static double file_size(const char *dir, const char *name)
{
    char path[1024];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return stat(path, &st) == 0 ? (double)st.st_size : 0;
}

static const phase *find_phase(const sim *S, const char *name)
{
    for (size_t i = 0; i < S->nph; i++)
        if (strcmp(S->ph[i].name, name) == 0)
            return &S->ph[i];
    return NULL;
}

/* Removes the state directory: its files (journal, snapshot, lock) and itself. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[1024];
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (unlink(path) != 0)
            fprintf(stderr, "bench_sim: cannot remove %s: %s\n", path, strerror(errno));
    }
    if (d)
        closedir(d);
    if (rmdir(dir) != 0)
        fprintf(stderr, "bench_sim: cannot remove %s: %s\n", dir, strerror(errno));
}

static bool run_point(uint32_t W, uint32_t R)
{
    sim *S = calloc(1, sizeof(*S));
    if (!S)
        die("sim", BW_NOMEM, "out of memory");
    S->W = W;
    S->R = R;
    S->world = opt.world && opt.world < R ? opt.world : R;
    S->njobs = (R + S->world - 1) / S->world;
    S->incarnation = calloc(W, sizeof(*S->incarnation));
    S->leases = calloc(R, sizeof(*S->leases));
    S->fingerprint = calloc(S->njobs, sizeof(*S->fingerprint));
    if (!S->incarnation || !S->leases || !S->fingerprint)
        die("sim", BW_NOMEM, "out of memory");
    snprintf(S->dir, sizeof(S->dir), "%s/bench_sim.XXXXXX", opt.state);
    if (!mkdtemp(S->dir)) {
        fprintf(stderr, "bench_sim: cannot make a state directory under %s: %s\n", opt.state,
                strerror(errno));
        exit(1);
    }
    S->coord.cfg = &S->cfg;
    printf("\n== %u workers, %u ranks (%u job%s of %u), state %s ==\n", W, R, S->njobs,
           S->njobs == 1 ? "" : "s", S->world, S->dir);
    printf("  %-34s %9s %9s %9s %9s %10s %10s %9s %9s\n", "operation", "timed", "stands for",
           "wall s", "CPU s", "CPU us/op", "CPU s all", "RSS MiB", "jB/op");
    fflush(stdout);
    double rss0 = proc_mib("VmRSS");
    bw_journal_report rep;
    open_state(S, &rep);
    new_members(S);
    uint64_t sample = opt.sample < R ? opt.sample : R;

    /* 1. W workers register */
    mark m = start(S);
    for (uint32_t i = 0; i < W; i++) {
        char err[512];
        S->incarnation[i] = bw__random_u64() | 1;
        int rc = register_worker(S->members, i, S->incarnation[i], err, sizeof(err));
        if (rc != BW_OK)
            die("register", rc, err);
    }
    S->last_round = now_s();
    finish(S, m, "register workers", W, W);
    m = start(S);
    create_jobs(S);
    finish(S, m, "create jobs", S->njobs, S->njobs);

    /* 2. R ranks join (journaled; durable at the end) */
    m = start(S);
    double rss_before_ranks = proc_mib("VmRSS");
    run_ops(S, join, R);
    sync_all(S);
    finish(S, m, "ranks join", R, R);
    double rss_after_ranks = proc_mib("VmRSS");

    /* 3. a heartbeat round: every rank's lease heartbeat, every worker's heartbeat */
    m = start(S);
    run_ops(S, lease_heartbeat, R);
    finish(S, m, "lease heartbeats (all ranks)", R, R);
    m = start(S);
    worker_round(S);
    finish(S, m, "worker heartbeats (all workers)", W, W);

    /* 4. every rank commits once (journaled; durable at the end) */
    m = start(S);
    run_ops(S, op_commit1, R);
    sync_all(S);
    finish(S, m, "cursor commits (all ranks)", R, R);

    /* 5. Placement.Get with the loader's 256 shards: the cost per call depends on W only, so
     * `sample` calls stand for all R ranks fetching it once */
    m = start(S);
    run_ops(S, op_placement, sample);
    finish(S, m, "Placement.Get calls (256 shards)", sample, R);

    /* 6. restart: replay the journal (no snapshot yet) */
    uint64_t jrecords_bytes = journal_bytes(S);
    bw__jobs_close(S->jobs);
    S->jobs = NULL;
    m = start(S);
    open_state(S, &rep);
    finish(S, m, "restart: replay journal", rep.records_replayed, rep.records_replayed);
    uint64_t replayed_records = rep.records_replayed;

    /* 7. compaction: the snapshot of R ranks (their leases and cursors) */
    m = start(S);
    char err[1024];
    int rc = bw__jobs_compact(S->jobs, 0, err, sizeof(err));
    if (rc != BW_OK)
        die("compact", rc, err);
    finish(S, m, "compaction (snapshot)", 1, 1);
    double snap_bytes = file_size(S->dir, "snapshot");

    /* 8. restart from the snapshot; the worker table is in memory only, so it starts empty */
    bw__jobs_close(S->jobs);
    S->jobs = NULL;
    bw__membership_free(S->members);
    m = start(S);
    open_state(S, &rep);
    new_members(S);
    finish(S, m, "restart: load snapshot", 1, 1);

    /* 9. the failover storm: every worker heartbeats (unknown) and registers again, every rank
     * heartbeats its lease (kept across the restart) and, as the placement version changed,
     * fetches the placement table; then every rank joins again (a trainer that lost its lease:
     * journaled) */
    m = start(S);
    for (uint32_t i = 0; i < W; i++)
        worker_beat(S, i);
    S->last_round = now_s();
    finish(S, m, "storm: workers register again", W, W);
    m = start(S);
    run_ops(S, lease_heartbeat, R);
    finish(S, m, "storm: lease heartbeats", R, R);
    m = start(S);
    run_ops(S, op_placement, sample);
    finish(S, m, "storm: Placement.Get calls", sample, R);
    m = start(S);
    run_ops(S, join, R);
    sync_all(S);
    finish(S, m, "storm: ranks join again", R, R);

    /* The size of one Placement.Get answer (the live workers and 256 owners): what every rank
     * downloads after a placement change. */
    size_t answer_bytes;
    {
        bw_arena a;
        bw__arena_init(&a, 0);
        Batchwire__V1__PlacementTable *t = NULL;
        uint64_t version = 0;
        uint32_t owners[LOADER_SHARDS];
        if (bw__jobs_placement_table(&S->coord, &a, &version, &t) != BW_OK || !t)
            die("placement table", BW_NOMEM, "out of memory");
        placement_get(S, &a, LOADER_SHARDS, owners);
        t->num_shards = LOADER_SHARDS;
        t->n_owners = LOADER_SHARDS;
        t->owners = owners;
        answer_bytes = batchwire__v1__placement_table__get_packed_size(t);
        bw__arena_reset(&a);
    }

    /* ---- report ---- */
    double hwm = proc_mib("VmHWM");
    double rank_kib = (rss_after_ranks - rss_before_ranks) * 1024.0 / R;
    printf("  memory: %.1f MiB RSS at start, %.1f MiB peak of the process so far; %.2f KiB per "
           "joined rank\n",
           rss0, hwm, rank_kib);
    printf("  journal: %.0f bytes for %" PRIu64 " records before compaction; snapshot %.0f "
           "bytes (%.0f per rank)\n",
           (double)jrecords_bytes, replayed_records, snap_bytes, snap_bytes / R);
    printf("  Placement.Get answer (%u workers, %d owners): %zu bytes; all ranks once: %.1f MiB\n",
           W, LOADER_SHARDS, answer_bytes, (double)answer_bytes * R / 1048576.0);
    printf("  worker heartbeat rounds carried by the phases: %" PRIu64 "\n", S->worker_rounds);
    /* Steady state at the defaults: each rank heartbeats every lease / 3 ms (the integer
     * JoinJob answers as heartbeat_ms), each worker every heartbeat interval (server/main.c). */
    const phase *lh = find_phase(S, "lease heartbeats (all ranks)");
    const phase *wh = find_phase(S, "worker heartbeats (all workers)");
    double lease_cores = lh->cpu / ((double)LEASE_BEAT_MS / 1000.0);
    double worker_cores = wh->cpu / (HEARTBEAT_MS / 1000.0);
    printf("  steady state at the defaults: lease heartbeats %.3f cores, worker heartbeats "
           "%.3f cores\n",
           lease_cores, worker_cores);

    /* JSON */
    printf("bench_sim {\"workers\":%u,\"ranks\":%u,\"jobs\":%u,\"world\":%u,\"rss_start_mib\":%.1f,"
           "\"rss_peak_mib\":%.1f,\"kib_per_rank\":%.3f,\"journal_bytes\":%" PRIu64
           ",\"journal_records\":%" PRIu64 ",\"snapshot_bytes\":%.0f,\"lease_hb_cores\":%.4f,"
           "\"worker_hb_cores\":%.4f,\"placement_answer_bytes\":%zu,\"phases\":[",
           W, R, S->njobs, S->world, rss0, hwm, rank_kib, jrecords_bytes, replayed_records,
           snap_bytes, lease_cores, worker_cores, answer_bytes);
    for (size_t i = 0; i < S->nph; i++) {
        const phase *q = &S->ph[i];
        printf("%s{\"name\":\"%s\",\"ops\":%" PRIu64 ",\"stands_for\":%" PRIu64
               ",\"wall_s\":%.4f,\"cpu_s\":%.4f,\"cpu_us_per_op\":%.3f,\"rss_mib\":%.1f,"
               "\"journal_bytes\":%" PRIu64 "}",
               i ? "," : "", q->name, q->ops, q->total, q->wall, q->cpu,
               q->ops ? q->cpu / (double)q->ops * 1e6 : 0, q->rss, q->jbytes);
    }
    printf("]}\n");
    fflush(stdout);

    bw__jobs_close(S->jobs);
    bw__membership_free(S->members);
    bw__owner_cache_free(S->coord.owners);
    S->coord.owners = NULL;
    remove_dir(S->dir);
    free(S->incarnation);
    free(S->leases);
    free(S->fingerprint);
    free(S);
    return true;
}

/* ---- main ---- */

int main(int argc, char **argv)
{
    if (bw__version_flag(argc, argv, "bench_sim"))
        return 0;
    snprintf(opt.state, sizeof(opt.state), "/var/tmp");
    const char *points = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            opt.quick = true;
        } else if (strcmp(a, "--log-info") == 0) {
            opt.log_info = true;
        } else if (!v) {
            usage();
        } else if (strcmp(a, "--points") == 0) {
            points = v, i++;
        } else if (strcmp(a, "--world") == 0) {
            opt.world = parse_u32("--world", v, 1, 1048576), i++;
        } else if (strcmp(a, "--shards") == 0) {
            opt.shards = parse_u32("--shards", v, 1, 1u << 24), i++;
        } else if (strcmp(a, "--sample") == 0) {
            opt.sample = parse_u32("--sample", v, 1, 1000000), i++;
        } else if (strcmp(a, "--state") == 0) {
            snprintf(opt.state, sizeof(opt.state), "%s", v), i++;
        } else {
            usage();
        }
    }
    /* --quick (the ctest bench/sim_quick): small enough for the sanitizer build on 2 busy
     * cores, with enough shards that the churn bound stays tight (4 sigma is 0.003 at p = 0.01). */
    if (!opt.shards)
        opt.shards = opt.quick ? 16384 : 65536;
    if (!opt.sample)
        opt.sample = opt.quick ? 100 : 2000;
    parse_points(points      ? points
                 : opt.quick ? "10:1000,100:3000"
                             : "10:1000,100:10000,1000:100000");
    /* The coordinator logs every join at INFO; by default only warnings (marked-dead workers)
     * reach stderr, so that the figures are the coordinator's work, not the terminal's. */
    bw__log_to_stderr("coordinator", opt.log_info ? BW_LOG_INFO : BW_LOG_WARN);
    printf("bench_sim: batchwire %s; %s; state under %s\n", bw_version(),
           opt.world ? "jobs of --world ranks" : "one job per point", opt.state);

    bool ok = true;
    for (size_t i = 0; i < opt.npoints; i++)
        ok &= run_point(opt.workers[i], opt.ranks[i]);

    /* Placement churn at each point's worker count: 1 % die, 1 % join. */
    printf("\n== placement churn: %u shards; rendezvous promise: k of N lost move k/N of the "
           "shards, none between survivors ==\n",
           opt.shards);
    printf("  %-6s %6s %4s %9s %9s %9s %9s %12s %10s %8s %8s %s\n", "event", "N", "k", "moved",
           "fraction", "expected", "bound", "wrong moves", "max/worker", "load max", "used/256",
           "check");
    for (size_t i = 0; i < opt.npoints; i++)
        for (int d = 1; d >= 0; d--) {
            churn c = measure_churn(opt.workers[i], opt.shards, d);
            double frac = (double)c.moved / c.shards;
            printf("  %-6s %6u %4u %9" PRIu64 " %9.5f %9.5f %9.5f %12" PRIu64 " %10" PRIu64
                   " %8.2f %8u %s\n",
                   d ? "die" : "join", c.n, c.k, c.moved, frac, c.expected, c.bound, c.moved_wrong,
                   c.max_per_worker, c.max_load_ratio, c.used256, c.ok ? "ok" : "FAILED");
            printf(
                "bench_sim_churn {\"event\":\"%s\",\"workers\":%u,\"k\":%u,\"shards\":%u,"
                "\"moved\":%" PRIu64 ",\"fraction\":%.6f,\"expected\":%.6f,\"bound\":%.6f,"
                "\"wrong_moves\":%" PRIu64 ",\"max_per_worker\":%" PRIu64
                ",\"load_max_ratio\":%.3f,\"workers_used_256\":%u,\"owner_ms\":%.2f,\"ok\":%s}\n",
                d ? "die" : "join", c.n, c.k, c.shards, c.moved, frac, c.expected, c.bound,
                c.moved_wrong, c.max_per_worker, c.max_load_ratio, c.used256, c.wall_ms,
                c.ok ? "true" : "false");
            ok &= c.ok;
        }
    printf("\nbench_sim: %s\n", ok ? "every churn check held" : "a churn check FAILED");
    return ok ? 0 : 1;
}
