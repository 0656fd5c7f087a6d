/* Handlers every daemon serves the same way (common_handlers.h): health checks and Info. */
#include "rpc/common_handlers.h"

#include <string.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/util.h"
#include "common/version.h"

int bw__rpc_health_check(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                         ProtobufCMessage **resp)
{
    (void)user;
    const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
    static const char *const services[] = {"", "batchwire.v1.Coordinator", "batchwire.v1.Worker",
                                           "grpc.health.v1.Health"};
    int found = 0;
    for (size_t i = 0; i < sizeof(services) / sizeof(services[0]); i++)
        if (strcmp(r->service, services[i]) == 0)
            found = 1;
    if (!found)
        return bw__rpc_fail(call, BW_NOT_FOUND, "unknown service '%.200s'", r->service);
    Grpc__Health__V1__HealthCheckResponse *out =
        bw__arena_alloc(bw__rpc_call_arena(call), sizeof(*out));
    if (!out)
        return BW_NOMEM;
    grpc__health__v1__health_check_response__init(out);
    out->status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    *resp = &out->base;
    return BW_OK;
}

int bw__rpc_info(bw_rpc_call *call, Batchwire__V1__Role role, const char *id,
                 const char *listen_address, uint64_t start_mono_ms, ProtobufCMessage **resp)
{
    bw_arena *a = bw__rpc_call_arena(call);
    Batchwire__V1__InfoResponse *out = bw__arena_alloc(a, sizeof(*out));
    char host[256];
    bw__hostname(host, sizeof(host));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__info_response__init(out);
    out->role = role;
    out->version = (char *)bw_version();
    out->commit = (char *)bw__build_commit();
    out->build_type = (char *)bw__build_type();
    out->features = (char **)bw__build_features(&out->n_features);
    out->id = bw__arena_strdup(a, id ? id : "");
    out->listen_address = bw__arena_strdup(a, listen_address);
    out->hostname = bw__arena_strdup(a, host);
    out->uptime_ms = bw__mono_ms() - start_mono_ms;
    out->pid = (uint32_t)getpid();
    if (!out->id || !out->listen_address || !out->hostname)
        return BW_NOMEM;
    *resp = &out->base;
    return BW_OK;
}
