/* A job's sampler: the pure sampler core configured from a job's protobuf configuration and
 * its world-size history. Shared by the coordinator (checks) and the client (batches), so
 * both compute the same order. */
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

/* The world size epoch `epoch` starts with, from history[0..n) (n >= 1). */
uint32_t bw__job_epoch_world(const Batchwire__V1__WorldSegment *const *history, size_t n,
                             uint64_t epoch);

/*
 * The sampler of `epoch` with every resize recorded for that epoch applied. With
 * counts_only the order is not computed (O(1)): enough for step counts and checks, not for
 * indices. Returns BW_OK or an error with a sentence in err (then *out is NULL).
 */
int bw__job_sampler_new(const Batchwire__V1__SamplerConfig *sc, uint64_t length,
                        const Batchwire__V1__WorldSegment *const *history, size_t n, uint64_t epoch,
                        bool counts_only, bw__sampler **out, char *err, size_t errlen);

#endif
