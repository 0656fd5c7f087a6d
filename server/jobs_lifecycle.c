/* How jobs end (docs/security.md, "Jobs"): deleted by their owner or an admin, removed once
 * every rank left after its last epoch, or removed after --job-ttl without activity. Each is
 * one JobDeleted record; the ranks' cursors stay valid, so a job created again with the same
 * name, dataset and sampler resumes from them. */
#include "jobs_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/util.h"

/* Under s->mu: journals the removal of `job`; it is freed. */
static int journal_removal(bw_jobs *s, bw_job *job, const char *reason, char *err, size_t errlen)
{
    char name[BW_JOB_NAME_MAX + 1];
    snprintf(name, sizeof(name), "%s", job->name);
    Batchwire__V1__JobDeleted d = BATCHWIRE__V1__JOB_DELETED__INIT;
    d.job = name;
    d.reason = (char *)reason;
    d.deleted_unix_ms = bw__unix_ms();
    Batchwire__V1__JournalRecord rec = BATCHWIRE__V1__JOURNAL_RECORD__INIT;
    rec.change_case = BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_JOB_DELETED;
    rec.job_deleted = &d;
    int rc = bw__jobs_commit_record(s, &rec, err, errlen);
    if (rc == BW_OK)
        BW_INFO("job=%s removed: %s", name, reason);
    return rc;
}

int bw__jobs_finish_if_done(bw_jobs *s, bw_job *job, uint64_t *wait_seq, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < job->world_size; i++)
        if (job->ranks[i].leased || !job->ranks[i].finished)
            return BW_OK;
    int rc = journal_removal(s, job, "every rank left after its last epoch", err, errlen);
    *wait_seq = s->last_seq;
    return rc;
}

int bw__jobs_delete(bw_jobs *s, const bw_principal *who, const Batchwire__V1__DeleteJobRequest *req,
                    bw_arena *arena, Batchwire__V1__DeleteJobResponse **resp, uint64_t *wait_seq,
                    char *err, size_t errlen)
{
    int rc = bw__check_name("job", req->job, BW_JOB_NAME_MAX, err, errlen);
    if (rc != BW_OK)
        return rc;
    Batchwire__V1__DeleteJobResponse *out = bw__arena_alloc(arena, sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__delete_job_response__init(out);
    pthread_mutex_lock(&s->mu);
    *wait_seq = s->last_seq;
    bw_job *job = bw__jobs_find(s, req->job);
    if (!job) {
        snprintf(err, errlen, "no job named '%s'", req->job);
        rc = BW_NOT_FOUND;
    } else if ((rc = bw__jobs_check_owner(job, who, err, errlen)) == BW_OK) {
        char reason[BW_PRINCIPAL_NAME_MAX + 64];
        snprintf(reason, sizeof(reason), "deleted by %s%s%s", bw__role_name(who->role),
                 who->name[0] ? " " : "", who->name);
        rc = journal_removal(s, job, reason, err, errlen);
        *wait_seq = s->last_seq;
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == BW_OK)
        *resp = out;
    return rc;
}

size_t bw__jobs_expire(bw_jobs *s, uint64_t ttl_ms)
{
    size_t removed = 0;
    uint64_t now_unix = bw__unix_ms(), now = bw__mono_ms();
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->njobs;) {
        bw_job *job = s->jobs[i];
        bool live = false;
        for (uint32_t r = 0; r < job->world_size && !live; r++)
            live = bw__jobs_lease_live(s, &job->ranks[r], now);
        if (live || job->active_unix_ms + ttl_ms > now_unix) {
            i++;
            continue;
        }
        char reason[96], err[256];
        snprintf(reason, sizeof(reason), "idle for %" PRIu64 " s, past --job-ttl (%" PRIu64 " s)",
                 (now_unix - job->active_unix_ms) / 1000, ttl_ms / 1000);
        if (journal_removal(s, job, reason, err, sizeof(err)) != BW_OK) {
            BW_WARN("cannot remove idle job '%s': %s", job->name, err);
            break; /* the journal is failing: try again at the next sweep */
        }
        removed++; /* the next job moved into slot i */
    }
    pthread_mutex_unlock(&s->mu);
    return removed;
}
