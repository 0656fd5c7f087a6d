/* The one error list (include/batchwire/batchwire.h) turned into names, messages and
 * gRPC status codes. */
#include "common/errors.h"

const char *bw_strerror(int rc)
{
    switch (rc) {
#define BW__ERR_MSG(name, num, grpc, msg)                                                          \
    case num:                                                                                      \
        return msg;
        BW_ERR_MAP(BW__ERR_MSG)
#undef BW__ERR_MSG
    }
    return "unknown error";
}

const char *bw_err_name(int rc)
{
    switch (rc) {
#define BW__ERR_NAME(name, num, grpc, msg)                                                         \
    case num:                                                                                      \
        return "BW_" #name;
        BW_ERR_MAP(BW__ERR_NAME)
#undef BW__ERR_NAME
    }
    return "BW_UNKNOWN_ERROR";
}

grpc_status_code bw__err_to_grpc(int rc)
{
    switch (rc) {
#define BW__ERR_GRPC(name, num, grpc, msg)                                                         \
    case num:                                                                                      \
        return GRPC_STATUS_##grpc;
        BW_ERR_MAP(BW__ERR_GRPC)
#undef BW__ERR_GRPC
    }
    return GRPC_STATUS_UNKNOWN;
}

int bw__err_from_grpc(grpc_status_code status)
{
    /* Several codes share a gRPC status; the reverse picks the most general one. The exact
     * code travels in the "bw-error" trailing metadata when the peer is batchwire. */
    switch (status) {
    case GRPC_STATUS_OK:
        return BW_OK;
    case GRPC_STATUS_CANCELLED:
        return BW_CANCELLED;
    case GRPC_STATUS_INVALID_ARGUMENT:
        return BW_INVALID_ARGUMENT;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return BW_TIMEOUT;
    case GRPC_STATUS_NOT_FOUND:
        return BW_NOT_FOUND;
    case GRPC_STATUS_ALREADY_EXISTS:
        return BW_ALREADY_EXISTS;
    case GRPC_STATUS_PERMISSION_DENIED:
        return BW_PERMISSION_DENIED;
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        return BW_TOO_BIG;
    case GRPC_STATUS_FAILED_PRECONDITION:
        return BW_FAILED_PRECONDITION;
    case GRPC_STATUS_ABORTED:
        return BW_ABORTED;
    case GRPC_STATUS_OUT_OF_RANGE:
        return BW_OUT_OF_RANGE;
    case GRPC_STATUS_UNIMPLEMENTED:
        return BW_UNIMPLEMENTED;
    case GRPC_STATUS_UNAVAILABLE:
        return BW_UNAVAILABLE;
    case GRPC_STATUS_DATA_LOSS:
        return BW_CORRUPT;
    case GRPC_STATUS_UNAUTHENTICATED:
        return BW_UNAUTHENTICATED;
    case GRPC_STATUS_INTERNAL:
    case GRPC_STATUS_UNKNOWN:
    default:
        return BW_INTERNAL;
    }
}

int bw__err_from_name(const char *name)
{
#define BW__ERR_BYNAME(ename, num, grpc, msg)                                                      \
    if (strcmp(name, "BW_" #ename) == 0)                                                           \
        return num;
    BW_ERR_MAP(BW__ERR_BYNAME)
#undef BW__ERR_BYNAME
    return 1; /* not a code: positive on purpose */
}

const char *bw__grpc_status_name(grpc_status_code status)
{
    static const char *const names[] = {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if ((unsigned)status < sizeof(names) / sizeof(names[0]))
        return names[status];
    return "UNKNOWN_STATUS";
}
