/* The jobs part of `batchwire status` (status_jobs.c): every job -- or one, for --job NAME --
 * with its ranks, as a table or as JSON. */
#ifndef BW_CLI_STATUS_JOBS_H
#define BW_CLI_STATUS_JOBS_H

#include <stddef.h>

#include "common/arena.h"
#include "rpc/client.h"

/* Which ranks a job's table and JSON list (`batchwire status --limit`, `--ranks`;
 * docs/client.md). */
typedef struct bw_status_view {
    size_t limit;      /* table: at most this many rank rows per job, the unusual first (0: all) */
    bool range;        /* --ranks FROM-TO: exactly those ranks, in the table and in JSON */
    uint32_t from, to; /* inclusive */
} bw_status_view;

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
void bw__status_jobs_json(const bw_status_jobs *j, const bw_status_view *v);

/* Writes one job's object: {"name":...,"rank_summary":{...},"ranks":[...]}, an element of
 * "jobs" above; "ranks" holds every rank, or those of v->range. */
void bw__status_job_json(const Batchwire__V1__GetJobResponse *job, const bw_status_view *v);

/* Writes the jobs section of the table. */
void bw__status_jobs_table(const bw_status_jobs *j, const bw_status_view *v);

/* Writes one job's part of it: its line, its ranks summarised by lease and lag, and the table
 * of its ranks: those of v->range, or every rank when there are at most v->limit, or else
 * v->limit of them, the unusual first (lease expired, none, then the furthest behind). */
void bw__status_job_table(const Batchwire__V1__GetJobResponse *g, const bw_status_view *v);

#endif
