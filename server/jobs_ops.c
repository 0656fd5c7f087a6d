/* The Jobs operations: validate every field of a request (with a sentence naming what was
 * wrong), check it against the state, and turn an accepted change into one journal record. */
#include "jobs_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/refuse.h"
#include "common/util.h"
#include "cursor/cursor.h"
#include "formats/formats.h"
#include "jobs/job_check.h"
#include "jobs/mixture.h"
#include "rpc/pbdiff.h"

enum { MAX_SOURCES = 4096, MAX_BATCH = 1 << 24 };

static uint64_t placement_version(bw_jobs *s, bw_arena *arena,
                                  Batchwire__V1__PlacementTable **table)
{
    pthread_mutex_lock(&s->mu);
    bw_jobs_placement_fn fn = s->placement;
    void *user = s->placement_user;
    pthread_mutex_unlock(&s->mu);
    uint64_t version = 0;
    if (table)
        *table = NULL;
    if (fn && fn(user, arena, &version, table) != BW_OK) {
        version = 0;
        if (table)
            *table = NULL;
    }
    return version;
}

/* A list of 1 to MAX_SOURCES paths, each text (`what`: the message's place). */
static int check_sources(const char *what, char *const *sources, size_t n, char *err, size_t errlen)
{
    if (n == 0 || n > MAX_SOURCES) {
        snprintf(err, errlen, "%s.sources must list 1 to %d paths (got %zu)", what, MAX_SOURCES, n);
        return BW_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < n; i++) {
        char where[160];
        snprintf(where, sizeof(where), "%s.sources[%zu]", what, i);
        int rc = bw__check_text(where, sources[i], BW_NAME_MAX, err, errlen);
        if (rc != BW_OK)
            return rc;
    }
    return BW_OK;
}

/* Named arrays (format "fields", docs/formats.md): no sources of its own, 1 to
 * BW_FMT_MAX_FIELDS fields with valid, distinct names, each npy over its own sources. Whether
 * the arrays agree (lengths, splits) is the describing worker's to say. */
static int check_fields(const Batchwire__V1__Dataset *d, char *err, size_t errlen)
{
    if (d->n_sources) {
        snprintf(err, errlen,
                 "config.dataset.sources must be empty for format fields (each "
                 "field lists its own)");
        return BW_INVALID_ARGUMENT;
    }
    if (d->n_fields == 0 || d->n_fields > BW_FMT_MAX_FIELDS) {
        snprintf(err, errlen, "config.dataset.fields must list 1 to %d named arrays (got %zu)",
                 BW_FMT_MAX_FIELDS, d->n_fields);
        return BW_INVALID_ARGUMENT;
    }
    size_t total = 0; /* the paths of every field together, bounded as one list's */
    for (size_t k = 0; k < d->n_fields; k++)
        total += d->fields[k]->n_sources;
    if (total > MAX_SOURCES) {
        snprintf(err, errlen, "config.dataset.fields list %zu paths together, more than %d", total,
                 MAX_SOURCES);
        return BW_INVALID_ARGUMENT;
    }
    for (size_t k = 0; k < d->n_fields; k++) {
        const Batchwire__V1__DatasetField *f = d->fields[k];
        char what[128];
        snprintf(what, sizeof(what), "config.dataset.fields[%zu]", k);
        int rc = bw__check_field_name(f->name, err, errlen);
        for (size_t j = 0; rc == BW_OK && j < k; j++)
            if (strcmp(d->fields[j]->name, f->name) == 0) {
                snprintf(err, errlen, "%s: field '%s' is named twice", what, f->name);
                rc = BW_INVALID_ARGUMENT;
            }
        if (rc == BW_OK && (!f->format || strcmp(f->format, "npy") != 0)) {
            snprintf(err, errlen,
                     "%s (field '%s'): format '%.32s' cannot be a field: fields are "
                     "npy arrays",
                     what, f->name, f->format ? f->format : "");
            rc = BW_INVALID_ARGUMENT;
        }
        if (rc == BW_OK)
            rc = check_sources(what, f->sources, f->n_sources, err, errlen);
        if (rc != BW_OK)
            return rc;
    }
    return BW_OK;
}

/* A dataset to be described by a worker: `what` names it in messages ("config.dataset"). */
static int check_dataset(const char *what, const Batchwire__V1__Dataset *d, char *err,
                         size_t errlen)
{
    if (!d || !d->format || !*d->format) {
        snprintf(err, errlen,
                 "%s.format is required (npy, npz, tfrecord, files, jsonl, text, tar, fields)",
                 what);
        return BW_INVALID_ARGUMENT;
    }
    if (strlen(d->format) > 32) {
        snprintf(err, errlen, "%s.format '%.40s...' is too long", what, d->format);
        return BW_INVALID_ARGUMENT;
    }
    int rc = strcmp(d->format, "fields") == 0
                 ? check_fields(d, err, errlen)
                 : check_sources(what, d->sources, d->n_sources, err, errlen);
    if (rc == BW_OK && d->n_fields && strcmp(d->format, "fields") != 0) {
        snprintf(err, errlen, "%s.fields is for format fields, not '%s'", what, d->format);
        rc = BW_INVALID_ARGUMENT;
    }
    return rc;
}

/* A mixture's sources (docs/semantics.md, "Mixtures"): their number, datasets and weights;
 * the sizes are checked with the plan once workers have described them. */
static int check_mixture(const Batchwire__V1__Mixture *m, char *err, size_t errlen)
{
    if (m->n_sources == 0 || m->n_sources > BW__MIX_MAX_SOURCES) {
        snprintf(err, errlen, "config.mixture has %zu sources: from 1 to %d", m->n_sources,
                 BW__MIX_MAX_SOURCES);
        return BW_INVALID_ARGUMENT;
    }
    if (m->policy > BATCHWIRE__V1__MIX_POLICY__MIX_POLICY_STOP) {
        snprintf(err, errlen, "config.mixture.policy %d is not a known policy", (int)m->policy);
        return BW_INVALID_ARGUMENT;
    }
    size_t streams = 0;
    for (size_t j = 0; j < m->n_sources; j++) {
        char what[64];
        snprintf(what, sizeof(what), "config.mixture.sources[%zu].dataset", j);
        const Batchwire__V1__MixSource *src = m->sources[j];
        if (!src)
            return bw__refuse(err, errlen, "%s.format is required (a source without a dataset)",
                              what);
        int rc = check_dataset(what, src->dataset, err, errlen);
        if (rc != BW_OK)
            return rc;
        if (src->weight == 0 || src->weight > BW__MIX_MAX_WEIGHT) {
            char w[32];
            bw__mix_weight_format(src->weight, w, sizeof(w));
            snprintf(err, errlen,
                     "config.mixture.sources[%zu].weight %s must be from 0.000000001 to "
                     "1000000000 (sent in units of 10^-9: %" PRIu64 ")",
                     j, w, src->weight);
            return BW_INVALID_ARGUMENT;
        }
        if (src->dataset->pre_sharded || strcmp(src->dataset->format, "fields") == 0) {
            snprintf(err, errlen,
                     "%s: a mixture's source cannot be %s (a mixture reads whole samples of "
                     "each source, in its own order)",
                     what, src->dataset->pre_sharded ? "pre-sharded" : "named arrays (fields)");
            return BW_INVALID_ARGUMENT;
        }
        if (src->stream && !bw__job_format_is_stream(src->dataset->format))
            return bw__refuse(err, errlen,
                              "config.mixture.sources[%zu].stream: format '%s' is not a stream "
                              "(tfrecord, jsonl, text or tar are)",
                              j, src->dataset->format);
        streams += src->stream;
    }
    /* A map-style source never runs dry: the policy is for stream sources (docs/semantics.md,
     * "Streams in a mixture"). */
    if (m->policy == BATCHWIRE__V1__MIX_POLICY__MIX_POLICY_STOP && streams == 0)
        return bw__refuse(err, errlen,
                          "config.mixture.policy stop needs a stream source (a map-style source "
                          "never runs dry)");
    return BW_OK;
}

static int check_config(const Batchwire__V1__JobConfig *c, char *err, size_t errlen)
{
    if (!c) {
        snprintf(err, errlen, "config is required (dataset and sampler)");
        return BW_INVALID_ARGUMENT;
    }
    const Batchwire__V1__Dataset *d = c->dataset;
    bool has_dataset = d && ((d->format && *d->format) || d->n_sources > 0 || d->n_fields > 0);
    if ((c->synthetic_samples > 0) + has_dataset + (c->mixture != NULL) > 1) {
        snprintf(err, errlen,
                 "config.dataset, config.synthetic_samples and config.mixture exclude each "
                 "other");
        return BW_INVALID_ARGUMENT;
    }
    int rc = c->mixture                  ? check_mixture(c->mixture, err, errlen)
             : c->synthetic_samples == 0 ? check_dataset("config.dataset", d, err, errlen)
                                         : BW_OK;
    if (rc != BW_OK)
        return rc;
    const Batchwire__V1__SamplerConfig *sc = c->sampler;
    if (!sc || sc->mode == BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_UNSPECIFIED) {
        snprintf(err, errlen, "config.sampler.mode is required: torch, accelerate or iterable");
        return BW_INVALID_ARGUMENT;
    }
    if (sc->mode > BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ITERABLE) {
        snprintf(err, errlen, "config.sampler.mode %d is not a known mode", (int)sc->mode);
        return BW_INVALID_ARGUMENT;
    }
    if (sc->shuffle_algo > BATCHWIRE__V1__SHUFFLE_ALGO__SHUFFLE_ALGO_FEISTEL) {
        snprintf(err, errlen, "config.sampler.shuffle_algo %d is not a known algorithm",
                 (int)sc->shuffle_algo);
        return BW_INVALID_ARGUMENT;
    }
    if (sc->batch_size == 0 || sc->batch_size > MAX_BATCH) {
        snprintf(err, errlen, "config.sampler.batch_size %" PRIu64 " must be from 1 to %d",
                 sc->batch_size, MAX_BATCH);
        return BW_INVALID_ARGUMENT;
    }
    return BW_OK;
}

static int check_world(bw_jobs *s, uint32_t world, char *err, size_t errlen)
{
    if (world == 0 || world > s->opts.max_world_size) {
        snprintf(err, errlen, "world_size %u must be from 1 to %u", world, s->opts.max_world_size);
        return BW_INVALID_ARGUMENT;
    }
    return BW_OK;
}

/* Under s->mu: whether one more job fits, for `who` and for the coordinator. */
static int check_quota(bw_jobs *s, const bw_principal *who, char *err, size_t errlen)
{
    if (s->njobs >= s->opts.max_jobs) {
        snprintf(err, errlen,
                 "the coordinator holds %zu jobs, its limit (--max-jobs); delete finished ones "
                 "with `batchwire job delete --job NAME` (an admin may delete any job)",
                 s->njobs);
        return BW_TOO_BIG;
    }
    /* The anonymous principal of an open service and admins have no per-principal quota. */
    if (who->role == BW_ROLE_TRAINER) {
        size_t owned = bw__jobs_owned(s, who->name);
        if (owned >= s->opts.max_jobs_per_principal) {
            snprintf(err, errlen,
                     "principal '%s' owns %zu jobs, its quota (--max-jobs-per-principal %u); "
                     "delete one with `batchwire job delete --job NAME`, or wait for idle jobs "
                     "to expire (--job-ttl)",
                     who->name, owned, s->opts.max_jobs_per_principal);
            return BW_TOO_BIG;
        }
    }
    return BW_OK;
}

Batchwire__V1__DatasetInfo *bw__jobs_synthetic_info(bw_arena *arena, uint64_t samples)
{
    Batchwire__V1__DatasetInfo *info = bw__arena_alloc(arena, sizeof(*info));
    char fp[64];
    if (!info)
        return NULL;
    batchwire__v1__dataset_info__init(info);
    snprintf(fp, sizeof(fp), "synthetic-%" PRIu64, samples);
    info->format = "synthetic";
    info->length = samples;
    info->fingerprint = bw__arena_strdup(arena, fp);
    return info->fingerprint ? info : NULL;
}

/* A mixture's weight as the user wrote it (0.3), not in the wire's units of 10^-9. */
static void weight_text(const void *value, char *out, size_t outlen)
{
    bw__mix_weight_format(*(const uint64_t *)value, out, outlen);
}

/* Under s->mu: the answer for an existing job. */
static int existing(bw_job *job, const Batchwire__V1__GetOrCreateJobRequest *req, bw_arena *arena,
                    Batchwire__V1__GetOrCreateJobResponse **resp, char *err, size_t errlen)
{
    static const bw__pb_diff_format formats[] = {
        {&batchwire__v1__mix_source__descriptor, "weight", weight_text},
    };
    char diff[1536];
    bw__pb_diff(&batchwire__v1__job_config__descriptor, &job->config->base, "job",
                &req->config->base, "request", formats, sizeof(formats) / sizeof(formats[0]), diff,
                sizeof(diff));
    if (diff[0]) {
        snprintf(err, errlen,
                 "job '%s' exists with a different configuration: %s. Use the job's "
                 "configuration, or another job name",
                 job->name, diff);
        return BW_MISMATCH;
    }
    Batchwire__V1__GetOrCreateJobResponse *out = bw__arena_alloc(arena, sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__get_or_create_job_response__init(out);
    out->job = bw__jobs_summary(arena, job);
    out->created = false;
    *resp = out;
    return out->job ? BW_OK : BW_NOMEM;
}

int bw__jobs_lookup(bw_jobs *s, const bw_principal *who,
                    const Batchwire__V1__GetOrCreateJobRequest *req, bw_arena *arena,
                    Batchwire__V1__GetOrCreateJobResponse **resp, bool *need_describe,
                    uint64_t *wait_seq, char *err, size_t errlen)
{
    *need_describe = false;
    int rc = bw__check_name("job name", req->name, BW_JOB_NAME_MAX, err, errlen);
    if (rc == BW_OK)
        rc = check_config(req->config, err, errlen);
    if (rc == BW_OK)
        rc = check_world(s, req->world_size, err, errlen);
    if (rc != BW_OK)
        return rc;
    pthread_mutex_lock(&s->mu);
    *wait_seq = s->last_seq;
    bw_job *job = bw__jobs_find(s, req->name);
    if (job) {
        rc = bw__jobs_check_owner(job, who, err, errlen);
        if (rc == BW_OK)
            rc = existing(job, req, arena, resp, err, errlen);
    } else {
        rc = check_quota(s, who, err, errlen);
        *need_describe = rc == BW_OK;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int bw__jobs_create(bw_jobs *s, const bw_principal *who,
                    const Batchwire__V1__GetOrCreateJobRequest *req,
                    const Batchwire__V1__DatasetInfo *info, bw_arena *arena,
                    Batchwire__V1__GetOrCreateJobResponse **resp, uint64_t *wait_seq, char *err,
                    size_t errlen)
{
    /* The planner must accept this configuration for this dataset, and give every rank the
     * same number of batches (docs/semantics.md, "Equal batch counts"), or the job is refused
     * now. */
    Batchwire__V1__WorldSegment first = BATCHWIRE__V1__WORLD_SEGMENT__INIT;
    first.world_size = req->world_size;
    const Batchwire__V1__WorldSegment *history[1] = {&first};
    bw__plan *plan = NULL;
    char why[512];
    int rc = bw__plan_new_for_job(req->config, info, history, 1, 0, true, &plan, why, sizeof(why));
    if (rc == BW_OK && info->length == 0) {
        snprintf(why, sizeof(why), "the dataset is empty");
        rc = BW_INVALID_ARGUMENT;
    }
    if (rc == BW_OK && !bw__plan_equal_batches(plan) &&
        !(req->config->sampler && req->config->sampler->allow_uneven)) {
        snprintf(why, sizeof(why),
                 "ranks would receive different numbers of batches (uneven_batches without "
                 "drop_last); a DDP job would hang: set drop_last, leave uneven_batches off, "
                 "or ask for unequal counts explicitly (allow_uneven)");
        rc = BW_INVALID_ARGUMENT;
    }
    bw__plan_free(plan);
    if (rc != BW_OK) {
        snprintf(err, errlen,
                 "job '%s' refused: %s (dataset of %" PRIu64 " samples, world size %u)", req->name,
                 why, info->length, req->world_size);
        return rc == BW_NOMEM ? rc : BW_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&s->mu);
    *wait_seq = s->last_seq;
    bw_job *job = bw__jobs_find(s, req->name);
    if (job) { /* created by another caller while the dataset was being described */
        rc = bw__jobs_check_owner(job, who, err, errlen);
        if (rc == BW_OK)
            rc = existing(job, req, arena, resp, err, errlen);
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    if ((rc = check_quota(s, who, err, errlen)) != BW_OK) {
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    Batchwire__V1__JobCreated c = BATCHWIRE__V1__JOB_CREATED__INIT;
    c.name = req->name;
    c.config = req->config;
    c.dataset = (Batchwire__V1__DatasetInfo *)info;
    c.world_size = req->world_size;
    c.created_unix_ms = bw__unix_ms();
    c.owner = (char *)who->name;
    Batchwire__V1__JournalRecord rec = BATCHWIRE__V1__JOURNAL_RECORD__INIT;
    rec.change_case = BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_JOB_CREATED;
    rec.job_created = &c;
    rc = bw__jobs_fingerprint(req->name, req->config, info, &c.fingerprint, err, errlen);
    if (rc == BW_OK)
        rc = bw__jobs_commit_record(s, &rec, err, errlen);
    if (rc == BW_OK) {
        *wait_seq = s->last_seq;
        Batchwire__V1__GetOrCreateJobResponse *out = bw__arena_alloc(arena, sizeof(*out));
        if (!out) {
            rc = BW_NOMEM;
        } else {
            batchwire__v1__get_or_create_job_response__init(out);
            out->job = bw__jobs_summary(arena, bw__jobs_find(s, req->name));
            out->created = true;
            *resp = out;
            rc = out->job ? BW_OK : BW_NOMEM;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Under s->mu: the job and rank named by a request, with messages for people. */
static int locate(bw_jobs *s, const bw_principal *who, const char *name, uint32_t rank,
                  bw_job **job, bw_rank_state **r, char *err, size_t errlen)
{
    *job = bw__jobs_find(s, name);
    if (!*job) {
        snprintf(err, errlen, "no job named '%s' (create it with GetOrCreateJob first)", name);
        return BW_NOT_FOUND;
    }
    int rc = bw__jobs_check_owner(*job, who, err, errlen);
    if (rc != BW_OK)
        return rc;
    if (rank >= (*job)->world_size) {
        snprintf(err, errlen, "rank %u is not below job '%s''s world size %u", rank, name,
                 (*job)->world_size);
        return BW_OUT_OF_RANGE;
    }
    *r = &(*job)->ranks[rank];
    return BW_OK;
}

/* Why a lease id is not (or no longer) the rank's. */
static void lease_gone(const bw_jobs *s, const bw_job *job, uint32_t rank, const bw_rank_state *r,
                       uint64_t now, char *err, size_t errlen)
{
    const Batchwire__V1__WorldSegment *last = &job->history[job->nhistory - 1];
    if (!r->leased && job->nhistory > 1)
        snprintf(err, errlen,
                 "rank %u of job '%s' has no lease: the job was resumed with world size %u at "
                 "epoch %" PRIu64 " step %" PRIu64 "; join again with the new world size",
                 rank, job->name, job->world_size, last->epoch, last->start_step);
    else if (!r->leased)
        snprintf(err, errlen, "rank %u of job '%s' has no lease: join first", rank, job->name);
    else
        snprintf(err, errlen,
                 "this lease is no longer rank %u's of job '%s': host %s pid %u holds it now "
                 "(%s); this trainer must stop",
                 rank, job->name, r->host, r->pid,
                 bw__jobs_lease_live(s, r, now) ? "live" : "expired");
}

int bw__jobs_join(bw_jobs *s, const bw_principal *who, const Batchwire__V1__JoinJobRequest *req,
                  bw_arena *arena, Batchwire__V1__JoinJobResponse **resp, uint64_t *wait_seq,
                  char *err, size_t errlen)
{
    int rc = bw__check_name("job", req->job, BW_JOB_NAME_MAX, err, errlen);
    if (rc == BW_OK)
        rc = check_world(s, req->world_size, err, errlen);
    if (rc != BW_OK)
        return rc;
    if (req->rank >= req->world_size) {
        snprintf(err, errlen, "rank %u is not below world_size %u", req->rank, req->world_size);
        return BW_INVALID_ARGUMENT;
    }
    if (!req->holder) {
        snprintf(err, errlen, "holder (host and pid of the trainer) is required");
        return BW_INVALID_ARGUMENT;
    }
    if ((rc = bw__check_text("holder.host", req->holder->host, BW_HOST_MAX - 1, err, errlen)))
        return rc;
    if (req->holder->pid == 0) {
        snprintf(err, errlen, "holder.pid is required");
        return BW_INVALID_ARGUMENT;
    }
    Batchwire__V1__JoinJobResponse *out = bw__arena_alloc(arena, sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__join_job_response__init(out);

    pthread_mutex_lock(&s->mu);
    *wait_seq = s->last_seq;
    bw_job *job;
    bw_rank_state *r;
    uint64_t now = bw__mono_ms();
    job = bw__jobs_find(s, req->job);
    if (job && (rc = bw__jobs_check_owner(job, who, err, errlen)) != BW_OK) {
        ; /* refused before anything about the job is said */
    } else if (job && req->world_size != job->world_size) {
        snprintf(err, errlen,
                 "world_size %u does not match job '%s''s world size %u; to continue with %u "
                 "ranks, resume the job elastically (ResumeElastic) from every rank's cursor",
                 req->world_size, req->job, job->world_size, req->world_size);
        rc = BW_FAILED_PRECONDITION;
    } else {
        rc = locate(s, who, req->job, req->rank, &job, &r, err, errlen);
    }
    bool same = rc == BW_OK && r->leased && strcmp(r->host, req->holder->host) == 0 &&
                r->pid == req->holder->pid;
    /* A trainer restarted on the holder's own host, which saw the holder's process gone. */
    bool reclaim = rc == BW_OK && !same && r->leased && req->reclaim_pid != 0 &&
                   r->pid == req->reclaim_pid && strcmp(r->host, req->holder->host) == 0;
    if (reclaim)
        BW_INFO(
            "job=%s rank=%u holder=%s:%u reclaims the rank from its exited holder exited_pid=%u",
            req->job, req->rank, req->holder->host, req->holder->pid, r->pid);
    if (rc == BW_OK && bw__jobs_lease_live(s, r, now) && !same && !reclaim) {
        /* The LOCAL_RANK hint only for a holder that is heartbeating (every lease / 3): one
         * that has missed its beats may have died, and then the cure is waiting, not RANK. */
        uint64_t quiet = now - r->last_beat_ms;
        bool beating = quiet <= 2 * (r->lease_ms / 3);
        snprintf(err, errlen,
                 "rank %u of job '%s' is already held by host %s pid %u (heard from %.1f s ago; "
                 "the lease expires %.1f s after that); refusing host %s pid %u. %s",
                 req->rank, req->job, r->host, r->pid, (double)quiet / 1000.0,
                 (double)r->lease_ms / 1000.0, req->holder->host, req->holder->pid,
                 beating ? "Two trainers must not claim one rank: pass RANK, not LOCAL_RANK"
                         : "The holder has missed its heartbeats (it may have exited or been "
                           "paused): the rank is free when its lease expires, or at once for a "
                           "trainer restarted on the holder's host after its process exited");
        rc = BW_ALREADY_EXISTS;
    }
    /* Every join, also the holder's own again (a retried join, or after our restart), gets a
     * new lease: a lease id is only ever told to the caller that acquired it, and the one it
     * replaces stops working (docs/security.md, "Leases"). */
    if (rc == BW_OK) {
        bw_lease id;
        do {
            id.lo = bw__random_u64();
            id.hi = bw__random_u64();
        } while (id.lo == 0 && id.hi == 0);
        Batchwire__V1__RankJoined j = BATCHWIRE__V1__RANK_JOINED__INIT;
        j.job = req->job;
        j.rank = req->rank;
        j.holder = req->holder;
        j.lease_id = id.lo;
        j.lease_id_hi = id.hi;
        j.joined_unix_ms = bw__unix_ms();
        Batchwire__V1__JournalRecord rec = BATCHWIRE__V1__JOURNAL_RECORD__INIT;
        rec.change_case = BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_RANK_JOINED;
        rec.rank_joined = &j;
        bool taken = r->leased && !same; /* from another holder: expired, or reclaimed */
        rc = bw__jobs_commit_record(s, &rec, err, errlen);
        *wait_seq = s->last_seq;
        if (rc == BW_OK && taken)
            (*(reclaim ? &s->takeovers_reclaimed : &s->takeovers_expired))++;
        if (rc == BW_OK)
            BW_INFO("job=%s rank=%u holder=%s:%u world_size=%u joined%s", req->job, req->rank,
                    req->holder->host, req->holder->pid, req->world_size,
                    same ? ", again: its previous lease ends" : "");
    }
    if (rc == BW_OK) {
        out->lease_id = r->lease.lo;
        out->lease_id_hi = r->lease.hi;
        out->lease_ms = r->lease_ms; /* bw__jobs_lease_ms when the join was installed */
        out->heartbeat_ms = r->lease_ms / 3 ? r->lease_ms / 3 : 1;
        out->job = bw__jobs_summary(arena, job);
        size_t len = 0;
        uint8_t *c = r->committed ? r->cursor : bw__jobs_make_cursor(job, req->rank, 0, 0, &len);
        len = r->committed ? r->cursor_len : len;
        out->cursor.data = c ? bw__arena_alloc(arena, len ? len : 1) : NULL;
        if (out->cursor.data)
            memcpy(out->cursor.data, c, len);
        out->cursor.len = len;
        if (!r->committed)
            free(c);
        if (out->job && out->cursor.data &&
            bw__jobs_grant(s, job, req->rank, r, arena, &out->grant_claims, &out->grant_secret) !=
                BW_OK)
            out->job = NULL;
        if (!out->job || !out->cursor.data) {
            snprintf(err, errlen, "out of memory answering the join of rank %u: retry", req->rank);
            rc = BW_NOMEM;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == BW_OK) {
        out->placement_version = placement_version(s, arena, NULL);
        *resp = out;
    }
    return rc;
}

int bw__jobs_heartbeat(bw_jobs *s, const bw_principal *who,
                       const Batchwire__V1__LeaseHeartbeatRequest *req, bw_arena *arena,
                       Batchwire__V1__LeaseHeartbeatResponse **resp, uint64_t *wait_seq, char *err,
                       size_t errlen)
{
    int rc = bw__check_name("job", req->job, BW_JOB_NAME_MAX, err, errlen);
    if (rc != BW_OK)
        return rc;
    Batchwire__V1__LeaseHeartbeatResponse *out = bw__arena_alloc(arena, sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__lease_heartbeat_response__init(out);
    pthread_mutex_lock(&s->mu);
    *wait_seq = s->last_seq;
    bw_job *job;
    bw_rank_state *r;
    uint64_t now = bw__mono_ms();
    rc = locate(s, who, req->job, req->rank, &job, &r, err, errlen);
    if (rc == BW_OK &&
        (!r->leased || !bw__lease_eq(r->lease, (bw_lease){req->lease_id, req->lease_id_hi}))) {
        lease_gone(s, job, req->rank, r, now, err, errlen);
        rc = BW_LEASE_LOST;
    }
    if (rc == BW_OK) {
        r->last_beat_ms = now; /* an expired lease nobody took is renewed */
        r->lease_ms = bw__jobs_lease_ms(s);
        if (req->live)
            bw__jobs_live_report(r, r->lease, req->live, now);
        out->lease_ms = r->lease_ms;
        out->world_size = job->world_size;
        if (bw__jobs_grant(s, job, req->rank, r, arena, &out->grant_claims, &out->grant_secret) !=
            BW_OK) {
            snprintf(err, errlen, "out of memory renewing the read grant of rank %u: retry",
                     req->rank);
            rc = BW_NOMEM;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == BW_OK) {
        out->placement_version = placement_version(s, arena, NULL);
        *resp = out;
    }
    return rc;
}

int bw__jobs_leave(bw_jobs *s, const bw_principal *who, const Batchwire__V1__LeaveJobRequest *req,
                   bw_arena *arena, Batchwire__V1__LeaveJobResponse **resp, uint64_t *wait_seq,
                   char *err, size_t errlen)
{
    int rc = bw__check_name("job", req->job, BW_JOB_NAME_MAX, err, errlen);
    if (rc != BW_OK)
        return rc;
    if (req->lease_id == 0 && req->lease_id_hi == 0) {
        snprintf(err, errlen, "lease_id is required (the one JoinJob returned)");
        return BW_INVALID_ARGUMENT;
    }
    Batchwire__V1__LeaveJobResponse *out = bw__arena_alloc(arena, sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__leave_job_response__init(out);
    pthread_mutex_lock(&s->mu);
    *wait_seq = s->last_seq;
    bw_job *job;
    bw_rank_state *r;
    rc = locate(s, who, req->job, req->rank, &job, &r, err, errlen);
    /* Not the rank's lease (any more): a retry of a leave that was applied, or a trainer
     * whose lease expired and was taken over. Either way it must not touch the rank. */
    if (rc == BW_OK && r->leased &&
        bw__lease_eq(r->lease, (bw_lease){req->lease_id, req->lease_id_hi})) {
        char host[BW_HOST_MAX];
        uint32_t pid = r->pid;
        snprintf(host, sizeof(host), "%s", r->host);
        Batchwire__V1__RankLeft left = BATCHWIRE__V1__RANK_LEFT__INIT;
        left.job = job->name;
        left.rank = req->rank;
        left.lease_id = req->lease_id;
        left.lease_id_hi = req->lease_id_hi;
        left.left_unix_ms = bw__unix_ms();
        left.finished = req->finished;
        Batchwire__V1__JournalRecord rec = BATCHWIRE__V1__JOURNAL_RECORD__INIT;
        rec.change_case = BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_RANK_LEFT;
        rec.rank_left = &left;
        rc = bw__jobs_commit_record(s, &rec, err, errlen);
        *wait_seq = s->last_seq;
        if (rc == BW_OK) {
            out->released = true;
            BW_INFO("job=%s rank=%u holder=%s:%u left%s: the rank is free", req->job, req->rank,
                    host, pid, req->finished ? " after its last epoch" : "");
            rc = bw__jobs_finish_if_done(s, job, wait_seq, err, errlen);
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == BW_OK)
        *resp = out;
    return rc;
}

int bw__jobs_commit(bw_jobs *s, const bw_principal *who,
                    const Batchwire__V1__CommitCursorRequest *req, bw_arena *arena,
                    Batchwire__V1__CommitCursorResponse **resp, uint64_t *wait_seq, char *err,
                    size_t errlen)
{
    int rc = bw__check_name("job", req->job, BW_JOB_NAME_MAX, err, errlen);
    if (rc != BW_OK)
        return rc;
    Batchwire__V1__Cursor *c = NULL;
    char why[512];
    rc = bw__cursor_decode(req->cursor.data, req->cursor.len, arena, &c, why, sizeof(why));
    if (rc != BW_OK) {
        snprintf(err, errlen, "cursor: %s", why);
        return rc;
    }
    Batchwire__V1__CommitCursorResponse *out = bw__arena_alloc(arena, sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__commit_cursor_response__init(out);

    pthread_mutex_lock(&s->mu);
    *wait_seq = s->last_seq;
    bw_job *job;
    bw_rank_state *r;
    bw__plan *plan = NULL;
    uint64_t now = bw__mono_ms();
    rc = locate(s, who, req->job, req->rank, &job, &r, err, errlen);
    if (rc != BW_OK)
        goto out;
    if (c->job_fingerprint != job->fingerprint) {
        bw_job *other = NULL;
        for (size_t k = 0; k < s->njobs && !other; k++)
            if (s->jobs[k]->fingerprint == c->job_fingerprint)
                other = s->jobs[k];
        snprintf(err, errlen,
                 "the cursor belongs to %s%s%s (fingerprint %016" PRIx64 "), not to job '%s' "
                 "(fingerprint %016" PRIx64 "): a cursor only resumes the job and dataset it was "
                 "made for",
                 other ? "job '" : "another job or dataset", other ? other->name : "",
                 other ? "'" : "", c->job_fingerprint, job->name, job->fingerprint);
        rc = BW_MISMATCH;
        goto out;
    }
    if (c->rank != req->rank || c->world_size != job->world_size) {
        snprintf(err, errlen,
                 "the cursor is rank %u of world size %u, but the commit is for rank %u of job "
                 "'%s' at world size %u",
                 c->rank, c->world_size, req->rank, job->name, job->world_size);
        rc = BW_MISMATCH;
        goto out;
    }
    if (!r->leased || !bw__lease_eq(r->lease, (bw_lease){req->lease_id, req->lease_id_hi})) {
        lease_gone(s, job, req->rank, r, now, err, errlen);
        rc = BW_LEASE_LOST;
        goto out;
    }
    const Batchwire__V1__WorldSegment *last = &job->history[job->nhistory - 1];
    if (c->epoch < last->epoch || (c->epoch == last->epoch && c->step < last->start_step)) {
        snprintf(err, errlen,
                 "the cursor (epoch %" PRIu64 " step %" PRIu64 ") precedes the start of world "
                 "size %u (epoch %" PRIu64 " step %" PRIu64 ")",
                 c->epoch, c->step, job->world_size, last->epoch, last->start_step);
        rc = BW_FAILED_PRECONDITION;
        goto out;
    }
    rc = bw__jobs_plan(job, NULL, c->epoch, &plan, why, sizeof(why));
    if (rc != BW_OK) {
        snprintf(err, errlen, "cannot check the cursor: %s", why);
        goto out;
    }
    uint64_t end = bw__plan_end_step(plan, req->rank);
    if (c->step > end) {
        snprintf(err, errlen,
                 "the cursor's step %" PRIu64 " is past the end of epoch %" PRIu64
                 " for rank %u (%" PRIu64 " steps)",
                 c->step, c->epoch, req->rank, end);
        rc = BW_OUT_OF_RANGE;
        goto out;
    }
    size_t len;
    uint8_t *bin = bw__cursor_encode(c, &len); /* stored in binary, whatever form it came in */
    if (!bin) {
        snprintf(err, errlen, "out of memory encoding the cursor: retry");
        rc = BW_NOMEM;
        goto out;
    }
    Batchwire__V1__CursorCommitted cc = BATCHWIRE__V1__CURSOR_COMMITTED__INIT;
    cc.job = job->name;
    cc.rank = req->rank;
    cc.epoch = c->epoch;
    cc.step = c->step;
    cc.committed_unix_ms = bw__unix_ms();
    cc.cursor.data = bin;
    cc.cursor.len = len;
    Batchwire__V1__JournalRecord rec = BATCHWIRE__V1__JOURNAL_RECORD__INIT;
    rec.change_case = BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_CURSOR_COMMITTED;
    rec.cursor_committed = &cc;
    rc = bw__jobs_commit_record(s, &rec, err, errlen);
    free(bin);
    if (rc == BW_OK) {
        s->commits++;
        r->last_beat_ms = now; /* a commit is a sign of life too */
        *wait_seq = s->last_seq;
        *resp = out;
    }
out:
    pthread_mutex_unlock(&s->mu);
    bw__plan_free(plan);
    return rc;
}

int bw__jobs_get(bw_jobs *s, const bw_principal *who, const Batchwire__V1__GetJobRequest *req,
                 bw_arena *arena, Batchwire__V1__GetJobResponse **resp, uint64_t *wait_seq,
                 char *err, size_t errlen)
{
    int rc = bw__check_name("job name", req->name, BW_JOB_NAME_MAX, err, errlen);
    if (rc != BW_OK)
        return rc;
    Batchwire__V1__GetJobResponse *out = bw__arena_alloc(arena, sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__get_job_response__init(out);
    pthread_mutex_lock(&s->mu);
    *wait_seq = s->last_seq;
    uint64_t now = bw__mono_ms();
    bw_job *job = bw__jobs_find(s, req->name);
    if (!job) {
        snprintf(err, errlen, "no job named '%s'", req->name);
        rc = BW_NOT_FOUND;
        goto out;
    }
    if ((rc = bw__jobs_check_owner(job, who, err, errlen)) != BW_OK)
        goto out;
    out->job = bw__jobs_summary(arena, job);
    out->ranks = bw__arena_alloc(arena, (job->world_size + 1) * sizeof(*out->ranks));
    Batchwire__V1__RankProgress *rp = bw__arena_alloc(arena, (job->world_size + 1) * sizeof(*rp));
    if (!out->job || !out->ranks || !rp) {
        rc = BW_NOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < job->world_size; i++) {
        const bw_rank_state *r = &job->ranks[i];
        Batchwire__V1__RankProgress *p = &rp[i];
        batchwire__v1__rank_progress__init(p);
        p->rank = i;
        p->lease = !r->leased ? BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_NONE
                   : bw__jobs_lease_live(s, r, now)
                       ? BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_LIVE
                       : BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_EXPIRED;
        if (r->leased) {
            p->holder = bw__arena_alloc(arena, sizeof(*p->holder));
            if (!p->holder) {
                rc = BW_NOMEM;
                goto out;
            }
            batchwire__v1__holder__init(p->holder);
            p->holder->host = bw__arena_strdup(arena, r->host);
            p->holder->pid = r->pid;
            p->ms_since_heartbeat = now - r->last_beat_ms;
        }
        p->committed = r->committed;
        p->epoch = r->epoch;
        p->step = r->step;
        p->committed_unix_ms = r->committed_unix_ms;
        if (r->committed && r->cursor_len) { /* copied: a commit may free r->cursor */
            p->cursor.data = bw__arena_alloc(arena, r->cursor_len);
            if (!p->cursor.data) {
                rc = BW_NOMEM;
                goto out;
            }
            memcpy(p->cursor.data, r->cursor, r->cursor_len);
            p->cursor.len = r->cursor_len;
        }
        if (bw__jobs_live_fill(r, now, arena, p) != BW_OK) {
            rc = BW_NOMEM;
            goto out;
        }
        out->ranks[i] = p;
    }
    out->n_ranks = job->world_size;
out:
    pthread_mutex_unlock(&s->mu);
    if (rc == BW_OK) {
        placement_version(s, arena, &out->placement);
        *resp = out;
    }
    return rc;
}

static int by_name(const void *a, const void *b)
{
    const Batchwire__V1__JobListEntry *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

int bw__jobs_list(bw_jobs *s, const bw_principal *who, bw_arena *arena,
                  Batchwire__V1__ListJobsResponse **resp, uint64_t *wait_seq, char *err,
                  size_t errlen)
{
    (void)err;
    (void)errlen;
    Batchwire__V1__ListJobsResponse *out = bw__arena_alloc(arena, sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__list_jobs_response__init(out);
    int rc = BW_OK;
    pthread_mutex_lock(&s->mu);
    *wait_seq = s->last_seq;
    uint64_t now = bw__mono_ms();
    out->jobs = bw__arena_alloc(arena, (s->njobs + 1) * sizeof(*out->jobs));
    Batchwire__V1__JobListEntry *es = bw__arena_alloc(arena, (s->njobs + 1) * sizeof(*es));
    if (!out->jobs || !es)
        rc = BW_NOMEM;
    size_t n = 0;
    for (size_t i = 0; rc == BW_OK && i < s->njobs; i++) {
        const bw_job *job = s->jobs[i];
        if (!bw__auth_owns(who, job->owner))
            continue; /* a trainer lists its own jobs (and those made on an open service) */
        Batchwire__V1__JobListEntry *e = &es[n];
        batchwire__v1__job_list_entry__init(e);
        e->name = bw__arena_strdup(arena, job->name);
        e->world_size = job->world_size;
        e->fingerprint = job->fingerprint;
        e->num_samples = job->dataset->length;
        e->owner = bw__arena_strdup(arena, job->owner);
        bool any = false;
        for (uint32_t r = 0; r < job->world_size; r++) {
            const bw_rank_state *st = &job->ranks[r];
            e->ranks_live += bw__jobs_lease_live(s, st, now);
            if (!st->committed)
                continue;
            e->ranks_committed++;
            bool lower = !any || st->epoch < e->min_epoch ||
                         (st->epoch == e->min_epoch && st->step < e->min_step);
            bool higher = !any || st->epoch > e->max_epoch ||
                          (st->epoch == e->max_epoch && st->step > e->max_step);
            if (lower) {
                e->min_epoch = st->epoch;
                e->min_step = st->step;
            }
            if (higher) {
                e->max_epoch = st->epoch;
                e->max_step = st->step;
            }
            any = true;
        }
        out->jobs[n++] = e;
        if (!e->name || !e->owner)
            rc = BW_NOMEM;
    }
    out->n_jobs = rc == BW_OK ? n : 0;
    pthread_mutex_unlock(&s->mu);
    if (rc == BW_OK) {
        qsort(out->jobs, out->n_jobs, sizeof(*out->jobs), by_name);
        *resp = out;
    }
    return rc;
}
