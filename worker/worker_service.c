/* The worker's RPC handlers. */
#include "rpc/common_handlers.h"
#include "worker.h"

static int on_info(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                   ProtobufCMessage **resp)
{
    (void)req;
    bw_worker *w = user;
    return bw__rpc_info(call, BATCHWIRE__V1__ROLE__ROLE_WORKER, w->id, w->bound, w->start_ms, resp);
}

const bw_rpc_handler bw__worker_handlers[] = {
    {BW_METHOD(BW_M_HEALTH_CHECK), bw__rpc_health_check},
    {BW_METHOD(BW_M_WORKER_INFO), on_info},
};
const size_t bw__worker_nhandlers = sizeof(bw__worker_handlers) / sizeof(bw__worker_handlers[0]);
