/* The lease holder's side of a read grant (grant.h, docs/security.md "Read grants"): the
 * per-worker proof. In the client library; the daemons' side is grant.c. */
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "auth/grant.h"

void bw__grant_proof(const uint8_t secret[BW_GRANT_SECRET_BYTES], const char *worker_id,
                     uint8_t out[BW_GRANT_PROOF_BYTES])
{
    static const char label[] = "bw-read-v1";
    size_t id_len = strlen(worker_id);
    unsigned char msg[sizeof(label) + 256];
    unsigned char *m = msg;
    size_t n = sizeof(label); /* the label and its NUL separate it from the id */
    if (n + id_len > sizeof(msg)) {
        /* worker ids are at most 255 bytes (docs/security.md, "Input limits"); a longer one
         * cannot be a worker's, so its proof is computed over the label and a hash of it */
        unsigned char digest[32];
        unsigned int dl = 0;
        EVP_Digest(worker_id, id_len, digest, &dl, EVP_sha256(), NULL);
        memcpy(m, label, sizeof(label));
        memcpy(m + n, digest, dl);
        n += dl;
    } else {
        memcpy(m, label, sizeof(label));
        memcpy(m + n, worker_id, id_len);
        n += id_len;
    }
    unsigned int len = BW_GRANT_PROOF_BYTES;
    HMAC(EVP_sha256(), secret, BW_GRANT_SECRET_BYTES, msg, n, out, &len);
}
