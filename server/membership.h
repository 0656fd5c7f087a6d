/* The coordinator's table of storage workers: registration, heartbeats and liveness.
 * A worker is dead once it has missed `dead_after` heartbeats in a row, and alive again as
 * soon as it heartbeats or registers. Thread-safe. */
#ifndef BW_SERVER_MEMBERSHIP_H
#define BW_SERVER_MEMBERSHIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth/auth.h"
#include "common/arena.h"
#include "batchwire.pb-c.h"

typedef struct bw_membership bw_membership;

/* NULL when memory ran out. */
bw_membership *bw__membership_new(uint32_t heartbeat_ms, uint32_t dead_after);
void bw__membership_free(bw_membership *m);

uint32_t bw__membership_heartbeat_ms(const bw_membership *m);
uint32_t bw__membership_dead_after(const bw_membership *m);

/* Adds or updates a worker. A new incarnation of a known id replaces the old process when
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

/* Records a heartbeat. *known is false when the id or incarnation is unknown (the worker must
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

/* Marks workers dead whose heartbeats are overdue and logs every transition; returns how many
 * changed. Called periodically. */
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
