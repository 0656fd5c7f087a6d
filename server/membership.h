/* The coordinator's table of storage workers: registration, heartbeats and liveness.
 * A worker is dead once it has missed `dead_after` heartbeats in a row, and alive again as
 * soon as it heartbeats or registers; one dead for `forget_ms` more leaves the table. Which
 * principal may register which id, and how many ids the table holds: docs/security.md,
 * "Worker ids". Thread-safe. */
#ifndef BW_SERVER_MEMBERSHIP_H
#define BW_SERVER_MEMBERSHIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth/auth.h"
#include "common/arena.h"
#include "batchwire.pb-c.h"

typedef struct bw_membership bw_membership;

typedef struct bw_membership_opts {
    uint32_t heartbeat_ms, dead_after;
    uint64_t forget_ms;         /* a worker dead this long is removed from the table */
    uint32_t max_workers;       /* ids in the table, live or dead (--max-workers) */
    uint32_t max_per_principal; /* ids of one worker principal (--max-workers-per-principal) */
    bw_auth *auth;              /* the ids= bindings (borrowed; NULL: none, an open service) */
} bw_membership_opts;

/* NULL when memory ran out. */
bw_membership *bw__membership_new(const bw_membership_opts *opts);
void bw__membership_free(bw_membership *m);

uint32_t bw__membership_heartbeat_ms(const bw_membership *m);
uint32_t bw__membership_dead_after(const bw_membership *m);

/* Adds or updates a worker. `who` must be allowed the id (bw__auth_worker_id: its ids=
 * binding), else BW_PERMISSION_DENIED; a new id must fit under max_per_principal (worker
 * principals only) and max_workers, else BW_RESOURCE_EXHAUSTED naming the flag. A new
 * incarnation of a known id replaces the old process when
 * that one is dead, registers at the same address (restarted in place) or req->takeover is
 * set; a live holder elsewhere keeps its id: BW_ALREADY_EXISTS while it heartbeats,
 * BW_UNAVAILABLE (retry) once it has gone quiet but is not yet dead. An id is bound to the
 * principal `who` that registered it first: another principal (not admin) is refused with
 * BW_PERMISSION_DENIED, here and in heartbeats, and the worker keeps serving. Also
 * BW_INVALID_ARGUMENT or BW_NOMEM; every error comes with a sentence in err, and then nothing
 * changed. */
int bw__membership_register(bw_membership *m, const bw_principal *who,
                            const Batchwire__V1__RegisterWorkerRequest *req, const char *peer,
                            char *err, size_t errlen);

/* Records a heartbeat; `who` must still be allowed the id (its binding, its owner: else
 * BW_PERMISSION_DENIED). *known is false when the id or incarnation is unknown (the worker must
 * register again). Returns BW_ALREADY_EXISTS with a sentence when another process has taken
 * over the id. */
int bw__membership_heartbeat(bw_membership *m, const bw_principal *who, const char *id,
                             uint64_t incarnation, bool *known, char *err, size_t errlen);

/* Records what worker `id` (this incarnation) has served so far, from its heartbeat: the
 * totals and rates ListWorkers reports. */
void bw__membership_served(bw_membership *m, const char *id, uint64_t incarnation, uint64_t samples,
                           uint64_t bytes);

/* How many workers are alive and dead now. */
void bw__membership_counts(bw_membership *m, size_t *alive, size_t *dead);

/* Marks workers dead whose heartbeats are overdue, removes those dead for forget_ms, and logs
 * every transition; returns how many were marked dead. Called periodically. */
int bw__membership_sweep(bw_membership *m);

/* Fills resp->workers (sorted by id) with a snapshot, allocated in `arena`. */
int bw__membership_list(bw_membership *m, bw_arena *arena,
                        Batchwire__V1__ListWorkersResponse *resp);

/* The placement version: changes whenever a worker joins, dies, comes back, restarts or moves. */
uint64_t bw__membership_version(bw_membership *m);

/* A consistent snapshot of the live workers, sorted by id, with the version it belongs to;
 * arrays and strings in `arena`. */
int bw__membership_live(bw_membership *m, bw_arena *arena, uint64_t *version, char ***ids,
                        char ***addresses, char ***data_addresses, size_t *n);

#endif
