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
