/* The jobs state in memory (jobs_int.h): the table of jobs and their ranks, what the
 * operations ask of it (a job by name, a rank's lease, ownership, a job's summary, cursors and
 * fingerprint), and freeing it. How it changes is in jobs_apply.c; how it is rebuilt on start
 * and written as a snapshot, in jobs_replay.c and jobs_snapshot.c. */
#include "jobs_int.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/util.h"
#include "cursor/cursor.h"

size_t bw__jobs_slot(const bw_jobs *s, const char *name)
{
    size_t lo = 0, hi = s->njobs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(s->jobs[mid]->name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bw_job *bw__jobs_find(bw_jobs *s, const char *name)
{
    size_t i = bw__jobs_slot(s, name);
    return i < s->njobs && strcmp(s->jobs[i]->name, name) == 0 ? s->jobs[i] : NULL;
}

bw_journal *bw__jobs_journal(bw_jobs *s)
{
    return s->journal;
}

void bw__jobs_set_placement(bw_jobs *s, bw_jobs_placement_fn fn, void *user)
{
    pthread_mutex_lock(&s->mu);
    s->placement = fn;
    s->placement_user = user;
    pthread_mutex_unlock(&s->mu);
}

void bw__jobs_ranks_free(bw_rank_state *ranks, uint32_t n)
{
    for (uint32_t r = 0; ranks && r < n; r++)
        free(ranks[r].cursor);
    free(ranks);
}

void bw__jobs_job_free(bw_job *job)
{
    if (!job)
        return;
    bw__jobs_ranks_free(job->ranks, job->world_size);
    free(job->history);
    free(job->source_hashes);
    if (job->config)
        protobuf_c_message_free_unpacked(&job->config->base, NULL);
    if (job->dataset)
        protobuf_c_message_free_unpacked(&job->dataset->base, NULL);
    free(job->name);
    free(job->owner);
    free(job);
}

uint8_t *bw__jobs_cursor_at(const bw_job *job, uint32_t world, uint32_t rank, uint64_t epoch,
                            uint64_t step, size_t *len)
{
    Batchwire__V1__Cursor c = BATCHWIRE__V1__CURSOR__INIT;
    c.job = job->name;
    c.job_fingerprint = job->fingerprint;
    c.rank = rank;
    c.world_size = world;
    c.epoch = epoch;
    c.step = step;
    return bw__cursor_encode(&c, len);
}

uint8_t *bw__jobs_make_cursor(const bw_job *job, uint32_t rank, uint64_t epoch, uint64_t step,
                              size_t *len)
{
    return bw__jobs_cursor_at(job, job->world_size, rank, epoch, step, len);
}

size_t bw__jobs_owned(const bw_jobs *s, const char *owner)
{
    size_t n = 0;
    for (size_t i = 0; i < s->njobs; i++)
        n += strcmp(s->jobs[i]->owner, owner) == 0;
    return n;
}

int bw__jobs_fingerprint(const char *name, const Batchwire__V1__JobConfig *cfg,
                         const Batchwire__V1__DatasetInfo *info, uint64_t *out, char *err,
                         size_t errlen)
{
    size_t ln = strlen(name) + 1; /* with its NUL: "ab"+cfg never equals "a"+"b"cfg */
    size_t la = batchwire__v1__job_config__get_packed_size(cfg);
    size_t lb = batchwire__v1__dataset_info__get_packed_size(info);
    uint8_t *buf = malloc(ln + la + lb);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (buf) {
        memcpy(buf, name, ln);
        batchwire__v1__job_config__pack(cfg, buf + ln);
        batchwire__v1__dataset_info__pack(info, buf + ln + la);
    }
    /* EVP_Digest fails only when OpenSSL cannot allocate its context. */
    bool ok = buf && EVP_Digest(buf, ln + la + lb, md, &mdlen, EVP_sha256(), NULL) == 1;
    free(buf);
    if (!ok) {
        snprintf(err, errlen, "out of memory computing job '%s''s fingerprint", name);
        return BW_NOMEM;
    }
    uint64_t fp = 0;
    for (int i = 0; i < 8; i++)
        fp = fp << 8 | md[i];
    *out = fp ? fp : 1; /* 0 means "no fingerprint" in a cursor */
    return BW_OK;
}

int bw__jobs_check_owner(const bw_job *job, const bw_principal *who, char *err, size_t errlen)
{
    if (bw__auth_owns(who, job->owner))
        return BW_OK;
    snprintf(err, errlen, "job '%s' belongs to another principal; '%s' may not use it", job->name,
             who->name);
    return BW_PERMISSION_DENIED;
}

bool bw__jobs_lease_live(const bw_jobs *s, const bw_rank_state *r, uint64_t now_ms)
{
    uint32_t len = r->lease_ms ? r->lease_ms : s->opts.lease_ms;
    return r->leased && now_ms - r->last_beat_ms <= len;
}

uint32_t bw__jobs_lease_ms(const bw_jobs *s)
{
    uint64_t len = s->opts.lease_ms;
    if (s->opts.max_heartbeats_per_s) {
        /* Each lease beats every third of its length: n leases of L ms ask 3000 n / L beats a
         * second, at most max when L >= 3000 n / max. */
        uint64_t need =
            (3000ull * s->leases + s->opts.max_heartbeats_per_s - 1) / s->opts.max_heartbeats_per_s;
        len = need > len ? need : len;
    }
    return len < BW_JOBS_LEASE_MAX_MS ? (uint32_t)len : BW_JOBS_LEASE_MAX_MS;
}

void bw__jobs_lease_started(bw_jobs *s, bw_rank_state *r)
{
    if (!r->leased)
        s->leases++;
    r->leased = true;
    r->last_beat_ms = bw__mono_ms();
    r->lease_ms = bw__jobs_lease_ms(s);
}

Batchwire__V1__JobSummary *bw__jobs_summary(bw_arena *a, const bw_job *job)
{
    Batchwire__V1__JobSummary *sum = bw__arena_alloc(a, sizeof(*sum));
    Batchwire__V1__WorldSegment **h = bw__arena_alloc(a, (job->nhistory + 1) * sizeof(*h));
    Batchwire__V1__WorldSegment *segs = bw__arena_alloc(a, (job->nhistory + 1) * sizeof(*segs));
    if (!sum || !h || !segs)
        return NULL;
    batchwire__v1__job_summary__init(sum);
    sum->name = bw__arena_strdup(a, job->name);
    sum->config = job->config;
    sum->dataset = job->dataset;
    sum->fingerprint = job->fingerprint;
    sum->world_size = job->world_size;
    sum->created_unix_ms = job->created_unix_ms;
    sum->owner = bw__arena_strdup(a, job->owner);
    for (size_t i = 0; i < job->nhistory; i++) {
        segs[i] = job->history[i];
        h[i] = &segs[i];
    }
    sum->history = h;
    sum->n_history = job->nhistory;
    return sum->name && sum->owner ? sum : NULL;
}

void bw__jobs_close(bw_jobs *s)
{
    if (!s)
        return;
    bw__journal_close(s->journal);
    for (size_t i = 0; i < s->njobs; i++)
        bw__jobs_job_free(s->jobs[i]);
    free(s->jobs);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
