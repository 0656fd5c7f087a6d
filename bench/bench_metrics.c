/*
 * What metrics cost (docs/performance.md, "Metrics"): the worker's hooks per read request
 * (arrival, the dataset's counters, end with its latency: worker/metrics.h) on one thread and
 * on several at once, against the same loop without them; and rendering a scrape
 * (core/metrics/metrics.h) of a coordinator-sized registry -- 7 series per rank, as the
 * coordinator's collector emits them after copying the jobs' state under their lock
 * (server/metrics.c) -- for 1,000 to 100,000 ranks.
 *
 *   bench_metrics [--reps N] [--threads N]
 *
 * Prints Markdown tables (median of --reps runs each).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batchwire/batchwire.h"
#include "common/version.h"
#include "worker/metrics.h"
#include "worker/request.h"

enum { REQUESTS = 1000000, SAMPLES_PER_REQUEST = 64, SAMPLE_BYTES = 256 };

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

static void no_state(void *user, bw__wm_state *out)
{
    (void)user;
    (void)out;
}

typedef struct hooks {
    bw__wm *m; /* NULL: metrics off */
    double seconds;
} hooks;

/* What a worker does per request about metrics, REQUESTS times: begin, find the dataset's
 * counters (bw__rp_meter), add a request's samples (as the read path does, in one batch),
 * end with a latency. With m NULL, the same calls with metrics off. */
static void *requests(void *arg)
{
    hooks *h = arg;
    char *src[] = {"train/part-*.npy"};
    Batchwire__V1__Dataset ds = BATCHWIRE__V1__DATASET__INIT;
    ds.format = "npy";
    ds.sources = src;
    ds.n_sources = 1;
    double t0 = now();
    for (int i = 0; i < REQUESTS; i++) {
        uint64_t t = bw__wm_begin(h->m, BW_WM_DATA_CHANNEL);
        bw__wm_served s = bw__wm_served_for(h->m, BW_WM_DATA_CHANNEL, &ds);
        bw__counter_add(s.samples, SAMPLES_PER_REQUEST);
        bw__counter_add(s.bytes, SAMPLES_PER_REQUEST * SAMPLE_BYTES);
        bw__wm_end(h->m, BW_WM_DATA_CHANNEL, BW_REQ_SAMPLES, t, BW_OK);
    }
    h->seconds = now() - t0;
    return NULL;
}

/* ns per request with `threads` threads at once (the slowest thread's time). */
static double per_request(bw__wm *m, int threads)
{
    hooks h[16];
    pthread_t th[16];
    for (int i = 0; i < threads; i++) {
        h[i] = (hooks){m, 0};
        pthread_create(&th[i], NULL, requests, &h[i]);
    }
    double worst = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        worst = h[i].seconds > worst ? h[i].seconds : worst;
    }
    return worst / REQUESTS * 1e9;
}

typedef struct ranks {
    bw_metric *f[7];
    int n;
} ranks;

static void emit_ranks(void *user, bw_metrics_sink *sink)
{
    ranks *r = user;
    for (int k = 0; k < r->n; k++) {
        char job[32], rank[16];
        snprintf(job, sizeof(job), "job-%d", k / 1000);
        snprintf(rank, sizeof(rank), "%d", k % 1000);
        for (int i = 0; i < 7; i++)
            bw__metrics_emit(sink, r->f[i], (const char *[]){job, rank}, (double)k * 1.5);
    }
}

static const char *const RANK_NAMES[7] = {"bench_rank_epoch",
                                          "bench_rank_step",
                                          "bench_rank_batches_total",
                                          "bench_rank_per_second",
                                          "bench_rank_committed_epoch",
                                          "bench_rank_committed_step",
                                          "bench_rank_commit_age_seconds"};

int main(int argc, char **argv)
{
    if (bw__version_flag(argc, argv, "bench_metrics"))
        return 0;
    int reps = 5, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--reps") == 0)
            reps = (int)strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = (int)strtol(argv[i + 1], NULL, 10);
    }
    if (reps < 1 || reps > 15 || threads < 1 || threads > 16) {
        fprintf(stderr, "usage: bench_metrics [--reps 1..15] [--threads 1..16]\n");
        return 2;
    }
    bw_metrics *reg = bw__metrics_new();
    int rc = BW_OK;
    bw__wm *m = bw__wm_new(reg, no_state, NULL, &rc);
    if (!m)
        return 1;

    printf("| worker hooks per request | threads | ns off | ns on | on - off |\n"
           "|---|---|---|---|---|\n");
    for (int t = 1; t <= threads; t += threads > 1 ? threads - 1 : 1) {
        double off[15], on[15];
        for (int r = 0; r < reps; r++) {
            off[r] = per_request(NULL, t);
            on[r] = per_request(m, t);
        }
        qsort(off, (size_t)reps, sizeof(double), cmp_double);
        qsort(on, (size_t)reps, sizeof(double), cmp_double);
        printf("| begin, dataset counters, %d samples, end | %d | %.0f | %.0f | %.0f |\n",
               SAMPLES_PER_REQUEST, t, off[reps / 2], on[reps / 2], on[reps / 2] - off[reps / 2]);
    }

    printf("\n| ranks | series | scrape bytes | render ms |\n|---|---|---|---|\n");
    static bw_metric_def defs[7];
    ranks rk = {{NULL}, 0};
    bw_metrics *coord = bw__metrics_new();
    for (int i = 0; i < 7; i++) {
        defs[i] = (bw_metric_def)BW_METRIC_DEF(RANK_NAMES[i], BW_GAUGE, "a rank's value",
                                               "job_name", "rank");
        if (strstr(RANK_NAMES[i], "_total"))
            defs[i].type = BW_COUNTER;
        rk.f[i] = bw__metrics_add_collected(coord, &defs[i]);
    }
    bw__metrics_add_collector(coord, emit_ranks, &rk, NULL);
    const int sizes[] = {1000, 10000, 100000};
    for (int k = 0; k < 3; k++) {
        rk.n = sizes[k];
        double ms[15];
        size_t bytes = 0;
        for (int r = 0; r < reps; r++) {
            char *text = NULL;
            double t0 = now();
            if (bw__metrics_render(coord, &text, &bytes) != BW_OK)
                return 1;
            ms[r] = (now() - t0) * 1e3;
            free(text);
        }
        qsort(ms, (size_t)reps, sizeof(double), cmp_double);
        printf("| %d | %d | %zu | %.1f |\n", sizes[k], sizes[k] * 7, bytes, ms[reps / 2]);
    }
    bw__metrics_free(coord);
    bw__wm_free(m);
    bw__metrics_free(reg);
    return 0;
}
