/* libFuzzer target: transforms (core/transform/, docs/transforms.md). The input is a spec, up
 * to the first newline, then the bytes of one image (anything). Invariants:
 *
 * - the parser accepts or refuses with a sentence; an accepted spec's canonical text parses to
 *   itself, and its output shape (when fixed) is what every run gives;
 * - an accepted spec runs on a valid JPEG and a valid PNG (made here) and succeeds, or stops at
 *   the pixel limit (BW_TOO_BIG): no op is parsed and then refused at run time; the same key
 *   gives the same bytes twice, and again after the input's own run (the scratch stays usable
 *   after a failure);
 * - the image bytes, through the spec if it was accepted and through decode|resize(7,5)
 *   otherwise, decode or are refused as corrupt or too big, with a reason, never a crash;
 *   within the small pixel limit used here (1 << 14) a decompression bomb is refused from
 *   its header.
 *
 * - the same bytes as a JSON Lines field's value (docs/transforms.md, "JSON Lines fields"):
 *   for a token spec with a fixed JSON length, an array of int64 or a refusal with a reason
 *   (never a crash or an unexplained code); for every input, as a base64 string, decoded
 *   within bw__tf_base64_cap or refused with a reason.
 *
 * Seeds: fuzz/corpus/fuzz_transform/ (written once from tests/integration/test_transform_equiv.py's
 * PNG writer and Pillow's JPEGs; each file is "SPEC\nIMAGE"; json-* hold JSON Lines values
 * written by hand). */
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "batchwire/batchwire.h"
#include "transform/transform.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_PIXELS = 1 << 14, OUTCAP = MAX_PIXELS * 3 * 4, IMG_H = 6, IMG_W = 9 };

static bw__tf_scratch *scratch;
static uint8_t *out, *again;
static uint8_t *jpeg, *png;
static size_t jpeg_len, png_len;

/* A small valid JPEG and PNG of the same pixels, made once. */
static void setup(void)
{
    uint8_t px[IMG_H * IMG_W * 3];
    for (size_t i = 0; i < sizeof(px); i++)
        px[i] = (uint8_t)(i * 41 + (i >> 2));
    tjhandle tj = tjInitCompress();
    unsigned long len = 0;
    if (!tj || tjCompress2(tj, px, IMG_W, 0, IMG_H, TJPF_RGB, &jpeg, &len, TJSAMP_420, 85, 0))
        abort();
    tjDestroy(tj);
    jpeg_len = len;
    png_image im;
    memset(&im, 0, sizeof(im));
    im.version = PNG_IMAGE_VERSION;
    im.width = IMG_W;
    im.height = IMG_H;
    im.format = PNG_FORMAT_RGB;
    if (!png_image_write_get_memory_size(im, png_len, 0, px, 0, NULL) || !(png = malloc(png_len)) ||
        !png_image_write_to_memory(&im, png, &png_len, 0, px, 0, NULL))
        abort();
    scratch = bw__tf_scratch_new(MAX_PIXELS);
    out = malloc(OUTCAP);
    again = malloc(OUTCAP);
    if (!scratch || !out || !again)
        abort();
}

/* Runs spec on a valid image: OK (twice the same bytes, the fixed shape if there is one) or
 * the pixel limit. */
static void run_valid(const bw__tf_spec *spec, const bw__tf_shape *fixed, const uint8_t *img,
                      size_t len, const bw__tf_key *key)
{
    char err[512];
    bw__tf_result res, res2;
    int rc = bw__tf_run(spec, scratch, key, img, len, out, OUTCAP, &res, err, sizeof(err));
    if (rc == BW_TOO_BIG && strstr(err, "more than the limit"))
        return;
    if (rc != BW_OK) {
        fprintf(stderr, "an accepted spec failed on a valid image: %s\n", err);
        abort();
    }
    if (fixed && memcmp(fixed->dims, res.shape.dims, sizeof(fixed->dims)) != 0)
        abort();
    if (bw__tf_run(spec, scratch, key, img, len, again, OUTCAP, &res2, err, sizeof(err)) != BW_OK ||
        res2.shape.bytes != res.shape.bytes || memcmp(out, again, res.shape.bytes) != 0)
        abort();
}

/* A token pipeline on the input as a row of int16 values (the dataset's rows being that long):
 * the result is the row cut to or padded up to its length, byte for byte. */
/* The bytes as a JSON Lines field: int64 rows of a token spec whose length is fixed. */
static void run_json_tokens(const bw__tf_spec *spec, const uint8_t *v, size_t len)
{
    char err[512] = "";
    bw__tf_shape shape;
    if (bw__tf_tokens_json_shape(spec, &shape, err, sizeof(err)) != BW_OK) {
        if (!err[0])
            abort();
        return;
    }
    if (shape.bytes > OUTCAP || strcmp(shape.descr, "<i8") != 0)
        return;
    int rc = bw__tf_tokens_json_run(spec, &shape, v, len, out, OUTCAP, err, sizeof(err));
    if (rc != BW_OK && rc != BW_CORRUPT && rc != BW_TOO_BIG)
        abort();
    if (rc != BW_OK && !err[0])
        abort();
    /* An array is accepted only if it is one: '[' first (after spaces), ']' last. */
    if (rc == BW_OK && (!memchr(v, '[', len) || !memchr(v, ']', len)))
        abort();
}

/* The bytes as a JSON string of base64: decoded within the cap, or refused with a reason. */
static void run_json_base64(const uint8_t *v, size_t len)
{
    char err[512] = "";
    size_t cap = bw__tf_base64_cap(len), n = 0;
    uint8_t *buf = malloc(cap);
    if (!buf)
        abort();
    int rc = bw__tf_json_base64(v, len, buf, &n, err, sizeof(err));
    if (rc == BW_OK ? n > cap || n > len : rc != BW_CORRUPT || !err[0])
        abort();
    free(buf);
}

static void run_tokens(const bw__tf_spec *spec, const uint8_t *row, size_t len)
{
    char err[512];
    bw__tf_shape shape;
    run_json_tokens(spec, row, len);
    uint64_t n = len / 2;
    int rc = bw__tf_tokens_shape(spec, "<i2", &n, 1, &shape, err, sizeof(err));
    if (rc != BW_OK) {
        if (!strstr(err, "pad value")) /* only a pad value out of int16's range is refused */
            abort();
        return;
    }
    if (shape.bytes > OUTCAP)
        return;
    rc = bw__tf_tokens_run(spec, &shape, row, len, out, OUTCAP, err, sizeof(err));
    if ((len % 2 != 0) != (rc != BW_OK))
        abort();
    if (rc != BW_OK)
        return;
    /* The reference: the row cut at every truncate's length, then padded (docs/transforms.md,
     * "Token arrays"). */
    size_t keep = len / 2;
    for (int k = 0; k < spec->n; k++)
        if (spec->ops[k].kind == BW_TF_TRUNCATE && keep > (size_t)spec->ops[k].a)
            keep = (size_t)spec->ops[k].a;
    keep *= 2;
    if (keep > shape.bytes)
        abort();
    if (memcmp(out, row, keep) != 0)
        abort();
    for (size_t at = keep; at < shape.bytes; at += 2)
        if (memcmp((uint8_t *)out + at, shape.pad, 2) != 0)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!scratch)
        setup();
    const uint8_t *nl = memchr(data, '\n', size);
    size_t tl = nl ? (size_t)(nl - data) : size;
    if (tl > BW_TF_SPEC_MAX + 8)
        return 0;
    char text[BW_TF_SPEC_MAX + 9], err[512];
    memcpy(text, data, tl);
    text[tl] = '\0'; /* an embedded NUL ends the spec early: also a test */
    const uint8_t *img = nl ? nl + 1 : data + size;
    size_t ilen = (size_t)(data + size - img);
    bw__tf_key key = {tl, size, ilen, 3};

    bw__tf_spec spec;
    err[0] = '\0';
    int ok = bw__tf_parse(text, &spec, err, sizeof(err)) == BW_OK;
    if (!ok && !err[0])
        abort(); /* a refusal says why */
    bw__tf_shape shape;
    const bw__tf_shape *fixed = NULL;
    if (ok) {
        char canon[BW_TF_CANON_MAX], canon2[BW_TF_CANON_MAX];
        bw__tf_spec spec2;
        if (bw__tf_format(&spec, canon, sizeof(canon)) < 0 ||
            bw__tf_parse(canon, &spec2, err, sizeof(err)) != BW_OK ||
            bw__tf_format(&spec2, canon2, sizeof(canon2)) < 0 || strcmp(canon, canon2) != 0)
            abort();
        if (bw__tf_is_tokens(&spec)) {
            run_tokens(&spec, img, ilen);
            return 0;
        }
        if (bw__tf_output_shape(&spec, &shape, err, sizeof(err)) == BW_OK)
            fixed = &shape;
        run_valid(&spec, fixed, jpeg, jpeg_len, &key);
        run_valid(&spec, fixed, png, png_len, &key);
    } else if (bw__tf_parse("decode|resize(7,5)", &spec, err, sizeof(err)) != BW_OK) {
        abort();
    }
    run_json_base64(img, ilen);
    bw__tf_result res;
    err[0] = '\0';
    int rc = bw__tf_run(&spec, scratch, &key, img, ilen, out, OUTCAP, &res, err, sizeof(err));
    if (rc == BW_OK        ? res.shape.bytes > OUTCAP
        : rc == BW_CORRUPT ? !strstr(err, "op 1: decode: ")
        : rc == BW_TOO_BIG ? !strstr(err, "more than the limit")
                           : 1)
        abort();
    /* The scratch stays usable after whatever the input did to it. */
    run_valid(&spec, ok ? fixed : NULL, jpeg, jpeg_len, &key);
    run_valid(&spec, ok ? fixed : NULL, png, png_len, &key);
    return 0;
}
