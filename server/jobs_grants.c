/* Read grants at the coordinator (docs/security.md, "Read grants"; core/auth/grant.h): the
 * grant each join and lease heartbeat answer carries, and the revocation of a lease's grants
 * when the lease ends (jobs_apply.c calls it wherever a lease ends). Under the jobs lock. */
#include "jobs_int.h"

#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/util.h"

void bw__jobs_set_grants(bw_jobs *s, bw_grants *grants)
{
    pthread_mutex_lock(&s->mu);
    s->grants = grants;
    pthread_mutex_unlock(&s->mu);
}

int bw__jobs_grant(bw_jobs *s, bw_job *job, uint32_t rank, const bw_rank_state *r, bw_arena *arena,
                   ProtobufCBinaryData *claims, ProtobufCBinaryData *secret)
{
    claims->data = secret->data = NULL;
    claims->len = secret->len = 0;
    if (!s->grants)
        return BW_OK;
    /* The configuration never changes: its dataset is hashed once (a mixture has none: the
     * empty message's hash, which no request names) and so are a mixture's sources, each a
     * dataset its reads name (docs/security.md, "Read grants"). */
    const Batchwire__V1__Mixture *mx = job->config->mixture;
    size_t nsources = mx ? mx->n_sources : 0;
    if (!job->dataset_hashed) {
        int rc = bw__grant_dataset_hash(job->config->dataset, job->dataset_hash);
        if (rc == BW_OK && nsources &&
            !(job->source_hashes = calloc(nsources, sizeof(*job->source_hashes))))
            rc = BW_NOMEM;
        for (size_t j = 0; rc == BW_OK && j < nsources; j++)
            rc = bw__grant_dataset_hash(mx->sources[j]->dataset, job->source_hashes[j]);
        if (rc != BW_OK) {
            free(job->source_hashes);
            job->source_hashes = NULL;
            return rc;
        }
        job->dataset_hashed = true;
    }
    bw_grant_claims c;
    memset(&c, 0, sizeof(c));
    c.job = job->name;
    c.rank = rank;
    memcpy(c.dataset, job->dataset_hash, sizeof(c.dataset));
    c.sources = (const uint8_t(*)[BW_GRANT_HASH_BYTES])job->source_hashes;
    c.nsources = nsources;
    c.lease_tag = bw__grant_lease_tag(r->lease.lo, r->lease.hi);
    c.expires_ms = bw__unix_ms() + r->lease_ms;
    return bw__grant_mint(s->grants, &c, arena, claims, secret);
}

void bw__jobs_lease_ended(bw_jobs *s, const bw_job *job, uint32_t rank, const bw_rank_state *r)
{
    if (!r->leased)
        return;
    BW_INVARIANT(s->leases > 0, "a lease that ends was counted when it started");
    s->leases--;
    if (!s->grants)
        return;
    /* Its last grant expires at most a lease after now; workers allow the skew beyond. */
    uint64_t until = bw__unix_ms() + r->lease_ms + BW_GRANT_SKEW_MS;
    if (bw__grant_revoke(s->grants, job->name, rank, bw__grant_lease_tag(r->lease.lo, r->lease.hi),
                         until) != BW_OK)
        BW_WARN("job=%s rank=%u out of memory revoking the read grants of an ended lease; they "
                "stay valid until they expire (at most the lease's length)",
                job->name, rank);
}
