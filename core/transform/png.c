/* PNG decoding with libpng to RGB, as Pillow's Image.open(f).convert("RGB") gives it
 * (docs/transforms.md, "decode"): alpha and tRNS transparency dropped (never composited),
 * 16-bit colour channels reduced to their high byte, 16-bit grayscale clipped to 255,
 * 1/2/4-bit grayscale scaled to 0..255, palette indexes beyond the PLTE read as gray (i, i, i). */
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "transform/transform.h"

typedef struct png_src {
    const uint8_t *p;
    size_t n, at;
    char why[200];
} png_src;

static void on_error(png_structp png, png_const_charp msg)
{
    png_src *s = png_get_error_ptr(png);
    snprintf(s->why, sizeof(s->why), "%s", msg);
    png_longjmp(png, 1);
}

/* Warnings (a damaged ancillary chunk after the image, extra data) leave a complete image. */
static void on_warning(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

static void on_read(png_structp png, png_bytep out, size_t len)
{
    png_src *s = png_get_io_ptr(png);
    if (len > s->n - s->at)
        png_error(png, "the file ends early (truncated)");
    memcpy(out, s->p + s->at, len);
    s->at += len;
}

/* What the rows hold after libpng's transforms, before ours. */
enum { ROWS_RGB, ROWS_INDEX, ROWS_GRAY16 };

/* Everything that setjmp must not see change lives in here (reached through a pointer). */
typedef struct png_job {
    uint64_t max_pixels;
    bw__tf_get_buf get_buf;
    void *ctx;
    int h, w, rows, passes;
    uint8_t *out;
    uint8_t pal[256][3];
    int rc;
    char msg[200];
} png_job;

static void setup(png_structp png, png_infop info, png_job *j)
{
    png_uint_32 w, h;
    int depth, type, interlace;
    png_read_info(png, info);
    png_get_IHDR(png, info, &w, &h, &depth, &type, &interlace, NULL, NULL);
    j->w = (int)w;
    j->h = (int)h;
    if ((uint64_t)w * (uint64_t)h > j->max_pixels) {
        j->rc = BW_TOO_BIG;
        snprintf(j->msg, sizeof(j->msg), "the PNG is %ux%u pixels, more than the limit of %llu",
                 (unsigned)w, (unsigned)h, (unsigned long long)j->max_pixels);
        return;
    }
    j->rows = ROWS_RGB;
    if (depth == 16 && type != PNG_COLOR_TYPE_GRAY)
        png_set_strip_16(png); /* the high byte, as Pillow's "RGB;16B", "LA;16B", "RGBA;16B" */
    if (type & PNG_COLOR_MASK_ALPHA)
        png_set_strip_alpha(png);
    if (type == PNG_COLOR_TYPE_PALETTE) {
        /* Indexes, one byte each, mapped below: Pillow's palette is gray (i, i, i) past the
         * PLTE's entries, where libpng would refuse or give black. */
        png_colorp plte = NULL;
        int n = 0;
        png_get_PLTE(png, info, &plte, &n);
        for (int i = 0; i < 256; i++) {
            j->pal[i][0] = i < n ? plte[i].red : (uint8_t)i;
            j->pal[i][1] = i < n ? plte[i].green : (uint8_t)i;
            j->pal[i][2] = i < n ? plte[i].blue : (uint8_t)i;
        }
        png_set_check_for_invalid_index(png, 0);
        if (depth < 8)
            png_set_packing(png);
        j->rows = ROWS_INDEX;
    } else if (!(type & PNG_COLOR_MASK_COLOR)) {
        if (depth < 8)
            png_set_expand_gray_1_2_4_to_8(png); /* v * 255 / (2^depth - 1), as Pillow */
        if (depth == 16 && type == PNG_COLOR_TYPE_GRAY)
            j->rows = ROWS_GRAY16; /* Pillow's mode I, which convert("RGB") clips to 255 */
        else
            png_set_gray_to_rgb(png);
    }
    j->passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    size_t want = (size_t)w * (j->rows == ROWS_RGB ? 3 : j->rows == ROWS_INDEX ? 1 : 2);
    if (png_get_rowbytes(png, info) != want) { /* not expected: every combination is above */
        j->rc = BW_CORRUPT;
        snprintf(j->msg, sizeof(j->msg), "unsupported PNG (bit depth %d, colour type %d)", depth,
                 type);
        return;
    }
    j->out = j->get_buf(j->ctx, (size_t)w * (size_t)h * 3);
    if (!j->out) {
        j->rc = BW_NOMEM;
        snprintf(j->msg, sizeof(j->msg), "out of memory for a %ux%u image", (unsigned)w,
                 (unsigned)h);
    }
}

/* Row y holds want bytes at its start; spread them to 3 per pixel, from the end so that no
 * byte is overwritten before it is read. */
static void widen(png_job *j, uint8_t *row)
{
    for (int x = j->w - 1; x >= 0; x--) {
        uint8_t *o = row + (size_t)x * 3;
        if (j->rows == ROWS_INDEX) {
            const uint8_t *c = j->pal[row[x]];
            o[2] = c[2];
            o[1] = c[1];
            o[0] = c[0];
        } else {
            unsigned v = (unsigned)row[2 * x] << 8 | row[2 * x + 1];
            o[0] = o[1] = o[2] = v > 255 ? 255 : (uint8_t)v;
        }
    }
}

int bw__tf_png_decode(const uint8_t *in, size_t inlen, uint64_t max_pixels, bw__tf_get_buf get_buf,
                      void *ctx, int *h, int *w, char *err, size_t errlen)
{
    png_src src = {in, inlen, 0, {0}};
    png_job job;
    memset(&job, 0, sizeof(job));
    job.max_pixels = max_pixels;
    job.get_buf = get_buf;
    job.ctx = ctx;
    png_job *volatile j = &job;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, on_error, on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        snprintf(err, errlen, "decode: out of memory starting libpng");
        return BW_NOMEM;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        snprintf(err, errlen, "decode: corrupt PNG (%zu bytes): %s", inlen, src.why);
        return BW_CORRUPT;
    }
    png_set_read_fn(png, &src, on_read);
    /* Pillow checks the CRC of every chunk before the image data and refuses a file where one
     * is wrong; libpng by default only warns about an ancillary chunk's. */
    png_set_crc_action(png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
    /* No limit on a side beyond the pixel limit (libpng's default is 1,000,000; Pillow's none). */
    png_set_user_limits(png, 0x7fffffffu, 0x7fffffffu);
    setup(png, info, j);
    if (j->rc == BW_OK) {
        size_t stride = (size_t)j->w * 3;
        for (int p = 0; p < j->passes; p++)
            for (int y = 0; y < j->h; y++)
                png_read_row(png, j->out + (size_t)y * stride, NULL);
        if (j->rows != ROWS_RGB)
            for (int y = 0; y < j->h; y++)
                widen(j, j->out + (size_t)y * stride);
    }
    png_destroy_read_struct(&png, &info, NULL);
    *h = j->h;
    *w = j->w;
    if (j->rc != BW_OK)
        snprintf(err, errlen, "decode: %s", j->msg);
    return j->rc;
}
