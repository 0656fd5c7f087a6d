/* Rates from a remote process's cumulative counters (rate.h), over windows of at least
 * BW_RATE_WINDOW_MS. */
#include "common/rate.h"

#include <stdbool.h>
#include <string.h>

void bw__rate_report(bw__rate *r, uint64_t now_ms, const uint64_t *totals)
{
    bool restarted = r->at_ms == 0 || now_ms < r->base_ms;
    for (int i = 0; i < BW_RATE_COUNTERS; i++)
        restarted |= totals[i] < r->total[i];
    if (restarted) {
        memset(r, 0, sizeof(*r));
        r->base_ms = now_ms;
        memcpy(r->base, totals, sizeof(r->base));
    } else if (now_ms - r->base_ms >= BW_RATE_WINDOW_MS) {
        double secs = (double)(now_ms - r->base_ms) / 1000.0;
        for (int i = 0; i < BW_RATE_COUNTERS; i++)
            r->per_s[i] = (double)(totals[i] - r->base[i]) / secs;
        r->base_ms = now_ms;
        memcpy(r->base, totals, sizeof(r->base));
    }
    r->at_ms = now_ms ? now_ms : 1;
    memcpy(r->total, totals, sizeof(r->total));
}
