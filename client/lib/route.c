/* Routing as a pure function of placement and suspects (route.h), and the placement table's
 * release (the session builds tables, fetches route with them and record the suspects). */
#include <stdlib.h>
#include <string.h>

#include "placement/placement.h"
#include "route.h"

void bw__placement_put(bw__placement *p)
{
    if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
        return;
    for (size_t i = 0; i < p->nworkers; i++) {
        free(p->workers[i].id);
        free(p->workers[i].address);
        free(p->workers[i].data_address);
    }
    free(p->workers);
    free(p->owners);
    free(p);
}

bool bw__suspects_has(const bw__suspects *s, const char *id)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->ids[i], id) == 0)
            return true;
    return false;
}

/* The worker serving `shard` (route.h); -1 when every worker is a suspect. ids and map hold
 * p->nworkers entries of scratch. */
static long pick(const bw__placement *p, uint32_t shard, const bw__suspects *s, bool *checked,
                 const char **ids, size_t *map)
{
    size_t owner = p->owners[shard];
    if (!bw__suspects_has(s, p->workers[owner].id)) {
        *checked = true;
        return (long)owner;
    }
    *checked = false;
    size_t m = 0;
    for (size_t i = 0; i < p->nworkers; i++)
        if (!bw__suspects_has(s, p->workers[i].id)) {
            ids[m] = p->workers[i].id;
            map[m++] = i;
        }
    return m ? (long)map[bw__placement_owner(ids, m, shard)] : -1;
}

int bw__route_items(const bw__placement *p, const uint32_t *shards, size_t n, const bw__suspects *s,
                    size_t *route)
{
    const char **ids = malloc((p->nworkers ? p->nworkers : 1) * sizeof(*ids));
    size_t *map = malloc((p->nworkers ? p->nworkers : 1) * sizeof(*map));
    int rc = ids && map ? BW_OK : BW_NOMEM;
    for (size_t u = 0; u < n && rc == BW_OK; u++) {
        bool checked;
        long wk = pick(p, shards[u], s, &checked, ids, map);
        if (wk < 0)
            rc = BW_UNAVAILABLE;
        else
            route[u] = (size_t)wk * 2 + (checked ? 0 : 1);
    }
    free(ids);
    free(map);
    return rc;
}
