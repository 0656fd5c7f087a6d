/* The Jobs service's handlers. They run on completion-queue threads and never wait for a
 * disk: each one applies its change (jobs_ops.c) and answers from the journal's notifier
 * thread once the change is durable (group commit). Creating a job first asks a live worker to
 * describe the dataset, on a thread of its own. */
#include "jobs_service.h"
#include "placement_service.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "rpc/client.h"

enum { DESCRIBE_TIMEOUT_MS = 10000 };

typedef struct reply {
    bw_coordinator *c;
    bw_rpc_call *call;
    int rc;
    const ProtobufCMessage *resp;
} reply;

/* What a change's answer becomes once the journal has spoken (jrc): the handler's own rc, or
 * the journal's failure with its sentence in why. One place for the unary calls and the
 * session stream's messages. */
static int durable_rc(bw_coordinator *c, int rc, int jrc, char *why, size_t whylen)
{
    if (jrc == BW_NOMEM) {
        snprintf(why, whylen,
                 "the coordinator ran out of memory waiting for this change to be durable: retry");
        return BW_NOMEM;
    }
    if (jrc == BW_UNAVAILABLE && rc != BW_UNAVAILABLE) {
        /* The disk is full (a change refused for it already says so, and stays as it is). */
        char full[512];
        if (!bw__journal_full(bw__jobs_journal(c->jobs), full, sizeof(full)))
            snprintf(full, sizeof(full), "no space left");
        snprintf(why, whylen,
                 "the coordinator's state directory is full (%s), and this answer depends on a "
                 "change not yet on disk (it is written once there is space): retry",
                 full);
        return BW_UNAVAILABLE;
    }
    if (jrc != BW_OK && jrc != BW_UNAVAILABLE) {
        snprintf(why, whylen,
                 "the coordinator's journal failed before this change was durable; it restarts "
                 "from what is on disk: retry");
        return BW_UNAVAILABLE;
    }
    return rc;
}

static void reply_durable(void *arg, int jrc)
{
    reply *r = arg;
    char why[768];
    int rc = durable_rc(r->c, r->rc, jrc, why, sizeof(why));
    if (rc != r->rc)
        bw__rpc_fail(r->call, rc, "%s", why);
    bw__rpc_finish(r->call, rc, rc == BW_OK ? r->resp : NULL);
}

/* Answers once `wait_seq` is durable: the answer may depend on changes not yet on disk. */
static int answer(bw_coordinator *c, bw_rpc_call *call, const char *method, int rc,
                  const ProtobufCMessage *resp, uint64_t wait_seq, const char *err)
{
    if (rc != BW_OK && err[0])
        bw__rpc_fail(call, rc, "%s: %s", method, err);
    reply *r = bw__arena_alloc(bw__rpc_call_arena(call), sizeof(*r));
    if (!r)
        return BW_NOMEM;
    r->c = c;
    r->call = call;
    r->rc = rc;
    r->resp = resp;
    bw__journal_when_durable(bw__jobs_journal(c->jobs), wait_seq, reply_durable, r);
    return BW_RPC_DEFERRED;
}

/* ---- describing a dataset through a live worker ---- */

int bw__describe_dataset(bw_coordinator *c, const Batchwire__V1__Dataset *dataset, bw_arena *arena,
                         Batchwire__V1__DatasetInfo **info, char *err, size_t errlen)
{
    *info = NULL;
    bw_arena tmp;
    bw__arena_init(&tmp, 0);
    char **ids = NULL, **addrs = NULL, **daddrs = NULL;
    size_t n = 0;
    uint64_t version;
    int rc = bw__membership_live(c->members, &tmp, &version, &ids, &addrs, &daddrs, &n);
    if (rc == BW_OK && n == 0) {
        size_t nsrc = dataset->n_sources; /* named arrays: every field's */
        for (size_t k = 0; k < dataset->n_fields; k++)
            nsrc += dataset->fields[k]->n_sources;
        snprintf(err, errlen,
                 "no live storage worker to describe the dataset (format %s, %zu sources): start "
                 "a batchwire-worker with --coordinator %s, then retry",
                 dataset->format, nsrc, c->bound);
        rc = BW_UNAVAILABLE;
    }
    Batchwire__V1__DescribeRequest req = BATCHWIRE__V1__DESCRIBE_REQUEST__INIT;
    req.dataset = (Batchwire__V1__Dataset *)dataset;
    /* Any live worker sees the same shared volume; start at a different one per dataset so
     * that creations spread, and move on only when a worker cannot answer at all. */
    size_t start = n ? (size_t)(bw__random_u64() % n) : 0;
    for (size_t k = 0; rc == BW_OK && k < n; k++) {
        size_t i = (start + k) % n;
        bw_rpc_channel_opts co;
        memset(&co, 0, sizeof(co));
        co.target = addrs[i];
        co.tls.ca = c->cfg->worker_tls_ca;
        co.tls.cert = c->cfg->worker_tls_ca ? c->cfg->common.tls_cert : NULL;
        co.tls.key = c->cfg->worker_tls_ca ? c->cfg->common.tls_key : NULL;
        /* With authentication on, the coordinator proves itself to this worker alone for a
         * minute (role coordinator: Describe and Info only) and never sends a token a worker
         * could use elsewhere (docs/security.md, "Read grants"). */
        char proof[BW_GRANT_COORD_PROOF_MAX];
        if (c->grants) {
            bw__grant_coord_proof(c->grants, ids[i], bw__unix_ms(), proof);
            co.header_name = BW_GRANT_COORD_HEADER;
            co.header_value = proof;
        } else {
            co.tls.token = c->token;
        }
        co.max_receive_bytes = 64 << 20;
        bw_rpc_channel *ch = NULL;
        char why[1024];
        ProtobufCMessage *resp = NULL;
        rc = bw__rpc_channel_open(&co, &ch, why, sizeof(why));
        if (rc == BW_OK)
            rc = bw__rpc_call(ch, BW_METHOD(BW_M_DATA_DESCRIBE), &req.base, arena, &resp,
                              DESCRIBE_TIMEOUT_MS, why, sizeof(why));
        bw__rpc_channel_close(ch);
        if (rc == BW_OK) {
            *info = ((Batchwire__V1__DescribeResponse *)resp)->info;
            if (!*info) {
                snprintf(err, errlen, "worker %s described the dataset with nothing", ids[i]);
                rc = BW_PROTOCOL;
            }
            break;
        }
        snprintf(err, errlen, "worker %s could not describe the dataset: %s", ids[i], why);
        /* A worker that is down or busy: try the next. An answer about the dataset
         * (not found, invalid, corrupt) would be the same from every worker. */
        if (rc == BW_UNAVAILABLE || rc == BW_TIMEOUT || rc == BW_UNIMPLEMENTED ||
            rc == BW_CANCELLED)
            rc = k + 1 < n ? BW_OK : rc;
        else
            break;
    }
    bw__arena_reset(&tmp);
    return rc;
}

/* A mixture's sources, each described through a live worker, then the mixture's own
 * description (bw__jobs_mixture_info). */
static int describe_mixture(bw_coordinator *c, const Batchwire__V1__Mixture *mix, bw_arena *arena,
                            Batchwire__V1__DatasetInfo **info, char *err, size_t errlen)
{
    size_t n = mix->n_sources;
    Batchwire__V1__DatasetInfo **infos = bw__arena_alloc(arena, (n ? n : 1) * sizeof(*infos));
    if (!infos) {
        snprintf(err, errlen, "out of memory describing a mixture of %zu sources", n);
        return BW_NOMEM;
    }
    for (size_t j = 0; j < n; j++) {
        char why[1024];
        int rc =
            bw__describe_dataset(c, mix->sources[j]->dataset, arena, &infos[j], why, sizeof(why));
        if (rc != BW_OK) {
            snprintf(err, errlen, "mixture source %zu: %s", j, why);
            return rc;
        }
    }
    return bw__jobs_mixture_info(arena, mix, infos, info, err, errlen);
}

typedef struct create_task {
    bw_coordinator *c;
    bw_rpc_call *call;
    const Batchwire__V1__GetOrCreateJobRequest *req;
} create_task;

static pthread_mutex_t tasks_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t tasks_cv = PTHREAD_COND_INITIALIZER;
static int tasks_running;

static void *create_thread(void *arg)
{
    create_task *t = arg;
    bw_arena *a = bw__rpc_call_arena(t->call);
    char err[1536] = "";
    Batchwire__V1__DatasetInfo *info = NULL;
    Batchwire__V1__GetOrCreateJobResponse *resp = NULL;
    uint64_t wait_seq = 0;
    const Batchwire__V1__Mixture *mix = t->req->config->mixture;
    int rc = mix ? describe_mixture(t->c, mix, a, &info, err, sizeof(err))
                 : bw__describe_dataset(t->c, t->req->config->dataset, a, &info, err, sizeof(err));
    if (rc == BW_OK)
        rc = bw__jobs_create(t->c->jobs, bw__rpc_call_principal(t->call), t->req, info, a, &resp,
                             &wait_seq, err, sizeof(err));
    if (rc == BW_OK && resp->created)
        BW_INFO("job=%s created over a dataset a worker described samples=%llu world_size=%u "
                "fingerprint=%016llx",
                t->req->name, (unsigned long long)info->length, t->req->world_size,
                (unsigned long long)resp->job->fingerprint);
    if (answer(t->c, t->call, "GetOrCreateJob", rc, resp ? &resp->base : NULL, wait_seq, err) !=
        BW_RPC_DEFERRED)
        bw__rpc_finish(t->call, BW_NOMEM, NULL);
    free(t);
    pthread_mutex_lock(&tasks_mu);
    tasks_running--;
    pthread_cond_broadcast(&tasks_cv);
    pthread_mutex_unlock(&tasks_mu);
    return NULL;
}

void bw__jobs_service_drain(void)
{
    pthread_mutex_lock(&tasks_mu);
    while (tasks_running > 0)
        pthread_cond_wait(&tasks_cv, &tasks_mu);
    pthread_mutex_unlock(&tasks_mu);
}

/* ---- handlers ---- */

int bw__jobs_on_get_or_create(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                              ProtobufCMessage **resp)
{
    (void)resp;
    bw_coordinator *c = user;
    const Batchwire__V1__GetOrCreateJobRequest *r = (const void *)req;
    bw_arena *a = bw__rpc_call_arena(call);
    char err[1536] = "";
    Batchwire__V1__GetOrCreateJobResponse *out = NULL;
    uint64_t wait_seq = 0;
    bool need_describe = false;
    const bw_principal *who = bw__rpc_call_principal(call);
    int rc = bw__jobs_lookup(c->jobs, who, r, a, &out, &need_describe, &wait_seq, err, sizeof(err));
    if (rc == BW_OK && need_describe && r->config->synthetic_samples > 0) {
        Batchwire__V1__DatasetInfo *info = bw__jobs_synthetic_info(a, r->config->synthetic_samples);
        rc = info ? bw__jobs_create(c->jobs, who, r, info, a, &out, &wait_seq, err, sizeof(err))
                  : BW_NOMEM;
        if (rc == BW_OK && out->created)
            BW_INFO("job=%s created over a synthetic dataset samples=%llu world_size=%u "
                    "fingerprint=%016llx",
                    r->name, (unsigned long long)info->length, r->world_size,
                    (unsigned long long)out->job->fingerprint);
    } else if (rc == BW_OK && need_describe) {
        create_task *t = calloc(1, sizeof(*t));
        if (!t) {
            snprintf(err, sizeof(err), "out of memory starting to describe the dataset: retry");
            return answer(c, call, "GetOrCreateJob", BW_NOMEM, NULL, wait_seq, err);
        }
        *t = (create_task){c, call, r};
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_mutex_lock(&tasks_mu);
        tasks_running++;
        pthread_mutex_unlock(&tasks_mu);
        int e = pthread_create(&th, &attr, create_thread, t);
        pthread_attr_destroy(&attr);
        if (e == 0)
            return BW_RPC_DEFERRED;
        pthread_mutex_lock(&tasks_mu);
        tasks_running--;
        pthread_cond_broadcast(&tasks_cv);
        pthread_mutex_unlock(&tasks_mu);
        free(t);
        snprintf(err, sizeof(err), "cannot start a thread to describe the dataset (%s): retry",
                 strerror(e));
        return answer(c, call, "GetOrCreateJob", BW_UNAVAILABLE, NULL, wait_seq, err);
    }
    return answer(c, call, "GetOrCreateJob", rc, out ? &out->base : NULL, wait_seq, err);
}

#define SIMPLE_HANDLER(fname, method, Req, Resp, op)                                               \
    int fname(void *user, bw_rpc_call *call, const ProtobufCMessage *req, ProtobufCMessage **resp) \
    {                                                                                              \
        (void)resp;                                                                                \
        bw_coordinator *c = user;                                                                  \
        char err[1536] = "";                                                                       \
        Resp *out = NULL;                                                                          \
        uint64_t wait_seq = 0;                                                                     \
        int rc = op(c->jobs, bw__rpc_call_principal(call), (const Req *)(const void *)req,         \
                    bw__rpc_call_arena(call), &out, &wait_seq, err, sizeof(err));                  \
        return answer(c, call, method, rc, out ? &out->base : NULL, wait_seq, err);                \
    }

SIMPLE_HANDLER(bw__jobs_on_lease_heartbeat, "LeaseHeartbeat", Batchwire__V1__LeaseHeartbeatRequest,
               Batchwire__V1__LeaseHeartbeatResponse, bw__jobs_heartbeat)
SIMPLE_HANDLER(bw__jobs_on_commit, "CommitCursor", Batchwire__V1__CommitCursorRequest,
               Batchwire__V1__CommitCursorResponse, bw__jobs_commit)
SIMPLE_HANDLER(bw__jobs_on_get, "GetJob", Batchwire__V1__GetJobRequest,
               Batchwire__V1__GetJobResponse, bw__jobs_get)
SIMPLE_HANDLER(bw__jobs_on_resume, "ResumeElastic", Batchwire__V1__ResumeElasticRequest,
               Batchwire__V1__ResumeElasticResponse, bw__jobs_resume)
SIMPLE_HANDLER(bw__jobs_on_leave, "LeaveJob", Batchwire__V1__LeaveJobRequest,
               Batchwire__V1__LeaveJobResponse, bw__jobs_leave)
SIMPLE_HANDLER(bw__jobs_on_delete, "DeleteJob", Batchwire__V1__DeleteJobRequest,
               Batchwire__V1__DeleteJobResponse, bw__jobs_delete)

/* JoinJob: bw__jobs_join, and the commit channel's port for the session's commits. */
int bw__jobs_on_join(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                     ProtobufCMessage **resp)
{
    (void)resp;
    bw_coordinator *c = user;
    char err[1536] = "";
    Batchwire__V1__JoinJobResponse *out = NULL;
    uint64_t wait_seq = 0;
    int rc = bw__jobs_join(c->jobs, bw__rpc_call_principal(call), (const void *)req,
                           bw__rpc_call_arena(call), &out, &wait_seq, err, sizeof(err));
    if (rc == BW_OK && out)
        out->commit_port = (uint32_t)c->commit_port;
    return answer(c, call, "JoinJob", rc, out ? &out->base : NULL, wait_seq, err);
}

int bw__jobs_on_list(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                     ProtobufCMessage **resp)
{
    (void)req;
    (void)resp;
    bw_coordinator *c = user;
    char err[256] = "";
    Batchwire__V1__ListJobsResponse *out = NULL;
    uint64_t wait_seq = 0;
    int rc = bw__jobs_list(c->jobs, bw__rpc_call_principal(call), bw__rpc_call_arena(call), &out,
                           &wait_seq, err, sizeof(err));
    return answer(c, call, "ListJobs", rc, out ? &out->base : NULL, wait_seq, err);
}

/* ---- Jobs.Session: a trainer session's commits and heartbeats on one stream ----
 *
 * Each message is the unary call it carries: authorized by the same table entry
 * (bw__rpc_authorize_as; a role that may not make the call ends the stream), handled by the
 * same operation of jobs_ops.c with the stream's principal (which checks the job's owner and
 * the lease), answered once durable through durable_rc. Its error -- LEASE_LOST above all --
 * is that message's answer (code and sentence, worded as the unary call's) and the stream
 * stays open. */

typedef struct session_reply {
    bw_coordinator *c;
    bw_rpc_msg *m;
    bw_session_answer ans;
} session_reply;

void bw__jobs_session_settle(bw_coordinator *c, bw_session_answer *a, int jrc)
{
    char why[768];
    int rc = durable_rc(c, a->rc, jrc, why, sizeof(why));
    Batchwire__V1__SessionResponse *out = &a->resp;
    if (rc != BW_OK) {
        if (rc != a->rc)
            snprintf(a->err, sizeof(a->err), "%s", why);
        else if (a->err[0] == '\0')
            snprintf(a->err, sizeof(a->err), "%s", bw_strerror(rc));
        out->result_case = BATCHWIRE__V1__SESSION_RESPONSE__RESULT__NOT_SET;
        out->error_code = (char *)bw_err_name(rc);
        out->error_message = a->err;
    }
    a->rc = rc;
}

static void session_durable(void *arg, int jrc)
{
    session_reply *r = arg;
    bw__jobs_session_settle(r->c, &r->ans, jrc);
    bw__rpc_msg_answer(r->m, BW_OK, &r->ans.resp.base);
}

bw_method_id bw__jobs_session_method(const Batchwire__V1__SessionRequest *r)
{
    switch (r->op_case) {
    case BATCHWIRE__V1__SESSION_REQUEST__OP_COMMIT:
        return BW_M_JOBS_COMMIT_CURSOR;
    case BATCHWIRE__V1__SESSION_REQUEST__OP_HEARTBEAT:
        return BW_M_JOBS_LEASE_HEARTBEAT;
    default:
        return BW_M__COUNT;
    }
}

int bw__jobs_session_op(bw_jobs *jobs, const bw_principal *who,
                        const Batchwire__V1__SessionRequest *r, bw_arena *a,
                        Batchwire__V1__SessionResponse *out, uint64_t *wait_seq, char *err,
                        size_t errlen)
{
    out->id = r->id;
    if (r->op_case == BATCHWIRE__V1__SESSION_REQUEST__OP_COMMIT) {
        out->result_case = BATCHWIRE__V1__SESSION_RESPONSE__RESULT_COMMIT;
        return bw__jobs_commit(jobs, who, r->commit, a, &out->commit, wait_seq, err, errlen);
    }
    if (r->op_case == BATCHWIRE__V1__SESSION_REQUEST__OP_HEARTBEAT) {
        out->result_case = BATCHWIRE__V1__SESSION_RESPONSE__RESULT_HEARTBEAT;
        return bw__jobs_heartbeat(jobs, who, r->heartbeat, a, &out->heartbeat, wait_seq, err,
                                  errlen);
    }
    snprintf(err, errlen,
             "message %llu carries no request (a SessionRequest holds a commit or a "
             "heartbeat)",
             (unsigned long long)r->id);
    return BW_INVALID_ARGUMENT;
}

uint64_t bw__jobs_session_begin(bw_coordinator *c, const bw_principal *who,
                                const Batchwire__V1__SessionRequest *r, bw_arena *a,
                                bw_session_answer *out)
{
    memset(out, 0, sizeof(*out));
    batchwire__v1__session_response__init(&out->resp);
    const char *method =
        bw__jobs_session_method(r) == BW_M_JOBS_COMMIT_CURSOR ? "CommitCursor" : "LeaseHeartbeat";
    uint64_t wait_seq = 0;
    char err[1536] = "";
    out->rc = bw__jobs_session_op(c->jobs, who, r, a, &out->resp, &wait_seq, err, sizeof(err));
    if (out->rc != BW_OK && err[0])
        snprintf(out->err, sizeof(out->err), "%s: %.1500s", method, err);
    return wait_seq;
}

static int on_session_msg(void *state, bw_rpc_msg *m, const ProtobufCMessage *req,
                          ProtobufCMessage **resp)
{
    (void)resp;
    bw_coordinator *c = state;
    const Batchwire__V1__SessionRequest *r = (const void *)req;
    bw_rpc_call *call = bw__rpc_msg_call(m);
    bw_method_id as = bw__jobs_session_method(r);
    if (as == BW_M__COUNT)
        return bw__rpc_fail(call, BW_INVALID_ARGUMENT,
                            "Jobs.Session: message %llu carries no request (a SessionRequest "
                            "holds a commit or a heartbeat)",
                            (unsigned long long)r->id);
    int rc = bw__rpc_authorize_as(call, as);
    if (rc != BW_OK)
        return rc;
    session_reply *out = bw__arena_alloc(bw__rpc_msg_arena(m), sizeof(*out));
    if (!out)
        return bw__rpc_fail(call, BW_NOMEM, "Jobs.Session: out of memory for an answer");
    out->c = c;
    out->m = m;
    uint64_t wait_seq =
        bw__jobs_session_begin(c, bw__rpc_call_principal(call), r, bw__rpc_msg_arena(m), &out->ans);
    bw__journal_when_durable(bw__jobs_journal(c->jobs), wait_seq, session_durable, out);
    return BW_RPC_DEFERRED;
}

int bw__jobs_on_session(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                        ProtobufCMessage **resp)
{
    (void)req;
    (void)resp;
    bw__rpc_bidi_start(call, on_session_msg, user, NULL);
    return BW_RPC_STREAM;
}

/* The placement table for GetJob and lease heartbeats: the live workers and their version. */
int bw__jobs_placement_table(void *user, bw_arena *a, uint64_t *version,
                             Batchwire__V1__PlacementTable **out)
{
    bw_coordinator *c = user;
    if (!out) {
        /* The version alone: no copy and sort of every live worker (bench/bench_sim.c found
         * that copy in every join and heartbeat, ~0.1 us per worker). */
        *version = bw__membership_version(c->members);
        return BW_OK;
    }
    int rc = bw__placement_table(c, a, 0, out);
    *version = rc == BW_OK ? (*out)->version : 0;
    return rc;
}
