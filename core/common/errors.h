/* Internal side of the error list: mapping to and from gRPC status codes. */
#ifndef BW_COMMON_ERRORS_H
#define BW_COMMON_ERRORS_H

#include <string.h>
#include <grpc/status.h>

#include "batchwire/batchwire.h"

/* The gRPC status a batchwire error code is sent as. Unknown numbers give UNKNOWN. */
grpc_status_code bw__err_to_grpc(int rc);

/* The most general batchwire code for a gRPC status received from a peer. */
int bw__err_from_grpc(grpc_status_code status);

/* The code named by `name` ("BW_NOT_FOUND"), or 1 when the name is not in the list. */
int bw__err_from_name(const char *name);

/* "DEADLINE_EXCEEDED" etc.; a static string. */
const char *bw__grpc_status_name(grpc_status_code status);

#endif
