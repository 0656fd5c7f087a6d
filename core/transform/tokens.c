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
