/* JPEG decoding with libjpeg-turbo's TurboJPEG API to RGB, as Pillow's
 * Image.open(f).convert("RGB") gives it (docs/transforms.md, "decode"). */
#include <stdio.h>
#include <string.h>
#include <turbojpeg.h>

#include "batchwire/batchwire.h"
#include "transform/transform.h"

/* Pillow reads every 4-channel JPEG with Adobe's polarity (inverted CMYK) and converts CMYK
 * to RGB as R = (255 - K) - (C * (255 - K)) / 255 with its rounding division by 255 ((t +
 * 128 + ((t + 128) >> 8)) >> 8, t = C * (255 - K)). TurboJPEG gives the stored (inverted)
 * values; c and k below are those, so C = 255 - c and 255 - K = k. In place: pixel i's three
 * bytes never overwrite pixel i + 1's four. */
static void cmyk_to_rgb(uint8_t *p, size_t pixels)
{
    for (size_t i = 0; i < pixels; i++) {
        const uint8_t *in = p + i * 4;
        int nk = in[3], v[3];
        for (int ch = 0; ch < 3; ch++) {
            int t = (255 - in[ch]) * nk + 128;
            int x = nk - (((t >> 8) + t) >> 8);
            v[ch] = x < 0 ? 0 : x > 255 ? 255 : x;
        }
        for (int ch = 0; ch < 3; ch++)
            p[i * 3 + (size_t)ch] = (uint8_t)v[ch];
    }
}

int bw__tf_is_png(const uint8_t *in, size_t inlen)
{
    return inlen >= 8 && memcmp(in, "\x89PNG\r\n\x1a\n", 8) == 0;
}

int bw__tf_jpeg_decode(void *tj, const uint8_t *in, size_t inlen, uint64_t max_pixels,
                       bw__tf_get_buf get_buf, void *ctx, int *h, int *w, char *err, size_t errlen)
{
    int sub, cs;
    if (inlen < 4 || in[0] != 0xff || in[1] != 0xd8) {
        snprintf(err, errlen,
                 "decode: not a JPEG or a PNG (%zu bytes, no JPEG start-of-image marker or PNG "
                 "signature)",
                 inlen);
        return BW_CORRUPT;
    }
    if (inlen > (size_t)0xffffffffu) {
        snprintf(err, errlen, "decode: the JPEG is %zu bytes, more than 4 GiB", inlen);
        return BW_TOO_BIG;
    }
    if (tjDecompressHeader3(tj, in, (unsigned long)inlen, w, h, &sub, &cs) != 0) {
        snprintf(err, errlen, "decode: corrupt JPEG header: %s", tjGetErrorStr2(tj));
        return BW_CORRUPT;
    }
    if (*w < 1 || *h < 1) {
        snprintf(err, errlen, "decode: corrupt JPEG header: image size %dx%d", *w, *h);
        return BW_CORRUPT;
    }
    if ((uint64_t)*w * (uint64_t)*h > max_pixels) {
        snprintf(err, errlen, "decode: the JPEG is %dx%d pixels, more than the limit of %llu", *w,
                 *h, (unsigned long long)max_pixels);
        return BW_TOO_BIG;
    }
    int cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
    size_t pixels = (size_t)*w * (size_t)*h;
    uint8_t *out = get_buf(ctx, pixels * (cmyk ? 4 : 3));
    if (!out) {
        snprintf(err, errlen, "decode: out of memory for a %dx%d image", *w, *h);
        return BW_NOMEM;
    }
    /* Flags 0: the accurate integer DCT and fancy upsampling, libjpeg's defaults, which
     * Pillow keeps. */
    if (tjDecompress2(tj, in, (unsigned long)inlen, out, *w, 0, *h, cmyk ? TJPF_CMYK : TJPF_RGB,
                      0) != 0) {
        const char *why = tjGetErrorStr2(tj);
        /* A warning leaves a complete image. Pillow accepts those too, except a file that
         * ends early, which it refuses as truncated. */
        if (tjGetErrorCode(tj) != TJERR_WARNING || strstr(why, "Premature end of JPEG file")) {
            snprintf(err, errlen, "decode: corrupt JPEG (%dx%d): %s", *w, *h, why);
            return BW_CORRUPT;
        }
    }
    if (cmyk)
        cmyk_to_rgb(out, pixels);
    return BW_OK;
}
