/*
 * Transforms: the per-sample preprocessing a job declares and the workers run (issue 28;
 * docs/transforms.md states the operations, the spec syntax, the random choices and how each
 * result compares with Pillow and torchvision).
 *
 * A spec is parsed once (bw__tf_parse) into a bw__tf_spec, a plain value that any number of
 * threads may read at once. Each thread that runs transforms owns one bw__tf_scratch: the
 * TurboJPEG handle and the intermediate images of one sample. The scratch grows to the
 * largest sample seen and is then reused, so once warm bw__tf_run allocates nothing; its
 * size is bounded by the scratch's pixel limit (bw__tf_scratch_new). bw__tf_run writes the
 * result into a buffer the caller provides.
 *
 * Daemon-only (the workers and the CLI link it; libbatchwire does not: CMakeLists.txt,
 * BW_DAEMON_SRCS).
 */
#ifndef BW_TRANSFORM_TRANSFORM_H
#define BW_TRANSFORM_TRANSFORM_H

#include <stddef.h>
#include <stdint.h>

enum {
    BW_TF_MAX_OPS = 16,
    BW_TF_MAX_SIDE = 16384,              /* the largest output side an op may ask for */
    BW_TF_SPEC_MAX = 1024,               /* the longest spec text accepted */
    BW_TF_MAX_TOKENS = 1 << 24,          /* the longest token array truncate or pad makes */
    BW_TF_CANON_MAX = 2048,              /* room for bw__tf_format's canonical text */
    BW_TF_DEFAULT_MAX_PIXELS = 89478485, /* Pillow's decompression-bomb limit */
};

typedef enum bw__tf_kind {
    BW_TF_DECODE,
    BW_TF_RESIZE,              /* a: shorter side (b == 0), or a = H, b = W */
    BW_TF_CENTER_CROP,         /* a = H, b = W */
    BW_TF_RESIZED_CROP,        /* top, left, height, width (i[0..3]) then resize to a x b */
    BW_TF_RANDOM_RESIZED_CROP, /* a = H, b = W, scale[2], ratio[2] */
    BW_TF_FLIP,                /* p */
    BW_TF_NORMALIZE,           /* mean[3], std[3] */
    BW_TF_CHW,
    BW_TF_CAST,     /* dtype */
    BW_TF_TRUNCATE, /* a = L: the first L values of a token array */
    BW_TF_PAD,      /* a = L, pad_int or pad_real: appended up to L values */
} bw__tf_kind;

typedef enum bw__tf_dtype {
    BW_TF_UINT8,
    BW_TF_FLOAT32,
    BW_TF_FLOAT16,
    BW_TF_BFLOAT16,
} bw__tf_dtype;

typedef struct bw__tf_op {
    bw__tf_kind kind;
    int a, b;          /* output sizes (see bw__tf_kind) */
    int64_t i[4];      /* resized_crop's box: top, left, height, width */
    double scale[2];   /* random_resized_crop */
    double ratio[2];   /* random_resized_crop */
    double p;          /* flip */
    float mean[3];     /* normalize: float32 of the decimal, as torch.tensor([...]) rounds it */
    float std[3];      /* normalize */
    bw__tf_dtype cast; /* cast */
    int pad_is_int;    /* pad: the value was written as an integer (pad_int), else pad_real */
    int64_t pad_int;
    double pad_real;
} bw__tf_op;

typedef struct bw__tf_spec {
    int n;
    bw__tf_op ops[BW_TF_MAX_OPS];
} bw__tf_spec;

/* Parses and validates `text` (docs/transforms.md, "Spec syntax") into *out. Returns BW_OK,
 * or BW_INVALID_ARGUMENT with a sentence in err naming the op (by position and text) and
 * what is wrong with it; *out is then unspecified. Thread-safe. */
int bw__tf_parse(const char *text, bw__tf_spec *out, char *err, size_t errlen);

/* Writes the canonical text of spec into buf (at most len bytes, NUL-terminated): every
 * default spelled out, numbers in a fixed form, no spaces. Two specs that run the same
 * transform have the same canonical text (what a job's fingerprint hashes). Returns the
 * length, or -1 if it did not fit. */
int bw__tf_format(const bw__tf_spec *spec, char *buf, size_t len);

/* The result of a pipeline, when it is the same for every input: dtype, layout and the
 * dimensions (C, H, W in the order of the layout: chw ? {C,H,W} : {H,W,C}). Returns BW_OK,
 * or BW_INVALID_ARGUMENT when the output size depends on the image (no op after the last
 * decode fixes it), with the reason in err. */
typedef struct bw__tf_shape {
    bw__tf_dtype dtype; /* images */
    int chw;            /* 1: channels first */
    int ndim;           /* 3 for images, 1 for token arrays */
    int dims[3];        /* in memory order */
    size_t bytes;
    char descr[16]; /* numpy's descr of the values ("<f4", "|u1", "bfloat16"; tokens: input's) */
    /* token arrays: one value's bytes, and the pad value in the input's type and byte order */
    int elem;
    uint8_t pad[8];
} bw__tf_shape;
int bw__tf_output_shape(const bw__tf_spec *spec, bw__tf_shape *out, char *err, size_t errlen);

/* ---- token arrays (tokens.c; docs/transforms.md, "Token arrays") ---- */

/* True when spec is a token pipeline (truncate, pad) rather than an image one. */
int bw__tf_is_tokens(const bw__tf_spec *spec);

/* The result of token pipeline spec on samples that are rows of an array of numpy descr
 * `descr` whose per-sample shape is shape[0..ndim): the rows must be 1-D of integers or
 * float32/float64, and pad's value must be one of that type. Fills *out (ndim 1, the output
 * length, the input's descr, the pad value's bytes). BW_OK, or BW_INVALID_ARGUMENT with the
 * reason. */
int bw__tf_tokens_shape(const bw__tf_spec *spec, const char *descr, const uint64_t *shape,
                        size_t ndim, bw__tf_shape *out, char *err, size_t errlen);

/* Runs token pipeline spec on one row in[0..inlen) of values of shape->descr (from
 * bw__tf_tokens_shape), writing shape->bytes bytes to out (outcap at least that). BW_OK, or
 * an error with the reason (a row whose length is not a whole number of values, a result of
 * another length). Thread-safe. */
int bw__tf_tokens_run(const bw__tf_spec *spec, const bw__tf_shape *shape, const uint8_t *in,
                      size_t inlen, void *out, size_t outcap, char *err, size_t errlen);

/* ---- JSON Lines fields (docs/transforms.md, "JSON Lines fields") ---- */

/* The result of token pipeline spec on a JSON Lines field (a JSON array of integers of any
 * length, read as int64): the pipeline must end with pad(L2,VALUE) and every truncate and pad
 * before it be at most L2, so that every row is L2 values (a row longer than L2 after the
 * truncates fails); VALUE must be an int64. Fills *out (descr "<i8", ndim 1, dims[0] L2, the
 * pad value's bytes). BW_OK, or BW_INVALID_ARGUMENT with the reason. */
int bw__tf_tokens_json_shape(const bw__tf_spec *spec, bw__tf_shape *out, char *err, size_t errlen);

/* Runs token pipeline spec (shape from bw__tf_tokens_json_shape) on v[0..n), the JSON text of
 * a field's value: an array of integers, each within int64, become int64 little-endian, cut
 * by the truncates and padded to shape->bytes in out (outcap at least that). BW_OK;
 * BW_CORRUPT when v is not such an array (naming the value); BW_TOO_BIG when the row is longer
 * than the pad's length after the truncates. Thread-safe. */
int bw__tf_tokens_json_run(const bw__tf_spec *spec, const bw__tf_shape *shape, const uint8_t *v,
                           size_t n, void *out, size_t outcap, char *err, size_t errlen);

/* Decodes v[0..n), the JSON text of a field's value, a string of standard base64 (RFC 4648,
 * padded; "\/" read as '/'), into out (room for bw__tf_base64_cap(n) bytes), its length in
 * *outlen. BW_OK, or BW_CORRUPT saying what is not base64 and where (daemon-only:
 * base64.c). */
size_t bw__tf_base64_cap(size_t n);
int bw__tf_json_base64(const uint8_t *v, size_t n, uint8_t *out, size_t *outlen, char *why,
                       size_t whylen);

/* Bytes of one value of d; the shape of an h x w x 3 image of d in the layout chw says. */
size_t bw__tf_dtype_size(bw__tf_dtype d);
void bw__tf_shape_set(bw__tf_shape *out, bw__tf_dtype d, int chw, int h, int w);

/* What makes a sample's random choices: pure function of these and the op's position. */
typedef struct bw__tf_key {
    uint64_t seed, epoch, source, index;
} bw__tf_key;

/* The random choices a run made, for tests and debugging: one per random op, in order. */
typedef struct bw__tf_draw {
    int op;         /* position in the spec */
    int64_t box[4]; /* random_resized_crop: top, left, height, width */
    int flipped;    /* flip: 1 when the image was flipped */
} bw__tf_draw;

typedef struct bw__tf_result {
    bw__tf_shape shape;
    int ndraws;
    bw__tf_draw draws[BW_TF_MAX_OPS];
} bw__tf_result;

typedef struct bw__tf_scratch bw__tf_scratch;

/* A new scratch for one thread. max_pixels bounds the decoded image (width * height; 0: the
 * default, BW_TF_DEFAULT_MAX_PIXELS): the scratch then holds at most about 9 bytes per pixel
 * of the largest image plus the largest output. Returns NULL when out of memory or when
 * TurboJPEG cannot start. Free with bw__tf_scratch_free. */
bw__tf_scratch *bw__tf_scratch_new(uint64_t max_pixels);
void bw__tf_scratch_free(bw__tf_scratch *s);
/* Bytes the scratch holds now. */
size_t bw__tf_scratch_bytes(const bw__tf_scratch *s);

/* Runs spec on one encoded sample in[0..inlen) and writes the result to out[0..outcap).
 * key fixes the random choices. On success returns BW_OK and fills *res (the bytes written
 * are res->shape.bytes). On failure (a corrupt image, a result larger than outcap, an image
 * over the pixel limit, out of memory) returns an error code with a sentence in err that
 * says which op failed and why; the caller adds the source and index. The scratch stays
 * usable after a failure. Not thread-safe on one scratch; spec is only read. */
int bw__tf_run(const bw__tf_spec *spec, bw__tf_scratch *s, const bw__tf_key *key, const uint8_t *in,
               size_t inlen, void *out, size_t outcap, bw__tf_result *res, char *err,
               size_t errlen);

/* ---- the operations, for the pipeline above and for tests (ops.c, jpeg.c, rng.c) ---- */

/* An 8-bit image, interleaved channels (HWC), rows packed. */
typedef struct bw__tf_image {
    uint8_t *p;
    int h, w, c;
} bw__tf_image;

/* Pillow's bilinear resampling with antialias (docs/transforms.md, "resize"): src (h x w x c,
 * c <= 4) to dst (dh x dw x c, allocated by the caller). tmp holds the horizontal pass: at
 * least src.h * dw * c bytes; coef at least bw__tf_resize_coef_bytes(sh, sw, dh, dw) bytes,
 * suitably aligned for a double (from malloc). */
size_t bw__tf_resize_coef_bytes(int sh, int sw, int dh, int dw);
void bw__tf_resize(const bw__tf_image *src, bw__tf_image *dst, uint8_t *tmp, void *coef);

/* The size `resize(S)` gives an h x w image, as torchvision computes it. */
void bw__tf_shorter_side(int h, int w, int s, int *oh, int *ow);

/* Pillow's Image.crop: dst (height x width, caller-allocated) = src[top.., left..], with
 * zeros where the box is outside src. */
void bw__tf_crop(const bw__tf_image *src, int64_t top, int64_t left, bw__tf_image *dst);

/* torchvision's center_crop offsets (after its zero padding, which crop's zeros give). */
void bw__tf_center_box(int h, int w, int ch, int cw, int64_t *top, int64_t *left);

void bw__tf_hflip(bw__tf_image *img);

/* (x / 255 - mean) / std in float32 for every value of src (HWC), into dst (HWC). */
void bw__tf_normalize(const bw__tf_image *src, const float mean[3], const float std[3], float *dst);

/* The same values written channels first (CHW) into dst: normalize then chw in one pass. */
void bw__tf_normalize_chw(const bw__tf_image *src, const float mean[3], const float std[3],
                          float *dst);

/* The PRNG of docs/transforms.md, "Random choices". */
typedef struct bw__tf_rng {
    uint64_t key, n;
} bw__tf_rng;
void bw__tf_rng_init(bw__tf_rng *r, const bw__tf_key *key, int op);
uint64_t bw__tf_rng_next(bw__tf_rng *r);
double bw__tf_rng_uniform(bw__tf_rng *r);             /* [0, 1), 53 bits */
uint64_t bw__tf_rng_below(bw__tf_rng *r, uint64_t n); /* [0, n), unbiased; n >= 1 */

/* torchvision's RandomResizedCrop.get_params on our PRNG: box = top, left, height, width. */
void bw__tf_rrc_params(bw__tf_rng *r, int h, int w, const double scale[2], const double ratio[2],
                       int64_t box[4]);

/* Decodes a JPEG to RGB (docs/transforms.md, "decode"): sets *h, *w after reading the header
 * and writes h * w * 3 bytes to the buffer get_buf returns for that size (NULL: out of
 * memory). Returns BW_OK or an error with the reason in err. tj is a TurboJPEG decompressor. */
typedef uint8_t *(*bw__tf_get_buf)(void *ctx, size_t bytes);
int bw__tf_jpeg_decode(void *tj, const uint8_t *in, size_t inlen, uint64_t max_pixels,
                       bw__tf_get_buf get_buf, void *ctx, int *h, int *w, char *err, size_t errlen);

/* The same for a PNG, with libpng (png.c; docs/transforms.md, "decode"). */
int bw__tf_png_decode(const uint8_t *in, size_t inlen, uint64_t max_pixels, bw__tf_get_buf get_buf,
                      void *ctx, int *h, int *w, char *err, size_t errlen);

/* True when in starts with the PNG signature (decode then reads it as a PNG, else as a JPEG). */
int bw__tf_is_png(const uint8_t *in, size_t inlen);

#endif
