/* The transform spec: parsing, validation, canonical text and output shape (transform.h;
 * the syntax is docs/transforms.md, "Spec syntax"). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "transform/transform.h"

enum { MAX_ARGS = 8 };

typedef struct parsed_args {
    int n, semi; /* number of arguments; index of the first after ';' (or -1) */
    char text[MAX_ARGS][64];
} parsed_args;

typedef struct pctx {
    char *err;
    size_t errlen;
    int pos;        /* 1-based op position */
    const char *op; /* the op's text, for messages */
    int oplen;
} pctx;

static int fail(const pctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(const pctx *c, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    snprintf(c->err, c->errlen, "op %d '%.*s': %s", c->pos, c->oplen > 200 ? 200 : c->oplen, c->op,
             why);
    return BW_INVALID_ARGUMENT;
}

static const char *const dtype_names[] = {"uint8", "float32", "float16", "bfloat16"};

static int parse_int(const pctx *c, const char *s, const char *what, int64_t lo, int64_t hi,
                     int64_t *out)
{
    char *end;
    errno = 0;
    const char *p = s + (*s == '-' || *s == '+');
    long long v = strtoll(s, &end, 10);
    if (!isdigit((unsigned char)*p) || *end || errno)
        return fail(c, "%s '%s' is not an integer", what, s);
    if (v < lo || v > hi)
        return fail(c, "%s %lld is out of range [%lld, %lld]", what, v, (long long)lo,
                    (long long)hi);
    *out = v;
    return BW_OK;
}

static int parse_side(const pctx *c, const char *s, const char *what, int *out)
{
    int64_t v = 0;
    int rc = parse_int(c, s, what, 1, BW_TF_MAX_SIDE, &v);
    *out = (int)v;
    return rc;
}

static int parse_real(const pctx *c, const char *s, const char *what, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || isspace((unsigned char)*s))
        return fail(c, "%s '%s' is not a finite decimal number", what, s);
    *out = v;
    return BW_OK;
}

/* "(a,b;c)" after the name into args; the text must end right after ')'. */
static int split_args(const pctx *c, const char *p, const char *end, parsed_args *a)
{
    memset(a, 0, sizeof(*a));
    a->semi = -1;
    if (p == end)
        return BW_OK;
    if (*p != '(' || end[-1] != ')')
        return fail(c, "expected NAME or NAME(ARGS)");
    p++;
    end--;
    if (p == end)
        return fail(c, "empty argument list: leave out the parentheses");
    for (;;) {
        const char *q = p;
        while (q < end && *q != ',' && *q != ';')
            q++;
        const char *s = p, *e = q;
        while (s < e && isspace((unsigned char)*s))
            s++;
        while (e > s && isspace((unsigned char)e[-1]))
            e--;
        if (a->n == MAX_ARGS)
            return fail(c, "more than %d arguments", MAX_ARGS);
        if (s == e)
            return fail(c, "argument %d is empty", a->n + 1);
        if ((size_t)(e - s) >= sizeof(a->text[0]))
            return fail(c, "argument %d is longer than %zu characters", a->n + 1,
                        sizeof(a->text[0]) - 1);
        memcpy(a->text[a->n], s, (size_t)(e - s));
        a->n++;
        if (q == end)
            break;
        if (*q == ';') {
            if (a->semi >= 0)
                return fail(c, "more than one ';'");
            a->semi = a->n;
        }
        p = q + 1;
    }
    return BW_OK;
}

static int want_args(const pctx *c, const parsed_args *a, const char *usage, int n1, int n2, int n3)
{
    if (a->semi >= 0)
        return fail(c, "unexpected ';': usage %s", usage);
    if (a->n != n1 && a->n != n2 && a->n != n3)
        return fail(c, "%d argument%s given: usage %s", a->n, a->n == 1 ? "" : "s", usage);
    return BW_OK;
}

/* The value state a pipeline carries from op to op, for validation and the output shape. */
typedef struct vstate {
    int decoded;
    int truncated, padded; /* token ops seen */
    bw__tf_dtype dtype;
    int chw;
    int h, w; /* 0: depends on the image */
} vstate;

static int check_image_op(const pctx *c, const vstate *v)
{
    if (v->truncated || v->padded)
        return fail(c, "image ops and token ops (truncate, pad) do not mix: a spec is either "
                       "decode and image ops, or token ops");
    if (!v->decoded)
        return fail(c, "the spec must start with decode (the samples are encoded images)");
    if (v->dtype != BW_TF_UINT8 || v->chw)
        return fail(c, "image ops work on the uint8 HWC image decode gives: put them before "
                       "normalize, cast and chw");
    return BW_OK;
}

static int parse_op(const pctx *c, const char *name, size_t nl, const parsed_args *a, bw__tf_op *op,
                    vstate *v)
{
    int rc = BW_OK;
    memset(op, 0, sizeof(*op));
#define IS(s) (nl == strlen(s) && memcmp(name, s, nl) == 0)
    if (IS("decode")) {
        op->kind = BW_TF_DECODE;
        if ((rc = want_args(c, a, "decode", 0, 0, 0)) != BW_OK)
            return rc;
        if (v->decoded || c->pos != 1)
            return fail(c, "decode must be the first op, once");
        v->decoded = 1;
        return BW_OK;
    }
    if (IS("resize")) {
        op->kind = BW_TF_RESIZE;
        if ((rc = want_args(c, a, "resize(S) or resize(H,W)", 1, 2, 2)) != BW_OK ||
            (rc = check_image_op(c, v)) != BW_OK ||
            (rc = parse_side(c, a->text[0], a->n == 1 ? "size" : "height", &op->a)) != BW_OK ||
            (a->n == 2 && (rc = parse_side(c, a->text[1], "width", &op->b)) != BW_OK))
            return rc;
        if (op->b) {
            v->h = op->a;
            v->w = op->b;
        } else if (v->h) {
            bw__tf_shorter_side(v->h, v->w, op->a, &v->h, &v->w);
        }
        return BW_OK;
    }
    if (IS("center_crop")) {
        op->kind = BW_TF_CENTER_CROP;
        if ((rc = want_args(c, a, "center_crop(S) or center_crop(H,W)", 1, 2, 2)) != BW_OK ||
            (rc = check_image_op(c, v)) != BW_OK ||
            (rc = parse_side(c, a->text[0], a->n == 1 ? "size" : "height", &op->a)) != BW_OK ||
            (rc = parse_side(c, a->text[a->n - 1], a->n == 1 ? "size" : "width", &op->b)) != BW_OK)
            return rc;
        v->h = op->a;
        v->w = op->b;
        return BW_OK;
    }
    if (IS("resized_crop")) {
        op->kind = BW_TF_RESIZED_CROP;
        static const char *const what[] = {"top", "left", "height", "width"};
        if ((rc = want_args(c, a,
                            "resized_crop(TOP,LEFT,HEIGHT,WIDTH,S) or "
                            "resized_crop(TOP,LEFT,HEIGHT,WIDTH,H,W)",
                            5, 6, 6)) != BW_OK ||
            (rc = check_image_op(c, v)) != BW_OK)
            return rc;
        for (int k = 0; k < 4; k++) {
            int64_t lim = k < 2 ? (int64_t)1 << 30 : (int64_t)BW_TF_MAX_SIDE * 4;
            if ((rc = parse_int(c, a->text[k], what[k], k < 2 ? -lim : 1, lim, &op->i[k])) != BW_OK)
                return rc;
        }
        if ((rc = parse_side(c, a->text[4], a->n == 5 ? "size" : "output height", &op->a)) !=
                BW_OK ||
            (a->n == 6 && (rc = parse_side(c, a->text[5], "output width", &op->b)) != BW_OK))
            return rc;
        if (op->b) {
            v->h = op->a;
            v->w = op->b;
        } else {
            bw__tf_shorter_side((int)op->i[2], (int)op->i[3], op->a, &v->h, &v->w);
        }
        return BW_OK;
    }
    if (IS("random_resized_crop")) {
        op->kind = BW_TF_RANDOM_RESIZED_CROP;
        if ((rc = want_args(c, a,
                            "random_resized_crop(S), random_resized_crop(H,W), "
                            "random_resized_crop(H,W,SCALE_LO,SCALE_HI) or "
                            "random_resized_crop(H,W,SCALE_LO,SCALE_HI,RATIO_LO,RATIO_HI)",
                            a->n == 1 ? 1 : 2, 4, 6)) != BW_OK ||
            (rc = check_image_op(c, v)) != BW_OK ||
            (rc = parse_side(c, a->text[0], a->n == 1 ? "size" : "height", &op->a)) != BW_OK ||
            (rc = parse_side(c, a->text[a->n == 1 ? 0 : 1], a->n == 1 ? "size" : "width",
                             &op->b)) != BW_OK)
            return rc;
        op->scale[0] = 0.08;
        op->scale[1] = 1.0;
        op->ratio[0] = 3.0 / 4.0;
        op->ratio[1] = 4.0 / 3.0;
        if (a->n >= 4 && ((rc = parse_real(c, a->text[2], "scale_lo", &op->scale[0])) != BW_OK ||
                          (rc = parse_real(c, a->text[3], "scale_hi", &op->scale[1])) != BW_OK))
            return rc;
        if (a->n == 6 && ((rc = parse_real(c, a->text[4], "ratio_lo", &op->ratio[0])) != BW_OK ||
                          (rc = parse_real(c, a->text[5], "ratio_hi", &op->ratio[1])) != BW_OK))
            return rc;
        if (!(op->scale[0] > 0 && op->scale[0] <= op->scale[1] && op->scale[1] <= 1))
            return fail(c, "scale (%g, %g): need 0 < scale_lo <= scale_hi <= 1", op->scale[0],
                        op->scale[1]);
        if (!(op->ratio[0] > 0 && op->ratio[0] <= op->ratio[1] && op->ratio[1] <= 1e6))
            return fail(c, "ratio (%g, %g): need 0 < ratio_lo <= ratio_hi <= 1e6", op->ratio[0],
                        op->ratio[1]);
        v->h = op->a;
        v->w = op->b;
        return BW_OK;
    }
    if (IS("flip")) {
        op->kind = BW_TF_FLIP;
        op->p = 0.5;
        if ((rc = want_args(c, a, "flip or flip(P)", 0, 1, 1)) != BW_OK ||
            (rc = check_image_op(c, v)) != BW_OK ||
            (a->n == 1 && (rc = parse_real(c, a->text[0], "probability", &op->p)) != BW_OK))
            return rc;
        if (op->p < 0 || op->p > 1)
            return fail(c, "probability %g is not in [0, 1]", op->p);
        return BW_OK;
    }
    if (IS("normalize")) {
        op->kind = BW_TF_NORMALIZE;
        if (a->n != 6 || a->semi != 3)
            return fail(c, "usage normalize(M1,M2,M3;S1,S2,S3): three means, ';', three "
                           "standard deviations");
        if (!v->decoded)
            return check_image_op(c, v);
        if (v->dtype != BW_TF_UINT8)
            return fail(c, "normalize takes the uint8 image (x / 255); the data is %s here",
                        dtype_names[v->dtype]);
        for (int k = 0; k < 6; k++) {
            double d = 0;
            if ((rc = parse_real(c, a->text[k], k < 3 ? "mean" : "std", &d)) != BW_OK)
                return rc;
            /* torch.tensor([...], dtype=float32) rounds the Python float (a double). */
            if (k < 3)
                op->mean[k] = (float)d;
            else
                op->std[k - 3] = (float)d;
            if (k >= 3 && op->std[k - 3] == 0)
                return fail(c, "std %s is zero (in float32)", a->text[k]);
            if (!isfinite(k < 3 ? op->mean[k] : op->std[k - 3]))
                return fail(c, "%s %s overflows float32", k < 3 ? "mean" : "std", a->text[k]);
        }
        v->dtype = BW_TF_FLOAT32;
        return BW_OK;
    }
    if (IS("chw")) {
        op->kind = BW_TF_CHW;
        if ((rc = want_args(c, a, "chw", 0, 0, 0)) != BW_OK)
            return rc;
        if (!v->decoded)
            return check_image_op(c, v);
        if (v->chw)
            return fail(c, "the data is channels-first already");
        v->chw = 1;
        return BW_OK;
    }
    if (IS("cast")) {
        op->kind = BW_TF_CAST;
        if ((rc = want_args(c, a, "cast(T), T one of uint8, float32, float16, bfloat16", 1, 1,
                            1)) != BW_OK)
            return rc;
        if (!v->decoded)
            return check_image_op(c, v);
        int found = -1;
        for (int k = 0; k < 4; k++)
            if (strcmp(a->text[0], dtype_names[k]) == 0)
                found = k;
        if (found < 0)
            return fail(c, "type '%s' is not one of uint8, float32, float16, bfloat16", a->text[0]);
        op->cast = (bw__tf_dtype)found;
        if (v->dtype == BW_TF_FLOAT16 || v->dtype == BW_TF_BFLOAT16)
            return fail(c, "the data is %s already: cast once, from uint8 or float32",
                        dtype_names[v->dtype]);
        if (op->cast == BW_TF_UINT8 && v->dtype != BW_TF_UINT8)
            return fail(c,
                        "cast(uint8) of %s data is not supported (it would have to choose a "
                        "rounding and a range): leave out normalize for uint8 output",
                        dtype_names[v->dtype]);
        v->dtype = op->cast;
        return BW_OK;
    }
    if (IS("truncate") || IS("pad")) {
        /* Token arrays (docs/transforms.md, "Token arrays"): truncate then pad, each once. */
        int pad = IS("pad");
        op->kind = pad ? BW_TF_PAD : BW_TF_TRUNCATE;
        int64_t len = 0;
        if ((rc = want_args(c, a, pad ? "pad(L,VALUE)" : "truncate(L)", pad ? 2 : 1, pad ? 2 : 1,
                            pad ? 2 : 1)) != BW_OK ||
            (rc = parse_int(c, a->text[0], "length", 1, BW_TF_MAX_TOKENS, &len)) != BW_OK)
            return rc;
        op->a = (int)len;
        if (v->decoded)
            return fail(c, "token ops (truncate, pad) read arrays of numbers, not images: a spec "
                           "is either decode and image ops, or token ops");
        if (pad ? v->padded : v->truncated)
            return fail(c, "%s once", pad ? "pad" : "truncate");
        if (!pad && v->padded)
            return fail(c, "truncate before pad");
        if (pad) {
            const char *t = a->text[1];
            const char *d = t + (*t == '-' || *t == '+');
            int integral = *d != '\0';
            for (; *d; d++)
                integral = integral && isdigit((unsigned char)*d);
            op->pad_is_int = integral;
            if (integral)
                rc = parse_int(c, t, "pad value", INT64_MIN, INT64_MAX, &op->pad_int);
            else
                rc = parse_real(c, t, "pad value", &op->pad_real);
            if (rc != BW_OK)
                return rc;
            /* One value, one spelling: 1.0 and -0.0 are the integers 1 and 0. */
            if (!integral && op->pad_real == floor(op->pad_real) && fabs(op->pad_real) < 0x1p53) {
                op->pad_is_int = 1;
                op->pad_int = (int64_t)op->pad_real;
                op->pad_real = 0;
            }
            v->padded = 1;
        } else {
            v->truncated = 1;
        }
        return BW_OK;
    }
#undef IS
    return fail(c, "unknown op: expected decode, resize, center_crop, resized_crop, "
                   "random_resized_crop, flip, normalize, chw, cast, truncate or pad");
}

static int walk(const char *text, bw__tf_spec *out, vstate *v, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    memset(v, 0, sizeof(*v));
    if (!text || !*text) {
        snprintf(err, errlen, "the spec is empty");
        return BW_INVALID_ARGUMENT;
    }
    size_t tl = strlen(text);
    if (tl > BW_TF_SPEC_MAX) {
        snprintf(err, errlen, "the spec is %zu characters, more than %d", tl, BW_TF_SPEC_MAX);
        return BW_INVALID_ARGUMENT;
    }
    for (size_t k = 0; k < tl; k++)
        if (!isprint((unsigned char)text[k])) {
            snprintf(err, errlen, "character %zu of the spec is not printable ASCII", k + 1);
            return BW_INVALID_ARGUMENT;
        }
    const char *p = text;
    for (int pos = 1;; pos++) {
        const char *e = strchr(p, '|');
        if (!e)
            e = p + strlen(p);
        while (p < e && isspace((unsigned char)*p))
            p++;
        const char *q = e;
        while (q > p && isspace((unsigned char)q[-1]))
            q--;
        pctx c = {err, errlen, pos, p, (int)(q - p)};
        if (p == q) {
            snprintf(err, errlen, "op %d is empty (ops are separated by '|')", pos);
            return BW_INVALID_ARGUMENT;
        }
        if (out->n == BW_TF_MAX_OPS)
            return fail(&c, "more than %d ops", BW_TF_MAX_OPS);
        const char *n = p;
        while (n < q && (islower((unsigned char)*n) || *n == '_'))
            n++;
        if (n == p)
            return fail(&c, "expected an op name (lower case letters and '_')");
        size_t nl = (size_t)(n - p);
        while (n < q && isspace((unsigned char)*n))
            n++;
        parsed_args a;
        int rc = split_args(&c, n, q, &a);
        if (rc == BW_OK)
            rc = parse_op(&c, p, nl, &a, &out->ops[out->n], v);
        if (rc != BW_OK)
            return rc;
        out->n++;
        if (!*e)
            break;
        p = e + 1;
    }
    return BW_OK;
}

int bw__tf_parse(const char *text, bw__tf_spec *out, char *err, size_t errlen)
{
    vstate v;
    return walk(text, out, &v, err, errlen);
}

/* Here rather than in ops.c: the parser's output sizes need it, and the parser is the
 * client library's too (CMakeLists.txt). */
void bw__tf_shorter_side(int h, int w, int s, int *oh, int *ow)
{
    /* torchvision: the shorter side becomes s, the longer int(s * long / short) (a float
     * division, truncated). */
    int shorter = w <= h ? w : h, longer = w <= h ? h : w;
    int nl = (int)((double)((int64_t)s * longer) / shorter);
    *ow = w <= h ? s : nl;
    *oh = w <= h ? nl : s;
}

size_t bw__tf_dtype_size(bw__tf_dtype d)
{
    return d == BW_TF_UINT8 ? 1 : d == BW_TF_FLOAT32 ? 4 : 2;
}

void bw__tf_shape_set(bw__tf_shape *out, bw__tf_dtype d, int chw, int h, int w)
{
    memset(out, 0, sizeof(*out));
    out->dtype = d;
    out->chw = chw;
    out->dims[0] = chw ? 3 : h;
    out->dims[1] = chw ? h : w;
    out->dims[2] = chw ? w : 3;
    out->ndim = 3;
    out->bytes = (size_t)h * (size_t)w * 3 * bw__tf_dtype_size(d);
    /* bw_batch_dtype's text: numpy's descr where numpy has the type, bfloat16 by name. */
    static const char *const descr[] = {"|u1", "<f4", "<f2", "bfloat16"};
    snprintf(out->descr, sizeof(out->descr), "%s", descr[d]);
}

int bw__tf_output_shape(const bw__tf_spec *spec, bw__tf_shape *out, char *err, size_t errlen)
{
    char canon[BW_TF_CANON_MAX];
    vstate v;
    bw__tf_spec again;
    /* Re-walk the canonical text: the state is a by-product of validation. */
    if (bw__tf_format(spec, canon, sizeof(canon)) < 0 ||
        walk(canon, &again, &v, err, errlen) != BW_OK) {
        if (err && errlen)
            snprintf(err, errlen, "the spec is not valid");
        return BW_INVALID_ARGUMENT;
    }
    if (v.truncated || v.padded) {
        snprintf(err, errlen,
                 "token ops (truncate, pad): the result's type and length come from the "
                 "dataset's samples (bw__tf_tokens_shape)");
        return BW_INVALID_ARGUMENT;
    }
    if (!v.h) {
        snprintf(err, errlen,
                 "the output size depends on each image: end the image ops with a fixed size "
                 "(resize(H,W), center_crop, resized_crop or random_resized_crop) so that a "
                 "batch is one tensor");
        return BW_INVALID_ARGUMENT;
    }
    bw__tf_shape_set(out, v.dtype, v.chw, v.h, v.w);
    return BW_OK;
}

int bw__tf_format(const bw__tf_spec *spec, char *buf, size_t len)
{
    size_t at = 0;
    int n;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        n = snprintf(buf + at, len > at ? len - at : 0, __VA_ARGS__);                              \
        if (n < 0 || (size_t)n >= (len > at ? len - at : 0))                                       \
            return -1;                                                                             \
        at += (size_t)n;                                                                           \
    } while (0)
    for (int k = 0; k < spec->n; k++) {
        const bw__tf_op *op = &spec->ops[k];
        if (k)
            PUT("|");
        switch (op->kind) {
        case BW_TF_DECODE:
            PUT("decode");
            break;
        case BW_TF_RESIZE:
            if (op->b)
                PUT("resize(%d,%d)", op->a, op->b);
            else
                PUT("resize(%d)", op->a);
            break;
        case BW_TF_CENTER_CROP:
            PUT("center_crop(%d,%d)", op->a, op->b);
            break;
        case BW_TF_RESIZED_CROP:
            PUT("resized_crop(%lld,%lld,%lld,%lld,%d", (long long)op->i[0], (long long)op->i[1],
                (long long)op->i[2], (long long)op->i[3], op->a);
            if (op->b)
                PUT(",%d", op->b);
            PUT(")");
            break;
        case BW_TF_RANDOM_RESIZED_CROP:
            PUT("random_resized_crop(%d,%d,%.17g,%.17g,%.17g,%.17g)", op->a, op->b, op->scale[0],
                op->scale[1], op->ratio[0], op->ratio[1]);
            break;
        case BW_TF_FLIP:
            PUT("flip(%.17g)", op->p);
            break;
        case BW_TF_NORMALIZE:
            PUT("normalize(%.9g,%.9g,%.9g;%.9g,%.9g,%.9g)", (double)op->mean[0],
                (double)op->mean[1], (double)op->mean[2], (double)op->std[0], (double)op->std[1],
                (double)op->std[2]);
            break;
        case BW_TF_CHW:
            PUT("chw");
            break;
        case BW_TF_CAST:
            PUT("cast(%s)", dtype_names[op->cast]);
            break;
        case BW_TF_TRUNCATE:
            PUT("truncate(%d)", op->a);
            break;
        case BW_TF_PAD:
            if (op->pad_is_int)
                PUT("pad(%d,%lld)", op->a, (long long)op->pad_int);
            else
                PUT("pad(%d,%.17g)", op->a, op->pad_real);
            break;
        }
    }
#undef PUT
    return (int)at;
}
