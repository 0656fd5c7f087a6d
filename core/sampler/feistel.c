/*
 * Feistel shuffle. Round keys come from splitmix64 of the key so that nearby seeds (seed,
 * seed + 1 for the next epoch) give unrelated orders; the round function is the murmur3
 * 64-bit finaliser, which mixes every input bit into every output bit.
 */
#include "sampler/feistel.h"

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

void bw__feistel_init(bw__feistel *f, uint64_t n, uint64_t key)
{
    unsigned bits = 1;
    if (n > 2)
        bits = 64u - (unsigned)__builtin_clzll(n - 1);
    f->n = n;
    f->half_bits = (bits + 1) / 2;
    if (f->half_bits < 1)
        f->half_bits = 1;
    f->half_mask = (f->half_bits >= 64) ? ~0ull : ((1ull << f->half_bits) - 1);
    uint64_t sm = key;
    for (int i = 0; i < BW__FEISTEL_ROUNDS; i++)
        f->keys[i] = splitmix64(&sm);
}

static inline uint64_t encrypt(const bw__feistel *f, uint64_t x)
{
    uint64_t left = x >> f->half_bits, right = x & f->half_mask;
    for (int i = 0; i < BW__FEISTEL_ROUNDS; i++) {
        uint64_t next = left ^ (fmix64(right ^ f->keys[i]) & f->half_mask);
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

void bw__feistel_at_each(const bw__feistel *const *f, uint64_t *x, size_t n)
{
    uint8_t walk[BW__FEISTEL_EACH_MAX]; /* the items still outside [0, n) */
    size_t nwalk = 0;
    for (size_t i = 0; i < n && i < BW__FEISTEL_EACH_MAX; i++) {
        x[i] = encrypt(f[i], x[i]);
        walk[nwalk] = (uint8_t)i;
        nwalk += x[i] >= f[i]->n; /* no branch: about half the items walk on */
    }
    while (nwalk > 0) {
        size_t left = 0;
        for (size_t w = 0; w < nwalk; w++) {
            size_t i = walk[w];
            x[i] = encrypt(f[i], x[i]);
            walk[left] = (uint8_t)i;
            left += x[i] >= f[i]->n;
        }
        nwalk = left;
    }
}
