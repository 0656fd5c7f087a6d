/* Placement.Get: the versioned table of live workers from membership, and, when the caller
 * names a shard count, the owner of every shard by rendezvous hashing (core/placement). The
 * table is built from a consistent snapshot of the workers; the owners, which cost a score per
 * worker and shard, are computed once per (placement version, shard count) and kept
 * (docs/performance.md, "Coordinator at scale"): after a worker dies every rank asks again,
 * and all of them get the same answer. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "placement/placement.h"
#include "placement_service.h"

enum { MAX_SHARDS = 1 << 20 };

struct bw_owner_cache {
    pthread_mutex_t mu;
    uint64_t version; /* the placement version the owners are for */
    size_t workers;   /* live workers then */
    uint32_t shards;  /* 0: nothing kept */
    uint32_t *owners;
};

bw_owner_cache *bw__owner_cache_new(void)
{
    bw_owner_cache *c = calloc(1, sizeof(*c));
    if (c)
        pthread_mutex_init(&c->mu, NULL);
    return c;
}

void bw__owner_cache_free(bw_owner_cache *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->mu);
    free(c->owners);
    free(c);
}

/* Copies the kept owners of (version, n, shards) into `out`: 1 if they were there. */
static int cache_get(bw_owner_cache *c, uint64_t version, size_t n, uint32_t shards, uint32_t *out)
{
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    if (c->shards == shards && c->version == version && c->workers == n) {
        memcpy(out, c->owners, shards * sizeof(*out));
        hit = 1;
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

/* Keeps a copy of `owners` (best effort: without memory nothing is kept). */
static void cache_put(bw_owner_cache *c, uint64_t version, size_t n, uint32_t shards,
                      const uint32_t *owners)
{
    uint32_t *copy = malloc(shards * sizeof(*copy));
    if (!copy)
        return;
    memcpy(copy, owners, shards * sizeof(*copy));
    pthread_mutex_lock(&c->mu);
    free(c->owners);
    c->owners = copy;
    c->version = version;
    c->workers = n;
    c->shards = shards;
    pthread_mutex_unlock(&c->mu);
}

int bw__placement_table(bw_coordinator *c, bw_arena *a, uint32_t num_shards,
                        Batchwire__V1__PlacementTable **out)
{
    *out = NULL;
    Batchwire__V1__PlacementTable *t = bw__arena_alloc(a, sizeof(*t));
    if (!t)
        return BW_NOMEM;
    batchwire__v1__placement_table__init(t);
    char **ids = NULL, **addrs = NULL, **daddrs = NULL;
    size_t n = 0;
    int rc = bw__membership_live(c->members, a, &t->version, &ids, &addrs, &daddrs, &n);
    if (rc != BW_OK)
        return rc;
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
    if (num_shards > 0 && n > 0) {
        uint32_t *owners = bw__arena_alloc(a, num_shards * sizeof(*owners));
        if (!owners)
            return BW_NOMEM;
        if (!c->owners || !cache_get(c->owners, t->version, n, num_shards, owners)) {
            for (uint32_t s = 0; s < num_shards; s++)
                owners[s] = (uint32_t)bw__placement_owner((const char *const *)ids, n, s);
            if (c->owners)
                cache_put(c->owners, t->version, n, num_shards, owners);
        }
        t->num_shards = num_shards;
        t->n_owners = num_shards;
        t->owners = owners;
    }
    *out = t;
    return BW_OK;
}

int bw__placement_get(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                      ProtobufCMessage **resp)
{
    const Batchwire__V1__PlacementRequest *r = (const void *)req;
    if (r->num_shards > MAX_SHARDS)
        return bw__rpc_fail(call, BW_INVALID_ARGUMENT,
                            "Placement.Get: num_shards %u is more than the limit of %d",
                            r->num_shards, MAX_SHARDS);
    Batchwire__V1__PlacementTable *t = NULL;
    int rc = bw__placement_table(user, bw__rpc_call_arena(call), r->num_shards, &t);
    if (rc == BW_NOMEM)
        return rc;
    if (rc != BW_OK)
        return bw__rpc_fail(call, rc, "Placement.Get: cannot snapshot the workers");
    *resp = &t->base;
    return BW_OK;
}
