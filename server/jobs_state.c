/* The jobs state: records and how they apply, replay on start, snapshots, and the helpers
 * that turn state into answers. One apply function serves the live path and replay, so what
 * a restart rebuilds is what was acknowledged. */
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

bw_job *bw__jobs_find(bw_jobs *s, const char *name)
{
    for (size_t i = 0; i < s->njobs; i++)
        if (strcmp(s->jobs[i]->name, name) == 0)
            return s->jobs[i];
    return NULL;
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

static void ranks_free(bw_rank_state *ranks, uint32_t n)
{
    for (uint32_t r = 0; ranks && r < n; r++)
        free(ranks[r].cursor);
    free(ranks);
}

static void job_free(bw_job *job)
{
    if (!job)
        return;
    ranks_free(job->ranks, job->world_size);
    free(job->history);
    if (job->config)
        protobuf_c_message_free_unpacked(&job->config->base, NULL);
    if (job->dataset)
        protobuf_c_message_free_unpacked(&job->dataset->base, NULL);
    free(job->name);
    free(job->owner);
    free(job);
}

/* A rank's cursor at (epoch, step) of world size `world`; NULL when memory ran out. */
static uint8_t *cursor_at(const bw_job *job, uint32_t world, uint32_t rank, uint64_t epoch,
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
    return cursor_at(job, job->world_size, rank, epoch, step, len);
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
        job_free(job);
        snprintf(err, errlen, "out of memory for job '%s' (world size %u)", name, world);
        return BW_NOMEM;
    }
    job->fingerprint = fingerprint;
    job->created_unix_ms = created;
    job->active_unix_ms = created;
    *out = job;
    return BW_OK;
}

/* Inserts a job make_job built (its place is reserved). */
static void insert_job(bw_jobs *s, bw_job *job)
{
    s->jobs[s->njobs++] = job;
}

/* Takes a job out of the table and frees it. */
static void remove_job(bw_jobs *s, bw_job *job)
{
    for (size_t i = 0; i < s->njobs; i++) {
        if (s->jobs[i] == job) {
            s->jobs[i] = s->jobs[--s->njobs];
            break;
        }
    }
    job_free(job);
}

size_t bw__jobs_owned(const bw_jobs *s, const char *owner)
{
    size_t n = 0;
    for (size_t i = 0; i < s->njobs; i++)
        n += strcmp(s->jobs[i]->owner, owner) == 0;
    return n;
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
            r->cursor =
                cursor_at(p->job, seg->world_size, i, seg->epoch, seg->start_step, &r->cursor_len);
            if (!r->cursor)
                rc = BW_NOMEM;
        }
        if (rc != BW_OK)
            snprintf(err, errlen, "out of memory for %u ranks of job '%s'", seg->world_size,
                     c->job);
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
        job_free(p->job);
    free(p->cursor);
    ranks_free(p->ranks, p->nranks);
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
        r->leased = true;
        snprintf(r->host, sizeof(r->host), "%s",
                 c->holder && c->holder->host ? c->holder->host : "");
        r->pid = c->holder ? c->holder->pid : 0;
        r->lease = (bw_lease){c->lease_id, c->lease_id_hi};
        r->finished = false;
        r->joined_unix_ms = c->joined_unix_ms;
        r->last_beat_ms = bw__mono_ms();
        p->job->active_unix_ms = c->joined_unix_ms;
        break;
    }
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_RANK_LEFT:
        /* The committed cursor stays: the next holder resumes from it. */
        r->leased = false;
        r->host[0] = '\0';
        r->pid = 0;
        r->lease = (bw_lease){0, 0};
        r->finished = rec->rank_left->finished;
        r->joined_unix_ms = 0;
        r->last_beat_ms = 0;
        p->job->active_unix_ms = rec->rank_left->left_unix_ms;
        break;
    case BATCHWIRE__V1__JOURNAL_RECORD__CHANGE_JOB_DELETED:
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
        for (uint32_t i = 0; i < job->world_size; i++)
            rank_clear(&job->ranks[i]);
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

/* ---- replay ---- */

/* The default allocator, remembering whether an allocation failed: protobuf-c answers NULL
 * both for bytes that do not decode and for memory that ran out, and replay must not call a
 * record corrupt for the machine's fault. */
typedef struct tracked {
    ProtobufCAllocator a;
    bool failed;
} tracked;

static void *tracked_alloc(void *data, size_t size)
{
    void *p = malloc(size);
    if (!p)
        ((tracked *)data)->failed = true;
    return p;
}

static void tracked_free(void *data, void *p)
{
    (void)data;
    free(p);
}

static void tracked_init(tracked *t)
{
    t->a.alloc = tracked_alloc;
    t->a.free = tracked_free;
    t->a.allocator_data = t;
    t->failed = false;
}

static int on_record(void *user, uint64_t seq, const uint8_t *data, size_t len, char *err,
                     size_t errlen)
{
    bw_jobs *s = user;
    tracked t;
    tracked_init(&t);
    Batchwire__V1__JournalRecord *rec = batchwire__v1__journal_record__unpack(&t.a, len, data);
    if (!rec) {
        snprintf(err, errlen, "record %" PRIu64 " %s", seq,
                 t.failed ? "cannot be decoded: out of memory" : "does not decode");
        return t.failed ? BW_NOMEM : BW_CORRUPT;
    }
    int rc = BW_OK;
    if (rec->seq != seq) {
        snprintf(err, errlen, "record at position %" PRIu64 " says it is record %" PRIu64, seq,
                 rec->seq);
        rc = BW_CORRUPT;
    } else {
        char why[256];
        prepared p;
        rc = prepare(s, rec, &p, why, sizeof(why));
        if (rc != BW_OK) {
            snprintf(err, errlen, "record %" PRIu64 ": %s", seq, why);
        } else {
            install(s, rec, &p);
            s->last_seq = seq;
        }
    }
    batchwire__v1__journal_record__free_unpacked(rec, &t.a);
    return rc;
}

/* Builds one job of a snapshot and inserts it, or changes nothing (BW_CORRUPT, BW_NOMEM). */
static int load_job(bw_jobs *s, const Batchwire__V1__JobSnapshot *js, char *err, size_t errlen)
{
    const Batchwire__V1__JobSummary *sum = js->job;
    bw_job *job;
    if (!sum || sum->n_history == 0) {
        snprintf(err, errlen, "a job without a summary or world-size history");
        return BW_CORRUPT;
    }
    int rc = make_job(s, sum->name, sum->owner, sum->config, sum->dataset, sum->fingerprint,
                      sum->world_size, sum->created_unix_ms, sum->n_history, &job, err, errlen);
    if (js->active_unix_ms > job->active_unix_ms)
        job->active_unix_ms = js->active_unix_ms;
    if (rc != BW_OK)
        return rc;
    for (size_t i = 0; i < sum->n_history; i++)
        append_segment(job, sum->history[i]->epoch, sum->history[i]->start_step,
                       sum->history[i]->world_size);
    uint64_t now = bw__mono_ms();
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
        r->leased = rs->lease_id != 0 || rs->lease_id_hi != 0;
        r->finished = rs->finished;
        snprintf(r->host, sizeof(r->host), "%s",
                 rs->holder && rs->holder->host ? rs->holder->host : "");
        r->pid = rs->holder ? rs->holder->pid : 0;
        r->joined_unix_ms = rs->joined_unix_ms;
        r->last_beat_ms = now;
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
        job_free(job);
        return rc;
    }
    insert_job(s, job);
    return BW_OK;
}

static int on_snapshot(void *user, uint64_t seq, const uint8_t *data, size_t len, char *err,
                       size_t errlen)
{
    bw_jobs *s = user;
    tracked t;
    tracked_init(&t);
    Batchwire__V1__Snapshot *snap = batchwire__v1__snapshot__unpack(&t.a, len, data);
    if (!snap) {
        snprintf(err, errlen, "snapshot %s",
                 t.failed ? "cannot be decoded: out of memory" : "does not decode");
        return t.failed ? BW_NOMEM : BW_CORRUPT;
    }
    int rc = BW_OK;
    char why[256] = "";
    if (snap->seq != seq) {
        snprintf(why, sizeof(why), "it says it holds record %" PRIu64 ", its header %" PRIu64,
                 snap->seq, seq);
        rc = BW_CORRUPT;
    }
    for (size_t i = 0; rc == BW_OK && i < snap->n_jobs; i++)
        rc = load_job(s, snap->jobs[i], why, sizeof(why));
    if (rc != BW_OK)
        snprintf(err, errlen, "snapshot %s: %s",
                 rc == BW_NOMEM ? "cannot be loaded" : "is inconsistent", why);
    else
        s->last_seq = seq;
    batchwire__v1__snapshot__free_unpacked(snap, &t.a);
    return rc;
}

int bw__jobs_open(const bw_jobs_opts *opts, bw_jobs **out, bw_journal_report *report, char *err,
                  size_t errlen)
{
    *out = NULL;
    bw_jobs *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory for the jobs state");
        return BW_NOMEM;
    }
    s->opts = *opts;
    pthread_mutex_init(&s->mu, NULL);
    int rc = bw__journal_open(opts->state_dir, opts->truncate_at, on_snapshot, on_record, s,
                              &s->journal, report, err, errlen);
    if (rc != BW_OK) {
        s->journal = NULL;
        bw__jobs_close(s);
        return rc;
    }
    *out = s;
    return BW_OK;
}

void bw__jobs_close(bw_jobs *s)
{
    if (!s)
        return;
    bw__journal_close(s->journal);
    for (size_t i = 0; i < s->njobs; i++)
        job_free(s->jobs[i]);
    free(s->jobs);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- snapshots ---- */

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

/* ---- helpers for answers and checks ---- */

/* One field's value as text; repeated fields as [a, b]. */
static void field_text(const ProtobufCFieldDescriptor *f, const void *base, char *out,
                       size_t outlen);

static void one_value(const ProtobufCFieldDescriptor *f, const void *p, char *out, size_t outlen)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        snprintf(out, outlen, "%" PRId32, *(const int32_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        snprintf(out, outlen, "%" PRIu32, *(const uint32_t *)p);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        snprintf(out, outlen, "%" PRId64, *(const int64_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        snprintf(out, outlen, "%" PRIu64, *(const uint64_t *)p);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        snprintf(out, outlen, "%g", (double)*(const float *)p);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        snprintf(out, outlen, "%g", *(const double *)p);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        snprintf(out, outlen, "%s", *(const protobuf_c_boolean *)p ? "true" : "false");
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int *)p);
        snprintf(out, outlen, "%s", ev ? ev->name : "?");
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *sv = *(char *const *)p;
        snprintf(out, outlen, "\"%.100s\"", sv ? sv : "");
        break;
    }
    case PROTOBUF_C_TYPE_BYTES:
        snprintf(out, outlen, "<%zu bytes>", ((const ProtobufCBinaryData *)p)->len);
        break;
    default:
        snprintf(out, outlen, "<message>");
        break;
    }
}

static void field_text(const ProtobufCFieldDescriptor *f, const void *base, char *out,
                       size_t outlen)
{
    const char *p = (const char *)base + f->offset;
    if (f->label != PROTOBUF_C_LABEL_REPEATED) {
        one_value(f, p, out, outlen);
        return;
    }
    size_t n = *(const size_t *)((const char *)base + f->quantifier_offset);
    const char *arr = *(char *const *)p;
    size_t elem = f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE
                      ? sizeof(void *)
                  : f->type == PROTOBUF_C_TYPE_BYTES ? sizeof(ProtobufCBinaryData)
                  : f->type == PROTOBUF_C_TYPE_INT64 || f->type == PROTOBUF_C_TYPE_UINT64 ||
                          f->type == PROTOBUF_C_TYPE_SINT64 || f->type == PROTOBUF_C_TYPE_FIXED64 ||
                          f->type == PROTOBUF_C_TYPE_SFIXED64 || f->type == PROTOBUF_C_TYPE_DOUBLE
                      ? 8
                  : f->type == PROTOBUF_C_TYPE_BOOL ? sizeof(protobuf_c_boolean)
                                                    : 4;
    size_t o = (size_t)snprintf(out, outlen, "[");
    for (size_t i = 0; i < n && o + 8 < outlen; i++) {
        char v[128];
        if (f->type == PROTOBUF_C_TYPE_MESSAGE)
            snprintf(v, sizeof(v), "<message>");
        else
            one_value(f, arr + i * elem, v, sizeof(v));
        o += (size_t)snprintf(out + o, outlen - o, "%s%s", i ? ", " : "", v);
    }
    if (o + 2 < outlen)
        snprintf(out + o, outlen - o, "]");
}

static void diff_rec(const ProtobufCMessageDescriptor *desc, const ProtobufCMessage *a,
                     const ProtobufCMessage *b, const char *prefix, char *out, size_t outlen)
{
    /* A missing sub-message compares like an empty one. */
    union {
        ProtobufCMessage m;
        max_align_t align;
        uint8_t bytes[1024];
    } empty_a, empty_b;
    if (!a && desc->sizeof_message <= sizeof(empty_a)) {
        desc->message_init(&empty_a.m);
        a = &empty_a.m;
    }
    if (!b && desc->sizeof_message <= sizeof(empty_b)) {
        desc->message_init(&empty_b.m);
        b = &empty_b.m;
    }
    if (!a || !b)
        return;
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        char name[160];
        snprintf(name, sizeof(name), "%s%s", prefix, f->name);
        if (f->type == PROTOBUF_C_TYPE_MESSAGE && f->label != PROTOBUF_C_LABEL_REPEATED) {
            char sub[168];
            snprintf(sub, sizeof(sub), "%s.", name);
            diff_rec(f->descriptor, *(ProtobufCMessage *const *)((const char *)a + f->offset),
                     *(ProtobufCMessage *const *)((const char *)b + f->offset), sub, out, outlen);
            continue;
        }
        /* Repeated messages (a dataset's fields): element by element when the counts agree. */
        size_t na = 0, nb = 0;
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            na = *(const size_t *)((const char *)a + f->quantifier_offset);
            nb = *(const size_t *)((const char *)b + f->quantifier_offset);
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE && na == nb) {
            ProtobufCMessage *const *ea =
                *(ProtobufCMessage *const *const *)((const char *)a + f->offset);
            ProtobufCMessage *const *eb =
                *(ProtobufCMessage *const *const *)((const char *)b + f->offset);
            for (size_t k = 0; k < na; k++) {
                char sub[200];
                snprintf(sub, sizeof(sub), "%.160s[%zu].", name, k);
                diff_rec(f->descriptor, ea[k], eb[k], sub, out, outlen);
            }
            continue;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            size_t used = strlen(out);
            snprintf(out + used, outlen - used, "%s%s: job has %zu, request has %zu",
                     used ? "; " : "", name, na, nb);
            continue;
        }
        char va[512], vb[512];
        field_text(f, a, va, sizeof(va));
        field_text(f, b, vb, sizeof(vb));
        if (strcmp(va, vb) == 0)
            continue;
        size_t used = strlen(out);
        snprintf(out + used, outlen - used, "%s%s: job has %s, request has %s", used ? "; " : "",
                 name, va, vb);
    }
}

void bw__jobs_diff(const ProtobufCMessageDescriptor *desc, const ProtobufCMessage *a,
                   const ProtobufCMessage *b, char *out, size_t outlen)
{
    out[0] = '\0';
    diff_rec(desc, a, b, "", out, outlen);
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
