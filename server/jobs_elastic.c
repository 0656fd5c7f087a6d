/* Elastic resume (docs/semantics.md, "Elastic resume") and the plan checks behind it: a job
 * continues with a new world size from a consistent set of cursors, recorded as a new segment
 * of the epoch's world-size history; the planner re-shards the rest of the epoch. */
#include "jobs_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "cursor/cursor.h"

int bw__jobs_plan(const bw_job *job, const Batchwire__V1__WorldSegment *extra, uint64_t epoch,
                  bw__plan **out, char *err, size_t errlen)
{
    *out = NULL;
    size_t n = job->nhistory + (extra != NULL);
    const Batchwire__V1__WorldSegment **history = malloc(n * sizeof(*history));
    if (!history) {
        snprintf(err, errlen, "out of memory for the world-size history of job '%s'", job->name);
        return BW_NOMEM;
    }
    for (size_t i = 0; i < job->nhistory; i++)
        history[i] = &job->history[i];
    if (extra)
        history[job->nhistory] = extra;
    int rc =
        bw__plan_new_for_job(job->config, job->dataset, history, n, epoch, true, out, err, errlen);
    free(history);
    return rc;
}

/* Appends "3, 5, 7" (at most a few dozen) to out. */
static void list_ranks(const uint32_t *ranks, size_t n, char *out, size_t outlen)
{
    size_t o = strlen(out);
    for (size_t i = 0; i < n && o + 16 < outlen; i++) {
        if (i == 32) {
            snprintf(out + o, outlen - o, ", ... (%zu in all)", n);
            return;
        }
        o += (size_t)snprintf(out + o, outlen - o, "%s%u", i ? "," : "", ranks[i]);
    }
}

typedef struct group {
    uint64_t epoch, step;
    uint32_t *ranks;
    size_t n;
} group;

static int by_position(const void *a, const void *b)
{
    const group *x = a, *y = b;
    if (x->epoch != y->epoch)
        return x->epoch < y->epoch ? -1 : 1;
    return x->step < y->step ? -1 : x->step > y->step;
}

int bw__jobs_resume(bw_jobs *s, const bw_principal *who,
                    const Batchwire__V1__ResumeElasticRequest *req, bw_arena *arena,
                    Batchwire__V1__ResumeElasticResponse **resp, uint64_t *wait_seq, char *err,
                    size_t errlen)
{
    int rc = bw__check_name("job", req->job, BW_JOB_NAME_MAX, err, errlen);
    if (rc != BW_OK)
        return rc;
    if (req->world_size == 0 || req->world_size > s->opts.max_world_size) {
        snprintf(err, errlen, "world_size %u must be from 1 to %u", req->world_size,
                 s->opts.max_world_size);
        return BW_INVALID_ARGUMENT;
    }
    if (req->n_cursors == 0 || req->n_cursors > s->opts.max_world_size) {
        snprintf(err, errlen,
                 "%zu cursors: give one cursor per rank of the world being resumed (1 to %u)",
                 req->n_cursors, s->opts.max_world_size);
        return BW_INVALID_ARGUMENT;
    }
    Batchwire__V1__Cursor **cur = bw__arena_alloc(arena, req->n_cursors * sizeof(*cur));
    group *groups = bw__arena_alloc(arena, req->n_cursors * sizeof(*groups));
    uint32_t *scratch = bw__arena_alloc(arena, req->n_cursors * sizeof(uint32_t));
    if (!cur || !groups || !scratch)
        return BW_NOMEM;
    for (size_t i = 0; i < req->n_cursors; i++) {
        char why[256];
        rc = bw__cursor_decode(req->cursors[i].data, req->cursors[i].len, arena, &cur[i], why,
                               sizeof(why));
        if (rc != BW_OK) {
            snprintf(err, errlen, "cursor %zu: %s", i, why);
            return rc;
        }
    }

    pthread_mutex_lock(&s->mu);
    *wait_seq = s->last_seq;
    bw_job *job = bw__jobs_find(s, req->job);
    bw__plan *plan = NULL;
    if (!job) {
        snprintf(err, errlen, "no job named '%s'", req->job);
        rc = BW_NOT_FOUND;
        goto out;
    }
    if ((rc = bw__jobs_check_owner(job, who, err, errlen)) != BW_OK)
        goto out;
    uint32_t old_world = cur[0]->world_size;
    for (size_t i = 0; i < req->n_cursors; i++) {
        const Batchwire__V1__Cursor *c = cur[i];
        if (c->job_fingerprint != job->fingerprint) {
            bw_job *other = NULL;
            for (size_t k = 0; k < s->njobs && !other; k++)
                if (s->jobs[k]->fingerprint == c->job_fingerprint)
                    other = s->jobs[k];
            snprintf(err, errlen,
                     "cursor %zu (rank %u) belongs to %s%s%s (fingerprint %016" PRIx64
                     "), not to job '%s' (fingerprint %016" PRIx64 ")",
                     i, c->rank, other ? "job '" : "another job or dataset",
                     other ? other->name : "", other ? "'" : "", c->job_fingerprint, req->job,
                     job->fingerprint);
            rc = BW_MISMATCH;
            goto out;
        }
        if (c->world_size != old_world) {
            snprintf(err, errlen,
                     "cursor %zu (rank %u) was made at world size %u but cursor 0 at world size "
                     "%u: take every cursor from the same checkpoint",
                     i, c->rank, c->world_size, old_world);
            rc = BW_FAILED_PRECONDITION;
            goto out;
        }
    }
    /* Every rank of the old world exactly once. */
    uint8_t *seen = bw__arena_alloc(arena, old_world);
    if (!seen) {
        rc = BW_NOMEM;
        goto out;
    }
    memset(seen, 0, old_world);
    size_t ndup = 0;
    for (size_t i = 0; i < req->n_cursors; i++) {
        if (seen[cur[i]->rank]++ == 1)
            scratch[ndup++] = cur[i]->rank;
    }
    if (ndup) {
        snprintf(err, errlen, "more than one cursor for rank(s) ");
        list_ranks(scratch, ndup, err, errlen);
        rc = BW_INVALID_ARGUMENT;
        goto out;
    }
    size_t nmiss = 0;
    uint32_t *missing = bw__arena_alloc(arena, (size_t)old_world * sizeof(uint32_t));
    if (!missing) {
        rc = BW_NOMEM;
        goto out;
    }
    for (uint32_t r = 0; r < old_world; r++)
        if (!seen[r])
            missing[nmiss++] = r;
    if (nmiss) {
        snprintf(err, errlen, "cursors of world size %u lack rank(s) ", old_world);
        list_ranks(missing, nmiss, err, errlen);
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, ": give one cursor per rank of the old world");
        rc = BW_INVALID_ARGUMENT;
        goto out;
    }
    /* All at the same step of the same epoch? */
    size_t ng = 0;
    for (size_t i = 0; i < req->n_cursors; i++) {
        size_t g = 0;
        while (g < ng && (groups[g].epoch != cur[i]->epoch || groups[g].step != cur[i]->step))
            g++;
        if (g == ng) {
            groups[ng].epoch = cur[i]->epoch;
            groups[ng].step = cur[i]->step;
            groups[ng].ranks = bw__arena_alloc(arena, req->n_cursors * sizeof(uint32_t));
            groups[ng].n = 0;
            if (!groups[ng].ranks) {
                rc = BW_NOMEM;
                goto out;
            }
            ng++;
        }
        groups[g].ranks[groups[g].n++] = cur[i]->rank;
    }
    if (ng > 1) {
        qsort(groups, ng, sizeof(*groups), by_position);
        snprintf(err, errlen, "cursors disagree, so the ranks did not stop at one step: ");
        for (size_t g = 0; g < ng; g++) {
            size_t used = strlen(err);
            snprintf(err + used, errlen - used, "%sepoch %" PRIu64 " step %" PRIu64 ": rank%s ",
                     g ? "; " : "", groups[g].epoch, groups[g].step, groups[g].n > 1 ? "s" : "");
            list_ranks(groups[g].ranks, groups[g].n, err, errlen);
        }
        size_t used = strlen(err);
        snprintf(err + used, errlen - used,
                 ". Resume from cursors saved at the same step by every rank (one checkpoint)");
        rc = BW_FAILED_PRECONDITION;
        goto out;
    }
    uint64_t epoch = groups[0].epoch, step = groups[0].step;
    Batchwire__V1__ResumeElasticResponse *out = bw__arena_alloc(arena, sizeof(*out));
    if (!out) {
        rc = BW_NOMEM;
        goto out;
    }
    batchwire__v1__resume_elastic_response__init(out);
    const Batchwire__V1__WorldSegment *last = &job->history[job->nhistory - 1];
    bool already = job->nhistory >= 2 && last->epoch == epoch && last->start_step == step &&
                   last->world_size == req->world_size &&
                   job->history[job->nhistory - 2].world_size == old_world;
    if (already || (old_world == job->world_size && req->world_size == job->world_size)) {
        out->resumed = false; /* recorded before (a retry), or nothing to change */
    } else {
        if (old_world != job->world_size) {
            snprintf(err, errlen,
                     "the cursors were made at world size %u but job '%s' runs at world size %u "
                     "now (since epoch %" PRIu64 " step %" PRIu64 ")",
                     old_world, job->name, job->world_size, last->epoch, last->start_step);
            rc = BW_FAILED_PRECONDITION;
            goto out;
        }
        if (epoch < last->epoch || (epoch == last->epoch && step < last->start_step)) {
            snprintf(err, errlen,
                     "the cursors (epoch %" PRIu64 " step %" PRIu64 ") are older than the "
                     "current world size's start (epoch %" PRIu64 " step %" PRIu64 ")",
                     epoch, step, last->epoch, last->start_step);
            rc = BW_FAILED_PRECONDITION;
            goto out;
        }
        /* The plan of the epoch with this resize recorded must exist: the one every later
         * plan of the epoch is made from. */
        Batchwire__V1__WorldSegment seg = BATCHWIRE__V1__WORLD_SEGMENT__INIT;
        seg.epoch = epoch;
        seg.start_step = step;
        seg.world_size = req->world_size;
        char why[512];
        rc = bw__jobs_plan(job, &seg, epoch, &plan, why, sizeof(why));
        if (rc != BW_OK) {
            snprintf(err, errlen,
                     "cannot resume job '%s' at epoch %" PRIu64 " step %" PRIu64
                     " with world size %u: %s",
                     job->name, epoch, step, req->world_size, why);
            rc = rc == BW_NOMEM ? BW_NOMEM : BW_FAILED_PRECONDITION;
            goto out;
        }
        Batchwire__V1__ElasticResumed er = BATCHWIRE__V1__ELASTIC_RESUMED__INIT;
        er.job = job->name;
        er.segment = &seg;
        Batchwire__V1__JournalRecord rec = BATCHWIRE__V1__JOURNAL_RECORD__INIT;
        rec.change_case = BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_ELASTIC_RESUMED;
        rec.elastic_resumed = &er;
        rc = bw__jobs_commit_record(s, &rec, err, errlen);
        if (rc != BW_OK)
            goto out;
        *wait_seq = s->last_seq;
        out->resumed = true;
        BW_INFO("job=%s resumed elastically world_size=%u old_world_size=%u epoch=%" PRIu64
                " step=%" PRIu64,
                job->name, req->world_size, old_world, epoch, step);
    }
    out->job = bw__jobs_summary(arena, job);
    if (!out->job) {
        rc = BW_NOMEM;
        goto out;
    }
    *resp = out;
out:
    pthread_mutex_unlock(&s->mu);
    bw__plan_free(plan);
    return rc;
}
