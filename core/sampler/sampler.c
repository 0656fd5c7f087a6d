/*
 * The sampler object: one epoch's configuration, its cached order, and the list of world
 * sizes the epoch ran at (elastic resume). Each segment lays out the suffix of the epoch's
 * order that was not consumed when it started, so a batch is found by locating its segment
 * (a handful at most) and doing O(1) arithmetic.
 */
#include "sampler/sampler.h"

#include "batchwire/batchwire.h"
#include "sampler/layout.h"
#include "sampler/order.h"

#include <stdio.h>
#include <stdlib.h>

typedef unsigned long long ull;

typedef struct segment {
    uint64_t first_step; /* epoch step at which this world size took over */
    uint64_t offset;     /* positions of the epoch's order consumed before it */
    bw__layout layout;   /* over the remaining n - offset positions */
} segment;

struct bw__sampler {
    bw__sampler_cfg cfg;
    bw__order order;
    segment *segs;
    size_t nsegs, capsegs;
};

static bw__order_kind order_kind(const bw__sampler_cfg *cfg)
{
    if (!cfg->shuffle)
        return BW__ORDER_SEQUENTIAL;
    return cfg->shuffle_algo == BW__SHUFFLE_FEISTEL ? BW__ORDER_FEISTEL : BW__ORDER_TORCH;
}

static void reset_segments(bw__sampler *s)
{
    s->nsegs = 1;
    s->segs[0].first_step = 0;
    s->segs[0].offset = 0;
    bw__layout_init(&s->segs[0].layout, &s->cfg, s->cfg.num_samples, s->cfg.world_size);
}

int bw__sampler_new(bw__sampler **out, const bw__sampler_cfg *cfg, char *err, size_t errlen)
{
    *out = NULL;
    int rc = bw__sampler_cfg_check(cfg, err, errlen);
    if (rc != BW_OK)
        return rc;
    bw__sampler *s = calloc(1, sizeof(*s));
    if (s)
        s->segs = calloc(4, sizeof(*s->segs));
    if (!s || !s->segs) {
        free(s);
        if (err && errlen)
            snprintf(err, errlen, "out of memory creating a sampler");
        return BW_NOMEM;
    }
    s->capsegs = 4;
    s->cfg = *cfg;
    rc = bw__sampler_set_epoch(s, cfg->epoch, err, errlen);
    if (rc != BW_OK) {
        bw__sampler_free(s);
        return rc;
    }
    *out = s;
    return BW_OK;
}

void bw__sampler_free(bw__sampler *s)
{
    if (!s)
        return;
    bw__order_free(&s->order);
    free(s->segs);
    free(s);
}

const bw__sampler_cfg *bw__sampler_config(const bw__sampler *s)
{
    return &s->cfg;
}

int bw__sampler_set_epoch(bw__sampler *s, uint64_t epoch, char *err, size_t errlen)
{
    s->cfg.epoch = epoch;
    reset_segments(s);
    /* seed + epoch wraps like the 64-bit value torch receives; only the low 32 bits of
     * the sum reach MT19937, exactly as in torch. */
    return bw__order_compute(&s->order, order_kind(&s->cfg), s->cfg.num_samples,
                             s->cfg.seed + epoch, err, errlen);
}

static const segment *current(const bw__sampler *s)
{
    return &s->segs[s->nsegs - 1];
}

int bw__sampler_resize(bw__sampler *s, uint64_t at_step, uint64_t world_size, char *err,
                       size_t errlen)
{
    int rc = bw__layout_check_world(&s->cfg, world_size, err, errlen);
    if (rc != BW_OK)
        return rc;
    const segment *cur = current(s);
    const bw__layout *l = &cur->layout;
    if (at_step < cur->first_step) {
        if (err && errlen)
            snprintf(err, errlen,
                     "resume_from_step %llu is before step %llu, where world_size %llu started",
                     (ull)at_step, (ull)cur->first_step, (ull)l->world);
        return BW_INVALID_ARGUMENT;
    }
    uint64_t k = at_step - cur->first_step;
    uint64_t min_steps = bw__layout_steps(l, l->world - 1), max_steps = bw__layout_max_steps(l);
    if (k > min_steps && k != max_steps) {
        if (err && errlen && min_steps == max_steps)
            snprintf(err, errlen,
                     "resume_from_step %llu is past the end of the epoch: with world_size %llu "
                     "it ends at step %llu",
                     (ull)at_step, (ull)l->world, (ull)cur->first_step + max_steps);
        else if (err && errlen)
            snprintf(err, errlen,
                     "resume_from_step %llu: with world_size %llu ranks end at step %llu to "
                     "%llu, so not every rank can have run %llu steps",
                     (ull)at_step, (ull)l->world, (ull)cur->first_step + min_steps,
                     (ull)cur->first_step + max_steps, (ull)at_step);
        return BW_INVALID_ARGUMENT;
    }
    uint64_t offset = cur->offset + bw__layout_consumed(l, k);
    if (k == 0) {
        /* Nothing ran at the current size: replace it rather than keep an empty segment. */
        bw__layout_init(&s->segs[s->nsegs - 1].layout, &s->cfg, s->cfg.num_samples - offset,
                        world_size);
        return BW_OK;
    }
    if (s->nsegs == s->capsegs) {
        segment *grown = realloc(s->segs, 2 * s->capsegs * sizeof(*grown));
        if (!grown) {
            if (err && errlen)
                snprintf(err, errlen, "out of memory recording a resize");
            return BW_NOMEM;
        }
        s->segs = grown;
        s->capsegs *= 2;
    }
    segment *seg = &s->segs[s->nsegs++];
    seg->first_step = at_step;
    seg->offset = offset;
    bw__layout_init(&seg->layout, &s->cfg, s->cfg.num_samples - offset, world_size);
    return BW_OK;
}

uint64_t bw__sampler_world_size(const bw__sampler *s)
{
    return current(s)->layout.world;
}

uint64_t bw__sampler_first_step(const bw__sampler *s)
{
    return current(s)->first_step;
}

uint64_t bw__sampler_end_step(const bw__sampler *s, uint64_t rank)
{
    const segment *cur = current(s);
    if (rank >= cur->layout.world)
        return cur->first_step;
    return cur->first_step + bw__layout_steps(&cur->layout, rank);
}

uint64_t bw__sampler_position(const bw__sampler *s, uint64_t step)
{
    size_t i = s->nsegs - 1;
    while (i > 0 && s->segs[i].first_step > step)
        i--;
    const segment *seg = &s->segs[i];
    const bw__layout *l = &seg->layout;
    uint64_t k = step - seg->first_step;
    uint64_t per_step = l->mode == BW__MODE_TORCH ? l->b * l->world : l->g;
    /* k > n / per_step already reaches past the end: no product that could overflow. */
    uint64_t in_seg = k > l->n / per_step ? l->n : (k * per_step < l->n ? k * per_step : l->n);
    return seg->offset + in_seg;
}

bool bw__sampler_equal_batches(const bw__sampler *s)
{
    const bw__layout *l = &current(s)->layout;
    return bw__layout_steps(l, 0) == bw__layout_steps(l, l->world - 1);
}

size_t bw__sampler_max_batch(const bw__sampler *s)
{
    size_t most = 1;
    for (size_t i = 0; i < s->nsegs; i++)
        if (s->segs[i].layout.b > most)
            most = (size_t)s->segs[i].layout.b;
    return most;
}

int bw__sampler_batch(const bw__sampler *s, uint64_t rank, uint64_t step, bw__batch *out)
{
    size_t i = s->nsegs - 1;
    while (i > 0 && s->segs[i].first_step > step)
        i--;
    const segment *seg = &s->segs[i];
    out->count = 0;
    out->real = 0;
    if (rank >= seg->layout.world)
        return BW_INVALID_ARGUMENT;
    uint64_t local = step - seg->first_step;
    /* A step of an earlier world size past its end belongs to nobody. */
    uint64_t end = bw__layout_steps(&seg->layout, rank);
    if (i + 1 < s->nsegs && s->segs[i + 1].first_step - seg->first_step < end)
        end = s->segs[i + 1].first_step - seg->first_step;
    if (local >= end)
        return BW_END_OF_EPOCH;
    out->count =
        bw__layout_batch(&seg->layout, rank, local, out->indices, out->padding, &out->real);
    bw__order_at_many(&s->order, seg->offset, out->indices, out->count);
    return BW_OK;
}

int bw__sampler_next(const bw__sampler *s, uint64_t rank, bw__sampler_cursor *cursor,
                     bw__batch *out)
{
    if (cursor->epoch != s->cfg.epoch)
        return BW_MISMATCH;
    int rc = bw__sampler_batch(s, rank, cursor->step, out);
    if (rc == BW_OK)
        cursor->step++;
    return rc;
}

size_t bw__sampler_memory(const bw__sampler *s)
{
    return sizeof(*s) + s->capsegs * sizeof(*s->segs) + bw__order_memory(&s->order);
}
