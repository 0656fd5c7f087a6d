/*
 * The sampler core: which sample indices rank r receives at step s of epoch e.
 *
 * A pure function of the configuration, the dataset length, the seed and the epoch
 * (docs/semantics.md): no I/O, no threads, no globals, nothing printed. Every other part of
 * batchwire (coordinator, workers, client, `batchwire plan`) calls this module, so the same
 * inputs give the same batches everywhere. docs/semantics.md describes the behaviour for
 * users; this header gives the contracts.
 *
 * Modes (bit for bit with the reference named):
 *   torch       DataLoader(batch_size=B, drop_last, sampler=DistributedSampler(num_replicas=R,
 *               rank=r, shuffle, seed, drop_last=sampler_drop_last)) after set_epoch(epoch)
 *   accelerate  Accelerate's BatchSamplerShard(BatchSampler(sampler, B, drop_last), R, r,
 *               split_batches, even_batches), sampler sequential or SeedableRandomSampler
 *   iterable    Accelerate's IterableDatasetShard(stream of n elements, B, drop_last, R, r,
 *               split_batches) under a DataLoader of the per-rank batch size
 *
 * Threads: a bw__sampler is immutable between calls that take a non-const pointer; any
 * number of threads may call the const functions concurrently.
 */
#ifndef BW_SAMPLER_SAMPLER_H
#define BW_SAMPLER_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum bw__sampler_mode {
    BW__MODE_TORCH = 0,
    BW__MODE_ACCELERATE = 1,
    BW__MODE_ITERABLE = 2,
} bw__sampler_mode;

typedef enum bw__shuffle_algo {
    BW__SHUFFLE_TORCH = 0,   /* torch.randperm, bit-exact; needs 4n (n <= 2^32) or 8n bytes */
    BW__SHUFFLE_FEISTEL = 1, /* keyed bijection, O(1) memory; NOT torch-identical */
} bw__shuffle_algo;

typedef struct bw__sampler_cfg {
    bw__sampler_mode mode;
    uint64_t num_samples; /* n: dataset length (iterable: stream length) */
    uint64_t world_size;  /* R >= 1 */
    uint64_t batch_size;  /* B >= 1: per rank, or global with split_batches */
    bool shuffle;         /* torch, accelerate */
    uint64_t seed;        /* 64-bit two's complement; torch uses the low 32 bits of seed+epoch */
    uint64_t epoch;
    bw__shuffle_algo shuffle_algo;
    bool drop_last;         /* torch: the DataLoader's; accelerate: BatchSampler's; iterable */
    bool sampler_drop_last; /* torch only: DistributedSampler's drop_last */
    bool split_batches;     /* accelerate, iterable */
    bool even_batches;      /* accelerate (default true); iterable always pads */
    /* accelerate: Accelerate's DataLoaderDispatcher (dispatch_batches=True): full steps as
     * BatchSamplerShard, the short tail sliced among the ranks (docs/semantics.md) */
    bool dispatch_batches;
    /* accelerate at world size 1: true, BatchSamplerShard's padding (default here, the
     * reference vectors' class); false, the plain BatchSampler's batches that
     * prepare_data_loader gives one process (a short last batch) */
    bool shard_single_process;
} bw__sampler_cfg;

/* Defaults: torch mode, world 1, batch 1, no shuffle, seed 0, epoch 0, even_batches and
 * shard_single_process on. */
void bw__sampler_cfg_init(bw__sampler_cfg *cfg);

/*
 * Checks that the configuration is one batchwire serves. On error returns
 * BW_INVALID_ARGUMENT and writes a sentence naming the parameter into err (may be NULL).
 */
int bw__sampler_cfg_check(const bw__sampler_cfg *cfg, char *err, size_t errlen);

/* Parses "torch" / "accelerate" / "iterable" and "torch" / "feistel"; -1 if unknown. */
int bw__sampler_mode_parse(const char *s);
int bw__shuffle_algo_parse(const char *s);
const char *bw__sampler_mode_name(bw__sampler_mode mode);

/*
 * The length the reference implementation reports for rank `rank` (torch: len(DataLoader);
 * accelerate: BatchSamplerShard.__len__, which can differ from the number of batches it
 * yields; iterable: IterableDatasetShard.__len__, an element count). For parity checks and
 * for users who print len(); batchwire's own step counts come from bw__sampler_end_step.
 */
uint64_t bw__sampler_reference_len(const bw__sampler_cfg *cfg, uint64_t rank);

/* One batch. The caller points indices/padding at arrays of bw__sampler_max_batch() slots. */
typedef struct bw__batch {
    uint64_t *indices; /* sample indices */
    uint8_t *padding;  /* 1 where the sample is a padding duplicate, else 0; may be NULL */
    size_t count;      /* samples in this batch (real + padding) */
    size_t real;       /* samples that are not padding */
} bw__batch;

/* A resume cursor: the next step to deliver in an epoch. */
typedef struct bw__sampler_cursor {
    uint64_t epoch;
    uint64_t step;
} bw__sampler_cursor;

typedef struct bw__sampler bw__sampler;

/*
 * Creates the sampler of one epoch and computes that epoch's order (the only O(n) step;
 * O(1) for sequential and feistel). On error returns BW_INVALID_ARGUMENT or BW_NOMEM with a
 * sentence in err, and *out is NULL. Free with bw__sampler_free.
 */
int bw__sampler_new(bw__sampler **out, const bw__sampler_cfg *cfg, char *err, size_t errlen);

/* Accepts NULL. */
void bw__sampler_free(bw__sampler *s);

/* The configuration (world_size is the epoch's initial world size). Borrowed. */
const bw__sampler_cfg *bw__sampler_config(const bw__sampler *s);

/*
 * Moves to another epoch: recomputes the order (reusing its memory) and forgets resizes.
 * On error the sampler is unusable until a later call succeeds.
 */
int bw__sampler_set_epoch(bw__sampler *s, uint64_t epoch, char *err, size_t errlen);

/*
 * Elastic resume: the epoch ran `at_step` steps (counted from the epoch start) on every rank
 * of the current world size; from step at_step on it continues with `world_size` ranks over
 * the remaining suffix of the epoch's order, with the same batching rules. Calls compose
 * (several resizes in one epoch). at_step must be at least the current world's first step,
 * and either reach no further than the step every rank has, or be the end of the epoch.
 * On error returns BW_INVALID_ARGUMENT with a sentence in err; the sampler is unchanged.
 */
int bw__sampler_resize(bw__sampler *s, uint64_t at_step, uint64_t world_size, char *err,
                       size_t errlen);

/* The current world size and the step it starts at (0 unless resized). */
uint64_t bw__sampler_world_size(const bw__sampler *s);
uint64_t bw__sampler_first_step(const bw__sampler *s);

/* One past the last step of `rank` (< current world size) in this epoch. */
uint64_t bw__sampler_end_step(const bw__sampler *s, uint64_t rank);

/*
 * Positions of the epoch's order consumed once every rank has run `step` steps, counting the
 * last global batch only as far as the order reaches: for the world size that ran step `step`
 * (the segment holding it), the positions consumed before that world started plus
 * min(its remaining positions, (step - its first step) * positions per step), positions per
 * step being batch * world (per-rank batch). Without a resize: min(n, step * b * R). Streams
 * resume at this position (docs/streams.md).
 */
uint64_t bw__sampler_position(const bw__sampler *s, uint64_t step);

/* True when every rank of the current world gets the same number of batches (false only
 * for accelerate with even_batches off and drop_last off when the tail is uneven). */
bool bw__sampler_equal_batches(const bw__sampler *s);

/* Most samples one batch can hold; size the bw__batch arrays with it. */
size_t bw__sampler_max_batch(const bw__sampler *s);

/*
 * Batch `step` of `rank` in O(1) (after the epoch's order is computed): no earlier batch is
 * produced. Steps before the last resize are answered with the world size they ran at.
 * Returns BW_OK; BW_END_OF_EPOCH when the rank has no such step; BW_INVALID_ARGUMENT when
 * rank is not below the world size at that step. Thread-safe (const).
 */
int bw__sampler_batch(const bw__sampler *s, uint64_t rank, uint64_t step, bw__batch *out);

/*
 * The batch at cursor->step for `rank`, then advances cursor->step. BW_END_OF_EPOCH at the
 * end (cursor unchanged); BW_MISMATCH if cursor->epoch is not the sampler's epoch.
 */
int bw__sampler_next(const bw__sampler *s, uint64_t rank, bw__sampler_cursor *cursor,
                     bw__batch *out);

/* Bytes the sampler keeps (mostly the cached permutation). */
size_t bw__sampler_memory(const bw__sampler *s);

#endif
