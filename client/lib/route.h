/*
 * Routing: which worker serves which samples, as a pure function of a placement table and
 * the workers that failed during the current fetch (docs/architecture.md, "The client").
 * No I/O, no locks, no clock: the fetch loop (fetch.c) asks, the transports move bytes.
 */
#ifndef BW_CLIENT_ROUTE_H
#define BW_CLIENT_ROUTE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc/client.h"

typedef struct bw__worker_ref {
    char *id;
    char *address;
    char *data_address; /* the worker's data channel; "" when it offers none */
} bw__worker_ref;

/* One placement table, immutable once published; readers take a reference. */
typedef struct bw__placement {
    atomic_int refs;
    uint64_t version;
    size_t nworkers;
    bw__worker_ref *workers; /* sorted by id */
    uint32_t num_shards;
    uint32_t *owners; /* owners[shard] = index into workers */
} bw__placement;

/* Drops a reference; the last one frees the table. NULL is a no-op. */
void bw__placement_put(bw__placement *p);

/* Workers that failed during one fetch: routed around for the rest of it. The fetch loop
 * (fetch.c) records them; routing only reads them. */
enum { BW_MAX_SUSPECTS = 64 };
typedef struct bw__suspects {
    char *ids[BW_MAX_SUSPECTS];
    size_t n;
} bw__suspects;

bool bw__suspects_has(const bw__suspects *s, const char *id);

/* Routes n items with storage shards shards[0..n) to the shard's owner, or -- when the owner
 * is a suspect -- to the owner among the others, which is where rendezvous hashing moves the
 * shard once the coordinator drops the failed worker. route[u] = 2w for worker w as placed
 * (the request carries the placement's version, so the worker can refuse it when placement
 * moved on), 2w+1 for items routed around a suspect owner (no ownership check).
 * BW_OK, BW_UNAVAILABLE when some shard has no worker left (route[] then incomplete), or
 * BW_NOMEM. */
int bw__route_items(const bw__placement *p, const uint32_t *shards, size_t n, const bw__suspects *s,
                    size_t *route);

#endif
