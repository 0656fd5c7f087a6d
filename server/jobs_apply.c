/* How the jobs state changes (jobs_int.h): a journal record applies in two steps, prepare
 * (checks and allocates; an error changes nothing) and install (cannot fail), on the live path
 * (bw__jobs_commit_record: prepare, journal, install) and in replay (bw__jobs_apply_record),
 * so what a restart rebuilds is what was acknowledged; and a snapshot's job loads
 * (bw__jobs_load_job). */
#include "jobs_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/util.h"

/* A deep copy owned by the default allocator (free with protobuf_c_message_free_unpacked);
 * NULL when memory ran out. */
static ProtobufCMessage *dup_msg(const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return NULL;
    protobuf_c_message_pack(m, buf);
    ProtobufCMessage *copy = protobuf_c_message_unpack(m->descriptor, NULL, len, buf);
    free(buf);
    return copy;
}

static void rank_clear(bw_rank_state *r)
{
    free(r->cursor);
    memset(r, 0, sizeof(*r));
}

/* Room for one more history segment (the history itself is unchanged). */
static int reserve_segment(bw_job *job)
{
    Batchwire__V1__WorldSegment *h =
        realloc(job->history, (job->nhistory + 1) * sizeof(*job->history));
    if (!h)
        return BW_NOMEM;
    job->history = h;
    return BW_OK;
}

/* Appends a segment into the room reserve_segment made. */
static void append_segment(bw_job *job, uint64_t epoch, uint64_t start, uint32_t world)
{
    Batchwire__V1__WorldSegment *g = &job->history[job->nhistory++];
    batchwire__v1__world_segment__init(g);
    g->epoch = epoch;
    g->start_step = start;
    g->world_size = world;
}

/* Room for one more job in the table (the table itself is unchanged). */
static int reserve_job(bw_jobs *s)
{
    if (s->njobs < s->cap)
        return BW_OK;
    size_t cap = s->cap ? s->cap * 2 : 16;
    bw_job **jobs = realloc(s->jobs, cap * sizeof(*jobs));
    if (!jobs)
        return BW_NOMEM;
    s->jobs = jobs;
    s->cap = cap;
    return BW_OK;
}

/* Checks a job against the state and builds it with room for `nsegments` history segments
 * and a place in the table, but does not insert it: BW_CORRUPT or BW_NOMEM with a sentence,
 * and then nothing changed. */
static int make_job(bw_jobs *s, const char *name, const char *owner,
                    const Batchwire__V1__JobConfig *config,
                    const Batchwire__V1__DatasetInfo *dataset, uint64_t fingerprint, uint32_t world,
                    uint64_t created, size_t nsegments, bw_job **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!name || !*name || !config || !dataset || world == 0) {
        snprintf(err, errlen, "job record lacks a name, configuration, dataset or world size");
        return BW_CORRUPT;
    }
    if (bw__jobs_find(s, name)) {
        snprintf(err, errlen, "job '%s' is created twice", name);
        return BW_CORRUPT;
    }
    bw_job *job = calloc(1, sizeof(*job));
    if (job) {
        job->name = strdup(name);
        job->owner = strdup(owner ? owner : "");
        job->config = (Batchwire__V1__JobConfig *)dup_msg(&config->base);
        job->dataset = (Batchwire__V1__DatasetInfo *)dup_msg(&dataset->base);
        job->world_size = world;
        job->ranks = calloc(world, sizeof(*job->ranks));
        job->history = calloc(nsegments ? nsegments : 1, sizeof(*job->history));
    }
    if (!job || !job->name || !job->owner || !job->config || !job->dataset || !job->ranks ||
        !job->history || reserve_job(s) != BW_OK) {
        bw__jobs_job_free(job);
        snprintf(err, errlen, "out of memory for job '%s' (world size %u)", name, world);
        return BW_NOMEM;
    }
    job->fingerprint = fingerprint;
    job->created_unix_ms = created;
    job->active_unix_ms = created;
    *out = job;
    return BW_OK;
}

/* Inserts a job make_job built (its place is reserved) where its name sorts. */
static void insert_job(bw_jobs *s, bw_job *job)
{
    size_t i = bw__jobs_slot(s, job->name);
    memmove(&s->jobs[i + 1], &s->jobs[i], (s->njobs - i) * sizeof(*s->jobs));
    s->jobs[i] = job;
    s->njobs++;
}

/* Takes a job out of the table (the jobs after it move up one) and frees it. */
static void remove_job(bw_jobs *s, bw_job *job)
{
    size_t i = bw__jobs_slot(s, job->name);
    BW_INVARIANT(i < s->njobs && s->jobs[i] == job, "a job removed is in the table");
    memmove(&s->jobs[i], &s->jobs[i + 1], (s->njobs - i - 1) * sizeof(*s->jobs));
    s->njobs--;
    bw__jobs_job_free(job);
}

static int find_rank(bw_jobs *s, const char *name, uint32_t rank, bw_job **job, bw_rank_state **r,
                     char *err, size_t errlen)
{
    *job = name ? bw__jobs_find(s, name) : NULL;
    if (!*job) {
        snprintf(err, errlen, "record names job '%s', which does not exist", name ? name : "");
        return BW_CORRUPT;
    }
    if (rank >= (*job)->world_size) {
        snprintf(err, errlen, "record names rank %u of job '%s', whose world size is %u", rank,
                 name, (*job)->world_size);
        return BW_CORRUPT;
    }
    *r = &(*job)->ranks[rank];
    return BW_OK;
}

/*
 * Applying a record is two steps, so that it applies whole or not at all: prepare checks the
 * record against the state and allocates everything the change needs (an error here changes
 * nothing: BW_CORRUPT when the record contradicts the state, BW_NOMEM when memory ran out);
 * install then makes the change and cannot fail. Between the two the live path journals the
 * record, so the state never holds a change the journal lacks.
 */
typedef struct prepared {
    bw_job *job;          /* the record's job (JOB_CREATED: built, not yet in the table) */
    bw_rank_state *rank;  /* RANK_JOINED, RANK_LEFT, CURSOR_COMMITTED: the record's rank */
    uint8_t *cursor;      /* CURSOR_COMMITTED: the cursor's copy */
    bw_rank_state *ranks; /* ELASTIC_RESUMED: the new world's ranks with their cursors */
    uint32_t nranks;
} prepared;

static int prepare(bw_jobs *s, const Batchwire__V1__JournalRecord *rec, prepared *p, char *err,
                   size_t errlen)
{
    memset(p, 0, sizeof(*p));
    switch (rec->change_case) {
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_JOB_CREATED: {
        const Batchwire__V1__JobCreated *c = rec->job_created;
        return make_job(s, c->name, c->owner, c->config, c->dataset, c->fingerprint, c->world_size,
                        c->created_unix_ms, 1, &p->job, err, errlen);
    }
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_RANK_JOINED: {
        const Batchwire__V1__RankJoined *c = rec->rank_joined;
        return find_rank(s, c->job, c->rank, &p->job, &p->rank, err, errlen);
    }
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_RANK_LEFT: {
        const Batchwire__V1__RankLeft *c = rec->rank_left;
        int rc = find_rank(s, c->job, c->rank, &p->job, &p->rank, err, errlen);
        bw_lease l = {c->lease_id, c->lease_id_hi};
        if (rc == BW_OK && (!p->rank->leased || !bw__lease_eq(p->rank->lease, l))) {
            snprintf(err, errlen,
                     "record releases a lease of rank %u of job '%s' that the rank "
                     "does not hold",
                     c->rank, c->job);
            rc = BW_CORRUPT;
        }
        return rc;
    }
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_JOB_DELETED: {
        const Batchwire__V1__JobDeleted *c = rec->job_deleted;
        p->job = c->job ? bw__jobs_find(s, c->job) : NULL;
        if (!p->job) {
            snprintf(err, errlen, "record deletes job '%s', which does not exist",
                     c->job ? c->job : "");
            return BW_CORRUPT;
        }
        return BW_OK;
    }
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_CURSOR_COMMITTED: {
        const Batchwire__V1__CursorCommitted *c = rec->cursor_committed;
        int rc = find_rank(s, c->job, c->rank, &p->job, &p->rank, err, errlen);
        if (rc == BW_OK && !(p->cursor = malloc(c->cursor.len ? c->cursor.len : 1))) {
            snprintf(err, errlen, "out of memory for a cursor of %zu bytes", c->cursor.len);
            rc = BW_NOMEM;
        }
        if (rc == BW_OK)
            memcpy(p->cursor, c->cursor.data, c->cursor.len);
        return rc;
    }
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_ELASTIC_RESUMED: {
        const Batchwire__V1__ElasticResumed *c = rec->elastic_resumed;
        p->job = c->job ? bw__jobs_find(s, c->job) : NULL;
        if (!p->job || !c->segment || c->segment->world_size == 0) {
            snprintf(err, errlen, "elastic resume record for job '%s' is incomplete",
                     c->job ? c->job : "");
            return BW_CORRUPT;
        }
        const Batchwire__V1__WorldSegment *seg = c->segment;
        /* The old world's leases end here; every new rank starts at the resume point. */
        p->nranks = seg->world_size;
        p->ranks = calloc(seg->world_size, sizeof(*p->ranks));
        int rc = p->ranks ? reserve_segment(p->job) : BW_NOMEM;
        for (uint32_t i = 0; rc == BW_OK && i < seg->world_size; i++) {
            bw_rank_state *r = &p->ranks[i];
            r->committed = true;
            r->epoch = seg->epoch;
            r->step = seg->start_step;
            r->cursor = bw__jobs_cursor_at(p->job, seg->world_size, i, seg->epoch, seg->start_step,
                                           &r->cursor_len);
            if (!r->cursor)
                rc = BW_NOMEM;
        }
        if (rc != BW_OK) { /* nothing stays allocated when prepare fails */
            bw__jobs_ranks_free(p->ranks, p->nranks);
            p->ranks = NULL;
            p->nranks = 0;
            snprintf(err, errlen, "out of memory for %u ranks of job '%s'", seg->world_size,
                     c->job);
        }
        return rc;
    }
    default:
        snprintf(err, errlen, "record %" PRIu64 " holds no change this coordinator knows",
                 rec->seq);
        return BW_CORRUPT;
    }
}

/* Releases what prepare allocated for a change that is not installed. */
static void discard(const Batchwire__V1__JournalRecord *rec, prepared *p)
{
    if (rec->change_case == BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_JOB_CREATED)
        bw__jobs_job_free(p->job);
    free(p->cursor);
    bw__jobs_ranks_free(p->ranks, p->nranks);
    memset(p, 0, sizeof(*p));
}

static void install(bw_jobs *s, const Batchwire__V1__JournalRecord *rec, prepared *p)
{
    bw_rank_state *r = p->rank;
    switch (rec->change_case) {
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_JOB_CREATED:
        append_segment(p->job, 0, 0, p->job->world_size);
        insert_job(s, p->job);
        break;
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_RANK_JOINED: {
        const Batchwire__V1__RankJoined *c = rec->rank_joined;
        bw__jobs_lease_ended(s, p->job, c->rank, r); /* the lease this join replaces */
        r->leased = false;
        bw__jobs_lease_started(s, r);
        snprintf(r->host, sizeof(r->host), "%s",
                 c->holder && c->holder->host ? c->holder->host : "");
        r->pid = c->holder ? c->holder->pid : 0;
        r->lease = (bw_lease){c->lease_id, c->lease_id_hi};
        r->finished = false;
        r->joined_unix_ms = c->joined_unix_ms;
        p->job->active_unix_ms = c->joined_unix_ms;
        break;
    }
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_RANK_LEFT:
        /* The committed cursor stays: the next holder resumes from it. */
        bw__jobs_lease_ended(s, p->job, rec->rank_left->rank, r);
        r->leased = false;
        r->host[0] = '\0';
        r->pid = 0;
        r->lease = (bw_lease){0, 0};
        r->finished = rec->rank_left->finished;
        r->joined_unix_ms = 0;
        r->last_beat_ms = 0;
        r->lease_ms = 0;
        p->job->active_unix_ms = rec->rank_left->left_unix_ms;
        break;
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_JOB_DELETED:
        for (uint32_t i = 0; i < p->job->world_size; i++)
            bw__jobs_lease_ended(s, p->job, i, &p->job->ranks[i]);
        remove_job(s, p->job);
        break;
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_CURSOR_COMMITTED: {
        const Batchwire__V1__CursorCommitted *c = rec->cursor_committed;
        free(r->cursor);
        r->cursor = p->cursor;
        r->cursor_len = c->cursor.len;
        r->committed = true;
        r->epoch = c->epoch;
        r->step = c->step;
        r->committed_unix_ms = c->committed_unix_ms;
        p->job->active_unix_ms = c->committed_unix_ms;
        break;
    }
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_ELASTIC_RESUMED: {
        const Batchwire__V1__WorldSegment *seg = rec->elastic_resumed->segment;
        bw_job *job = p->job;
        for (uint32_t i = 0; i < job->world_size; i++) {
            bw__jobs_lease_ended(s, job, i, &job->ranks[i]);
            rank_clear(&job->ranks[i]);
        }
        free(job->ranks);
        job->ranks = p->ranks;
        job->world_size = seg->world_size;
        append_segment(job, seg->epoch, seg->start_step, seg->world_size);
        break;
    }
    default:
        BW_INVARIANT(false, "only a record prepare accepted is installed");
    }
    memset(p, 0, sizeof(*p));
}

/* Why the journal takes no change: its disk is full (the coordinator stays up and the change
 * can be retried once there is space; docs/operating.md) or it failed (the coordinator exits
 * and a restart recovers what is on disk). */
static int journal_refusal(bw_jobs *s, char *err, size_t errlen)
{
    char why[512];
    if (bw__journal_full(s->journal, why, sizeof(why)))
        snprintf(err, errlen,
                 "the coordinator's state directory is full (%s): the change was not made and "
                 "nothing acknowledged is lost; retry once there is space",
                 why);
    else
        snprintf(err, errlen, "the coordinator's journal has failed; it must restart: retry");
    return BW_UNAVAILABLE;
}

int bw__jobs_commit_record(bw_jobs *s, Batchwire__V1__JournalRecord *rec, char *err, size_t errlen)
{
    rec->seq = s->last_seq + 1;
    size_t len = batchwire__v1__journal_record__get_packed_size(rec);
    if (len > BW_JOURNAL_MAX_RECORD) {
        snprintf(err, errlen, "the change needs %zu bytes, more than the journal's limit of %u",
                 len, BW_JOURNAL_MAX_RECORD);
        return BW_TOO_BIG;
    }
    if (bw__journal_failed(s->journal) || bw__journal_full(s->journal, NULL, 0))
        return journal_refusal(s, err, errlen);
    uint8_t *buf = malloc(len);
    if (!buf) {
        snprintf(err, errlen, "out of memory for a journal record of %zu bytes: retry", len);
        return BW_NOMEM;
    }
    batchwire__v1__journal_record__pack(rec, buf);
    char why[256];
    prepared p;
    int rc = prepare(s, rec, &p, why, sizeof(why));
    if (rc != BW_OK) {
        free(buf);
        if (rc == BW_NOMEM) {
            snprintf(err, errlen, "%s: retry", why);
            return BW_NOMEM;
        }
        snprintf(err, errlen, "internal error: a validated change does not apply: %s", why);
        return BW_INTERNAL;
    }
    uint64_t seq = 0;
    rc = bw__journal_append(s->journal, buf, len, &seq);
    free(buf);
    if (rc != BW_OK) {
        discard(rec, &p);
        if (rc == BW_NOMEM) {
            snprintf(err, errlen, "out of memory queueing the change for the journal: retry");
            return BW_NOMEM;
        }
        return journal_refusal(s, err, errlen);
    }
    BW_INVARIANT(seq == rec->seq,
                 "the journal numbers records as the jobs state does (appends happen under the "
                 "state's lock)");
    install(s, rec, &p);
    s->last_seq = rec->seq;
    return BW_OK;
}

int bw__jobs_apply_record(bw_jobs *s, const Batchwire__V1__JournalRecord *rec, char *err,
                          size_t errlen)
{
    prepared p;
    int rc = prepare(s, rec, &p, err, errlen);
    if (rc != BW_OK)
        return rc;
    install(s, rec, &p);
    s->last_seq = rec->seq;
    return BW_OK;
}

int bw__jobs_load_job(bw_jobs *s, const Batchwire__V1__JobSnapshot *js, char *err, size_t errlen)
{
    const Batchwire__V1__JobSummary *sum = js->job;
    bw_job *job;
    if (!sum || sum->n_history == 0) {
        snprintf(err, errlen, "a job without a summary or world-size history");
        return BW_CORRUPT;
    }
    int rc = make_job(s, sum->name, sum->owner, sum->config, sum->dataset, sum->fingerprint,
                      sum->world_size, sum->created_unix_ms, sum->n_history, &job, err, errlen);
    if (rc != BW_OK) /* job is NULL then: a corrupt snapshot is refused, not dereferenced */
        return rc;
    if (js->active_unix_ms > job->active_unix_ms)
        job->active_unix_ms = js->active_unix_ms;
    for (size_t i = 0; i < sum->n_history; i++)
        append_segment(job, sum->history[i]->epoch, sum->history[i]->start_step,
                       sum->history[i]->world_size);
    for (size_t i = 0; rc == BW_OK && i < js->n_ranks; i++) {
        const Batchwire__V1__RankSnapshot *rs = js->ranks[i];
        if (rs->rank >= job->world_size) {
            snprintf(err, errlen, "job '%s': rank %u is not below world size %u", job->name,
                     rs->rank, job->world_size);
            rc = BW_CORRUPT;
            break;
        }
        bw_rank_state *r = &job->ranks[rs->rank];
        r->lease = (bw_lease){rs->lease_id, rs->lease_id_hi};
        r->finished = rs->finished;
        snprintf(r->host, sizeof(r->host), "%s",
                 rs->holder && rs->holder->host ? rs->holder->host : "");
        r->pid = rs->holder ? rs->holder->pid : 0;
        r->joined_unix_ms = rs->joined_unix_ms;
        r->committed = rs->committed;
        r->epoch = rs->epoch;
        r->step = rs->step;
        r->committed_unix_ms = rs->committed_unix_ms;
        if (rs->cursor.len && !(r->cursor = malloc(rs->cursor.len))) {
            snprintf(err, errlen, "job '%s': out of memory for rank %u's cursor", job->name,
                     rs->rank);
            rc = BW_NOMEM;
            break;
        }
        if (rs->cursor.len) {
            memcpy(r->cursor, rs->cursor.data, rs->cursor.len);
            r->cursor_len = rs->cursor.len;
        }
    }
    if (rc != BW_OK) {
        bw__jobs_job_free(job);
        return rc;
    }
    insert_job(s, job);
    for (uint32_t i = 0; i < job->world_size; i++)
        if (job->ranks[i].lease.lo != 0 || job->ranks[i].lease.hi != 0)
            bw__jobs_lease_started(s, &job->ranks[i]); /* a restart renews every lease */
    return BW_OK;
}
