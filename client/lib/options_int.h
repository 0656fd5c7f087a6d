/* The loader's options as the library reads them (options.c): the caller's struct read by its
 * size, checked, and turned into the job request the session sends. Nothing here is part of
 * the public API. */
#ifndef BW_CLIENT_OPTIONS_INT_H
#define BW_CLIENT_OPTIONS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batchwire/loader.h"
#include "data.pb-c.h"
#include "jobs.pb-c.h"
#include "transform/transform.h"

/* The job's name, dataset and sampler settings as protobuf messages, owned by the loader. */
typedef struct bw__job_request {
    char *name;
    char *format;
    char **sources;
    size_t nsources;
    Batchwire__V1__Dataset dataset;
    /* named arrays (bw_loader_options.dataset_fields): format "fields", one message each */
    size_t nfields;
    Batchwire__V1__DatasetField *fields;
    Batchwire__V1__DatasetField **field_ptrs;
    /* a mixture (bw_loader_options.mixture): one dataset message and source each */
    size_t nmix;
    Batchwire__V1__Dataset *mix_datasets;
    Batchwire__V1__MixSource *mix_sources;
    Batchwire__V1__MixSource **mix_ptrs;
    Batchwire__V1__Mixture mixture;
    Batchwire__V1__SamplerConfig sampler;
    Batchwire__V1__JobConfig config;
    /* bw_loader_options.transform: its canonical text (docs/transforms.md), "" for none */
    char transform[BW_TF_CANON_MAX];
    char *transform_field;
} bw__job_request;

/* The caller's options as this library's struct: the fields within in->size, defaults for
 * the rest (the ABI rule in include/batchwire/loader.h). BW_INVALID_ARGUMENT with a sentence
 * for NULL, a size below the first version's, or a set byte past this library's struct. */
int bw__loader_options_read(const bw_loader_options *in, bw_loader_options *out, char *err,
                            size_t errlen);

/* Validates options, resolves rank and world size (options, then RANK/WORLD_SIZE, then
 * SLURM_PROCID/SLURM_NTASKS) and builds the job request. */
int bw__loader_parse_options(const bw_loader_options *o, bw__job_request *jr, int64_t *rank,
                             int64_t *world, char *err, size_t errlen);
void bw__job_request_free(bw__job_request *jr);

/* Whether sample bytes may use the workers' data channel: o->transport, else
 * BATCHWIRE_TRANSPORT, else "auto". BW_INVALID_ARGUMENT for another value. */
int bw__loader_transport(const bw_loader_options *o, bool *data_channel, char *err, size_t errlen);

/* The data channel's compression as FEATURES bits (transport.h, bw__worker_opts.compress):
 * o->compress, else BATCHWIRE_COMPRESS, else "none". BW_INVALID_ARGUMENT for another value. */
int bw__loader_compress(const bw_loader_options *o, uint64_t *bits, char *err, size_t errlen);
/* Whether a loader whose order is computed position by position plans it ahead in a thread of
 * its own (docs/client.md, "Planning ahead"): BATCHWIRE_PLAN_AHEAD "on", "off", or "auto"
 * (unset or empty: on where this process may run on 4 CPUs or more); BW_INVALID_ARGUMENT with
 * a sentence for any other value. */
int bw__loader_plan_ahead(bool *on, char *err, size_t errlen);

#endif
