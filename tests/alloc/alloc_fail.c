/*
 * tests/alloc/alloc_fail.c -- allocation-failure injection over a loader's whole life: the
 * failure rule of docs/architecture.md tested the way SQLite's malloc tests (src/test_malloc.c)
 * and curl's torture mode test theirs. tests/alloc/test_alloc_fail.py starts a real cluster (a
 * coordinator and a worker on loopback, plaintext and TLS with a bearer token) and runs this
 * program against it.
 *
 * One run: bw_loader_open (then, with --hold-ms, a wait while the heartbeat thread runs),
 * bw_loader_next through the epoch (taking bw_loader_cursor,
 * bw_loader_cursor_text and bw_loader_commit after step CURSOR_STEP), bw_loader_close, then
 * bw_loader_open_at the cursor's text, one bw_loader_next and bw_loader_close -- each run as a
 * job of its own. A probe run counts the library's allocations per phase. Then, for N = 1 ..
 * count (and a margin, since the fetch and heartbeat threads make the count vary a little),
 * the Nth allocation fails ("once"), and in a second sweep every allocation from the Nth on
 * fails ("from"). Every run must show:
 *   - no crash and no hang: every call returns within CALL_TIMEOUT_S (SIGALRM ends the
 *     program naming the run and the call);
 *   - every failing call returns a known negative code with a sentence: bw_loader_open's err
 *     is rewritten (it starts as a sentinel), bw_loader_errmsg is not the sentence the call
 *     before it left (a sentinel set with bw_loader_to_device into a 0-byte buffer, which
 *     fails with BW_TOO_BIG and changes nothing else);
 *   - no silent downgrade: a loader that opens has the rank, world size and length asked for,
 *     and every batch it hands out is the probe's batch of that step (its indices and the
 *     hash of its bytes), none skipped or repeated -- also when a call is repeated after an
 *     error. The TLS cluster accepts only TLS with the token (and the worker's data channel
 *     only TLS with a client certificate): a loader that dropped either could not open or
 *     read there, so a successful run is proof the settings held;
 *   - "once" runs: after the single failure the library recovers. A failed bw_loader_next or
 *     cursor call is repeated (up to RETRIES times) and must then succeed; after a failed
 *     open, a loader of another (live) holder opens the same rank at once -- the failed open
 *     left nothing claimed;
 *   - no leak: every allocation made through the wrappers below during a run is freed by its
 *     end (checked here, naming each leaked block's size and caller), and LeakSanitizer
 *     checks the rest in the ASan build.
 *
 * Which allocations fail: batchwire's own. This program is linked statically against the
 * client library's and the core's objects (libbwclient.a, libbwcore.a) with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=strdup,--wrap=strndup
 * (tests/CMakeLists.txt). --wrap rewrites only the references resolved at this static link:
 * calls from batchwire's objects (and this file) reach the __wrap_ functions below, while
 * libgrpc, libprotobuf-c and libssl, shared libraries, keep calling the C library directly.
 * That is the line wanted: the failure rule covers the library's own allocations (gRPC aborts
 * the process when one of its own fails; OpenSSL reports its own failures through its API,
 * which the library checks where it calls it). protobuf-c's unpacking into a call's arena counts,
 * since the arena (core/common/arena.c) allocates through malloc. The other way, routing the
 * library's allocations through one bw__malloc family with a test hook, would need every future
 * call site to remember it; a forgotten one would silently escape the test, while --wrap catches
 * whatever the objects call. (The library calls no other allocating libc function --
 * asprintf, getline, realpath(NULL) -- on the trainer's side; tests/lint would be the place to
 * keep it so.)
 *
 * Usage: alloc_fail --coordinator ADDR --dataset SPEC --samples N --batch B --job PREFIX
 *            [--tls-ca F --tls-cert F --tls-key F] [--token-file F] [--other-holder PID]
 *            [--sweep once|from|both|none] [--first N] [--last N | --margin M] [--stride K]
 *            [--hold-ms MS]
 * (N from --first to --last, by default 1 to the probe's count + M, 20 by default; --stride
 * K runs every N through bw_loader_open's allocations and M more, then every Kth).
 * --hold-ms: each run holds the open loader that long before its first bw_loader_next, while
 * the heartbeat thread confirms the lease, and the sweeps cover the allocations made then
 * (those of the heartbeat thread, and of the fetch threads' first batches) with M either side.
 * Prints the probe's counts, one line per failing check, and a summary; exits 0 when every
 * run passed. With BW_ALLOC_FAIL_TRACE=1 a failing run also prints the stack of its first
 * injected failure (addr2line -f -i -e alloc_fail ADDRESS names the lines).
 */
#include <errno.h>
#include <execinfo.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "batchwire/loader.h"

enum {
    MAX_STEPS = 64,
    MAX_BATCH = 64,
    CURSOR_STEP = 2,     /* the cursor is taken after this step */
    RETRIES = 3,         /* a failed call is repeated this often in "once" runs */
    CALL_TIMEOUT_S = 30, /* no call may take longer (the loader's own deadline: 0.5-3 s) */
    TRACK_SLOTS = 1 << 18,
};

/* ---- the allocation wrappers ---- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);

static atomic_long g_count;     /* allocations counted since the counter was reset */
static atomic_long g_fail_at;   /* 0: none fails; else the Nth fails ... */
static atomic_bool g_fail_from; /* ... and, when set, every one after it */
static atomic_long g_failed;    /* allocations failed since the counter was reset */
static bool g_trace; /* BW_ALLOC_FAIL_TRACE set: a failing run prints where its first failure was */
static void *g_frames[24];
static int g_nframes;

/* Live blocks allocated through the wrappers: an open-addressing table (linear probing,
 * backward-shift deletion) under a mutex, allocated with __real_calloc so it tracks nothing
 * of its own. */
typedef struct {
    void *p;
    void *caller;
    size_t size;
} track_entry;
static track_entry *g_track;
static size_t g_live;
static pthread_mutex_t g_track_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t slot_of(const void *p)
{
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 17;
    x *= 0xed5ad4bbU;
    x ^= x >> 11;
    return (size_t)x & (TRACK_SLOTS - 1);
}

static void track_add(void *p, size_t size, void *caller)
{
    if (!p || !g_track)
        return;
    pthread_mutex_lock(&g_track_mu);
    if (g_live + 1 >= TRACK_SLOTS / 2) {
        static const char msg[] = "alloc_fail: more than TRACK_SLOTS/2 live blocks\n";
        (void)!write(2, msg, sizeof(msg) - 1);
        abort();
    }
    size_t i = slot_of(p);
    while (g_track[i].p)
        i = (i + 1) & (TRACK_SLOTS - 1);
    g_track[i] = (track_entry){p, caller, size};
    g_live++;
    pthread_mutex_unlock(&g_track_mu);
}

static void track_del(void *p)
{
    if (!p || !g_track)
        return;
    pthread_mutex_lock(&g_track_mu);
    size_t i = slot_of(p);
    while (g_track[i].p && g_track[i].p != p)
        i = (i + 1) & (TRACK_SLOTS - 1);
    if (g_track[i].p) { /* else not ours: a block of the C library or of gRPC */
        g_live--;
        size_t hole = i;
        for (size_t j = (i + 1) & (TRACK_SLOTS - 1); g_track[j].p;
             j = (j + 1) & (TRACK_SLOTS - 1)) {
            size_t home = slot_of(g_track[j].p);
            /* Move j into the hole unless its home lies cyclically in (hole, j]. */
            bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
            if (!stays) {
                g_track[hole] = g_track[j];
                hole = j;
            }
        }
        g_track[hole] = (track_entry){0};
    }
    pthread_mutex_unlock(&g_track_mu);
}

static bool inject(void)
{
    long n = atomic_fetch_add(&g_count, 1) + 1;
    long at = atomic_load(&g_fail_at);
    if (at == 0 || n < at || (n > at && !atomic_load(&g_fail_from)))
        return false;
    if (atomic_fetch_add(&g_failed, 1) == 0 && g_trace)
        g_nframes = backtrace(g_frames, 24);
    errno = ENOMEM;
    return true;
}

void *__wrap_malloc(size_t n);
void *__wrap_malloc(size_t n)
{
    if (inject())
        return NULL;
    void *p = __real_malloc(n);
    track_add(p, n, __builtin_return_address(0));
    return p;
}

void *__wrap_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size)
{
    if (inject())
        return NULL;
    void *p = __real_calloc(n, size);
    track_add(p, n * size, __builtin_return_address(0));
    return p;
}

void *__wrap_realloc(void *old, size_t n);
void *__wrap_realloc(void *old, size_t n)
{
    if (inject())
        return NULL; /* the old block stays the caller's */
    void *p = __real_realloc(old, n);
    if (p || n == 0) {
        track_del(old);
        track_add(p, n, __builtin_return_address(0));
    }
    return p;
}

void __wrap_free(void *p);
void __wrap_free(void *p)
{
    track_del(p);
    __real_free(p);
}

char *__wrap_strdup(const char *s);
char *__wrap_strdup(const char *s)
{
    if (inject())
        return NULL;
    char *p = __real_strdup(s);
    track_add(p, p ? strlen(p) + 1 : 0, __builtin_return_address(0));
    return p;
}

char *__wrap_strndup(const char *s, size_t n);
char *__wrap_strndup(const char *s, size_t n)
{
    if (inject())
        return NULL;
    char *p = __real_strndup(s, n);
    track_add(p, p ? strlen(p) + 1 : 0, __builtin_return_address(0));
    return p;
}

static size_t live_blocks(void)
{
    pthread_mutex_lock(&g_track_mu);
    size_t n = g_live;
    pthread_mutex_unlock(&g_track_mu);
    return n;
}

/* Prints (up to 10 of) the blocks not in `before` (a copy of the table taken earlier). */
static void print_new_blocks(const track_entry *before, const char *run)
{
    int shown = 0;
    pthread_mutex_lock(&g_track_mu);
    for (size_t i = 0; i < TRACK_SLOTS && shown < 10; i++) {
        if (!g_track[i].p)
            continue;
        bool old = false;
        for (size_t j = slot_of(g_track[i].p); before[j].p; j = (j + 1) & (TRACK_SLOTS - 1))
            if (before[j].p == g_track[i].p) {
                old = true;
                break;
            }
        if (!old) {
            printf("  %s: leaked %zu bytes allocated from %p (addr2line -e alloc_fail)\n", run,
                   g_track[i].size, g_track[i].caller);
            shown++;
        }
    }
    pthread_mutex_unlock(&g_track_mu);
}

/* ---- the run ---- */

static struct {
    const char *coordinator, *dataset, *job, *tls_ca, *tls_cert, *tls_key, *token_file;
    uint64_t samples, batch;
    uint32_t other_holder;
} cfg;

/* What the probe saw at each step: the indices and an FNV-1a hash of the bytes. */
static struct {
    uint64_t steps;
    size_t count[MAX_STEPS];
    uint64_t idx[MAX_STEPS][MAX_BATCH];
    uint64_t hash[MAX_STEPS];
} want;

static const char *volatile g_call = "start"; /* for the watchdog's message */
static char g_run[96];
static char g_logline[1024]; /* the library's last warning, for a failure's detail */

static void put(const char *text)
{
    (void)!write(1, text, strlen(text));
}

/* Async-signal-safe: write(2) and strlen only. */
static void on_alarm(int sig)
{
    (void)sig;
    put("FAIL ");
    put(g_run);
    put(": ");
    put(g_call);
    put(" did not return within its time (a hang)\n");
    _exit(3);
}

static void on_log(void *user, bw_log_level level, const char *line)
{
    (void)user;
    (void)level;
    snprintf(g_logline, sizeof(g_logline), "%s", line);
}

static int failures;

static void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s: ", g_run);
    vprintf(fmt, ap);
    va_end(ap);
    printf(" (library's last log line: %s)\n", g_logline[0] ? g_logline : "none");
    fflush(stdout);
    failures++;
    if (g_nframes > 0) {
        printf("  the run's first allocation failure was injected at:\n");
        fflush(stdout);
        backtrace_symbols_fd(g_frames, g_nframes, 1);
        g_nframes = 0;
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool g_times; /* BW_ALLOC_FAIL_TIMES set: print each run's time and its slow calls */
static double g_call_t0;

/* Names the call about to be made, for the watchdog (and, with g_times, reports the one before
 * it when it was slow). */
static void call(const char *what)
{
    double t = now_s();
    if (g_times && g_call_t0 > 0 && t - g_call_t0 > 0.5)
        printf("  %s: %s and what followed it took %.2f s\n", g_run, g_call, t - g_call_t0);
    g_call_t0 = t;
    g_call = what;
    alarm(CALL_TIMEOUT_S);
}

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static int g_timeout_ms = 3000; /* the loader's deadline: 500 ms in "from" runs, see sweep() */

static void options(bw_loader_options *o, const char *job, uint32_t holder)
{
    bw_loader_options_init(o);
    o->coordinator = cfg.coordinator;
    o->job = job;
    o->dataset = cfg.dataset;
    o->rank = 0;
    o->world_size = 1;
    o->batch_size = cfg.batch;
    o->shuffle = 1;
    o->seed = 7;
    o->prefetch_batches = 2;
    o->timeout_ms = g_timeout_ms;
    o->retry_ms = 0;
    o->tls_ca = cfg.tls_ca;
    o->tls_cert = cfg.tls_cert;
    o->tls_key = cfg.tls_key;
    o->token_file = cfg.token_file;
    o->holder_pid = holder;
}

/* An error's code and sentence: a known negative code, and a sentence other than `before`. */
static void check_error(const char *what, int rc, const char *msg, const char *before)
{
    if (rc >= 0 || strcmp(bw_err_name(rc), "BW_UNKNOWN_ERROR") == 0)
        failf("%s returned %d, not an error code of batchwire.h", what, rc);
    if (!msg || strlen(msg) < 8)
        failf("%s failed with %s and no sentence (\"%s\")", what, bw_err_name(rc), msg ? msg : "");
    else if (before && strcmp(msg, before) == 0)
        failf("%s failed with %s but left the previous call's sentence (\"%s\")", what,
              bw_err_name(rc), msg);
}

/* After a successful open: the loader is the one asked for. */
static bool check_loader(bw_loader *l)
{
    if (bw_loader_rank(l) != 0 || bw_loader_world_size(l) != 1 ||
        bw_loader_num_samples(l) != cfg.samples) {
        failf("the loader opened as rank %" PRId64 " of %" PRId64 " over %" PRIu64
              " samples, not rank 0 of 1 over %" PRIu64,
              bw_loader_rank(l), bw_loader_world_size(l), bw_loader_num_samples(l), cfg.samples);
        return false;
    }
    return true;
}

/* A batch handed out at `step` is the probe's (or, in the probe, is recorded). */
static bool check_batch(const bw_batch *b, uint64_t step, bool record)
{
    size_t n = bw_batch_count(b);
    const uint64_t *idx = bw_batch_indices(b);
    uint64_t h = fnv(bw_batch_data(b), bw_batch_nbytes(b));
    if (record) {
        if (step >= MAX_STEPS || n > MAX_BATCH || bw_batch_step(b) != step) {
            failf("probe: step %" PRIu64 " of %zu samples is beyond this test's tables", step, n);
            return false;
        }
        want.count[step] = n;
        memcpy(want.idx[step], idx, n * sizeof(*idx));
        want.hash[step] = h;
        return true;
    }
    if (bw_batch_epoch(b) != 0 || bw_batch_step(b) != step || step >= want.steps ||
        n != want.count[step] || memcmp(idx, want.idx[step], n * sizeof(*idx)) != 0 ||
        h != want.hash[step]) {
        failf("the batch handed out as step %" PRIu64 " (epoch %" PRIu64 ", %zu samples) is not "
              "the probe's step %" PRIu64 " (a skipped, repeated or wrong batch)",
              bw_batch_step(b), bw_batch_epoch(b), n, step);
        return false;
    }
    return true;
}

/* Sets bw_loader_errmsg to a sentence no failing call may leave: bw_loader_to_device into a
 * 0-byte buffer fails with BW_TOO_BIG before anything else. */
static void sentinel(bw_loader *l, const bw_batch *b, char *out, size_t outlen)
{
    out[0] = '\0';
    if (b && bw_loader_to_device(l, b, 0, NULL, 0) == BW_TOO_BIG)
        snprintf(out, outlen, "%s", bw_loader_errmsg(l));
}

typedef struct {
    long open, hold, next, cursor, close, reopen; /* allocations counted at each phase's end */
    bool opened;
} phases;

static long g_hold_ms; /* --hold-ms: the run waits this long after opening (heartbeats) */

/* bw_loader_next at `step`, repeated after an error when `retry`. Returns the batch or NULL. */
static const bw_batch *next_batch(bw_loader *l, const bw_batch *prev, uint64_t step, bool retry,
                                  bool record)
{
    char before[1024];
    for (int attempt = 0;; attempt++) {
        sentinel(l, attempt == 0 ? prev : NULL, before, sizeof(before));
        const bw_batch *b = NULL;
        call("bw_loader_next");
        int rc = bw_loader_next(l, &b);
        if (rc == BW_OK) {
            if (!b) {
                failf("bw_loader_next returned BW_OK without a batch");
                return NULL;
            }
            return check_batch(b, step, record) ? b : NULL;
        }
        check_error("bw_loader_next", rc, bw_loader_errmsg(l), before[0] ? before : NULL);
        if (!retry || attempt >= RETRIES) {
            if (retry)
                failf("bw_loader_next at step %" PRIu64 " still fails after one allocation "
                      "failed, %d repeats later: %s: %s",
                      step, RETRIES, bw_err_name(rc), bw_loader_errmsg(l));
            return NULL;
        }
    }
}

/* A cursor call, repeated after an error when `retry`. */
static int cursor_call(bw_loader *l, const bw_batch *prev, const char *what, bool retry,
                       int (*fn)(bw_loader *, void *, size_t), void *buf, size_t len)
{
    char before[1024];
    int rc = BW_OK;
    for (int attempt = 0; attempt <= (retry ? RETRIES : 0); attempt++) {
        sentinel(l, attempt == 0 ? prev : NULL, before, sizeof(before));
        call(what);
        if ((rc = fn(l, buf, len)) == BW_OK)
            return BW_OK;
        check_error(what, rc, bw_loader_errmsg(l), before[0] ? before : NULL);
    }
    if (retry)
        failf("%s still fails after one allocation failed, %d repeats later: %s: %s", what, RETRIES,
              bw_err_name(rc), bw_loader_errmsg(l));
    return rc;
}

static int do_cursor(bw_loader *l, void *buf, size_t len)
{
    size_t n = len;
    return bw_loader_cursor(l, buf, &n);
}

static int do_cursor_text(bw_loader *l, void *buf, size_t len)
{
    return bw_loader_cursor_text(l, buf, len);
}

static int do_commit(bw_loader *l, void *buf, size_t len)
{
    (void)buf;
    (void)len;
    return bw_loader_commit(l);
}

/* One run as job `job`; `once`: a single allocation fails (the library must recover). */
static void run(const char *job, bool once, bool record, phases *ph)
{
    bw_loader_options o;
    options(&o, job, 0);
    char err[1024];
    snprintf(err, sizeof(err), "(sentinel: bw_loader_open wrote nothing here)");
    bw_loader *l = (bw_loader *)1;
    call("bw_loader_open");
    int rc = bw_loader_open(&o, &l, err, sizeof(err));
    ph->open = atomic_load(&g_count);
    ph->opened = rc == BW_OK;
    if (rc != BW_OK && record) {
        failf("probe: bw_loader_open: %s: %s", bw_err_name(rc), err);
        return;
    }
    if (rc != BW_OK) {
        check_error("bw_loader_open", rc, err, "(sentinel: bw_loader_open wrote nothing here)");
        if (l != NULL)
            failf("bw_loader_open failed but left *out set");
        if (once && cfg.other_holder) {
            /* Nothing may stay claimed: another live holder takes the rank at once. */
            long at = atomic_exchange(&g_fail_at, 0);
            options(&o, job, cfg.other_holder);
            call("bw_loader_open (another holder)");
            if ((rc = bw_loader_open(&o, &l, err, sizeof(err))) != BW_OK)
                failf("after a failed bw_loader_open, another holder cannot open the rank: %s: %s",
                      bw_err_name(rc), err);
            call("bw_loader_close (another holder)");
            bw_loader_close(l);
            atomic_store(&g_fail_at, at);
        }
        return;
    }
    if (!check_loader(l)) {
        call("bw_loader_close");
        bw_loader_close(l);
        return;
    }
    if (g_hold_ms > 0) { /* the heartbeat thread runs meanwhile */
        struct timespec ts = {g_hold_ms / 1000, (g_hold_ms % 1000) * 1000000L};
        call("(holding the open loader)");
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    ph->hold = atomic_load(&g_count);
    const bw_batch *b = NULL;
    char text[256] = "";
    uint8_t bin[256];
    bool have_cursor = false;
    uint64_t step = 0;
    for (;; step++) {
        char before[1024];
        if (record || step == want.steps) {
            sentinel(l, b, before, sizeof(before));
            call("bw_loader_next");
            const bw_batch *e = NULL;
            rc = bw_loader_next(l, &e);
            if (rc == BW_END_OF_EPOCH)
                break;
            if (!record) {
                if (rc == BW_OK)
                    failf("bw_loader_next handed out a step %" PRIu64 " past the epoch's end",
                          bw_batch_step(e));
                else
                    check_error("bw_loader_next at the epoch's end", rc, bw_loader_errmsg(l),
                                before[0] ? before : NULL);
                break;
            }
            if (rc != BW_OK) {
                failf("probe: bw_loader_next: %s: %s", bw_err_name(rc), bw_loader_errmsg(l));
                break;
            }
            if (!check_batch(e, step, true))
                break;
            b = e;
        } else if (!(b = next_batch(l, b, step, once, false)))
            break;
        if (step == CURSOR_STEP) {
            have_cursor =
                cursor_call(l, b, "bw_loader_cursor", once, do_cursor, bin, sizeof(bin)) == BW_OK &&
                cursor_call(l, NULL, "bw_loader_cursor_text", once, do_cursor_text, text,
                            sizeof(text)) == BW_OK;
            cursor_call(l, NULL, "bw_loader_commit", once, do_commit, NULL, 0);
        }
    }
    if (record)
        want.steps = step;
    ph->next = atomic_load(&g_count);
    ph->cursor = ph->next;
    call("bw_loader_close");
    bw_loader_close(l);
    ph->close = atomic_load(&g_count);
    if (!have_cursor) {
        ph->reopen = ph->close;
        return;
    }
    /* Resume at the cursor: the next batch is the one after CURSOR_STEP. */
    snprintf(err, sizeof(err), "(sentinel: bw_loader_open_at wrote nothing here)");
    l = (bw_loader *)1;
    call("bw_loader_open_at");
    rc = bw_loader_open_at(&o, text, 0, &l, err, sizeof(err));
    if (rc != BW_OK) {
        check_error("bw_loader_open_at", rc, err,
                    "(sentinel: bw_loader_open_at wrote nothing here)");
        if (l != NULL)
            failf("bw_loader_open_at failed but left *out set");
        if (once) {
            long at = atomic_exchange(&g_fail_at, 0);
            call("bw_loader_open_at (again)");
            if ((rc = bw_loader_open_at(&o, text, 0, &l, err, sizeof(err))) != BW_OK)
                failf("after one allocation failure, bw_loader_open_at fails again: %s: %s",
                      bw_err_name(rc), err);
            else if (check_loader(l))
                next_batch(l, NULL, CURSOR_STEP + 1, true, false);
            call("bw_loader_close");
            bw_loader_close(l);
            atomic_store(&g_fail_at, at);
        }
    } else {
        if (check_loader(l))
            next_batch(l, NULL, CURSOR_STEP + 1, once, false);
        call("bw_loader_close");
        bw_loader_close(l);
    }
    ph->reopen = atomic_load(&g_count);
}

static track_entry *snapshot(void)
{
    track_entry *copy = __real_malloc(sizeof(track_entry) * TRACK_SLOTS);
    if (!copy)
        abort();
    pthread_mutex_lock(&g_track_mu);
    memcpy(copy, g_track, sizeof(track_entry) * TRACK_SLOTS);
    pthread_mutex_unlock(&g_track_mu);
    return copy;
}

/* One injected run: returns whether it passed (and whether any allocation failed). */
static bool injected(const char *kind, long n, bool from, size_t baseline, long *nfailed)
{
    int before_failures = failures;
    char job[160];
    snprintf(job, sizeof(job), "%s-%s-%ld", cfg.job, kind, n);
    snprintf(g_run, sizeof(g_run), "%s N=%ld", kind, n);
    g_logline[0] = '\0';
    track_entry *snap = snapshot();
    atomic_store(&g_count, 0);
    atomic_store(&g_failed, 0);
    g_nframes = 0;
    atomic_store(&g_fail_from, from);
    atomic_store(&g_fail_at, n);
    phases ph = {0};
    run(job, !from, false, &ph);
    call("(the run's end)");
    g_call_t0 = 0;
    atomic_store(&g_fail_at, 0);
    alarm(0);
    *nfailed = atomic_load(&g_failed);
    /* The library's threads are joined by bw_loader_close: nothing of the run may be left. */
    size_t live = live_blocks();
    if (live > baseline) {
        failf("%zu blocks allocated during the run are still live after bw_loader_close "
              "(%ld allocations failed)",
              live - baseline, *nfailed);
        print_new_blocks(snap, g_run);
    }
    __real_free(snap);
    return failures == before_failures;
}

static int arg_index(int argc, char **argv, const char *name)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return i + 1;
    return 0;
}

static const char *arg(int argc, char **argv, const char *name, const char *def)
{
    int i = arg_index(argc, argv, name);
    return i ? argv[i] : def;
}

/* Runs N = first, first + 1, ... up to dense, then every stride-th N up to last. */
static void sweep(const char *kind, bool from, long first, long last, long dense, long stride,
                  size_t baseline)
{
    double t0 = now_s();
    long runs = 0, passed = 0, failed_allocs = 0, without = 0, slowest_n = 0;
    double slowest = 0;
    /* Once every allocation fails, a fetch cannot start and bw_loader_next waits out the
     * loader's deadline: a shorter one keeps the sweep short. A "once" run keeps 3 s, so that
     * its repeated calls are not cut short on a loaded machine. */
    g_timeout_ms = from ? 500 : 3000;
    for (long n = first; n <= last; n += n < dense ? 1 : stride) {
        long nf = 0;
        runs++;
        double t = now_s();
        passed += injected(kind, n, from, baseline, &nf);
        if ((t = now_s() - t) > slowest) {
            slowest = t;
            slowest_n = n;
        }
        if (g_times)
            printf("  %s N=%ld: %.3f s, %ld allocations failed\n", kind, n, t, nf);
        failed_allocs += nf;
        if (nf == 0)
            without++;
    }
    printf("sweep %s: N = %ld..%ld (every %ld-th after %ld): %ld runs, %ld passed, %ld allocations "
           "failed, %ld "
           "runs ended before their Nth allocation, %.1f s (the slowest: N=%ld, %.2f s)\n",
           kind, first, last, stride, dense, runs, passed, failed_allocs, without, now_s() - t0,
           slowest_n, slowest);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    cfg.coordinator = arg(argc, argv, "--coordinator", NULL);
    cfg.dataset = arg(argc, argv, "--dataset", NULL);
    cfg.job = arg(argc, argv, "--job", "alloc");
    cfg.tls_ca = arg(argc, argv, "--tls-ca", NULL);
    cfg.tls_cert = arg(argc, argv, "--tls-cert", NULL);
    cfg.tls_key = arg(argc, argv, "--tls-key", NULL);
    cfg.token_file = arg(argc, argv, "--token-file", NULL);
    cfg.samples = strtoull(arg(argc, argv, "--samples", "0"), NULL, 10);
    cfg.batch = strtoull(arg(argc, argv, "--batch", "8"), NULL, 10);
    cfg.other_holder = (uint32_t)strtoul(arg(argc, argv, "--other-holder", "0"), NULL, 10);
    const char *which = arg(argc, argv, "--sweep", "both");
    long stride = strtol(arg(argc, argv, "--stride", "1"), NULL, 10);
    long margin = strtol(arg(argc, argv, "--margin", "20"), NULL, 10);
    long first = strtol(arg(argc, argv, "--first", "1"), NULL, 10);
    g_hold_ms = strtol(arg(argc, argv, "--hold-ms", "0"), NULL, 10);
    long last = strtol(arg(argc, argv, "--last", "0"), NULL, 10);
    if (!cfg.coordinator || !cfg.dataset || !cfg.samples || !cfg.batch || cfg.batch > MAX_BATCH ||
        stride < 1 || margin < 0 || first < 1) {
        fprintf(stderr, "usage: see the comment at the top of tests/alloc/alloc_fail.c\n");
        return 2;
    }
    g_track = __real_calloc(TRACK_SLOTS, sizeof(*g_track));
    if (!g_track)
        return 2;
    signal(SIGALRM, on_alarm);
    g_trace = getenv("BW_ALLOC_FAIL_TRACE") != NULL;
    g_times = getenv("BW_ALLOC_FAIL_TIMES") != NULL;
    bw_set_log_callback(on_log, NULL, BW_LOG_WARN);

    /* Two probes: the first warms what the library sets up once per process (its baseline
     * of live blocks); the second counts a run's allocations. */
    phases ph = {0};
    char job[160];
    snprintf(g_run, sizeof(g_run), "probe");
    snprintf(job, sizeof(job), "%s-warm", cfg.job);
    run(job, false, true, &ph);
    if (failures || !ph.opened) {
        printf("FAIL: the probe run failed; nothing injected\n");
        return 1;
    }
    alarm(0);
    size_t baseline = live_blocks();
    atomic_store(&g_count, 0);
    double t0 = now_s();
    snprintf(job, sizeof(job), "%s-probe", cfg.job);
    run(job, false, false, &ph);
    alarm(0);
    double probe_s = now_s() - t0;
    long count = ph.reopen;
    printf("probe: %" PRIu64 " steps; allocations: open %ld, %ld ms held open %ld, next+cursor "
           "%ld, close %ld, open_at+next+close %ld, total %ld; %zu blocks live after close (the "
           "library's per-process state); one run %.3f s\n",
           want.steps, ph.open, g_hold_ms, ph.hold - ph.open, ph.next - ph.hold, ph.close - ph.next,
           ph.reopen - ph.close, count, baseline, probe_s);
    if (g_hold_ms > 0 && ph.hold == ph.open) {
        failf("nothing was allocated in the %ld ms the loader was held open (no heartbeat?)",
              g_hold_ms);
        return 1;
    }
    if (live_blocks() > baseline)
        failf("the probe run left %zu blocks live", live_blocks() - baseline);
    fflush(stdout);
    if (failures)
        return 1;

    /* --stride thins the sweep after the open phase (every N of bw_loader_open, where the
     * TLS and token settings are read, is always run); holding, the whole window of the
     * heartbeats, with a margin either side. */
    long dense = ph.open + margin;
    if (g_hold_ms > 0 && first == 1 && last == 0) {
        first = ph.open > margin ? ph.open - margin : 1;
        last = ph.hold + margin;
        dense = 0;
    }
    if (last == 0)
        last = count + margin;
    if (strcmp(which, "once") == 0 || strcmp(which, "both") == 0)
        sweep("once", false, first, last, dense, stride, baseline);
    if (strcmp(which, "from") == 0 || strcmp(which, "both") == 0)
        sweep("from", true, first, last, dense, stride, baseline);
    printf("%d failed checks\n", failures);
    return failures ? 1 : 0;
}
