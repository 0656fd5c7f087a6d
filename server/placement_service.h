/* The coordinator's Placement service (placement_service.c). */
#ifndef BW_SERVER_PLACEMENT_SERVICE_H
#define BW_SERVER_PLACEMENT_SERVICE_H

#include "rpc/server.h"

/* Placement.Get; `user` is the bw_coordinator. */
int bw__placement_get(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                      ProtobufCMessage **resp);

#endif
