/*
 * randperm, both PyTorch algorithms. The only liberty taken over PyTorch's loops is memory
 * prefetching: every z depends only on the generator, never on the array, so z for step
 * i + PREFETCH is drawn early (in the same order) and its cache line requested before it is
 * needed. For n = 10^8 the loops are bound by random memory access, not by the generator.
 */
#include "sampler/randperm.h"

#include "sampler/torch_rng.h"

#include <stddef.h>

#define PREFETCH 16 /* steps ahead; a power of two */

bw__randperm_algo bw__randperm_algo_for(uint64_t n)
{
    return n < BW__RANDPERM_LARGE_N ? BW__RANDPERM_SWAP : BW__RANDPERM_INSIDE_OUT;
}

/* z for step i of the swap algorithm: random() % (n - i), in 32 bits when it fits (the
 * result is the same; a 32-bit division is cheaper). */
static inline uint64_t swap_draw(bw__torch_rng *g, uint64_t n, uint64_t i)
{
    uint64_t m = n - i;
    uint32_t x = bw__torch_rng_random(g);
    if (m <= UINT32_MAX)
        return x % (uint32_t)m;
    return x; /* x < 2^32 <= m */
}

#define DEFINE_RANDPERM(SUFFIX, T)                                                                 \
    static void swap_##SUFFIX(T *r, uint64_t n, bw__torch_rng *g)                                  \
    {                                                                                              \
        for (uint64_t i = 0; i < n; i++)                                                           \
            r[i] = (T)i;                                                                           \
        if (n < 2)                                                                                 \
            return;                                                                                \
        uint64_t steps = n - 1, ring[PREFETCH];                                                    \
        for (uint64_t k = 0; k < PREFETCH && k < steps; k++) {                                     \
            ring[k] = swap_draw(g, n, k);                                                          \
            __builtin_prefetch(&r[k + ring[k]], 1);                                                \
        }                                                                                          \
        for (uint64_t i = 0; i < steps; i++) {                                                     \
            uint64_t z = ring[i & (PREFETCH - 1)];                                                 \
            uint64_t a = i + PREFETCH;                                                             \
            if (a < steps) {                                                                       \
                uint64_t za = swap_draw(g, n, a);                                                  \
                ring[a & (PREFETCH - 1)] = za;                                                     \
                __builtin_prefetch(&r[a + za], 1);                                                 \
            }                                                                                      \
            T sav = r[i];                                                                          \
            r[i] = r[i + z];                                                                       \
            r[i + z] = sav;                                                                        \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    static void inside_out_##SUFFIX(T *r, uint64_t n, bw__torch_rng *g)                            \
    {                                                                                              \
        uint64_t ring[PREFETCH];                                                                   \
        for (uint64_t k = 0; k < PREFETCH && k < n; k++) {                                         \
            ring[k] = bw__torch_rng_random64(g) % (k + 1);                                         \
            __builtin_prefetch(&r[ring[k]], 1);                                                    \
        }                                                                                          \
        for (uint64_t i = 0; i < n; i++) {                                                         \
            uint64_t z = ring[i & (PREFETCH - 1)];                                                 \
            uint64_t a = i + PREFETCH;                                                             \
            if (a < n) {                                                                           \
                uint64_t za = bw__torch_rng_random64(g) % (a + 1);                                 \
                ring[a & (PREFETCH - 1)] = za;                                                     \
                __builtin_prefetch(&r[za], 1);                                                     \
            }                                                                                      \
            /* PyTorch: r[i] = i; r[i] = r[z]; r[z] = i. Written so r[i] is never read             \
             * before it is set. */                                                                \
            if (z == i) {                                                                          \
                r[i] = (T)i;                                                                       \
            } else {                                                                               \
                r[i] = r[z];                                                                       \
                r[z] = (T)i;                                                                       \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    void bw__randperm_##SUFFIX(T *r, uint64_t n, uint64_t seed, bw__randperm_algo algo)            \
    {                                                                                              \
        bw__torch_rng g;                                                                           \
        bw__torch_rng_seed(&g, seed);                                                              \
        if (algo == BW__RANDPERM_AUTO)                                                             \
            algo = bw__randperm_algo_for(n);                                                       \
        if (algo == BW__RANDPERM_SWAP)                                                             \
            swap_##SUFFIX(r, n, &g);                                                               \
        else                                                                                       \
            inside_out_##SUFFIX(r, n, &g);                                                         \
    }

DEFINE_RANDPERM(u32, uint32_t)
DEFINE_RANDPERM(u64, uint64_t)
