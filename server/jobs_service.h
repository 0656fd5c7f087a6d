/* The coordinator's Jobs service (jobs_service.c): handlers for coordinator_service.c's
 * table; `user` is the bw_coordinator. */
#ifndef BW_SERVER_JOBS_SERVICE_H
#define BW_SERVER_JOBS_SERVICE_H

#include "coordinator.h"
#include "jobs.h"
#include "rpc/server.h"

#define BW__JOBS_HANDLER(name)                                                                     \
    int name(void *user, bw_rpc_call *call, const ProtobufCMessage *req, ProtobufCMessage **resp)
BW__JOBS_HANDLER(bw__jobs_on_get_or_create);
BW__JOBS_HANDLER(bw__jobs_on_join);
BW__JOBS_HANDLER(bw__jobs_on_lease_heartbeat);
BW__JOBS_HANDLER(bw__jobs_on_commit);
BW__JOBS_HANDLER(bw__jobs_on_get);
BW__JOBS_HANDLER(bw__jobs_on_list);
BW__JOBS_HANDLER(bw__jobs_on_resume);
BW__JOBS_HANDLER(bw__jobs_on_leave);
BW__JOBS_HANDLER(bw__jobs_on_delete);

/*
 * Asks a live worker (any; the next one if it cannot answer) to describe `dataset`
 * (Data.Describe). Blocks up to a few seconds per worker: never call it on a completion-queue
 * thread. *info lives in `arena`. Returns BW_OK, BW_UNAVAILABLE when no worker could answer,
 * or the worker's verdict on the dataset, with a sentence in err.
 */
int bw__describe_dataset(bw_coordinator *c, const Batchwire__V1__Dataset *dataset, bw_arena *arena,
                         Batchwire__V1__DatasetInfo **info, char *err, size_t errlen);

/* Waits for job creations that are still describing their dataset (before shutdown). */
void bw__jobs_service_drain(void);

/* A bw_jobs_placement_fn over the coordinator's membership (`user` is the bw_coordinator). */
int bw__jobs_placement_table(void *user, bw_arena *arena, uint64_t *version,
                             Batchwire__V1__PlacementTable **out);

#endif
