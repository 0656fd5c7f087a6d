/* The loader's session with the coordinator (session.c): the job, the rank's lease and its
 * heartbeats, placement, committed cursors. Connections to workers are the transports'
 * (transport.h), not the session's. Nothing here is part of the public API. */
#ifndef BW_CLIENT_SESSION_H
#define BW_CLIENT_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "batchwire/loader.h"
#include "common/arena.h"
#include "commit_client.h"
#include "jobs.pb-c.h"
#include "loader_limits.h"
#include "options_int.h"
#include "route.h"
#include "rpc/client.h"
#include "transport.h"

/* What the loader has handed out, written by loader.c and read by the heartbeat thread (which
 * reports it as RankLive) and by bw_loader_get_stats. */
typedef struct bw__live {
    atomic_uint_fast64_t epoch, step, epoch_steps; /* the next batch to hand out */
    atomic_uint_fast64_t batches, samples, bytes, wait_ns;
} bw__live;

/* The lease's read grant (session.c; docs/security.md, "Read grants"). */
typedef struct bw__grant bw__grant;

typedef struct bw__session {
    bw_rpc_channel *coord;
    /* The settings the transports are created from: TLS (the coordinator's too; target unset),
     * never the token, and the session's read grant as their grant source. */
    bw__worker_opts chopts;
    int timeout_ms;
    int retry_ms; /* joins and commits retry this long while the coordinator is away */
    /* The coordinator has answered this session once: from then on a host name that does
     * not resolve is an outage (retried), not a mistyped address (refused at once). */
    atomic_bool reached;
    char *job;
    uint32_t rank, world;
    uint64_t lease_id, lease_id_hi; /* 128 bits: docs/security.md, "Leases" */
    char *token;                    /* bearer token (--token-file), or NULL: coordinator only */
    bool finished;                  /* the last epoch was delivered: leave saying so */
    uint32_t heartbeat_ms;
    bw_arena job_arena; /* holds `summary` */
    Batchwire__V1__JobSummary *summary;
    ProtobufCBinaryData resume_cursor; /* where JoinJob says this rank resumes */

    pthread_mutex_t mu; /* guards placement, the grant and the heartbeat's state; no I/O */
    pthread_cond_t cv;
    bw__placement *placement;
    /* The newest read grant the coordinator sent (JoinJob, each LeaseHeartbeat), with the
     * proofs computed from it; NULL without one (authentication off, or a share without the
     * lease). Secret: never logged, wiped when replaced and at close. granted_ms: when it
     * came (monotonic ms): a heartbeat is due an interval later even if commits keep renewing
     * the lease, as their answers carry no grant. */
    bw__grant *grant;
    uint64_t granted_ms;
    atomic_uint_fast64_t seen_version; /* newest placement version announced */

    bw__live live;       /* reported with each heartbeat */
    uint32_t holder_pid; /* the trainer process named as the lease's holder */
    /* Fencing (docs/client.md, "Fencing"). `claimed`: this session joined the rank (it reports
     * live counters and leaves on close); a share given the rank's lease (bw_loader_options.
     * lease) only confirms it. `confirms`: there is a lease to confirm (either case); the
     * heartbeat thread runs. */
    bool claimed, confirms;
    pthread_t hb_thread;
    bool hb_started, stopping; /* under mu */
    /* Heartbeats begun and ended, and the newest one's outcome (under mu; cv announces each). */
    uint64_t hb_begun, hb_ended;
    int hb_rc;
    char hb_err[BW_LOADER_ERRLEN];
    /* The coordinator said the lease is no longer ours (another process took the rank over):
     * set once, by whichever thread heard it; lost_err (under mu) says who holds it now. */
    atomic_bool lease_lost;
    char lost_err[BW_LOADER_ERRLEN];
    /* The lease's length (from the coordinator's last answer), and when the newest request the
     * coordinator answered with a renewal was *sent* (monotonic ms): the lease is proven until
     * vouched_ms + lease_ms, less a margin; past that, nothing is handed out until the
     * coordinator confirms it (bw__session_lease_gate). */
    atomic_uint_least32_t lease_ms;
    atomic_uint_fast64_t vouched_ms;
    atomic_bool cancelled; /* the loader is closing: waits for the lease end (BW_CANCELLED) */
    /* Commits and heartbeats travel on one Jobs.Session stream (session.c, "The session
     * stream"), one request at a time: whoever holds stream_mu uses it, and a request that
     * finds it busy goes as a unary call. `stream` is NULL until first use and after a
     * failure (reopened on the next use); no_stream: the coordinator has no Jobs.Session
     * (an older one), so every request is a unary call. */
    pthread_mutex_t stream_mu;
    bw_rpc_bidi *stream;     /* under stream_mu */
    uint64_t stream_next_id; /* under stream_mu */
    atomic_bool no_stream;
    /* The coordinator's commit channel (JoinJobResponse.commit_port; commit_client.h): when it
     * announced one, the requests that hold stream_mu go there instead of on the stream;
     * no_cchan once it could not be reached or said hello to (the stream from then on). */
    bw__cchan_client cchan; /* under stream_mu; address NULL: none announced */
    char cchan_host[256];   /* the name its TLS certificate must carry */
    atomic_bool no_cchan;
} bw__session;

/* How a loader joins its job. */
typedef struct bw__join {
    bool claim;    /* take the rank's lease (false: a share of the rank other than share 0) */
    bool elastic;  /* first resize the job to this world size (bw_loader_open_elastic) */
    bool describe; /* with claim false: only create or describe the job (summary), nothing else
                    * (no placement, no lease: bw_loader_rank_steps) */
    const void *const *cursors; /* ... from these cursors of the old world (lens[i] 0: */
    const size_t *lens;         /* text); ncursors 0: every rank's committed cursor */
    size_t ncursors;
} bw__join;

/* Connects, creates or joins the job (how NULL: claims the rank), takes the rank's lease and
 * fetches placement. jr NULL: connects to the coordinator only. */
int bw__session_open(bw__session *s, const bw_loader_options *o, const bw__job_request *jr,
                     uint32_t rank, uint32_t world, const bw__join *how, char *err, size_t errlen);

/* Every rank's committed cursor of `job` (GetJob), in rank order, into arena a.
 * BW_FAILED_PRECONDITION naming a rank that has none. */
int bw__session_committed(bw__session *s, const char *job, bw_arena *a, ProtobufCBinaryData **out,
                          size_t *n, char *err, size_t errlen);
void bw__session_close(bw__session *s);

/* The current placement (a reference: release with bw__placement_put). Refreshes it first
 * when `refresh` is set or a newer version was announced; keeps the old table if the
 * coordinator cannot be reached. NULL when no table has ever been fetched. */
bw__placement *bw__session_placement(bw__session *s, bool refresh, char *err, size_t errlen);

/* Whether the coordinator has vouched for the lease within the last lease period (less a
 * margin), measured from when the vouching request was sent; always true without a lease to
 * confirm. False once the lease is lost. */
bool bw__session_lease_fresh(bw__session *s);

/* The monotonic time (ms) until which the lease is proven, margin included (what
 * bw__session_lease_fresh compares with): UINT64_MAX without a lease to confirm or when the
 * coordinator states no lease length, 0 once the lease is lost. Atomics only; any thread. */
uint64_t bw__session_proven_until(bw__session *s);

/* The one lease gate: whether a read may start or a batch be handed out (docs/client.md,
 * "Fencing"). BW_LEASE_LOST with the coordinator's sentence in err once the lease was taken
 * over -- a loader that lost its rank hands out no more batches and commits nothing -- else,
 * without `wait`, BW_OK at once. With `wait`: BW_OK at once while the lease is fresh; else
 * waits (polling every 100 ms at most) until the coordinator confirms it (BW_OK), refuses it
 * (BW_LEASE_LOST, for good), the loader closes (BW_CANCELLED), or confirming has failed for
 * the session's retry_ms with at least one attempt since the call (the last error:
 * BW_UNAVAILABLE while the coordinator is unreachable); err says why. Any thread. */
int bw__session_lease_gate(bw__session *s, bool wait, char *err, size_t errlen);

/* Ends every waiting bw__session_lease_gate with BW_CANCELLED (the loader is closing). */
void bw__session_cancel(bw__session *s);

/* The lease as text ("bwl1:" and 32 hex digits) for the session that claimed the rank:
 * BW_FAILED_PRECONDITION without one, BW_LEASE_LOST once lost, BW_TOO_BIG. */
int bw__session_lease_text(bw__session *s, char *buf, size_t buflen, char *err, size_t errlen);

/* The read grant for a request to worker `worker_id`: copies the current grant's claims and
 * that worker's proof into *out (the proof computed once per worker per grant) and returns
 * true; false without a grant. Any thread; the session's lock is held only to copy. The
 * session's chopts.grant calls it. */
bool bw__session_grant(bw__session *s, const char *worker_id, bw__grant_copy *out);

/* The read grant in a coordinator's answer (`what`: "JoinJob" or "LeaseHeartbeat", for the
 * message) becomes the session's: the old one's secret and proofs are wiped, and so is the
 * answer's copy of the secret. Neither claims nor secret (authentication off): unchanged.
 * BW_PROTOCOL for a malformed grant (claims empty or over BW_GRANT_CLAIMS_MAX bytes, a secret
 * not BW_GRANT_SECRET_BYTES long), BW_NOMEM; on error the session's grant is unchanged. The
 * session calls it with each answer; exposed for tests. */
int bw__session_set_grant(bw__session *s, const char *what, ProtobufCBinaryData *claims,
                          ProtobufCBinaryData *secret, char *err, size_t errlen);

/* Records a cursor durably with the coordinator. */
int bw__session_commit(bw__session *s, const uint8_t *cursor, size_t len, char *err, size_t errlen);

#endif
