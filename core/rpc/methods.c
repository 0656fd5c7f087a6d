#include "rpc/methods.h"

const bw_rpc_method bw__methods[BW_M__COUNT] = {
    [BW_M_HEALTH_CHECK] = {"/grpc.health.v1.Health/Check", "Health.Check",
                           &grpc__health__v1__health_check_request__descriptor,
                           &grpc__health__v1__health_check_response__descriptor},
    [BW_M_COORDINATOR_INFO] = {"/batchwire.v1.Coordinator/Info", "Coordinator.Info",
                               &batchwire__v1__info_request__descriptor,
                               &batchwire__v1__info_response__descriptor},
    [BW_M_REGISTER_WORKER] = {"/batchwire.v1.Coordinator/RegisterWorker", "RegisterWorker",
                              &batchwire__v1__register_worker_request__descriptor,
                              &batchwire__v1__register_worker_response__descriptor},
    [BW_M_HEARTBEAT] = {"/batchwire.v1.Coordinator/Heartbeat", "Heartbeat",
                        &batchwire__v1__heartbeat_request__descriptor,
                        &batchwire__v1__heartbeat_response__descriptor},
    [BW_M_LIST_WORKERS] = {"/batchwire.v1.Coordinator/ListWorkers", "ListWorkers",
                           &batchwire__v1__list_workers_request__descriptor,
                           &batchwire__v1__list_workers_response__descriptor},
    [BW_M_WORKER_INFO] = {"/batchwire.v1.Worker/Info", "Worker.Info",
                          &batchwire__v1__info_request__descriptor,
                          &batchwire__v1__info_response__descriptor},
};
