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
}

uint32_t bw__job_epoch_world(const Batchwire__V1__WorldSegment *const *history, size_t n,
                             uint64_t epoch)
{
    uint32_t world = history[0]->world_size;
    for (size_t i = 0; i < n; i++) {
        const Batchwire__V1__WorldSegment *g = history[i];
        if (g->epoch < epoch || (g->epoch == epoch && g->start_step == 0))
            world = g->world_size;
    }
    return world;
}

int bw__job_sampler_new(const Batchwire__V1__SamplerConfig *sc, uint64_t length,
                        const Batchwire__V1__WorldSegment *const *history, size_t n, uint64_t epoch,
                        bool counts_only, bw__sampler **out, char *err, size_t errlen)
{
    *out = NULL;
    if (n == 0) {
        snprintf(err, errlen, "the job has no world-size history");
        return BW_INVALID_ARGUMENT;
    }
    bw__sampler_cfg cfg;
    bw__job_sampler_cfg(sc, length, bw__job_epoch_world(history, n, epoch), &cfg);
    if (counts_only)
        cfg.shuffle = false; /* step counts do not depend on the order */
    cfg.epoch = epoch;
    int rc = bw__sampler_new(out, &cfg, err, errlen);
    for (size_t i = 0; rc == BW_OK && i < n; i++) {
        const Batchwire__V1__WorldSegment *g = history[i];
        if (g->epoch == epoch && g->start_step > 0)
            rc = bw__sampler_resize(*out, g->start_step, g->world_size, err, errlen);
    }
    if (rc != BW_OK) {
        bw__sampler_free(*out);
        *out = NULL;
    }
    return rc;
}
