/* Opening the jobs state: the journal's snapshot and records replayed into it
 * (core/journal/journal.h), each record through the same apply as the live path
 * (jobs_apply.c). */
#include "jobs_int.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "batchwire/batchwire.h"

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
        rc = bw__jobs_apply_record(s, rec, why, sizeof(why));
        if (rc != BW_OK)
            snprintf(err, errlen, "record %" PRIu64 ": %s", seq, why);
    }
    batchwire__v1__journal_record__free_unpacked(rec, &t.a);
    return rc;
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
        rc = bw__jobs_load_job(s, snap->jobs[i], why, sizeof(why));
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
    /* Every restored lease is renewed for the length that all of them together give (the
     * snapshot and the journal brought them in one at a time). */
    uint32_t len = bw__jobs_lease_ms(s);
    for (size_t i = 0; i < s->njobs; i++)
        for (uint32_t r = 0; r < s->jobs[i]->world_size; r++)
            if (s->jobs[i]->ranks[r].leased)
                s->jobs[i]->ranks[r].lease_ms = len;
    *out = s;
    return BW_OK;
}
