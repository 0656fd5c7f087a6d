/* Checks of a job's configuration against its dataset (job_check.h): the modes a format
 * allows, what a pre-sharded stream needs, and where a transform may run. */
#include "jobs/job_check.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "jobs/job_sampler.h"
#include "transform/transform.h"

int bw__job_format_is_stream(const char *format)
{
    static const char *const streams[] = {"tfrecord", "jsonl", "text", "tar"};
    for (size_t i = 0; format && i < sizeof(streams) / sizeof(streams[0]); i++)
        if (strcmp(format, streams[i]) == 0)
            return 1;
    return 0;
}

int bw__job_check_layout(bw__sampler_mode mode, bool pre_sharded, size_t nsources,
                         bool shuffle_sources, uint64_t world, char *err, size_t errlen)
{
    bool iterable = mode == BW__MODE_ITERABLE;
    if (pre_sharded && !iterable) {
        snprintf(err, errlen,
                 "the dataset is pre-sharded (one source per rank, already split by its writer) "
                 "and %s mode would shard it again: each rank would get 1/%" PRIu64
                 " of its 1/%" PRIu64 " shard, 1/%" PRIu64 " of the data (double sharding). "
                 "Use mode iterable, which serves source r to rank r as it is",
                 bw__sampler_mode_name(mode), world, world, world * world);
        return BW_INVALID_ARGUMENT;
    }
    if (!iterable)
        return BW_OK;
    if (nsources == 0) {
        snprintf(err, errlen, "the stream has no sources");
        return BW_INVALID_ARGUMENT;
    }
    if (pre_sharded && nsources != world) {
        snprintf(err, errlen,
                 "a pre-sharded stream has one source per rank: its %zu sources do not match "
                 "world size %" PRIu64,
                 nsources, world);
        return BW_INVALID_ARGUMENT;
    }
    if (pre_sharded && shuffle_sources) {
        snprintf(err, errlen,
                 "shuffle: a pre-sharded stream's source r belongs to rank r; its sources "
                 "cannot be reordered");
        return BW_INVALID_ARGUMENT;
    }
    return BW_OK;
}

int bw__job_check_transform(const char *transform, const char *field, const char *format,
                            bool iterable, char *canon, size_t canonlen, char *err, size_t errlen)
{
    char why[512];
    bw__tf_spec spec;
    bw__tf_shape shape;
    field = field && field[0] ? field : NULL;
    if (!transform || !transform[0]) {
        if (canonlen)
            canon[0] = '\0';
        if (!field)
            return BW_OK;
        snprintf(err, errlen, "transform_field '%s' given without a transform", field);
        return BW_INVALID_ARGUMENT;
    }
    if (bw__tf_parse(transform, &spec, why, sizeof(why)) != BW_OK ||
        (!bw__tf_is_tokens(&spec) &&
         bw__tf_output_shape(&spec, &shape, why, sizeof(why)) != BW_OK)) {
        snprintf(err, errlen, "transform '%s': %s", transform, why);
        return BW_INVALID_ARGUMENT;
    }
    if (bw__tf_format(&spec, canon, canonlen) < 0) {
        snprintf(err, errlen, "transform '%s': its canonical text is longer than %zu bytes",
                 transform, canonlen ? canonlen - 1 : 0);
        return BW_INVALID_ARGUMENT;
    }
    if (iterable) {
        snprintf(err, errlen,
                 "transform: iterable mode reads streams, which workers do not transform; use "
                 "torch or accelerate mode");
        return BW_INVALID_ARGUMENT;
    }
    if (field && strlen(field) >= BW_JOB_FIELD_MAX) {
        snprintf(err, errlen, "transform_field '%.64s...': longer than %d bytes", field,
                 BW_JOB_FIELD_MAX - 1);
        return BW_INVALID_ARGUMENT;
    }
    bool jsonl = format && strcmp(format, "jsonl") == 0;
    if (jsonl && !field) {
        snprintf(err, errlen,
                 "transform on a jsonl dataset: give transform_field, the key whose value it "
                 "transforms (e.g. image: a base64 string, or ids: an array of integers)");
        return BW_INVALID_ARGUMENT;
    }
    if (bw__tf_is_tokens(&spec)) {
        /* Token arrays: the rows of an npy dataset, or a JSON Lines field's arrays
         * (docs/transforms.md, "Token arrays", "JSON Lines fields"). */
        if (jsonl) {
            if (bw__tf_tokens_json_shape(&spec, &shape, why, sizeof(why)) != BW_OK) {
                snprintf(err, errlen, "transform '%s' on jsonl field '%s': %s", transform, field,
                         why);
                return BW_INVALID_ARGUMENT;
            }
            return BW_OK;
        }
        if (!format || strcmp(format, "npy") != 0 || field) {
            snprintf(err, errlen,
                     "transform '%s': token ops (truncate, pad) read the rows of an npy dataset "
                     "or a jsonl field (with transform_field); %s%s%s",
                     transform,
                     field ? "transform_field is for tar members and jsonl keys, and " : "",
                     format ? "this dataset's format is " : "this job reads no dataset files",
                     format ? format : "");
            return BW_INVALID_ARGUMENT;
        }
        return BW_OK;
    }
    if (!format) {
        snprintf(err, errlen,
                 "transform: this job reads no dataset files (a synthetic dataset, or a mixture, "
                 "whose sources workers do not transform yet); a transform reads files (one "
                 "image per file), tar or jsonl (with transform_field)");
        return BW_INVALID_ARGUMENT;
    }
    bool tar = strcmp(format, "tar") == 0;
    if (!tar && !jsonl && strcmp(format, "files") != 0) {
        snprintf(err, errlen,
                 "transform: dataset format '%s' holds no images to decode; a transform reads "
                 "files (one image per file), tar or jsonl (with transform_field)",
                 format);
        return BW_INVALID_ARGUMENT;
    }
    if (tar && !field) {
        snprintf(err, errlen,
                 "transform on a tar dataset: give transform_field, the member it transforms "
                 "(e.g. jpg)");
        return BW_INVALID_ARGUMENT;
    }
    if (!tar && !jsonl && field) {
        snprintf(err, errlen,
                 "transform_field '%s': format '%s' has no members or keys (only tar and jsonl "
                 "have)",
                 field, format);
        return BW_INVALID_ARGUMENT;
    }
    return BW_OK;
}

int bw__job_check_data(const Batchwire__V1__JobConfig *config,
                       const Batchwire__V1__DatasetInfo *info, uint32_t world, char *err,
                       size_t errlen)
{
    const Batchwire__V1__Dataset *spec = config ? config->dataset : NULL;
    const Batchwire__V1__SamplerConfig *smp = config ? config->sampler : NULL;
    if (!smp)
        return BW_OK;
    bw__sampler_cfg cfg;
    bw__job_sampler_cfg(smp, 0, world, &cfg);
    bw__sampler_mode mode = cfg.mode;
    bool pre_sharded = spec && spec->pre_sharded;
    if (mode == BW__MODE_ITERABLE && (!spec || !info || !bw__job_format_is_stream(info->format))) {
        snprintf(err, errlen,
                 "iterable mode reads streams (tfrecord, jsonl, text or tar); dataset format "
                 "'%s' is map-style: use torch or accelerate mode",
                 info && info->format ? info->format : "synthetic");
        return BW_INVALID_ARGUMENT;
    }
    char canon[BW_TF_CANON_MAX];
    int rc = bw__job_check_transform(config->transform, config->transform_field,
                                     spec && spec->format && spec->format[0] ? spec->format : NULL,
                                     mode == BW__MODE_ITERABLE, canon, sizeof(canon), err, errlen);
    if (rc == BW_OK && config->transform && config->transform[0] &&
        strcmp(canon, config->transform) != 0) {
        /* The fingerprint hashes the text: one transform must have one spelling. */
        snprintf(err, errlen, "transform '%s' is not in its canonical form '%s'", config->transform,
                 canon);
        rc = BW_INVALID_ARGUMENT;
    }
    if (rc == BW_OK && config->transform && config->transform[0] && info &&
        !(config->transform_field && config->transform_field[0])) {
        /* Token ops on npy need the dataset's values: 1-D rows of numbers, pad's value one of
         * them (a jsonl field's are int64, checked above). */
        bw__tf_spec tf;
        bw__tf_shape shape;
        char why[512];
        const Batchwire__V1__SampleLayout *lay = info->layout;
        if (bw__tf_parse(config->transform, &tf, why, sizeof(why)) == BW_OK &&
            bw__tf_is_tokens(&tf) &&
            bw__tf_tokens_shape(&tf, lay ? lay->dtype : NULL, lay ? lay->shape : NULL,
                                lay ? lay->n_shape : 0, &shape, why, sizeof(why)) != BW_OK) {
            snprintf(err, errlen, "transform '%s': %s", config->transform, why);
            rc = BW_INVALID_ARGUMENT;
        }
    }
    if (rc != BW_OK)
        return rc;
    return bw__job_check_layout(mode, pre_sharded, info ? info->n_sources : 0, smp->shuffle_sources,
                                world, err, errlen);
}
