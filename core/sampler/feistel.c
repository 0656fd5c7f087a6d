/*
 * Feistel shuffle. Round keys come from splitmix64 of the key so that nearby seeds (seed,
 * seed + 1 for the next epoch) give unrelated orders; the round function is the murmur3
 * 64-bit finaliser, which mixes every input bit into every output bit.
 */
#include "sampler/feistel.h"

#include <stdbool.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

static uint64_t low_mask(unsigned bits)
{
    return bits >= 64 ? ~0ull : (1ull << bits) - 1;
}

void bw__feistel_init_bits(bw__feistel *f, uint64_t n, unsigned bits, uint64_t key)
{
    f->n = n;
    f->half_bits = (bits + 1) / 2;
    f->masks[0] = low_mask(bits - f->half_bits);
    f->masks[1] = low_mask(f->half_bits);
    uint64_t sm = key;
    for (int i = 0; i < BW__FEISTEL_ROUNDS; i++)
        f->keys[i] = splitmix64(&sm);
}

void bw__feistel_init(bw__feistel *f, uint64_t n, uint64_t key)
{
    unsigned bits = 1;
    if (n > 2)
        bits = 64u - (unsigned)__builtin_clzll(n - 1);
    bw__feistel_init_bits(f, n, bits + (bits & 1), key); /* 4^h: both parts h bits */
}

/* Round i makes the new right part out of the left one, so it keeps the left part's width:
 * masks[0] in even rounds, masks[1] in odd ones (the same mask when balanced). */
static inline uint64_t encrypt(const bw__feistel *f, uint64_t x)
{
    uint64_t left = x >> f->half_bits, right = x & f->masks[1];
#pragma GCC unroll 6
    for (int i = 0; i < BW__FEISTEL_ROUNDS; i++) {
        uint64_t next = left ^ (fmix64(right ^ f->keys[i]) & f->masks[i & 1]);
        left = right;
        right = next;
    }
    return (left << f->half_bits) | right;
}

uint64_t bw__feistel_at(const bw__feistel *f, uint64_t pos)
{
    /* Cycle-walking: the walk from pos stays on pos's cycle of the domain permutation,
     * which re-enters [0, n) at the latest when it returns to pos, so it terminates and
     * the restriction to [0, n) is a bijection. */
    uint64_t x = encrypt(f, pos);
    while (x >= f->n)
        x = encrypt(f, x);
    return x;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define FEISTEL_X8 1
/* Eight encryptions side by side in one AVX-512 register (vpmullq needs AVX512DQ), chosen at
 * run time (bw__feistel_at_run): the same operations as encrypt, lane by lane, in GCC's
 * vector extension. x[0, n) with n a multiple of 8. */
typedef uint64_t v8u64 __attribute__((vector_size(64)));

__attribute__((target("avx512f,avx512dq"))) static void encrypt_x8(const bw__feistel *f,
                                                                   uint64_t *x, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        v8u64 v;
        memcpy(&v, x + i, sizeof(v));
        v8u64 left = v >> f->half_bits, right = v & f->masks[1];
#pragma GCC unroll 6
        for (int r = 0; r < BW__FEISTEL_ROUNDS; r++) {
            v8u64 k = right ^ f->keys[r];
            k ^= k >> 33;
            k *= 0xff51afd7ed558ccdull;
            k ^= k >> 33;
            k *= 0xc4ceb9fe1a85ec53ull;
            k ^= k >> 33;
            v8u64 next = left ^ (k & f->masks[r & 1]);
            left = right;
            right = next;
        }
        v = (left << f->half_bits) | right;
        memcpy(x + i, &v, sizeof(v));
    }
}

static bool have_x8(void)
{
    static int known; /* 0: not asked yet, 1: no, 2: yes; a benign race (same answer) */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k == 0) {
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") ? 2 : 1;
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k == 2;
}
#endif

void bw__feistel_at_run(const bw__feistel *f, uint64_t *x, size_t n)
{
    const bw__feistel g = *f; /* a copy the stores to x cannot alias: keys stay in registers */
    size_t first = 0;         /* the items encrypted once already */
#ifdef FEISTEL_X8
    if (n >= 8 && have_x8()) {
        first = n & ~(size_t)7;
        encrypt_x8(&g, x, first);
    }
#endif
    enum { BLOCK = 64 };
    uint8_t walk[BLOCK]; /* the block's items still outside [0, n) */
    for (size_t b = 0; b < n; b += BLOCK) {
        size_t end = n - b < BLOCK ? n : b + BLOCK, nwalk = 0;
        for (size_t i = b; i < end; i++) {
            if (i >= first)
                x[i] = encrypt(&g, x[i]);
            walk[nwalk] = (uint8_t)(i - b);
            nwalk += x[i] >= g.n; /* no branch: about half the items walk on */
        }
        while (nwalk > 0) {
            size_t left = 0;
            for (size_t w = 0; w < nwalk; w++) {
                size_t i = b + walk[w];
                x[i] = encrypt(&g, x[i]);
                walk[left] = walk[w];
                left += x[i] >= g.n;
            }
            nwalk = left;
        }
    }
}
