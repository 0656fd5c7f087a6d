/*
 * Epoch order cache. The torch permutation is kept in 32-bit words whenever the values fit:
 * half the memory of PyTorch's int64 tensor and half the cache misses while shuffling.
 */
#include "sampler/order.h"

#include "batchwire/batchwire.h"
#include "sampler/randperm.h"

#include <stdio.h>
#include <stdlib.h>

#define FITS_U32(n) ((n) <= (uint64_t)UINT32_MAX + 1)

void bw__order_free(bw__order *o)
{
    if (!o)
        return;
    free(o->p32);
    free(o->p64);
    o->p32 = NULL;
    o->p64 = NULL;
    o->n = 0;
    o->kind = BW__ORDER_SEQUENTIAL;
}

size_t bw__order_memory(const bw__order *o)
{
    if (o->kind != BW__ORDER_TORCH)
        return sizeof(*o);
    return sizeof(*o) + (size_t)o->n * (o->p32 ? sizeof(uint32_t) : sizeof(uint64_t));
}

static void *ensure(void *old, uint64_t old_n, uint64_t n, size_t elem, int *fail)
{
    if (old && old_n >= n)
        return old;
    free(old);
    if (n > SIZE_MAX / elem) {
        *fail = 1;
        return NULL;
    }
    void *p = malloc(n ? (size_t)n * elem : 1);
    if (!p)
        *fail = 1;
    return p;
}

int bw__order_compute(bw__order *o, bw__order_kind kind, uint64_t n, uint64_t seed, char *err,
                      size_t errlen)
{
    uint64_t had = (o->kind == BW__ORDER_TORCH) ? o->n : 0;
    if (kind != BW__ORDER_TORCH) {
        bw__order_free(o);
        o->kind = kind;
        o->n = n;
        if (kind == BW__ORDER_FEISTEL)
            bw__feistel_init(&o->feistel, n, seed);
        return BW_OK;
    }

    int fail = 0;
    if (FITS_U32(n)) {
        free(o->p64);
        o->p64 = NULL;
        o->p32 = ensure(o->p32, had, n, sizeof(uint32_t), &fail);
    } else {
        free(o->p32);
        o->p32 = NULL;
        o->p64 = ensure(o->p64, had, n, sizeof(uint64_t), &fail);
    }
    if (fail) {
        bw__order_free(o);
        if (err && errlen)
            snprintf(err, errlen,
                     "num_samples %llu: cannot allocate the %.1f GiB torch-exact permutation; "
                     "use shuffle_algo feistel for an O(1)-memory shuffle",
                     (unsigned long long)n,
                     (double)n * (FITS_U32(n) ? 4.0 : 8.0) / (1024.0 * 1024.0 * 1024.0));
        return BW_NOMEM;
    }
    o->kind = BW__ORDER_TORCH;
    o->n = n;
    if (o->p32)
        bw__randperm_u32(o->p32, n, seed, BW__RANDPERM_AUTO);
    else
        bw__randperm_u64(o->p64, n, seed, BW__RANDPERM_AUTO);
    return BW_OK;
}

void bw__order_at_many(const bw__order *o, uint64_t offset, uint64_t *pos, size_t n)
{
    if (o->kind != BW__ORDER_FEISTEL) {
        for (size_t i = 0; i < n; i++)
            pos[i] = bw__order_at(o, offset + pos[i]);
        return;
    }
    for (size_t i = 0; i < n; i++)
        pos[i] += offset;
    bw__feistel_at_run(&o->feistel, pos, n);
}
