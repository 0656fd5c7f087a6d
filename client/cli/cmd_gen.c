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
 * jpeg and tar-jpeg: image i of core/formats/synth.h as a JPEG, one file per sample
 * (samples/sampleNNNNNNNN.jpg, read as format files) or in WebDataset shards with its class
 * (sampleNNNNNNNN.jpg and sampleNNNNNNNN.cls, read as format tar).
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
#include "common/text.h"
#include "formats/synth.h"

#include <turbojpeg.h>

enum { F_NPY, F_TFRECORD, F_JSONL, F_TAR, F_FILES, F_NPZ, F_JPEG, F_TAR_JPEG };

typedef struct gen_cfg {
    int format;
    char *out;
    int64_t num_samples, sample_bytes, sample_bytes_max, files, progress_ms;
    int64_t seed, image_min, image_max, quality;
    char *shape, *dtype;
    char *fields; /* --fields values, one a line */
} gen_cfg;

static const bw_opt options[] = {
    {"format", BW_OPT_ENUM, offsetof(gen_cfg, format), NULL, 0, 0,
     "npy|tfrecord|jsonl|tar|files|npz|jpeg|tar-jpeg", BW_OPT_NO_ENV | BW_OPT_REQUIRED, "FORMAT",
     "dataset format to write (npz: named arrays in uncompressed .npz archives; needs --fields; "
     "jpeg: one JPEG image per file, read as format files; tar-jpeg: WebDataset shards of "
     "NAME.jpg and NAME.cls members, read as format tar)"},
    {"seed", BW_OPT_INT, offsetof(gen_cfg, seed), "0", 0, INT64_MAX, NULL, BW_OPT_NO_ENV, "S",
     "jpeg and tar-jpeg: the images are a pure function of this seed and their index"},
    {"image-min", BW_OPT_INT, offsetof(gen_cfg, image_min), "64", 1, 8192, NULL, BW_OPT_NO_ENV,
     "PX", "jpeg and tar-jpeg: the least height and width of an image"},
    {"image-max", BW_OPT_INT, offsetof(gen_cfg, image_max), "640", 1, 8192, NULL, BW_OPT_NO_ENV,
     "PX",
     "jpeg and tar-jpeg: the greatest height and width of an image (each side is drawn "
     "in [image-min, image-max])"},
    {"quality", BW_OPT_INT, offsetof(gen_cfg, quality), "0", 0, 100, NULL, BW_OPT_NO_ENV, "Q",
     "jpeg and tar-jpeg: 0 varies the JPEG quality (75-95) and chroma subsampling per image; "
     "1-100 writes every image at quality Q with 4:4:4 subsampling"},
    {"fields", BW_OPT_LIST, offsetof(gen_cfg, fields), NULL, 0, 0, NULL, BW_OPT_NO_ENV,
     "NAME:DTYPE[:D1,D2,..] ...",
     "npy and npz: a dataset of named arrays indexed together (features and labels), one "
     "field per word: '--fields x:float32:3,32,32 y:int64' writes OUT/x/part-K.npy and "
     "OUT/y/part-K.npy (npz: OUT/part-K.npz holding both); DTYPE bool, (u)int8..64, "
     "float32/64; sample i's values follow docs/formats.md"},
    {"out", BW_OPT_PATH, offsetof(gen_cfg, out), NULL, 0, 0, NULL, BW_OPT_NO_ENV | BW_OPT_REQUIRED,
     "DIR", "directory to write into (created; existing files of the same names are replaced)"},
    {"num-samples", BW_OPT_INT, offsetof(gen_cfg, num_samples), "1000", 0, 1ll << 40, NULL,
     BW_OPT_NO_ENV, "N", "number of samples"},
    {"sample-bytes", BW_OPT_INT, offsetof(gen_cfg, sample_bytes), "256", 0, 1ll << 32, NULL,
     BW_OPT_NO_ENV, "BYTES",
     "bytes of payload per sample (npy: without --shape, a multiple of the --dtype's item size; "
     "with --shape, unused)"},
    {"sample-bytes-max", BW_OPT_INT, offsetof(gen_cfg, sample_bytes_max), "0", 0, 1ll << 32, NULL,
     BW_OPT_NO_ENV, "BYTES",
     "if larger than --sample-bytes, sample sizes vary in [sample-bytes, this] (not npy)"},
    {"files", BW_OPT_INT, offsetof(gen_cfg, files), "1", 1, 100000, NULL, BW_OPT_NO_ENV, "F",
     "number of files to split the samples over (not files: one file per sample)"},
    {"shape", BW_OPT_STRING, offsetof(gen_cfg, shape), NULL, 0, 0, NULL, BW_OPT_NO_ENV, "D1,D2,..",
     "npy: shape of one sample (default: one dimension of sample-bytes / item size elements: "
     "(256,) for the default 256 bytes of uint8, (64,) for float32)"},
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

/* The .npy (1.0) header of an array of `rows` rows of shape[0..ndim) into out (at least 1024
 * bytes); returns its length. */
static size_t npy_header(uint8_t *out, const char *descr, uint64_t rows, const uint64_t *shape,
                         int ndim)
{
    char dict[900];
    int n = snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': False, 'shape': (%llu,",
                     descr, (unsigned long long)rows);
    for (int d = 0; d < ndim; d++)
        n += snprintf(dict + n, sizeof(dict) - (size_t)n, "%s%llu", d ? ", " : " ",
                      (unsigned long long)shape[d]);
    n += snprintf(dict + n, sizeof(dict) - (size_t)n, "), }");
    /* numpy pads with spaces so that the data starts at a multiple of 64, ending with '\n'. */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    static const uint8_t magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
    memcpy(out, magic, 8);
    put_le(out + 8, (uint64_t)n + pad + 1, 2);
    memcpy(out + 10, dict, (size_t)n);
    memset(out + 10 + n, ' ', pad);
    out[10 + (size_t)n + pad] = '\n';
    return total + pad;
}

static void write_npy_header(FILE *f, const char *descr, uint64_t rows, const uint64_t *shape,
                             int ndim)
{
    uint8_t h[1024];
    fwrite(h, 1, npy_header(h, descr, rows, shape, ndim), f);
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

/* "D1,D2,..." into shape[0..*ndim): each a decimal number of at least 1 (no sign), and one
 * sample (their product times `item` bytes) at most 2^32 bytes, the --sample-bytes limit;
 * otherwise -1 with the reason in why. */
static int parse_shape(const char *text, uint64_t item, uint64_t *shape, int *ndim, char *why,
                       size_t whylen)
{
    *ndim = 0;
    const char *p = text;
    uint64_t bytes = item;
    snprintf(why, whylen, "expected D1,D2,... (decimal numbers of at least 1, up to 16)");
    while (*p) {
        char *end;
        errno = 0;
        if (*p < '0' || *p > '9')
            return -1;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || v == 0 || *ndim == 16 || (*end && *end != ','))
            return -1;
        if (v > (1ull << 32) || bytes * v > (1ull << 32)) {
            snprintf(why, whylen, "one sample would exceed %llu bytes", 1ull << 32);
            return -1;
        }
        bytes *= v;
        shape[(*ndim)++] = v;
        p = *end ? end + 1 : end;
    }
    return 0;
}

/* ---- named arrays (--fields; docs/formats.md, "Synthetic named arrays") ---- */

enum { MAX_GEN_FIELDS = 64 };

typedef struct gen_field {
    char name[BW_FIELD_NAME_MAX + 1];
    const char *descr;
    char kind; /* b (bool), i, u or f */
    unsigned item;
    uint64_t shape[16];
    int ndim;
    uint64_t elems, row_bytes; /* per sample */
} gen_field;

/* "NAME:DTYPE[:D1,D2,..]" */
static int parse_field(const char *text, gen_field *f, char *err, size_t errlen)
{
    const char *c1 = strchr(text, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c1 || (size_t)(c1 - text) > BW_FIELD_NAME_MAX) {
        snprintf(err, errlen, "--fields '%s': expected NAME:DTYPE[:D1,D2,..]", text);
        return BW_INVALID_ARGUMENT;
    }
    memset(f, 0, sizeof(*f));
    memcpy(f->name, text, (size_t)(c1 - text));
    char why[256], dt[32];
    if (bw__check_field_name(f->name, why, sizeof(why)) != BW_OK) {
        snprintf(err, errlen, "--fields '%s': %s", text, why);
        return BW_INVALID_ARGUMENT;
    }
    snprintf(dt, sizeof(dt), "%.*s", (int)(c2 ? (size_t)(c2 - c1 - 1) : strlen(c1 + 1)), c1 + 1);
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (strcmp(dt, dtypes[i].name) == 0)
            f->descr = dtypes[i].descr;
    f->kind = f->descr ? f->descr[1] : 0;
    f->item = f->descr ? (unsigned)strtoul(f->descr + 2, NULL, 10) : 0;
    if (!f->descr || !strchr("biuf", f->kind) || (f->kind == 'f' && f->item == 2)) {
        snprintf(err, errlen,
                 "--fields '%s': dtype '%s' is not one of bool, int8..int64, uint8..uint64, "
                 "float32, float64",
                 text, dt);
        return BW_INVALID_ARGUMENT;
    }
    if (c2 && parse_shape(c2 + 1, f->item, f->shape, &f->ndim, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "--fields '%s': shape '%s': %s", text, c2 + 1, why);
        return BW_INVALID_ARGUMENT;
    }
    f->elems = 1;
    for (int d = 0; d < f->ndim; d++)
        f->elems *= f->shape[d];
    f->row_bytes = f->elems * f->item;
    return BW_OK;
}

/* Row i of field f into out (row_bytes): class c(i) = word(i, 0) % 10; integers (c + j) % 10
 * (bool: % 2) for element j; floats 1 where j % 10 == c, else 0, plus noise
 * word(i, j + 1) / 2^64 - 0.5 (53 bits). Little endian. */
static void field_row(const gen_field *f, uint64_t i, uint8_t *out)
{
    uint64_t c = bw__synth_word(i, 0) % 10;
    for (uint64_t j = 0; j < f->elems; j++, out += f->item) {
        if (f->kind != 'f') {
            put_le(out, (c + j) % (f->kind == 'b' ? 2 : 10), (int)f->item);
            continue;
        }
        double v = (double)(j % 10 == c) + (double)(bw__synth_word(i, j + 1) >> 11) * 0x1p-53 - 0.5;
        if (f->item == 4) {
            float x = (float)v;
            uint32_t bits;
            memcpy(&bits, &x, 4);
            put_le(out, bits, 4);
        } else {
            uint64_t bits;
            memcpy(&bits, &v, 8);
            put_le(out, bits, 8);
        }
    }
}

/* CRC-32 (IEEE 802.3, zip's) of p[0..n) continuing from crc. */
static uint32_t crc32_ieee(uint32_t crc, const uint8_t *p, size_t n)
{
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    crc = ~crc;
    while (n--)
        /* The analyzer loses track of the bytes npy_header wrote: they are all set. */
        // NOLINTNEXTLINE(clang-analyzer-core.UndefinedBinaryOperatorResult)
        crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* Writes one field's rows [a, b) as an .npy array to f; with crc, updates the CRC-32. */
static void write_field_rows(FILE *f, const gen_field *fd, uint64_t a, uint64_t b, uint8_t *row,
                             uint32_t *crc, bw__progress *prog, uint64_t done)
{
    uint8_t h[1024];
    size_t hl = npy_header(h, fd->descr, b - a, fd->shape, fd->ndim);
    fwrite(h, 1, hl, f);
    if (crc)
        *crc = crc32_ieee(*crc, h, hl);
    for (uint64_t i = a; i < b; i++) {
        field_row(fd, i, row);
        fwrite(row, 1, fd->row_bytes, f);
        if (crc)
            *crc = crc32_ieee(*crc, row, fd->row_bytes);
        bw__progress_update(prog, done + i - a + 1);
    }
}

/* File k's npz archive: a stored member NAME.npy per field (zip, no compression). */
static int write_npz(gen *g, const gen_field *fs, size_t nf, uint64_t a, uint64_t b,
                     const char *name, uint8_t *row, bw__progress *prog, uint64_t done)
{
    FILE *f = create(g, name);
    if (!f)
        return 1;
    uint32_t crcs[MAX_GEN_FIELDS];
    uint64_t offs[MAX_GEN_FIELDS], sizes[MAX_GEN_FIELDS];
    for (size_t k = 0; k < nf; k++) {
        uint8_t h[1024], lh[30 + BW_FIELD_NAME_MAX + 4];
        sizes[k] =
            npy_header(h, fs[k].descr, b - a, fs[k].shape, fs[k].ndim) + (b - a) * fs[k].row_bytes;
        if (sizes[k] >= 0xffffffffu) {
            snprintf(g->err, sizeof(g->err),
                     "%s: member %s.npy would be %llu bytes, more than a plain zip member holds: "
                     "write more, smaller archives (--files)",
                     name, fs[k].name, (unsigned long long)sizes[k]);
            fclose(f);
            return 1;
        }
        long at = ftell(f);
        offs[k] = (uint64_t)(at < 0 ? 0 : at);
        size_t nl = strlen(fs[k].name) + 4;
        memset(lh, 0, 30);
        put_le(lh, 0x04034b50, 4);
        put_le(lh + 4, 20, 2); /* version needed: 2.0 */
        put_le(lh + 18, sizes[k], 4);
        put_le(lh + 22, sizes[k], 4);
        put_le(lh + 26, nl, 2);
        memcpy(lh + 30, fs[k].name, nl - 4);
        memcpy(lh + 30 + nl - 4, ".npy", 4);
        fwrite(lh, 1, 30 + nl, f);
        crcs[k] = 0;
        write_field_rows(f, &fs[k], a, b, row, &crcs[k], prog, done + k * (b - a));
        uint8_t c[4];
        put_le(c, crcs[k], 4);
        fseek(f, (long)offs[k] + 14, SEEK_SET);
        fwrite(c, 1, 4, f);
        fseek(f, 0, SEEK_END);
    }
    long cd = ftell(f);
    uint64_t cdsize = 0;
    for (size_t k = 0; k < nf; k++) {
        uint8_t ch[46];
        size_t nl = strlen(fs[k].name) + 4;
        memset(ch, 0, sizeof(ch));
        put_le(ch, 0x02014b50, 4);
        put_le(ch + 4, 20, 2);
        put_le(ch + 6, 20, 2);
        put_le(ch + 16, crcs[k], 4);
        put_le(ch + 20, sizes[k], 4);
        put_le(ch + 24, sizes[k], 4);
        put_le(ch + 28, nl, 2);
        put_le(ch + 38, 0644u << 16, 4); /* external attributes: a regular file */
        put_le(ch + 42, offs[k], 4);
        fwrite(ch, 1, sizeof(ch), f);
        fwrite(fs[k].name, 1, nl - 4, f);
        fwrite(".npy", 1, 4, f);
        cdsize += sizeof(ch) + nl;
    }
    uint8_t e[22];
    memset(e, 0, sizeof(e));
    put_le(e, 0x06054b50, 4);
    put_le(e + 8, nf, 2);
    put_le(e + 10, nf, 2);
    put_le(e + 12, cdsize, 4);
    put_le(e + 16, (uint64_t)(cd < 0 ? 0 : cd), 4);
    fwrite(e, 1, sizeof(e), f);
    if ((uint64_t)(cd < 0 ? 0 : cd) >= 0xffffffffu) {
        snprintf(g->err, sizeof(g->err), "%s: the archive is over 4 GiB: use more --files", name);
        fclose(f);
        return 1;
    }
    return finish(g, f, name);
}

/* --fields: the named arrays' files (npy: OUT/NAME/part-K.npy; npz: OUT/part-K.npz) and their
 * JSON description. */
static int gen_fields(gen *g, const gen_cfg *cfg)
{
    gen_field fs[MAX_GEN_FIELDS];
    size_t nf = 0;
    uint64_t row_max = 1;
    for (char *p = cfg->fields; p && *p;) {
        char *end = p + strcspn(p, " \n");
        char save = *end;
        *end = '\0';
        if (*p && nf == MAX_GEN_FIELDS) {
            snprintf(g->err, sizeof(g->err), "--fields: more than %d fields", MAX_GEN_FIELDS);
            return 2;
        }
        if (*p && parse_field(p, &fs[nf++], g->err, sizeof(g->err)) != BW_OK)
            return 2;
        for (size_t j = 0; *p && j + 1 < nf; j++)
            if (strcmp(fs[j].name, fs[nf - 1].name) == 0) {
                snprintf(g->err, sizeof(g->err), "--fields: field '%.64s' is named twice",
                         fs[j].name);
                return 2;
            }
        if (nf && fs[nf - 1].row_bytes > row_max)
            row_max = fs[nf - 1].row_bytes;
        *end = save;
        p = *end ? end + 1 : end;
    }
    if (nf == 0) {
        snprintf(g->err, sizeof(g->err), "--fields: no field given");
        return 2;
    }
    uint64_t n = (uint64_t)cfg->num_samples, nfiles = (uint64_t)cfg->files;
    bool npz = cfg->format == F_NPZ;
    uint8_t *row = malloc(row_max);
    if (!row) {
        snprintf(g->err, sizeof(g->err), "out of memory for a row of %llu bytes",
                 (unsigned long long)row_max);
        return 1;
    }
    char what[200], name[400];
    snprintf(what, sizeof(what), "writing format=%s fields=%zu samples=%llu out=%.100s",
             npz ? "npz" : "npy", nf, (unsigned long long)n, cfg->out);
    bw__progress prog;
    bw__progress_begin(&prog, what, false, n * nf);
    int rc = 0;
    for (size_t k = 0; k < nf && !npz && rc == 0; k++) {
        snprintf(name, sizeof(name), "%.300s/%.64s", cfg->out, fs[k].name);
        if (mkdir(name, 0755) != 0 && errno != EEXIST) {
            snprintf(g->err, sizeof(g->err), "%s: %s", name, strerror(errno));
            rc = 1;
        }
    }
    for (uint64_t f = 0; f < nfiles && rc == 0; f++) {
        uint64_t a = f * n / nfiles, b = (f + 1) * n / nfiles;
        if (npz) {
            snprintf(name, sizeof(name), "part-%05llu.npz", (unsigned long long)f);
            rc = write_npz(g, fs, nf, a, b, name, row, &prog, a * nf);
            continue;
        }
        for (size_t k = 0; k < nf && rc == 0; k++) {
            snprintf(name, sizeof(name), "%.64s/part-%05llu.npy", fs[k].name,
                     (unsigned long long)f);
            FILE *out = create(g, name);
            if (!out) {
                rc = 1;
                break;
            }
            write_field_rows(out, &fs[k], a, b, row, NULL, &prog, a * nf + k * (b - a));
            rc = finish(g, out, name);
        }
    }
    bw__progress_end(&prog, rc == 0);
    free(row);
    if (rc != 0)
        return rc;
    printf("{\"format\":\"%s\",\"dir\":", npz ? "npz" : "npy");
    bw__json_string(stdout, cfg->out);
    printf(",\"num_samples\":%llu,\"fields\":[", (unsigned long long)n);
    for (size_t k = 0; k < nf; k++) {
        printf("%s{\"name\":", k ? "," : "");
        bw__json_string(stdout, fs[k].name);
        printf(",\"dtype\":\"%s\",\"shape\":[", fs[k].descr);
        for (int d = 0; d < fs[k].ndim; d++)
            printf("%s%llu", d ? "," : "", (unsigned long long)fs[k].shape[d]);
        printf("],\"sample_bytes\":%llu}", (unsigned long long)fs[k].row_bytes);
    }
    /* how to name it to a loader, paths relative to --out */
    if (npz) {
        printf("],\"dataset\":\"npz:part-*.npz\"}\n");
        return 0;
    }
    printf("],\"dataset_fields\":[");
    for (size_t k = 0; k < nf; k++) {
        snprintf(name, sizeof(name), "%.64s=npy:%.64s/part-*.npy", fs[k].name, fs[k].name);
        printf("%s", k ? "," : "");
        bw__json_string(stdout, name);
    }
    printf("]}\n");
    return 0;
}

/* ---- images (--format jpeg|tar-jpeg; docs/formats.md, "Synthetic JPEG images") ---- */

/* Image i's JPEG: quality 75 + q % 21 and chroma subsampling 4:4:4, 4:2:2 or 4:2:0 by
 * (q >> 32) % 3, q = iword(2), unless --quality fixes them; its class iword(3) % 10. */
static int jpeg_sample(gen *g, tjhandle tj, uint64_t i, uint8_t **jpg, unsigned long *jlen)
{
    const gen_cfg *cfg = g->cfg;
    int h, w;
    bw__synth_image_size((uint64_t)cfg->seed, i, (int)cfg->image_min, (int)cfg->image_max, &h, &w);
    size_t need = (size_t)h * (size_t)w * 3;
    if (need > g->bufcap) {
        free(g->buf);
        g->bufcap = need;
        g->buf = malloc(need);
        if (!g->buf) {
            fprintf(stderr, "batchwire gen: out of memory\n");
            exit(1);
        }
    }
    bw__synth_image_fill((uint64_t)cfg->seed, i, h, w, g->buf);
    uint64_t q = bw__synth_image_word((uint64_t)cfg->seed, i, 2);
    static const int sub[3] = {TJSAMP_444, TJSAMP_422, TJSAMP_420};
    *jpg = NULL;
    *jlen = 0;
    int quality = cfg->quality ? (int)cfg->quality : 75 + (int)(q % 21);
    if (tjCompress2(tj, g->buf, w, 0, h, TJPF_RGB, jpg, jlen,
                    cfg->quality ? TJSAMP_444 : sub[(q >> 32) % 3], quality, 0) != 0) {
        snprintf(g->err, sizeof(g->err), "sample %llu: JPEG encoding failed: %s",
                 (unsigned long long)i, tjGetErrorStr2(tj));
        return 1;
    }
    return 0;
}

static int gen_images(gen *g, const gen_cfg *cfg)
{
    bool tar = cfg->format == F_TAR_JPEG;
    uint64_t n = (uint64_t)cfg->num_samples, nfiles = tar ? (uint64_t)cfg->files : 1;
    char name[256], what[200];
    if (!tar) {
        snprintf(name, sizeof(name), "%.200s/samples", cfg->out);
        if (mkdir(name, 0755) != 0 && errno != EEXIST) {
            snprintf(g->err, sizeof(g->err), "%s: %s", name, strerror(errno));
            return 1;
        }
    }
    tjhandle tj = tjInitCompress();
    if (!tj) {
        snprintf(g->err, sizeof(g->err), "TurboJPEG: %s", tjGetErrorStr2(NULL));
        return 1;
    }
    snprintf(what, sizeof(what), "writing format=%s samples=%llu out=%.100s",
             tar ? "tar-jpeg" : "jpeg", (unsigned long long)n, cfg->out);
    bw__progress prog;
    bw__progress_begin(&prog, what, false, n);
    uint64_t bytes = 0;
    int rc = 0;
    for (uint64_t k = 0; k < nfiles && rc == 0; k++) {
        uint64_t a = k * n / nfiles, b = (k + 1) * n / nfiles;
        FILE *f = NULL;
        if (tar) {
            snprintf(name, sizeof(name), "shard-%05llu.tar", (unsigned long long)k);
            if (!(f = create(g, name)))
                rc = 1;
        }
        for (uint64_t i = a; i < b && rc == 0; i++) {
            uint8_t *jpg;
            unsigned long jlen;
            if ((rc = jpeg_sample(g, tj, i, &jpg, &jlen)) != 0)
                break;
            char mname[64];
            snprintf(mname, sizeof(mname), "%ssample%08llu.jpg", tar ? "" : "samples/",
                     (unsigned long long)i);
            if (tar) {
                char cls[8];
                int cl = snprintf(cls, sizeof(cls), "%d",
                                  (int)(bw__synth_image_word((uint64_t)cfg->seed, i, 3) % 10));
                tar_member(f, mname, jpg, jlen);
                snprintf(mname, sizeof(mname), "sample%08llu.cls", (unsigned long long)i);
                tar_member(f, mname, (const uint8_t *)cls, (uint64_t)cl);
            } else {
                FILE *one = create(g, mname);
                rc = one ? (fwrite(jpg, 1, jlen, one), finish(g, one, mname)) : 1;
            }
            bytes += jlen;
            tjFree(jpg);
            bw__progress_update(&prog, i + 1);
        }
        if (f) {
            static const uint8_t zeros[1024];
            fwrite(zeros, 1, sizeof(zeros), f);
            int frc = finish(g, f, name);
            rc = rc ? rc : frc;
        }
    }
    tjDestroy(tj);
    bw__progress_end(&prog, rc == 0);
    if (rc != 0)
        return rc;
    printf("{\"format\":\"%s\",\"content\":\"jpeg\",\"dir\":", tar ? "tar" : "files");
    bw__json_string(stdout, cfg->out);
    printf(",\"sources\":[");
    for (uint64_t k = 0; k < nfiles; k++)
        if (tar)
            printf("%s\"shard-%05llu.tar\"", k ? "," : "", (unsigned long long)k);
        else
            printf("\"samples\"");
    printf("],\"num_samples\":%llu,\"seed\":%lld,\"image_min\":%lld,\"image_max\":%lld,"
           "\"jpeg_bytes\":%llu}\n",
           (unsigned long long)n, (long long)cfg->seed, (long long)cfg->image_min,
           (long long)cfg->image_max, (unsigned long long)bytes);
    return 0;
}

static int run_gen(int argc, char **argv);

int bw__cmd_gen(int argc, char **argv)
{
    /* "--fields x:float32:3,32,32 y:int64": every word after --fields up to the next option
     * is one more field (the config parser takes one value per flag). */
    char **args = calloc((size_t)argc * 2 + 1, sizeof(char *));
    if (!args) {
        fprintf(stderr, "batchwire gen: out of memory\n");
        return 1;
    }
    static char fields_flag[] = "--fields";
    int nargs = 0;
    for (int i = 0; i < argc; i++) {
        args[nargs++] = argv[i];
        if (strcmp(argv[i], fields_flag) != 0 || i + 1 >= argc)
            continue;
        args[nargs++] = argv[++i];
        while (i + 1 < argc && argv[i + 1][0] != '-') {
            args[nargs++] = fields_flag;
            args[nargs++] = argv[++i];
        }
    }
    int rc = run_gen(nargs, args);
    free(args);
    return rc;
}

static int run_gen(int argc, char **argv)
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
    if (cfg.fields || cfg.format == F_NPZ) {
        int frc = 2;
        if (cfg.format != F_NPY && cfg.format != F_NPZ)
            snprintf(g.err, sizeof(g.err), "--fields: named arrays are written as npy or npz");
        else if (!cfg.fields)
            snprintf(g.err, sizeof(g.err), "--format npz: give the arrays with --fields");
        else if (mkdir(cfg.out, 0755) != 0 && errno != EEXIST)
            snprintf(g.err, sizeof(g.err), "--out %s: %s", cfg.out, strerror(errno));
        else {
            bw__log_to_stderr("gen", BW_LOG_INFO);
            bw__progress_interval_ms = (uint64_t)cfg.progress_ms;
            frc = gen_fields(&g, &cfg);
        }
        if (frc != 0)
            fprintf(stderr, "batchwire gen: %s\n", g.err);
        bw__config_free(options, &cfg);
        return frc;
    }
    if (cfg.format == F_JPEG || cfg.format == F_TAR_JPEG) {
        int irc = 1;
        if (cfg.image_min > cfg.image_max) {
            snprintf(g.err, sizeof(g.err), "--image-min %lld is larger than --image-max %lld",
                     (long long)cfg.image_min, (long long)cfg.image_max);
            irc = 2;
        } else if (mkdir(cfg.out, 0755) != 0 && errno != EEXIST) {
            snprintf(g.err, sizeof(g.err), "--out %s: %s", cfg.out, strerror(errno));
        } else {
            bw__log_to_stderr("gen", BW_LOG_INFO);
            bw__progress_interval_ms = (uint64_t)cfg.progress_ms;
            irc = gen_images(&g, &cfg);
        }
        if (irc != 0)
            fprintf(stderr, "batchwire gen: %s\n", g.err);
        free(g.buf);
        bw__config_free(options, &cfg);
        return irc;
    }
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
        char why[128];
        if (cfg.shape && parse_shape(cfg.shape, item, shape, &ndim, why, sizeof(why)) != 0) {
            fprintf(stderr, "batchwire gen: --shape '%s': %s\n", cfg.shape, why);
            bw__config_free(options, &cfg);
            return 2;
        }
        if (!cfg.shape && g.lo % item != 0) {
            fprintf(stderr,
                    "batchwire gen: --sample-bytes %llu is not a multiple of the item size of "
                    "--dtype %s (%llu bytes): give a multiple, or --shape\n",
                    (unsigned long long)g.lo, cfg.dtype, (unsigned long long)item);
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
