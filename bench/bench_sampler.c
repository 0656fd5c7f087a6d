/*
 * Sampler benchmark. Each subcommand prints one JSON object per measurement on stdout;
 * bench/bench_sampler.py runs them next to the PyTorch baseline and prints the ratios.
 *
 *   bench_sampler randperm N REPEATS   torch-exact permutation of N (the epoch cache, 32-bit
 *                                      words, and the same into 64-bit words like torch's tensor)
 *   bench_sampler batch_at N R B       batch s of rank 0 for s = 0, 1e3, 1e6 once cached
 *   bench_sampler feistel N            per-index cost and memory of the feistel shuffle
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sampler/randperm.h"
#include "common/version.h"
#include "sampler/sampler.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t sink; /* keeps results alive */

static int bench_randperm(uint64_t n, int repeats)
{
    uint32_t *p32 = malloc(n * sizeof(uint32_t));
    uint64_t *p64 = malloc(n * sizeof(uint64_t));
    if (!p32 || !p64) {
        fprintf(stderr, "bench_sampler: out of memory for n=%" PRIu64 "\n", n);
        free(p32);
        free(p64);
        return 1;
    }
    double best32 = 1e30, best64 = 1e30;
    if (repeats < 1)
        repeats = 1;
    for (int i = 0; i < repeats; i++) {
        double t0 = now();
        bw__randperm_u32(p32, n, 42, BW__RANDPERM_AUTO);
        double t1 = now();
        bw__randperm_u64(p64, n, 42, BW__RANDPERM_AUTO);
        double t2 = now();
        if (t1 - t0 < best32)
            best32 = t1 - t0;
        if (t2 - t1 < best64)
            best64 = t2 - t1;
        sink += p32[n / 2] + p64[n / 3];
    }
    printf("{\"bench\":\"randperm\",\"n\":%" PRIu64 ",\"repeats\":%d,\"seconds_u32\":%.4f,"
           "\"seconds_u64\":%.4f,\"first\":[%" PRIu32 ",%" PRIu32 ",%" PRIu32 "]}\n",
           n, repeats, best32, best64, p32[0], p32[1], p32[2]);
    free(p32);
    free(p64);
    return 0;
}

static int bench_batch_at(uint64_t n, uint64_t world, uint64_t batch)
{
    bw__sampler_cfg c;
    bw__sampler_cfg_init(&c);
    c.mode = BW__MODE_TORCH;
    c.num_samples = n;
    c.world_size = world;
    c.batch_size = batch;
    c.shuffle = true;
    c.seed = 42;
    char err[256];
    bw__sampler *s;
    double t0 = now();
    if (bw__sampler_new(&s, &c, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_sampler: %s\n", err);
        return 1;
    }
    double cache = now() - t0;
    uint64_t idx[4096];
    uint8_t pad[4096];
    bw__batch b = {idx, pad, 0, 0};
    uint64_t steps[] = {0, 1000, 1000000};
    printf("{\"bench\":\"epoch_cache\",\"n\":%" PRIu64 ",\"seconds\":%.4f,\"bytes\":%zu}\n", n,
           cache, bw__sampler_memory(s));
    for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
        const int calls = 200000;
        if (steps[k] >= bw__sampler_end_step(s, 0)) {
            fprintf(stderr, "bench_sampler: step %" PRIu64 " is past the epoch\n", steps[k]);
            return 1;
        }
        double t1 = now();
        for (int i = 0; i < calls; i++) {
            /* rotate ranks so the lookups are not one cached line */
            bw__sampler_batch(s, (uint64_t)i % world, steps[k], &b);
            sink += b.indices[0];
        }
        double per = (now() - t1) / calls;
        printf("{\"bench\":\"batch_at\",\"n\":%" PRIu64 ",\"world_size\":%" PRIu64
               ",\"batch_size\":%" PRIu64 ",\"step\":%" PRIu64 ",\"ns_per_batch\":%.1f}\n",
               n, world, batch, steps[k], per * 1e9);
    }
    bw__sampler_free(s);
    return 0;
}

static int bench_feistel(uint64_t n)
{
    bw__sampler_cfg c;
    bw__sampler_cfg_init(&c);
    c.num_samples = n;
    c.batch_size = 1024;
    c.shuffle = true;
    c.shuffle_algo = BW__SHUFFLE_FEISTEL;
    c.seed = 42;
    char err[256];
    bw__sampler *s;
    if (bw__sampler_new(&s, &c, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_sampler: %s\n", err);
        return 1;
    }
    uint64_t idx[1024];
    bw__batch b = {idx, NULL, 0, 0};
    const uint64_t batches = 20000;
    double t0 = now();
    for (uint64_t i = 0; i < batches; i++) {
        bw__sampler_batch(s, 0, (i * 7919) % bw__sampler_end_step(s, 0), &b);
        sink += idx[0];
    }
    double per = (now() - t0) / (double)(batches * 1024);
    printf("{\"bench\":\"feistel\",\"n\":%" PRIu64 ",\"ns_per_index\":%.2f,\"bytes\":%zu}\n", n,
           per * 1e9, bw__sampler_memory(s));
    bw__sampler_free(s);
    return 0;
}

int main(int argc, char **argv)
{
    if (bw__version_flag(argc, argv, "bench_sampler"))
        return 0;
    int rc = 2;
    if (argc == 4 && !strcmp(argv[1], "randperm"))
        rc = bench_randperm(strtoull(argv[2], NULL, 10), (int)strtol(argv[3], NULL, 10));
    else if (argc == 5 && !strcmp(argv[1], "batch_at"))
        rc = bench_batch_at(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                            strtoull(argv[4], NULL, 10));
    else if (argc == 3 && !strcmp(argv[1], "feistel"))
        rc = bench_feistel(strtoull(argv[2], NULL, 10));
    else
        fprintf(stderr, "usage: bench_sampler randperm N REPEATS | batch_at N R B | feistel N\n");
    if (sink == 42)
        fprintf(stderr, "(sink)\n");
    return rc;
}
