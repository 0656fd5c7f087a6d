/* What ranks report about their progress with each lease heartbeat (RankLive): kept per rank
 * in memory, with rates over heartbeat windows (core/common/rate.h), and shown by GetJob. */
#include "jobs_int.h"

#include <string.h>

#include "batchwire/batchwire.h"

void bw__jobs_live_report(bw_rank_state *r, bw_lease lease, const Batchwire__V1__RankLive *live,
                          uint64_t now_ms)
{
    if (!bw__lease_eq(r->live.lease, lease)) {
        memset(&r->live, 0, sizeof(r->live)); /* another holder's counters start at 0 */
        r->live.lease = lease;
    }
    r->live.epoch = live->epoch;
    r->live.step = live->step;
    r->live.epoch_steps = live->epoch_steps;
    r->live.wait_ms = live->wait_ms;
    const uint64_t totals[BW_RATE_COUNTERS] = {live->batches, live->samples, live->bytes};
    bw__rate_report(&r->live.rate, now_ms, totals);
}

int bw__jobs_live_fill(const bw_rank_state *r, uint64_t now_ms, bw_arena *arena,
                       Batchwire__V1__RankProgress *p)
{
    const bw_rank_live *l = &r->live;
    if (!r->leased || !bw__lease_eq(l->lease, r->lease) || l->rate.at_ms == 0)
        return BW_OK; /* nothing reported by the current holder */
    Batchwire__V1__RankLive *out = bw__arena_alloc(arena, sizeof(*out));
    if (!out)
        return BW_NOMEM;
    batchwire__v1__rank_live__init(out);
    out->epoch = l->epoch;
    out->step = l->step;
    out->epoch_steps = l->epoch_steps;
    out->wait_ms = l->wait_ms;
    out->batches = l->rate.total[0];
    out->samples = l->rate.total[1];
    out->bytes = l->rate.total[2];
    p->live = out;
    p->batches_per_s = l->rate.per_s[0];
    p->samples_per_s = l->rate.per_s[1];
    p->bytes_per_s = l->rate.per_s[2];
    p->ms_since_live = now_ms - l->rate.at_ms;
    return BW_OK;
}
