/*
 * The synthetic content `batchwire gen` writes: every byte of sample i is a pure function of
 * i, so tests and benchmarks can verify what any worker served (docs/formats.md spells the
 * formula out for other languages):
 *
 *   mix(z)    = splitmix64 finalizer: z ^= z>>30; z *= 0xbf58476d1ce4e5b9; z ^= z>>27;
 *               z *= 0x94d049bb133111eb; z ^= z>>31   (all mod 2^64)
 *   word(i,w) = mix(i * 0x9e3779b97f4a7c15 + (w + 1) * 0xd1b54a32d192ed03)
 *   bytes(i, L) = the first L bytes of word(i,0) word(i,1) ... each little endian
 *   len(i)    = min + mix(i ^ 0x5851f42d4c957f2d) % (max - min + 1)   (min == max: fixed)
 */
#ifndef BW_FORMATS_SYNTH_H
#define BW_FORMATS_SYNTH_H

#include <stddef.h>
#include <stdint.h>

uint64_t bw__synth_word(uint64_t index, uint64_t w);

/* Writes bytes(index, len) to out. */
void bw__synth_fill(uint64_t index, uint8_t *out, size_t len);

/* The length of sample `index` for sizes in [min, max]. */
uint64_t bw__synth_len(uint64_t index, uint64_t min, uint64_t max);

/*
 * Synthetic images (`batchwire gen --format jpeg|tar-jpeg`; docs/formats.md, "Synthetic JPEG
 * images", gives every formula): image `index` of a set generated with `seed`, its size and
 * pixels pure functions of (seed, index):
 *   iword(k)  = mix(mix(seed ^ 0x632be59bd9b4e019) + index * 0x9e3779b97f4a7c15
 *                   + (k + 1) * 0xd1b54a32d192ed03)
 *   height    = min + iword(0) % (max - min + 1), width likewise with iword(1)
 * then a two-colour gradient, 2-5 rectangles, discs and striped discs, and per-pixel noise.
 */
uint64_t bw__synth_image_word(uint64_t seed, uint64_t index, uint64_t k);
void bw__synth_image_size(uint64_t seed, uint64_t index, int min, int max, int *h, int *w);
/* Writes h * w * 3 bytes of RGB (rows top to bottom) to rgb. */
void bw__synth_image_fill(uint64_t seed, uint64_t index, int h, int w, uint8_t *rgb);

#endif
