/* The jobs part of `batchwire status` (status_jobs.c): every job -- or one, for --job NAME --
 * with its ranks, as a table or as JSON. */
#ifndef BW_CLI_STATUS_JOBS_H
#define BW_CLI_STATUS_JOBS_H

#include <stddef.h>

#include "common/arena.h"
#include "rpc/client.h"

typedef struct bw_status_jobs {
    size_t n;
    const Batchwire__V1__GetJobResponse **jobs; /* sorted by name */
} bw_status_jobs;

/* ListJobs, then GetJob for each; everything in `arena`. Returns BW_OK or an error with a
 * sentence in err. */
int bw__status_jobs_fetch(bw_rpc_channel *ch, bw_arena *arena, int timeout_ms, bw_status_jobs *out,
                          char *err, size_t errlen);

/* `batchwire status --job NAME`: GetJob of that job alone into out (one entry). An unknown
 * job is BW_NOT_FOUND with a sentence naming it, `target` (the coordinator's address) and
 * the jobs there are; other errors as above. */
int bw__status_job_fetch(bw_rpc_channel *ch, bw_arena *arena, int timeout_ms, const char *name,
                         const char *target, bw_status_jobs *out, char *err, size_t errlen);

/* Writes `"jobs":[...]` (no leading comma). */
void bw__status_jobs_json(const bw_status_jobs *j);

/* Writes one job's object: {"name":...,"ranks":[...]}, an element of "jobs" above. */
void bw__status_job_json(const Batchwire__V1__GetJobResponse *job);

/* Writes the jobs section of the table. */
void bw__status_jobs_table(const bw_status_jobs *j);

/* Writes one job's part of it: its line and the table of its ranks. */
void bw__status_job_table(const Batchwire__V1__GetJobResponse *g);

#endif
