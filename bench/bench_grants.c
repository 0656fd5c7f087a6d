/*
 * What checking read grants costs a worker (docs/performance.md, "Read grants";
 * core/auth/grant.c): bw__grant_verify of a grant already verified (the cache: a lookup, a
 * compare, the request's dataset packed and compared), on one thread and on several at once,
 * against the same loop without the check; and of grants never seen before (two HMACs, the
 * claims decoded, the dataset hashed), as after every renewal. Datasets of 1 and 1,000
 * sources.
 *
 *   bench_grants [--reps N] [--threads N]
 *
 * Prints a Markdown table (median of --reps runs each, ns per request).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "auth/grant.h"
#include "batchwire/batchwire.h"
#include "common/util.h"
#include "common/version.h"

enum { CACHED = 1000000, FRESH = 20000, MAX_THREADS = 64 };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_grants: %s\n", what);
    exit(1);
}

typedef struct run {
    bw_grants *g;
    const Batchwire__V1__Dataset *ds;
    const Batchwire__V1__ReadGrant *grants; /* n of them, used in turn */
    size_t n, iters;
    bool check; /* false: the same loop without bw__grant_verify */
    double seconds;
} run;

static void *loop(void *arg)
{
    run *r = arg;
    char err[512];
    volatile size_t sink = 0;
    uint64_t t = bw__unix_ms();
    double t0 = now();
    for (size_t i = 0; i < r->iters; i++) {
        const Batchwire__V1__ReadGrant *gr = &r->grants[i % r->n];
        if (r->check) {
            if (bw__grant_verify(r->g, "worker-0", gr, r->ds, t, err, sizeof(err)) != BW_OK)
                die(err);
        } else {
            sink += gr->claims.len + r->ds->n_sources; /* what the loop reads anyway */
        }
    }
    r->seconds = now() - t0;
    (void)sink;
    return NULL;
}

/* ns per request, median of reps, with `threads` threads running `iters` each. */
static double measure(run *proto, int threads, int reps)
{
    double *v = calloc((size_t)reps, sizeof(*v));
    for (int k = 0; k < reps; k++) {
        run rs[MAX_THREADS];
        pthread_t th[MAX_THREADS];
        for (int i = 0; i < threads; i++) {
            rs[i] = *proto;
            pthread_create(&th[i], NULL, loop, &rs[i]);
        }
        double worst = 0;
        for (int i = 0; i < threads; i++) {
            pthread_join(th[i], NULL);
            worst = rs[i].seconds > worst ? rs[i].seconds : worst;
        }
        v[k] = worst * 1e9 / (double)proto->iters;
    }
    qsort(v, (size_t)reps, sizeof(*v), cmp_double);
    double m = v[reps / 2];
    free(v);
    return m;
}

/* `n` grants of job "bench" rank i over ds, and their proofs for worker-0, in arena. */
static Batchwire__V1__ReadGrant *mint(bw_grants *g, const Batchwire__V1__Dataset *ds, size_t n,
                                      bw_arena *arena)
{
    Batchwire__V1__ReadGrant *v = bw__arena_alloc(arena, n * sizeof(*v));
    bw_grant_claims c;
    memset(&c, 0, sizeof(c));
    c.job = "bench";
    if (!v || bw__grant_dataset_hash(ds, c.dataset) != BW_OK)
        die("out of memory");
    c.expires_ms = bw__unix_ms() + 3600000;
    for (size_t i = 0; i < n; i++) {
        ProtobufCBinaryData claims, secret;
        c.rank = (uint32_t)i;
        c.lease_tag = bw__grant_lease_tag(i, 1);
        uint8_t *proof = bw__arena_alloc(arena, BW_GRANT_PROOF_BYTES);
        if (!proof || bw__grant_mint(g, &c, arena, &claims, &secret) != BW_OK)
            die("out of memory");
        bw__grant_proof(secret.data, "worker-0", proof);
        batchwire__v1__read_grant__init(&v[i]);
        v[i].claims = claims;
        v[i].proof.data = proof;
        v[i].proof.len = BW_GRANT_PROOF_BYTES;
    }
    return v;
}

int main(int argc, char **argv)
{
    if (bw__version_flag(argc, argv, "bench_grants"))
        return 0;
    int reps = 5, threads = 2;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 == argc)
            die("usage: bench_grants [--reps N] [--threads N] (each flag takes a value)");
        if (strcmp(argv[i], "--reps") == 0)
            reps = (int)strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = (int)strtol(argv[i + 1], NULL, 10);
        else
            die("usage: bench_grants [--reps N] [--threads N]");
    }
    if (reps < 1 || threads < 1 || threads > MAX_THREADS)
        die("--reps and --threads must be 1 or more (threads at most 64)");
    char path[] = "/tmp/bench-grants-XXXXXX";
    int fd = mkstemp(path);
    static const char key[] =
        "k1 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
    if (fd < 0 || write(fd, key, sizeof(key) - 1) != (ssize_t)(sizeof(key) - 1))
        die("cannot write the key file");
    close(fd);
    bw_grants *g = NULL;
    char err[512];
    if (bw__grants_open(path, &g, err, sizeof(err)) != BW_OK)
        die(err);
    unlink(path);

    printf("| dataset | check | threads | ns per request |\n|---|---|---|---|\n");
    static const size_t sizes[] = {1, 1000};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t n = sizes[s];
        char **src = calloc(n, sizeof(*src));
        char *names = calloc(n, 32);
        if (!src || !names)
            die("out of memory");
        for (size_t i = 0; i < n; i++) {
            src[i] = names + 32 * i;
            snprintf(src[i], 32, "train/part-%05u.npy", (unsigned)(i % 100000));
        }
        Batchwire__V1__Dataset ds = BATCHWIRE__V1__DATASET__INIT;
        ds.format = "npy";
        ds.sources = src;
        ds.n_sources = n;
        bw_arena arena;
        bw__arena_init(&arena, 0);
        /* Cached: 16 leases' grants (a job's ranks at one worker), each verified before. */
        Batchwire__V1__ReadGrant *few = mint(g, &ds, 16, &arena);
        run r = {g, &ds, few, 16, CACHED / (n > 1 ? 100 : 1), false, 0};
        const int ts[2] = {1, threads};
        for (int k = 0; k < (threads > 1 ? 2 : 1); k++) {
            int t = ts[k];
            r.check = false;
            double off = measure(&r, t, reps);
            r.check = true;
            double on = measure(&r, t, reps);
            printf("| %zu source%s | none | %d | %.1f |\n", n, n > 1 ? "s" : "", t, off);
            printf("| %zu source%s | cached grant | %d | %.1f |\n", n, n > 1 ? "s" : "", t, on);
        }
        /* Fresh: every request a grant not seen before (the cache holds 4096). */
        Batchwire__V1__ReadGrant *many = mint(g, &ds, FRESH, &arena);
        run f = {g, &ds, many, FRESH, FRESH, true, 0};
        double *v = calloc((size_t)reps, sizeof(*v));
        for (int k = 0; k < reps; k++) {
            bw_grants *cold = NULL;
            snprintf(path, sizeof(path), "/tmp/bench-grants-XXXXXX");
            int wfd = mkstemp(path);
            if (wfd < 0 || write(wfd, key, sizeof(key) - 1) != (ssize_t)(sizeof(key) - 1))
                die("cannot write the key file");
            close(wfd);
            if (bw__grants_open(path, &cold, err, sizeof(err)) != BW_OK)
                die(err);
            unlink(path);
            f.g = cold;
            loop(&f);
            v[k] = f.seconds * 1e9 / (double)f.iters;
            bw__grants_free(cold);
        }
        qsort(v, (size_t)reps, sizeof(*v), cmp_double);
        printf("| %zu source%s | new grant | 1 | %.1f |\n", n, n > 1 ? "s" : "", v[reps / 2]);
        free(v);
        bw__arena_reset(&arena);
        free(src);
        free(names);
    }
    bw__grants_free(g);
    return 0;
}
