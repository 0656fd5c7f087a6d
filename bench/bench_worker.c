/*
 * Worker serving throughput: a worker's Data service in this process (the real handlers,
 * over loopback gRPC, plaintext) serves npy datasets of 256 B, 4 KiB, 64 KiB and 1 MiB
 * samples from the page cache to client threads that read SampleBatch streams as a trainer
 * would (protobuf-c unpack); the baseline reads the same bytes of the same file in the same
 * order with pread in this process. Indices are a fixed shuffle of the whole dataset.
 *
 *   bench_worker [--dir DIR] [--mib N] [--reps N] [--clients N] [--threads N] [--msg BYTES]
 *                [--per-req N] [--metrics]
 *
 * --msg is the message limit clients ask for (default: the worker's 16 MiB); --per-req the
 * samples per request (default: about 64 MiB of them, at most 65,536).
 *
 * --metrics compares the worker with its metrics on (worker/metrics.h, as --metrics-listen
 * turns them on) and off instead of with pread: the two alternate within every repetition,
 * and the counters are checked against what was served. Besides throughput it shows the CPU
 * time this process (clients and worker) spent per sample, which other load on the machine
 * disturbs less.
 *
 * Prints a Markdown table (median of --reps runs each) and writes the dataset under DIR
 * (default /tmp), removed at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "placement/placement.h"
#include "worker/data.h"
#include "worker/executor.h"
#include "worker/metrics.h"
#include "worker/read_path.h"
#include "worker/request.h"
#include "worker/worker.h"
#include "common/log.h"
#include "common/version.h"
#include "formats/synth.h"
#include "rpc/client.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *err)
{
    fprintf(stderr, "bench_worker: %s: %s\n", what, err);
    exit(1);
}

/* Writes DIR/bench-SIZE.npy: n rows of `size` uint8, row i = synth(i). */
static void write_npy(const char *path, uint64_t n, uint64_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        die(path, strerror(errno));
    char dict[256];
    int dl = snprintf(dict, sizeof(dict),
                      "{'descr': '|u1', 'fortran_order': False, 'shape': (%llu, %llu), }",
                      (unsigned long long)n, (unsigned long long)size);
    size_t pad = (64 - (10 + (size_t)dl + 1) % 64) % 64;
    uint16_t hl = (uint16_t)(dl + (int)pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hl & 0xff, f);
    fputc(hl >> 8, f);
    fwrite(dict, 1, (size_t)dl, f);
    for (size_t i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
    uint8_t *row = malloc(size);
    for (uint64_t i = 0; i < n; i++) {
        bw__synth_fill(i, row, size);
        fwrite(row, 1, size, f);
    }
    free(row);
    if (fclose(f) != 0)
        die(path, "write failed");
}

typedef struct job {
    const char *target, *source;
    const uint64_t *idx;
    size_t n, per_req;
    uint32_t msg;
    uint64_t size;
    uint64_t bytes, samples;
    int rc;
    char err[1024];
} job;

static void *client_thread(void *arg)
{
    job *j = arg;
    bw_rpc_channel_opts co;
    memset(&co, 0, sizeof(co));
    co.target = j->target;
    co.max_receive_bytes = 64 << 20;
    bw_rpc_channel *ch = NULL;
    j->rc = bw__rpc_channel_open(&co, &ch, j->err, sizeof(j->err));
    bw_arena arena;
    bw__arena_init(&arena, 0);
    char *srcs[] = {(char *)j->source};
    for (size_t off = 0; off < j->n && j->rc == BW_OK; off += j->per_req) {
        Batchwire__V1__Dataset ds = BATCHWIRE__V1__DATASET__INIT;
        ds.format = "npy";
        ds.sources = srcs;
        ds.n_sources = 1;
        Batchwire__V1__ReadSamplesRequest req = BATCHWIRE__V1__READ_SAMPLES_REQUEST__INIT;
        req.dataset = &ds;
        req.indices = (uint64_t *)j->idx + off;
        req.n_indices = j->n - off < j->per_req ? j->n - off : j->per_req;
        req.max_message_bytes = j->msg;
        bw_rpc_stream *st = NULL;
        j->rc = bw__rpc_stream_open(ch, BW_METHOD(BW_M_DATA_READ_SAMPLES), &req.base, 600000, &st,
                                    j->err, sizeof(j->err));
        while (j->rc == BW_OK) {
            ProtobufCMessage *m = NULL;
            int rc = bw__rpc_stream_next(st, &arena, &m, j->err, sizeof(j->err));
            if (rc == BW_RPC_STREAM_END)
                break;
            if (rc != BW_OK) {
                j->rc = rc;
                break;
            }
            const Batchwire__V1__SampleBatch *b = (const void *)m;
            for (size_t i = 0; i < b->n_samples; i++) {
                const Batchwire__V1__Sample *s = b->samples[i];
                j->bytes += s->data.len;
                if (s->chunk_offset + s->data.len == s->size)
                    j->samples++;
                /* spot check: the first 8 bytes are word 0 of the sample's index */
                if (s->chunk_offset == 0 && s->data.len >= 8 &&
                    memcmp(s->data.data, &(uint64_t){bw__synth_word(s->index, 0)}, 8) != 0) {
                    snprintf(j->err, sizeof(j->err), "sample %llu has wrong bytes",
                             (unsigned long long)s->index);
                    j->rc = BW_CORRUPT;
                }
            }
            bw__arena_reset(&arena);
        }
        bw__rpc_stream_close(st);
    }
    bw__arena_reset(&arena);
    bw__rpc_channel_close(ch);
    return NULL;
}

static uint32_t msg_limit;
static size_t per_req_opt; /* --per-req; 0: about 64 MiB per request */

/* CPU seconds (user + system) this process has used: clients and worker together. */
static double cpu_now(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static double last_cpu; /* CPU seconds of the last run_rpc */

static double run_rpc(const char *target, const char *source, const uint64_t *idx, size_t n,
                      uint64_t size, int clients)
{
    job jobs[16];
    pthread_t th[16];
    size_t per_req = (size_t)((64ull << 20) / size); /* ~64 MiB per request */
    if (per_req < 1)
        per_req = 1;
    if (per_req > 65536)
        per_req = 65536;
    if (per_req_opt)
        per_req = per_req_opt;
    double c0 = cpu_now();
    double t0 = now();
    for (int c = 0; c < clients; c++) {
        memset(&jobs[c], 0, sizeof(jobs[c]));
        jobs[c].target = target;
        jobs[c].source = source;
        jobs[c].idx = idx + n * (size_t)c / (size_t)clients;
        jobs[c].n = n * (size_t)(c + 1) / (size_t)clients - n * (size_t)c / (size_t)clients;
        jobs[c].per_req = per_req;
        jobs[c].size = size;
        jobs[c].msg = msg_limit;
        pthread_create(&th[c], NULL, client_thread, &jobs[c]);
    }
    uint64_t samples = 0;
    for (int c = 0; c < clients; c++) {
        pthread_join(th[c], NULL);
        if (jobs[c].rc != BW_OK)
            die("ReadSamples", jobs[c].err);
        samples += jobs[c].samples;
    }
    double t = now() - t0;
    last_cpu = cpu_now() - c0;
    if (samples != n)
        die("ReadSamples", "missing samples");
    return t;
}

static double run_pread(const char *path, const uint64_t *idx, size_t n, uint64_t size,
                        uint64_t data_off)
{
    int fd = open(path, O_RDONLY);
    uint8_t *buf = malloc(size);
    uint64_t x = 0;
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        if (pread(fd, buf, size, (off_t)(data_off + idx[i] * size)) != (ssize_t)size)
            die(path, "short pread");
        x ^= buf[0] ^ buf[size - 1];
    }
    double t = now() - t0;
    close(fd);
    free(buf);
    if (x == 0x1234567)
        printf(" ");
    return t;
}

/* --metrics: what a scrape reads of this worker (metrics.h). */
static void bench_state(void *user, bw__wm_state *out)
{
    bw_worker *w = user;
    out->in_flight_bytes = bw__exec_held(w->exec);
    bw__ds_cache_counts(w->datasets, &out->datasets, &out->files);
}

/* --metrics: the counters say that `samples` samples of `size` bytes of `rel` were served. */
static void check_counted(bw_metrics *reg, const char *rel, uint64_t samples, uint64_t size)
{
    char *text = NULL, want[256];
    size_t len = 0;
    if (bw__metrics_render(reg, &text, &len) != BW_OK)
        die("metrics", "cannot render");
    const char *names[] = {"samples", "bytes"};
    const uint64_t values[] = {samples, samples * size};
    for (int i = 0; i < 2; i++) {
        snprintf(want, sizeof(want),
                 "batchwire_worker_%s_served_total{dataset=\"npy:%s\",transport=\"grpc\"} %llu\n",
                 names[i], rel, (unsigned long long)values[i]);
        if (!strstr(text, want))
            die("metrics: the counters do not say", want);
    }
    free(text);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (bw__version_flag(argc, argv, "bench_worker"))
        return 0;
    const char *dir = "/tmp";
    int mib = 256, reps = 3, clients = 2, threads = 2;
    bool cmp_metrics = false; /* --metrics, a flag without a value: taken out of argv */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--metrics") == 0) {
            cmp_metrics = true;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof(*argv));
            argc--;
            break;
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--dir") == 0)
            dir = argv[i + 1];
        else if (strcmp(argv[i], "--mib") == 0)
            mib = (int)strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = (int)strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--clients") == 0)
            clients = (int)strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--msg") == 0)
            msg_limit = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--per-req") == 0)
            per_req_opt = (size_t)strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = (int)strtol(argv[i + 1], NULL, 10);
    }
    if (reps < 1 || reps > 15 || clients < 1 || clients > 16 || mib < 1)
        die("usage", "bench_worker [--dir DIR] [--mib N] [--reps 1..15] [--clients 1..16]");
    char root[1024];
    snprintf(root, sizeof(root), "%s/bench-worker-XXXXXX", dir);
    if (!mkdtemp(root))
        die(root, strerror(errno));
    char real[4096];
    if (!realpath(root, real))
        die(root, strerror(errno));

    char err[512];
    static bw_worker_config cfg;
    cfg.common.max_message_bytes = 16 << 20;
    static bw_worker w;
    w.cfg = &cfg;
    snprintf(w.id, sizeof(w.id), "bench");
    w.datasets = bw__ds_cache_new(real);
    bw__pview_init(&w.placement);
    bw__exec_opts xo = {4, (uint64_t)1 << 34, 1000, "budget"}; /* no admission limit here */
    if (bw__exec_start(&xo, &w.exec, err, sizeof(err)) != BW_OK)
        die("executor", err);
    const bw_rpc_handler handlers[] = {
        {BW_METHOD(BW_M_DATA_READ_SAMPLES), bw__data_read_samples},
    };
    bw_rpc_server_opts so;
    memset(&so, 0, sizeof(so));
    so.listen = "127.0.0.1:0";
    so.threads = threads;
    so.requests_per_method = 4;
    so.max_receive_bytes = 64 << 20;
    so.call_memory_limit = 256 << 20;
    so.role = "worker";
    so.raw_methods = bw__data_raw_methods;
    so.nraw_methods = bw__data_nraw_methods;
    bw_rpc_server *srv = NULL;
    char bound[256];
    if (bw__rpc_server_start(&so, handlers, 1, &w, &srv, bound, sizeof(bound), err, sizeof(err)) !=
        BW_OK)
        die("server", err);
    bw_metrics *reg = cmp_metrics ? bw__metrics_new() : NULL;
    int mrc = BW_OK;
    bw__wm *wm = bw__wm_new(reg, bench_state, &w, &mrc); /* on for half the runs */
    if (cmp_metrics && !wm)
        die("metrics", "out of memory");

    if (cmp_metrics)
        printf("| sample | samples/s metrics off | MiB/s off | samples/s metrics on | MiB/s on | "
               "on / off | CPU µs/sample off | on | on / off |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
    else
        printf("| sample | samples/s gRPC | MiB/s gRPC | samples/s pread | MiB/s pread | gRPC / "
               "pread |\n|---|---|---|---|---|---|\n");
    const uint64_t sizes[] = {256, 4096, 65536, 1 << 20};
    for (int k = 0; k < 4; k++) {
        uint64_t size = sizes[k], n = ((uint64_t)mib << 20) / size;
        char rel[64], path[4200];
        snprintf(rel, sizeof(rel), "bench-%llu.npy", (unsigned long long)size);
        snprintf(path, sizeof(path), "%s/%s", real, rel);
        write_npy(path, n, size);
        uint64_t *idx = malloc(n * sizeof(*idx));
        for (uint64_t i = 0; i < n; i++)
            idx[i] = i;
        for (uint64_t i = n - 1; i > 0; i--) { /* fixed shuffle */
            uint64_t j = bw__placement_mix64(i) % (i + 1), t = idx[i];
            idx[i] = idx[j];
            idx[j] = t;
        }
        struct stat st;
        stat(path, &st);
        uint64_t data_off = (uint64_t)st.st_size - n * size;
        /* warm the page cache and the worker's dataset cache */
        run_pread(path, idx, n, size, data_off);
        run_rpc(bound, rel, idx, n < 1000 ? n : 1000, size, 1);
        double tr[15], tp[15], cr[15], cp[15]; /* wall; CPU (--metrics) */
        for (int r = 0; r < reps; r++) {
            if (!cmp_metrics) {
                tr[r] = run_rpc(bound, rel, idx, n, size, clients);
                tp[r] = run_pread(path, idx, n, size, data_off);
                continue;
            }
            for (int h = 0; h < 2; h++) { /* off then on, on then off: alternately first */
                bool on = (h + r) % 2 == 0;
                w.metrics = on ? wm : NULL; /* no request is running */
                (on ? tr : tp)[r] = run_rpc(bound, rel, idx, n, size, clients);
                (on ? cr : cp)[r] = last_cpu;
            }
            w.metrics = NULL;
        }
        if (cmp_metrics)
            check_counted(reg, rel, (uint64_t)reps * n, size);
        qsort(tr, (size_t)reps, sizeof(double), cmp_double);
        qsort(tp, (size_t)reps, sizeof(double), cmp_double);
        qsort(cr, (size_t)reps, sizeof(double), cmp_double);
        qsort(cp, (size_t)reps, sizeof(double), cmp_double);
        double r = tr[reps / 2], p = tp[reps / 2], mibs = (double)(n * size) / (1 << 20);
        char label[32];
        if (size >= (1 << 20))
            snprintf(label, sizeof(label), "%llu MiB", (unsigned long long)(size >> 20));
        else if (size >= 1024)
            snprintf(label, sizeof(label), "%llu KiB", (unsigned long long)(size >> 10));
        else
            snprintf(label, sizeof(label), "%llu B", (unsigned long long)size);
        if (cmp_metrics) /* the baseline (p) is metrics off */
            printf("| %s | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | %.3f | %.3f |\n", label,
                   (double)n / p, mibs / p, (double)n / r, mibs / r, p / r,
                   cp[reps / 2] * 1e6 / (double)n, cr[reps / 2] * 1e6 / (double)n,
                   cr[reps / 2] / cp[reps / 2]);
        else
            printf("| %s | %.0f | %.0f | %.0f | %.0f | %.2f |\n", label, (double)n / r, mibs / r,
                   (double)n / p, mibs / p, p / r);
        fflush(stdout);
        free(idx);
        unlink(path);
    }
    bw__rpc_server_stop(srv, 1000);
    bw__exec_stop(w.exec);
    bw__ds_cache_free(w.datasets);
    bw__pview_destroy(&w.placement);
    bw__wm_free(wm);
    bw__metrics_free(reg);
    rmdir(real);
    return 0;
}
