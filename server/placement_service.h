/* The coordinator's Placement service (placement_service.c). */
#ifndef BW_SERVER_PLACEMENT_SERVICE_H
#define BW_SERVER_PLACEMENT_SERVICE_H

#include "coordinator.h"
#include "rpc/server.h"

/* The owners of each shard kept for the latest (placement version, shard count). */
bw_owner_cache *bw__owner_cache_new(void);
void bw__owner_cache_free(bw_owner_cache *c);

/* The placement table of the live workers into `a`: their ids and addresses, sorted by id,
 * the version, and with num_shards > 0 (and a live worker) the owner of every shard, taken
 * from c->owners when it holds them for this version (NULL: computed every time). */
int bw__placement_table(bw_coordinator *c, bw_arena *a, uint32_t num_shards,
                        Batchwire__V1__PlacementTable **out);

/* Placement.Get; `user` is the bw_coordinator. */
int bw__placement_get(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                      ProtobufCMessage **resp);

#endif
