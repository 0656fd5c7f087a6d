/* Internals of the jobs state shared by jobs_state.c (the state in memory and its queries),
 * jobs_apply.c (how records apply), jobs_replay.c and jobs_snapshot.c (the journal's side),
 * jobs_ops.c (the RPC operations), jobs_elastic.c (plan checks, elastic resume),
 * jobs_lifecycle.c (how jobs end) and jobs_live.c (reported progress). */
#ifndef BW_SERVER_JOBS_INT_H
#define BW_SERVER_JOBS_INT_H

#include <pthread.h>

#include "auth/auth.h"
#include "common/rate.h"
#include "common/text.h"
#include "jobs.h"
#include "jobs/plan.h"

enum { BW_HOST_MAX = 256 }; /* job names: BW_JOB_NAME_MAX (common/text.h) */

/* A lease id: 128 random bits (docs/security.md, "Leases"); all zero is no lease. */
typedef struct bw_lease {
    uint64_t lo, hi;
} bw_lease;

static inline bool bw__lease_eq(bw_lease a, bw_lease b)
{
    /* Both halves always compared: the time taken says nothing about a near miss. */
    return ((a.lo ^ b.lo) | (a.hi ^ b.hi)) == 0;
}

/* A rank's progress as its holder reports it with each heartbeat (RankLive; jobs_live.c). In
 * memory only: a restarted coordinator knows it again at the next heartbeat. */
typedef struct bw_rank_live {
    bw_lease lease; /* reported under this lease (another holder starts over) */
    uint64_t epoch, step, epoch_steps, wait_ms;
    bw__rate rate; /* batches, samples, bytes */
} bw_rank_live;

typedef struct bw_rank_state {
    bool leased;            /* joined, not revoked by an elastic resume */
    char host[BW_HOST_MAX]; /* the holder */
    uint32_t pid;
    bw_lease lease;
    bool finished; /* the last holder left saying it had delivered its last epoch */
    uint64_t joined_unix_ms;
    uint64_t last_beat_ms; /* monotonic; not journaled (a restart renews every lease) */
    uint32_t lease_ms;     /* the lease's length as last told to its holder (bw__jobs_lease_ms) */
    bool committed;
    uint64_t epoch, step;
    uint64_t committed_unix_ms;
    uint8_t *cursor; /* malloc'ed packed cursor */
    size_t cursor_len;
    bw_rank_live live;
} bw_rank_state;

typedef struct bw_job {
    char *name;
    Batchwire__V1__JobConfig *config;    /* owned, immutable (protobuf-c default allocator) */
    Batchwire__V1__DatasetInfo *dataset; /* owned, immutable */
    uint64_t fingerprint;
    uint8_t dataset_hash[32]; /* read grants: SHA-256 of config->dataset packed (jobs_grants.c) */
    bool dataset_hashed;
    uint8_t (*source_hashes)[32]; /* a mixture's: each source's dataset hashed (malloc'ed) */
    uint64_t created_unix_ms;
    uint64_t active_unix_ms; /* the last journaled change (creation, join, commit, leave) */
    char *owner;             /* the creating principal; "" on an open service */
    uint32_t world_size;     /* current */
    Batchwire__V1__WorldSegment *history; /* world-size segments, in order */
    size_t nhistory;
    bw_rank_state *ranks; /* world_size of them */
} bw_job;

struct bw_jobs {
    bw_jobs_opts opts;
    pthread_mutex_t mu;
    bw_journal *journal;
    bw_job **jobs;
    size_t njobs, cap;
    uint64_t last_seq; /* the last record applied */
    bw_jobs_placement_fn placement;
    void *placement_user;
    bw_grants *grants; /* read grants (jobs_grants.c); NULL: authentication off */
    size_t leases;     /* ranks with leased set, over every job: what heartbeats the leases ask */
    /* Since this process started, for metrics (server/metrics.c); not journaled. */
    uint64_t commits;             /* cursor commits accepted */
    uint64_t takeovers_expired;   /* joins that took a rank whose holder's lease had expired */
    uint64_t takeovers_reclaimed; /* joins that reclaimed a rank from an exited holder */
};

/* Under s->mu: the read grant of rank `rank`'s lease r of `job` (docs/security.md, "Read
 * grants"), valid for the lease's length from now, into *claims and *secret (in `arena`). With
 * grants off both stay empty. BW_OK, or BW_NOMEM. */
int bw__jobs_grant(bw_jobs *s, bw_job *job, uint32_t rank, const bw_rank_state *r, bw_arena *arena,
                   ProtobufCBinaryData *claims, ProtobufCBinaryData *secret);

/* Under s->mu: rank `rank`'s lease r of `job` ends (replaced by a join, left, deleted with its
 * job, or ended by an elastic resume): it no longer counts in s->leases, and its grants are
 * refused by workers until they have expired (storage-side fencing). No-op without a lease. */
void bw__jobs_lease_ended(bw_jobs *s, const bw_job *job, uint32_t rank, const bw_rank_state *r);

/* Under s->mu: whether r's lease is live at now_ms (monotonic): held, and heard from within
 * the lease's length as its holder was told it (r->lease_ms). */
bool bw__jobs_lease_live(const bw_jobs *s, const bw_rank_state *r, uint64_t now_ms);

/* Under s->mu: the length a lease is given now (a join, a heartbeat): --lease-ms, or longer
 * when s->leases heartbeating every third of it would pass --max-heartbeats-per-second:
 * 3 * leases / max seconds, at most BW_JOBS_LEASE_MAX_MS (docs/operating.md, "Leases at
 * scale"). */
uint32_t bw__jobs_lease_ms(const bw_jobs *s);

/* Under s->mu: r holds a lease from now on (a join, a restored snapshot): counted in
 * s->leases, heard from now, for the length bw__jobs_lease_ms gives. */
void bw__jobs_lease_started(bw_jobs *s, bw_rank_state *r);

/* The longest lease bw__jobs_lease_ms gives: an hour, as --lease-ms allows. */
#define BW_JOBS_LEASE_MAX_MS 3600000u

/* Under s->mu: the job called name, or NULL. s->jobs is kept sorted by name (strcmp), so this
 * is a binary search (bench/bench_sim.c measured the linear one at 5-15 us a call with 1,024
 * jobs). */
bw_job *bw__jobs_find(bw_jobs *s, const char *name);

/* Under s->mu: where a job called name is, or would be inserted, in s->jobs. */
size_t bw__jobs_slot(const bw_jobs *s, const char *name);

/* Under s->mu: gives `rec` the next seq, applies it, and queues it in the journal. On error
 * nothing changed: BW_NOMEM (memory ran out: an error answer, retry), BW_TOO_BIG,
 * BW_UNAVAILABLE (the journal failed), or BW_INTERNAL (a record that does not apply is a bug
 * in the caller's validation); err says which. */
int bw__jobs_commit_record(bw_jobs *s, Batchwire__V1__JournalRecord *rec, char *err, size_t errlen);

/* The job's summary for answers, in `arena` (config and dataset are borrowed: immutable). */
Batchwire__V1__JobSummary *bw__jobs_summary(bw_arena *arena, const bw_job *job);

/* The cursor a rank starts from when it has committed none: (epoch, step) with the job's
 * current world size. malloc'ed; NULL when memory ran out. */
uint8_t *bw__jobs_make_cursor(const bw_job *job, uint32_t rank, uint64_t epoch, uint64_t step,
                              size_t *len);

/* The plan of `epoch` (jobs/plan.h, counts only: step counts and checks) from the job's
 * configuration, dataset and world-size history, with `extra` (NULL: none) appended to the
 * history: the segment an elastic resume would record. BW_OK, or an error with a sentence in
 * err (BW_NOMEM when memory ran out). */
int bw__jobs_plan(const bw_job *job, const Batchwire__V1__WorldSegment *extra, uint64_t epoch,
                  bw__plan **out, char *err, size_t errlen);

/* The job's fingerprint into *out: SHA-256 of its name, configuration and dataset
 * description, first 8 bytes; never 0. Two jobs with one configuration still differ. BW_OK, or
 * BW_NOMEM with a sentence in err. */
int bw__jobs_fingerprint(const char *name, const Batchwire__V1__JobConfig *cfg,
                         const Batchwire__V1__DatasetInfo *info, uint64_t *out, char *err,
                         size_t errlen);

/* Under s->mu, after a rank left: removes the job (journaled) when every rank has left after
 * its last epoch; *wait_seq is then the removal's record. */
int bw__jobs_finish_if_done(bw_jobs *s, bw_job *job, uint64_t *wait_seq, char *err, size_t errlen);

/* Under s->mu: whether `who` may use `job` (its owner, an admin, an open service;
 * core/auth/auth.h, bw__auth_owns): BW_OK, or BW_PERMISSION_DENIED with a sentence that does
 * not say who owns the job. */
int bw__jobs_check_owner(const bw_job *job, const bw_principal *who, char *err, size_t errlen);

/* Under s->mu: how many jobs `owner` owns. */
size_t bw__jobs_owned(const bw_jobs *s, const char *owner);

/* jobs_state.c: frees a job and everything it owns (NULL: nothing); frees n ranks' cursors and
 * the array (NULL: nothing). */
void bw__jobs_job_free(bw_job *job);
void bw__jobs_ranks_free(bw_rank_state *ranks, uint32_t n);

/* jobs_state.c: a rank's cursor at (epoch, step) of world size `world`; malloc'ed, NULL when
 * memory ran out. */
uint8_t *bw__jobs_cursor_at(const bw_job *job, uint32_t world, uint32_t rank, uint64_t epoch,
                            uint64_t step, size_t *len);

/* jobs_apply.c, for replay: applies a record read back from the journal (prepare, then
 * install) and makes it the last one applied. On error nothing changed: BW_CORRUPT when the
 * record contradicts the state, BW_NOMEM; err says why. */
int bw__jobs_apply_record(bw_jobs *s, const Batchwire__V1__JournalRecord *rec, char *err,
                          size_t errlen);

/* jobs_apply.c, for replay: builds one job of a snapshot and inserts it, or changes nothing
 * (BW_CORRUPT, BW_NOMEM with a sentence in err). */
int bw__jobs_load_job(bw_jobs *s, const Batchwire__V1__JobSnapshot *js, char *err, size_t errlen);

/* jobs_live.c: records the progress a heartbeat of lease `lease` reports (under s->mu). */
void bw__jobs_live_report(bw_rank_state *r, bw_lease lease, const Batchwire__V1__RankLive *live,
                          uint64_t now_ms);

/* jobs_live.c: the rank's reported progress and rates into p (under s->mu); BW_OK or
 * BW_NOMEM. */
int bw__jobs_live_fill(const bw_rank_state *r, uint64_t now_ms, bw_arena *arena,
                       Batchwire__V1__RankProgress *p);

#endif
