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

/* The job's ranks counted by lease, commits and progress, with the lag's median and maximum
 * (and the rank furthest behind) over the ranks that report progress. */
typedef struct rank_summary {
    size_t live, expired, none, committed, reporting;
    int64_t lag_median, lag_max;
    uint32_t lag_max_rank;
} rank_summary;

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void summarise(const Batchwire__V1__GetJobResponse *g, const int64_t *lag, rank_summary *s)
{
    memset(s, 0, sizeof(*s));
    s->lag_median = s->lag_max = -1;
    for (size_t r = 0; r < g->n_ranks; r++) {
        const Batchwire__V1__RankProgress *p = g->ranks[r];
        s->live += p->lease == BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_LIVE;
        s->expired += p->lease == BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_EXPIRED;
        s->committed += p->committed;
        if (lag && lag[r] >= 0) {
            s->reporting++;
            if (lag[r] > s->lag_max) {
                s->lag_max = lag[r];
                s->lag_max_rank = p->rank;
            }
        }
    }
    s->none = g->n_ranks - s->live - s->expired;
    int64_t *sorted = s->reporting ? malloc(s->reporting * sizeof(*sorted)) : NULL;
    if (sorted) {
        size_t n = 0;
        for (size_t r = 0; r < g->n_ranks; r++)
            if (lag[r] >= 0)
                sorted[n++] = lag[r];
        qsort(sorted, n, sizeof(*sorted), cmp_i64);
        s->lag_median = sorted[n / 2];
        free(sorted);
    }
}

static bool in_view(const bw_status_view *v, uint32_t rank)
{
    return !v->range || (rank >= v->from && rank <= v->to);
}

void bw__status_job_json(const Batchwire__V1__GetJobResponse *job, const bw_status_view *v)
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
    rank_summary rs;
    summarise(job, lag, &rs);
    printf(",\"rank_summary\":{\"live\":%zu,\"expired\":%zu,\"none\":%zu,\"committed\":%zu,"
           "\"reporting\":%zu,\"lag_median_steps\":%" PRId64 ",\"lag_max_steps\":%" PRId64,
           rs.live, rs.expired, rs.none, rs.committed, rs.reporting, rs.lag_median, rs.lag_max);
    if (rs.reporting)
        printf(",\"lag_max_rank\":%" PRIu32, rs.lag_max_rank);
    putchar('}');
    printf(",\"history\":[");
    for (size_t h = 0; h < s->n_history; h++)
        printf("%s{\"epoch\":%" PRIu64 ",\"start_step\":%" PRIu64 ",\"world_size\":%" PRIu32 "}",
               h ? "," : "", s->history[h]->epoch, s->history[h]->start_step,
               s->history[h]->world_size);
    printf("],\"ranks\":[");
    bool first = true;
    for (size_t r = 0; r < job->n_ranks; r++) {
        const Batchwire__V1__RankProgress *p = job->ranks[r];
        if (!in_view(v, p->rank))
            continue;
        printf("%s{\"rank\":%" PRIu32 ",\"lease\":\"%s\"", first ? "" : ",", p->rank,
               lease_name(p->lease));
        first = false;
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

void bw__status_jobs_json(const bw_status_jobs *j, const bw_status_view *v)
{
    printf("\"jobs\":[");
    for (size_t i = 0; i < j->n; i++) {
        if (i)
            putchar(',');
        bw__status_job_json(j->jobs[i], v);
    }
    printf("]");
}

void bw__status_jobs_table(const bw_status_jobs *j, const bw_status_view *v)
{
    printf("\njobs: %zu\n", j->n);
    for (size_t i = 0; i < j->n; i++) {
        putchar('\n');
        bw__status_job_table(j->jobs[i], v);
    }
}

/* Orders rank indexes for the table's selection: lease expired, then none, then live; then
 * furthest behind first; then by rank. */
static const Batchwire__V1__GetJobResponse *order_job;
static const int64_t *order_lag;

static int lease_class(Batchwire__V1__LeaseState s)
{
    return s == BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_EXPIRED ? 0
           : s == BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_LIVE  ? 2
                                                                : 1;
}

static int unusual_first(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    int cx = lease_class(order_job->ranks[x]->lease), cy = lease_class(order_job->ranks[y]->lease);
    if (cx != cy)
        return cx - cy;
    int64_t lx = order_lag ? order_lag[x] : -1, ly = order_lag ? order_lag[y] : -1;
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int by_index(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* The indexes of the ranks the table shows into *out (malloc'ed; NULL with n 0 when memory
 * ran out), in rank order. */
static size_t pick_rows(const Batchwire__V1__GetJobResponse *g, const int64_t *lag,
                        const bw_status_view *v, size_t **out)
{
    size_t *idx = malloc((g->n_ranks + 1) * sizeof(*idx));
    *out = idx;
    if (!idx)
        return 0;
    size_t n = 0;
    for (size_t r = 0; r < g->n_ranks; r++)
        if (in_view(v, g->ranks[r]->rank))
            idx[n++] = r;
    if (v->range || v->limit == 0 || n <= v->limit)
        return n;
    order_job = g; /* the CLI prints from one thread */
    order_lag = lag;
    qsort(idx, n, sizeof(*idx), unusual_first);
    qsort(idx, v->limit, sizeof(*idx), by_index);
    return v->limit;
}

void bw__status_job_table(const Batchwire__V1__GetJobResponse *g, const bw_status_view *v)
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
    rank_summary rs;
    summarise(g, lag, &rs);
    printf("  ranks by lease: %zu live, %zu expired, %zu none", rs.live, rs.expired, rs.none);
    if (rs.reporting)
        printf("; %zu report progress, lag behind the furthest rank: median %" PRId64
               ", max %" PRId64 " steps (rank %" PRIu32 ")",
               rs.reporting, rs.lag_median, rs.lag_max, rs.lag_max_rank);
    putchar('\n');
    size_t *rows = NULL;
    size_t nrows = pick_rows(g, lag, v, &rows);
    printf("  %4s  %-7s  %-28s  %14s  %6s  %10s  %14s  %6s  %10s  %8s\n", "RANK", "LEASE", "HOLDER",
           "LAST HEARTBEAT", "EPOCH", "STEP", "AT EPOCH:STEP", "LAG", "SAMPLES/S", "MIB/S");
    for (size_t k = 0; k < nrows; k++) {
        size_t r = rows[k];
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
    if (!v->range && nrows < g->n_ranks)
        printf("  ... %zu of %zu ranks shown (lease expired or none first, then the furthest "
               "behind); --limit 0 shows every rank, --ranks FROM-TO a range\n",
               nrows, g->n_ranks);
    free(rows);
    free(lag);
}
