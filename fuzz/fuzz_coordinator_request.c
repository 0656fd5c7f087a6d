/* libFuzzer target: the coordinator's request handlers (server/jobs_*.c, server/membership.c)
 * on a real jobs state with its journal in a temporary directory. The first input byte picks
 * the method, the second the caller (an open service's anonymous principal, an admin, two
 * trainers, a worker); the rest is the request's bytes. Each goes through what the gRPC
 * runtime does before a handler (core/rpc/server.c: the authorization table, the request
 * checks of core/rpc/proto_check.c, bounded decoding) and then the handler's operation, so
 * any request a client can send reaches it. Invariants: no crash or leak, every refusal says
 * why, and the state stays usable (a job and a lease made at start still answer). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "server/jobs_int.h"
#include "server/jobs_service.h"
#include "server/membership.h"
#include "auth/auth.h"
#include "rpc/methods.h"
#include "rpc/proto_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bw_jobs *jobs;
static bw_membership *members;
static bw_lease lease0;
static unsigned long runs;
static char dir[] = "/tmp/bw-fuzz-coordinator-XXXXXX";

static const bw_principal callers[] = {
    {BW_ROLE_OPEN, ""},       {BW_ROLE_ADMIN, "ops"},      {BW_ROLE_TRAINER, "alice"},
    {BW_ROLE_TRAINER, "bob"}, {BW_ROLE_WORKER, "storage"},
};

static const bw_method_id methods[] = {
    BW_M_JOBS_GET_OR_CREATE,  BW_M_JOBS_JOIN,  BW_M_JOBS_LEASE_HEARTBEAT,
    BW_M_JOBS_COMMIT_CURSOR,  BW_M_JOBS_GET,   BW_M_JOBS_LIST,
    BW_M_JOBS_RESUME_ELASTIC, BW_M_JOBS_LEAVE, BW_M_JOBS_DELETE,
    BW_M_REGISTER_WORKER,     BW_M_HEARTBEAT,  BW_M_JOBS_SESSION,
};

static void must(int ok)
{
    if (!ok)
        __builtin_trap();
}

/* At exit: the state closed and its directory removed. */
static void cleanup(void)
{
    bw__jobs_close(jobs);
    bw__membership_free(members);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[512];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.')
            unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

static void setup(void)
{
    must(mkdtemp(dir) != NULL);
    atexit(cleanup);
    bw_jobs_opts o = {dir, NULL, 60000, 64, 8, 64, 0};
    bw_journal_report rep;
    char err[1024];
    must(bw__jobs_open(&o, &jobs, &rep, err, sizeof(err)) == BW_OK);
    const bw_membership_opts mo = {1000, 3, 3600000, 64, 8, NULL};
    members = bw__membership_new(&mo);
    must(members != NULL);
    /* A job owned by alice with rank 0 held: the target of most requests. */
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__SamplerConfig sc = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    sc.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH;
    sc.batch_size = 4;
    Batchwire__V1__JobConfig cfg = BATCHWIRE__V1__JOB_CONFIG__INIT;
    cfg.sampler = &sc;
    cfg.synthetic_samples = 100;
    Batchwire__V1__GetOrCreateJobRequest req = BATCHWIRE__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
    req.name = "j";
    req.config = &cfg;
    req.world_size = 4;
    Batchwire__V1__GetOrCreateJobResponse *resp = NULL;
    uint64_t ws;
    must(bw__jobs_create(jobs, &callers[2], &req, bw__jobs_synthetic_info(&a, 100), &a, &resp, &ws,
                         err, sizeof(err)) == BW_OK);
    Batchwire__V1__Holder h = BATCHWIRE__V1__HOLDER__INIT;
    h.host = "h";
    h.pid = 1;
    Batchwire__V1__JoinJobRequest j = BATCHWIRE__V1__JOIN_JOB_REQUEST__INIT;
    j.job = "j";
    j.world_size = 4;
    j.holder = &h;
    Batchwire__V1__JoinJobResponse *jr = NULL;
    must(bw__jobs_join(jobs, &callers[2], &j, &a, &jr, &ws, err, sizeof(err)) == BW_OK);
    lease0 = (bw_lease){jr->lease_id, jr->lease_id_hi};
    bw__arena_reset(&a);
}

/* One request through its handler's operation. */
static int handle(bw_method_id m, const bw_principal *who, const ProtobufCMessage *req, bw_arena *a,
                  char *err, size_t errlen)
{
    uint64_t ws;
    void *out = NULL;
    switch (m) {
    case BW_M_JOBS_GET_OR_CREATE: {
        const Batchwire__V1__GetOrCreateJobRequest *r = (const void *)req;
        bool describe = false;
        int rc = bw__jobs_lookup(jobs, who, r, a, (void *)&out, &describe, &ws, err, errlen);
        /* A real dataset would be described by a worker; a synthetic one is created here. */
        if (rc == BW_OK && describe && r->config->synthetic_samples > 0) {
            Batchwire__V1__DatasetInfo *info =
                bw__jobs_synthetic_info(a, r->config->synthetic_samples);
            rc = info ? bw__jobs_create(jobs, who, r, info, a, (void *)&out, &ws, err, errlen)
                      : BW_NOMEM;
        }
        return rc;
    }
    case BW_M_JOBS_JOIN:
        return bw__jobs_join(jobs, who, (const void *)req, a, (void *)&out, &ws, err, errlen);
    case BW_M_JOBS_LEASE_HEARTBEAT:
        return bw__jobs_heartbeat(jobs, who, (const void *)req, a, (void *)&out, &ws, err, errlen);
    case BW_M_JOBS_COMMIT_CURSOR:
        return bw__jobs_commit(jobs, who, (const void *)req, a, (void *)&out, &ws, err, errlen);
    case BW_M_JOBS_GET:
        return bw__jobs_get(jobs, who, (const void *)req, a, (void *)&out, &ws, err, errlen);
    case BW_M_JOBS_LIST:
        return bw__jobs_list(jobs, who, a, (void *)&out, &ws, err, errlen);
    case BW_M_JOBS_RESUME_ELASTIC:
        return bw__jobs_resume(jobs, who, (const void *)req, a, (void *)&out, &ws, err, errlen);
    case BW_M_JOBS_LEAVE:
        return bw__jobs_leave(jobs, who, (const void *)req, a, (void *)&out, &ws, err, errlen);
    case BW_M_JOBS_DELETE: {
        const Batchwire__V1__DeleteJobRequest *r = (const void *)req;
        if (r->job && strcmp(r->job, "j") == 0)
            return BW_OK; /* keep the job the invariant below looks at */
        return bw__jobs_delete(jobs, who, r, a, (void *)&out, &ws, err, errlen);
    }
    case BW_M_REGISTER_WORKER:
        return bw__membership_register(members, who, (const void *)req, "fuzz", err, errlen);
    case BW_M_HEARTBEAT: {
        const Batchwire__V1__HeartbeatRequest *r = (const void *)req;
        bool known;
        return bw__membership_heartbeat(members, who, r->id ? r->id : "", r->incarnation, &known,
                                        err, errlen);
    }
    case BW_M_JOBS_SESSION: {
        /* One message of the stream, authorized as the call it carries (server/jobs_service.c,
         * on_session_msg) */
        const Batchwire__V1__SessionRequest *r = (const void *)req;
        bw_method_id as = bw__jobs_session_method(r);
        if (as != BW_M__COUNT && !bw__auth_allowed(who->role, as)) {
            snprintf(err, errlen, "refused as %s", bw__methods[as].name);
            return BW_PERMISSION_DENIED;
        }
        Batchwire__V1__SessionResponse sresp = BATCHWIRE__V1__SESSION_RESPONSE__INIT;
        int rc = bw__jobs_session_op(jobs, who, r, a, &sresp, &ws, err, errlen);
        must(sresp.id == r->id);
        return rc;
    }
    default:
        return BW_OK;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!jobs)
        setup();
    if (size < 2)
        return 0;
    bw_method_id m = methods[data[0] % (sizeof(methods) / sizeof(methods[0]))];
    const bw_principal *who = &callers[data[1] % (sizeof(callers) / sizeof(callers[0]))];
    if (!bw__auth_allowed(who->role, m))
        return 0; /* the runtime refuses it before any handler */
    const bw_rpc_method *method = BW_METHOD(m);
    char err[2048] = "";
    if (bw__proto_check(method->request, data + 2, size - 2, err, sizeof(err)) != BW_OK) {
        must(err[0] != 0);
        return 0;
    }
    bw_arena a;
    bw__arena_init(&a, 16 << 20);
    ProtobufCMessage *req = protobuf_c_message_unpack(method->request, &a.pb, size - 2, data + 2);
    if (req) {
        err[0] = 0;
        int rc = handle(m, who, req, &a, err, sizeof(err));
        if (rc != BW_OK && rc != BW_NOMEM)
            must(err[0] != 0); /* every refusal says why */
    }
    bw__arena_reset(&a);

    /* The state still answers: alice's job and its lease. */
    Batchwire__V1__LeaseHeartbeatRequest hb = BATCHWIRE__V1__LEASE_HEARTBEAT_REQUEST__INIT;
    hb.job = "j";
    hb.lease_id = lease0.lo;
    hb.lease_id_hi = lease0.hi;
    bw__arena_init(&a, 0);
    Batchwire__V1__LeaseHeartbeatResponse *hr = NULL;
    uint64_t ws;
    int rc = bw__jobs_heartbeat(jobs, &callers[2], &hb, &a, &hr, &ws, err, sizeof(err));
    if (rc == BW_LEASE_LOST) { /* taken over by a fuzzed join: join again */
        Batchwire__V1__Holder h = BATCHWIRE__V1__HOLDER__INIT;
        h.host = "h";
        h.pid = 1;
        Batchwire__V1__JoinJobRequest j = BATCHWIRE__V1__JOIN_JOB_REQUEST__INIT;
        j.job = "j";
        j.world_size = bw__jobs_find(jobs, "j")->world_size;
        j.holder = &h;
        Batchwire__V1__JoinJobResponse *jr = NULL;
        rc = bw__jobs_join(jobs, &callers[1], &j, &a, &jr, &ws, err, sizeof(err));
        if (rc == BW_OK)
            lease0 = (bw_lease){jr->lease_id, jr->lease_id_hi};
        else
            rc = BW_OK; /* held by a fuzzed holder until its lease expires */
    }
    must(rc == BW_OK || rc == BW_OUT_OF_RANGE); /* (an elastic resume may shrink the world) */
    bw__arena_reset(&a);
    if (++runs % 4096 == 0) {
        char why[256];
        bw__jobs_compact(jobs, 1 << 20, why, sizeof(why));
    }
    return 0;
}
