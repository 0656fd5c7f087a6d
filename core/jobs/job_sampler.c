/* A job's sampler (job_sampler.h): the sampler core configured from a job's configuration
 * and world-size history, for the planner. */
#include "jobs/job_sampler.h"

#include <stdio.h>

#include "batchwire/batchwire.h"

void bw__job_sampler_cfg(const Batchwire__V1__SamplerConfig *sc, uint64_t length, uint32_t world,
                         bw__sampler_cfg *out)
{
    bw__sampler_cfg_init(out);
    out->num_samples = length;
    out->world_size = world;
    if (!sc)
        return;
    out->mode = sc->mode == BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ACCELERATE
                    ? BW__MODE_ACCELERATE
                : sc->mode == BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ITERABLE ? BW__MODE_ITERABLE
                                                                                 : BW__MODE_TORCH;
    out->batch_size = sc->batch_size;
    out->shuffle = sc->shuffle;
    out->seed = (uint64_t)sc->seed;
    out->shuffle_algo = sc->shuffle_algo == BATCHWIRE__V1__SHUFFLE_ALGO__SHUFFLE_ALGO_FEISTEL
                            ? BW__SHUFFLE_FEISTEL
                            : BW__SHUFFLE_TORCH;
    out->drop_last = sc->drop_last;
    out->sampler_drop_last = sc->sampler_drop_last;
    out->split_batches = sc->split_batches;
    out->even_batches = !sc->uneven_batches;
    out->dispatch_batches = sc->dispatch_batches;
    /* Jobs recorded before single_process_plain existed keep BatchSamplerShard's padding. */
    out->shard_single_process = !sc->single_process_plain;
}

/* The segment whose world size epoch `epoch` starts with: the first one recorded at its step
 * 0, else the last one of an earlier epoch (history[0] when there is none). */
static size_t epoch_start(const Batchwire__V1__WorldSegment *const *history, size_t n,
                          uint64_t epoch)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const Batchwire__V1__WorldSegment *g = history[i];
        if (g->epoch == epoch && g->start_step == 0)
            return i;
        if (g->epoch < epoch)
            at = i;
    }
    return at;
}

uint32_t bw__job_epoch_world(const Batchwire__V1__WorldSegment *const *history, size_t n,
                             uint64_t epoch)
{
    return history[epoch_start(history, n, epoch)]->world_size;
}

int bw__job_sampler_new_cfg(const bw__sampler_cfg *given,
                            const Batchwire__V1__WorldSegment *const *history, size_t n,
                            uint64_t epoch, bool counts_only, bw__sampler **out, char *err,
                            size_t errlen)
{
    *out = NULL;
    if (n == 0) {
        snprintf(err, errlen, "the job has no world-size history");
        return BW_INVALID_ARGUMENT;
    }
    size_t start = epoch_start(history, n, epoch);
    bw__sampler_cfg cfg = *given;
    cfg.world_size = history[start]->world_size;
    cfg.epoch = epoch;
    int rc = bw__sampler_cfg_check(&cfg, err, errlen);
    if (rc != BW_OK)
        return rc;
    if (counts_only) {
        /* Step counts do not depend on the order: skip computing it (and the feistel
         * setting, which only means something with shuffle). */
        cfg.shuffle = false;
        cfg.shuffle_algo = BW__SHUFFLE_TORCH;
    }
    rc = bw__sampler_new(out, &cfg, err, errlen);
    /* Every later segment of this epoch is a resize, at step 0 too: exactly what was checked
     * when it was recorded (a resize at the end of an epoch leaves nothing to run). */
    for (size_t i = start + 1; rc == BW_OK && i < n; i++) {
        const Batchwire__V1__WorldSegment *g = history[i];
        if (g->epoch == epoch)
            rc = bw__sampler_resize(*out, g->start_step, g->world_size, err, errlen);
    }
    if (rc != BW_OK) {
        bw__sampler_free(*out);
        *out = NULL;
    }
    return rc;
}
