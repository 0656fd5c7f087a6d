/* A job's sampler: the pure sampler core configured from a job's configuration and its
 * world-size history. The planner's internals (jobs/plan.h): callers use the planner, so that
 * step counts and batches follow one rule. */
#ifndef BW_JOBS_JOB_SAMPLER_H
#define BW_JOBS_JOB_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jobs.pb-c.h"
#include "sampler/sampler.h"

/* The sampler configuration of `sc` for a dataset of `length` samples at world size `world`
 * (sc NULL: the sampler core's defaults). */
void bw__job_sampler_cfg(const Batchwire__V1__SamplerConfig *sc, uint64_t length, uint32_t world,
                         bw__sampler_cfg *out);

/* The world size epoch `epoch` starts with, from history[0..n) (n >= 1, in the order
 * recorded): the first segment recorded at the epoch's step 0, else the last segment of an
 * earlier epoch. Later segments of the epoch, at step 0 too, are resizes. */
uint32_t bw__job_epoch_world(const Batchwire__V1__WorldSegment *const *history, size_t n,
                             uint64_t epoch);

/*
 * The sampler of `epoch` for `cfg` (its num_samples and every option; its world_size and
 * epoch are ignored: the history and `epoch` decide them) with every resize recorded for that
 * epoch applied. The configuration is checked as given; with counts_only the order is then
 * not computed (O(1)): enough for step counts and checks, not for indices. Returns BW_OK or
 * BW_INVALID_ARGUMENT / BW_NOMEM with a sentence in err (then *out is NULL).
 */
int bw__job_sampler_new_cfg(const bw__sampler_cfg *cfg,
                            const Batchwire__V1__WorldSegment *const *history, size_t n,
                            uint64_t epoch, bool counts_only, bw__sampler **out, char *err,
                            size_t errlen);

#endif
