#include "status_jobs.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/json.h"

int bw__status_jobs_fetch(bw_rpc_channel *ch, bw_arena *arena, int timeout_ms, bw_status_jobs *out,
                          char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    Batchwire__V1__ListJobsRequest lreq = BATCHWIRE__V1__LIST_JOBS_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    int rc =
        bw__rpc_call(ch, BW_METHOD(BW_M_JOBS_LIST), &lreq.base, arena, &m, timeout_ms, err, errlen);
    if (rc != BW_OK)
        return rc;
    const Batchwire__V1__ListJobsResponse *lj = (const void *)m;
    out->jobs = bw__arena_alloc(arena, (lj->n_jobs + 1) * sizeof(*out->jobs));
    if (!out->jobs)
        return BW_NOMEM;
    for (size_t i = 0; i < lj->n_jobs; i++) {
        Batchwire__V1__GetJobRequest g = BATCHWIRE__V1__GET_JOB_REQUEST__INIT;
        g.name = lj->jobs[i]->name;
        rc =
            bw__rpc_call(ch, BW_METHOD(BW_M_JOBS_GET), &g.base, arena, &m, timeout_ms, err, errlen);
        if (rc == BW_NOT_FOUND)
            continue;
        if (rc != BW_OK)
            return rc;
        out->jobs[out->n++] = (const void *)m;
    }
    return BW_OK;
}

/* Up to 10 job names the caller may see, ", "-separated, into out ("" when none or when
 * ListJobs fails): what a "no such job" message offers instead. */
static void known_jobs(bw_rpc_channel *ch, bw_arena *arena, int timeout_ms, char *out, size_t n)
{
    out[0] = '\0';
    Batchwire__V1__ListJobsRequest lreq = BATCHWIRE__V1__LIST_JOBS_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    char err[256];
    if (bw__rpc_call(ch, BW_METHOD(BW_M_JOBS_LIST), &lreq.base, arena, &m, timeout_ms, err,
                     sizeof(err)) != BW_OK)
        return;
    const Batchwire__V1__ListJobsResponse *lj = (const void *)m;
    size_t len = 0;
    for (size_t i = 0; i < lj->n_jobs && i < 10 && len < n; i++)
        len += (size_t)snprintf(out + len, n - len, "%s%s", i ? ", " : "", lj->jobs[i]->name);
    if (lj->n_jobs > 10 && len < n)
        snprintf(out + len, n - len, ", and %zu more", lj->n_jobs - 10);
}

int bw__status_job_fetch(bw_rpc_channel *ch, bw_arena *arena, int timeout_ms, const char *name,
                         const char *target, bw_status_jobs *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->jobs = bw__arena_alloc(arena, sizeof(*out->jobs));
    if (!out->jobs)
        return BW_NOMEM;
    Batchwire__V1__GetJobRequest g = BATCHWIRE__V1__GET_JOB_REQUEST__INIT;
    g.name = (char *)name;
    ProtobufCMessage *m = NULL;
    char why[1024];
    int rc = bw__rpc_call(ch, BW_METHOD(BW_M_JOBS_GET), &g.base, arena, &m, timeout_ms, why,
                          sizeof(why));
    if (rc == BW_NOT_FOUND) {
        char names[512];
        known_jobs(ch, arena, timeout_ms, names, sizeof(names));
        snprintf(err, errlen,
                 "no job '%s' on the coordinator at %s (%s%s; a job that finished, was deleted "
                 "or idled out is gone)",
                 name, target, names[0] ? "its jobs: " : "it has no jobs you may see", names);
        return rc;
    }
    if (rc != BW_OK) {
        snprintf(err, errlen, "%s", why);
        return rc;
    }
    out->jobs[out->n++] = (const void *)m;
    return BW_OK;
}

static const char *lease_name(Batchwire__V1__LeaseState s)
{
    switch (s) {
    case BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_LIVE:
        return "live";
    case BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_EXPIRED:
        return "expired";
    default:
        return "none";
    }
}

static const char *mode_name(const Batchwire__V1__JobConfig *c)
{
    switch (c && c->sampler ? c->sampler->mode : 0) {
    case BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH:
        return "torch";
    case BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ACCELERATE:
        return "accelerate";
    case BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ITERABLE:
        return "iterable";
    default:
        return "?";
    }
}

/* Where a rank is, in steps from epoch 0 (epoch_steps per epoch: every rank has as many). */
static uint64_t position(const Batchwire__V1__RankLive *l)
{
    return l->epoch * l->epoch_steps + l->step;
}

/* Each rank's lag behind the fastest rank of the job, in steps; -1 for a rank whose holder
 * reported no progress, and for every rank when memory ran out. malloc'ed: n_ranks entries. */
static int64_t *lags(const Batchwire__V1__GetJobResponse *g)
{
    int64_t *lag = malloc((g->n_ranks + 1) * sizeof(*lag));
    if (!lag)
        return NULL;
    uint64_t front = 0;
    for (size_t r = 0; r < g->n_ranks; r++)
        if (g->ranks[r]->live && position(g->ranks[r]->live) > front)
            front = position(g->ranks[r]->live);
    for (size_t r = 0; r < g->n_ranks; r++)
        lag[r] = g->ranks[r]->live ? (int64_t)(front - position(g->ranks[r]->live)) : -1;
    return lag;
}

static bool live_lease(const Batchwire__V1__RankProgress *p)
{
    return p->lease == BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_LIVE && p->live;
}

/* The job's rates: the sum over ranks whose lease is live. */
static void job_rates(const Batchwire__V1__GetJobResponse *g, double *samples, double *bytes)
{
    *samples = *bytes = 0;
    for (size_t r = 0; r < g->n_ranks; r++)
        if (live_lease(g->ranks[r])) {
            *samples += g->ranks[r]->samples_per_s;
            *bytes += g->ranks[r]->bytes_per_s;
        }
}

void bw__status_job_json(const Batchwire__V1__GetJobResponse *job)
{
    const Batchwire__V1__JobSummary *s = job->job;
    printf("{\"name\":");
    bw__json_string(stdout, s->name);
    printf(",\"mode\":\"%s\",\"world_size\":%" PRIu32 ",\"num_samples\":%" PRIu64
           ",\"fingerprint\":\"%016" PRIx64 "\",\"created_unix_ms\":%" PRIu64,
           mode_name(s->config), s->world_size, s->dataset ? s->dataset->length : 0, s->fingerprint,
           s->created_unix_ms);
    double jsamples, jbytes;
    job_rates(job, &jsamples, &jbytes);
    printf(",\"samples_per_s\":%.1f,\"bytes_per_s\":%.0f", jsamples, jbytes);
    int64_t *lag = lags(job);
    printf(",\"history\":[");
    for (size_t h = 0; h < s->n_history; h++)
        printf("%s{\"epoch\":%" PRIu64 ",\"start_step\":%" PRIu64 ",\"world_size\":%" PRIu32 "}",
               h ? "," : "", s->history[h]->epoch, s->history[h]->start_step,
               s->history[h]->world_size);
    printf("],\"ranks\":[");
    for (size_t r = 0; r < job->n_ranks; r++) {
        const Batchwire__V1__RankProgress *p = job->ranks[r];
        printf("%s{\"rank\":%" PRIu32 ",\"lease\":\"%s\"", r ? "," : "", p->rank,
               lease_name(p->lease));
        if (p->holder) {
            printf(",\"host\":");
            bw__json_string(stdout, p->holder->host);
            printf(",\"pid\":%" PRIu32 ",\"seconds_since_heartbeat\":%.3f", p->holder->pid,
                   (double)p->ms_since_heartbeat / 1000.0);
        }
        printf(",\"committed\":%s,\"epoch\":%" PRIu64 ",\"step\":%" PRIu64,
               p->committed ? "true" : "false", p->epoch, p->step);
        const Batchwire__V1__RankLive *l = p->live;
        if (l)
            printf(",\"live\":{\"epoch\":%" PRIu64 ",\"step\":%" PRIu64 ",\"epoch_steps\":%" PRIu64
                   ",\"batches\":%" PRIu64 ",\"samples\":%" PRIu64 ",\"bytes\":%" PRIu64
                   ",\"wait_seconds\":%.3f,\"seconds_since\":%.3f}"
                   ",\"lag_steps\":%" PRId64 ",\"batches_per_s\":%.2f,\"samples_per_s\":%.1f"
                   ",\"bytes_per_s\":%.0f",
                   l->epoch, l->step, l->epoch_steps, l->batches, l->samples, l->bytes,
                   (double)l->wait_ms / 1000.0, (double)p->ms_since_live / 1000.0,
                   lag ? lag[r] : -1, p->batches_per_s, p->samples_per_s, p->bytes_per_s);
        putchar('}');
    }
    printf("]}");
    free(lag);
}

void bw__status_jobs_json(const bw_status_jobs *j)
{
    printf("\"jobs\":[");
    for (size_t i = 0; i < j->n; i++) {
        if (i)
            putchar(',');
        bw__status_job_json(j->jobs[i]);
    }
    printf("]");
}

void bw__status_jobs_table(const bw_status_jobs *j)
{
    printf("\njobs: %zu\n", j->n);
    for (size_t i = 0; i < j->n; i++) {
        putchar('\n');
        bw__status_job_table(j->jobs[i]);
    }
}

void bw__status_job_table(const Batchwire__V1__GetJobResponse *g)
{
    const Batchwire__V1__JobSummary *s = g->job;
    size_t live = 0, committed = 0;
    for (size_t r = 0; r < g->n_ranks; r++) {
        live += g->ranks[r]->lease == BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_LIVE;
        committed += g->ranks[r]->committed;
    }
    double jsamples, jbytes;
    job_rates(g, &jsamples, &jbytes);
    printf("job %s  %s  world %" PRIu32 "  %" PRIu64 " samples  fingerprint %016" PRIx64
           "  ranks: %zu live, %zu committed  %.0f samples/s  %.1f MiB/s\n",
           s->name, mode_name(s->config), s->world_size, s->dataset ? s->dataset->length : 0,
           s->fingerprint, live, committed, jsamples, jbytes / (1 << 20));
    if (s->n_history > 1) {
        printf("  world size history:");
        for (size_t h = 0; h < s->n_history; h++)
            printf(" %" PRIu32 " from epoch %" PRIu64 " step %" PRIu64 "%s",
                   s->history[h]->world_size, s->history[h]->epoch, s->history[h]->start_step,
                   h + 1 < s->n_history ? "," : "\n");
    }
    int64_t *lag = lags(g);
    printf("  %4s  %-7s  %-28s  %14s  %6s  %10s  %14s  %6s  %10s  %8s\n", "RANK", "LEASE", "HOLDER",
           "LAST HEARTBEAT", "EPOCH", "STEP", "AT EPOCH:STEP", "LAG", "SAMPLES/S", "MIB/S");
    for (size_t r = 0; r < g->n_ranks; r++) {
        const Batchwire__V1__RankProgress *p = g->ranks[r];
        char holder[300] = "-", ago[32] = "-", epoch[24] = "-", step[24] = "-";
        char at[48] = "-", lagt[24] = "-", sps[24] = "-", mibs[24] = "-";
        if (p->live) {
            snprintf(at, sizeof(at), "%" PRIu64 ":%" PRIu64, p->live->epoch, p->live->step);
            snprintf(lagt, sizeof(lagt), "%" PRId64, lag ? lag[r] : -1);
        }
        if (live_lease(p)) {
            snprintf(sps, sizeof(sps), "%.0f", p->samples_per_s);
            snprintf(mibs, sizeof(mibs), "%.1f", p->bytes_per_s / (1 << 20));
        }
        if (p->holder) {
            snprintf(holder, sizeof(holder), "%.200s:%" PRIu32, p->holder->host, p->holder->pid);
            snprintf(ago, sizeof(ago), "%.1fs ago", (double)p->ms_since_heartbeat / 1000.0);
        }
        if (p->committed) {
            snprintf(epoch, sizeof(epoch), "%" PRIu64, p->epoch);
            snprintf(step, sizeof(step), "%" PRIu64, p->step);
        }
        printf("  %4" PRIu32 "  %-7s  %-28s  %14s  %6s  %10s  %14s  %6s  %10s  %8s\n", p->rank,
               lease_name(p->lease), holder, ago, epoch, step, at, lagt, sps, mibs);
    }
    free(lag);
}
