/* The coordinator's RPC handlers. They run on completion-queue threads: no blocking. */
#include "coordinator.h"

#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "jobs_service.h"
#include "placement_service.h"
#include "rpc/common_handlers.h"

static int on_info(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                   ProtobufCMessage **resp)
{
    (void)req;
    bw_coordinator *c = user;
    int rc =
        bw__rpc_info(call, BATCHWIRE__V1__ROLE__ROLE_COORDINATOR, "", c->bound, c->start_ms, resp);
    if (rc == BW_OK)
        ((Batchwire__V1__InfoResponse *)*resp)->auth_enabled = bw__auth_enabled(c->auth);
    return rc;
}

static int on_register(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                       ProtobufCMessage **resp)
{
    bw_coordinator *c = user;
    const Batchwire__V1__RegisterWorkerRequest *r = (const void *)req;
    char err[1024];
    int rc = bw__membership_register(c->members, bw__rpc_call_principal(call), r,
                                     bw__rpc_call_peer(call), err, sizeof(err));
    if (rc != BW_OK)
        return bw__rpc_fail(call, rc, "RegisterWorker: %s", err);
    Batchwire__V1__RegisterWorkerResponse *out =
        bw__arena_alloc(bw__rpc_call_arena(call), sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__register_worker_response__init(out);
    out->heartbeat_interval_ms = bw__membership_heartbeat_ms(c->members);
    out->missed_heartbeats_dead = bw__membership_dead_after(c->members);
    *resp = &out->base;
    return BW_OK;
}

static int on_heartbeat(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                        ProtobufCMessage **resp)
{
    bw_coordinator *c = user;
    const Batchwire__V1__HeartbeatRequest *r = (const void *)req;
    char err[1024];
    bool known = false;
    int rc = bw__membership_heartbeat(c->members, bw__rpc_call_principal(call), r->id,
                                      r->incarnation, &known, err, sizeof(err));
    if (rc != BW_OK)
        return bw__rpc_fail(call, rc, "Heartbeat: %s", err);
    if (known)
        bw__membership_served(c->members, r->id, r->incarnation, r->served_samples,
                              r->served_bytes);
    Batchwire__V1__HeartbeatResponse *out = bw__arena_alloc(bw__rpc_call_arena(call), sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__heartbeat_response__init(out);
    out->known = known;
    out->heartbeat_interval_ms = bw__membership_heartbeat_ms(c->members);
    out->placement_version = bw__membership_version(c->members);
    /* Leases that ended while their grants are unexpired: the worker refuses those grants
     * (docs/security.md, "Read grants"). */
    if (c->grants && bw__grant_revoked(c->grants, bw__unix_ms(), bw__rpc_call_arena(call),
                                       &out->revoked, &out->n_revoked) != BW_OK)
        return BW_NOMEM;
    *resp = &out->base;
    return BW_OK;
}

static int on_list_workers(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                           ProtobufCMessage **resp)
{
    (void)req;
    bw_coordinator *c = user;
    Batchwire__V1__ListWorkersResponse *out =
        bw__arena_alloc(bw__rpc_call_arena(call), sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__list_workers_response__init(out);
    int rc = bw__membership_list(c->members, bw__rpc_call_arena(call), out);
    if (rc != BW_OK)
        return rc;
    *resp = &out->base;
    return BW_OK;
}

const bw_rpc_handler bw__coordinator_handlers[] = {
    {BW_METHOD(BW_M_HEALTH_CHECK), bw__rpc_health_check},
    {BW_METHOD(BW_M_COORDINATOR_INFO), on_info},
    {BW_METHOD(BW_M_REGISTER_WORKER), on_register},
    {BW_METHOD(BW_M_HEARTBEAT), on_heartbeat},
    {BW_METHOD(BW_M_LIST_WORKERS), on_list_workers},
    {BW_METHOD(BW_M_PLACEMENT_GET), bw__placement_get},
    {BW_METHOD(BW_M_JOBS_GET_OR_CREATE), bw__jobs_on_get_or_create},
    {BW_METHOD(BW_M_JOBS_JOIN), bw__jobs_on_join},
    {BW_METHOD(BW_M_JOBS_LEASE_HEARTBEAT), bw__jobs_on_lease_heartbeat},
    {BW_METHOD(BW_M_JOBS_COMMIT_CURSOR), bw__jobs_on_commit},
    {BW_METHOD(BW_M_JOBS_GET), bw__jobs_on_get},
    {BW_METHOD(BW_M_JOBS_LIST), bw__jobs_on_list},
    {BW_METHOD(BW_M_JOBS_RESUME_ELASTIC), bw__jobs_on_resume},
    {BW_METHOD(BW_M_JOBS_LEAVE), bw__jobs_on_leave},
    {BW_METHOD(BW_M_JOBS_DELETE), bw__jobs_on_delete},
    {BW_METHOD(BW_M_JOBS_SESSION), bw__jobs_on_session},
};
const size_t bw__coordinator_nhandlers =
    sizeof(bw__coordinator_handlers) / sizeof(bw__coordinator_handlers[0]);
