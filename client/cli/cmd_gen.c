/*
 * batchwire gen: writes a synthetic dataset in any format whose every sample is a pure
 * function of its index (core/formats/synth.h; formula in docs/formats.md), then prints one
 * JSON object describing it:
 *   {"format":"npy","dir":"OUT","sources":["part-00000.npy"],"num_samples":N,
 *    "dtype":"|u1","shape":[3,32,32],"sample_bytes":3072}
 * Sources are relative to --out. Samples are split over --files files in index order (file k
 * holds [k*N/F, (k+1)*N/F)).
 *
 * Per format, sample i is: npy: bytes(i, itemsize * prod(shape)) as one row; tfrecord, files:
 * bytes(i, len(i)); jsonl: the line {"index":I,"hex":"HEX"} with HEX = hex of bytes(i, len(i));
 * tar: members sampleNNNNNNNN.bin = bytes(i, len(i)) and sampleNNNNNNNN.json = {"index":I}.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "common/crc32c.h"
#include "common/json.h"
#include "common/log.h"
#include "common/progress.h"
#include "formats/synth.h"

enum { F_NPY, F_TFRECORD, F_JSONL, F_TAR, F_FILES };

typedef struct gen_cfg {
    int format;
    char *out;
    int64_t num_samples, sample_bytes, sample_bytes_max, files, progress_ms;
    char *shape, *dtype;
} gen_cfg;

static const bw_opt options[] = {
    {"format", BW_OPT_ENUM, offsetof(gen_cfg, format), NULL, 0, 0, "npy|tfrecord|jsonl|tar|files",
     BW_OPT_NO_ENV | BW_OPT_REQUIRED, "FORMAT", "dataset format to write"},
    {"out", BW_OPT_PATH, offsetof(gen_cfg, out), NULL, 0, 0, NULL, BW_OPT_NO_ENV | BW_OPT_REQUIRED,
     "DIR", "directory to write into (created; existing files of the same names are replaced)"},
    {"num-samples", BW_OPT_INT, offsetof(gen_cfg, num_samples), "1000", 0, 1ll << 40, NULL,
     BW_OPT_NO_ENV, "N", "number of samples"},
    {"sample-bytes", BW_OPT_INT, offsetof(gen_cfg, sample_bytes), "256", 0, 1ll << 32, NULL,
     BW_OPT_NO_ENV, "BYTES", "bytes of payload per sample (npy: use --shape and --dtype)"},
    {"sample-bytes-max", BW_OPT_INT, offsetof(gen_cfg, sample_bytes_max), "0", 0, 1ll << 32, NULL,
     BW_OPT_NO_ENV, "BYTES",
     "if larger than --sample-bytes, sample sizes vary in [sample-bytes, this] (not npy)"},
    {"files", BW_OPT_INT, offsetof(gen_cfg, files), "1", 1, 100000, NULL, BW_OPT_NO_ENV, "F",
     "number of files to split the samples over (not files: one file per sample)"},
    {"shape", BW_OPT_STRING, offsetof(gen_cfg, shape), NULL, 0, 0, NULL, BW_OPT_NO_ENV, "D1,D2,..",
     "npy: shape of one sample (default: sample-bytes elements)"},
    {"progress-ms", BW_OPT_INT, offsetof(gen_cfg, progress_ms), "5000", 0, 3600000, NULL,
     BW_OPT_NO_ENV, "MS",
     "log progress (samples written, share, rate, time left) this often on stderr; on a "
     "terminal one line updates in place (0: never)"},
    {"dtype", BW_OPT_STRING, offsetof(gen_cfg, dtype), "uint8", 0, 0, NULL, BW_OPT_NO_ENV, "DTYPE",
     "npy: bool, int8..int64, uint8..uint64, float16/32/64, complex64/128, or a numpy descr "
     "such as '>i4'"},
    BW_OPT_END,
};

static const struct {
    const char *name, *descr;
} dtypes[] = {
    {"bool", "|b1"},      {"int8", "|i1"},        {"uint8", "|u1"},   {"int16", "<i2"},
    {"uint16", "<u2"},    {"int32", "<i4"},       {"uint32", "<u4"},  {"int64", "<i8"},
    {"uint64", "<u8"},    {"float16", "<f2"},     {"float32", "<f4"}, {"float64", "<f8"},
    {"complex64", "<c8"}, {"complex128", "<c16"},
};

typedef struct gen {
    const gen_cfg *cfg;
    uint64_t lo, hi; /* sample length bounds */
    uint8_t *buf;
    size_t bufcap;
    char err[4400];
} gen;

static const uint8_t *sample(gen *g, uint64_t i, uint64_t *len)
{
    *len = bw__synth_len(i, g->lo, g->hi);
    if (*len > g->bufcap) {
        free(g->buf);
        g->bufcap = *len;
        g->buf = malloc(*len);
        if (!g->buf) {
            fprintf(stderr, "batchwire gen: out of memory\n");
            exit(1);
        }
    }
    bw__synth_fill(i, g->buf, *len);
    return g->buf;
}

static FILE *create(gen *g, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", g->cfg->out, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        snprintf(g->err, sizeof(g->err), "%s: %s", path, strerror(errno));
    return f;
}

static int finish(gen *g, FILE *f, const char *name)
{
    if (ferror(f) | (fclose(f) != 0)) {
        snprintf(g->err, sizeof(g->err), "%s/%s: write failed: %s", g->cfg->out, name,
                 strerror(errno));
        return 1;
    }
    return 0;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void write_npy_header(FILE *f, const char *descr, uint64_t rows, const uint64_t *shape,
                             int ndim)
{
    char dict[1024];
    int n = snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': False, 'shape': (%llu,",
                     descr, (unsigned long long)rows);
    for (int d = 0; d < ndim; d++)
        n += snprintf(dict + n, sizeof(dict) - (size_t)n, "%s%llu", d ? ", " : " ",
                      (unsigned long long)shape[d]);
    n += snprintf(dict + n, sizeof(dict) - (size_t)n, "), }");
    /* numpy pads with spaces so that the data starts at a multiple of 64, ending with '\n'. */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    uint8_t head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    put_le(head + 8, (uint64_t)n + pad + 1, 2);
    fwrite(head, 1, 10, f);
    fwrite(dict, 1, (size_t)n, f);
    for (size_t i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
}

static void tar_member(FILE *f, const char *name, const uint8_t *data, uint64_t len)
{
    uint8_t h[512];
    memset(h, 0, sizeof(h));
    snprintf((char *)h, 100, "%s", name);
    memcpy(h + 100, "0000644", 8);
    memcpy(h + 108, "0000000", 8);
    memcpy(h + 116, "0000000", 8);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)len);
    memcpy(h + 136, "00000000000", 12);
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
    fwrite(h, 1, 512, f);
    fwrite(data, 1, len, f);
    static const uint8_t zeros[512];
    fwrite(zeros, 1, (512 - len % 512) % 512, f);
}

static int parse_shape(const char *text, uint64_t *shape, int *ndim)
{
    *ndim = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || errno || *ndim == 16 || (*end && *end != ','))
            return -1;
        shape[(*ndim)++] = v;
        p = *end ? end + 1 : end;
    }
    return 0;
}

int bw__cmd_gen(int argc, char **argv)
{
    gen_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    int status = bw__config_main(
        "batchwire gen", "--format FORMAT --out DIR [options]",
        "Writes a synthetic dataset whose every sample is a pure function of its index "
        "(docs/formats.md) and prints a JSON description of it.",
        options, &cfg, argc, argv);
    if (status >= 0) {
        bw__config_free(options, &cfg);
        return status;
    }
    gen g;
    memset(&g, 0, sizeof(g));
    g.cfg = &cfg;
    g.lo = (uint64_t)cfg.sample_bytes;
    g.hi = cfg.sample_bytes_max > cfg.sample_bytes ? (uint64_t)cfg.sample_bytes_max : g.lo;
    uint64_t n = (uint64_t)cfg.num_samples, nfiles = (uint64_t)cfg.files;
    const char *descr = cfg.dtype;
    uint64_t shape[16];
    int ndim = 1;
    shape[0] = g.lo;
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (strcmp(cfg.dtype, dtypes[i].name) == 0)
            descr = dtypes[i].descr;
    uint64_t item = 0;
    if (cfg.format == F_NPY) {
        const char *d = descr + (strchr("<>|=", descr[0]) ? 1 : 0);
        item = strtoull(d + 1, NULL, 10);
        if (!strchr("biufc", d[0]) || !item || item > 32 || strlen(descr) > 8) {
            fprintf(stderr, "batchwire gen: --dtype '%s': expected a numeric dtype\n", cfg.dtype);
            bw__config_free(options, &cfg);
            return 2;
        }
        if (cfg.shape && parse_shape(cfg.shape, shape, &ndim) != 0) {
            fprintf(stderr, "batchwire gen: --shape '%s': expected D1,D2,...\n", cfg.shape);
            bw__config_free(options, &cfg);
            return 2;
        }
        if (!cfg.shape)
            shape[0] = g.lo / item;
        g.lo = item;
        for (int d2 = 0; d2 < ndim; d2++)
            g.lo *= shape[d2];
        g.hi = g.lo;
    }
    if (mkdir(cfg.out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "batchwire gen: --out %s: %s\n", cfg.out, strerror(errno));
        bw__config_free(options, &cfg);
        return 1;
    }
    static const char *const ext[] = {"npy", "tfrecord", "jsonl", "tar", ""};
    static const char *const fmt_names[] = {"npy", "tfrecord", "jsonl", "tar", "files"};
    int rc = 0;
    char name[256], what[200];
    bw__log_to_stderr("gen", BW_LOG_INFO);
    bw__progress_interval_ms = (uint64_t)cfg.progress_ms;
    snprintf(what, sizeof(what), "writing format=%s samples=%llu out=%.100s", fmt_names[cfg.format],
             (unsigned long long)n, cfg.out);
    bw__progress progress;
    bw__progress_begin(&progress, what, false, n);
    if (cfg.format == F_FILES) {
        snprintf(name, sizeof(name), "%s/samples", cfg.out);
        if (mkdir(name, 0755) != 0 && errno != EEXIST) {
            snprintf(g.err, sizeof(g.err), "%s: %s", name, strerror(errno));
            rc = 1;
        }
        for (uint64_t i = 0; i < n && rc == 0; i++) {
            char fname[64];
            snprintf(fname, sizeof(fname), "samples/sample%08llu.bin", (unsigned long long)i);
            FILE *f = create(&g, fname);
            uint64_t len;
            const uint8_t *b = sample(&g, i, &len);
            rc = f ? (fwrite(b, 1, len, f), finish(&g, f, fname)) : 1;
            bw__progress_update(&progress, i + 1);
        }
        nfiles = 1;
    }
    for (uint64_t k = 0; k < nfiles && rc == 0 && cfg.format != F_FILES; k++) {
        uint64_t a = k * n / nfiles, b = (k + 1) * n / nfiles;
        snprintf(name, sizeof(name), "%s-%05llu.%s", cfg.format == F_TAR ? "shard" : "part",
                 (unsigned long long)k, ext[cfg.format]);
        FILE *f = create(&g, name);
        if (!f) {
            rc = 1;
            break;
        }
        if (cfg.format == F_NPY)
            write_npy_header(f, descr, b - a, shape, ndim);
        for (uint64_t i = a; i < b; i++) {
            uint64_t len;
            const uint8_t *d = sample(&g, i, &len);
            if (cfg.format == F_NPY) {
                fwrite(d, 1, len, f);
            } else if (cfg.format == F_TFRECORD) {
                uint8_t h[12], t[4];
                put_le(h, len, 8);
                put_le(h + 8, bw__crc32c_mask(bw__crc32c(0, h, 8)), 4);
                put_le(t, bw__crc32c_mask(bw__crc32c(0, d, len)), 4);
                fwrite(h, 1, 12, f);
                fwrite(d, 1, len, f);
                fwrite(t, 1, 4, f);
            } else if (cfg.format == F_JSONL) {
                fprintf(f, "{\"index\":%llu,\"hex\":\"", (unsigned long long)i);
                for (uint64_t j = 0; j < len; j++)
                    fprintf(f, "%02x", d[j]);
                fputs("\"}\n", f);
            } else {
                char mname[64], json[64];
                snprintf(mname, sizeof(mname), "sample%08llu.bin", (unsigned long long)i);
                tar_member(f, mname, d, len);
                int jl = snprintf(json, sizeof(json), "{\"index\":%llu}", (unsigned long long)i);
                snprintf(mname, sizeof(mname), "sample%08llu.json", (unsigned long long)i);
                tar_member(f, mname, (const uint8_t *)json, (uint64_t)jl);
            }
            bw__progress_update(&progress, i + 1);
        }
        if (cfg.format == F_TAR) {
            static const uint8_t zeros[1024];
            fwrite(zeros, 1, sizeof(zeros), f);
        }
        rc = finish(&g, f, name);
    }
    bw__progress_end(&progress, rc == 0);
    if (rc != 0) {
        fprintf(stderr, "batchwire gen: %s\n", g.err);
    } else {
        printf("{\"format\":\"%s\",\"dir\":", fmt_names[cfg.format]);
        bw__json_string(stdout, cfg.out);
        printf(",\"sources\":[");
        for (uint64_t k = 0; k < nfiles; k++) {
            if (cfg.format == F_FILES)
                printf("\"samples\"");
            else
                printf("%s\"%s-%05llu.%s\"", k ? "," : "", cfg.format == F_TAR ? "shard" : "part",
                       (unsigned long long)k, ext[cfg.format]);
        }
        printf("],\"num_samples\":%llu", (unsigned long long)n);
        if (cfg.format == F_NPY) {
            printf(",\"dtype\":\"%s\",\"shape\":[", descr);
            for (int d = 0; d < ndim; d++)
                printf("%s%llu", d ? "," : "", (unsigned long long)shape[d]);
            printf("]");
        }
        printf(",\"sample_bytes\":%llu,\"sample_bytes_max\":%llu}\n", (unsigned long long)g.lo,
               (unsigned long long)g.hi);
    }
    free(g.buf);
    bw__config_free(options, &cfg);
    return rc;
}
