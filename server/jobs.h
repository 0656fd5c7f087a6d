/*
 * The coordinator's jobs (docs/operating.md, "Coordinator state"): configuration and dataset
 * description, a fingerprint that every cursor carries, the world-size history, each rank's
 * lease and committed cursor. Every change is one journal record (core/journal); the same
 * apply steps run live and on replay, so a restarted coordinator rebuilds exactly the state it
 * had acknowledged. Out of memory, an operation answers BW_NOMEM and changes nothing.
 *
 * Answers and durability: each operation below validates its request, applies and journals
 * the change (if any) under the state's lock, fills *resp in `arena`, and sets *wait_seq: the
 * answer, success or error, must be sent only once bw__journal_when_durable says that seq is
 * durable (it may reflect changes by other callers that are not durable yet). Errors come with
 * a sentence in err that names what was wrong. Thread-safe.
 */
#ifndef BW_SERVER_JOBS_H
#define BW_SERVER_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth/auth.h"
#include "auth/grant.h"
#include "common/arena.h"
#include "data.pb-c.h"
#include "jobs.pb-c.h"
#include "journal/journal.h"

typedef struct bw_jobs bw_jobs;

typedef struct bw_jobs_opts {
    const char *state_dir;   /* locked by the caller */
    const char *truncate_at; /* --truncate-journal-at, or NULL */
    uint32_t lease_ms;       /* a lease expires this long after its last heartbeat, at least */
    uint32_t max_jobs;
    uint32_t max_jobs_per_principal; /* trainer principals; admins and open services: none */
    uint32_t max_world_size;
    /* Heartbeats the coordinator asks for, at most, per second over all leases: with more
     * leases than lease_ms / 3 allows, each lease gets longer (bw__jobs_lease_ms;
     * docs/operating.md, "Leases at scale"). 0: lease_ms whatever the number of leases. */
    uint32_t max_heartbeats_per_s;
} bw_jobs_opts;

/* Loads the snapshot and replays the journal. On error (corruption: file and offset in err)
 * nothing is left open. `report` says what recovery found, for the caller to log. */
int bw__jobs_open(const bw_jobs_opts *opts, bw_jobs **out, bw_journal_report *report, char *err,
                  size_t errlen);

/* Waits for the journal to be durable and frees everything. NULL is a no-op. */
void bw__jobs_close(bw_jobs *s);

bw_journal *bw__jobs_journal(bw_jobs *s);

/* Writes a snapshot and drops the journal files it replaces when at least min_bytes were
 * journaled since the last one. Returns BW_OK (also when nothing was due) or an error. Call
 * from one thread (the daemon's main loop). */
int bw__jobs_compact(bw_jobs *s, uint64_t min_bytes, char *err, size_t errlen);

/* The placement to hand out (GetJob, heartbeats): its version into *version, and, when `out`
 * is not NULL, the table filled into `arena` (*out = NULL when there is none). Joins and
 * heartbeats ask only for the version, which costs nothing per worker; GetJob asks for the
 * table. Called without the jobs lock held. */
typedef int (*bw_jobs_placement_fn)(void *user, bw_arena *arena, uint64_t *version,
                                    Batchwire__V1__PlacementTable **out);
void bw__jobs_set_placement(bw_jobs *s, bw_jobs_placement_fn fn, void *user);

/* Read grants (docs/security.md, "Read grants"; borrowed, NULL: off): with them every join and
 * lease heartbeat answer carries the lease's grant, and leases that end are revoked in them. */
void bw__jobs_set_grants(bw_jobs *s, bw_grants *grants);

/* Every operation below takes the caller, `who`: a job belongs to the principal that created
 * it, and others are refused with BW_PERMISSION_DENIED unless admin (core/auth/auth.h,
 * bw__auth_owns); ListJobs lists only the jobs `who` may use. */

/* GetOrCreateJob, step 1: validates; answers for an existing job (identical configuration,
 * or BW_MISMATCH listing the differing fields). *need_describe is set when the job does not
 * exist: describe the dataset, then call bw__jobs_create. */
int bw__jobs_lookup(bw_jobs *s, const bw_principal *who,
                    const Batchwire__V1__GetOrCreateJobRequest *req, bw_arena *arena,
                    Batchwire__V1__GetOrCreateJobResponse **resp, bool *need_describe,
                    uint64_t *wait_seq, char *err, size_t errlen);

/* GetOrCreateJob, step 2: creates the job with the dataset as described (or answers as
 * lookup does if another caller created it meanwhile). */
int bw__jobs_create(bw_jobs *s, const bw_principal *who,
                    const Batchwire__V1__GetOrCreateJobRequest *req,
                    const Batchwire__V1__DatasetInfo *info, bw_arena *arena,
                    Batchwire__V1__GetOrCreateJobResponse **resp, uint64_t *wait_seq, char *err,
                    size_t errlen);

/* A mixture job's description (docs/semantics.md, "Mixtures") from its sources' (infos[j] for
 * mix->sources[j], as workers described them; borrowed, so they must live in `arena` or
 * longer): format "mixture", sources[j].records source j's size, length E, the sources' own
 * descriptions in mix_sources, a fingerprint over theirs, their common layout if any.
 * Refuses a source that is empty or holds named arrays. BW_OK, BW_INVALID_ARGUMENT or
 * BW_NOMEM with a sentence. */
int bw__jobs_mixture_info(bw_arena *arena, const Batchwire__V1__Mixture *mix,
                          Batchwire__V1__DatasetInfo *const *infos,
                          Batchwire__V1__DatasetInfo **out, char *err, size_t errlen);

/* A synthetic dataset's description (JobConfig.synthetic_samples), made without a worker. */
Batchwire__V1__DatasetInfo *bw__jobs_synthetic_info(bw_arena *arena, uint64_t samples);

int bw__jobs_join(bw_jobs *s, const bw_principal *who, const Batchwire__V1__JoinJobRequest *req,
                  bw_arena *arena, Batchwire__V1__JoinJobResponse **resp, uint64_t *wait_seq,
                  char *err, size_t errlen);
int bw__jobs_heartbeat(bw_jobs *s, const bw_principal *who,
                       const Batchwire__V1__LeaseHeartbeatRequest *req, bw_arena *arena,
                       Batchwire__V1__LeaseHeartbeatResponse **resp, uint64_t *wait_seq, char *err,
                       size_t errlen);
/* LeaveJob: the holder of req->lease_id gives the rank up (journaled: a restart does not
 * renew a released lease). A lease_id that is not the rank's current lease changes nothing
 * and answers released = false, so a retried leave succeeds and cannot release anyone
 * else's lease. */
int bw__jobs_leave(bw_jobs *s, const bw_principal *who, const Batchwire__V1__LeaveJobRequest *req,
                   bw_arena *arena, Batchwire__V1__LeaveJobResponse **resp, uint64_t *wait_seq,
                   char *err, size_t errlen);
int bw__jobs_commit(bw_jobs *s, const bw_principal *who,
                    const Batchwire__V1__CommitCursorRequest *req, bw_arena *arena,
                    Batchwire__V1__CommitCursorResponse **resp, uint64_t *wait_seq, char *err,
                    size_t errlen);
int bw__jobs_get(bw_jobs *s, const bw_principal *who, const Batchwire__V1__GetJobRequest *req,
                 bw_arena *arena, Batchwire__V1__GetJobResponse **resp, uint64_t *wait_seq,
                 char *err, size_t errlen);
int bw__jobs_list(bw_jobs *s, const bw_principal *who, bw_arena *arena,
                  Batchwire__V1__ListJobsResponse **resp, uint64_t *wait_seq, char *err,
                  size_t errlen);
int bw__jobs_resume(bw_jobs *s, const bw_principal *who,
                    const Batchwire__V1__ResumeElasticRequest *req, bw_arena *arena,
                    Batchwire__V1__ResumeElasticResponse **resp, uint64_t *wait_seq, char *err,
                    size_t errlen);
/* DeleteJob: removes the job (journaled), for its owner or an admin. Its ranks' cursors stay
 * valid for a job created again with the same configuration. */
int bw__jobs_delete(bw_jobs *s, const bw_principal *who, const Batchwire__V1__DeleteJobRequest *req,
                    bw_arena *arena, Batchwire__V1__DeleteJobResponse **resp, uint64_t *wait_seq,
                    char *err, size_t errlen);

/* Removes (journaled) every job without a live lease whose last change is older than ttl_ms;
 * returns how many. For the daemon's main loop. */
size_t bw__jobs_expire(bw_jobs *s, uint64_t ttl_ms);

#endif
