/*
 * MT19937 as c10/util/mt19937.h implements it: init_genrand seeding from a 32-bit value and
 * the reference twist. Kept separate from randperm so other code (and tests) can draw from
 * the exact generator.
 */
#include "sampler/torch_rng.h"

#define MT_M 397
#define MATRIX_A 0x9908b0dfu
#define UPPER_MASK 0x80000000u
#define LOWER_MASK 0x7fffffffu

void bw__torch_rng_seed(bw__torch_rng *g, uint64_t seed)
{
    /* c10's mt19937 takes a uint64_t and keeps only its low 32 bits. */
    g->state[0] = (uint32_t)(seed & 0xffffffffu);
    for (uint32_t j = 1; j < BW__MT_N; j++) {
        uint32_t prev = g->state[j - 1];
        g->state[j] = 1812433253u * (prev ^ (prev >> 30)) + j;
    }
    g->next = BW__MT_N;
}

static inline uint32_t mix_bits(uint32_t u, uint32_t v)
{
    return (u & UPPER_MASK) | (v & LOWER_MASK);
}

static inline uint32_t twist_word(uint32_t u, uint32_t v)
{
    return (mix_bits(u, v) >> 1) ^ ((v & 1u) ? MATRIX_A : 0u);
}

void bw__torch_rng_twist(bw__torch_rng *g)
{
    uint32_t *s = g->state;
    int j;
    for (j = 0; j < BW__MT_N - MT_M; j++)
        s[j] = s[j + MT_M] ^ twist_word(s[j], s[j + 1]);
    for (; j < BW__MT_N - 1; j++)
        s[j] = s[j + (MT_M - BW__MT_N)] ^ twist_word(s[j], s[j + 1]);
    s[BW__MT_N - 1] = s[MT_M - 1] ^ twist_word(s[BW__MT_N - 1], s[0]);
    g->next = 0;
}
