/* Transforms (core/transform/): the spec parser's answers and errors, the canonical text, the
 * output shape, and the pipeline on edge cases (1x1 images, upscaling, crops outside the
 * image, odd sizes, grayscale and CMYK JPEGs, PNGs, corrupt input, limits, scratch reuse). The
 * comparison with Pillow and torchvision is tests/integration/test_transform_equiv.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <png.h>
#include <turbojpeg.h>

#include "batchwire/batchwire.h"
#include "jobs/job_check.h"
#include "transform/transform.h"

static char err[2048];

static void parses_to(const char *text, const char *canon)
{
    bw__tf_spec s;
    char buf[BW_TF_CANON_MAX];
    if (bw__tf_parse(text, &s, err, sizeof(err)) != BW_OK)
        fail_msg("'%s' refused: %s", text, err);
    assert_true(bw__tf_format(&s, buf, sizeof(buf)) > 0);
    assert_string_equal(buf, canon);
    /* The canonical text parses to itself. */
    bw__tf_spec again;
    char buf2[BW_TF_CANON_MAX];
    assert_int_equal(bw__tf_parse(buf, &again, err, sizeof(err)), BW_OK);
    assert_true(bw__tf_format(&again, buf2, sizeof(buf2)) > 0);
    assert_string_equal(buf, buf2);
}

static void refused(const char *text, const char *why)
{
    bw__tf_spec s;
    err[0] = '\0';
    assert_int_equal(bw__tf_parse(text, &s, err, sizeof(err)), BW_INVALID_ARGUMENT);
    if (!strstr(err, why))
        fail_msg("'%s': error '%s' does not say '%s'", text, err, why);
}

static void test_parse_valid(void **state)
{
    (void)state;
    parses_to("decode", "decode");
    parses_to(" decode | resize( 256 ) |center_crop(224)",
              "decode|resize(256)|center_crop(224,224)");
    parses_to("decode|random_resized_crop(224)|flip|normalize(0.485,0.456,0.406;0.229,0.224,"
              "0.225)|chw|cast(bfloat16)",
              "decode|random_resized_crop(224,224,0.080000000000000002,1,0.75,"
              "1.3333333333333333)|flip(0.5)|normalize(0.485000014,0.456,0.405999988;"
              "0.229000002,0.224000007,0.224999994)|chw|cast(bfloat16)");
    parses_to("decode|random_resized_crop(32,48,0.5,1)", "decode|random_resized_crop(32,48,0.5,"
                                                         "1,0.75,1.3333333333333333)");
    parses_to("decode|random_resized_crop(32,48,0.5,1,1,2)",
              "decode|random_resized_crop(32,48,0.5,1,1,2)");
    parses_to("decode|resized_crop(-3,5,30,200,24)|flip(1)|resize(7,9)",
              "decode|resized_crop(-3,5,30,200,24)|flip(1)|resize(7,9)");
    parses_to("decode|chw|normalize(0,0,0;1,1,1)", "decode|chw|normalize(0,0,0;1,1,1)");
    parses_to("decode|cast(float32)|cast(float16)", "decode|cast(float32)|cast(float16)");
    parses_to("decode|cast(uint8)", "decode|cast(uint8)");
    parses_to(" truncate( 512 ) | pad(512, -1)", "truncate(512)|pad(512,-1)");
    parses_to("pad(8,1.0)", "pad(8,1)");
    parses_to("pad(8,-0.0)", "pad(8,0)");
    parses_to("pad(8,0.25)", "pad(8,0.25)");
    parses_to("truncate(3)", "truncate(3)");
    bw__tf_spec s;
    assert_int_equal(bw__tf_parse("decode|normalize(0.1,0.2,0.3;1e-3,2,3)", &s, err, sizeof(err)),
                     BW_OK);
    /* torch.tensor([0.1]) is the float32 nearest the double 0.1 */
    assert_true(s.ops[1].mean[0] == (float)0.1 && s.ops[1].std[0] == (float)1e-3);
}

static void test_parse_errors(void **state)
{
    (void)state;
    refused("", "the spec is empty");
    refused("decode|", "op 2 is empty");
    refused("decode||resize(3)", "op 2 is empty");
    refused("resize(3)", "must start with decode");
    refused("decode|decode", "decode must be the first op");
    refused("decode|Resize(3)", "expected an op name");
    refused("decode|blur(3)", "unknown op");
    refused("decode|resize", "0 arguments given");
    refused("decode|resize()", "empty argument list");
    refused("decode|resize(1,2,3)", "3 arguments given");
    refused("decode|resize(0)", "size 0 is out of range [1, 16384]");
    refused("decode|resize(16385)", "out of range");
    refused("decode|resize(2x)", "size '2x' is not an integer");
    refused("decode|resize(3,)", "argument 2 is empty");
    refused("decode|resize(3) x", "expected NAME or NAME(ARGS)");
    refused("decode|resize(3;4)", "unexpected ';'");
    refused("decode|center_crop(-1)", "out of range");
    refused("decode|resized_crop(0,0,0,5,3)", "height 0 is out of range");
    refused("decode|resized_crop(0,0,5,5)", "4 arguments given");
    refused("decode|random_resized_crop(32,32,0,1)", "need 0 < scale_lo");
    refused("decode|random_resized_crop(32,32,0.9,0.5)", "need 0 < scale_lo <= scale_hi");
    refused("decode|random_resized_crop(32,32,0.5,1.5)", "scale_hi <= 1");
    refused("decode|random_resized_crop(32,32,0.5,1,2,1)", "need 0 < ratio_lo <= ratio_hi");
    refused("decode|random_resized_crop(32,32,0.5)", "3 arguments given");
    refused("decode|random_resized_crop(32,32,nan,1)", "not a finite decimal number");
    refused("decode|flip(1.5)", "probability 1.5 is not in [0, 1]");
    refused("decode|flip(x)", "probability 'x' is not a finite");
    refused("decode|normalize(1,2,3)", "usage normalize(M1,M2,M3;S1,S2,S3)");
    refused("decode|normalize(1,2;3,4,5,6)", "usage normalize");
    refused("decode|normalize(0,0,0;1,0,1)", "std 0 is zero");
    refused("decode|normalize(0,0,0;1,1e-50,1)", "is zero (in float32)");
    refused("decode|normalize(0,0,0;1,1,1e40)", "overflows float32");
    refused("decode|normalize(0,0,0;1,1,1)|normalize(0,0,0;1,1,1)", "takes the uint8 image");
    refused("decode|normalize(0,0,0;1,1,1)|resize(3)", "image ops work on the uint8 HWC image");
    refused("decode|chw|flip", "image ops work on the uint8 HWC image");
    refused("decode|chw|chw", "channels-first already");
    refused("decode|cast(int8)", "type 'int8' is not one of");
    refused("decode|cast(float16)|cast(float32)", "cast once");
    refused("decode|normalize(0,0,0;1,1,1)|cast(uint8)", "cast(uint8) of float32");
    refused("decode|truncate(5)", "op 2 'truncate(5)': token ops (truncate, pad) read arrays of "
                                  "numbers, not images");
    refused("truncate(5)|flip", "op 2 'flip': image ops and token ops (truncate, pad) do not mix");
    refused("truncate(5)|decode", "decode must be the first op");
    refused("pad(5,0)|truncate(5)", "op 2 'truncate(5)': truncate before pad");
    refused("truncate(5)|truncate(4)", "truncate once");
    refused("truncate(0)", "length 0 is out of range [1, 16777216]");
    refused("pad(5)", "1 argument given: usage pad(L,VALUE)");
    refused("pad(5,x)", "pad value 'x' is not a finite decimal number");
    refused("pad(5,99999999999999999999)", "pad value '99999999999999999999' is not an integer");
    refused("decode|resize(3)\x01", "not printable");
    char big[BW_TF_SPEC_MAX + 10];
    memset(big, ' ', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    refused(big, "more than 1024");
    char many[400] = "decode";
    size_t at = strlen(many);
    for (int k = 0; k < BW_TF_MAX_OPS; k++)
        at += (size_t)snprintf(many + at, sizeof(many) - at, "|flip");
    refused(many, "op 17 'flip': more than 16 ops");
    /* The op is named by position and text. */
    refused("decode|resize(3)|center_crop(0,4)", "op 3 'center_crop(0,4)': height 0");
}

/* Token arrays (docs/transforms.md, "Token arrays"): rows cut to / padded up to L, the pad
 * value in the rows' own type and byte order; what the dataset's rows must be. */
static void token_shape(const char *text, const char *descr, uint64_t n, size_t ndim, int rc,
                        const char *why, bw__tf_shape *sh)
{
    bw__tf_spec s;
    assert_int_equal(bw__tf_parse(text, &s, err, sizeof(err)), BW_OK);
    assert_true(bw__tf_is_tokens(&s));
    err[0] = '\0';
    assert_int_equal(bw__tf_tokens_shape(&s, descr, &n, ndim, sh, err, sizeof(err)), rc);
    if (why && !strstr(err, why))
        fail_msg("'%s' on %s: error '%s' does not say '%s'", text, descr, err, why);
}

static void test_tokens(void **state)
{
    (void)state;
    bw__tf_shape sh;
    bw__tf_spec s;
    uint8_t out[64];
    /* int32 rows of 5: truncate(3) keeps 3, pad(8,-2) appends three -2, both make L */
    const int32_t row[5] = {10, -20, 30, 40, 50};
    token_shape("truncate(3)|pad(3,-2)", "<i4", 5, 1, BW_OK, NULL, &sh);
    assert_int_equal(sh.ndim, 1);
    assert_int_equal(sh.dims[0], 3);
    assert_int_equal(sh.bytes, 12);
    assert_string_equal(sh.descr, "<i4");
    assert_int_equal(bw__tf_parse("truncate(3)|pad(3,-2)", &s, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__tf_tokens_run(&s, &sh, (const uint8_t *)row, sizeof(row), out, sizeof(out),
                                       err, sizeof(err)),
                     BW_OK);
    assert_memory_equal(out, row, 12);
    token_shape("pad(8,-2)", "<i4", 5, 1, BW_OK, NULL, &sh);
    assert_int_equal(sh.dims[0], 8);
    assert_int_equal(bw__tf_parse("pad(8,-2)", &s, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__tf_tokens_run(&s, &sh, (const uint8_t *)row, sizeof(row), out, sizeof(out),
                                       err, sizeof(err)),
                     BW_OK);
    const int32_t want[8] = {10, -20, 30, 40, 50, -2, -2, -2};
    assert_memory_equal(out, want, sizeof(want));
    /* truncate shorter than pad: the first 3 values, then the pad value up to 6 */
    token_shape("truncate(3)|pad(6,-2)", "<i4", 5, 1, BW_OK, NULL, &sh);
    assert_int_equal(sh.dims[0], 6);
    assert_int_equal(bw__tf_parse("truncate(3)|pad(6,-2)", &s, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__tf_tokens_run(&s, &sh, (const uint8_t *)row, sizeof(row), out, sizeof(out),
                                       err, sizeof(err)),
                     BW_OK);
    const int32_t cut_pad[6] = {10, -20, 30, -2, -2, -2};
    assert_memory_equal(out, cut_pad, sizeof(cut_pad));
    /* truncate longer than the row and pad shorter: the row as it is */
    token_shape("truncate(9)", "<i4", 5, 1, BW_OK, NULL, &sh);
    assert_int_equal(sh.dims[0], 5);
    token_shape("pad(2,0)", "<i4", 5, 1, BW_OK, NULL, &sh);
    assert_int_equal(sh.dims[0], 5);
    /* big-endian uint16: the pad value's bytes in that order */
    token_shape("pad(4,258)", ">u2", 2, 1, BW_OK, NULL, &sh);
    assert_memory_equal(sh.pad, ((uint8_t[]){1, 2}), 2);
    token_shape("pad(4,0.5)", "<f4", 2, 1, BW_OK, NULL, &sh);
    float half = 0.5f;
    assert_memory_equal(sh.pad, &half, 4);
    /* refusals: the pad value out of the type, not an integer, rows not 1-D, not numbers */
    token_shape("pad(4,256)", "|u1", 2, 1, BW_INVALID_ARGUMENT, "out of the range of uint8", &sh);
    token_shape("pad(4,-1)", "<u4", 2, 1, BW_INVALID_ARGUMENT, "out of the range of uint32", &sh);
    token_shape("pad(4,-129)", "|i1", 2, 1, BW_INVALID_ARGUMENT, "out of the range of int8", &sh);
    token_shape("pad(4,127)", "|i1", 2, 1, BW_OK, NULL, &sh);
    token_shape("pad(4,0.5)", "<i8", 2, 1, BW_INVALID_ARGUMENT, "not an integer", &sh);
    token_shape("pad(4,1e39)", "<f4", 2, 1, BW_INVALID_ARGUMENT, "overflows float32", &sh);
    token_shape("truncate(4)", "<f2", 2, 1, BW_INVALID_ARGUMENT, "integers, float32 or float64",
                &sh);
    token_shape("truncate(4)", "|b1", 2, 1, BW_INVALID_ARGUMENT, "the dataset's samples are |b1",
                &sh);
    token_shape("truncate(4)", "", 2, 1, BW_INVALID_ARGUMENT, "not arrays", &sh);
    token_shape("truncate(4)", "<i4", 2, 2, BW_INVALID_ARGUMENT, "have 2 dimensions", &sh);
    token_shape("truncate(4)", "<i4", 2, 0, BW_INVALID_ARGUMENT, "have 0 dimensions", &sh);
    /* a row that is not whole values, or of another length than the job's rows */
    token_shape("truncate(3)", "<i4", 5, 1, BW_OK, NULL, &sh);
    assert_int_equal(bw__tf_parse("truncate(3)", &s, err, sizeof(err)), BW_OK);
    assert_int_equal(
        bw__tf_tokens_run(&s, &sh, (const uint8_t *)row, 7, out, sizeof(out), err, sizeof(err)),
        BW_CORRUPT);
    assert_non_null(strstr(err, "not a whole number of 4-byte values"));
    assert_int_equal(
        bw__tf_tokens_run(&s, &sh, (const uint8_t *)row, 8, out, sizeof(out), err, sizeof(err)),
        BW_CORRUPT);
    assert_non_null(strstr(err, "make 2, not the job's 3"));
    /* an image pipeline is not a token one, and bw__tf_output_shape sends token ones here */
    assert_int_equal(bw__tf_output_shape(&s, &sh, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "come from the dataset's samples"));
}

/* Token ops on a JSON Lines field: json_shape's fixed-length rule, its int64 rows. */
static int json_row(const char *spec, const char *value, int64_t *out, size_t cap)
{
    bw__tf_spec s;
    bw__tf_shape sh;
    assert_int_equal(bw__tf_parse(spec, &s, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__tf_tokens_json_shape(&s, &sh, err, sizeof(err)), BW_OK);
    assert_string_equal(sh.descr, "<i8");
    assert_true(sh.bytes <= cap * 8);
    err[0] = '\0';
    return bw__tf_tokens_json_run(&s, &sh, (const uint8_t *)value, strlen(value), out, cap * 8, err,
                                  sizeof(err));
}

static void json_shape_refused(const char *spec, const char *why)
{
    bw__tf_spec s;
    bw__tf_shape sh;
    assert_int_equal(bw__tf_parse(spec, &s, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__tf_tokens_json_shape(&s, &sh, err, sizeof(err)), BW_INVALID_ARGUMENT);
    if (!strstr(err, why))
        fail_msg("'%s': error '%s' does not say '%s'", spec, err, why);
}

static void test_json_tokens(void **state)
{
    (void)state;
    int64_t out[8];
    assert_int_equal(json_row("truncate(3)|pad(5,-2)",
                              " [ 7, -9223372036854775808,"
                              "9223372036854775807, 4 ] ",
                              out, 8),
                     BW_OK);
    const int64_t cut[5] = {7, INT64_MIN, INT64_MAX, -2, -2};
    assert_memory_equal(out, cut, sizeof(cut));
    assert_int_equal(json_row("pad(4,9)", "[]", out, 8), BW_OK);
    const int64_t empty[4] = {9, 9, 9, 9};
    assert_memory_equal(out, empty, sizeof(empty));
    assert_int_equal(json_row("pad(2,0)", "[1,2]", out, 8), BW_OK);
    /* a row longer than the pad, not cut by a truncate: refused, never cut */
    assert_int_equal(json_row("pad(2,0)", "[1,2,3]", out, 8), BW_TOO_BIG);
    assert_non_null(strstr(err, "the row has 3 values, more than the 2 of the final pad"));
    assert_int_equal(json_row("pad(4,0)", "[1,2.0]", out, 8), BW_CORRUPT);
    assert_non_null(strstr(err, "value 1 of the array, 2.0, is not an integer"));
    assert_int_equal(json_row("pad(4,0)", "[1e3]", out, 8), BW_CORRUPT);
    assert_non_null(strstr(err, "1e3, is not an integer"));
    assert_int_equal(json_row("pad(4,0)", "[-9223372036854775809]", out, 8), BW_CORRUPT);
    assert_non_null(strstr(err, "outside int64"));
    assert_int_equal(json_row("pad(4,0)", "[1,\"2\"]", out, 8), BW_CORRUPT);
    assert_non_null(strstr(err, "value 1 of the array is a string, not an integer"));
    assert_int_equal(json_row("pad(4,0)", "{\"a\":1}", out, 8), BW_CORRUPT);
    assert_non_null(strstr(err, "the value is an object, not an array of integers"));
    assert_int_equal(json_row("pad(4,0)", "[1,2", out, 8), BW_CORRUPT);
    assert_non_null(strstr(err, "not closed"));
    assert_int_equal(json_row("pad(4,0)", "[1,]", out, 8), BW_CORRUPT);
    assert_int_equal(json_row("pad(4,0)", "[-]", out, 8), BW_CORRUPT);
    /* the output length must be fixed: a final pad, nothing longer before it, an int64 value */
    json_shape_refused("truncate(8)", "must end with pad(L,VALUE)");
    json_shape_refused("truncate(9)|pad(8,0)", "op 1 truncate(9): longer than the final pad");
    json_shape_refused("pad(8,0.5)", "not an integer");
}

static void test_json_base64(void **state)
{
    (void)state;
    uint8_t out[16];
    size_t n = 0;
    const struct {
        const char *v, *want;
    } ok[] = {{"\"\"", ""},           {"\"Zg==\"", "f"},        {"\"Zm8=\"", "fo"},
              {"\"Zm9v\"", "foo"},    {"\"Zm9vYg==\"", "foob"}, {" \"Zm9vYmE=\" ", "fooba"},
              {"\"P\\/8=\"", "?\xff"}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        size_t len = strlen(ok[i].v);
        assert_true(bw__tf_base64_cap(len) <= sizeof(out));
        assert_int_equal(
            bw__tf_json_base64((const uint8_t *)ok[i].v, len, out, &n, err, sizeof(err)), BW_OK);
        assert_int_equal(n, strlen(ok[i].want));
        assert_memory_equal(out, ok[i].want, n);
    }
    /* Round trips of every length 0..80, with "\/" for some '/' (the whole quanta decoded at
     * once, then one character at a time after an escape, then at once again). */
    const char *al = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    uint8_t raw[80], dec[128];
    char enc[256];
    for (size_t len = 0; len <= sizeof(raw); len++) {
        size_t e = 0;
        enc[e++] = '"';
        for (size_t k = 0; k < len; k++)
            raw[k] = (uint8_t)(k * 37 + len * 11 + (k >> 1));
        for (size_t k = 0; k < len; k += 3) {
            uint32_t q = (uint32_t)raw[k] << 16 | (k + 1 < len ? (uint32_t)raw[k + 1] << 8 : 0) |
                         (k + 2 < len ? raw[k + 2] : 0);
            for (int j = 0; j < 4; j++) {
                char c = j <= (int)(len - k) && (j < 2 || k + (size_t)j - 1 < len)
                             ? al[(q >> (18 - 6 * j)) & 63]
                             : '=';
                if (c == '/' && (k + (size_t)j) % 2)
                    enc[e++] = '\\';
                enc[e++] = c;
            }
        }
        enc[e++] = '"';
        assert_true(bw__tf_base64_cap(e) <= sizeof(dec));
        assert_int_equal(bw__tf_json_base64((const uint8_t *)enc, e, dec, &n, err, sizeof(err)),
                         BW_OK);
        assert_int_equal(n, len);
        assert_memory_equal(dec, raw, len);
    }
    const struct {
        const char *v, *why;
    } bad[] = {{"\"Zm9\"", "3 characters, not a multiple of 4"},
               {"\"Zg\"", "not a multiple of 4"},
               {"\"Z===\"", "more than two '='"},
               {"\"Zg=a\"", "comes after its '=' padding"},
               {"\"Zm 9v\"", "character 2 of the string (' ') is not in the base64 alphabet"},
               {"\"Zm-v\"", "('-') is not in the base64 alphabet"},
               {"\"Zm\\n9v\"", "an escape"},
               {"\"Zm9v", "not closed"},
               {"\"Zm9v\" x", "bytes after its string"},
               {"42", "the value is a number, not a string of base64"},
               {"null", "the value is null"},
               {"", "the value is empty"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(bw__tf_json_base64((const uint8_t *)bad[i].v, strlen(bad[i].v), out, &n,
                                            err, sizeof(err)),
                         BW_CORRUPT);
        if (!strstr(err, bad[i].why))
            fail_msg("base64 %s: error '%s' does not say '%s'", bad[i].v, err, bad[i].why);
    }
}

/* Where a transform may run (the client and the coordinator's rule): jsonl needs a field,
 * token ops on one need a fixed length. */
static void test_job_check_jsonl(void **state)
{
    (void)state;
    char canon[BW_TF_CANON_MAX];
    const char *img = "decode|center_crop(8)";
    assert_int_equal(bw__job_check_transform(img, "image", "jsonl", false, canon, sizeof(canon),
                                             err, sizeof(err)),
                     BW_OK);
    assert_int_equal(bw__job_check_transform("truncate(4)|pad(8,-1)", "ids", "jsonl", false, canon,
                                             sizeof(canon), err, sizeof(err)),
                     BW_OK);
    assert_string_equal(canon, "truncate(4)|pad(8,-1)");
    assert_int_equal(
        bw__job_check_transform(img, NULL, "jsonl", false, canon, sizeof(canon), err, sizeof(err)),
        BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "give transform_field, the key"));
    assert_int_equal(bw__job_check_transform("truncate(4)", "ids", "jsonl", false, canon,
                                             sizeof(canon), err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "on jsonl field 'ids': the rows of a JSON Lines field"));
    assert_int_equal(bw__job_check_transform("pad(4,0)", "ids", "npy", false, canon, sizeof(canon),
                                             err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_int_equal(bw__job_check_transform(img, "image", "files", false, canon, sizeof(canon),
                                             err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_int_equal(bw__job_check_transform(img, "image", "jsonl", true, canon, sizeof(canon), err,
                                             sizeof(err)),
                     BW_INVALID_ARGUMENT);
    /* the coordinator's check of a job (bw__job_check_data): the jsonl dataset has no dtype,
     * which must not send a field's token ops to the npy rows' check */
    Batchwire__V1__Dataset ds = BATCHWIRE__V1__DATASET__INIT;
    ds.format = "jsonl";
    Batchwire__V1__SamplerConfig smp = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    smp.batch_size = 4;
    Batchwire__V1__JobConfig cfg = BATCHWIRE__V1__JOB_CONFIG__INIT;
    cfg.dataset = &ds;
    cfg.sampler = &smp;
    cfg.transform = "truncate(4)|pad(8,-1)";
    cfg.transform_field = "ids";
    Batchwire__V1__SampleLayout lay = BATCHWIRE__V1__SAMPLE_LAYOUT__INIT;
    Batchwire__V1__DatasetInfo info = BATCHWIRE__V1__DATASET_INFO__INIT;
    info.format = "jsonl";
    info.layout = &lay;
    info.n_sources = 1;
    assert_int_equal(bw__job_check_data(&cfg, &info, 1, err, sizeof(err)), BW_OK);
    cfg.transform = "truncate(4)";
    assert_int_equal(bw__job_check_data(&cfg, &info, 1, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "must end with pad(L,VALUE)"));
}

static void test_output_shape(void **state)
{
    (void)state;
    bw__tf_spec s;
    bw__tf_shape sh;
    assert_int_equal(bw__tf_parse("decode|random_resized_crop(224)|flip|normalize(0,0,0;1,1,1)|"
                                  "chw|cast(float16)",
                                  &s, err, sizeof(err)),
                     BW_OK);
    assert_int_equal(bw__tf_output_shape(&s, &sh, err, sizeof(err)), BW_OK);
    assert_int_equal(sh.dtype, BW_TF_FLOAT16);
    assert_int_equal(sh.chw, 1);
    assert_int_equal(sh.dims[0], 3);
    assert_int_equal(sh.dims[1], 224);
    assert_int_equal(sh.dims[2], 224);
    assert_int_equal(sh.bytes, 3 * 224 * 224 * 2);
    assert_int_equal(bw__tf_parse("decode|center_crop(10,20)|resize(5)", &s, err, sizeof(err)),
                     BW_OK);
    assert_int_equal(bw__tf_output_shape(&s, &sh, err, sizeof(err)), BW_OK);
    assert_int_equal(sh.dims[0], 5);
    assert_int_equal(sh.dims[1], 10);
    assert_int_equal(sh.dims[2], 3);
    assert_int_equal(bw__tf_parse("decode|resized_crop(0,0,30,20,10)", &s, err, sizeof(err)),
                     BW_OK);
    assert_int_equal(bw__tf_output_shape(&s, &sh, err, sizeof(err)), BW_OK);
    assert_int_equal(sh.dims[0], 15); /* int(10 * 30 / 20) */
    assert_int_equal(sh.dims[1], 10);
    assert_int_equal(bw__tf_parse("decode|resize(256)|flip", &s, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__tf_output_shape(&s, &sh, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "the output size depends on each image"));
}

/* ---- the pipeline ---- */

static uint8_t *encode(const uint8_t *px, int h, int w, int pf, int sub, int q, unsigned long *len)
{
    tjhandle tj = tjInitCompress();
    uint8_t *out = NULL;
    *len = 0;
    assert_int_equal(tjCompress2(tj, px, w, 0, h, pf, &out, len, sub, q, 0), 0);
    tjDestroy(tj);
    return out;
}

typedef struct run_out {
    int rc;
    bw__tf_result res;
    uint8_t *data;
} run_out;

static run_out run(bw__tf_scratch *s, const char *spec, const uint8_t *jpg, size_t len,
                   uint64_t index)
{
    bw__tf_spec sp;
    if (bw__tf_parse(spec, &sp, err, sizeof(err)) != BW_OK)
        fail_msg("%s: %s", spec, err);
    run_out o;
    static uint8_t buf[4 << 20];
    bw__tf_key key = {7, 1, 2, index};
    o.data = buf;
    o.rc = bw__tf_run(&sp, s, &key, jpg, len, buf, sizeof(buf), &o.res, err, sizeof(err));
    return o;
}

static void test_one_pixel_and_upscale(void **state)
{
    (void)state;
    bw__tf_scratch *s = bw__tf_scratch_new(0);
    assert_non_null(s);
    const uint8_t px[3] = {200, 30, 90};
    unsigned long len;
    uint8_t *jpg = encode(px, 1, 1, TJPF_RGB, TJSAMP_444, 100, &len);
    run_out o = run(s, "decode", jpg, len, 0);
    assert_int_equal(o.rc, BW_OK);
    assert_int_equal(o.res.shape.bytes, 3);
    uint8_t one[3];
    memcpy(one, o.data, 3);
    /* Upscaling a constant image keeps it constant, whatever the sizes. */
    o = run(s, "decode|resize(37,5)", jpg, len, 0);
    assert_int_equal(o.rc, BW_OK);
    assert_int_equal(o.res.shape.dims[0], 37);
    assert_int_equal(o.res.shape.dims[1], 5);
    for (int i = 0; i < 37 * 5 * 3; i++)
        assert_int_equal(o.data[i], one[i % 3]);
    /* random_resized_crop of a 1x1 image: the whole pixel. */
    o = run(s, "decode|random_resized_crop(4,6)", jpg, len, 3);
    assert_int_equal(o.rc, BW_OK);
    assert_int_equal(o.res.ndraws, 1);
    assert_int_equal(o.res.draws[0].box[2], 1);
    assert_int_equal(o.res.draws[0].box[3], 1);
    for (int i = 0; i < 4 * 6 * 3; i++)
        assert_int_equal(o.data[i], one[i % 3]);
    /* center_crop larger than the image: the pixel in the middle, zeros around it
     * (torchvision pads (3 - 1) // 2 = 1 before). */
    o = run(s, "decode|center_crop(3,4)", jpg, len, 0);
    assert_int_equal(o.rc, BW_OK);
    for (int y = 0; y < 3; y++)
        for (int x = 0; x < 4; x++)
            for (int c = 0; c < 3; c++)
                assert_int_equal(o.data[(y * 4 + x) * 3 + c], y == 1 && x == 1 ? one[c] : 0);
    tjFree(jpg);
    bw__tf_scratch_free(s);
}

static void test_crop_outside_and_odd_sizes(void **state)
{
    (void)state;
    enum { H = 13, W = 7 };
    uint8_t px[H * W * 3];
    for (int i = 0; i < H * W * 3; i++)
        px[i] = (uint8_t)(i * 37 + 11);
    unsigned long len;
    uint8_t *jpg = encode(px, H, W, TJPF_RGB, TJSAMP_420, 90, &len);
    bw__tf_scratch *s = bw__tf_scratch_new(0);
    run_out o = run(s, "decode", jpg, len, 0);
    assert_int_equal(o.rc, BW_OK);
    static uint8_t img[H * W * 3];
    memcpy(img, o.data, sizeof(img));
    /* A box entirely outside: zeros. */
    o = run(s, "decode|resized_crop(100,100,5,5,5,5)", jpg, len, 0);
    assert_int_equal(o.rc, BW_OK);
    for (int i = 0; i < 5 * 5 * 3; i++)
        assert_int_equal(o.data[i], 0);
    /* A box over the top-left corner: zeros, then the image. */
    o = run(s, "decode|resized_crop(-2,-3,4,5,4,5)", jpg, len, 0);
    assert_int_equal(o.rc, BW_OK);
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 5; x++)
            for (int c = 0; c < 3; c++) {
                int sy = y - 2, sx = x - 3;
                int want = sy >= 0 && sx >= 0 ? img[(sy * W + sx) * 3 + c] : 0;
                assert_int_equal(o.data[(y * 5 + x) * 3 + c], want);
            }
    /* center_crop with odd differences: Python's round((13 - 4) / 2) = round(4.5) = 4,
     * round((7 - 2) / 2) = round(2.5) = 2 (halves to even). */
    o = run(s, "decode|center_crop(4,2)", jpg, len, 0);
    assert_int_equal(o.rc, BW_OK);
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 2; x++)
            for (int c = 0; c < 3; c++)
                assert_int_equal(o.data[(y * 2 + x) * 3 + c], img[((y + 4) * W + x + 2) * 3 + c]);
    int64_t top, left;
    bw__tf_center_box(13, 8, 2, 3, &top, &left); /* 5.5 -> 6, 2.5 -> 2 */
    assert_int_equal(top, 6);
    assert_int_equal(left, 2);
    bw__tf_center_box(4, 4, 7, 9, &top, &left); /* padded: (7-4)//2, (9-4)//2 before */
    assert_int_equal(top, -1);
    assert_int_equal(left, -2);
    /* flip twice is the identity; flip(1) mirrors rows. */
    o = run(s, "decode|flip(1)", jpg, len, 0);
    assert_int_equal(o.rc, BW_OK);
    assert_int_equal(o.res.draws[0].flipped, 1);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                assert_int_equal(o.data[(y * W + x) * 3 + c], img[(y * W + (W - 1 - x)) * 3 + c]);
    o = run(s, "decode|flip(1)|flip(1)", jpg, len, 0);
    assert_memory_equal(o.data, img, sizeof(img));
    /* chw moves channels first. */
    o = run(s, "decode|chw", jpg, len, 0);
    assert_int_equal(o.res.shape.dims[0], 3);
    for (int i = 0; i < H * W; i++)
        for (int c = 0; c < 3; c++)
            assert_int_equal(o.data[c * H * W + i], img[i * 3 + c]);
    /* Shorter side: 7 -> 3, 13 -> int(3 * 13 / 7) = 5. */
    o = run(s, "decode|resize(3)", jpg, len, 0);
    assert_int_equal(o.res.shape.dims[0], 5);
    assert_int_equal(o.res.shape.dims[1], 3);
    tjFree(jpg);
    bw__tf_scratch_free(s);
}

static void test_gray_and_cmyk(void **state)
{
    (void)state;
    enum { H = 9, W = 11 };
    uint8_t gray[H * W], cmyk[H * W * 4];
    for (int i = 0; i < H * W; i++)
        gray[i] = (uint8_t)(i * 23);
    for (int i = 0; i < H * W * 4; i++)
        cmyk[i] = (uint8_t)(i * 29 + 5);
    unsigned long len;
    bw__tf_scratch *s = bw__tf_scratch_new(0);
    uint8_t *jpg = encode(gray, H, W, TJPF_GRAY, TJSAMP_GRAY, 95, &len);
    /* What TurboJPEG decodes the gray JPEG to, replicated into R, G and B. */
    tjhandle tj = tjInitDecompress();
    uint8_t g[H * W], k4[H * W * 4];
    assert_int_equal(tjDecompress2(tj, jpg, len, g, W, 0, H, TJPF_GRAY, 0), 0);
    run_out o = run(s, "decode", jpg, len, 0);
    assert_int_equal(o.rc, BW_OK);
    for (int i = 0; i < H * W * 3; i++)
        assert_int_equal(o.data[i], g[i / 3]);
    tjFree(jpg);
    jpg = encode(cmyk, H, W, TJPF_CMYK, TJSAMP_444, 95, &len);
    assert_int_equal(tjDecompress2(tj, jpg, len, k4, W, 0, H, TJPF_CMYK, 0), 0);
    o = run(s, "decode", jpg, len, 0);
    assert_int_equal(o.rc, BW_OK);
    /* Pillow's reading: inverted CMYK, then R = (255 - K) - C * (255 - K) / 255 rounded as
     * Pillow's MULDIV255; written here in floating point with its rounding instead. */
    for (int i = 0; i < H * W; i++)
        for (int c = 0; c < 3; c++) {
            int C = 255 - k4[i * 4 + c], nk = k4[i * 4 + 3];
            int t = C * nk + 128;
            int want = nk - (t + (t >> 8)) / 256;
            assert_int_equal(o.data[i * 3 + c], want);
            double exact = nk - C * nk / 255.0;
            assert_true(o.data[i * 3 + c] >= exact - 1 && o.data[i * 3 + c] <= exact + 1);
        }
    tjFree(jpg);
    tjDestroy(tj);
    bw__tf_scratch_free(s);
}

/* A PNG of px (h x w, format one of libpng's simplified PNG_FORMAT_*), written by libpng. */
static uint8_t *encode_png(const uint8_t *px, int h, int w, uint32_t format, size_t *len)
{
    png_image im;
    memset(&im, 0, sizeof(im));
    im.version = PNG_IMAGE_VERSION;
    im.width = (uint32_t)w;
    im.height = (uint32_t)h;
    im.format = format;
    assert_true(png_image_write_get_memory_size(im, *len, 0, px, 0, NULL));
    uint8_t *out = malloc(*len);
    assert_non_null(out);
    assert_true(png_image_write_to_memory(&im, out, len, 0, px, 0, NULL));
    return out;
}

static void test_png(void **state)
{
    (void)state;
    enum { H = 13, W = 21 };
    uint8_t rgba[H * W * 4];
    for (int i = 0; i < H * W * 4; i++)
        rgba[i] = (uint8_t)(i * 37 + (i >> 3));
    bw__tf_scratch *s = bw__tf_scratch_new(0);
    size_t len;
    /* RGB: lossless, the same pixels; RGBA: the alpha dropped (never composited); gray:
     * replicated into R, G and B. */
    uint8_t *png = encode_png(rgba, H, W * 4 / 3, PNG_FORMAT_RGB, &len);
    run_out o = run(s, "decode", png, len, 0);
    assert_int_equal(o.rc, BW_OK);
    assert_int_equal(o.res.shape.dims[0], H);
    assert_int_equal(o.res.shape.dims[1], W * 4 / 3);
    assert_memory_equal(o.data, rgba, (size_t)H * (W * 4 / 3) * 3);
    free(png);
    png = encode_png(rgba, H, W, PNG_FORMAT_RGBA, &len);
    o = run(s, "decode|flip(1)", png, len, 0);
    assert_int_equal(o.rc, BW_OK);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                assert_int_equal(o.data[(y * W + x) * 3 + c], rgba[(y * W + W - 1 - x) * 4 + c]);
    free(png);
    png = encode_png(rgba, H, W, PNG_FORMAT_GRAY, &len);
    o = run(s, "decode", png, len, 0);
    assert_int_equal(o.rc, BW_OK);
    for (int i = 0; i < H * W * 3; i++)
        assert_int_equal(o.data[i], rgba[i / 3]);
    /* Damaged: cut short, a chunk's CRC wrong, the pixel limit. Each names op, format and
     * reason; the scratch decodes the whole file again afterwards. */
    o = run(s, "decode", png, len - 20, 0);
    assert_int_equal(o.rc, BW_CORRUPT);
    assert_non_null(strstr(err, "op 1: decode: corrupt PNG"));
    png[8 + 8 + 13] ^= 1; /* IHDR's CRC */
    o = run(s, "decode", png, len, 0);
    assert_int_equal(o.rc, BW_CORRUPT);
    assert_non_null(strstr(err, "IHDR: CRC error"));
    png[8 + 8 + 13] ^= 1;
    o = run(s, "decode|resize(4)", png, 8, 0); /* the signature alone */
    assert_int_equal(o.rc, BW_CORRUPT);
    assert_non_null(strstr(err, "corrupt PNG (8 bytes): the file ends early"));
    bw__tf_scratch *small = bw__tf_scratch_new(H * W - 1);
    o = run(small, "decode", png, len, 0);
    assert_int_equal(o.rc, BW_TOO_BIG);
    assert_non_null(
        strstr(err, "op 1: decode: the PNG is 21x13 pixels, more than the limit of 272"));
    bw__tf_scratch_free(small);
    o = run(s, "decode", png, len, 0);
    assert_int_equal(o.rc, BW_OK);
    free(png);
    bw__tf_scratch_free(s);
}

static void test_errors_and_limits(void **state)
{
    (void)state;
    enum { H = 40, W = 50 };
    static uint8_t px[H * W * 3];
    for (int i = 0; i < H * W * 3; i++)
        px[i] = (uint8_t)(i ^ (i >> 5));
    unsigned long len;
    uint8_t *jpg = encode(px, H, W, TJPF_RGB, TJSAMP_420, 80, &len);
    bw__tf_scratch *s = bw__tf_scratch_new(H * W - 1);
    run_out o = run(s, "decode", jpg, len, 0);
    assert_int_equal(o.rc, BW_TOO_BIG);
    assert_non_null(strstr(err, "50x40 pixels, more than the limit of 1999"));
    bw__tf_scratch_free(s);
    s = bw__tf_scratch_new(0);
    o = run(s, "decode", jpg, len / 2, 0);
    assert_int_equal(o.rc, BW_CORRUPT);
    assert_non_null(strstr(err, "op 1: decode: corrupt JPEG (50x40): Premature end"));
    o = run(s, "decode", jpg + 2, len - 2, 0);
    assert_int_equal(o.rc, BW_CORRUPT);
    assert_non_null(strstr(err, "not a JPEG"));
    uint8_t bad[64];
    memcpy(bad, jpg, sizeof(bad));
    memset(bad + 2, 0xee, sizeof(bad) - 2);
    o = run(s, "decode", bad, sizeof(bad), 0);
    assert_int_equal(o.rc, BW_CORRUPT);
    assert_non_null(strstr(err, "corrupt JPEG header"));
    /* A file that ends inside its header, then the whole file on the same scratch: TurboJPEG
     * left the failed decompressor reading every later header as 0x0 (fuzz_transform found
     * it), so run.c starts a fresh one after a failure. */
    o = run(s, "decode", jpg, 200, 0);
    assert_int_equal(o.rc, BW_CORRUPT);
    assert_non_null(strstr(err, "op 1: decode: corrupt JPEG header"));
    o = run(s, "decode", jpg, len, 0);
    if (o.rc != BW_OK)
        fail_msg("the JPEG after a truncated header: %s", err);
    assert_memory_equal(o.res.shape.dims, ((int[]){H, W, 3}), sizeof(o.res.shape.dims));
    /* A result larger than the caller's buffer. */
    bw__tf_spec sp;
    bw__tf_result res;
    uint8_t small[100];
    bw__tf_key key = {0, 0, 0, 0};
    assert_int_equal(bw__tf_parse("decode|resize(10,10)", &sp, err, sizeof(err)), BW_OK);
    assert_int_equal(
        bw__tf_run(&sp, s, &key, jpg, len, small, sizeof(small), &res, err, sizeof(err)),
        BW_TOO_BIG);
    assert_non_null(strstr(err, "is 300 bytes, more than the 100 of the output buffer"));
    /* A spec that did not come from the parser. */
    bw__tf_spec empty;
    memset(&empty, 0, sizeof(empty));
    assert_int_equal(
        bw__tf_run(&empty, s, &key, jpg, len, small, sizeof(small), &res, err, sizeof(err)),
        BW_INVALID_ARGUMENT);
    /* A crop beyond the pixel limit. */
    bw__tf_scratch_free(s);
    s = bw__tf_scratch_new(H * W);
    o = run(s, "decode|resized_crop(0,0,1000,1000,2,2)", jpg, len, 0);
    assert_int_equal(o.rc, BW_TOO_BIG);
    assert_non_null(strstr(err, "op 2 (resized_crop): 1000x1000 pixels is more than the limit"));
    /* The scratch stays usable after errors, and once warm does not grow. */
    o = run(s, "decode|random_resized_crop(16)|flip|normalize(0,0,0;1,1,1)|chw", jpg, len, 1);
    assert_int_equal(o.rc, BW_OK);
    size_t warm = bw__tf_scratch_bytes(s);
    for (uint64_t i = 2; i < 50; i++) {
        o = run(s, "decode|random_resized_crop(16)|flip|normalize(0,0,0;1,1,1)|chw", jpg, len, i);
        assert_int_equal(o.rc, BW_OK);
    }
    assert_true(bw__tf_scratch_bytes(s) <= warm + 2 * (H * W * 3 + 4096));
    tjFree(jpg);
    bw__tf_scratch_free(s);
    bw__tf_scratch_free(NULL);
}

static void test_rng(void **state)
{
    (void)state;
    bw__tf_key k = {1, 2, 3, 4};
    bw__tf_rng a, b;
    bw__tf_rng_init(&a, &k, 0);
    bw__tf_rng_init(&b, &k, 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(bw__tf_rng_next(&a), bw__tf_rng_next(&b));
    bw__tf_rng_init(&b, &k, 1);
    bw__tf_rng_init(&a, &k, 0);
    assert_int_not_equal(bw__tf_rng_next(&a), bw__tf_rng_next(&b));
    int hist[7] = {0};
    for (int i = 0; i < 7000; i++) {
        double u = bw__tf_rng_uniform(&a);
        assert_true(u >= 0 && u < 1);
        hist[bw__tf_rng_below(&a, 7)]++;
        assert_int_equal(bw__tf_rng_below(&a, 1), 0);
    }
    for (int i = 0; i < 7; i++)
        assert_true(hist[i] > 800 && hist[i] < 1200);
    /* Ten misses on a 1 x 1000 strip (any area of the range needs a taller crop): the
     * fallback's central crop of the widest allowed ratio, 4/3 of the height: round(1.33). */
    double scale[2] = {0.08, 1}, ratio[2] = {0.75, 4.0 / 3.0};
    int64_t box[4];
    bw__tf_rng_init(&a, &k, 0);
    bw__tf_rrc_params(&a, 1, 1000, scale, ratio, box);
    assert_int_equal(box[0], 0);
    assert_int_equal(box[2], 1);
    assert_int_equal(box[3], 1);
    assert_int_equal(box[1], 499);
    /* A 1000 x 1 strip: the fallback's tallest crop, round(1 / 0.75) = 1 row. */
    bw__tf_rrc_params(&a, 1000, 1, scale, ratio, box);
    assert_int_equal(box[2], 1);
    assert_int_equal(box[0], 499);
    /* Inside the image, always. */
    for (uint64_t i = 0; i < 2000; i++) {
        k.index = i;
        bw__tf_rng_init(&a, &k, 3);
        int h = 1 + (int)(i % 97), w = 1 + (int)(i * 7 % 113);
        bw__tf_rrc_params(&a, h, w, scale, ratio, box);
        assert_true(box[0] >= 0 && box[1] >= 0 && box[2] >= 1 && box[3] >= 1);
        assert_true(box[0] + box[2] <= h && box[1] + box[3] <= w);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_output_shape),
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_json_tokens),
        cmocka_unit_test(test_json_base64),
        cmocka_unit_test(test_job_check_jsonl),
        cmocka_unit_test(test_one_pixel_and_upscale),
        cmocka_unit_test(test_crop_outside_and_odd_sizes),
        cmocka_unit_test(test_gray_and_cmyk),
        cmocka_unit_test(test_png),
        cmocka_unit_test(test_errors_and_limits),
        cmocka_unit_test(test_rng),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
