/* Token arrays: truncate and pad on rows of numbers (transform.h; docs/transforms.md, "Token
 * arrays"). Part of the client library too, as the spec parser is: a loader learns the
 * shape of its batches from the job's dataset before any worker runs the pipeline. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "transform/transform.h"

int bw__tf_is_tokens(const bw__tf_spec *spec)
{
    return spec->n > 0 && (spec->ops[0].kind == BW_TF_TRUNCATE || spec->ops[0].kind == BW_TF_PAD);
}

/* The pad value of op as `size` bytes of kind ('i', 'u' or 'f'), little-endian; BW_OK or the
 * reason it is not a value of that type. */
static int pad_bytes(const bw__tf_op *op, char kind, int size, uint8_t out[8], char *why,
                     size_t whylen)
{
    char text[40];
    if (op->pad_is_int)
        snprintf(text, sizeof(text), "%lld", (long long)op->pad_int);
    else
        snprintf(text, sizeof(text), "%.17g", op->pad_real);
    if (kind == 'f') {
        double d = op->pad_is_int ? (double)op->pad_int : op->pad_real;
        if (size == 4) {
            float f = (float)d;
            if (!isfinite(f)) {
                snprintf(why, whylen, "pad value %s overflows float32", text);
                return BW_INVALID_ARGUMENT;
            }
            memcpy(out, &f, 4);
        } else {
            memcpy(out, &d, 8);
        }
        return BW_OK;
    }
    if (!op->pad_is_int) {
        snprintf(why, whylen, "pad value %s is not an integer, and the values are integers", text);
        return BW_INVALID_ARGUMENT;
    }
    int bits = size * 8;
    int64_t v = op->pad_int;
    int fits = kind == 'u' ? v >= 0 && (bits == 64 || (uint64_t)v < (uint64_t)1 << bits)
                           : bits == 64 || (v >= -((int64_t)1 << (bits - 1)) &&
                                            v < ((int64_t)1 << (bits - 1)));
    if (!fits) {
        snprintf(why, whylen, "pad value %s is out of the range of %s%d", text,
                 kind == 'u' ? "uint" : "int", bits);
        return BW_INVALID_ARGUMENT;
    }
    uint64_t u = (uint64_t)v;
    for (int k = 0; k < size; k++)
        out[k] = (uint8_t)(u >> (8 * k));
    return BW_OK;
}

/* The values of a row of n that a pipeline keeps (truncate's cut: pad only appends), and
 * the length it makes of the row. */
static uint64_t kept_len(const bw__tf_spec *spec, uint64_t n)
{
    for (int k = 0; k < spec->n; k++)
        if (spec->ops[k].kind == BW_TF_TRUNCATE && n > (uint64_t)spec->ops[k].a)
            n = (uint64_t)spec->ops[k].a;
    return n;
}

static uint64_t out_len(const bw__tf_spec *spec, uint64_t n)
{
    n = kept_len(spec, n);
    for (int k = 0; k < spec->n; k++)
        if (spec->ops[k].kind == BW_TF_PAD && n < (uint64_t)spec->ops[k].a)
            n = (uint64_t)spec->ops[k].a;
    return n;
}

int bw__tf_tokens_shape(const bw__tf_spec *spec, const char *descr, const uint64_t *shape,
                        size_t ndim, bw__tf_shape *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    descr = descr ? descr : "";
    if (!bw__tf_is_tokens(spec)) {
        snprintf(err, errlen, "not a token pipeline (truncate, pad)");
        return BW_INVALID_ARGUMENT;
    }
    /* numpy's descr of a plain number: byte order, kind, one digit of size ("<i4", "|u1") */
    char order = descr[0], kind = order ? descr[1] : 0;
    int size = kind && descr[2] >= '1' && descr[2] <= '9' && !descr[3] ? descr[2] - '0' : 0;
    bool ok_kind = (kind == 'i' || kind == 'u') ? (size == 1 || size == 2 || size == 4 || size == 8)
                   : kind == 'f'                ? (size == 4 || size == 8)
                                                : false;
    if (!(order == '<' || order == '>' || order == '|') || !ok_kind) {
        snprintf(err, errlen,
                 "token ops (truncate, pad) read arrays of integers, float32 or float64; the "
                 "dataset's samples are %s",
                 descr[0] ? descr : "not arrays (no dtype: use an npy dataset)");
        return BW_INVALID_ARGUMENT;
    }
    if (ndim != 1) {
        snprintf(err, errlen,
                 "token ops (truncate, pad) read one row of values per sample; the dataset's "
                 "samples have %zu dimensions",
                 ndim);
        return BW_INVALID_ARGUMENT;
    }
    uint8_t le[8] = {0};
    const bw__tf_op *pad = NULL;
    for (int k = 0; k < spec->n; k++)
        if (spec->ops[k].kind == BW_TF_PAD)
            pad = &spec->ops[k];
    char why[160];
    if (pad && pad_bytes(pad, kind, size, le, why, sizeof(why)) != BW_OK) {
        snprintf(err, errlen, "op pad(%d,...): %s (the dataset's values are %s)", pad->a, why,
                 descr);
        return BW_INVALID_ARGUMENT;
    }
    for (int k = 0; k < size; k++) /* in the values' own byte order */
        out->pad[k] = order == '>' ? le[size - 1 - k] : le[k];
    out->ndim = 1;
    out->elem = size;
    uint64_t n = out_len(spec, shape[0]);
    out->dims[0] = (int)n;
    out->bytes = (size_t)n * (size_t)size;
    snprintf(out->descr, sizeof(out->descr), "%s", descr);
    return BW_OK;
}

int bw__tf_tokens_run(const bw__tf_spec *spec, const bw__tf_shape *shape, const uint8_t *in,
                      size_t inlen, void *out, size_t outcap, char *err, size_t errlen)
{
    size_t e = (size_t)shape->elem;
    if (!e || inlen % e) {
        snprintf(err, errlen, "the sample's %zu bytes are not a whole number of %zu-byte values",
                 inlen, e);
        return BW_CORRUPT;
    }
    uint64_t n = out_len(spec, inlen / e);
    if (n * e != shape->bytes || shape->bytes > outcap) {
        snprintf(err, errlen,
                 "the sample's %zu values make %llu, not the job's %d (every sample of a batch "
                 "has the same length)",
                 inlen / e, (unsigned long long)n, shape->dims[0]);
        return BW_CORRUPT;
    }
    size_t keep = (size_t)kept_len(spec, inlen / e) * e;
    memcpy(out, in, keep);
    for (size_t at = keep; at < shape->bytes; at += e)
        memcpy((uint8_t *)out + at, shape->pad, e);
    return BW_OK;
}

/* ---- JSON Lines fields (docs/transforms.md, "JSON Lines fields") ---- */

static const char *op_name(const bw__tf_op *op)
{
    return op->kind == BW_TF_PAD ? "pad" : "truncate";
}

int bw__tf_tokens_json_shape(const bw__tf_spec *spec, bw__tf_shape *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (!bw__tf_is_tokens(spec)) {
        snprintf(err, errlen, "not a token pipeline (truncate, pad)");
        return BW_INVALID_ARGUMENT;
    }
    const bw__tf_op *last = &spec->ops[spec->n - 1];
    if (last->kind != BW_TF_PAD) {
        snprintf(err, errlen,
                 "the rows of a JSON Lines field have varying lengths and a batch is one "
                 "tensor, so the pipeline must end with pad(L,VALUE), which makes every row L "
                 "values long (a truncate(L) before it cuts longer rows); it ends with "
                 "truncate(%d), which leaves shorter rows short",
                 last->a);
        return BW_INVALID_ARGUMENT;
    }
    for (int k = 0; k < spec->n - 1; k++)
        if (spec->ops[k].a > last->a) {
            snprintf(err, errlen,
                     "op %d %s(%d%s): longer than the final pad(%d,...), so rows would not all "
                     "have its length %d: the output length of a JSON Lines field is the last "
                     "pad's, and every truncate and pad before it must be at most that",
                     k + 1, op_name(&spec->ops[k]), spec->ops[k].a,
                     spec->ops[k].kind == BW_TF_PAD ? ",..." : "", last->a, last->a);
            return BW_INVALID_ARGUMENT;
        }
    uint8_t le[8] = {0};
    char why[160];
    if (pad_bytes(last, 'i', 8, le, why, sizeof(why)) != BW_OK) {
        snprintf(err, errlen, "op %d pad(%d,...): %s (a JSON Lines field's values become int64)",
                 spec->n, last->a, why);
        return BW_INVALID_ARGUMENT;
    }
    memcpy(out->pad, le, 8);
    out->ndim = 1;
    out->elem = 8;
    out->dims[0] = last->a;
    out->bytes = (size_t)last->a * 8;
    snprintf(out->descr, sizeof(out->descr), "<i8");
    return BW_OK;
}

static size_t json_ws(const uint8_t *p, size_t n, size_t i)
{
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n'))
        i++;
    return i;
}

static const char *json_type(uint8_t c)
{
    switch (c) {
    case '"':
        return "a string";
    case '{':
        return "an object";
    case '[':
        return "an array";
    case 't':
    case 'f':
        return "a boolean";
    case 'n':
        return "null";
    default:
        return (c == '-' || (c >= '0' && c <= '9')) ? "a number" : "not JSON";
    }
}

/* The integer at p[*i..n) (JSON's grammar: '-'?, digits, no fraction or exponent) as an
 * int64 into *v, *i past it; BW_OK or BW_CORRUPT with why. */
static int json_int64(const uint8_t *p, size_t n, size_t *i, size_t k, int64_t *v, char *why,
                      size_t whylen)
{
    size_t s = *i, j = s;
    bool neg = j < n && p[j] == '-';
    if (neg)
        j++;
    size_t d0 = j;
    uint64_t u = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    bool over = false;
    for (; j < n && p[j] >= '0' && p[j] <= '9'; j++) {
        unsigned dig = (unsigned)(p[j] - '0');
        if (u > (lim - dig) / 10)
            over = true;
        else
            u = u * 10 + dig;
    }
    size_t e = j; /* the whole token, for the message */
    while (e < n && p[e] != ',' && p[e] != ']' && p[e] != ' ' && p[e] != '\t' && p[e] != '\r' &&
           p[e] != '\n')
        e++;
    int shown = (int)(e - s < 40 ? e - s : 40);
    if (j == d0) {
        snprintf(why, whylen, "value %zu of the array is %s, not an integer", k,
                 s < n ? json_type(p[s]) : "missing");
        return BW_CORRUPT;
    }
    if (e != j) {
        snprintf(why, whylen, "value %zu of the array, %.*s, is not an integer", k, shown,
                 (const char *)p + s);
        return BW_CORRUPT;
    }
    if (over) {
        snprintf(why, whylen, "value %zu of the array, %.*s, is outside int64", k, shown,
                 (const char *)p + s);
        return BW_CORRUPT;
    }
    *v = neg ? (int64_t)(0 - u) : (int64_t)u;
    *i = j;
    return BW_OK;
}

int bw__tf_tokens_json_run(const bw__tf_spec *spec, const bw__tf_shape *shape, const uint8_t *v,
                           size_t n, void *out, size_t outcap, char *err, size_t errlen)
{
    size_t cap = shape->bytes / 8; /* the values that fit: the final pad's length */
    if (shape->elem != 8 || shape->bytes > outcap) {
        snprintf(err, errlen, "the result's %zu bytes do not fit in %zu", shape->bytes, outcap);
        return BW_INVALID_ARGUMENT;
    }
    size_t i = json_ws(v, n, 0);
    if (i >= n || v[i] != '[') {
        snprintf(err, errlen, "the value is %s, not an array of integers",
                 i < n ? json_type(v[i]) : "empty");
        return BW_CORRUPT;
    }
    uint8_t *o = out;
    uint64_t count = 0;
    i = json_ws(v, n, i + 1);
    if (i < n && v[i] == ']')
        i++;
    else
        for (;;) {
            int64_t x;
            int rc = json_int64(v, n, &i, (size_t)count, &x, err, errlen);
            if (rc != BW_OK)
                return rc;
            if (count < cap)
                for (int b = 0; b < 8; b++)
                    o[count * 8 + (size_t)b] = (uint8_t)((uint64_t)x >> (8 * b));
            count++;
            i = json_ws(v, n, i);
            if (i < n && v[i] == ']') {
                i++;
                break;
            }
            if (i >= n || v[i] != ',') {
                snprintf(err, errlen, "the array is not closed after value %llu",
                         (unsigned long long)count - 1);
                return BW_CORRUPT;
            }
            i = json_ws(v, n, i + 1);
        }
    if (json_ws(v, n, i) != n) {
        snprintf(err, errlen, "the value has bytes after its array");
        return BW_CORRUPT;
    }
    uint64_t keep = kept_len(spec, count);
    if (keep > cap) {
        snprintf(err, errlen,
                 "the row has %llu values, more than the %zu of the final pad, and no "
                 "truncate(L) cuts it (rows are never cut silently)",
                 (unsigned long long)count, cap);
        return BW_TOO_BIG;
    }
    for (size_t at = (size_t)keep; at < cap; at++)
        memcpy(o + at * 8, shape->pad, 8);
    return BW_OK;
}
