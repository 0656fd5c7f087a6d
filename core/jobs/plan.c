/*
 * The planner over its two layouts. The sampler core answers for torch, accelerate and plain
 * streams; a pre-sharded stream keeps the sampler for what it shares with them (world size,
 * first step, per-rank batch size) and takes its step count and batches from the pre-sharded
 * layout, whose record numbers become positions in the epoch's stream.
 */
#include "jobs/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "jobs/job_check.h"
#include "jobs/job_sampler.h"

struct bw__plan {
    uint64_t epoch;
    bool counts_only;
    bw__sampler *sampler;
    bool iterable, pre_sharded;
    bw__stream_order order; /* iterable jobs: the epoch's sources */
    bw__preshard ps;        /* pre-sharded: its counts point into order.counts */
};

int bw__plan_new(const bw__plan_spec *spec, uint64_t epoch, bool counts_only, bw__plan **out,
                 char *err, size_t errlen)
{
    *out = NULL;
    bw__plan *p = calloc(1, sizeof(*p));
    if (!p) {
        snprintf(err, errlen, "out of memory making the plan of epoch %llu",
                 (unsigned long long)epoch);
        return BW_NOMEM;
    }
    p->epoch = epoch;
    p->counts_only = counts_only;
    p->iterable = spec->sampler.mode == BW__MODE_ITERABLE;
    p->pre_sharded = spec->pre_sharded;
    bw__sampler_cfg cfg = spec->sampler;
    int rc = BW_OK;
    if (p->iterable) {
        rc = bw__stream_order_init(&p->order, spec->records, spec->nsources, spec->shuffle_sources,
                                   cfg.seed, epoch, err, errlen);
        cfg.num_samples = p->order.total;
    }
    if (rc == BW_OK)
        rc = bw__job_sampler_new_cfg(&cfg, spec->history, spec->nhistory, epoch, counts_only,
                                     &p->sampler, err, errlen);
    /* The layout is checked against the world size that runs the epoch's last steps. */
    if (rc == BW_OK)
        rc =
            bw__job_check_layout(cfg.mode, spec->pre_sharded, spec->nsources, spec->shuffle_sources,
                                 bw__sampler_world_size(p->sampler), err, errlen);
    if (rc == BW_OK && p->pre_sharded && bw__sampler_first_step(p->sampler) > 0) {
        snprintf(err, errlen,
                 "a pre-sharded stream cannot change its world size inside an epoch (source r "
                 "is rank r's); epoch %llu was resized at step %llu",
                 (unsigned long long)epoch, (unsigned long long)bw__sampler_first_step(p->sampler));
        rc = BW_INVALID_ARGUMENT;
    }
    if (rc == BW_OK && p->pre_sharded)
        rc = bw__preshard_init(&p->ps, p->order.counts, spec->nsources,
                               bw__sampler_max_batch(p->sampler), cfg.drop_last, err, errlen);
    if (rc != BW_OK) {
        bw__plan_free(p);
        return rc;
    }
    *out = p;
    return BW_OK;
}

int bw__plan_new_for_job(const Batchwire__V1__JobConfig *config,
                         const Batchwire__V1__DatasetInfo *info,
                         const Batchwire__V1__WorldSegment *const *history, size_t nhistory,
                         uint64_t epoch, bool counts_only, bw__plan **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!config || !info) {
        snprintf(err, errlen, "the job has no %s",
                 config ? "dataset description" : "configuration");
        return BW_INVALID_ARGUMENT;
    }
    if (nhistory == 0) {
        snprintf(err, errlen, "the job has no world-size history");
        return BW_INVALID_ARGUMENT;
    }
    const Batchwire__V1__SamplerConfig *sc = config->sampler;
    bw__plan_spec spec;
    memset(&spec, 0, sizeof(spec));
    bw__job_sampler_cfg(sc, info->length, 1, &spec.sampler);
    /* The configuration's own rules first, then the dataset's (the order of the refusals). */
    bw__sampler_cfg first = spec.sampler;
    first.world_size = bw__job_epoch_world(history, nhistory, epoch);
    int rc = bw__sampler_cfg_check(&first, err, errlen);
    if (rc == BW_OK)
        rc = bw__job_check_data(config, info, (uint32_t)first.world_size, err, errlen);
    if (rc != BW_OK)
        return rc;
    uint64_t *records = NULL;
    if (spec.sampler.mode == BW__MODE_ITERABLE) {
        records = calloc(info->n_sources ? info->n_sources : 1, sizeof(*records));
        if (!records) {
            snprintf(err, errlen, "out of memory for the record counts of %zu sources",
                     info->n_sources);
            return BW_NOMEM;
        }
        for (size_t i = 0; i < info->n_sources; i++)
            records[i] = info->sources[i]->records;
    }
    spec.records = records;
    spec.nsources = info->n_sources;
    spec.pre_sharded = config->dataset && config->dataset->pre_sharded;
    spec.shuffle_sources = sc && sc->shuffle_sources;
    spec.history = history;
    spec.nhistory = nhistory;
    rc = bw__plan_new(&spec, epoch, counts_only, out, err, errlen);
    free(records);
    return rc;
}

void bw__plan_free(bw__plan *p)
{
    if (!p)
        return;
    bw__sampler_free(p->sampler);
    bw__stream_order_free(&p->order);
    free(p);
}

uint64_t bw__plan_epoch(const bw__plan *p)
{
    return p->epoch;
}

const bw__sampler_cfg *bw__plan_config(const bw__plan *p)
{
    return bw__sampler_config(p->sampler);
}

bool bw__plan_pre_sharded(const bw__plan *p)
{
    return p->pre_sharded;
}

uint64_t bw__plan_world_size(const bw__plan *p)
{
    return bw__sampler_world_size(p->sampler);
}

uint64_t bw__plan_first_step(const bw__plan *p)
{
    return bw__sampler_first_step(p->sampler);
}

uint64_t bw__plan_end_step(const bw__plan *p, uint64_t rank)
{
    if (!p->pre_sharded)
        return bw__sampler_end_step(p->sampler, rank);
    /* Every rank reads its own source: as many steps as the layout gives every rank (a
     * pre-sharded epoch is never resized, so it starts at step 0). */
    return rank < p->ps.world ? p->ps.steps : 0;
}

bool bw__plan_equal_batches(const bw__plan *p)
{
    return p->pre_sharded || bw__sampler_equal_batches(p->sampler);
}

size_t bw__plan_max_batch(const bw__plan *p)
{
    return bw__sampler_max_batch(p->sampler);
}

int bw__plan_batch(const bw__plan *p, uint64_t rank, uint64_t step, bw__batch *out)
{
    out->count = 0;
    out->real = 0;
    if (p->counts_only)
        return BW_FAILED_PRECONDITION;
    if (!p->pre_sharded)
        return bw__sampler_batch(p->sampler, rank, step, out);
    if (rank >= p->ps.world)
        return BW_INVALID_ARGUMENT;
    size_t n =
        bw__preshard_batch(&p->ps, (size_t)rank, step, out->indices, out->padding, &out->real);
    if (n == 0)
        return BW_END_OF_EPOCH;
    for (size_t i = 0; i < n; i++)
        out->indices[i] = bw__stream_order_position(&p->order, (uint32_t)rank, out->indices[i]);
    out->count = n;
    return BW_OK;
}

uint64_t bw__plan_step_positions(const bw__plan *p)
{
    return (uint64_t)bw__sampler_max_batch(p->sampler) * bw__sampler_world_size(p->sampler);
}

uint64_t bw__plan_stream_position(const bw__plan *p, uint64_t rank, uint64_t step)
{
    if (!p->pre_sharded)
        return bw__sampler_position(p->sampler, step);
    if (rank >= p->ps.world)
        return 0;
    return bw__stream_order_position(&p->order, (uint32_t)rank,
                                     bw__plan_source_records(p, rank, (uint32_t)rank, step));
}

uint64_t bw__plan_source_records(const bw__plan *p, uint64_t rank, uint32_t src, uint64_t step)
{
    if (!p->iterable || src >= p->order.nsources)
        return 0;
    if (p->pre_sharded) {
        return src == rank ? bw__preshard_consumed(&p->ps, (size_t)rank, step) : 0;
    }
    return bw__stream_order_consumed(&p->order, src, bw__sampler_position(p->sampler, step));
}

const bw__stream_order *bw__plan_stream_order(const bw__plan *p)
{
    return p->iterable ? &p->order : NULL;
}
