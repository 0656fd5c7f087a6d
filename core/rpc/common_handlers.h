/* Handlers every daemon serves the same way. */
#ifndef BW_RPC_COMMON_HANDLERS_H
#define BW_RPC_COMMON_HANDLERS_H

#include <stdint.h>

#include "rpc/server.h"

/* grpc.health.v1.Health/Check: SERVING for "" and the daemon's own services, NOT_FOUND
 * (as the protocol says) for other service names. `user` is ignored. */
int bw__rpc_health_check(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                         ProtobufCMessage **resp);

/* Fills an InfoResponse in the call's arena. */
int bw__rpc_info(bw_rpc_call *call, Batchwire__V1__Role role, const char *id,
                 const char *listen_address, uint64_t start_mono_ms, ProtobufCMessage **resp);

#endif
