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

static void clear(bw__pview *v)
{
    for (size_t i = 0; i < v->n; i++)
        free(v->ids[i]);
    free(v->ids);
    v->ids = NULL;
    v->n = 0;
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
    /* memo: 0 unknown, 1 mine, 2 another's */
    uint8_t *memo = calloc(rt->num_shards, 1);
    if (!memo) {
        pthread_mutex_unlock(&v->mu);
        snprintf(err, errlen, "out of memory for the owners of %u shards", rt->num_shards);
        return BW_NOMEM;
    }
    for (size_t i = 0; i < n && rc == BW_OK; i++) {
        uint32_t s = shards[i];
        if (!memo[s]) {
            size_t o = bw__placement_owner((const char *const *)v->ids, v->n, s);
            memo[s] = strcmp(v->ids[o], self) == 0 ? 1 : 2;
            if (memo[s] == 2) {
                snprintf(err, errlen,
                         "shard %u of %u is owned by worker %s, not %s, under placement version "
                         "%llu (the request was routed with version %llu): refresh placement",
                         s, rt->num_shards, v->ids[o], self, (unsigned long long)v->version,
                         (unsigned long long)rt->placement_version);
                rc = BW_WRONG_OWNER;
            }
        }
    }
    free(memo);
    pthread_mutex_unlock(&v->mu);
    return rc;
}
