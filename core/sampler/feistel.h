/*
 * An O(1)-memory keyed bijection on [0, n): a balanced Feistel network on the smallest
 * square power of two >= n (4^h), made to fit [0, n) by cycle-walking (re-encrypt until the
 * value falls inside). The domain is under 4n, so a position takes fewer than 4 encryptions
 * on average. It is a good shuffle for datasets too large for an n-element permutation, but
 * it is NOT torch.randperm: the same seed gives a different order.
 */
#ifndef BW_SAMPLER_FEISTEL_H
#define BW_SAMPLER_FEISTEL_H

#include <stdint.h>

#define BW__FEISTEL_ROUNDS 6

typedef struct bw__feistel {
    uint64_t n;
    unsigned half_bits;
    uint64_t half_mask;
    uint64_t keys[BW__FEISTEL_ROUNDS];
} bw__feistel;

/* Prepares the bijection of [0, n) keyed by `key` (the sampler passes seed + epoch). */
void bw__feistel_init(bw__feistel *f, uint64_t n, uint64_t key);

/* The image of pos (< n) under the bijection. */
uint64_t bw__feistel_at(const bw__feistel *f, uint64_t pos);

#endif
