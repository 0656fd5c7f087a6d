/* Placement.Get: the versioned table of live workers from membership, and, when the caller
 * names a shard count, the owner of every shard by rendezvous hashing (core/placement). The
 * table is computed per call from a consistent snapshot: there is nothing to keep in step. */
#include <string.h>

#include "coordinator.h"
#include "placement/placement.h"
#include "placement_service.h"

enum { MAX_SHARDS = 1 << 20 };

int bw__placement_get(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                      ProtobufCMessage **resp)
{
    bw_coordinator *c = user;
    const Batchwire__V1__PlacementRequest *r = (const void *)req;
    if (r->num_shards > MAX_SHARDS)
        return bw__rpc_fail(call, BW_INVALID_ARGUMENT,
                            "Placement.Get: num_shards %u is more than the limit of %d",
                            r->num_shards, MAX_SHARDS);
    bw_arena *a = bw__rpc_call_arena(call);
    Batchwire__V1__PlacementTable *t = bw__arena_alloc(a, sizeof(*t));
    if (!t)
        return BW_NOMEM;
    batchwire__v1__placement_table__init(t);
    char **ids = NULL, **addrs = NULL, **daddrs = NULL;
    size_t n = 0;
    int rc = bw__membership_live(c->members, a, &t->version, &ids, &addrs, &daddrs, &n);
    if (rc != BW_OK)
        return bw__rpc_fail(call, rc, "Placement.Get: cannot snapshot the workers");
    Batchwire__V1__PlacementWorker *pw = bw__arena_alloc(a, (n + 1) * sizeof(*pw));
    Batchwire__V1__PlacementWorker **pp = bw__arena_alloc(a, (n + 1) * sizeof(*pp));
    if (!pw || !pp)
        return BW_NOMEM;
    for (size_t i = 0; i < n; i++) {
        batchwire__v1__placement_worker__init(&pw[i]);
        pw[i].id = ids[i];
        pw[i].address = addrs[i];
        pw[i].data_address = daddrs[i];
        pp[i] = &pw[i];
    }
    t->n_workers = n;
    t->workers = pp;
    if (r->num_shards > 0 && n > 0) {
        uint32_t *owners = bw__arena_alloc(a, r->num_shards * sizeof(*owners));
        if (!owners)
            return BW_NOMEM;
        for (uint32_t s = 0; s < r->num_shards; s++)
            owners[s] = (uint32_t)bw__placement_owner((const char *const *)ids, n, s);
        t->num_shards = r->num_shards;
        t->n_owners = r->num_shards;
        t->owners = owners;
    }
    *resp = &t->base;
    return BW_OK;
}
