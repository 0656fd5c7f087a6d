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
#include "common/refuse.h"
#include "jobs/job_check.h"
#include "jobs/job_sampler.h"
#include "transform/transform.h"

struct bw__plan {
    uint64_t epoch;
    bool counts_only;
    bw__sampler *sampler;
    bool iterable, pre_sharded;
    bw__stream_order order; /* iterable jobs: the epoch's sources */
    bw__preshard ps;        /* pre-sharded: its counts point into order.counts */
    bw__mixture *mix;       /* mixture jobs: the epoch's order of positions */
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
    /* A mixture in iterable mode shards its positions as a stream's (docs/semantics.md,
     * "Streams in a mixture"); its stream sources are the mixture's, not a stream order. */
    p->iterable = spec->sampler.mode == BW__MODE_ITERABLE && !spec->mix;
    p->pre_sharded = spec->pre_sharded;
    bw__sampler_cfg cfg = spec->sampler;
    int rc = BW_OK;
    if (spec->mix && cfg.shuffle)
        rc = bw__refuse(err, errlen,
                        "shuffle: a mixture orders its sources itself (a seeded permutation "
                        "within each source, a seeded interleave); leave shuffle off");
    else if (spec->mix &&
             (rc = bw__mixture_new(&p->mix, spec->mix, cfg.seed, epoch, err, errlen)) == BW_OK)
        cfg.num_samples = bw__mixture_end(p->mix);
    if (rc == BW_OK && p->iterable) {
        rc = bw__stream_order_init(&p->order, spec->records, spec->nsources, spec->shuffle_sources,
                                   cfg.seed, epoch, err, errlen);
        cfg.num_samples = p->order.total;
    }
    if (rc == BW_OK)
        rc = bw__job_sampler_new_cfg(&cfg, spec->history, spec->nhistory, epoch, counts_only,
                                     &p->sampler, err, errlen);
    /* The layout is checked against the world size that runs the epoch's last steps. */
    if (rc == BW_OK && !spec->mix)
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

/* bw__plan_new_for_job for a mixture job: the weights from its configuration, the sizes from
 * its description (one SourceInfo per source, made by the coordinator). */
static int plan_new_for_mixture(const Batchwire__V1__JobConfig *config,
                                const Batchwire__V1__DatasetInfo *info,
                                const Batchwire__V1__WorldSegment *const *history, size_t nhistory,
                                uint64_t epoch, bool counts_only, bw__plan **out, char *err,
                                size_t errlen)
{
    const Batchwire__V1__Mixture *mx = config->mixture;
    size_t n = mx->n_sources;
    if (n == 0 || n > BW__MIX_MAX_SOURCES || info->n_sources != n)
        return bw__refuse(err, errlen,
                          "the mixture has %zu sources and its description %zu: from 1 to %d, "
                          "the same number",
                          n, info->n_sources, BW__MIX_MAX_SOURCES);
    uint64_t *sizes = calloc(n, sizeof(*sizes)), *weights = calloc(n, sizeof(*weights));
    bool *streams = calloc(n, sizeof(*streams));
    int rc = sizes && weights && streams ? BW_OK : BW_NOMEM;
    if (rc != BW_OK)
        snprintf(err, errlen, "out of memory for a mixture of %zu sources", n);
    for (size_t j = 0; rc == BW_OK && j < n; j++) {
        sizes[j] = info->sources[j]->records;
        weights[j] = mx->sources[j]->weight;
        streams[j] = mx->sources[j]->stream;
    }
    bw__mix_spec mix = {
        sizes,
        weights,
        n,
        mx->samples,
        streams,
        mx->policy == BATCHWIRE__V1__MIX_POLICY__MIX_POLICY_STOP ? BW__MIX_STOP : BW__MIX_CYCLE};
    bw__plan_spec spec;
    memset(&spec, 0, sizeof(spec));
    bw__job_sampler_cfg(config->sampler, 1, 1, &spec.sampler);
    spec.history = history;
    spec.nhistory = nhistory;
    spec.mix = &mix;
    if (rc == BW_OK) {
        bw__sampler_cfg first = spec.sampler;
        first.world_size = bw__job_epoch_world(history, nhistory, epoch);
        rc = bw__sampler_cfg_check(&first, err, errlen);
    }
    if (rc == BW_OK)
        rc = bw__plan_new(&spec, epoch, counts_only, out, err, errlen);
    free(sizes);
    free(weights);
    free(streams);
    return rc;
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
    if (config->mixture) {
        /* No format: bw__job_check_transform refuses any transform of a mixture (not yet). */
        char canon[BW_TF_CANON_MAX];
        int trc = bw__job_check_transform(config->transform, config->transform_field, NULL, false,
                                          canon, sizeof(canon), err, errlen);
        if (trc != BW_OK)
            return trc;
        return plan_new_for_mixture(config, info, history, nhistory, epoch, counts_only, out, err,
                                    errlen);
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
    bw__mixture_free(p->mix);
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

const bw__mixture *bw__plan_mixture(const bw__plan *p)
{
    return p->mix;
}

int bw__plan_mix_batch(const bw__plan *p, uint64_t rank, uint64_t step, bw__batch *out,
                       uint32_t *sources, uint64_t *passes)
{
    int rc = bw__plan_batch(p, rank, step, out);
    if (rc != BW_OK || !p->mix)
        return rc;
    bw__mixture_at_many(p->mix, out->indices, out->count, sources, out->indices, passes);
    return BW_OK;
}
