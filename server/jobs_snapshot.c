/* Snapshots of the jobs state: the whole state packed as one Snapshot under the state's lock,
 * and compaction (a journal rotation, then the snapshot written off the lock;
 * core/journal/journal.h). */
#include "jobs_int.h"

#include <stdio.h>
#include <stdlib.h>

#include "batchwire/batchwire.h"
#include "common/util.h"

static Batchwire__V1__Holder *holder(bw_arena *a, const char *host, uint32_t pid)
{
    Batchwire__V1__Holder *h = bw__arena_alloc(a, sizeof(*h));
    if (!h)
        return NULL;
    batchwire__v1__holder__init(h);
    h->host = bw__arena_strdup(a, host);
    h->pid = pid;
    return h->host ? h : NULL;
}

/* Under s->mu: the whole state as one packed Snapshot; malloc'ed, or NULL when memory ran
 * out. */
static uint8_t *snapshot_pack(bw_jobs *s, uint64_t seq, size_t *len)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    uint8_t *buf = NULL;
    Batchwire__V1__Snapshot snap = BATCHWIRE__V1__SNAPSHOT__INIT;
    snap.seq = seq;
    snap.written_unix_ms = bw__unix_ms();
    snap.n_jobs = s->njobs;
    snap.jobs = bw__arena_alloc(&a, (s->njobs + 1) * sizeof(*snap.jobs));
    if (!snap.jobs)
        goto out;
    for (size_t i = 0; i < s->njobs; i++) {
        const bw_job *job = s->jobs[i];
        Batchwire__V1__JobSnapshot *js = bw__arena_alloc(&a, sizeof(*js));
        Batchwire__V1__RankSnapshot *rs = bw__arena_alloc(&a, (job->world_size + 1) * sizeof(*rs));
        Batchwire__V1__RankSnapshot **rp = bw__arena_alloc(&a, (job->world_size + 1) * sizeof(*rp));
        if (!js || !rs || !rp)
            goto out;
        batchwire__v1__job_snapshot__init(js);
        js->job = bw__jobs_summary(&a, job);
        if (!js->job)
            goto out;
        js->ranks = rp;
        js->active_unix_ms = job->active_unix_ms;
        for (uint32_t r = 0; r < job->world_size; r++) {
            const bw_rank_state *st = &job->ranks[r];
            if (!st->leased && !st->committed && !st->finished)
                continue;
            Batchwire__V1__RankSnapshot *x = &rs[js->n_ranks];
            batchwire__v1__rank_snapshot__init(x);
            x->rank = r;
            if (st->leased) {
                if (!(x->holder = holder(&a, st->host, st->pid)))
                    goto out;
                x->lease_id = st->lease.lo;
                x->lease_id_hi = st->lease.hi;
                x->joined_unix_ms = st->joined_unix_ms;
            }
            x->finished = st->finished;
            x->committed = st->committed;
            x->epoch = st->epoch;
            x->step = st->step;
            x->committed_unix_ms = st->committed_unix_ms;
            x->cursor.data = st->cursor;
            x->cursor.len = st->cursor_len;
            rp[js->n_ranks++] = x;
        }
        snap.jobs[i] = js;
    }
    *len = batchwire__v1__snapshot__get_packed_size(&snap);
    buf = malloc(*len ? *len : 1);
    if (buf)
        batchwire__v1__snapshot__pack(&snap, buf);
out:
    bw__arena_reset(&a);
    return buf;
}

int bw__jobs_compact(bw_jobs *s, uint64_t min_bytes, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->mu);
    if (bw__journal_bytes_since_snapshot(s->journal) < (min_bytes ? min_bytes : 1)) {
        pthread_mutex_unlock(&s->mu);
        return BW_OK;
    }
    uint64_t seq;
    int rc = bw__journal_rotate(s->journal, &seq);
    if (rc != BW_OK) {
        pthread_mutex_unlock(&s->mu);
        if (rc == BW_UNAVAILABLE)
            return BW_OK; /* a rotation is still pending; next time */
        snprintf(err, errlen, "cannot rotate the journal: %s",
                 rc == BW_NOMEM ? "out of memory" : "the journal has failed");
        return rc;
    }
    size_t len, njobs = s->njobs;
    uint8_t *buf = snapshot_pack(s, seq, &len);
    pthread_mutex_unlock(&s->mu);
    if (!buf) {
        snprintf(err, errlen, "out of memory packing a snapshot of %zu jobs", njobs);
        return BW_NOMEM;
    }
    rc = bw__journal_write_snapshot(s->journal, seq, buf, len, err, errlen);
    free(buf);
    return rc;
}
