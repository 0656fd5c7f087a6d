/*
 * PyTorch's CPU generator (c10::mt19937 inside CPUGeneratorImpl), bit for bit.
 *
 * torch.Generator().manual_seed(seed) keeps the seed as a 64-bit two's-complement value and
 * seeds MT19937 with its low 32 bits. random() is one tempered 32-bit output; random64() is
 * (first << 32) | second. Pure state machine: no globals, safe to use one per thread.
 */
#ifndef BW_SAMPLER_TORCH_RNG_H
#define BW_SAMPLER_TORCH_RNG_H

#include <stdint.h>

#define BW__MT_N 624

typedef struct bw__torch_rng {
    uint32_t state[BW__MT_N];
    uint32_t next; /* index of the next untempered word; BW__MT_N means "twist first" */
} bw__torch_rng;

/* Seeds like torch.Generator().manual_seed(seed); negative Python seeds are passed as their
 * two's complement (uint64_t)(int64_t)seed. */
void bw__torch_rng_seed(bw__torch_rng *g, uint64_t seed);

/* Regenerates the 624-word block; called by bw__torch_rng_random when it is used up. */
void bw__torch_rng_twist(bw__torch_rng *g);

/* One tempered 32-bit output: CPUGeneratorImpl::random(). */
static inline uint32_t bw__torch_rng_random(bw__torch_rng *g)
{
    if (g->next >= BW__MT_N)
        bw__torch_rng_twist(g);
    uint32_t y = g->state[g->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* CPUGeneratorImpl::random64(): two outputs, the first in the high half. */
static inline uint64_t bw__torch_rng_random64(bw__torch_rng *g)
{
    uint64_t hi = bw__torch_rng_random(g);
    uint64_t lo = bw__torch_rng_random(g);
    return (hi << 32) | lo;
}

#endif
