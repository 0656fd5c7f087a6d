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

#endif
