/* The image operations (transform.h). Each follows what Pillow and torchvision compute on a
 * PIL image, as docs/transforms.md describes; the comments say where a detail matters for
 * equality with them. Written from that description, not from their code. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "transform/transform.h"

/* Pillow's 8-bit resampling works in fixed point with 22 fractional bits: 32 bits less 8 for
 * the value and 2 of headroom. */
enum { PREC = 22 };

/* The bilinear (triangle) filter, support 1. */
static double triangle(double x)
{
    x = x < 0 ? -x : x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Kernel width for a resize from `in` to `out` samples: the support (1 for bilinear) widens
 * by the downscale factor, which is what makes a downscale antialiased. */
static int kernel_size(int in, int out)
{
    double scale = (double)in / out;
    double support = scale < 1.0 ? 1.0 : scale;
    return (int)ceil(support) * 2 + 1;
}

size_t bw__tf_resize_coef_bytes(int sh, int sw, int dh, int dw)
{
    int kh = kernel_size(sw, dw), kv = kernel_size(sh, dh);
    /* bounds and weights of both passes, and the vertical pass's accumulators (c <= 4) */
    size_t ints = 2 * (size_t)dw + (size_t)dw * (size_t)kh + 2 * (size_t)dh +
                  (size_t)dh * (size_t)kv + (size_t)dw * 4;
    return ints * sizeof(int32_t) + (size_t)(kh > kv ? kh : kv) * sizeof(double);
}

/* For each output position o in [0, out): the first input sample bounds[2o], the number of
 * them bounds[2o+1], and their fixed-point weights k[o * ksize ..]. The weights are computed
 * in double exactly as Pillow orders the arithmetic (the centre of output o is (o + 0.5) *
 * scale; rounding the bounds by +0.5 and truncating), normalised to sum 1, then rounded to
 * PREC bits away from zero; those integers are what make results bit-equal to Pillow's. */
static void coefficients(int in, int out, int ksize, int32_t *bounds, int32_t *k, double *w)
{
    double scale = (double)in / out;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale;
    double inv = 1.0 / filterscale;
    for (int o = 0; o < out; o++) {
        double center = (o + 0.5) * scale;
        double lo = center - support + 0.5, hi = center + support + 0.5;
        int xmin = lo < 0 ? 0 : (int)lo;
        int xmax = hi > in ? in : (int)hi;
        xmax -= xmin;
        double ww = 0.0;
        for (int x = 0; x < xmax; x++) {
            w[x] = triangle((x + xmin - center + 0.5) * inv);
            ww += w[x];
        }
        int32_t *ko = k + (size_t)o * (size_t)ksize;
        for (int x = 0; x < ksize; x++) {
            double v = x < xmax ? (ww != 0.0 ? w[x] / ww : w[x]) : 0.0;
            ko[x] = (int32_t)(v < 0 ? -0.5 + v * (1 << PREC) : 0.5 + v * (1 << PREC));
        }
        bounds[2 * o] = xmin;
        bounds[2 * o + 1] = xmax;
    }
}

static uint8_t clip8(int32_t v)
{
    if (v < 0)
        return 0;
    v >>= PREC;
    return (uint8_t)(v > 255 ? 255 : v);
}

/* One pass along rows (horizontal) or columns (vertical): out[o] = sum k * in[bounds..]. The
 * intermediate between the passes is 8-bit, as in Pillow. Sums are exact integers, so their
 * order is free: the horizontal pass keeps a pixel's channels in registers, the vertical one
 * adds whole input rows into a row of accumulators (acc, w * c of them), which the compiler
 * vectorises. */
static void pass_h(const uint8_t *src, int h, int sw, int c, uint8_t *dst, int dw, int ksize,
                   const int32_t *bounds, const int32_t *k)
{
    for (int y = 0; y < h; y++) {
        const uint8_t *row = src + (size_t)y * (size_t)sw * (size_t)c;
        uint8_t *out = dst + (size_t)y * (size_t)dw * (size_t)c;
        for (int o = 0; o < dw; o++) {
            const int32_t *ko = k + (size_t)o * (size_t)ksize;
            const uint8_t *in = row + (size_t)bounds[2 * o] * (size_t)c;
            int n = bounds[2 * o + 1];
            if (c == 3) {
                int32_t s0 = 1 << (PREC - 1), s1 = s0, s2 = s0;
                for (int x = 0; x < n; x++, in += 3) {
                    s0 += in[0] * ko[x];
                    s1 += in[1] * ko[x];
                    s2 += in[2] * ko[x];
                }
                out[(size_t)o * 3] = clip8(s0);
                out[(size_t)o * 3 + 1] = clip8(s1);
                out[(size_t)o * 3 + 2] = clip8(s2);
                continue;
            }
            for (int ch = 0; ch < c; ch++) {
                int32_t ss = 1 << (PREC - 1);
                for (int x = 0; x < n; x++)
                    ss += in[(size_t)x * (size_t)c + (size_t)ch] * ko[x];
                out[(size_t)o * (size_t)c + (size_t)ch] = clip8(ss);
            }
        }
    }
}

static void pass_v(const uint8_t *src, int w, int c, uint8_t *dst, int dh, int ksize,
                   const int32_t *bounds, const int32_t *k, int32_t *acc)
{
    size_t stride = (size_t)w * (size_t)c;
    for (int o = 0; o < dh; o++) {
        const int32_t *ko = k + (size_t)o * (size_t)ksize;
        const uint8_t *in = src + (size_t)bounds[2 * o] * stride;
        int n = bounds[2 * o + 1];
        uint8_t *out = dst + (size_t)o * stride;
        for (size_t i = 0; i < stride; i++)
            acc[i] = 1 << (PREC - 1);
        for (int y = 0; y < n; y++) {
            const uint8_t *row = in + (size_t)y * stride;
            int32_t kv = ko[y];
            for (size_t i = 0; i < stride; i++)
                acc[i] += row[i] * kv;
        }
        for (size_t i = 0; i < stride; i++)
            out[i] = clip8(acc[i]);
    }
}

void bw__tf_resize(const bw__tf_image *src, bw__tf_image *dst, uint8_t *tmp, void *coef)
{
    int c = src->c, sh = src->h, sw = src->w, dh = dst->h, dw = dst->w;
    int kh = kernel_size(sw, dw), kv = kernel_size(sh, dh);
    /* The doubles first: coef is malloc'd, so they are aligned, and the int32s after them. */
    double *w = coef;
    int32_t *bh = (int32_t *)(void *)(w + (kh > kv ? kh : kv));
    int32_t *khw = bh + 2 * (size_t)dw, *bv = khw + (size_t)dw * (size_t)kh;
    int32_t *kvw = bv + 2 * (size_t)dh;
    /* Pillow skips a pass whose size does not change (and copies when neither does). */
    int horiz = dw != sw, vert = dh != sh;
    if (!horiz && !vert) {
        memcpy(dst->p, src->p, (size_t)sh * (size_t)sw * (size_t)c);
        return;
    }
    if (horiz) {
        coefficients(sw, dw, kh, bh, khw, w);
        pass_h(src->p, sh, sw, c, vert ? tmp : dst->p, dw, kh, bh, khw);
    }
    if (vert) {
        coefficients(sh, dh, kv, bv, kvw, w);
        pass_v(horiz ? tmp : src->p, dw, c, dst->p, dh, kv, bv, kvw, kvw + (size_t)dh * (size_t)kv);
    }
}

void bw__tf_crop(const bw__tf_image *src, int64_t top, int64_t left, bw__tf_image *dst)
{
    int c = src->c;
    size_t row_bytes = (size_t)dst->w * (size_t)c;
    /* Columns of the box inside src: [x0, x1) in dst coordinates. */
    int64_t x0 = left < 0 ? -left : 0, x1 = src->w - left;
    if (x1 > dst->w)
        x1 = dst->w;
    for (int y = 0; y < dst->h; y++) {
        uint8_t *out = dst->p + (size_t)y * row_bytes;
        int64_t sy = top + y;
        if (sy < 0 || sy >= src->h || x1 <= x0) {
            memset(out, 0, row_bytes);
            continue;
        }
        const uint8_t *in = src->p + ((size_t)sy * (size_t)src->w) * (size_t)c;
        memset(out, 0, (size_t)x0 * (size_t)c);
        memcpy(out + (size_t)x0 * (size_t)c, in + (size_t)(left + x0) * (size_t)c,
               (size_t)(x1 - x0) * (size_t)c);
        memset(out + (size_t)x1 * (size_t)c, 0, (size_t)(dst->w - x1) * (size_t)c);
    }
}

/* Python's round() of d / 2 for an integer d >= 0: halves go to the even neighbour. */
static int64_t half_even(int64_t d)
{
    int64_t k = d / 2;
    return d % 2 == 0 || k % 2 == 0 ? k : k + 1;
}

void bw__tf_center_box(int h, int w, int ch, int cw, int64_t *top, int64_t *left)
{
    /* torchvision pads a side the crop exceeds with (crop - size) // 2 zeros before (and the
     * rest after), then takes round((size - crop) / 2) of the padded image: in the original
     * image's coordinates that is -(crop - size) // 2 on a padded side. */
    *top = ch > h ? -((int64_t)(ch - h) / 2) : half_even(h - ch);
    *left = cw > w ? -((int64_t)(cw - w) / 2) : half_even(w - cw);
}

void bw__tf_hflip(bw__tf_image *img)
{
    int c = img->c;
    for (int y = 0; y < img->h; y++) {
        uint8_t *row = img->p + (size_t)y * (size_t)img->w * (size_t)c;
        for (int a = 0, b = img->w - 1; a < b; a++, b--)
            for (int ch = 0; ch < c; ch++) {
                uint8_t t = row[(size_t)a * (size_t)c + (size_t)ch];
                row[(size_t)a * (size_t)c + (size_t)ch] = row[(size_t)b * (size_t)c + (size_t)ch];
                row[(size_t)b * (size_t)c + (size_t)ch] = t;
            }
    }
}

/* torchvision: to_tensor divides by 255 in float32, then normalize subtracts the mean and
 * divides by the std, each in float32 (x86-64 evaluates float in float: FLT_EVAL_METHOD 0).
 * One table per channel gives the same values as computing each one. */
static void normalize_lut(int c, const float mean[3], const float std[3], float lut[3][256])
{
    for (int ch = 0; ch < 3 && ch < c; ch++)
        for (int v = 0; v < 256; v++) {
            float x = (float)v / 255.0f;
            x = x - mean[ch];
            lut[ch][v] = x / std[ch];
        }
}

void bw__tf_normalize(const bw__tf_image *src, const float mean[3], const float std[3], float *dst)
{
    float lut[3][256];
    normalize_lut(src->c, mean, std, lut);
    size_t n = (size_t)src->h * (size_t)src->w;
    for (size_t i = 0; i < n; i++)
        for (int ch = 0; ch < 3; ch++)
            dst[i * 3 + (size_t)ch] = lut[ch][src->p[i * 3 + (size_t)ch]];
}

void bw__tf_normalize_chw(const bw__tf_image *src, const float mean[3], const float std[3],
                          float *dst)
{
    float lut[3][256];
    normalize_lut(src->c, mean, std, lut);
    size_t n = (size_t)src->h * (size_t)src->w;
    float *r = dst, *g = dst + n, *b = dst + 2 * n;
    const uint8_t *p = src->p;
    for (size_t i = 0; i < n; i++, p += 3) {
        r[i] = lut[0][p[0]];
        g[i] = lut[1][p[1]];
        b[i] = lut[2][p[2]];
    }
}
