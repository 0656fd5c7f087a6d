/* The coordinator's Jobs service (jobs_service.c): handlers for coordinator_service.c's
 * table; `user` is the bw_coordinator. */
#ifndef BW_SERVER_JOBS_SERVICE_H
#define BW_SERVER_JOBS_SERVICE_H

#include "coordinator.h"
#include "jobs.h"
#include "rpc/server.h"

#define BW__JOBS_HANDLER(name)                                                                     \
    int name(void *user, bw_rpc_call *call, const ProtobufCMessage *req, ProtobufCMessage **resp)
BW__JOBS_HANDLER(bw__jobs_on_get_or_create);
BW__JOBS_HANDLER(bw__jobs_on_join);
BW__JOBS_HANDLER(bw__jobs_on_lease_heartbeat);
BW__JOBS_HANDLER(bw__jobs_on_commit);
BW__JOBS_HANDLER(bw__jobs_on_get);
BW__JOBS_HANDLER(bw__jobs_on_list);
BW__JOBS_HANDLER(bw__jobs_on_resume);
BW__JOBS_HANDLER(bw__jobs_on_leave);
BW__JOBS_HANDLER(bw__jobs_on_delete);
/* Jobs.Session, a bidirectional stream (core/rpc/server.h): each message a CommitCursor or
 * LeaseHeartbeat, handled as the unary call. */
BW__JOBS_HANDLER(bw__jobs_on_session);

/* The unary method a Jobs.Session message stands for (BW_M_JOBS_COMMIT_CURSOR,
 * BW_M_JOBS_LEASE_HEARTBEAT), whose authorization it gets; BW_M__COUNT when it carries none. */
bw_method_id bw__jobs_session_method(const Batchwire__V1__SessionRequest *r);

/* Applies a Jobs.Session message's operation (bw__jobs_commit, bw__jobs_heartbeat) for `who`,
 * whom the caller has authorized for bw__jobs_session_method(r): sets out's id and result
 * (memory from `a`) and returns the operation's rc, *wait_seq and err, as the unary handler
 * gets them. */
int bw__jobs_session_op(bw_jobs *jobs, const bw_principal *who,
                        const Batchwire__V1__SessionRequest *r, bw_arena *a,
                        Batchwire__V1__SessionResponse *out, uint64_t *wait_seq, char *err,
                        size_t errlen);

/* One Jobs.Session message's answer in the making, the same whatever carried the message: the
 * gRPC stream (bw__jobs_on_session) or the commit channel (server/commit_channel.c). */
typedef struct bw_session_answer {
    int rc;         /* the operation's, then (bw__jobs_session_settle) the answer's */
    char err[1536]; /* its sentence, worded as the unary call's ("CommitCursor: ...") */
    Batchwire__V1__SessionResponse resp;
} bw_session_answer;

/* Applies message r for `who` (authorized by the caller for bw__jobs_session_method(r)) with
 * bw__jobs_session_op, filling *out (memory from `a`); returns the journal record the answer
 * must wait for: hand it to bw__journal_when_durable, then call bw__jobs_session_settle. */
uint64_t bw__jobs_session_begin(bw_coordinator *c, const bw_principal *who,
                                const Batchwire__V1__SessionRequest *r, bw_arena *a,
                                bw_session_answer *out);

/* Once the journal has spoken (jrc, as bw_journal_done_fn gets it): makes out->resp the final
 * answer, with error_code and error_message when it failed (its rc then in out->rc). */
void bw__jobs_session_settle(bw_coordinator *c, bw_session_answer *out, int jrc);

/*
 * Asks a live worker (any; the next one if it cannot answer) to describe `dataset`
 * (Data.Describe). Blocks up to a few seconds per worker: never call it on a completion-queue
 * thread. *info lives in `arena`. Returns BW_OK, BW_UNAVAILABLE when no worker could answer,
 * or the worker's verdict on the dataset, with a sentence in err.
 */
int bw__describe_dataset(bw_coordinator *c, const Batchwire__V1__Dataset *dataset, bw_arena *arena,
                         Batchwire__V1__DatasetInfo **info, char *err, size_t errlen);

/* Waits for job creations that are still describing their dataset (before shutdown). */
void bw__jobs_service_drain(void);

/* A bw_jobs_placement_fn over the coordinator's membership (`user` is the bw_coordinator). */
int bw__jobs_placement_table(void *user, bw_arena *arena, uint64_t *version,
                             Batchwire__V1__PlacementTable **out);

#endif
