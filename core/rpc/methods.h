/* Every RPC of the protocol, once: path, request and response types. Servers register and
 * clients call methods by their id here, so no path string is spelled twice. */
#ifndef BW_RPC_METHODS_H
#define BW_RPC_METHODS_H

#include <stdbool.h>
#include <protobuf-c/protobuf-c.h>

#include "batchwire.pb-c.h"
#include "data.pb-c.h"
#include "health.pb-c.h"
#include "jobs.pb-c.h"

typedef enum bw_method_id {
    BW_M_HEALTH_CHECK,
    BW_M_COORDINATOR_INFO,
    BW_M_REGISTER_WORKER,
    BW_M_HEARTBEAT,
    BW_M_LIST_WORKERS,
    BW_M_WORKER_INFO,
    BW_M_DATA_DESCRIBE,
    BW_M_DATA_READ_SAMPLES,
    BW_M_DATA_READ_STREAM,
    BW_M_PLACEMENT_GET,
    BW_M_JOBS_GET_OR_CREATE,
    BW_M_JOBS_JOIN,
    BW_M_JOBS_LEASE_HEARTBEAT,
    BW_M_JOBS_COMMIT_CURSOR,
    BW_M_JOBS_GET,
    BW_M_JOBS_LIST,
    BW_M_JOBS_RESUME_ELASTIC,
    BW_M_JOBS_LEAVE,
    BW_M_DATA_STATS,
    BW_M_JOBS_DELETE,
    BW_M_JOBS_SESSION, /* bidirectional stream (bw__method_bidi) */
    BW_M__COUNT
} bw_method_id;

typedef struct bw_rpc_method {
    const char *path; /* "/batchwire.v1.Coordinator/Heartbeat" */
    const char *name; /* "Heartbeat", for messages */
    const ProtobufCMessageDescriptor *request;
    const ProtobufCMessageDescriptor *response;
} bw_rpc_method;

extern const bw_rpc_method bw__methods[BW_M__COUNT];

/* Whether `m` is a bidirectional stream (its requests arrive one message at a time on an open
 * call: core/rpc/server.h, "Bidirectional streams"). Methods outside bw__methods are not. */
bool bw__method_bidi(const bw_rpc_method *m);

/* The method with id `id`. */
#define BW_METHOD(id) (&bw__methods[id])

#endif
