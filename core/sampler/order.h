/*
 * The order of one epoch: position p (0 <= p < n) of the epoch's sequence -> sample index.
 * Sequential (identity), torch-exact (a cached randperm of n, 4 bytes a sample when
 * n <= 2^32, else 8) or feistel (a keyed bijection, O(1) memory, not torch-identical).
 * Computing it is the only O(n) step of an epoch; every lookup afterwards is O(1).
 */
#ifndef BW_SAMPLER_ORDER_H
#define BW_SAMPLER_ORDER_H

#include "sampler/feistel.h"

#include <stddef.h>
#include <stdint.h>

typedef enum bw__order_kind {
    BW__ORDER_SEQUENTIAL = 0,
    BW__ORDER_TORCH = 1,
    BW__ORDER_FEISTEL = 2,
} bw__order_kind;

typedef struct bw__order {
    bw__order_kind kind;
    uint64_t n;
    uint32_t *p32; /* torch, n <= 2^32 */
    uint64_t *p64; /* torch, n > 2^32 */
    bw__feistel feistel;
} bw__order;

/*
 * Computes the order of n samples for `seed` (the sampler passes seed + epoch; unused when
 * sequential). Reuses o's buffer when it is large enough (o must be zeroed or previously
 * initialised). On error (BW_NOMEM, with a sentence in err) o is left freed and empty.
 */
int bw__order_compute(bw__order *o, bw__order_kind kind, uint64_t n, uint64_t seed, char *err,
                      size_t errlen);

/* Releases the cached permutation; o is then empty. Accepts an empty order. */
void bw__order_free(bw__order *o);

/* Sample index at position pos (< n). */
static inline uint64_t bw__order_at(const bw__order *o, uint64_t pos)
{
    switch (o->kind) {
    case BW__ORDER_TORCH:
        return o->p32 ? o->p32[pos] : o->p64[pos];
    case BW__ORDER_FEISTEL:
        return bw__feistel_at(&o->feistel, pos);
    default:
        return pos;
    }
}

/* pos[i] = bw__order_at(o, offset + pos[i]) for i < n: a feistel order encrypts them
 * together (bw__feistel_at_run: eight at a time with AVX-512), not one walk after another. */
void bw__order_at_many(const bw__order *o, uint64_t offset, uint64_t *pos, size_t n);

/* Bytes the order keeps in memory. */
size_t bw__order_memory(const bw__order *o);

#endif
