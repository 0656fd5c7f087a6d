/*
 * Batching rules of each mode over a sequence of n positions (an epoch, or the suffix of one
 * after an elastic resize), for one world size. Positions are turned into sample indices by
 * the epoch's order (order.h); this file never sees sample indices.
 *
 * Every mode reduces to: rank r's step s is a run of "virtual positions" v; v < n is the
 * real position v, v >= n is a padding duplicate of position (v - n) % pad_cycle — the
 * references all pad by cycling from the start of the order.
 *   torch:           v = j*R + r for j in [s*B, min(s*B + B, per_rank))
 *   accelerate/iter: v in [s*G + r*b, s*G + r*b + b), G = R*b samples per step, b the
 *                    per-rank batch size; with the uneven tail (accelerate even_batches
 *                    off) the run is cut at n instead of padded.
 */
#ifndef BW_SAMPLER_LAYOUT_H
#define BW_SAMPLER_LAYOUT_H

#include "sampler/sampler.h"

typedef struct bw__layout {
    bw__sampler_mode mode;
    uint64_t n;         /* positions in the sequence */
    uint64_t world;     /* R */
    uint64_t b;         /* samples a rank gets per step (torch: B) */
    uint64_t g;         /* accelerate/iterable: samples per step over all ranks */
    uint64_t per_rank;  /* torch: DistributedSampler.num_samples */
    uint64_t steps;     /* steps every rank has */
    bool uneven_tail;   /* accelerate, even_batches off: ranks with data get one more step */
    uint64_t pad_cycle; /* padding cycles through positions [0, pad_cycle) */
    /* accelerate, dispatch_batches, a short last step: each rank's slice of it (tail_b
     * samples, the last ranks' shorter or empty) over the leftover positions followed by
     * tail_pad padding positions [0, tail_pad) */
    uint64_t tail_b, tail_pad;
} bw__layout;

/* Lays out n positions over `world` ranks under cfg's rules (cfg->num_samples and
 * cfg->world_size are ignored). cfg must have passed bw__sampler_cfg_check for `world`. */
void bw__layout_init(bw__layout *l, const bw__sampler_cfg *cfg, uint64_t n, uint64_t world);

/* Steps rank r (< world) has. */
uint64_t bw__layout_steps(const bw__layout *l, uint64_t rank);

/* Steps of the rank with the most. */
uint64_t bw__layout_max_steps(const bw__layout *l);

/* Positions of batch `step` of `rank` into pos[] and padding flags into pad[] (may be NULL);
 * returns the count (0 if the rank has no such step). pos[] needs l->b slots. */
size_t bw__layout_batch(const bw__layout *l, uint64_t rank, uint64_t step, uint64_t *pos,
                        uint8_t *pad, size_t *real);

/* Positions consumed, as a prefix, once every rank has run k steps (k <= min steps, or
 * k = max steps meaning the whole sequence). */
uint64_t bw__layout_consumed(const bw__layout *l, uint64_t k);

/* Checks world-size dependent rules for `world` (also used for elastic resizes). */
int bw__layout_check_world(const bw__sampler_cfg *cfg, uint64_t world, char *err, size_t errlen);

#endif
