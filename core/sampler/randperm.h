/*
 * torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU, bit for bit.
 *
 * PyTorch picks the algorithm by n:
 *   n <  214748364 (UINT32_MAX / 20): r[i] = i; for i = 0 .. n-2: z = random() % (n-i),
 *                                     swap r[i], r[i+z]                     (every version)
 *   n >= 214748364: inside-out Fisher-Yates, for i = 0 .. n-1: z = random64() % (i+1),
 *                   r[i] = r[z], r[z] = i                                   (PyTorch >= 2.6)
 * PyTorch 1.13 (Debian's python3-torch) uses the first algorithm for every n; we follow
 * current PyTorch, as docs/semantics.md ("Shuffle") says, so for n >= 214748364 the output matches
 * PyTorch >= 2.6 and differs from 1.13.
 *
 * The output is written to a caller-owned array of n elements; values fit 32 bits whenever
 * n <= 2^32, so the _u32 variant halves the memory of the cached permutation.
 */
#ifndef BW_SAMPLER_RANDPERM_H
#define BW_SAMPLER_RANDPERM_H

#include <stdint.h>

#define BW__RANDPERM_LARGE_N 214748364ull /* UINT32_MAX / 20 */

typedef enum bw__randperm_algo {
    BW__RANDPERM_AUTO = 0,       /* what current PyTorch uses for this n */
    BW__RANDPERM_SWAP = 1,       /* the n < 214748364 algorithm, forced (tests) */
    BW__RANDPERM_INSIDE_OUT = 2, /* the n >= 214748364 algorithm, forced (tests) */
} bw__randperm_algo;

/* The algorithm current PyTorch uses for n (never BW__RANDPERM_AUTO). */
bw__randperm_algo bw__randperm_algo_for(uint64_t n);

/* Fills r[0..n) with the permutation. Requires n <= 2^32 (values must fit). */
void bw__randperm_u32(uint32_t *r, uint64_t n, uint64_t seed, bw__randperm_algo algo);

/* Same for any n. */
void bw__randperm_u64(uint64_t *r, uint64_t n, uint64_t seed, bw__randperm_algo algo);

#endif
