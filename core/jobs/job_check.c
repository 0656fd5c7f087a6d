#include "jobs/job_check.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"

int bw__job_format_is_stream(const char *format)
{
    static const char *const streams[] = {"tfrecord", "jsonl", "text", "tar"};
    for (size_t i = 0; format && i < sizeof(streams) / sizeof(streams[0]); i++)
        if (strcmp(format, streams[i]) == 0)
            return 1;
    return 0;
}

int bw__job_check_data(const Batchwire__V1__JobConfig *config,
                       const Batchwire__V1__DatasetInfo *info, uint32_t world, char *err,
                       size_t errlen)
{
    const Batchwire__V1__Dataset *spec = config ? config->dataset : NULL;
    const Batchwire__V1__SamplerConfig *smp = config ? config->sampler : NULL;
    if (!smp)
        return BW_OK;
    bool iterable = smp->mode == BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ITERABLE;
    bool pre_sharded = spec && spec->pre_sharded;
    if (pre_sharded && !iterable) {
        uint64_t r = world;
        snprintf(err, errlen,
                 "the dataset is pre-sharded (one source per rank, already split by its writer) "
                 "and %s mode would shard it again: each rank would get 1/%" PRIu64
                 " of its 1/%" PRIu64 " shard, 1/%" PRIu64 " of the data (double sharding). "
                 "Use mode iterable, which serves source r to rank r as it is",
                 smp->mode == BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ACCELERATE ? "accelerate"
                                                                                   : "torch",
                 r, r, r * r);
        return BW_INVALID_ARGUMENT;
    }
    if (!iterable)
        return BW_OK;
    if (!spec || !info || !bw__job_format_is_stream(info->format)) {
        snprintf(err, errlen,
                 "iterable mode reads streams (tfrecord, jsonl, text or tar); dataset format "
                 "'%s' is map-style: use torch or accelerate mode",
                 info && info->format ? info->format : "synthetic");
        return BW_INVALID_ARGUMENT;
    }
    if (info->n_sources == 0) {
        snprintf(err, errlen, "the stream has no sources");
        return BW_INVALID_ARGUMENT;
    }
    if (pre_sharded && info->n_sources != world) {
        snprintf(err, errlen,
                 "a pre-sharded stream has one source per rank: its %zu sources do not match "
                 "world size %u",
                 info->n_sources, world);
        return BW_INVALID_ARGUMENT;
    }
    if (pre_sharded && smp->shuffle_sources) {
        snprintf(err, errlen,
                 "shuffle: a pre-sharded stream's source r belongs to rank r; its sources "
                 "cannot be reordered");
        return BW_INVALID_ARGUMENT;
    }
    return BW_OK;
}
