/*
 * Rates from cumulative counters that a remote process reports now and then (a worker's
 * served totals, a loader's handed-out totals, with each heartbeat): per second over the
 * window from one report to the first report at least BW_RATE_WINDOW_MS later. The rate
 * shown is that of the last complete window, so it is never computed over less than a
 * second and follows the process within two windows. Counters that go down (the process
 * restarted) start a new window with no rate. Not thread-safe: the caller's lock guards it.
 */
#ifndef BW_COMMON_RATE_H
#define BW_COMMON_RATE_H

#include <stdint.h>

enum { BW_RATE_COUNTERS = 3, BW_RATE_WINDOW_MS = 1000 };

typedef struct bw__rate {
    uint64_t at_ms;                   /* the latest report, monotonic (0: none yet) */
    uint64_t total[BW_RATE_COUNTERS]; /* its totals */
    uint64_t base_ms;                 /* where the current window started */
    uint64_t base[BW_RATE_COUNTERS];
    double per_s[BW_RATE_COUNTERS]; /* over the last complete window (0 before one) */
} bw__rate;

/* Records a report of `totals` (BW_RATE_COUNTERS of them; unused ones 0) at now_ms. */
void bw__rate_report(bw__rate *r, uint64_t now_ms, const uint64_t *totals);

#endif
