/* Checks of a job's configuration against its dataset that neither the sampler nor the
 * dataset alone can make: which modes a format allows, and what a pre-sharded stream needs.
 * The coordinator refuses such a job at creation; the client checks again before reading. */
#ifndef BW_JOBS_JOB_CHECK_H
#define BW_JOBS_JOB_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jobs.pb-c.h"
#include "sampler/sampler.h"

/* Whether `format` is read as a stream in iterable mode (tfrecord, jsonl, text, tar). */
int bw__job_format_is_stream(const char *format);

/* The layout rules of a job over `nsources` sources at world size `world`: a pre-sharded
 * dataset only in iterable mode (never sharded again), a stream with at least one source, a
 * pre-sharded stream with one source per rank and its sources never reordered. BW_OK, or
 * BW_INVALID_ARGUMENT with a sentence in err. */
int bw__job_check_layout(bw__sampler_mode mode, bool pre_sharded, size_t nsources,
                         bool shuffle_sources, uint64_t world, char *err, size_t errlen);

/* The longest transform_field a job may name, with its NUL (a tar member, a jsonl key). */
enum { BW_JOB_FIELD_MAX = 64 };

/* A job's transform (docs/transforms.md, "On the workers"): its spec parses and fixes the
 * output shape, the job is map-style (not `iterable`), the dataset's format is files, or tar
 * or jsonl with a `field` (only they have one: a member, a top-level key); token ops read npy
 * rows, or a jsonl field when the pipeline's output length is fixed (bw__tf_tokens_json_shape;
 * docs/transforms.md, "JSON Lines fields"). Writes the spec's canonical text to canon (canonlen
 * bytes; "" without a transform). BW_OK, or BW_INVALID_ARGUMENT with a sentence in err. */
int bw__job_check_transform(const char *transform, const char *field, const char *format,
                            bool iterable, char *canon, size_t canonlen, char *err, size_t errlen);

/* The format rules (iterable mode reads streams) and bw__job_check_layout for a job's
 * configuration and dataset description. BW_OK, or BW_INVALID_ARGUMENT with a sentence in err
 * naming what is wrong. */
int bw__job_check_data(const Batchwire__V1__JobConfig *config,
                       const Batchwire__V1__DatasetInfo *info, uint32_t world, char *err,
                       size_t errlen);

#endif
