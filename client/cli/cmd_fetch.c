/* batchwire fetch: joins a job as one rank and pulls its batches through libbatchwire,
 * printing one JSON line per batch (indices, real count, sha256 of the batch bytes) and a
 * summary line. The tool tests, benchmarks and the demo check batchwire with. */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/sha.h>

#include "batchwire/loader.h"
#include "commands.h"
#include "common/interrupt.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "jobs/mixture.h"
#include "rpc/daemon.h"

typedef struct fetch_cfg {
    char *coordinator, *job, *dataset, *resume, *cursor_out, *device, *resume_elastic;
    char *dataset_fields; /* --dataset-field values, one a line */
    char *transform, *transform_field;
    char *mix; /* --mix values, one a line */
    char *mix_policy;
    int64_t mix_samples;
    int64_t rank, world_size;
    int mode, shuffle_algo;
    int64_t batch_size, epochs, max_steps, prefetch, timeout_ms, retry_ms, commit_every;
    int64_t job_epochs;
    int transport;
    char *compress;
    int log_level;
    uint64_t seed;
    bool shuffle, drop_last, sampler_drop_last, split_batches, even_batches, quiet, commit;
    bool allow_uneven, dispatch_batches, pad_single_process, elastic;
    bw_cli_tls tls;
} fetch_cfg;

static const bw_opt options[] = {
    {"coordinator", BW_OPT_ADDR, offsetof(fetch_cfg, coordinator), NULL, 0, 0, NULL,
     BW_OPT_REQUIRED, "HOST:PORT", "the coordinator"},
    {"job", BW_OPT_STRING, offsetof(fetch_cfg, job), NULL, 0, 0, NULL, BW_OPT_REQUIRED, "NAME",
     "job name (created on first use)"},
    {"dataset", BW_OPT_STRING, offsetof(fetch_cfg, dataset), NULL, 0, 0, NULL, 0,
     "FORMAT:PATH[,PATH...]",
     "npy, npz, tfrecord, jsonl, text, tar or files; paths below the workers' --data-root "
     "(globs allowed); required unless --dataset-field is given"},
    {"dataset-field", BW_OPT_LIST, offsetof(fetch_cfg, dataset_fields), NULL, 0, 0, NULL,
     BW_OPT_NO_ENV, "NAME=npy:PATH[,PATH...]",
     "instead of --dataset, repeated: one named array of a dataset of arrays indexed together "
     "(features and labels, like TensorDataset(x, y)); every array has the same length, split "
     "over its files the same way (docs/formats.md)"},
    {"transform", BW_OPT_STRING, offsetof(fetch_cfg, transform), NULL, 0, 0, NULL, 0, "SPEC",
     "run this pipeline on every sample on the workers, e.g. "
     "'decode|random_resized_crop(224)|flip|normalize(0.485,0.456,0.406;0.229,0.224,0.225)|chw'"
     ": each batch is one tensor (docs/transforms.md)"},
    {"transform-field", BW_OPT_STRING, offsetof(fetch_cfg, transform_field), NULL, 0, 0, NULL, 0,
     "KEY",
     "tar datasets: the member the transform runs on (e.g. jpg); jsonl datasets: the key whose "
     "value it runs on (a base64 string of an image, or an array of integers for "
     "truncate/pad, which become int64; docs/transforms.md)"},
    {"mix", BW_OPT_LIST, offsetof(fetch_cfg, mix), NULL, 0, 0, NULL, BW_OPT_NO_ENV,
     "[stream:]FORMAT:PATH[,PATH...]=WEIGHT",
     "instead of --dataset, repeated: one source of a weighted mixture of datasets, source j "
     "being the j-th --mix; WEIGHT a positive decimal (weights are normalised); stream: reads "
     "a tfrecord, jsonl, text or tar source as a stream, in its own order; no --shuffle; each "
     "line then has \"sources\" beside \"indices\" (docs/semantics.md, Mixtures)"},
    {"mix-policy", BW_OPT_STRING, offsetof(fetch_cfg, mix_policy), NULL, 0, 0, NULL, BW_OPT_NO_ENV,
     "cycle|stop",
     "a stream source of the mixture that runs dry: cycle (default) starts it again from its "
     "first record, stop ends the epoch there; needs a stream: source"},
    {"mix-samples", BW_OPT_INT, offsetof(fetch_cfg, mix_samples), "0", 0, 1ll << 62, NULL,
     BW_OPT_NO_ENV, "E", "the mixture's epoch size (default 0: the sum of the sources' sizes)"},
    {"rank", BW_OPT_INT, offsetof(fetch_cfg, rank), "-1", -1, 1 << 24, NULL, 0, "r",
     "this rank (default: RANK or SLURM_PROCID)"},
    {"world-size", BW_OPT_INT, offsetof(fetch_cfg, world_size), "-1", -1, 1 << 24, NULL, 0, "R",
     "number of ranks (default: WORLD_SIZE or SLURM_NTASKS)"},
    {"mode", BW_OPT_ENUM, offsetof(fetch_cfg, mode), "torch", 0, 0, "torch|accelerate|iterable", 0,
     NULL, "sampler semantics (docs/semantics.md)"},
    {"batch-size", BW_OPT_INT, offsetof(fetch_cfg, batch_size), "1", 1, 1 << 24, NULL, 0, "B",
     "batch size per rank (global with --split-batches)"},
    {"shuffle", BW_OPT_BOOL, offsetof(fetch_cfg, shuffle), "false", 0, 0, NULL, 0, NULL,
     "shuffle each epoch (torch.randperm with seed + epoch)"},
    {"seed", BW_OPT_UINT64, offsetof(fetch_cfg, seed), "0", 0, 0, NULL, 0, "S", "shuffle seed"},
    {"shuffle-algo", BW_OPT_ENUM, offsetof(fetch_cfg, shuffle_algo), "torch", 0, 0, "torch|feistel",
     0, NULL, "torch (bit-exact) or feistel (O(1) memory)"},
    {"drop-last", BW_OPT_BOOL, offsetof(fetch_cfg, drop_last), "false", 0, 0, NULL, 0, NULL,
     "torch: the DataLoader's drop_last; accelerate: the BatchSampler's"},
    {"sampler-drop-last", BW_OPT_BOOL, offsetof(fetch_cfg, sampler_drop_last), "false", 0, 0, NULL,
     0, NULL, "torch only: DistributedSampler's drop_last"},
    {"split-batches", BW_OPT_BOOL, offsetof(fetch_cfg, split_batches), "false", 0, 0, NULL, 0, NULL,
     "accelerate: --batch-size is global"},
    {"even-batches", BW_OPT_BOOL, offsetof(fetch_cfg, even_batches), "true", 0, 0, NULL, 0, NULL,
     "accelerate: pad so every rank gets as many batches (--no-even-batches)"},
    {"allow-uneven", BW_OPT_BOOL, offsetof(fetch_cfg, allow_uneven), "false", 0, 0, NULL, 0, NULL,
     "accelerate, --no-even-batches: accept that ranks get different numbers of batches (a "
     "DDP job would hang on the shorter ranks)"},
    {"dispatch-batches", BW_OPT_BOOL, offsetof(fetch_cfg, dispatch_batches), "false", 0, 0, NULL, 0,
     NULL, "accelerate: Accelerate's DataLoaderDispatcher batches (dispatch_batches=True)"},
    {"pad-single-process", BW_OPT_BOOL, offsetof(fetch_cfg, pad_single_process), "false", 0, 0,
     NULL, 0, NULL,
     "accelerate with one rank: BatchSamplerShard's padding instead of the plain last batch"},
    {"epochs", BW_OPT_INT, offsetof(fetch_cfg, epochs), "0", 0, 1000000, NULL, 0, "E",
     "epochs to run in this invocation: the rest of the starting position's epoch (nothing when "
     "the cursor is at its end) counts as the first; 0: one, or with --job-epochs every epoch "
     "the job has left. Never past the job's last epoch when --job-epochs is given"},
    {"max-steps", BW_OPT_INT, offsetof(fetch_cfg, max_steps), "0", 0, INT64_MAX, NULL, 0, "K",
     "stop after K batches (0: no limit)"},
    {"resume", BW_OPT_STRING, offsetof(fetch_cfg, resume), NULL, 0, 0, NULL, 0, "CURSOR_TEXT",
     "start after the batch this cursor describes (default: where the coordinator says this "
     "rank resumes)"},
    {"resume-elastic", BW_OPT_PATH, offsetof(fetch_cfg, resume_elastic), NULL, 0, 0, NULL, 0,
     "FILE",
     "elastic resume at this --world-size from the cursors of every rank of the old world, one "
     "per line (their --cursor-out files concatenated)"},
    {"elastic", BW_OPT_BOOL, offsetof(fetch_cfg, elastic), "false", 0, 0, NULL, 0, NULL,
     "elastic resume at this --world-size from every rank's committed cursor"},
    {"cursor-out", BW_OPT_PATH, offsetof(fetch_cfg, cursor_out), NULL, 0, 0, NULL, 0, "FILE",
     "write the cursor of the last batch handed out to FILE at the end (also when stopped by "
     "SIGTERM or SIGINT)"},
    {"commit", BW_OPT_BOOL, offsetof(fetch_cfg, commit), "false", 0, 0, NULL, 0, NULL,
     "commit the final cursor to the coordinator"},
    {"commit-every", BW_OPT_INT, offsetof(fetch_cfg, commit_every), "0", 0, INT64_MAX, NULL, 0, "K",
     "also commit the cursor every K batches (0: never)"},
    {"device", BW_OPT_STRING, offsetof(fetch_cfg, device), NULL, 0, 0, NULL, 0, "cuda:N",
     "deliver batches on this GPU"},
    {"prefetch", BW_OPT_INT, offsetof(fetch_cfg, prefetch), "0", 0, 1024, NULL, 0, "N",
     "batches fetched ahead (0: auto: batches of fixed-size samples up to 1 MiB read in "
     "groups, about 8 MiB in flight; larger ones 2 to 4 at a time; otherwise 4)"},
    {"timeout-ms", BW_OPT_INT, offsetof(fetch_cfg, timeout_ms), "10000", 1, 3600000, NULL, 0, "MS",
     "deadline of each call"},
    {"job-epochs", BW_OPT_INT, offsetof(fetch_cfg, job_epochs), "0", 0, 1000000, NULL, 0, "N",
     "the job's total number of epochs: a rank that delivers the end of epoch N-1 tells the "
     "coordinator it is finished, and the job is removed once every rank is; the run never goes "
     "past that epoch (0: unknown)"},
    {"retry-ms", BW_OPT_INT, offsetof(fetch_cfg, retry_ms), "60000", 0, 86400000, NULL, 0, "MS",
     "how long joining and committing retry while the coordinator is unreachable (0: never), "
     "saying so in a WARN line at once and every 10 s; a host name that does not resolve fails "
     "at once"},
    {"transport", BW_OPT_ENUM, offsetof(fetch_cfg, transport), "auto", 0, 0, "auto|grpc", 0, NULL,
     "auto: the workers' data channel where offered (TLS when this uses TLS), else gRPC; grpc: "
     "always gRPC"},
    {"compress", BW_OPT_STRING, offsetof(fetch_cfg, compress), NULL, 0, 0, NULL, 0,
     "zstd[:LEVEL]|auto|none",
     "compression of sample bytes on the data channel, asked of each worker (default none: "
     "raw, no CPU spent; zstd: level 1; auto: zstd level 1 where a probe of each request "
     "shrinks it by a tenth or more, raw otherwise, as for JPEGs; docs/data-channel.md)"},
    {"log-level", BW_OPT_ENUM, offsetof(fetch_cfg, log_level), "warn", 0, 0, BW_LOG_LEVEL_CHOICES,
     0, NULL, "the library's log lines on stderr at this level or more severe (failover: info)"},
    {"quiet", BW_OPT_BOOL, offsetof(fetch_cfg, quiet), "false", 0, 0, NULL, 0, NULL,
     "print only the summary line"},
    BW_CLI_TLS_OPTS(fetch_cfg, tls),
    BW_OPT_END,
};

/* --dataset-field: one more than a dataset may have, so that the loader refuses too many */
enum { BW_CLI_MAX_FIELDS = 65 };

/* The signal that stopped the run (SIGTERM, SIGINT), or 0. */
static volatile sig_atomic_t stop_requested;

/* Called after the library's own handler (bw_interrupt_on_signals), which has already
 * interrupted whatever the loader was waiting for. */
static void on_signal(int sig)
{
    stop_requested = sig;
}

/* After a stop by a signal the cursor is written, committed (--commit) and the job left --
 * with the interrupt lowered so that these calls can run, but raised again at this many ms
 * after the stop, so that the whole stop stays well within a second however the coordinator
 * and the workers behave (docs/client.md, "Signals"). */
enum { STOP_GRACE_MS = 400 };

static void *raise_later(void *arg)
{
    (void)arg;
    bw__sleep_ms(STOP_GRACE_MS); /* returns at once if someone raises it first */
    bw_interrupt();
    return NULL;
}

/* Installs on_signal for SIGINT and SIGTERM, then the library's handlers on top of it. */
static int catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; /* a batch line being written is written whole */
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
        return BW_INTERNAL;
    return bw_interrupt_on_signals();
}

static int parse_device(const char *text, int *device)
{
    *device = -1;
    if (!text)
        return BW_OK;
    char *end;
    if (strncmp(text, "cuda:", 5) != 0 || !text[5])
        return BW_INVALID_ARGUMENT;
    long d = strtol(text + 5, &end, 10);
    if (*end || d < 0 || d > 1024)
        return BW_INVALID_ARGUMENT;
    *device = (int)d;
    return BW_OK;
}

/* Named arrays: ,"fields":{"x":{"dtype":"<f4","shape":[B,...],"bytes":N,"sha256":"..."},...}
 * (the names are the dataset's field names, checked text without quotes or controls). */
static void print_arrays(const bw_batch *b)
{
    size_t n = bw_batch_narrays(b);
    if (!n)
        return;
    const uint8_t *base = bw_batch_host_data(b);
    printf(",\"fields\":{");
    for (size_t k = 0; k < n; k++) {
        bw_array a;
        bw_batch_array(b, k, &a);
        unsigned char h[SHA256_DIGEST_LENGTH];
        SHA256(a.nbytes ? base + a.offset : (const uint8_t *)"", a.nbytes, h);
        printf("%s", k ? "," : "");
        bw__json_string(stdout, a.name);
        printf(":{\"dtype\":");
        bw__json_string(stdout, a.dtype);
        printf(",\"shape\":[");
        for (size_t d = 0; d < a.ndim; d++)
            printf("%s%" PRIu64, d ? "," : "", a.shape[d]);
        printf("],\"bytes\":%zu,\"sha256\":\"", a.nbytes);
        for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
            printf("%02x", h[i]);
        printf("\"}");
    }
    printf("}");
}

/* A transformed batch: ,"dtype":"<f4","shape":[B,C,H,W] (what the tensor's bytes are). */
static void print_tensor(const bw_batch *b)
{
    printf(",\"dtype\":");
    bw__json_string(stdout, bw_batch_dtype(b));
    printf(",\"shape\":[");
    const uint64_t *shape = bw_batch_shape(b);
    for (size_t d = 0; d < bw_batch_ndim(b); d++)
        printf("%s%" PRIu64, d ? "," : "", shape[d]);
    printf("]");
}

static void print_batch(const bw_batch *b, int64_t rank, bool tensor)
{
    unsigned char h[SHA256_DIGEST_LENGTH];
    SHA256(bw_batch_data(b), bw_batch_nbytes(b), h);
    printf("{\"epoch\":%" PRIu64 ",\"rank\":%" PRId64 ",\"step\":%" PRIu64 ",\"indices\":[",
           bw_batch_epoch(b), rank, bw_batch_step(b));
    const uint64_t *idx = bw_batch_indices(b);
    const uint8_t *pad = bw_batch_padding(b);
    for (size_t i = 0; i < bw_batch_count(b); i++)
        printf("%s%" PRIu64, i ? "," : "", idx[i]);
    const uint32_t *src = bw_batch_sources(b);
    for (size_t i = 0; src && i < bw_batch_count(b); i++)
        printf("%s%" PRIu32, i ? "," : "],\"sources\":[", src[i]);
    const uint64_t *pass = bw_batch_passes(b);
    for (size_t i = 0; pass && i < bw_batch_count(b); i++)
        printf("%s%" PRIu64, i ? "," : "],\"passes\":[", pass[i]);
    printf("],\"padding\":[");
    for (size_t i = 0; i < bw_batch_count(b); i++)
        printf("%s%d", i ? "," : "", pad[i]);
    printf("],\"real\":%zu,\"bytes\":%zu,\"sha256\":\"", bw_batch_real(b), bw_batch_nbytes(b));
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
        printf("%02x", h[i]);
    printf("\"");
    if (tensor && bw_batch_ndim(b))
        print_tensor(b);
    print_arrays(b);
    printf("}\n");
}

static int write_cursor(bw_loader *l, const char *path)
{
    char text[4096], tmp[4200];
    int rc = bw_loader_cursor_text(l, text, sizeof(text));
    if (rc != BW_OK)
        return rc;
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%s\n", text) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        if (f)
            fclose(f);
        return BW_IO;
    }
    fclose(f);
    return rename(tmp, path) == 0 ? BW_OK : BW_IO;
}

/* The cursors of a job-level checkpoint: one cursor text per non-empty line of `path`. */
static int read_cursors(const char *path, char ***out, size_t *n, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--resume-elastic %s: cannot open it", path);
        return BW_IO;
    }
    char line[8192];
    int rc = BW_OK;
    while (rc == BW_OK && fgets(line, sizeof(line), f)) {
        size_t len = strcspn(line, "\r\n");
        if (line[len] == '\0' && !feof(f)) {
            snprintf(err, errlen, "--resume-elastic %s: line %zu is too long for a cursor", path,
                     *n + 1);
            rc = BW_INVALID_ARGUMENT;
            break;
        }
        line[len] = '\0';
        if (len == 0)
            continue;
        char **grown = realloc(*out, (*n + 1) * sizeof(**out));
        if (!grown || !(grown[*n] = strdup(line))) {
            if (grown)
                *out = grown;
            snprintf(err, errlen, "out of memory");
            rc = BW_NOMEM;
            break;
        }
        *out = grown;
        (*n)++;
    }
    fclose(f);
    if (rc == BW_OK && *n == 0) {
        snprintf(err, errlen, "--resume-elastic %s: no cursor in it", path);
        rc = BW_INVALID_ARGUMENT;
    }
    return rc;
}

int bw__cmd_fetch(int argc, char **argv)
{
    fetch_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    int status = bw__config_main("batchwire fetch",
                                 "--coordinator HOST:PORT --job NAME --dataset SPEC [options]",
                                 "Joins a job as one rank and pulls its batches, printing one JSON "
                                 "line per batch and a summary line. SIGTERM or SIGINT stops it "
                                 "within a second in every phase (joining, retrying, waiting for a "
                                 "worker, mid-batch): it writes --cursor-out (the cursor of the "
                                 "last batch printed), commits with --commit, leaves the job and "
                                 "exits with status 143 (SIGTERM) or 130 (SIGINT); 1 on an error, "
                                 "0 otherwise.",
                                 options, &cfg, argc, argv);
    if (status >= 0) {
        bw__config_free(options, &cfg);
        return status;
    }
    if (cfg.tls.tls && !cfg.tls.tls_ca) {
        /* The loader takes TLS settings as files: without a CA it would talk plaintext. */
        fprintf(stderr, "batchwire fetch: --tls: give the CA to verify with as --tls-ca FILE "
                        "(for the system's roots: --tls-ca /etc/ssl/certs/ca-certificates.crt)\n");
        bw__config_free(options, &cfg);
        return 2;
    }
    if (cfg.resume && (cfg.resume_elastic || cfg.elastic)) {
        fprintf(stderr, "batchwire fetch: --resume is one rank's cursor; --resume-elastic and "
                        "--elastic resume every rank: give one of them\n");
        bw__config_free(options, &cfg);
        return 2;
    }
    if ((cfg.dataset != NULL) + (cfg.dataset_fields != NULL) + (cfg.mix != NULL) != 1) {
        fprintf(stderr, "batchwire fetch: give the dataset as --dataset FORMAT:PATH[,PATH...], "
                        "as its arrays, --dataset-field NAME=npy:PATH[,PATH...] for each, or as "
                        "a mixture, --mix FORMAT:PATH[,PATH...]=WEIGHT for each source (one of "
                        "the three)\n");
        bw__config_free(options, &cfg);
        return 2;
    }
    /* --dataset-field values, one a line: split in place */
    const char *fields[BW_CLI_MAX_FIELDS];
    size_t nfields = 0;
    for (char *p = cfg.dataset_fields; p && nfields < BW_CLI_MAX_FIELDS; nfields++) {
        fields[nfields] = p;
        if ((p = strchr(p, '\n')) != NULL)
            *p++ = '\0';
    }
    /* --mix values, one a line: split in place (one more than a mixture may have, so that
     * the loader refuses too many) */
    const char *mix[BW__MIX_MAX_SOURCES + 1];
    size_t nmix = 0;
    for (char *p = cfg.mix; p && nmix < BW__MIX_MAX_SOURCES + 1; nmix++) {
        mix[nmix] = p;
        if ((p = strchr(p, '\n')) != NULL)
            *p++ = '\0';
    }
    bw__log_to_stderr("fetch", (bw_log_level)cfg.log_level);
    static const char *const modes[] = {"torch", "accelerate", "iterable"};
    bw_loader_options o;
    bw_loader_options_init(&o);
    o.coordinator = cfg.coordinator;
    o.tls_ca = cfg.tls.tls_ca;
    o.tls_cert = cfg.tls.tls_cert;
    o.tls_key = cfg.tls.tls_key;
    o.tls_server_name = cfg.tls.tls_server_name;
    o.job = cfg.job;
    o.dataset = cfg.dataset;
    o.dataset_fields = fields;
    o.n_dataset_fields = nfields;
    o.mixture = mix;
    o.n_mixture = nmix;
    o.mix_samples = (uint64_t)cfg.mix_samples;
    o.mix_policy = cfg.mix_policy;
    o.rank = cfg.rank;
    o.world_size = cfg.world_size;
    o.mode = modes[cfg.mode];
    o.batch_size = (uint64_t)cfg.batch_size;
    o.shuffle = cfg.shuffle;
    o.seed = (int64_t)cfg.seed;
    o.shuffle_algo = cfg.shuffle_algo ? "feistel" : "torch";
    o.drop_last = cfg.drop_last;
    o.sampler_drop_last = cfg.sampler_drop_last;
    o.split_batches = cfg.split_batches;
    o.even_batches = cfg.even_batches;
    o.allow_uneven = cfg.allow_uneven;
    o.dispatch_batches = cfg.dispatch_batches;
    o.pad_single_process = cfg.pad_single_process;
    o.prefetch_batches = (unsigned)cfg.prefetch;
    o.timeout_ms = (int)cfg.timeout_ms;
    o.retry_ms = (int)cfg.retry_ms;
    o.token_file = cfg.tls.token_file;
    o.epochs = (uint64_t)cfg.job_epochs;
    o.transport = cfg.transport ? "grpc" : "auto";
    o.compress = cfg.compress;
    o.transform = cfg.transform;
    o.transform_field = cfg.transform_field;
    if (parse_device(cfg.device, &o.device) != BW_OK) {
        fprintf(stderr, "batchwire fetch: --device: invalid value '%s': expected cuda:N\n",
                cfg.device);
        bw__config_free(options, &cfg);
        return 2;
    }
    if (catch_signals() != BW_OK) {
        fprintf(stderr, "batchwire fetch: cannot install the SIGINT/SIGTERM handlers\n");
        bw__config_free(options, &cfg);
        return 1;
    }

    char err[2048];
    bw_loader *l = NULL;
    uint64_t t0 = bw__mono_ms();
    int rc;
    if (cfg.resume_elastic || cfg.elastic) {
        char **texts = NULL;
        size_t n = 0;
        rc = cfg.resume_elastic ? read_cursors(cfg.resume_elastic, &texts, &n, err, sizeof(err))
                                : BW_OK;
        size_t *lens = calloc(n ? n : 1, sizeof(*lens)); /* 0: text */
        if (rc == BW_OK && !lens) {
            snprintf(err, sizeof(err), "out of memory");
            rc = BW_NOMEM;
        }
        if (rc == BW_OK)
            rc = bw_loader_open_elastic(&o, (const void *const *)texts, lens, n, &l, err,
                                        sizeof(err));
        for (size_t i = 0; i < n; i++)
            free(texts[i]);
        free(texts);
        free(lens);
    } else {
        rc = cfg.resume ? bw_loader_open_at(&o, cfg.resume, 0, &l, err, sizeof(err))
                        : bw_loader_open(&o, &l, err, sizeof(err));
    }
    if (rc != BW_OK && stop_requested) {
        fprintf(stderr, "batchwire fetch: stopped by %s before joining: %s\n",
                stop_requested == SIGINT ? "SIGINT" : "SIGTERM", err);
        bw__config_free(options, &cfg);
        return 128 + stop_requested;
    }
    if (rc != BW_OK) {
        fprintf(stderr, "batchwire fetch: %s: %s\n", bw_err_name(rc), err);
        bw__config_free(options, &cfg);
        return 1;
    }
    uint64_t batches = 0, samples = 0, bytes = 0;
    int64_t rank = bw_loader_rank(l);
    /* Epochs: --epochs loop turns (0: one, or with --job-epochs all the job has left), the
     * first the rest of the starting position's epoch; never past the job's last epoch
     * (--job-epochs). */
    int64_t ran = 0, want = cfg.epochs ? cfg.epochs : cfg.job_epochs ? INT64_MAX : 1;
    while (!stop_requested) {
        if (cfg.job_epochs && bw_loader_epoch(l) >= (uint64_t)cfg.job_epochs)
            break;
        const bw_batch *b;
        while (!stop_requested && (cfg.max_steps == 0 || batches < (uint64_t)cfg.max_steps) &&
               (rc = bw_loader_next(l, &b)) == BW_OK) {
            if (!cfg.quiet) {
                print_batch(b, rank, cfg.transform != NULL);
                fflush(stdout); /* each line out as it is handed out, e.g. to a pipe */
            }
            batches++;
            samples += bw_batch_count(b);
            bytes += bw_batch_nbytes(b);
            if (cfg.commit_every && batches % (uint64_t)cfg.commit_every == 0 &&
                (rc = bw_loader_commit(l)) != BW_OK)
                break;
        }
        if (rc != BW_OK && rc != BW_END_OF_EPOCH)
            break;
        if (cfg.max_steps && batches >= (uint64_t)cfg.max_steps)
            break;
        rc = BW_OK;
        if (++ran >= want || stop_requested || (rc = bw_loader_next_epoch(l)) != BW_OK)
            break;
    }
    if (rc == BW_END_OF_EPOCH)
        rc = BW_OK;
    status = 0;
    pthread_t later;
    bool raising = false;
    if (stop_requested) {
        /* Stopped: whatever was waiting returned BW_INTERRUPTED. The interrupt stays raised,
         * so that fetches in flight end and closing waits for nothing; what needs the network
         * once more -- a stream's cursor (its offsets), --commit -- gets STOP_GRACE_MS with
         * the interrupt lowered. */
        if (rc == BW_INTERRUPTED)
            rc = BW_OK;
        status = 128 + stop_requested;
    }
    if (rc != BW_OK) {
        fprintf(stderr, "batchwire fetch: %s: %s\n", bw_err_name(rc), bw_loader_errmsg(l));
        status = 1;
    }
    int crc = cfg.cursor_out ? write_cursor(l, cfg.cursor_out) : BW_OK;
    if (stop_requested && (crc == BW_INTERRUPTED || cfg.commit)) {
        bw_interrupt_clear();
        raising = pthread_create(&later, NULL, raise_later, NULL) == 0;
        if (!raising)
            bw_interrupt(); /* no time to spare: everything below brief or skipped */
        if (crc == BW_INTERRUPTED)
            crc = write_cursor(l, cfg.cursor_out);
    }
    if (crc != BW_OK) {
        fprintf(stderr, "batchwire fetch: --cursor-out %s: cannot write the cursor: %s\n",
                cfg.cursor_out,
                crc == BW_IO ? "the file could not be written" : bw_loader_errmsg(l));
        status = stop_requested ? status : 1;
    }
    if (cfg.commit && bw_loader_commit(l) != BW_OK) {
        fprintf(stderr, "batchwire fetch: commit: %s\n", bw_loader_errmsg(l));
        status = stop_requested ? status : 1;
    }
    double secs = (double)(bw__mono_ms() - t0) / 1000.0;
    bw_loader_stats st;
    bw_loader_get_stats(l, &st, sizeof(st));
    printf("{\"summary\":{\"rank\":%" PRId64 ",\"batches\":%" PRIu64 ",\"samples\":%" PRIu64
           ",\"bytes\":%" PRIu64 ",\"seconds\":%.3f,\"mib_per_s\":%.1f,\"stopped\":%s",
           rank, batches, samples, bytes, secs, secs > 0 ? (double)bytes / (1 << 20) / secs : 0.0,
           stop_requested ? "true" : "false");
    printf(",\"stats\":{\"batches\":%" PRIu64 ",\"samples\":%" PRIu64 ",\"bytes\":%" PRIu64
           ",\"wait_seconds\":%.3f,\"samples_received\":%" PRIu64 ",\"bytes_received\":%" PRIu64
           ",\"requests\":%" PRIu64 ",\"retries\":%" PRIu64 ",\"failovers\":%" PRIu64
           ",\"busy\":%" PRIu64 "}}}\n",
           st.batches, st.samples, st.bytes, (double)st.wait_ns / 1e9, st.samples_received,
           st.bytes_received, st.requests, st.retries, st.failovers, st.busy);
    fflush(stdout);
    bw_loader_close(l);
    if (raising) {
        bw_interrupt(); /* ends the wait of raise_later */
        pthread_join(later, NULL);
    }
    if (stop_requested)
        fprintf(stderr, "batchwire fetch: stopped by %s after %" PRIu64 " batches%s%s\n",
                stop_requested == SIGINT ? "SIGINT" : "SIGTERM", batches,
                cfg.cursor_out && crc == BW_OK ? "; cursor written to " : "",
                cfg.cursor_out && crc == BW_OK ? cfg.cursor_out : "");
    bw__config_free(options, &cfg);
    return status;
}
