/*
 * The coordinator's metrics (docs/operating.md, "Metrics"): workers, jobs, ranks and their
 * progress, commits and lease takeovers, read from the worker table and the jobs at each
 * scrape (so a job's series go when the job goes), and the journal's fsyncs, observed by a
 * hook as they happen.
 *
 * With metrics off there is no bw__cm. Thread-safe.
 */
#ifndef BW_SERVER_METRICS_H
#define BW_SERVER_METRICS_H

#include "coordinator.h"
#include "metrics/metrics.h"

typedef struct bw__cm bw__cm;

/* Registers the coordinator's families and collector in reg (which must outlive the result)
 * over c's worker table and jobs, and hooks the journal's fsyncs. NULL when reg is NULL
 * (metrics off) or out of memory (*rc says which: BW_OK or BW_NOMEM). */
bw__cm *bw__cm_new(bw_metrics *reg, bw_coordinator *c, int *rc);

/* Unhooks the journal and frees m: call it while the jobs are still open (before
 * bw__jobs_close), after the /metrics server stopped. NULL is a no-op. */
void bw__cm_free(bw__cm *m);

#endif
