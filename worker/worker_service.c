/* The worker's RPC handlers. */
#include "rpc/common_handlers.h"
#include "worker.h"

static int on_info(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                   ProtobufCMessage **resp)
{
    (void)req;
    bw_worker *w = user;
    int rc =
        bw__rpc_info(call, BATCHWIRE__V1__ROLE__ROLE_WORKER, w->id, w->bound, w->start_ms, resp);
    if (rc == BW_OK)
        ((Batchwire__V1__InfoResponse *)*resp)->auth_enabled = bw__auth_enabled(w->auth);
    return rc;
}

const bw_rpc_handler bw__worker_handlers[] = {
    {BW_METHOD(BW_M_HEALTH_CHECK), bw__rpc_health_check},
    {BW_METHOD(BW_M_WORKER_INFO), on_info},
    {BW_METHOD(BW_M_DATA_DESCRIBE), bw__data_describe},
    {BW_METHOD(BW_M_DATA_READ_SAMPLES), bw__data_read_samples},
    {BW_METHOD(BW_M_DATA_READ_STREAM), bw__data_read_stream},
    {BW_METHOD(BW_M_DATA_STATS), bw__data_get_stats},
};
const size_t bw__worker_nhandlers = sizeof(bw__worker_handlers) / sizeof(bw__worker_handlers[0]);
