/* The worker's copy of the coordinator's placement table, and the ownership check of each
 * request. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "placement/placement.h"

void bw__pview_init(bw__pview *v)
{
    memset(v, 0, sizeof(*v));
    pthread_mutex_init(&v->mu, NULL);
}

static void forget_owners(bw__pview *v)
{
    free(v->owners);
    free(v->owners_self);
    v->owners = NULL;
    v->owners_self = NULL;
    v->owners_shards = 0;
}

static void clear(bw__pview *v)
{
    for (size_t i = 0; i < v->n; i++)
        free(v->ids[i]);
    free(v->ids);
    v->ids = NULL;
    v->n = 0;
    forget_owners(v);
}

void bw__pview_destroy(bw__pview *v)
{
    clear(v);
    pthread_mutex_destroy(&v->mu);
}

int bw__pview_set(bw__pview *v, uint64_t version, const char *const *ids, size_t n)
{
    char **copy = calloc(n ? n : 1, sizeof(char *));
    for (size_t i = 0; copy && i < n; i++)
        if (!(copy[i] = strdup(ids[i]))) {
            while (i > 0)
                free(copy[--i]);
            free(copy);
            copy = NULL;
        }
    if (!copy)
        return BW_NOMEM;
    pthread_mutex_lock(&v->mu);
    clear(v);
    v->ids = copy;
    v->n = n;
    v->version = version;
    v->stale = false;
    pthread_mutex_unlock(&v->mu);
    return BW_OK;
}

int bw__pview_check(bw__pview *v, const char *self, const Batchwire__V1__Routing *rt,
                    const uint32_t *shards, size_t n, char *err, size_t errlen)
{
    if (!rt || rt->placement_version == 0)
        return BW_OK;
    if (rt->num_shards == 0 || rt->num_shards > BW_DATA_MAX_SHARDS) {
        snprintf(err, errlen, "routing.num_shards must be 1 to %d (got %u)", BW_DATA_MAX_SHARDS,
                 rt->num_shards);
        return BW_INVALID_ARGUMENT;
    }
    int rc = BW_OK;
    pthread_mutex_lock(&v->mu);
    if (v->version == 0 || rt->placement_version > v->version || v->n == 0) {
        v->stale = rt->placement_version > v->version;
        pthread_mutex_unlock(&v->mu);
        return BW_OK;
    }
    /* Under v->mu: the owners found so far for this table, this many shards and this worker. */
    if (v->owners_shards != rt->num_shards || !v->owners_self ||
        strcmp(v->owners_self, self) != 0) {
        forget_owners(v);
        v->owners = calloc(rt->num_shards, 1);
        v->owners_self = strdup(self);
        if (!v->owners || !v->owners_self) {
            forget_owners(v);
            pthread_mutex_unlock(&v->mu);
            snprintf(err, errlen, "out of memory for the owners of %u shards", rt->num_shards);
            return BW_NOMEM;
        }
        v->owners_shards = rt->num_shards;
    }
    uint8_t *owners = v->owners;
    for (size_t i = 0; i < n && rc == BW_OK; i++) {
        uint32_t s = shards[i];
        if (owners[s] == 1)
            continue;
        size_t o = bw__placement_owner((const char *const *)v->ids, v->n, s);
        owners[s] = strcmp(v->ids[o], self) == 0 ? 1 : 2;
        if (owners[s] == 2) {
            snprintf(err, errlen,
                     "shard %u of %u is owned by worker %s, not %s, under placement version "
                     "%llu (the request was routed with version %llu): refresh placement",
                     s, rt->num_shards, v->ids[o], self, (unsigned long long)v->version,
                     (unsigned long long)rt->placement_version);
            rc = BW_WRONG_OWNER;
        }
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}
