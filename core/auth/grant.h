/* Read grants (docs/security.md, "Read grants"): the coordinator signs what a rank's lease may
 * read (a packed GrantClaims, proto/data.proto) with a key it shares with its workers
 * (--grant-key); the lease holder receives the claims and their secret, and proves to each
 * worker that it holds the secret with a proof bound to that worker's id. grant_proof.c holds
 * the part the client library needs (the proof); the daemons' part (keys, minting,
 * verification) is grant.c. */
#ifndef BW_AUTH_GRANT_H
#define BW_AUTH_GRANT_H

#include <stddef.h>
#include <stdint.h>

#define BW_GRANT_SECRET_BYTES 32
#define BW_GRANT_PROOF_BYTES 32

/* The proof a lease holder sends worker `worker_id` with each read: HMAC-SHA256 keyed by the
 * grant's secret over "bw-read-v1" and the id. Never fails (OpenSSL's one-shot HMAC on a
 * 32-byte key); `out` receives BW_GRANT_PROOF_BYTES. */
void bw__grant_proof(const uint8_t secret[BW_GRANT_SECRET_BYTES], const char *worker_id,
                     uint8_t out[BW_GRANT_PROOF_BYTES]);

/* ---- the daemons' side (grant.c; bwdaemon, never in the client library) ---- */

#include <stdbool.h>

#include "common/arena.h"
#include "data.pb-c.h"
#include "batchwire.pb-c.h"

/* A worker accepts a grant up to this long after its expiry (clocks of different hosts). */
#define BW_GRANT_SKEW_MS 5000
/* The gRPC metadata key of the coordinator's proof on its calls to workers, and how long one
 * proof is good for. */
#define BW_GRANT_COORD_HEADER "x-batchwire-coordinator"
#define BW_GRANT_COORD_PROOF_MS 60000

enum {
    BW_GRANT_KEY_ID_MAX = 32,
    BW_GRANT_HASH_BYTES = 32, /* GrantClaims.dataset: SHA-256 of the packed Dataset */
    /* a longer GrantClaims is refused unread; room for a mixture of 256 sources' hashes */
    BW_GRANT_CLAIMS_MAX = 10240,
    /* "KEYID.EXPIRES_MS.HEX" and its NUL */
    BW_GRANT_COORD_PROOF_MAX = BW_GRANT_KEY_ID_MAX + 1 + 20 + 1 + 64 + 1,
};

/*
 * The grant keys of --grant-key (docs/security.md, "Read grants"), the leases whose grants are
 * refused (revoked) and the verified grants (a cache). One a daemon; every function is
 * thread-safe.
 *
 * The file holds lines "KEYID HEX" ('#' comments and blank lines ignored): KEYID 1-32 of
 * [A-Za-z0-9_.-], HEX at least 64 hex digits (a key of 32 bytes or more). The first key signs;
 * all of them verify, so a key is rotated by adding a new first line, reloading every daemon
 * (SIGHUP), and removing the old line later.
 */
typedef struct bw_grants bw_grants;

/* Loads `path`. BW_OK with *out (free with bw__grants_free), or BW_IO / BW_INVALID_ARGUMENT
 * with a sentence naming the file and line (never a key's bytes). Warns when others can read
 * or write the file. */
int bw__grants_open(const char *path, bw_grants **out, char *err, size_t errlen);

/* NULL is a no-op. */
void bw__grants_free(bw_grants *g);

/* Reads the file again (SIGHUP). On error the keys loaded before stay in force; *count is the
 * number of keys now loaded. Grants verified with a key that is gone are verified again. */
int bw__grants_reload(bw_grants *g, size_t *count, char *err, size_t errlen);

/* The file's path (as given). */
const char *bw__grants_path(const bw_grants *g);

/* Names a lease without revealing it: the first 8 bytes (big-endian) of SHA-256("bw-lease-tag"
 * || lo || hi), the lease id's halves as 8 little-endian bytes each. */
uint64_t bw__grant_lease_tag(uint64_t lease_lo, uint64_t lease_hi);

/* SHA-256 of the packed `dataset` (protobuf-c's packing: the same bytes on every side that
 * holds the same message; NULL: the empty message's). BW_OK, or BW_NOMEM. */
int bw__grant_dataset_hash(const Batchwire__V1__Dataset *dataset, uint8_t out[BW_GRANT_HASH_BYTES]);

/* What a grant says (GrantClaims without its key id). */
typedef struct bw_grant_claims {
    const char *job;
    uint32_t rank;
    uint8_t dataset[BW_GRANT_HASH_BYTES];
    /* A mixture job's sources' hashes (GrantClaims.sources; nsources 0: none), borrowed. */
    const uint8_t (*sources)[BW_GRANT_HASH_BYTES];
    size_t nsources;
    uint64_t lease_tag;
    uint64_t lease_generation; /* 0: unknown */
    uint64_t expires_ms;       /* unix ms */
} bw_grant_claims;

/* Mints a grant with the first key: *claims the packed GrantClaims and *secret its
 * BW_GRANT_SECRET_BYTES secret, HMAC-SHA256(K, "bw-grant-v1" || claims), both in `arena`.
 * BW_OK, or BW_NOMEM. The secret is never logged. */
int bw__grant_mint(bw_grants *g, const bw_grant_claims *c, bw_arena *arena,
                   ProtobufCBinaryData *claims, ProtobufCBinaryData *secret);

/*
 * Whether `grant` lets its sender read `dataset` at worker `worker_id` at unix time now_ms.
 * Checks, in order: the claims decode and their key id is one of ours; they have not expired
 * (BW_GRANT_SKEW_MS allowed); their lease is not revoked; the proof is
 * HMAC(HMAC(K, "bw-grant-v1" || claims), "bw-read-v1\0" || worker_id); the request's
 * dataset hashes to the claims' dataset or to one of its sources (a mixture's). BW_OK, or
 * BW_PERMISSION_DENIED with a sentence naming what failed (never a secret or a proof's bytes). A
 * pair verified before costs a table lookup and a memcmp (and the dataset's packing); a mixture's
 * grant is cached once per source dataset read with it. `grant` NULL: refused ("no read grant").
 */
int bw__grant_verify(bw_grants *g, const char *worker_id, const Batchwire__V1__ReadGrant *grant,
                     const Batchwire__V1__Dataset *dataset, uint64_t now_ms, char *err,
                     size_t errlen);

/* Revokes the grants of one lease of (job, rank) until until_ms (unix). At the coordinator:
 * a lease that ended; at a worker: one of the heartbeat answer's RevokedLease. Adding one
 * already known only extends it. BW_OK, or BW_NOMEM (the worker tries again at the next
 * heartbeat). */
int bw__grant_revoke(bw_grants *g, const char *job, uint32_t rank, uint64_t lease_tag,
                     uint64_t until_ms);

/* The revocations still in force at now_ms, in `arena` (*n of them; forgets older ones): what
 * the coordinator sends each worker with its HeartbeatResponse. BW_OK, or BW_NOMEM. */
int bw__grant_revoked(bw_grants *g, uint64_t now_ms, bw_arena *arena,
                      Batchwire__V1__RevokedLease ***out, size_t *n);

/* The coordinator's proof for calling worker `worker_id` (BW_GRANT_COORD_HEADER):
 * "KEYID.EXPIRES_MS.HEX", HEX = HMAC-SHA256(K, "bw-coord-v1\0" || worker_id || "\0" ||
 * EXPIRES_MS in decimal), good for BW_GRANT_COORD_PROOF_MS from now_ms. */
void bw__grant_coord_proof(bw_grants *g, const char *worker_id, uint64_t now_ms,
                           char out[BW_GRANT_COORD_PROOF_MAX]);

/* Whether `value` is a coordinator's proof for worker `worker_id`, unexpired at now_ms. BW_OK,
 * or BW_PERMISSION_DENIED with a sentence naming what failed. */
int bw__grant_coord_verify(bw_grants *g, const char *worker_id, const char *value, uint64_t now_ms,
                           char *err, size_t errlen);

#endif
