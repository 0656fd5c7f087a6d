/* Loader options: defaults, the caller's struct read by its size (the ABI rule in
 * include/batchwire/loader.h), validation, rank and world size from the launcher's
 * environment, and the job request sent to the coordinator. */
#include <errno.h>
#include <sched.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"
#include "formats/formats.h"
#include "jobs/job_check.h"
#include "jobs/mixture.h"
#include "options_int.h"
#include "rpc/dchan.h"
#include "sampler/sampler.h"

/* Out of memory while reading the options: the sentence names what was being copied. */
static int nomem(const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "out of memory copying the options' %s", what);
    return BW_NOMEM;
}

/* The end of the last field of the first bw_loader_options that carried its size: no
 * caller's struct is shorter. Fields added later extend the struct; this stays. */
#define OPTIONS_V1_SIZE (offsetof(bw_loader_options, n_dataset_fields) + sizeof(size_t))

static void options_defaults(bw_loader_options *o)
{
    memset(o, 0, sizeof(*o));
    o->size = sizeof(*o);
    o->rank = -1;
    o->world_size = -1;
    o->mode = "torch";
    o->batch_size = 1;
    o->shuffle_algo = "torch";
    o->even_batches = 1;
    o->prefetch_batches = 0; /* auto (loader.c, auto_depth) */
    o->max_buffer_bytes = (size_t)1 << 30;
    o->timeout_ms = 10000;
    o->device = -1;
    o->retry_ms = 60000;
    o->start_epoch = -1;
    o->share_count = 1;
}

void bw_loader_options_init_sized(bw_loader_options *o, size_t size)
{
    if (!o)
        return;
    bw_loader_options d;
    options_defaults(&d);
    d.size = size;
    /* A caller built against a newer header: its fields past ours default to zero. */
    size_t known = size < sizeof(d) ? size : sizeof(d);
    memcpy(o, &d, known);
    if (size > known)
        memset((char *)o + known, 0, size - known);
}

int bw__loader_options_read(const bw_loader_options *in, bw_loader_options *out, char *err,
                            size_t errlen)
{
    options_defaults(out);
    if (!in) {
        snprintf(err, errlen, "options: none given (a bw_loader_options is required)");
        return BW_INVALID_ARGUMENT;
    }
    size_t size = in->size;
    if (size < OPTIONS_V1_SIZE) {
        snprintf(err, errlen,
                 "options: bw_loader_options.size is %zu, less than the %zu bytes of the first "
                 "version: initialise the struct with bw_loader_options_init before setting "
                 "fields",
                 size, (size_t)OPTIONS_V1_SIZE);
        return BW_INVALID_ARGUMENT;
    }
    const unsigned char *tail = (const unsigned char *)in;
    for (size_t i = sizeof(*out); i < size; i++)
        if (tail[i] != 0) {
            snprintf(err, errlen,
                     "options: bw_loader_options is %zu bytes and byte %zu, past the %zu this "
                     "library (batchwire %s) knows, is set: the program was built against a "
                     "newer batchwire and uses a setting this library does not have; use the "
                     "newer library",
                     size, i, sizeof(*out), bw_version());
            return BW_INVALID_ARGUMENT;
        }
    memcpy(out, in, size < sizeof(*out) ? size : sizeof(*out));
    out->size = sizeof(*out);
    return BW_OK;
}

/* Reads a non-negative integer from the environment; 1 if absent, 0 ok, -1 malformed. */
static int env_u32(const char *name, int64_t *out, char *err, size_t errlen)
{
    const char *v = getenv(name);
    if (!v)
        return 1;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno || x < 0 || x > (1 << 24)) {
        snprintf(err, errlen, "environment variable %s='%s' is not a rank or world size", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int resolve_rank(const bw_loader_options *o, int64_t *rank, int64_t *world, char *err,
                        size_t errlen)
{
    *rank = o->rank;
    *world = o->world_size;
    const char *rank_src = "the options", *world_src = "the options";
    if (*rank < -1) {
        snprintf(err, errlen,
                 "rank %" PRId64 " is not a rank: give 0 to world size - 1, or -1 (None in "
                 "Python, no --rank) to take it from RANK (torchrun) or SLURM_PROCID (srun)",
                 *rank);
        return BW_INVALID_ARGUMENT;
    }
    if (*world < -1 || *world == 0) {
        snprintf(err, errlen,
                 "world size %" PRId64 " is not a world size: give the number of ranks, at least "
                 "1, or -1 (None in Python, no --world-size) to take it from WORLD_SIZE "
                 "(torchrun) or SLURM_NTASKS (srun)",
                 *world);
        return BW_INVALID_ARGUMENT;
    }
    if (*rank < 0) {
        int r = env_u32("RANK", rank, err, errlen);
        rank_src = "RANK";
        if (r == 1) {
            r = env_u32("SLURM_PROCID", rank, err, errlen);
            rank_src = "SLURM_PROCID";
        }
        if (r < 0)
            return BW_INVALID_ARGUMENT;
        if (r == 1) {
            snprintf(err, errlen,
                     "rank not given (-1: from the environment) and neither RANK (torchrun) nor "
                     "SLURM_PROCID (srun) is set: give this process's rank, 0 to world size - 1");
            return BW_INVALID_ARGUMENT;
        }
    }
    if (*world < 0) {
        int r = env_u32("WORLD_SIZE", world, err, errlen);
        world_src = "WORLD_SIZE";
        if (r == 1) {
            r = env_u32("SLURM_NTASKS", world, err, errlen);
            world_src = "SLURM_NTASKS";
        }
        if (r < 0)
            return BW_INVALID_ARGUMENT;
        if (r == 1) {
            snprintf(err, errlen,
                     "world size not given (-1: from the environment) and neither WORLD_SIZE "
                     "(torchrun) nor SLURM_NTASKS (srun) is set: give the number of ranks, at "
                     "least 1");
            return BW_INVALID_ARGUMENT;
        }
    }
    if (*world < 1) {
        snprintf(err, errlen, "world size 0 (from %s): a job has at least 1 rank", world_src);
        return BW_INVALID_ARGUMENT;
    }
    if (*rank >= *world) {
        snprintf(err, errlen,
                 "rank %" PRId64 " (from %s) is not below world size %" PRId64
                 " (from %s): ranks are 0 to %" PRId64,
                 *rank, rank_src, *world, world_src, *world - 1);
        return BW_INVALID_ARGUMENT;
    }
    return BW_OK;
}

#define PRE_SHARDED "pre_sharded:"
#define MIX_STREAM "stream:"

static const char *const formats[] = {"npy", "npz", "tfrecord", "jsonl", "text", "tar", "files"};

/* "npy:a/x*.npy,b.npy" gives format "npy" and sources "a/x*.npy" and "b.npy" (`what` names the
 * spec in messages: "dataset 'npy:...'" or "field 'x'"). */
static int parse_spec(const char *what, const char *spec, char **format, char ***sources,
                      size_t *nsources, char *err, size_t errlen)
{
    const char *colon = spec ? strchr(spec, ':') : NULL;
    if (!colon || colon == spec || colon[1] == '\0') {
        snprintf(err, errlen,
                 "%s '%s': expected FORMAT:PATH[,PATH...] with FORMAT one of "
                 "npy, npz, tfrecord, jsonl, text, tar, files",
                 what, spec ? spec : "(none)");
        return BW_INVALID_ARGUMENT;
    }
    *format = strndup(spec, (size_t)(colon - spec));
    if (!*format)
        return nomem(what, err, errlen);
    int known = 0;
    for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
        known |= strcmp(*format, formats[i]) == 0;
    if (!known) {
        snprintf(err, errlen,
                 "%s '%s': unknown format '%s' (npy, npz, tfrecord, jsonl, text, "
                 "tar or files)",
                 what, spec, *format);
        return BW_INVALID_ARGUMENT;
    }
    const char *p = colon + 1;
    size_t n = 1;
    for (const char *q = p; *q; q++)
        n += *q == ',';
    *sources = calloc(n, sizeof(char *));
    if (!*sources)
        return nomem(what, err, errlen);
    while (*p) {
        size_t len = strcspn(p, ",");
        if (len == 0) {
            snprintf(err, errlen, "%s '%s': empty path in the list", what, spec);
            return BW_INVALID_ARGUMENT;
        }
        if (!((*sources)[(*nsources)++] = strndup(p, len)))
            return nomem(what, err, errlen);
        p += len + (p[len] == ',');
    }
    return BW_OK;
}

static int parse_dataset(const char *spec, bw__job_request *jr, char *err, size_t errlen)
{
    return parse_spec("dataset", spec, &jr->format, &jr->sources, &jr->nsources, err, errlen);
}

/* dataset_fields: "NAME=npy:PATH[,PATH...]" each, into jr's field messages (format
 * "fields"). The names are checked as the coordinator checks them (bw__check_field_name);
 * lengths and splits are the describing worker's to check. */
static int parse_fields(const bw_loader_options *o, bw__job_request *jr, char *err, size_t errlen)
{
    if (o->dataset) {
        snprintf(err, errlen,
                 "dataset '%s' and dataset_fields exclude each other: a dataset of named arrays "
                 "lists every array as a field",
                 o->dataset);
        return BW_INVALID_ARGUMENT;
    }
    if (o->n_dataset_fields > BW_FMT_MAX_FIELDS) {
        snprintf(err, errlen, "dataset_fields: %zu fields is more than %d", o->n_dataset_fields,
                 BW_FMT_MAX_FIELDS);
        return BW_INVALID_ARGUMENT;
    }
    jr->fields = calloc(o->n_dataset_fields, sizeof(*jr->fields));
    jr->field_ptrs = calloc(o->n_dataset_fields, sizeof(*jr->field_ptrs));
    if (!(jr->format = strdup("fields")) || !jr->fields || !jr->field_ptrs)
        return nomem("dataset_fields", err, errlen);
    for (size_t k = 0; k < o->n_dataset_fields; k++) {
        const char *spec = o->dataset_fields[k] ? o->dataset_fields[k] : "";
        const char *eq = strchr(spec, '=');
        Batchwire__V1__DatasetField *f = &jr->fields[k];
        batchwire__v1__dataset_field__init(f);
        f->name = f->format = NULL; /* owned strings from here on (freed with jr) */
        jr->field_ptrs[jr->nfields++] = f;
        if (!eq) {
            snprintf(err, errlen, "dataset field '%s': expected NAME=npy:PATH[,PATH...]", spec);
            return BW_INVALID_ARGUMENT;
        }
        if (!(f->name = strndup(spec, (size_t)(eq - spec))))
            return nomem("dataset_fields", err, errlen);
        char why[256];
        int rc = bw__check_field_name(f->name, why, sizeof(why));
        for (size_t j = 0; rc == BW_OK && j < k; j++)
            if (strcmp(jr->fields[j].name, f->name) == 0) {
                snprintf(why, sizeof(why), "field '%s' is named twice", f->name);
                rc = BW_INVALID_ARGUMENT;
            }
        if (rc != BW_OK) {
            snprintf(err, errlen, "dataset field '%s': %s", spec, why);
            return rc;
        }
        char what[BW_FIELD_NAME_MAX + 16];
        snprintf(what, sizeof(what), "field '%s'", f->name);
        if ((rc = parse_spec(what, eq + 1, &f->format, &f->sources, &f->n_sources, err, errlen)) !=
            BW_OK)
            return rc;
        if (strcmp(f->format, "npy") != 0) {
            snprintf(err, errlen,
                     "field '%s': format '%s' cannot be a field: fields are .npy arrays "
                     "(NAME=npy:PATH[,PATH...]); an .npz archive is a dataset of fields by itself "
                     "(dataset npz:PATH)",
                     f->name, f->format);
            return BW_INVALID_ARGUMENT;
        }
    }
    return BW_OK;
}

/* The transform (docs/transforms.md, "On the workers"): its canonical text into jr, checked
 * as the coordinator checks it (bw__job_check_transform). */
static int parse_transform(const bw_loader_options *o, int mode, bw__job_request *jr, char *err,
                           size_t errlen)
{
    const char *field = o->transform_field && o->transform_field[0] ? o->transform_field : NULL;
    int rc = bw__job_check_transform(o->transform, field, jr->format, mode == BW__MODE_ITERABLE,
                                     jr->transform, sizeof(jr->transform), err, errlen);
    if (rc == BW_OK && field && !(jr->transform_field = strdup(field)))
        return nomem("transform field", err, errlen);
    return rc;
}

/* mixture: "FORMAT:PATH[,PATH...]=WEIGHT" each (split at the last '='), into jr's mixture
 * message; sizes and formats are the describing workers' to check. */
static int parse_mixture(const bw_loader_options *o, bw__job_request *jr, char *err, size_t errlen)
{
    if (o->dataset || o->n_dataset_fields) {
        snprintf(err, errlen,
                 "mixture and %s exclude each other: a mixture lists each of its datasets",
                 o->dataset ? "dataset" : "dataset_fields");
        return BW_INVALID_ARGUMENT;
    }
    if (o->n_mixture > BW__MIX_MAX_SOURCES) {
        snprintf(err, errlen, "mixture: %zu sources is more than %d", o->n_mixture,
                 BW__MIX_MAX_SOURCES);
        return BW_INVALID_ARGUMENT;
    }
    size_t n = o->n_mixture;
    jr->mix_datasets = calloc(n, sizeof(*jr->mix_datasets));
    jr->mix_sources = calloc(n, sizeof(*jr->mix_sources));
    jr->mix_ptrs = calloc(n, sizeof(*jr->mix_ptrs));
    if (!jr->mix_datasets || !jr->mix_sources || !jr->mix_ptrs)
        return nomem("mixture", err, errlen);
    size_t streams = 0;
    for (size_t j = 0; j < n; j++) {
        const char *entry = o->mixture[j] ? o->mixture[j] : "";
        const char *eq = strrchr(entry, '=');
        /* "stream:FORMAT:..." a stream source (docs/semantics.md, "Streams in a mixture") */
        bool stream = strncmp(entry, MIX_STREAM, strlen(MIX_STREAM)) == 0;
        Batchwire__V1__Dataset *d = &jr->mix_datasets[j];
        batchwire__v1__dataset__init(d);
        d->format = NULL; /* owned strings from here on (freed with jr) */
        batchwire__v1__mix_source__init(&jr->mix_sources[j]);
        jr->mix_sources[j].dataset = d;
        jr->mix_ptrs[j] = &jr->mix_sources[j];
        jr->nmix++;
        if (!eq) {
            snprintf(err, errlen, "mixture source %zu '%s': expected FORMAT:PATH[,PATH...]=WEIGHT",
                     j, entry);
            return BW_INVALID_ARGUMENT;
        }
        const char *from = stream ? entry + strlen(MIX_STREAM) : entry;
        char *spec = strndup(from, eq > from ? (size_t)(eq - from) : 0), what[64], why[256];
        if (!spec)
            return nomem("mixture", err, errlen);
        snprintf(what, sizeof(what), "mixture source %zu", j);
        int rc = parse_spec(what, spec, &d->format, &d->sources, &d->n_sources, err, errlen);
        free(spec);
        if (rc != BW_OK)
            return rc;
        if (stream && !bw__job_format_is_stream(d->format)) {
            snprintf(err, errlen,
                     "mixture source %zu '%s': stream: needs a stream format (tfrecord, jsonl, "
                     "text or tar), not '%s'",
                     j, entry, d->format);
            return BW_INVALID_ARGUMENT;
        }
        jr->mix_sources[j].stream = stream;
        streams += stream;
        if ((rc = bw__mix_weight_parse(eq + 1, &jr->mix_sources[j].weight, why, sizeof(why))) !=
            BW_OK) {
            snprintf(err, errlen, "mixture source %zu '%s': %s", j, entry, why);
            return rc;
        }
    }
    batchwire__v1__mixture__init(&jr->mixture);
    jr->mixture.n_sources = n;
    jr->mixture.sources = jr->mix_ptrs;
    jr->mixture.samples = o->mix_samples;
    const char *policy = o->mix_policy;
    if (policy && strcmp(policy, "cycle") != 0 && strcmp(policy, "stop") != 0) {
        snprintf(err, errlen, "mix_policy '%s': expected cycle or stop", policy);
        return BW_INVALID_ARGUMENT;
    }
    if (policy && streams == 0) {
        snprintf(err, errlen,
                 "mix_policy %s needs a stream source (\"stream:FORMAT:PATH=WEIGHT\"): a "
                 "map-style source never runs dry",
                 policy);
        return BW_INVALID_ARGUMENT;
    }
    jr->mixture.policy = policy && strcmp(policy, "stop") == 0
                             ? BATCHWIRE__V1__MIX_POLICY__MIX_POLICY_STOP
                             : BATCHWIRE__V1__MIX_POLICY__MIX_POLICY_CYCLE;
    return BW_OK;
}

int bw__loader_parse_options(const bw_loader_options *o, bw__job_request *jr, int64_t *rank,
                             int64_t *world, char *err, size_t errlen)
{
    memset(jr, 0, sizeof(*jr));
    if (!o->coordinator || !*o->coordinator) {
        snprintf(err, errlen, "coordinator: no address given (HOST:PORT)");
        return BW_INVALID_ARGUMENT;
    }
    /* The coordinator's rule for job names, checked before any call. */
    int rc = bw__check_name("job name", o->job, BW_JOB_NAME_MAX, err, errlen);
    if (rc == BW_OK)
        rc = resolve_rank(o, rank, world, err, errlen);
    if (rc != BW_OK)
        return rc;
    int mode = bw__sampler_mode_parse(o->mode ? o->mode : "torch");
    int algo = bw__shuffle_algo_parse(o->shuffle_algo ? o->shuffle_algo : "torch");
    if (mode < 0) {
        snprintf(err, errlen, "mode '%s': expected torch, accelerate or iterable", o->mode);
        return BW_INVALID_ARGUMENT;
    }
    if (algo < 0) {
        snprintf(err, errlen, "shuffle_algo '%s': expected torch or feistel", o->shuffle_algo);
        return BW_INVALID_ARGUMENT;
    }
    if (o->batch_size < 1) {
        snprintf(err, errlen, "batch_size must be at least 1");
        return BW_INVALID_ARGUMENT;
    }
    if (!(jr->name = strdup(o->job)))
        return nomem("job name", err, errlen);
    /* "pre_sharded:FORMAT:PATHS": one source per rank, already split (docs/streams.md). */
    const char *spec = o->dataset;
    bool pre_sharded = spec && strncmp(spec, PRE_SHARDED, strlen(PRE_SHARDED)) == 0;
    if (pre_sharded)
        spec += strlen(PRE_SHARDED);
    if (o->n_dataset_fields && pre_sharded) {
        snprintf(err, errlen, "dataset_fields cannot be pre-sharded (named arrays are map-style)");
        return BW_INVALID_ARGUMENT;
    }
    if (o->n_mixture && pre_sharded) {
        snprintf(err, errlen,
                 "a mixture cannot be pre-sharded (it shards its own order over the ranks)");
        return BW_INVALID_ARGUMENT;
    }
    if (o->mix_policy && !o->n_mixture) {
        snprintf(err, errlen, "mix_policy is for a mixture (bw_loader_options.mixture)");
        return BW_INVALID_ARGUMENT;
    }
    if ((rc = o->n_mixture          ? parse_mixture(o, jr, err, errlen)
              : o->n_dataset_fields ? parse_fields(o, jr, err, errlen)
                                    : parse_dataset(spec, jr, err, errlen)) != BW_OK)
        return rc;
    if (o->n_mixture && o->shuffle) {
        snprintf(err, errlen,
                 "shuffle: a mixture orders its sources itself from the seed (a seeded "
                 "permutation within each map-style source, streams in their own order: "
                 "docs/semantics.md, \"Mixtures\"); leave shuffle off");
        return BW_INVALID_ARGUMENT;
    }
    if (pre_sharded && mode != BW__MODE_ITERABLE) {
        snprintf(err, errlen,
                 "dataset '%s' is pre-sharded (one source per rank, already split by its "
                 "writer) and %s mode would shard it again: each rank would get 1/%" PRId64
                 " of its 1/%" PRId64 " shard, 1/%" PRId64 " of the data (double sharding). "
                 "Use mode iterable, which serves source r to rank r as it is, or drop the "
                 "pre_sharded: prefix to shard the whole dataset once",
                 o->dataset, bw__sampler_mode_name((bw__sampler_mode)mode), *world, *world,
                 *world * *world);
        return BW_INVALID_ARGUMENT;
    }

    /* The same configuration the sampler checks, so a bad one is refused before any call. */
    bw__sampler_cfg sc;
    bw__sampler_cfg_init(&sc);
    sc.mode = (bw__sampler_mode)mode;
    sc.num_samples = 1u << 20; /* the real length comes from the job */
    sc.world_size = (uint64_t)*world;
    sc.batch_size = o->batch_size;
    /* iterable: shuffle reorders the stream's sources each epoch; records keep file order */
    sc.shuffle = o->shuffle != 0 && mode != BW__MODE_ITERABLE;
    sc.seed = (uint64_t)o->seed;
    sc.shuffle_algo = (bw__shuffle_algo)algo;
    sc.drop_last = o->drop_last != 0;
    sc.sampler_drop_last = o->sampler_drop_last != 0;
    sc.split_batches = o->split_batches != 0;
    sc.even_batches = o->even_batches != 0;
    sc.dispatch_batches = o->dispatch_batches != 0;
    sc.shard_single_process = o->pad_single_process != 0;
    if ((rc = bw__sampler_cfg_check(&sc, err, errlen)) != BW_OK)
        return rc;
    if ((rc = parse_transform(o, mode, jr, err, errlen)) != BW_OK)
        return rc;
    if (o->share_count > 1 && o->share_index >= o->share_count) {
        snprintf(err, errlen, "share_index %u is not below share_count %u", o->share_index,
                 o->share_count);
        return BW_INVALID_ARGUMENT;
    }

    batchwire__v1__dataset__init(&jr->dataset);
    jr->dataset.format = jr->format;
    jr->dataset.n_sources = jr->nsources;
    jr->dataset.sources = jr->sources;
    jr->dataset.pre_sharded = pre_sharded;
    jr->dataset.n_fields = jr->nfields;
    jr->dataset.fields = jr->field_ptrs;
    batchwire__v1__sampler_config__init(&jr->sampler);
    jr->sampler.mode =
        mode == BW__MODE_ACCELERATE ? BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ACCELERATE
        : mode == BW__MODE_ITERABLE ? BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ITERABLE
                                    : BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH;
    jr->sampler.shuffle_sources = mode == BW__MODE_ITERABLE && o->shuffle;
    jr->sampler.batch_size = o->batch_size;
    jr->sampler.shuffle = sc.shuffle;
    jr->sampler.seed = o->seed;
    jr->sampler.shuffle_algo = algo == BW__SHUFFLE_FEISTEL
                                   ? BATCHWIRE__V1__SHUFFLE_ALGO__SHUFFLE_ALGO_FEISTEL
                                   : BATCHWIRE__V1__SHUFFLE_ALGO__SHUFFLE_ALGO_TORCH;
    jr->sampler.drop_last = sc.drop_last;
    jr->sampler.sampler_drop_last = sc.sampler_drop_last;
    jr->sampler.split_batches = sc.split_batches;
    jr->sampler.uneven_batches = !sc.even_batches;
    jr->sampler.dispatch_batches = sc.dispatch_batches;
    jr->sampler.single_process_plain = mode == BW__MODE_ACCELERATE && !sc.shard_single_process;
    jr->sampler.allow_uneven = o->allow_uneven != 0;
    batchwire__v1__job_config__init(&jr->config);
    jr->config.dataset = jr->nmix ? NULL : &jr->dataset;
    jr->config.mixture = jr->nmix ? &jr->mixture : NULL;
    jr->config.sampler = &jr->sampler;
    jr->config.transform = jr->transform;
    jr->config.transform_field = jr->transform_field ? jr->transform_field : (char *)"";
    return BW_OK;
}

void bw__job_request_free(bw__job_request *jr)
{
    free(jr->name);
    free(jr->format);
    for (size_t i = 0; i < jr->nsources; i++)
        free(jr->sources[i]);
    free(jr->sources);
    for (size_t k = 0; k < jr->nfields; k++) {
        Batchwire__V1__DatasetField *f = &jr->fields[k];
        free(f->name);
        free(f->format);
        for (size_t i = 0; i < f->n_sources; i++)
            free(f->sources[i]);
        free(f->sources);
    }
    free(jr->fields);
    free(jr->field_ptrs);
    free(jr->transform_field);
    for (size_t j = 0; j < jr->nmix; j++) {
        Batchwire__V1__Dataset *d = &jr->mix_datasets[j];
        free(d->format);
        for (size_t i = 0; i < d->n_sources; i++)
            free(d->sources[i]);
        free(d->sources);
    }
    free(jr->mix_datasets);
    free(jr->mix_sources);
    free(jr->mix_ptrs);
    memset(jr, 0, sizeof(*jr));
}

int bw__loader_transport(const bw_loader_options *o, bool *data_channel, char *err, size_t errlen)
{
    const char *t = o->transport, *from = "the transport option";
    if (!t && (t = getenv("BATCHWIRE_TRANSPORT")) != NULL)
        from = "BATCHWIRE_TRANSPORT";
    if (!t || !t[0])
        t = "auto";
    if (strcmp(t, "auto") != 0 && strcmp(t, "grpc") != 0) {
        snprintf(err, errlen, "%s is '%s': expected auto or grpc", from, t);
        return BW_INVALID_ARGUMENT;
    }
    /* (The data channel speaks TLS when the loader does.) */
    *data_channel = strcmp(t, "auto") == 0;
    return BW_OK;
}

int bw__loader_plan_ahead(bool *on, char *err, size_t errlen)
{
    const char *v = getenv("BATCHWIRE_PLAN_AHEAD");
    if (!v || !v[0] || strcmp(v, "auto") == 0) {
        /* The planner computes while the fetch threads wait; with fewer cores it only takes
         * turns with them (docs/performance.md, "Planning ahead, and a cheaper split at each
         * node": +12 % client CPU at 256 B on 2 cores). */
        cpu_set_t set;
        *on = sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) >= 4;
        return BW_OK;
    }
    if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0) {
        snprintf(err, errlen, "BATCHWIRE_PLAN_AHEAD is '%s': expected auto, on or off", v);
        return BW_INVALID_ARGUMENT;
    }
    *on = strcmp(v, "on") == 0;
    return BW_OK;
}

int bw__loader_compress(const bw_loader_options *o, uint64_t *bits, char *err, size_t errlen)
{
    const char *c = o->compress, *from = "the compress option";
    if (!c && (c = getenv("BATCHWIRE_COMPRESS")) != NULL)
        from = "BATCHWIRE_COMPRESS";
    *bits = 0;
    if (!c || !c[0] || strcmp(c, "none") == 0)
        return BW_OK;
    if (strcmp(c, "auto") == 0) {
        *bits = BW_DCHAN_FEATURE_ZSTD | BW_DCHAN_FEATURE_ZSTD_AUTO;
        return BW_OK;
    }
    uint64_t level = 0;
    if (strncmp(c, "zstd", 4) == 0 && c[4] == ':' && c[5] >= '1' && c[5] <= '9') {
        char *end = NULL;
        level = strtoull(c + 5, &end, 10);
        if (*end || level > BW_DCHAN_ZSTD_LEVEL_MAX)
            level = 0;
    }
    if (strcmp(c, "zstd") != 0 && level == 0) {
        snprintf(err, errlen, "%s is '%s': expected none, auto, zstd or zstd:LEVEL (LEVEL 1 to %d)",
                 from, c, BW_DCHAN_ZSTD_LEVEL_MAX);
        return BW_INVALID_ARGUMENT;
    }
    *bits = BW_DCHAN_FEATURE_ZSTD | level << BW_DCHAN_ZSTD_LEVEL_SHIFT;
    return BW_OK;
}
