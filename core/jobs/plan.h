/*
 * The planner: the one answer to "how many steps does rank r have in epoch e, and which
 * samples make up its batch at step s". The coordinator (job creation, cursor commits,
 * elastic resume), the client library and `batchwire plan` all call it, so the step-count
 * rule lives here once (docs/semantics.md, docs/streams.md).
 *
 * A plan is one epoch of one job: its sampler configuration, its dataset (a length for
 * map-style jobs; for iterable jobs the record count of each source, and whether the stream
 * is pre-sharded), its world-size history and the epoch. Inside, map-style and plain stream
 * jobs are the sampler core (sampler/sampler.h: torch, accelerate and iterable modes, elastic
 * resizes); a pre-sharded stream gives rank r source r alone (jobs/stream_order.h). Callers
 * never choose between the two: every function below answers for both.
 *
 * Indices: for torch and accelerate jobs, dataset indices; for iterable jobs, positions in
 * the epoch's global stream order (bw__plan_stream_order turns a position into a source and
 * record). Pure: no I/O, no threads, no globals, nothing printed.
 *
 * Errors: functions that can fail return BW_OK or a negative bw_err code and write a sentence
 * naming the cause into err (err may be NULL when errlen is 0). Nothing aborts: allocation
 * failures are BW_NOMEM.
 *
 * Threads: a plan is immutable once made; any number of threads may call the functions that
 * take a const plan concurrently. bw__plan_free must not race with them.
 */
#ifndef BW_JOBS_PLAN_H
#define BW_JOBS_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data.pb-c.h"
#include "jobs.pb-c.h"
#include "jobs/mixture.h"
#include "jobs/stream_order.h"
#include "sampler/sampler.h"

typedef struct bw__plan bw__plan;

/* What a plan is made from. Everything is borrowed for the duration of bw__plan_new only. */
typedef struct bw__plan_spec {
    /* The sampler's settings (mode, batch_size, shuffle, seed, shuffle_algo, drop_last,
     * sampler_drop_last, split_batches, even_batches). num_samples is the dataset length of a
     * torch or accelerate job (an iterable job's length is the sum of `records`); world_size
     * and epoch are ignored: the history and the epoch given to bw__plan_new decide them. */
    bw__sampler_cfg sampler;
    /* Iterable jobs: the record count of each source in declared order (nsources >= 1).
     * Ignored for torch and accelerate jobs. */
    const uint64_t *records;
    size_t nsources;
    bool pre_sharded;     /* iterable: source r belongs to rank r (one source per rank) */
    bool shuffle_sources; /* iterable: the sources' order is reshuffled each epoch */
    /* The job's world-size history (at least one segment, in the order recorded): the world
     * size an epoch starts with, and the elastic resizes inside it. */
    const Batchwire__V1__WorldSegment *const *history;
    size_t nhistory;
    /* Torch and accelerate jobs over a weighted mixture (docs/semantics.md, "Mixtures"), or
     * NULL: the sampler then orders the positions of the epoch's mixture (num_samples is
     * ignored: the mixture's end decides it; shuffle is refused, the mixture orders itself)
     * and bw__plan_batch answers positions, which bw__plan_mixture turns into (source,
     * index). */
    const bw__mix_spec *mix;
} bw__plan_spec;

/*
 * Makes the plan of `epoch`. The configuration is checked as given: the sampler core's rules
 * (also for every resize the history records in the epoch), and for a pre-sharded stream one
 * source per rank, no resize inside the epoch and no source left without records while its
 * peers have batches. With counts_only nothing of size n is computed (O(sources)): step
 * counts, world size and stream positions are exact, but bw__plan_batch answers
 * BW_FAILED_PRECONDITION.
 * Returns BW_OK with a new plan in *out (free with bw__plan_free), or BW_INVALID_ARGUMENT /
 * BW_NOMEM with a sentence in err, and *out NULL.
 */
int bw__plan_new(const bw__plan_spec *spec, uint64_t epoch, bool counts_only, bw__plan **out,
                 char *err, size_t errlen);

/*
 * bw__plan_new for a job as the coordinator records it: config->sampler, config->dataset's
 * pre_sharded flag, the dataset description `info` (its length, or its sources' record
 * counts for iterable jobs; a mixture's: each source's size in sources[j].records, E in
 * length, config->mixture the weights) and history[0..nhistory). First refuses what
 * bw__job_check_data (jobs/job_check.h) refuses for the epoch's world size. Same results as
 * bw__plan_new.
 */
int bw__plan_new_for_job(const Batchwire__V1__JobConfig *config,
                         const Batchwire__V1__DatasetInfo *info,
                         const Batchwire__V1__WorldSegment *const *history, size_t nhistory,
                         uint64_t epoch, bool counts_only, bw__plan **out, char *err,
                         size_t errlen);

/* Accepts NULL. */
void bw__plan_free(bw__plan *p);

/* The epoch planned. */
uint64_t bw__plan_epoch(const bw__plan *p);

/* The sampler settings the plan was made with (world_size: the epoch's initial world size;
 * num_samples: the dataset or stream length). Borrowed; lives as long as the plan. */
const bw__sampler_cfg *bw__plan_config(const bw__plan *p);

/* Whether this is a pre-sharded stream (source r is rank r's). */
bool bw__plan_pre_sharded(const bw__plan *p);

/* The world size after the epoch's last resize, and the step it starts at (0 unless
 * resized): ranks of that world run steps [first_step, end_step). */
uint64_t bw__plan_world_size(const bw__plan *p);
uint64_t bw__plan_first_step(const bw__plan *p);

/*
 * One past the last step of `rank` in this epoch: the step-count rule. Torch, accelerate and
 * plain streams: the sampler's (every rank equal, except accelerate with even_batches and
 * drop_last off); pre-sharded streams: every rank as many steps as the layout gives (the
 * longest source's batches, or with drop_last the shortest's). A rank not below the world
 * size gets first_step (no steps).
 */
uint64_t bw__plan_end_step(const bw__plan *p, uint64_t rank);

/* True when every rank of the current world has the same end_step. */
bool bw__plan_equal_batches(const bw__plan *p);

/* Most samples one batch can hold: size bw__batch's arrays with it. */
size_t bw__plan_max_batch(const bw__plan *p);

/*
 * Batch `step` of `rank`: out->indices (dataset indices, or stream positions for iterable
 * jobs), out->padding (may be NULL) flags padding duplicates, out->count and out->real. The
 * caller's arrays need bw__plan_max_batch slots. O(1) (the epoch's order was computed once).
 * Returns BW_OK; BW_END_OF_EPOCH when the rank has no such step; BW_INVALID_ARGUMENT when
 * rank is not below the world size at that step; BW_FAILED_PRECONDITION for a counts-only
 * plan. On error out->count and out->real are 0.
 */
int bw__plan_batch(const bw__plan *p, uint64_t rank, uint64_t step, bw__batch *out);

/* Stream positions one step of every rank of the current world consumes (per-rank batch
 * times world size). */
uint64_t bw__plan_step_positions(const bw__plan *p);

/*
 * Iterable jobs: the global stream position once `rank` has run `step` steps (counted from
 * the epoch's start), where its cursor resumes. Plain streams: the positions every rank
 * consumed together, min(stream length, step * step positions) without a resize; pre-sharded:
 * the position after the records of source `rank` consumed (0 for a rank not below the world
 * size). Torch and accelerate jobs: the positions of the epoch's order consumed (the same
 * prefix rule).
 */
uint64_t bw__plan_stream_position(const bw__plan *p, uint64_t rank, uint64_t step);

/* Iterable jobs: records of source `src` consumed once `rank` has run `step` steps (0 for a
 * source that is not the rank's own in a pre-sharded stream). 0 for other jobs. */
uint64_t bw__plan_source_records(const bw__plan *p, uint64_t rank, uint32_t src, uint64_t step);

/* Mixture jobs: the epoch's order (position -> source, index: bw__mixture_at); borrowed,
 * lives as long as the plan. NULL for other jobs. bw__plan_batch answers positions of it. */
const bw__mixture *bw__plan_mixture(const bw__plan *p);

/*
 * bw__plan_batch, then for a mixture job each position turned into its source (sources[],
 * bw__plan_max_batch slots), the index within that source (out->indices) and, unless passes is
 * NULL, its pass (passes[], as many slots); for other jobs sources[] and passes[] are left
 * alone. Same results as bw__plan_batch.
 */
int bw__plan_mix_batch(const bw__plan *p, uint64_t rank, uint64_t step, bw__batch *out,
                       uint32_t *sources, uint64_t *passes);

/* Iterable jobs: the epoch's source order (position <-> source and record); borrowed, lives
 * as long as the plan. NULL for torch and accelerate jobs. */
const bw__stream_order *bw__plan_stream_order(const bw__plan *p);

#endif
