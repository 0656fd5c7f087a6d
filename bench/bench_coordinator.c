/*
 * Coordinator benchmark: starts build/bin/batchwire-coordinator on a fresh state directory
 * (under /var/tmp: a real disk, not tmpfs) and measures, over gRPC on loopback,
 * Phases 1 and 2 run three times: over unary calls (the baseline), with each rank's commits or
 * heartbeats as messages on a Jobs.Session stream of its own, as a Loader sends them, and over
 * the coordinator's commit channel (--commit-listen: the same SessionRequest in framed plain
 * TCP; server/commit_channel.h). Phase 1 opens a channel connection per trainer. Phase 2's
 * ranks share --connections channel connections (64 by default), as a trainer process with
 * many ranks could: the channel's hello only authenticates the connection and every frame
 * names its own job, rank and lease (docs/operating.md, "Commit channel"), so nothing binds a
 * rank to a connection, and 10,000 connections would measure sockets, not heartbeats.
 *   1. acknowledged CommitCursor calls per second (each acknowledged only after fdatasync;
 *      concurrent commits share one fsync) with 1 and with T concurrent trainers. Every
 *      trainer is a rank of its own with its own lease and keeps exactly one commit
 *      outstanding; by default each has its own connection (--connections). The client
 *      drives them asynchronously on --client-threads completion queues, so that the client
 *      costs little of the machine it shares with the coordinator;
 *   2. the time for --ranks ranks (default 10,000) to join one job (--join-window joins
 *      outstanding at a time), then those ranks heartbeating at the interval the coordinator
 *      asks for (a third of the lease: 3,333 ms at --lease-ms 10000, longer when the ranks
 *      would pass --max-heartbeats-per-second, docs/operating.md "Leases at scale";
 *      --max-heartbeats passes it, 0 turns it off) for --seconds, with the coordinator's CPU
 *      time over that window (from /proc/PID/stat), failed heartbeats and lapsed leases;
 *   3. how long `batchwire status` (--bin/batchwire) and one scrape of /metrics take with
 *      those ranks held.
 * Each phase also reports the coordinator's CPU time per operation.
 *
 * Usage: bench_coordinator [--bin DIR] [--state DIR] [--threads T] [--commit-seconds S]
 *                          [--connections C] [--client-threads K] [--coord-threads N]
 *                          [--ranks N] [--seconds S] [--lease-ms MS] [--join-window W]
 *                          [--max-heartbeats N] [--skip-single 1]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>

#include "batchwire/batchwire.h"
#include "common/util.h"
#include "common/version.h"
#include "cursor/cursor.h"
#include "rpc/dchan.h"
#include "rpc/methods.h"
#include "rpc/server.h"

static char bin_dir[1024] = "build/bin";
static char state_dir[1024] = "";
static int threads = 64, commit_seconds = 5, nranks = 10000, hb_seconds = 10, lease_ms = 10000;
static int max_heartbeats =
    -1; /* --max-heartbeats-per-second for the coordinator; -1: its default */
static int connections = 0, client_threads = 1, coord_threads = 2, join_window = 1024;
static int skip_single = 0;
static char addr[256];
static char cchan_addr[64]; /* the commit channel's */
static int metrics_port;
static pid_t coord_pid;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The coordinator's user + system CPU seconds so far (/proc/PID/stat fields 14 and 15). */
static double coord_cpu_s(void)
{
    char path[64], buf[2048];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)coord_pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    /* After the command (which may hold spaces and parentheses): fields 3, 4, ...; utime and
     * stime are fields 14 and 15. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p++;
    unsigned long long v[2] = {0, 0};
    for (int field = 3; field <= 15; field++) {
        while (*p == ' ')
            p++;
        char *end = p;
        if (field >= 14)
            v[field - 14] = strtoull(p, &end, 10);
        else
            while (*end && *end != ' ')
                end++;
        if (end == p)
            return 0;
        p = end;
    }
    return (double)(v[0] + v[1]) / (double)sysconf(_SC_CLK_TCK);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        abort();
    close(fd);
    return ntohs(a.sin_port);
}

/* Stops the coordinator this run started, also when a phase gives up with exit(1): else it
 * would outlive the bench, and a pipe on the bench's output would never end. */
static void stop_coordinator(void)
{
    if (coord_pid > 0) {
        kill(coord_pid, SIGTERM);
        waitpid(coord_pid, NULL, 0);
        coord_pid = 0;
    }
}

static pid_t start_coordinator(void)
{
    int fds[2];
    if (pipe(fds) != 0)
        abort();
    metrics_port = free_port();
    snprintf(cchan_addr, sizeof(cchan_addr), "127.0.0.1:%d", free_port());
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        char exe[1100], lease[32], th[32], metrics[64], maxhb[32];
        snprintf(exe, sizeof(exe), "%s/batchwire-coordinator", bin_dir);
        snprintf(lease, sizeof(lease), "%d", lease_ms);
        snprintf(th, sizeof(th), "%d", coord_threads);
        snprintf(metrics, sizeof(metrics), "127.0.0.1:%d", metrics_port);
        snprintf(maxhb, sizeof(maxhb), "%d", max_heartbeats);
        execl(exe, exe, "--listen", "127.0.0.1:0", "--state-dir", state_dir, "--lease-ms", lease,
              "--threads", th, "--max-world-size", "100000", "--metrics-listen", metrics,
              "--commit-listen", cchan_addr,
              max_heartbeats >= 0 ? "--max-heartbeats-per-second" : (char *)NULL, maxhb,
              (char *)NULL);
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

/* calloc that aborts when memory runs out (a benchmark has nothing better to do). */
static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p)
        abort();
    return p;
}

/* ---- asynchronous unary calls on completion queues ---- */

/* One connection of its own (a local subchannel pool: channels with the same arguments would
 * otherwise share one TCP connection), with every method registered once. */
typedef struct conn {
    grpc_channel *ch;
    void *methods[BW_M__COUNT];
} conn;

static conn *conn_open(void)
{
    conn *c = xcalloc(1, sizeof(*c));
    grpc_arg a[1];
    a[0].type = GRPC_ARG_INTEGER;
    a[0].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    a[0].value.integer = 1;
    grpc_channel_args args = {1, a};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    c->ch = grpc_channel_create(addr, creds, &args);
    grpc_channel_credentials_release(creds);
    for (int m = 0; m < BW_M__COUNT; m++)
        c->methods[m] = grpc_channel_register_call(c->ch, bw__methods[m].path, NULL, NULL);
    return c;
}

static void conn_close(conn *c)
{
    grpc_channel_destroy(c->ch);
    free(c);
}

/* One call in flight; the tag of its batch is the slot itself. */
typedef struct slot {
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    grpc_metadata_array imd, tmd;
    grpc_status_code status;
    grpc_slice details;
    grpc_op ops[6];
    bw_method_id method;
    double t0;
    void *owner;
    bool streamed; /* a message on the owner's Jobs.Session stream, not a call of its own */
} slot;

static void slot_start(slot *s, conn *c, grpc_completion_queue *cq, bw_method_id m,
                       const ProtobufCMessage *req, int timeout_ms)
{
    if (!c) {
        fprintf(stderr, "bench: a %s call without a connection\n", bw__methods[m].name);
        exit(1);
    }
    size_t len = protobuf_c_message_get_packed_size(req);
    grpc_slice sl = grpc_slice_malloc(len);
    protobuf_c_message_pack(req, GRPC_SLICE_START_PTR(sl));
    s->send = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    s->recv = NULL;
    s->method = m;
    s->streamed = false;
    grpc_metadata_array_init(&s->imd);
    grpc_metadata_array_init(&s->tmd);
    s->details = grpc_empty_slice();
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    s->call = grpc_channel_create_registered_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                                  c->methods[m], deadline, NULL);
    memset(s->ops, 0, sizeof(s->ops));
    s->ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    s->ops[1].op = GRPC_OP_SEND_MESSAGE;
    s->ops[1].data.send_message.send_message = s->send;
    s->ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    s->ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    s->ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->imd;
    s->ops[4].op = GRPC_OP_RECV_MESSAGE;
    s->ops[4].data.recv_message.recv_message = &s->recv;
    s->ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    s->ops[5].data.recv_status_on_client.trailing_metadata = &s->tmd;
    s->ops[5].data.recv_status_on_client.status = &s->status;
    s->ops[5].data.recv_status_on_client.status_details = &s->details;
    s->t0 = now_s();
    if (grpc_call_start_batch(s->call, s->ops, 6, s, NULL) != GRPC_CALL_OK) {
        fprintf(stderr, "bench: cannot start a %s call\n", bw__methods[m].name);
        exit(1);
    }
}

/* ---- the same requests as messages on a Jobs.Session stream (docs/architecture.md) ----
 *
 * One stream per rank, as a Loader's session keeps one, opened on its first message on the
 * completion queue of the thread that drives it; one message outstanding, as a trainer's
 * commits are. */

typedef struct stream {
    grpc_call *call;
    bool started; /* initial metadata sent and asked for */
    uint64_t id;
} stream;

static void slot_start_msg(slot *s, stream *st, conn *c, grpc_completion_queue *cq, bw_method_id m,
                           const ProtobufCMessage *req)
{
    Batchwire__V1__SessionRequest sr = BATCHWIRE__V1__SESSION_REQUEST__INIT;
    sr.id = ++st->id;
    if (m == BW_M_JOBS_COMMIT_CURSOR) {
        sr.op_case = BATCHWIRE__V1__SESSION_REQUEST__OP_COMMIT;
        sr.commit = (Batchwire__V1__CommitCursorRequest *)req;
    } else {
        sr.op_case = BATCHWIRE__V1__SESSION_REQUEST__OP_HEARTBEAT;
        sr.heartbeat = (Batchwire__V1__LeaseHeartbeatRequest *)req;
    }
    if (!st->call)
        st->call = grpc_channel_create_registered_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                                       c->methods[BW_M_JOBS_SESSION],
                                                       gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    size_t len = protobuf_c_message_get_packed_size(&sr.base);
    grpc_slice sl = grpc_slice_malloc(len);
    protobuf_c_message_pack(&sr.base, GRPC_SLICE_START_PTR(sl));
    s->send = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    s->recv = NULL;
    s->method = m;
    s->streamed = true;
    s->call = st->call;
    grpc_metadata_array_init(&s->imd);
    grpc_metadata_array_init(&s->tmd);
    s->details = grpc_empty_slice();
    memset(s->ops, 0, sizeof(s->ops));
    size_t n = 0;
    if (!st->started)
        s->ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    s->ops[n].op = GRPC_OP_SEND_MESSAGE;
    s->ops[n++].data.send_message.send_message = s->send;
    if (!st->started) {
        s->ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        s->ops[n++].data.recv_initial_metadata.recv_initial_metadata = &s->imd;
    }
    s->ops[n].op = GRPC_OP_RECV_MESSAGE;
    s->ops[n++].data.recv_message.recv_message = &s->recv;
    st->started = true;
    s->t0 = now_s();
    if (grpc_call_start_batch(s->call, s->ops, n, s, NULL) != GRPC_CALL_OK) {
        fprintf(stderr, "bench: cannot send a %s message on the stream\n", bw__methods[m].name);
        exit(1);
    }
}

/* Half-closes the streams of agents[0..n) (the agent's slot is its tag) and waits for their
 * status on cq. */
static void streams_close(slot *const *slots, stream *const *sts, size_t n,
                          grpc_completion_queue *cq)
{
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        slot *s = slots[i];
        if (!sts[i]->call)
            continue;
        s->call = sts[i]->call;
        s->details = grpc_empty_slice();
        grpc_metadata_array_init(&s->tmd);
        memset(s->ops, 0, sizeof(s->ops));
        s->ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        s->ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        s->ops[1].data.recv_status_on_client.trailing_metadata = &s->tmd;
        s->ops[1].data.recv_status_on_client.status = &s->status;
        s->ops[1].data.recv_status_on_client.status_details = &s->details;
        if (grpc_call_start_batch(s->call, s->ops, 2, s, NULL) == GRPC_CALL_OK)
            out++;
    }
    while (out > 0) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            break;
        out--;
    }
    for (size_t i = 0; i < n; i++) {
        if (!sts[i]->call)
            continue;
        slot *s = slots[i];
        if (s->status != GRPC_STATUS_OK) {
            char *d = grpc_slice_to_c_string(s->details);
            fprintf(stderr, "bench: a Jobs.Session stream ended with status %d: %s\n",
                    (int)s->status, d);
            gpr_free(d);
        }
        grpc_slice_unref(s->details);
        grpc_metadata_array_destroy(&s->tmd);
        grpc_call_unref(sts[i]->call);
        memset(sts[i], 0, sizeof(*sts[i]));
    }
}

/* After the slot's batch completed: the response unpacked (protobuf-c's allocator; free with
 * protobuf_c_message_free_unpacked) when the call succeeded and want is set, and the status. */
static grpc_status_code slot_end(slot *s, bool want, ProtobufCMessage **resp, char *err,
                                 size_t errlen)
{
    if (resp)
        *resp = NULL;
    if (s->streamed) {
        /* The message's answer: its own error, or none (the stream stays open). */
        s->streamed = false;
        grpc_status_code st = GRPC_STATUS_OK;
        Batchwire__V1__SessionResponse *r = NULL;
        if (s->recv) {
            grpc_byte_buffer_reader rd;
            grpc_byte_buffer_reader_init(&rd, s->recv);
            grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
            grpc_byte_buffer_reader_destroy(&rd);
            r = batchwire__v1__session_response__unpack(NULL, GRPC_SLICE_LENGTH(all),
                                                        GRPC_SLICE_START_PTR(all));
            grpc_slice_unref(all);
            grpc_byte_buffer_destroy(s->recv);
        }
        if (!r) {
            snprintf(err, errlen, "%s: the stream ended or answered garbage",
                     bw__methods[s->method].name);
            st = GRPC_STATUS_UNAVAILABLE;
        } else if (r->error_code && r->error_code[0]) {
            snprintf(err, errlen, "%s: %s: %s", bw__methods[s->method].name, r->error_code,
                     r->error_message);
            st = GRPC_STATUS_UNKNOWN;
        }
        if (r)
            batchwire__v1__session_response__free_unpacked(r, NULL);
        (void)want;
        grpc_byte_buffer_destroy(s->send);
        grpc_slice_unref(s->details);
        grpc_metadata_array_destroy(&s->imd);
        grpc_metadata_array_destroy(&s->tmd);
        s->call = NULL; /* the stream's */
        return st;
    }
    grpc_status_code st = s->status;
    if (st != GRPC_STATUS_OK) {
        char *d = grpc_slice_to_c_string(s->details);
        snprintf(err, errlen, "%s: status %d: %s", bw__methods[s->method].name, (int)st, d);
        gpr_free(d);
    } else if (want && s->recv) {
        grpc_byte_buffer_reader r;
        grpc_byte_buffer_reader_init(&r, s->recv);
        grpc_slice all = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
        *resp = protobuf_c_message_unpack(bw__methods[s->method].response, NULL,
                                          GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
        grpc_slice_unref(all);
    }
    if (s->recv)
        grpc_byte_buffer_destroy(s->recv);
    grpc_byte_buffer_destroy(s->send);
    grpc_slice_unref(s->details);
    grpc_metadata_array_destroy(&s->imd);
    grpc_metadata_array_destroy(&s->tmd);
    grpc_call_unref(s->call);
    s->call = NULL;
    return st;
}

/* The next event of cq, waiting at most until `until` (monotonic seconds); NULL on timeout. */
static slot *next_event(grpc_completion_queue *cq, double until)
{
    double left = until - now_s();
    gpr_timespec d =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_from_micros(left > 0 ? (int64_t)(left * 1e6) : 0, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_next(cq, d, NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        return NULL;
    return ev.tag;
}

static void drain_cq(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Latencies (seconds), appended as calls complete, sorted for quantiles. */
typedef struct lats {
    double *v;
    size_t n, cap;
} lats;

static void lats_add(lats *l, double x)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 1024;
        l->v = realloc(l->v, l->cap * sizeof(double));
        if (!l->v)
            abort();
    }
    l->v[l->n++] = x;
}

/* Appends `from` to `into` and frees it. */
static void lats_take(lats *into, lats *from)
{
    for (size_t i = 0; i < from->n; i++)
        lats_add(into, from->v[i]);
    free(from->v);
    memset(from, 0, sizeof(*from));
}

/* The q-quantile (0 <= q < 1) in milliseconds, after sorting; 0 when empty. */
static double lats_ms(lats *l, double q)
{
    if (!l->n)
        return 0;
    qsort(l->v, l->n, sizeof(double), cmp_double);
    return l->v[(size_t)(q * (double)l->n)] * 1e3;
}

/* ---- a job and its ranks ---- */

static uint64_t create(conn *c, const char *name, uint32_t world)
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
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    slot s;
    slot_start(&s, c, cq, BW_M_JOBS_GET_OR_CREATE, &req.base, 30000);
    next_event(cq, now_s() + 60);
    char err[1024];
    ProtobufCMessage *resp;
    if (slot_end(&s, true, &resp, err, sizeof(err)) != GRPC_STATUS_OK || !resp) {
        fprintf(stderr, "bench: GetOrCreateJob: %s\n", err);
        exit(1);
    }
    uint64_t fp = ((Batchwire__V1__GetOrCreateJobResponse *)resp)->job->fingerprint;
    protobuf_c_message_free_unpacked(resp, NULL);
    drain_cq(cq);
    return fp;
}

/* A rank: its lease once joined, and its own progress. */
typedef struct rank_agent {
    slot s;
    conn *c;
    uint32_t rank;
    uint64_t lease_lo, lease_hi;
    uint32_t hb_ms;
    uint64_t step;
    bool busy;
    lats lat;  /* commits */
    stream st; /* Jobs.Session, when the phase runs over streams */
    int cfd;   /* its commit-channel connection, when the phase runs over it */
    uint8_t cin[4096];
    size_t cin_len;
    double ct0;
} rank_agent;

/* Closes the Jobs.Session streams of ranks[first .. first + count) on cq. */
static void close_rank_streams(rank_agent *ranks, size_t first, size_t count,
                               grpc_completion_queue *cq)
{
    slot **slots = calloc(count ? count : 1, sizeof(*slots));
    stream **sts = calloc(count ? count : 1, sizeof(*sts));
    if (!slots || !sts)
        abort();
    for (size_t i = 0; i < count; i++) {
        slots[i] = &ranks[first + i].s;
        sts[i] = &ranks[first + i].st;
    }
    streams_close(slots, sts, count, cq);
    free(slots);
    free(sts);
}

static void start_join(rank_agent *a, grpc_completion_queue *cq, const char *job, uint32_t world)
{
    Batchwire__V1__Holder h = BATCHWIRE__V1__HOLDER__INIT;
    h.host = "bench";
    h.pid = 100000 + a->rank;
    Batchwire__V1__JoinJobRequest req = BATCHWIRE__V1__JOIN_JOB_REQUEST__INIT;
    req.job = (char *)job;
    req.rank = a->rank;
    req.world_size = world;
    req.holder = &h;
    a->s.owner = a;
    a->busy = true;
    slot_start(&a->s, a->c, cq, BW_M_JOBS_JOIN, &req.base, 60000);
}

static void end_join(rank_agent *a)
{
    char err[1024];
    ProtobufCMessage *resp;
    a->busy = false;
    if (slot_end(&a->s, true, &resp, err, sizeof(err)) != GRPC_STATUS_OK || !resp) {
        fprintf(stderr, "bench: JoinJob of rank %u: %s\n", a->rank, err);
        exit(1);
    }
    const Batchwire__V1__JoinJobResponse *j = (const void *)resp;
    a->lease_lo = j->lease_id;
    a->lease_hi = j->lease_id_hi;
    a->hb_ms = j->heartbeat_ms;
    protobuf_c_message_free_unpacked(resp, NULL);
}

/* Joins ranks[0..n) with at most `window` joins outstanding, driven from this thread. */
static void join_all(rank_agent *ranks, size_t n, const char *job, uint32_t world, int window)
{
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    size_t next = 0, done = 0;
    int out = 0;
    while (done < n) {
        while (out < window && next < n) {
            start_join(&ranks[next++], cq, job, world);
            out++;
        }
        slot *s = next_event(cq, now_s() + 60);
        if (!s) {
            fprintf(stderr, "bench: a join took over a minute\n");
            exit(1);
        }
        end_join(s->owner);
        out--;
        done++;
    }
    drain_cq(cq);
}

static void fsyncs(double *count, double *sum);
static double self_cpu_s(void);

/* ---- 1. commits ---- */

enum { VIA_UNARY, VIA_STREAM, VIA_CCHAN };
static const char *const via_name[] = {"unary calls", "a Jobs.Session stream each",
                                       "the commit channel, a connection each"};

typedef struct commit_ctx {
    const char *job;
    uint64_t fingerprint;
    uint32_t world;
    rank_agent *ranks;
    size_t first, count; /* this thread's ranks */
    double until;
    uint64_t done, failed;
    int via; /* VIA_UNARY, VIA_STREAM, VIA_CCHAN */
    double t_end, cpu_end,
        me_end; /* when its last commit was answered (before the streams close) */
} commit_ctx;

/* Sends m as one SESSION frame on a commit-channel connection. */
static void cchan_send(int fd, Batchwire__V1__SessionRequest *m)
{
    uint8_t frame[1024];
    size_t n = protobuf_c_message_get_packed_size(&m->base);
    if (n + BW_DCHAN_REQ_HEADER > sizeof(frame))
        abort();
    bw__dchan_put_req_header(frame, BW_DCHAN_KIND_SESSION, n);
    protobuf_c_message_pack(&m->base, frame + BW_DCHAN_REQ_HEADER);
    if (send(fd, frame, n + BW_DCHAN_REQ_HEADER, MSG_NOSIGNAL) !=
        (ssize_t)(n + BW_DCHAN_REQ_HEADER)) {
        fprintf(stderr, "bench: commit channel send: %s\n", strerror(errno));
        exit(1);
    }
}

/* Appends what fd has to buf (*len of cap bytes held); exits if the connection closed. */
static void cchan_recv(int fd, uint8_t *buf, size_t cap, size_t *len)
{
    ssize_t r = recv(fd, buf + *len, cap - *len, 0);
    if (r <= 0) {
        fprintf(stderr, "bench: commit channel connection: %s\n",
                r == 0 ? "closed" : strerror(errno));
        exit(1);
    }
    *len += (size_t)r;
}

/* Takes the first whole ANSWER frame out of buf: *resp its SessionResponse (NULL: none could be
 * decoded); false when no whole frame is held yet. Exits on another frame type. */
static bool cchan_take(uint8_t *buf, size_t cap, size_t *len, Batchwire__V1__SessionResponse **resp)
{
    if (*len < BW_DCHAN_FRAME_HEADER)
        return false;
    bw_dchan_frame f;
    bw__dchan_get_frame(buf, &f);
    size_t whole = BW_DCHAN_FRAME_HEADER + (size_t)f.a;
    if (f.a > cap - BW_DCHAN_FRAME_HEADER || f.type != BW_DCHAN_ANSWER) {
        fprintf(stderr, "bench: commit channel: frame type %u code %d\n", f.type, (int)f.code);
        exit(1);
    }
    if (*len < whole)
        return false;
    *resp = batchwire__v1__session_response__unpack(NULL, (size_t)f.a, buf + BW_DCHAN_FRAME_HEADER);
    memmove(buf, buf + whole, *len - whole);
    *len -= whole;
    return true;
}

static void start_commit(commit_ctx *x, rank_agent *a, grpc_completion_queue *cq)
{
    Batchwire__V1__Cursor cur = BATCHWIRE__V1__CURSOR__INIT;
    cur.job = (char *)x->job;
    cur.job_fingerprint = x->fingerprint;
    cur.rank = a->rank;
    cur.world_size = x->world;
    cur.step = ++a->step;
    size_t len;
    uint8_t *bin = bw__cursor_encode(&cur, &len);
    Batchwire__V1__CommitCursorRequest req = BATCHWIRE__V1__COMMIT_CURSOR_REQUEST__INIT;
    req.job = (char *)x->job;
    req.rank = a->rank;
    req.lease_id = a->lease_lo;
    req.lease_id_hi = a->lease_hi;
    req.cursor.data = bin;
    req.cursor.len = len;
    a->s.owner = a;
    a->busy = true;
    if (x->via == VIA_CCHAN) {
        Batchwire__V1__SessionRequest m = BATCHWIRE__V1__SESSION_REQUEST__INIT;
        m.id = a->step;
        m.op_case = BATCHWIRE__V1__SESSION_REQUEST__OP_COMMIT;
        m.commit = &req;
        a->ct0 = now_s();
        cchan_send(a->cfd, &m);
    } else if (x->via == VIA_STREAM)
        slot_start_msg(&a->s, &a->st, a->c, cq, BW_M_JOBS_COMMIT_CURSOR, &req.base);
    else
        slot_start(&a->s, a->c, cq, BW_M_JOBS_COMMIT_CURSOR, &req.base, 10000);
    free(bin);
}

/* The commit channel's answers on a's connection: reads what is there and handles each whole
 * ANSWER frame (a trainer has one outstanding). Returns the answers handled. */
static int cchan_answers(commit_ctx *x, rank_agent *a)
{
    cchan_recv(a->cfd, a->cin, sizeof(a->cin), &a->cin_len);
    int handled = 0;
    Batchwire__V1__SessionResponse *resp;
    while (cchan_take(a->cin, sizeof(a->cin), &a->cin_len, &resp)) {
        if (!resp || (resp->error_code && resp->error_code[0])) {
            fprintf(stderr, "bench: CommitCursor of rank %u on the commit channel: %s\n", a->rank,
                    resp ? resp->error_message : "no SessionResponse");
            x->failed++;
        } else {
            x->done++;
            lats_add(&a->lat, now_s() - a->ct0);
        }
        if (resp)
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        handled++;
    }
    return handled;
}

/* Phase 1 over the commit channel: one epoll over this thread's ranks' connections. */
static void commit_thread_cchan(commit_ctx *x)
{
    int ep = epoll_create1(0);
    for (size_t i = 0; i < x->count; i++) {
        rank_agent *a = &x->ranks[x->first + i];
        struct epoll_event ev = {EPOLLIN, {.ptr = a}};
        if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, a->cfd, &ev) != 0)
            abort();
        start_commit(x, a, NULL);
    }
    size_t out = x->count;
    struct epoll_event evs[256];
    while (out > 0) {
        int n = epoll_wait(ep, evs, 256, 30000);
        if (n <= 0) {
            fprintf(stderr, "bench: a commit on the commit channel took over 30 s\n");
            exit(1);
        }
        for (int i = 0; i < n; i++) {
            rank_agent *a = evs[i].data.ptr;
            if (cchan_answers(x, a) == 0)
                continue;
            if (now_s() < x->until)
                start_commit(x, a, NULL);
            else
                out--;
        }
    }
    x->t_end = now_s();
    x->cpu_end = coord_cpu_s();
    x->me_end = self_cpu_s();
    close(ep);
}

/* A commit-channel connection, its hello answered (an open coordinator: no token); i names it
 * in an error. */
static int cchan_open(uint32_t i)
{
    char err[512] = "";
    int fd = -1;
    uint8_t h[BW_DCHAN_REQ_HEADER], f[BW_DCHAN_FRAME_HEADER];
    bw__dchan_put_req_header(h, BW_DCHAN_KIND_AUTH, 0);
    if (bw__sock_connect(cchan_addr, 5000, &fd, err, sizeof(err)) != BW_OK ||
        send(fd, h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h) ||
        bw__sock_read_all(fd, f, sizeof(f), 0, NULL, err, sizeof(err)) != BW_OK ||
        f[0] != BW_DCHAN_END) {
        fprintf(stderr, "bench: commit channel %s: hello of connection %u failed: %s\n", cchan_addr,
                i, err);
        exit(1);
    }
    return fd;
}

/* A commit-channel connection for each rank. */
static void cchan_connect(rank_agent *ranks, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        ranks[i].cfd = cchan_open(i);
}

static void *commit_thread(void *arg)
{
    commit_ctx *x = arg;
    if (x->via == VIA_CCHAN) {
        commit_thread_cchan(x);
        return NULL;
    }
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    for (size_t i = 0; i < x->count; i++)
        start_commit(x, &x->ranks[x->first + i], cq);
    size_t out = x->count;
    while (out > 0) {
        slot *s = next_event(cq, now_s() + 30);
        if (!s) {
            fprintf(stderr, "bench: a commit took over 30 s\n");
            exit(1);
        }
        rank_agent *a = s->owner;
        double dt = now_s() - s->t0;
        char err[1024];
        a->busy = false;
        if (slot_end(s, false, NULL, err, sizeof(err)) != GRPC_STATUS_OK) {
            fprintf(stderr, "bench: CommitCursor of rank %u: %s\n", a->rank, err);
            x->failed++;
        } else {
            x->done++;
            lats_add(&a->lat, dt);
        }
        if (now_s() < x->until)
            start_commit(x, a, cq);
        else
            out--;
    }
    x->t_end = now_s();
    x->cpu_end = coord_cpu_s();
    x->me_end = self_cpu_s();
    close_rank_streams(x->ranks, x->first, x->count, cq);
    drain_cq(cq);
    return NULL;
}

static void bench_commits(uint32_t world, int via)
{
    int nconn = connections > 0 ? connections : (int)world;
    if (nconn > (int)world)
        nconn = (int)world;
    if (nconn < 1)
        nconn = 1;
    conn **cs = xcalloc((size_t)nconn, sizeof(*cs));
    for (int i = 0; i < nconn; i++)
        cs[i] = conn_open();
    char job[32];
    snprintf(job, sizeof(job), "commits-%u-%s", world,
             via == VIA_CCHAN    ? "cchan"
             : via == VIA_STREAM ? "stream"
                                 : "unary");
    uint64_t fp = create(cs[0], job, world);
    rank_agent *ranks = xcalloc(world, sizeof(*ranks));
    for (uint32_t i = 0; i < world; i++) {
        ranks[i].rank = i;
        ranks[i].c = cs[i % (uint32_t)nconn];
    }
    join_all(ranks, world, job, world, 64);
    if (via == VIA_CCHAN)
        cchan_connect(ranks, world);
    int k = client_threads < (int)world ? client_threads : (int)world;
    commit_ctx *xs = xcalloc((size_t)k, sizeof(*xs));
    pthread_t *ts = xcalloc((size_t)k, sizeof(*ts));
    double fc0, fs0;
    fsyncs(&fc0, &fs0);
    double cpu0 = coord_cpu_s(), me0 = self_cpu_s(), t0 = now_s();
    for (int i = 0; i < k; i++) {
        size_t per = world / (size_t)k, first = per * (size_t)i;
        xs[i] = (commit_ctx){.job = job,
                             .fingerprint = fp,
                             .world = world,
                             .ranks = ranks,
                             .first = first,
                             .count = i == k - 1 ? world - first : per,
                             .until = t0 + commit_seconds,
                             .via = via};
        pthread_create(&ts[i], NULL, commit_thread, &xs[i]);
    }
    uint64_t total = 0, failed = 0;
    double t1 = t0, cpu1 = cpu0, me1 = me0; /* at the last answer, before the streams close */
    for (int i = 0; i < k; i++) {
        pthread_join(ts[i], NULL);
        total += xs[i].done;
        failed += xs[i].failed;
        if (xs[i].t_end > t1) {
            t1 = xs[i].t_end;
            cpu1 = xs[i].cpu_end;
            me1 = xs[i].me_end;
        }
    }
    double el = t1 - t0, cpu = cpu1 - cpu0, me = me1 - me0;
    double fc1, fs1;
    fsyncs(&fc1, &fs1);
    lats all = {0};
    for (uint32_t i = 0; i < world; i++)
        lats_take(&all, &ranks[i].lat);
    double p50 = lats_ms(&all, 0.5), p99 = lats_ms(&all, 0.99);
    double pmax = all.n ? all.v[all.n - 1] * 1e3 : 0.0; /* sorted by lats_ms */
    printf("commits over %s, %3u concurrent trainers (%d connections, %d client threads): "
           "%8.0f "
           "acknowledged commits/s (%" PRIu64 " in %.1f s, %" PRIu64 " failed), latency p50 "
           "%.2f ms, p99 %.2f ms, max %.2f ms; coordinator CPU %.0f%% of a core, %.1f us/commit; "
           "client CPU %.1f us/commit; %.0f group commits (%.1f commits each, write+fdatasync "
           "%.3f ms mean)\n",
           via_name[via], world, via == VIA_CCHAN ? (int)world : nconn, k, (double)total / el,
           total, el, failed, p50, p99, pmax, 100.0 * cpu / el,
           total ? cpu / (double)total * 1e6 : 0.0, total ? me / (double)total * 1e6 : 0.0,
           fc1 - fc0, fc1 > fc0 ? (double)total / (fc1 - fc0) : 0.0,
           fc1 > fc0 ? (fs1 - fs0) / (fc1 - fc0) * 1e3 : 0.0);
    fflush(stdout);
    free(all.v);
    for (uint32_t i = 0; via == VIA_CCHAN && i < world; i++)
        close(ranks[i].cfd);
    free(ranks);
    free(xs);
    free(ts);
    for (int i = 0; i < nconn; i++)
        conn_close(cs[i]);
    free(cs);
}

/* ---- 2. many ranks: joins, heartbeats ---- */

/* A commit-channel connection phase 2's ranks share, and the answers read from it. */
typedef struct hb_conn {
    int fd;
    uint8_t in[1 << 16];
    size_t len;
} hb_conn;

typedef struct hb_ctx {
    rank_agent *ranks;
    size_t first, count;
    double start, until;
    uint32_t period_ms; /* the interval every rank heartbeats at */
    uint64_t beats, failures, skipped;
    double max_lat;
    lats lat;
    int via;     /* VIA_UNARY, VIA_STREAM, VIA_CCHAN */
    hb_conn *cc; /* VIA_CCHAN: this thread's connections */
    size_t ncc;
    double t_end, cpu_end, me_end; /* when its last beat was answered (before the streams close) */
} hb_ctx;

/* Each heartbeat carries the rank's progress, as a Loader's does (20 batches of 32 samples of
 * 4 KiB since the last; every 50th rank runs at half speed, so that lags show). */
static void start_heartbeat(rank_agent *a, grpc_completion_queue *cq, int via)
{
    a->step += a->rank % 50 == 7 ? 10 : 20;
    Batchwire__V1__RankLive live = BATCHWIRE__V1__RANK_LIVE__INIT;
    live.epoch_steps = 1000000;
    live.epoch = a->step / live.epoch_steps;
    live.step = a->step % live.epoch_steps;
    live.batches = a->step;
    live.samples = a->step * 32;
    live.bytes = a->step * 32 * 4096;
    Batchwire__V1__LeaseHeartbeatRequest req = BATCHWIRE__V1__LEASE_HEARTBEAT_REQUEST__INIT;
    req.live = &live;
    req.job = "ranks";
    req.rank = a->rank;
    req.lease_id = a->lease_lo;
    req.lease_id_hi = a->lease_hi;
    a->s.owner = a;
    a->busy = true;
    if (via == VIA_CCHAN) {
        Batchwire__V1__SessionRequest m = BATCHWIRE__V1__SESSION_REQUEST__INIT;
        m.id = a->rank; /* one beat outstanding a rank: its answer names the rank */
        m.op_case = BATCHWIRE__V1__SESSION_REQUEST__OP_HEARTBEAT;
        m.heartbeat = &req;
        a->ct0 = now_s();
        cchan_send(a->cfd, &m);
    } else if (via == VIA_STREAM)
        slot_start_msg(&a->s, &a->st, a->c, cq, BW_M_JOBS_LEASE_HEARTBEAT, &req.base);
    else
        slot_start(&a->s, a->c, cq, BW_M_JOBS_LEASE_HEARTBEAT, &req.base, 10000);
}

/* Counts one answered beat of a, taken dt seconds; err: why it failed (NULL: it did not). */
static void beat_done(hb_ctx *x, rank_agent *a, double dt, const char *err)
{
    a->busy = false;
    x->beats++;
    if (err && x->failures++ == 0)
        fprintf(stderr, "bench: LeaseHeartbeat of rank %u: %s\n", a->rank, err);
    x->max_lat = dt > x->max_lat ? dt : x->max_lat;
    lats_add(&x->lat, dt);
}

static void end_heartbeat(hb_ctx *x, slot *s)
{
    double dt = now_s() - s->t0;
    char err[1024];
    bool ok = slot_end(s, false, NULL, err, sizeof(err)) == GRPC_STATUS_OK;
    beat_done(x, s->owner, dt, ok ? NULL : err);
}

/* Handles the beats answered before `until` (or the first that are): over gRPC one completion,
 * over the channel one epoll_wait's worth (ep: this thread's connections). Returns how many. */
static size_t hb_events(hb_ctx *x, grpc_completion_queue *cq, int ep, double until)
{
    if (x->via != VIA_CCHAN) {
        slot *s = next_event(cq, until);
        if (s)
            end_heartbeat(x, s);
        return s ? 1 : 0;
    }
    struct epoll_event evs[64];
    double wait = until - now_s();
    int n = epoll_wait(ep, evs, 64, wait > 0 ? (int)(wait * 1000) + 1 : 0);
    size_t handled = 0;
    for (int i = 0; i < n; i++) {
        hb_conn *k = evs[i].data.ptr;
        cchan_recv(k->fd, k->in, sizeof(k->in), &k->len);
        Batchwire__V1__SessionResponse *r;
        while (cchan_take(k->in, sizeof(k->in), &k->len, &r)) {
            uint64_t id = r ? r->id : UINT64_MAX;
            if (!r || id < x->first || id - x->first >= x->count || !x->ranks[id].busy) {
                fprintf(stderr,
                        "bench: commit channel: an answer to no heartbeat sent (id %" PRIu64 ")\n",
                        id);
                exit(1);
            }
            rank_agent *a = &x->ranks[id];
            beat_done(x, a, now_s() - a->ct0,
                      r->error_code && r->error_code[0] ? r->error_message : NULL);
            protobuf_c_message_free_unpacked(&r->base, NULL);
            handled++;
        }
    }
    return handled;
}

/* Each rank heartbeats every period_ms, the thread's ranks spread evenly over the interval. */
static void *hb_thread(void *arg)
{
    hb_ctx *x = arg;
    if (x->count == 0 || (x->via == VIA_CCHAN && x->ncc == 0))
        abort(); /* run_heartbeats gives every thread ranks and connections */
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    int ep = -1;
    if (x->via == VIA_CCHAN) {
        ep = epoll_create1(0);
        for (size_t j = 0; j < x->ncc; j++) {
            struct epoll_event ev = {EPOLLIN, {.ptr = &x->cc[j]}};
            if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, x->cc[j].fd, &ev) != 0)
                abort();
        }
        for (size_t i = 0; i < x->count; i++)
            x->ranks[x->first + i].cfd = x->cc[i % x->ncc].fd;
    }
    double period = x->period_ms / 1000.0;
    size_t out = 0;
    for (uint64_t n = 0;; n++) {
        uint64_t round = n / x->count;
        size_t i = n % x->count;
        double due = x->start + (double)round * period + period * (double)i / (double)x->count;
        if (due >= x->until)
            break;
        for (;;) {
            double now = now_s();
            if (now >= due)
                break;
            out -= hb_events(x, cq, ep, due);
        }
        rank_agent *a = &x->ranks[x->first + i];
        if (a->busy) {
            x->skipped++; /* the previous beat has not been answered yet */
            continue;
        }
        start_heartbeat(a, cq, x->via);
        out++;
    }
    for (double last = now_s() + 30; out > 0 && now_s() < last;)
        out -= hb_events(x, cq, ep, last);
    x->t_end = now_s();
    x->cpu_end = coord_cpu_s();
    x->me_end = self_cpu_s();
    if (ep >= 0)
        close(ep);
    else
        close_rank_streams(x->ranks, x->first, x->count, cq);
    drain_cq(cq);
    return NULL;
}

/* Runs `argv` (argv[0] a path), its stdout to `out` (may be NULL: discarded); returns the
 * seconds it took and its exit status in *status. */
static double run_timed(char *const argv[], const char *out, int *status)
{
    double t0 = now_s();
    pid_t p = fork();
    if (p == 0) {
        FILE *o = freopen(out ? out : "/dev/null", "w", stdout);
        (void)o;
        execv(argv[0], argv);
        _exit(127);
    }
    waitpid(p, status, 0);
    return now_s() - t0;
}

/* One GET /metrics over HTTP/1.0: seconds taken, bytes and lines of the response; the
 * response itself into keep (NULL: not kept; malloc'ed). */
static double scrape_into(size_t *bytes, size_t *lines, char **keep)
{
    double t0 = now_s();
    *bytes = *lines = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)metrics_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    const char *rq = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, rq, strlen(rq)) != (ssize_t)strlen(rq)) {
        close(fd);
        return -1;
    }
    char buf[65536];
    ssize_t n;
    size_t cap = 0;
    if (keep)
        *keep = NULL;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
        if (keep) {
            if (*bytes + (size_t)n + 1 > cap) {
                cap = (*bytes + (size_t)n + 1) * 2;
                *keep = realloc(*keep, cap);
                if (!*keep)
                    abort();
            }
            memcpy(*keep + *bytes, buf, (size_t)n);
            (*keep)[*bytes + (size_t)n] = 0;
        }
        *bytes += (size_t)n;
        for (ssize_t i = 0; i < n; i++)
            *lines += buf[i] == '\n';
    }
    close(fd);
    return now_s() - t0;
}

static double scrape(size_t *bytes, size_t *lines)
{
    return scrape_into(bytes, lines, NULL);
}

/* The journal's group commits so far, from /metrics: how many and their seconds in total. */
static void fsyncs(double *count, double *sum)
{
    size_t b, l;
    char *m = NULL;
    *count = *sum = 0;
    if (scrape_into(&b, &l, &m) < 0 || !m)
        return;
    const char *c = strstr(m, "batchwire_coordinator_journal_fsync_duration_seconds_count ");
    const char *s = strstr(m, "batchwire_coordinator_journal_fsync_duration_seconds_sum ");
    if (c)
        *count = strtod(strchr(c, ' ') + 1, NULL);
    if (s)
        *sum = strtod(strchr(s, ' ') + 1, NULL);
    free(m);
}

/* This process's CPU seconds so far. */
static double self_cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
}

/* The ranks heartbeat for --seconds, over unary calls, their streams or the commit channel
 * (--connections connections, 64 by default, shared by the ranks: the header comment says
 * why); one line of figures. */
static void run_heartbeats(rank_agent *ranks, int via)
{
    int k = client_threads;
    hb_ctx *xs = xcalloc((size_t)k, sizeof(*xs));
    pthread_t *ts = xcalloc((size_t)k, sizeof(*ts));
    int ncc = connections > 0 ? connections : 64;
    ncc = ncc > nranks ? nranks : ncc < k ? k : ncc;
    hb_conn *cc = via == VIA_CCHAN ? xcalloc((size_t)ncc, sizeof(*cc)) : NULL;
    for (int j = 0; cc && j < ncc; j++)
        cc[j].fd = cchan_open((uint32_t)j);
    /* The interval a Loader keeps after its first heartbeat: the coordinator tells every lease
     * the length for all the leases held (docs/operating.md, "Leases at scale"), which the
     * last join was told; the first joins were told less, before the others came. */
    uint32_t period_ms = 0;
    for (int r = 0; r < nranks; r++)
        period_ms = ranks[r].hb_ms > period_ms ? ranks[r].hb_ms : period_ms;
    double start = now_s() + 0.05;
    double cpu0 = coord_cpu_s(), me0 = self_cpu_s();
    double w0 = now_s();
    for (int i = 0; i < k; i++) {
        size_t per = (size_t)nranks / (size_t)k, first = per * (size_t)i;
        xs[i].ranks = ranks;
        xs[i].first = first;
        xs[i].count = i == k - 1 ? (size_t)nranks - first : per;
        xs[i].start = start;
        xs[i].until = start + hb_seconds;
        xs[i].period_ms = period_ms;
        xs[i].via = via;
        if (cc) { /* this thread's share of the connections */
            size_t c0 = (size_t)ncc * (size_t)i / (size_t)k,
                   c1 = (size_t)ncc * (size_t)(i + 1) / (size_t)k;
            xs[i].cc = cc + c0;
            xs[i].ncc = c1 - c0;
        }
        pthread_create(&ts[i], NULL, hb_thread, &xs[i]);
    }
    uint64_t beats = 0, failures = 0, skipped = 0;
    double max_lat = 0;
    lats all = {0};
    double t1 = w0, cpu1 = cpu0, me1 = me0; /* at the last answer, before the streams close */
    for (int i = 0; i < k; i++) {
        pthread_join(ts[i], NULL);
        beats += xs[i].beats;
        failures += xs[i].failures;
        skipped += xs[i].skipped;
        max_lat = xs[i].max_lat > max_lat ? xs[i].max_lat : max_lat;
        lats_take(&all, &xs[i].lat);
        if (xs[i].t_end > t1) {
            t1 = xs[i].t_end;
            cpu1 = xs[i].cpu_end;
            me1 = xs[i].me_end;
        }
    }
    double window = t1 - w0, hb_cpu = cpu1 - cpu0, me = me1 - me0;
    double hp50 = lats_ms(&all, 0.5), hp99 = lats_ms(&all, 0.99);
    char over[96];
    snprintf(over, sizeof(over), "%s",
             via == VIA_UNARY ? "unary calls" : "a Jobs.Session stream each");
    if (via == VIA_CCHAN)
        snprintf(over, sizeof(over), "the commit channel (%d connections)", ncc);
    printf("ranks: %d ranks heartbeating over %s every %u ms for %d s: %" PRIu64
           " heartbeats (%.0f/s), %" PRIu64 " failed, %" PRIu64
           " skipped (previous unanswered), p50 %.2f ms, p99 %.2f ms, slowest %.2f ms; "
           "coordinator CPU %.2f s in %.1f s = %.1f%% of one core (%.1f us/heartbeat); client "
           "CPU %.1f us/heartbeat\n",
           nranks, over, period_ms, hb_seconds, beats, (double)beats / window, failures, skipped,
           hp50, hp99, max_lat * 1e3, hb_cpu, window, 100.0 * hb_cpu / window,
           beats ? hb_cpu / (double)beats * 1e6 : 0.0, beats ? me / (double)beats * 1e6 : 0.0);
    fflush(stdout);
    free(all.v);
    for (int j = 0; cc && j < ncc; j++)
        close(cc[j].fd);
    free(cc);
    free(xs);
    free(ts);
}

static void bench_ranks(void)
{
    int nconn = connections > 0 ? connections : 64;
    conn **cs = xcalloc((size_t)nconn, sizeof(*cs));
    for (int i = 0; i < nconn; i++)
        cs[i] = conn_open();
    create(cs[0], "ranks", (uint32_t)nranks);
    rank_agent *ranks = xcalloc((size_t)nranks, sizeof(*ranks));
    for (int i = 0; i < nranks; i++) {
        ranks[i].rank = (uint32_t)i;
        ranks[i].c = cs[i % nconn];
    }
    double cpu0 = coord_cpu_s(), t0 = now_s();
    join_all(ranks, (size_t)nranks, "ranks", (uint32_t)nranks, join_window);
    double join_s = now_s() - t0, join_cpu = coord_cpu_s() - cpu0;
    printf("ranks: %d ranks joined one job in %.3f s (%.0f joins/s, %d outstanding at a time, "
           "each journaled and fsynced); coordinator CPU %.1f us/join\n",
           nranks, join_s, nranks / join_s, join_window, join_cpu / nranks * 1e6);
    fflush(stdout);

    run_heartbeats(ranks, VIA_UNARY);
    run_heartbeats(ranks, VIA_STREAM);
    run_heartbeats(ranks, VIA_CCHAN);

    /* 3. status and metrics with the ranks held */
    char exe[1100], json_out[1100];
    snprintf(exe, sizeof(exe), "%s/batchwire", bin_dir);
    snprintf(json_out, sizeof(json_out), "%s/status.json", state_dir);
    char *table[] = {exe, "status", "--coordinator", addr, NULL};
    char *one[] = {exe, "status", "--coordinator", addr, "--job", "ranks", NULL};
    char *json[] = {exe, "status", "--coordinator", addr, "--json", NULL};
    int st_t, st_o, st_j;
    double tt = run_timed(table, NULL, &st_t);
    double to = run_timed(one, NULL, &st_o);
    double tj = run_timed(json, json_out, &st_j);
    printf("status at %d ranks: `batchwire status` %.3f s (exit %d), `--job ranks` %.3f s "
           "(exit %d), `--json` %.3f s (exit %d)\n",
           nranks, tt, WEXITSTATUS(st_t), to, WEXITSTATUS(st_o), tj, WEXITSTATUS(st_j));
    size_t bytes, lines;
    double tm = scrape(&bytes, &lines);
    printf("metrics at %d ranks: one scrape of /metrics %.3f s, %zu bytes, %zu lines\n", nranks, tm,
           bytes, lines);

    /* Every lease must still be live. On a fresh connection: nothing polled cs[] while the
     * ranks heartbeat over the commit channel, so the coordinator's keepalive pings went
     * unanswered and it closed them ("Socket closed"). */
    Batchwire__V1__GetJobRequest g = BATCHWIRE__V1__GET_JOB_REQUEST__INIT;
    g.name = "ranks";
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    conn *gc = conn_open();
    slot s;
    slot_start(&s, gc, cq, BW_M_JOBS_GET, &g.base, 30000);
    next_event(cq, now_s() + 60);
    char err[1024];
    ProtobufCMessage *resp;
    if (slot_end(&s, true, &resp, err, sizeof(err)) != GRPC_STATUS_OK || !resp) {
        fprintf(stderr, "bench: GetJob: %s\n", err);
        exit(1);
    }
    const Batchwire__V1__GetJobResponse *gr = (const void *)resp;
    size_t live = 0;
    for (size_t i = 0; i < gr->n_ranks; i++)
        live += gr->ranks[i]->lease == BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_LIVE;
    printf("ranks: %zu of %d leases live at the end\n", live, nranks);
    protobuf_c_message_free_unpacked(resp, NULL);
    drain_cq(cq);
    conn_close(gc);
    free(ranks);
    for (int i = 0; i < nconn; i++)
        conn_close(cs[i]);
    free(cs);
}

int main(int argc, char **argv)
{
    if (bw__version_flag(argc, argv, "bench_coordinator"))
        return 0;
    static const struct {
        const char *name;
        int *v;
        int min;
    } ints[] = {
        {"--threads", &threads, 1},
        {"--commit-seconds", &commit_seconds, 1},
        {"--connections", &connections, 0},
        {"--client-threads", &client_threads, 1},
        {"--coord-threads", &coord_threads, 1},
        {"--ranks", &nranks, 1},
        {"--seconds", &hb_seconds, 1},
        {"--lease-ms", &lease_ms, 100},
        {"--max-heartbeats", &max_heartbeats, 0},
        {"--join-window", &join_window, 1},
        {"--skip-single", &skip_single, 0},
    };
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_coordinator: %s needs a value\n", argv[i]);
            return 2;
        }
        bool known = false;
        if (!strcmp(argv[i], "--bin")) {
            snprintf(bin_dir, sizeof(bin_dir), "%s", argv[i + 1]);
            known = true;
        } else if (!strcmp(argv[i], "--state")) {
            snprintf(state_dir, sizeof(state_dir), "%s", argv[i + 1]);
            known = true;
        }
        for (size_t k = 0; !known && k < sizeof(ints) / sizeof(ints[0]); k++) {
            if (strcmp(argv[i], ints[k].name) != 0)
                continue;
            char *end;
            long v = strtol(argv[i + 1], &end, 10);
            if (*end || v < ints[k].min || v > 10000000) {
                fprintf(stderr, "bench_coordinator: %s %s: expected an integer >= %d\n", argv[i],
                        argv[i + 1], ints[k].min);
                return 2;
            }
            *ints[k].v = (int)v;
            known = true;
        }
        if (!known) {
            fprintf(stderr, "bench_coordinator: unknown option %s (see the comment at the top)\n",
                    argv[i]);
            return 2;
        }
    }
    if (client_threads > nranks || client_threads > threads) {
        fprintf(stderr, "bench_coordinator: --client-threads exceeds --threads or --ranks\n");
        return 2;
    }
    if (!state_dir[0]) {
        snprintf(state_dir, sizeof(state_dir), "/var/tmp/bw-bench-coord-XXXXXX");
        if (!mkdtemp(state_dir)) {
            fprintf(stderr, "bench_coordinator: mkdtemp: %s\n", strerror(errno));
            return 1;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    coord_pid = start_coordinator();
    atexit(stop_coordinator);
    if (!addr[0]) {
        fprintf(stderr, "bench_coordinator: the coordinator did not start\n");
        return 1;
    }
    bw__rpc_quiet_mutex_checks(); /* as the coordinator does (core/rpc/server.h) */
    grpc_init();
    printf("coordinator %s (%d completion-queue threads), state directory %s\n", addr,
           coord_threads, state_dir);
    /* Each phase over unary calls (the baseline) and over Jobs.Session streams, in this run. */
    if (!skip_single) {
        bench_commits(1, VIA_UNARY);
        bench_commits(1, VIA_STREAM);
        bench_commits(1, VIA_CCHAN);
    }
    bench_commits((uint32_t)threads, VIA_UNARY);
    bench_commits((uint32_t)threads, VIA_STREAM);
    bench_commits((uint32_t)threads, VIA_CCHAN);
    bench_ranks();
    stop_coordinator();
    grpc_shutdown();
    return 0;
}
