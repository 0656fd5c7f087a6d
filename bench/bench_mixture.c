/*
 * Cost of mixing (core/jobs/mixture.h, docs/semantics.md "Mixtures"): nanoseconds per sample
 * of bw__mix_sampler_batch against its baseline in the same run, the sampler core over one
 * dataset of the same E with the O(1)-memory feistel shuffle (what a single-source job of that
 * size uses without an O(E) cache), and the sequential order (the floor: sharding alone). Each
 * is measured from step 0 and over the epoch's last steps (positions near 10^10), to show that
 * the cost does not grow with the step.
 * Prints one JSON object per measurement.
 *
 *   bench_mixture [SAMPLES_PER_POINT]     (default 2,000,000)
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/version.h"
#include "jobs/mixture.h"
#include "sampler/sampler.h"

#define E_SAMPLES 10000000000ull
#define BATCH 64
#define WORLD 8

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t sink; /* keeps results alive */

/* ns per sample over `batches` consecutive batches of rank 3 from `step`, best of 3 */
static double time_single(const bw__sampler *s, uint64_t step, uint64_t batches)
{
    uint64_t idx[BATCH];
    uint8_t pad[BATCH];
    bw__batch b = {idx, pad, 0, 0};
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        for (uint64_t i = 0; i < batches; i++) {
            if (bw__sampler_batch(s, 3, step + i, &b) != 0)
                return -1;
            sink += idx[0] + idx[BATCH - 1];
        }
        double dt = now() - t0;
        if (dt < best)
            best = dt;
    }
    return best * 1e9 / (double)(batches * BATCH);
}

static double time_mix(const bw__mix_sampler *s, uint64_t step, uint64_t batches)
{
    uint64_t idx[BATCH];
    uint8_t pad[BATCH];
    uint32_t src[BATCH];
    bw__batch b = {idx, pad, 0, 0};
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        for (uint64_t i = 0; i < batches; i++) {
            if (bw__mix_sampler_batch(s, 3, step + i, &b, src, NULL) != 0)
                return -1;
            sink += idx[0] + src[BATCH - 1];
        }
        double dt = now() - t0;
        if (dt < best)
            best = dt;
    }
    return best * 1e9 / (double)(batches * BATCH);
}

int main(int argc, char **argv)
{
    if (bw__version_flag(argc, argv, "bench_mixture"))
        return 0;
    uint64_t per_point = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
    if (per_point < BATCH) {
        fprintf(stderr, "bench_mixture: SAMPLES_PER_POINT must be at least %d\n", BATCH);
        return 2;
    }
    uint64_t batches = per_point / BATCH;
    /* the last steps of the epoch: positions near 10^10 */
    const uint64_t far = E_SAMPLES / (WORLD * BATCH) - batches - 1;
    const uint64_t steps[] = {0, far};
    char err[256];

    Batchwire__V1__WorldSegment seg = BATCHWIRE__V1__WORLD_SEGMENT__INIT;
    const Batchwire__V1__WorldSegment *hist[] = {&seg};
    seg.world_size = WORLD;
    bw__sampler_cfg cfg;
    bw__sampler_cfg_init(&cfg);
    cfg.mode = BW__MODE_TORCH;
    cfg.num_samples = E_SAMPLES;
    cfg.world_size = WORLD;
    cfg.batch_size = BATCH;
    cfg.seed = 7;

    for (int shuffled = 0; shuffled < 2; shuffled++) {
        bw__sampler_cfg c = cfg;
        c.shuffle = shuffled;
        c.shuffle_algo = shuffled ? BW__SHUFFLE_FEISTEL : BW__SHUFFLE_TORCH;
        bw__sampler *s;
        if (bw__sampler_new(&s, &c, err, sizeof(err)) != 0) {
            fprintf(stderr, "bench_mixture: %s\n", err);
            return 1;
        }
        for (size_t i = 0; i < 2; i++)
            printf("{\"bench\":\"single\",\"order\":\"%s\",\"E\":%llu,\"step\":%" PRIu64
                   ",\"ns_per_sample\":%.1f}\n",
                   shuffled ? "feistel" : "sequential", (unsigned long long)E_SAMPLES, steps[i],
                   time_single(s, steps[i], batches));
        bw__sampler_free(s);
    }

    static uint64_t sizes[BW__MIX_MAX_SOURCES], weights[BW__MIX_MAX_SOURCES];
    const size_t nsources[] = {1, 2, 5, 16, 256};
    for (size_t t = 0; t < sizeof(nsources) / sizeof(nsources[0]); t++) {
        size_t n = nsources[t];
        for (size_t j = 0; j < n; j++) {
            sizes[j] = 1000000000ull + 7919 * j; /* sizes near 10^9: passes straddle epochs */
            weights[j] = 1000000000ull * (1 + j % 7);
        }
        bw__mix_spec spec = {sizes, weights, n, E_SAMPLES, NULL, BW__MIX_CYCLE};
        bw__mix_sampler *m;
        if (bw__mix_sampler_new(&m, &spec, &cfg, hist, 1, 0, err, sizeof(err)) != 0) {
            fprintf(stderr, "bench_mixture: %s\n", err);
            return 1;
        }
        for (size_t i = 0; i < 2; i++)
            printf("{\"bench\":\"mixture\",\"sources\":%zu,\"E\":%llu,\"step\":%" PRIu64
                   ",\"ns_per_sample\":%.1f}\n",
                   n, (unsigned long long)E_SAMPLES, steps[i], time_mix(m, steps[i], batches));
        bw__mix_sampler_free(m);
    }
    fprintf(stderr, "(sink %llu)\n", (unsigned long long)(sink & 1));
    return 0;
}
