/*
 * bw_transform_check: runs a transform pipeline (core/transform/transform.h) on image files
 * and writes each raw result, for tests/integration/test_transform_equiv.py to compare with
 * Pillow and torchvision.
 *
 *   bw_transform_check [--seed S] [--epoch E] [--source K] [--index I] SPEC OUTDIR FILE...
 *     file n (from 0) runs with sample index I + n; its result goes to OUTDIR/n.raw and one
 *     JSON line to stdout: {"n":0,"ok":true,"dtype":"uint8","chw":0,"shape":[H,W,3],
 *     "draws":[{"op":1,"box":[T,L,H,W]},{"op":2,"flipped":1}]} or
 *     {"n":0,"ok":false,"error":"FILE (index I): ..."}. Exit status 1 if any file failed.
 *   bw_transform_check --rrc-params H W SCALE_LO SCALE_HI RATIO_LO RATIO_HI COUNT [--seed S]
 *     prints random_resized_crop's box for indexes 0..COUNT-1 (op position 0), one
 *     "T L H W" line each.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "transform/transform.h"

static uint64_t num(const char *s, const char *what)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno) {
        fprintf(stderr, "bw_transform_check: %s '%s' is not a number\n", what, s);
        exit(2);
    }
    return v;
}

static double real(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end) {
        fprintf(stderr, "bw_transform_check: '%s' is not a number\n", s);
        exit(2);
    }
    return v;
}

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = malloc(cap);
    for (size_t r; b && (r = fread(b + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            uint8_t *nb = realloc(b, cap *= 2);
            if (!nb)
                free(b);
            b = nb;
        }
    }
    fclose(f);
    *len = n;
    return b;
}

static void json_text(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

int main(int argc, char **argv)
{
    bw__tf_key key = {0, 0, 0, 0};
    int i = 1;
    if (argc >= 9 && strcmp(argv[1], "--rrc-params") == 0) {
        int h = (int)num(argv[2], "H"), w = (int)num(argv[3], "W");
        double scale[2] = {real(argv[4]), real(argv[5])}, ratio[2] = {real(argv[6]), real(argv[7])};
        uint64_t count = num(argv[8], "COUNT");
        if (argc == 11 && strcmp(argv[9], "--seed") == 0)
            key.seed = num(argv[10], "--seed");
        if (h < 1 || w < 1) {
            fprintf(stderr, "bw_transform_check: H and W must be at least 1\n");
            return 2;
        }
        for (uint64_t k = 0; k < count; k++) {
            bw__tf_rng r;
            int64_t box[4];
            key.index = k;
            bw__tf_rng_init(&r, &key, 0);
            bw__tf_rrc_params(&r, h, w, scale, ratio, box);
            printf("%lld %lld %lld %lld\n", (long long)box[0], (long long)box[1], (long long)box[2],
                   (long long)box[3]);
        }
        return 0;
    }
    for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        uint64_t v = num(argv[i + 1], argv[i]);
        if (strcmp(argv[i], "--seed") == 0)
            key.seed = v;
        else if (strcmp(argv[i], "--epoch") == 0)
            key.epoch = v;
        else if (strcmp(argv[i], "--source") == 0)
            key.source = v;
        else if (strcmp(argv[i], "--index") == 0)
            key.index = v;
        else {
            fprintf(stderr, "bw_transform_check: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (argc - i < 3) {
        fprintf(stderr, "usage: bw_transform_check [--seed S] [--epoch E] [--source K] "
                        "[--index I] SPEC OUTDIR FILE...\n");
        return 2;
    }
    bw__tf_spec spec;
    char err[1024];
    if (bw__tf_parse(argv[i], &spec, err, sizeof(err)) != BW_OK) {
        fprintf(stderr, "bw_transform_check: transform '%s': %s\n", argv[i], err);
        return 2;
    }
    const char *outdir = argv[i + 1];
    bw__tf_scratch *s = bw__tf_scratch_new(0);
    size_t cap = (size_t)64 << 20;
    void *out = malloc(cap);
    if (!s || !out) {
        fprintf(stderr, "bw_transform_check: out of memory\n");
        free(out);
        bw__tf_scratch_free(s);
        return 1;
    }
    uint64_t first = key.index;
    int failed = 0;
    static const char *const dtypes[] = {"uint8", "float32", "float16", "bfloat16"};
    for (int n = 0; i + 2 + n < argc; n++) {
        const char *path = argv[i + 2 + n];
        size_t len = 0;
        uint8_t *in = read_file(path, &len);
        bw__tf_result res;
        key.index = first + (uint64_t)n;
        int rc = in ? bw__tf_run(&spec, s, &key, in, len, out, cap, &res, err, sizeof(err)) : BW_IO;
        if (!in)
            snprintf(err, sizeof(err), "%s", strerror(errno));
        free(in);
        printf("{\"n\":%d,", n);
        if (rc != BW_OK) {
            char msg[1400];
            snprintf(msg, sizeof(msg), "%s (index %llu): %s", path, (unsigned long long)key.index,
                     err);
            printf("\"ok\":false,\"error\":");
            json_text(msg);
            printf("}\n");
            failed = 1;
            continue;
        }
        char name[4200];
        snprintf(name, sizeof(name), "%s/%d.raw", outdir, n);
        FILE *f = fopen(name, "wb");
        int bad = !f;
        if (f) {
            bad = fwrite(out, 1, res.shape.bytes, f) != res.shape.bytes;
            bad |= fclose(f) != 0;
        }
        if (bad) {
            fprintf(stderr, "bw_transform_check: %s: cannot write\n", name);
            free(out);
            bw__tf_scratch_free(s);
            return 1;
        }
        printf("\"ok\":true,\"dtype\":\"%s\",\"chw\":%d,\"shape\":[%d,%d,%d],\"draws\":[",
               dtypes[res.shape.dtype], res.shape.chw, res.shape.dims[0], res.shape.dims[1],
               res.shape.dims[2]);
        for (int d = 0; d < res.ndraws; d++) {
            const bw__tf_draw *dr = &res.draws[d];
            if (spec.ops[dr->op].kind == BW_TF_FLIP)
                printf("%s{\"op\":%d,\"flipped\":%d}", d ? "," : "", dr->op, dr->flipped);
            else
                printf("%s{\"op\":%d,\"box\":[%lld,%lld,%lld,%lld]}", d ? "," : "", dr->op,
                       (long long)dr->box[0], (long long)dr->box[1], (long long)dr->box[2],
                       (long long)dr->box[3]);
        }
        printf("]}\n");
    }
    free(out);
    bw__tf_scratch_free(s);
    return failed;
}
