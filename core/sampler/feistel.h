/*
 * An O(1)-memory keyed bijection on [0, n): a balanced Feistel network on the smallest
 * square power of two >= n (4^h), made to fit [0, n) by cycle-walking (re-encrypt until the
 * value falls inside). The domain is under 4n, so a position takes fewer than 4 encryptions
 * on average. It is a good shuffle for datasets too large for an n-element permutation, but
 * it is NOT torch.randperm: the same seed gives a different order.
 */
#ifndef BW_SAMPLER_FEISTEL_H
#define BW_SAMPLER_FEISTEL_H

#include <stddef.h>
#include <stdint.h>

#define BW__FEISTEL_ROUNDS 6

typedef struct bw__feistel {
    uint64_t n;
    unsigned half_bits; /* h: the right part's width; the left part's is `bits - h` */
    uint64_t masks[2];  /* the left part's mask, then the right part's (2^h - 1) */
    uint64_t keys[BW__FEISTEL_ROUNDS];
} bw__feistel;

/* Prepares the bijection of [0, n) keyed by `key` (the sampler passes seed + epoch): the
 * balanced network on the smallest 4^h >= n. */
void bw__feistel_init(bw__feistel *f, uint64_t n, uint64_t key);

/* The same on [0, 2^bits) (n <= 2^bits, 1 <= bits <= 64), made of a right part of
 * h = ceil(bits / 2) bits and a left part of bits - h: when bits is odd the two parts' widths
 * trade places each round (an unbalanced network) and are back after the six. With
 * bits = 2h it is bw__feistel_init's network. The domain can be under 2n instead of 4n, so
 * fewer steps of cycle-walking. */
void bw__feistel_init_bits(bw__feistel *f, uint64_t n, unsigned bits, uint64_t key);

/* The image of pos (< n) under the bijection. */
uint64_t bw__feistel_at(const bw__feistel *f, uint64_t pos);

/* x[i] = bw__feistel_at(f, x[i]) for i < n, with the same results: the items' encryptions
 * are independent, so they are done one round of cycle-walking at a time over all items still
 * outside the domain, which lets the processor overlap them instead of waiting on one walk's
 * chain of multiplications and mispredicting its exit; with AVX-512 (checked at run time)
 * the first encryptions go eight to a register. */
void bw__feistel_at_run(const bw__feistel *f, uint64_t *x, size_t n);

#endif
