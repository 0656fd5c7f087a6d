/* Running a parsed pipeline on one sample with a per-thread scratch (transform.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "batchwire/batchwire.h"
#include "transform/transform.h"

/* Two buffers the ops ping-pong between, the resize's intermediate and its coefficients.
 * Each grows to the largest size asked for and stays. */
enum { SLOT_A, SLOT_B, SLOT_TMP, SLOT_COEF, NSLOTS };

struct bw__tf_scratch {
    tjhandle tj;
    uint64_t max_pixels;
    void *buf[NSLOTS];
    size_t cap[NSLOTS];
};

bw__tf_scratch *bw__tf_scratch_new(uint64_t max_pixels)
{
    bw__tf_scratch *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->max_pixels = max_pixels ? max_pixels : BW_TF_DEFAULT_MAX_PIXELS;
    s->tj = tjInitDecompress();
    if (!s->tj) {
        free(s);
        return NULL;
    }
    return s;
}

void bw__tf_scratch_free(bw__tf_scratch *s)
{
    if (!s)
        return;
    for (int k = 0; k < NSLOTS; k++)
        free(s->buf[k]);
    if (s->tj)
        tjDestroy(s->tj);
    free(s);
}

size_t bw__tf_scratch_bytes(const bw__tf_scratch *s)
{
    size_t n = sizeof(*s);
    for (int k = 0; k < NSLOTS; k++)
        n += s->cap[k];
    return n;
}

static void *slot(bw__tf_scratch *s, int k, size_t bytes)
{
    if (bytes > s->cap[k]) {
        free(s->buf[k]);
        s->buf[k] = malloc(bytes);
        s->cap[k] = s->buf[k] ? bytes : 0;
    }
    return s->buf[k];
}

typedef struct decode_ctx {
    bw__tf_scratch *s;
    int k;
} decode_ctx;

static uint8_t *decode_buf(void *ctx, size_t bytes)
{
    decode_ctx *d = ctx;
    return slot(d->s, d->k, bytes);
}

/* The value between ops: which slot holds it and what it is. */
typedef struct value {
    int k; /* slot */
    int h, w;
    bw__tf_dtype dtype;
    int chw;
} value;

static bw__tf_image image_of(bw__tf_scratch *s, const value *v)
{
    bw__tf_image im = {s->buf[v->k], v->h, v->w, 3};
    return im;
}

static int too_big(const bw__tf_scratch *s, int64_t h, int64_t w, const char *what, char *err,
                   size_t errlen)
{
    if ((uint64_t)h * (uint64_t)w <= s->max_pixels)
        return 0;
    snprintf(err, errlen, "%s: %lldx%lld pixels is more than the limit of %llu", what, (long long)h,
             (long long)w, (unsigned long long)s->max_pixels);
    return 1;
}

static int nomem(char *err, size_t errlen, const char *what, size_t bytes)
{
    snprintf(err, errlen, "%s: out of memory for %zu bytes", what, bytes);
    return BW_NOMEM;
}

/* Crops v to box (zeros outside the image) into the other slot; a box that is the whole
 * image leaves v as it is. */
static int crop_to(bw__tf_scratch *s, value *v, const int64_t box[4], const char *what, char *err,
                   size_t errlen)
{
    if (box[0] == 0 && box[1] == 0 && box[2] == v->h && box[3] == v->w)
        return BW_OK;
    if (too_big(s, box[2], box[3], what, err, errlen))
        return BW_TOO_BIG;
    size_t bytes = (size_t)box[2] * (size_t)box[3] * 3;
    uint8_t *dst = slot(s, 1 - v->k, bytes);
    if (!dst)
        return nomem(err, errlen, what, bytes);
    bw__tf_image src = image_of(s, v), out = {dst, (int)box[2], (int)box[3], 3};
    bw__tf_crop(&src, box[0], box[1], &out);
    v->k = 1 - v->k;
    v->h = out.h;
    v->w = out.w;
    return BW_OK;
}

static int resize_to(bw__tf_scratch *s, value *v, int oh, int ow, const char *what, char *err,
                     size_t errlen)
{
    if (oh == v->h && ow == v->w)
        return BW_OK;
    if (too_big(s, oh, ow, what, err, errlen) || too_big(s, v->h, ow, what, err, errlen))
        return BW_TOO_BIG;
    size_t bytes = (size_t)oh * (size_t)ow * 3, tbytes = (size_t)v->h * (size_t)ow * 3;
    size_t cbytes = bw__tf_resize_coef_bytes(v->h, v->w, oh, ow);
    uint8_t *dst = slot(s, 1 - v->k, bytes), *tmp = slot(s, SLOT_TMP, tbytes);
    void *coef = slot(s, SLOT_COEF, cbytes);
    if (!dst || !tmp || !coef)
        return nomem(err, errlen, what, bytes + tbytes + cbytes);
    bw__tf_image src = image_of(s, v), out = {dst, oh, ow, 3};
    bw__tf_resize(&src, &out, tmp, coef);
    v->k = 1 - v->k;
    v->h = oh;
    v->w = ow;
    return BW_OK;
}

static uint16_t to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e == 0xff) /* inf, nan (kept quiet) */
        return (uint16_t)(sign | 0x7c00u | (m ? 0x200u | (m >> 13) : 0));
    int ex = (int)e - 127 + 15;
    if (ex >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (ex <= 0) { /* subnormal half (or zero): shift the full mantissa, round to even */
        if (ex < -10)
            return (uint16_t)sign;
        m |= 0x800000u;
        int shift = 14 - ex;
        uint32_t hm = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (hm & 1)))
            hm++;
        return (uint16_t)(sign | hm);
    }
    uint32_t hm = m >> 13, rem = m & 0x1fffu;
    uint32_t h = sign | ((uint32_t)ex << 10) | hm;
    if (rem > 0x1000u || (rem == 0x1000u && (hm & 1)))
        h++; /* may carry into the exponent, which is right (up to inf) */
    return (uint16_t)h;
}

static uint16_t to_bfloat16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu))
        return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float value_at(const void *p, bw__tf_dtype d, size_t i)
{
    if (d == BW_TF_UINT8)
        return (float)((const uint8_t *)p)[i];
    return ((const float *)p)[i];
}

static void cast_values(const void *src, bw__tf_dtype from, void *dst, bw__tf_dtype to, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (to == BW_TF_UINT8) {
            ((uint8_t *)dst)[i] = ((const uint8_t *)src)[i];
            continue;
        }
        float f = value_at(src, from, i);
        if (to == BW_TF_FLOAT32)
            ((float *)dst)[i] = f;
        else
            ((uint16_t *)dst)[i] = to == BW_TF_FLOAT16 ? to_half(f) : to_bfloat16(f);
    }
}

/* One loop per element size, so that each is a plain typed copy. */
#define TO_CHW(T)                                                                                  \
    do {                                                                                           \
        const T *in = src;                                                                         \
        T *out = dst;                                                                              \
        for (size_t i = 0; i < plane; i++) {                                                       \
            out[i] = in[i * 3];                                                                    \
            out[plane + i] = in[i * 3 + 1];                                                        \
            out[2 * plane + i] = in[i * 3 + 2];                                                    \
        }                                                                                          \
    } while (0)

static void to_chw(const void *src, void *dst, int h, int w, size_t es)
{
    size_t plane = (size_t)h * (size_t)w;
    if (es == 1)
        TO_CHW(uint8_t);
    else if (es == 2)
        TO_CHW(uint16_t);
    else
        TO_CHW(float);
}

/* Where an op writes a new buffer of `bytes`: out when it is the pipeline's last and the
 * result fits (*in_out then set), else the slot v is not in. */
static void *out_or_slot(bw__tf_scratch *s, const value *v, bool last, size_t bytes, void *out,
                         size_t outcap, bool *in_out)
{
    if (last && bytes <= outcap) {
        *in_out = true;
        return out;
    }
    return slot(s, 1 - v->k, bytes);
}

static const char *const op_names[] = {
    "decode", "resize", "center_crop", "resized_crop", "random_resized_crop", "flip", "normalize",
    "chw",    "cast",   "truncate",    "pad",
};

int bw__tf_run(const bw__tf_spec *spec, bw__tf_scratch *s, const bw__tf_key *key, const uint8_t *in,
               size_t inlen, void *out, size_t outcap, bw__tf_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof(*res));
    if (spec->n < 1 || spec->n > BW_TF_MAX_OPS || spec->ops[0].kind != BW_TF_DECODE) {
        snprintf(err, errlen,
                 "transform: not a spec bw__tf_parse accepted (it starts with decode)");
        return BW_INVALID_ARGUMENT;
    }
    value v = {SLOT_A, 0, 0, BW_TF_UINT8, 0};
    char what[48];
    /* The last op that writes a new buffer (normalize, chw, cast) writes into out when the
     * result fits, which saves copying it there at the end. */
    bool in_out = false;
    for (int k = 0; k < spec->n; k++) {
        const bw__tf_op *op = &spec->ops[k];
        snprintf(what, sizeof(what), "op %d (%s)", k + 1, op_names[op->kind]);
        int rc = BW_OK;
        bw__tf_rng rng;
        bw__tf_draw *draw = &res->draws[res->ndraws];
        int64_t box[4];
        size_t n = (size_t)v.h * (size_t)v.w * 3, bytes;
        void *dst;
        switch (op->kind) {
        case BW_TF_DECODE: {
            decode_ctx d = {s, SLOT_A};
            char why[400];
            if (bw__tf_is_png(in, inlen))
                rc = bw__tf_png_decode(in, inlen, s->max_pixels, decode_buf, &d, &v.h, &v.w, why,
                                       sizeof(why));
            else if (!s->tj && !(s->tj = tjInitDecompress())) {
                snprintf(why, sizeof(why), "decode: out of memory starting TurboJPEG");
                rc = BW_NOMEM;
            } else {
                rc = bw__tf_jpeg_decode(s->tj, in, inlen, s->max_pixels, decode_buf, &d, &v.h, &v.w,
                                        why, sizeof(why));
                /* TurboJPEG 2.1 leaves a decompressor whose header read failed (a file that
                 * ends inside its header) reading every later header as 0x0: a fresh one
                 * after any failure keeps the scratch usable (fuzz_transform found it). */
                if (rc != BW_OK) {
                    tjDestroy(s->tj);
                    s->tj = tjInitDecompress();
                }
            }
            if (rc != BW_OK)
                snprintf(err, errlen, "op %d: %s", k + 1, why);
            break;
        }
        case BW_TF_RESIZE: {
            int oh = op->a, ow = op->b;
            if (!op->b)
                bw__tf_shorter_side(v.h, v.w, op->a, &oh, &ow);
            rc = resize_to(s, &v, oh, ow, what, err, errlen);
            break;
        }
        case BW_TF_CENTER_CROP:
            bw__tf_center_box(v.h, v.w, op->a, op->b, &box[0], &box[1]);
            box[2] = op->a;
            box[3] = op->b;
            rc = crop_to(s, &v, box, what, err, errlen);
            break;
        case BW_TF_RESIZED_CROP:
        case BW_TF_RANDOM_RESIZED_CROP: {
            int oh = op->a, ow = op->b;
            if (op->kind == BW_TF_RANDOM_RESIZED_CROP) {
                bw__tf_rng_init(&rng, key, k);
                bw__tf_rrc_params(&rng, v.h, v.w, op->scale, op->ratio, box);
                draw->op = k;
                memcpy(draw->box, box, sizeof(box));
                res->ndraws++;
            } else {
                memcpy(box, op->i, sizeof(box));
            }
            if (!op->b)
                bw__tf_shorter_side((int)box[2], (int)box[3], op->a, &oh, &ow);
            rc = crop_to(s, &v, box, what, err, errlen);
            if (rc == BW_OK)
                rc = resize_to(s, &v, oh, ow, what, err, errlen);
            break;
        }
        case BW_TF_FLIP: {
            bw__tf_rng_init(&rng, key, k);
            draw->op = k;
            draw->flipped = bw__tf_rng_uniform(&rng) < op->p;
            res->ndraws++;
            bw__tf_image im = image_of(s, &v);
            if (draw->flipped)
                bw__tf_hflip(&im);
            break;
        }
        case BW_TF_NORMALIZE: {
            /* normalize then chw: one pass writing channels first (the same values) */
            bool fuse = !v.chw && k + 1 < spec->n && spec->ops[k + 1].kind == BW_TF_CHW;
            bytes = n * sizeof(float);
            if (!(dst = out_or_slot(s, &v, k + fuse == spec->n - 1, bytes, out, outcap, &in_out)))
                return nomem(err, errlen, what, bytes);
            if (fuse) {
                bw__tf_image im = image_of(s, &v);
                bw__tf_normalize_chw(&im, op->mean, op->std, dst);
                v.chw = 1;
                k++;
            } else if (v.chw) {
                /* Channels-first uint8 (chw before normalize): normalise plane by plane. */
                size_t plane = (size_t)v.h * (size_t)v.w;
                for (size_t i = 0; i < n; i++) {
                    size_t ch = i / plane;
                    float x = (float)((const uint8_t *)s->buf[v.k])[i] / 255.0f;
                    x = x - op->mean[ch];
                    ((float *)dst)[i] = x / op->std[ch];
                }
            } else {
                bw__tf_image im = image_of(s, &v);
                bw__tf_normalize(&im, op->mean, op->std, dst);
            }
            v.k = 1 - v.k;
            v.dtype = BW_TF_FLOAT32;
            break;
        }
        case BW_TF_CHW:
            bytes = n * bw__tf_dtype_size(v.dtype);
            if (!(dst = out_or_slot(s, &v, k == spec->n - 1, bytes, out, outcap, &in_out)))
                return nomem(err, errlen, what, bytes);
            to_chw(s->buf[v.k], dst, v.h, v.w, bw__tf_dtype_size(v.dtype));
            v.k = 1 - v.k;
            v.chw = 1;
            break;
        case BW_TF_CAST:
            bytes = n * bw__tf_dtype_size(op->cast);
            if (!(dst = out_or_slot(s, &v, k == spec->n - 1, bytes, out, outcap, &in_out)))
                return nomem(err, errlen, what, bytes);
            cast_values(s->buf[v.k], v.dtype, dst, op->cast, n);
            v.k = 1 - v.k;
            v.dtype = op->cast;
            break;
        case BW_TF_TRUNCATE:
        case BW_TF_PAD: /* token pipelines run in bw__tf_tokens_run; the parser keeps them apart */
            snprintf(err, errlen, "%s: a token op in an image pipeline", what);
            return BW_INVALID_ARGUMENT;
        }
        if (rc != BW_OK)
            return rc;
    }
    bw__tf_shape *sh = &res->shape;
    bw__tf_shape_set(sh, v.dtype, v.chw, v.h, v.w);
    if (sh->bytes > outcap) {
        snprintf(err, errlen,
                 "the result (%dx%dx%d %s) is %zu bytes, more than the %zu of the "
                 "output buffer",
                 sh->dims[0], sh->dims[1], sh->dims[2],
                 v.dtype == BW_TF_UINT8     ? "uint8"
                 : v.dtype == BW_TF_FLOAT32 ? "float32"
                                            : "16-bit",
                 sh->bytes, outcap);
        return BW_TOO_BIG;
    }
    if (!in_out)
        memcpy(out, s->buf[v.k], sh->bytes);
    return BW_OK;
}
