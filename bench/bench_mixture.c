/*
 * Cost of mixing (core/jobs/mixture.h, docs/semantics.md "Mixtures"): nanoseconds per sample
 * of bw__mix_sampler_batch against its baseline in the same run, the sampler core over one
 * dataset of the same E with the O(1)-memory feistel shuffle (what a single-source job of that
 * size uses without an O(E) cache), and the sequential order (the floor: sharding alone). Each
 * is measured from step 0 and over the epoch's last steps (positions near 10^10), to show that
 * the cost does not grow with the step.
 * Then the configuration of bench/bench_mixture_jobs.py: two sources of 2^17 samples mixed
 * half and half (E = 2^18), one rank, batches of 256, against one dataset of 2^18 in torch's
 * shuffled order (what `--shuffle` gives a job of that size: a materialised randperm), and a
 * mixture of one source of 2^18 (the within-source permutation without an interleave).
 * Prints one JSON object per measurement; with `small`, only those last three (e.g. under
 * `perf record`).
 *
 *   bench_mixture [SAMPLES_PER_POINT [small]]     (default 2,000,000)
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
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: the machine is shared */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t sink; /* keeps results alive */

/* ns per sample over `batches` consecutive batches of `batch` of `rank` from `step`, of the
 * mixture m or else the single-dataset sampler s, best of `reps` */
static double time_batches(const bw__mix_sampler *m, const bw__sampler *s, uint64_t rank,
                           uint64_t step, uint64_t batches, size_t batch, int reps)
{
    enum { MAXB = 256 };
    uint64_t idx[MAXB];
    uint8_t pad[MAXB];
    uint32_t src[MAXB];
    bw__batch b = {idx, pad, 0, 0};
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = now();
        for (uint64_t i = 0; i < batches; i++) {
            if ((m ? bw__mix_sampler_batch(m, rank, step + i, &b, src, NULL)
                   : bw__sampler_batch(s, rank, step + i, &b)) != 0)
                return -1;
            sink += idx[0] + idx[batch - 1];
        }
        double dt = now() - t0;
        if (dt < best)
            best = dt;
    }
    return best * 1e9 / (double)(batches * batch);
}

static int bench_small(void)
{
    const uint64_t half = 1u << 17, e = 2 * half;
    const size_t batch = 256;
    char err[256];
    Batchwire__V1__WorldSegment seg = BATCHWIRE__V1__WORLD_SEGMENT__INIT;
    const Batchwire__V1__WorldSegment *hist[] = {&seg};
    seg.world_size = 1;
    bw__sampler_cfg cfg;
    bw__sampler_cfg_init(&cfg);
    cfg.mode = BW__MODE_TORCH;
    cfg.num_samples = e;
    cfg.world_size = 1;
    cfg.batch_size = batch;
    cfg.seed = 1;
    bw__sampler_cfg shuffled = cfg;
    shuffled.shuffle = true;
    uint64_t sizes[2] = {half, half}, weights[2] = {1, 1}, whole = e;
    bw__mix_spec spec = {sizes, weights, 2, e, NULL, BW__MIX_CYCLE};
    bw__mix_spec one = {&whole, weights, 1, e, NULL, BW__MIX_CYCLE};
    bw__sampler *s = NULL;
    bw__mix_sampler *m[2] = {NULL, NULL}; /* a mixture of the one dataset, of two halves */
    int rc = bw__sampler_new(&s, &shuffled, err, sizeof(err));
    if (rc == 0)
        rc = bw__mix_sampler_new(&m[0], &one, &cfg, hist, 1, 0, err, sizeof(err));
    if (rc == 0)
        rc = bw__mix_sampler_new(&m[1], &spec, &cfg, hist, 1, 0, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "bench_mixture: %s\n", err);
        bw__sampler_free(s);
        bw__mix_sampler_free(m[0]);
        return 1;
    }
    static const char *const names[] = {"single shuffled", "mixture of 1", "mixture of 2"};
    for (int k = 0; k < 3; k++)
        printf("{\"bench\":\"small\",\"order\":\"%s\",\"E\":%" PRIu64 ",\"ns_per_sample\":%.1f}\n",
               names[k], e,
               time_batches(k ? m[k - 1] : NULL, k ? NULL : s, 0, 0, e / batch, batch, 5));
    bw__sampler_free(s);
    bw__mix_sampler_free(m[0]);
    bw__mix_sampler_free(m[1]);
    return 0;
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
    if (argc > 2 && strcmp(argv[2], "small") == 0)
        return bench_small();
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
                   time_batches(NULL, s, 3, steps[i], batches, BATCH, 3));
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
                   n, (unsigned long long)E_SAMPLES, steps[i],
                   time_batches(m, NULL, 3, steps[i], batches, BATCH, 3));
        bw__mix_sampler_free(m);
    }
    if (bench_small() != 0)
        return 1;
    fprintf(stderr, "(sink %llu)\n", (unsigned long long)(sink & 1));
    return 0;
}
