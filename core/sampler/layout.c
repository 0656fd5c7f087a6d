/*
 * Mode rules: configuration checks and the arithmetic that places positions in batches.
 * Derivations from the reference code are in docs/semantics.md; the golden vectors in
 * tests/data/ are the authority.
 */
#include "sampler/layout.h"

#include "batchwire/batchwire.h"
#include "common/refuse.h"

#include <stdio.h>
#include <string.h>

/* Caps keep every product below 2^63: far beyond any real dataset or batch. */
#define MAX_SAMPLES (1ull << 62)
#define MAX_WORLD (1ull << 20)
#define MAX_BATCH (1ull << 24)

typedef unsigned long long ull;

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

void bw__sampler_cfg_init(bw__sampler_cfg *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->mode = BW__MODE_TORCH;
    cfg->world_size = 1;
    cfg->batch_size = 1;
    cfg->shuffle_algo = BW__SHUFFLE_TORCH;
    cfg->even_batches = true;
    cfg->shard_single_process = true;
}

int bw__sampler_mode_parse(const char *s)
{
    if (!s)
        return -1;
    if (!strcmp(s, "torch"))
        return BW__MODE_TORCH;
    if (!strcmp(s, "accelerate"))
        return BW__MODE_ACCELERATE;
    if (!strcmp(s, "iterable"))
        return BW__MODE_ITERABLE;
    return -1;
}

int bw__shuffle_algo_parse(const char *s)
{
    if (!s)
        return -1;
    if (!strcmp(s, "torch"))
        return BW__SHUFFLE_TORCH;
    if (!strcmp(s, "feistel"))
        return BW__SHUFFLE_FEISTEL;
    return -1;
}

const char *bw__sampler_mode_name(bw__sampler_mode mode)
{
    switch (mode) {
    case BW__MODE_TORCH:
        return "torch";
    case BW__MODE_ACCELERATE:
        return "accelerate";
    case BW__MODE_ITERABLE:
        return "iterable";
    }
    return "unknown";
}

int bw__layout_check_world(const bw__sampler_cfg *cfg, uint64_t world, char *err, size_t errlen)
{
    if (world < 1 || world > MAX_WORLD)
        return bw__refuse(err, errlen, "world_size %llu is out of range [1, %llu]", (ull)world,
                          (ull)MAX_WORLD);
    if (cfg->mode != BW__MODE_TORCH) {
        if (cfg->split_batches && cfg->batch_size % world != 0)
            return bw__refuse(err, errlen,
                              "split_batches: batch_size %llu is not a multiple of world_size %llu "
                              "(each rank gets batch_size / world_size samples a step)",
                              (ull)cfg->batch_size, (ull)world);
        if (!cfg->split_batches && cfg->batch_size * world > MAX_SAMPLES)
            return bw__refuse(err, errlen, "batch_size %llu times world_size %llu is too large",
                              (ull)cfg->batch_size, (ull)world);
    }
    return BW_OK;
}

int bw__sampler_cfg_check(const bw__sampler_cfg *cfg, char *err, size_t errlen)
{
    const char *mode = bw__sampler_mode_name(cfg->mode);
    if (cfg->mode != BW__MODE_TORCH && cfg->mode != BW__MODE_ACCELERATE &&
        cfg->mode != BW__MODE_ITERABLE)
        return bw__refuse(err, errlen, "mode %d is not torch, accelerate or iterable",
                          (int)cfg->mode);
    if (cfg->num_samples > MAX_SAMPLES)
        return bw__refuse(err, errlen, "num_samples %llu is larger than the limit %llu",
                          (ull)cfg->num_samples, (ull)MAX_SAMPLES);
    if (cfg->batch_size < 1 || cfg->batch_size > MAX_BATCH)
        return bw__refuse(err, errlen, "batch_size %llu is out of range [1, %llu]",
                          (ull)cfg->batch_size, (ull)MAX_BATCH);
    if (cfg->shuffle_algo != BW__SHUFFLE_TORCH && cfg->shuffle_algo != BW__SHUFFLE_FEISTEL)
        return bw__refuse(err, errlen, "shuffle_algo %d is not torch or feistel",
                          (int)cfg->shuffle_algo);
    if (cfg->shuffle_algo == BW__SHUFFLE_FEISTEL && !cfg->shuffle)
        return bw__refuse(err, errlen, "shuffle_algo feistel needs shuffle");
    if (cfg->mode != BW__MODE_TORCH && cfg->sampler_drop_last)
        return bw__refuse(
            err, errlen,
            "sampler_drop_last is DistributedSampler's option; %s mode has no sampler "
            "drop_last (use drop_last)",
            mode);
    if (cfg->mode == BW__MODE_TORCH && cfg->split_batches)
        return bw__refuse(err, errlen,
                          "split_batches is an accelerate/iterable option; torch mode always gives "
                          "each rank batch_size samples");
    if (cfg->mode != BW__MODE_ACCELERATE && !cfg->even_batches)
        return bw__refuse(err, errlen,
                          "even_batches off is an accelerate option; %s mode always gives every "
                          "rank the same number of batches",
                          mode);
    if (cfg->dispatch_batches && cfg->mode != BW__MODE_ACCELERATE)
        return bw__refuse(
            err, errlen,
            "dispatch_batches is an accelerate option (DataLoaderDispatcher); %s mode "
            "has no dispatcher",
            mode);
    if (cfg->dispatch_batches && !cfg->even_batches)
        return bw__refuse(
            err, errlen,
            "even_batches off with dispatch_batches: Accelerate's DataLoaderDispatcher "
            "has no even_batches (it slices the last batch among the ranks); leave "
            "even_batches on");
    if (cfg->mode == BW__MODE_ITERABLE && cfg->shuffle)
        return bw__refuse(err, errlen,
                          "shuffle: iterable mode serves a stream in its own order (shuffle the "
                          "sources instead)");
    if (cfg->mode == BW__MODE_ACCELERATE && cfg->shuffle && cfg->num_samples == 0)
        /* SeedableRandomSampler (a RandomSampler) refuses an empty dataset. */
        return bw__refuse(err, errlen,
                          "num_samples 0: accelerate's shuffled sampler needs at least one sample");
    return bw__layout_check_world(cfg, cfg->world_size, err, errlen);
}

void bw__layout_init(bw__layout *l, const bw__sampler_cfg *cfg, uint64_t n, uint64_t world)
{
    memset(l, 0, sizeof(*l));
    l->mode = cfg->mode;
    l->n = n;
    l->world = world;
    if (cfg->mode == BW__MODE_TORCH) {
        /* DistributedSampler: drop_last truncates to a multiple of R, otherwise the list
         * is padded by repeating it from its start. */
        l->b = cfg->batch_size;
        l->per_rank = (cfg->sampler_drop_last && n % world) ? n / world : ceil_div(n, world);
        l->steps = cfg->drop_last ? l->per_rank / l->b : ceil_div(l->per_rank, l->b);
        l->pad_cycle = n;
        return;
    }
    l->b = cfg->split_batches ? cfg->batch_size / world : cfg->batch_size;
    l->g = l->b * world;
    uint64_t full = n / l->g;
    /* Padding cycles through the first global batch (the first R base batches, the first
     * base batch with split_batches, the stream's first global batch), itself cycled when
     * the epoch is shorter than that. */
    l->pad_cycle = n < l->g ? n : l->g;
    /* prepare_data_loader does not shard for one process: the plain BatchSampler. */
    bool plain = cfg->mode == BW__MODE_ACCELERATE && world == 1 && !cfg->shard_single_process;
    if (n % l->g == 0 || cfg->drop_last) {
        l->steps = full;
    } else if (cfg->dispatch_batches) {
        /* DataLoaderDispatcher: the m leftover samples are cut into world slices of
         * ceil(m / world); when m % world != 0 the first min(world, n) positions of the
         * sequence follow them, so the last slices are padded, short or empty. */
        uint64_t m = n - full * l->g;
        l->steps = full + 1;
        l->tail_b = m / world + (m % world != 0);
        l->tail_pad = m % world ? (n < world ? n : world) : 0;
    } else if (cfg->mode == BW__MODE_ITERABLE || (cfg->even_batches && !plain)) {
        l->steps = full + 1;
    } else {
        l->steps = full;
        l->uneven_tail = true;
    }
}

uint64_t bw__layout_steps(const bw__layout *l, uint64_t rank)
{
    if (l->uneven_tail && l->steps * l->g + rank * l->b < l->n)
        return l->steps + 1;
    return l->steps;
}

uint64_t bw__layout_max_steps(const bw__layout *l)
{
    return bw__layout_steps(l, 0);
}

size_t bw__layout_batch(const bw__layout *l, uint64_t rank, uint64_t step, uint64_t *pos,
                        uint8_t *pad, size_t *real)
{
    size_t count = 0, nreal = 0;
    if (rank >= l->world || step >= bw__layout_steps(l, rank)) {
        *real = 0;
        return 0;
    }
    if (l->mode == BW__MODE_TORCH) {
        uint64_t j0 = step * l->b;
        uint64_t j1 = j0 + l->b < l->per_rank ? j0 + l->b : l->per_rank;
        for (uint64_t j = j0; j < j1; j++) {
            uint64_t v = j * l->world + rank;
            bool is_pad = v >= l->n;
            pos[count] = is_pad ? (v - l->n) % l->pad_cycle : v;
            if (pad)
                pad[count] = is_pad;
            nreal += !is_pad;
            count++;
        }
    } else if (l->tail_b && step == l->steps - 1) {
        uint64_t v0 = step * l->g + rank * l->tail_b;
        for (uint64_t v = v0; v < v0 + l->tail_b && v < l->n + l->tail_pad; v++) {
            bool is_pad = v >= l->n;
            pos[count] = is_pad ? v - l->n : v;
            if (pad)
                pad[count] = is_pad;
            nreal += !is_pad;
            count++;
        }
    } else {
        uint64_t v0 = step * l->g + rank * l->b;
        for (uint64_t v = v0; v < v0 + l->b; v++) {
            bool is_pad = v >= l->n;
            if (is_pad && l->uneven_tail)
                break; /* even_batches off: the tail batch is yielded short */
            pos[count] = is_pad ? (v - l->n) % l->pad_cycle : v;
            if (pad)
                pad[count] = is_pad;
            nreal += !is_pad;
            count++;
        }
    }
    *real = nreal;
    return count;
}

uint64_t bw__layout_consumed(const bw__layout *l, uint64_t k)
{
    if (k >= bw__layout_max_steps(l))
        return l->n;
    uint64_t per_step = l->mode == BW__MODE_TORCH ? l->b * l->world : l->g;
    /* k < steps keeps k * per_step within the padded sequence, so no overflow. */
    uint64_t c = k * per_step;
    return c < l->n ? c : l->n;
}

uint64_t bw__sampler_reference_len(const bw__sampler_cfg *cfg, uint64_t rank)
{
    uint64_t n = cfg->num_samples, B = cfg->batch_size, R = cfg->world_size;
    if (cfg->mode == BW__MODE_TORCH) {
        bw__layout l;
        bw__layout_init(&l, cfg, n, R);
        return l.steps;
    }
    if (cfg->mode == BW__MODE_ITERABLE) {
        /* IterableDatasetShard.__len__ counts elements and ignores split_batches. */
        uint64_t g = B * R;
        return (cfg->drop_last ? n / g : ceil_div(n, g)) * B;
    }
    uint64_t nb = cfg->drop_last ? n / B : ceil_div(n, B); /* len(BatchSampler) */
    if (cfg->split_batches || nb % R == 0)
        return cfg->split_batches ? nb : nb / R;
    if (cfg->drop_last)
        return nb / R;
    if (cfg->even_batches)
        return nb / R + 1;
    return nb / R + (rank < nb % R);
}
