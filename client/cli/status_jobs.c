#include "status_jobs.h"

#include <inttypes.h>
#include <stdio.h>
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

void bw__status_jobs_json(const bw_status_jobs *j)
{
    printf("\"jobs\":[");
    for (size_t i = 0; i < j->n; i++) {
        const Batchwire__V1__JobSummary *s = j->jobs[i]->job;
        printf("%s{\"name\":", i ? "," : "");
        bw__json_string(stdout, s->name);
        printf(",\"mode\":\"%s\",\"world_size\":%" PRIu32 ",\"num_samples\":%" PRIu64
               ",\"fingerprint\":\"%016" PRIx64 "\",\"created_unix_ms\":%" PRIu64,
               mode_name(s->config), s->world_size, s->dataset ? s->dataset->length : 0,
               s->fingerprint, s->created_unix_ms);
        printf(",\"history\":[");
        for (size_t h = 0; h < s->n_history; h++)
            printf("%s{\"epoch\":%" PRIu64 ",\"start_step\":%" PRIu64 ",\"world_size\":%" PRIu32
                   "}",
                   h ? "," : "", s->history[h]->epoch, s->history[h]->start_step,
                   s->history[h]->world_size);
        printf("],\"ranks\":[");
        for (size_t r = 0; r < j->jobs[i]->n_ranks; r++) {
            const Batchwire__V1__RankProgress *p = j->jobs[i]->ranks[r];
            printf("%s{\"rank\":%" PRIu32 ",\"lease\":\"%s\"", r ? "," : "", p->rank,
                   lease_name(p->lease));
            if (p->holder) {
                printf(",\"host\":");
                bw__json_string(stdout, p->holder->host);
                printf(",\"pid\":%" PRIu32 ",\"seconds_since_heartbeat\":%.3f", p->holder->pid,
                       (double)p->ms_since_heartbeat / 1000.0);
            }
            printf(",\"committed\":%s,\"epoch\":%" PRIu64 ",\"step\":%" PRIu64 "}",
                   p->committed ? "true" : "false", p->epoch, p->step);
        }
        printf("]}");
    }
    printf("]");
}

void bw__status_jobs_table(const bw_status_jobs *j)
{
    printf("\njobs: %zu\n", j->n);
    for (size_t i = 0; i < j->n; i++) {
        const Batchwire__V1__GetJobResponse *g = j->jobs[i];
        const Batchwire__V1__JobSummary *s = g->job;
        size_t live = 0, committed = 0;
        for (size_t r = 0; r < g->n_ranks; r++) {
            live += g->ranks[r]->lease == BATCHWIRE__V1__LEASE_STATE__LEASE_STATE_LIVE;
            committed += g->ranks[r]->committed;
        }
        printf("\njob %s  %s  world %" PRIu32 "  %" PRIu64 " samples  fingerprint %016" PRIx64
               "  ranks: %zu live, %zu committed\n",
               s->name, mode_name(s->config), s->world_size, s->dataset ? s->dataset->length : 0,
               s->fingerprint, live, committed);
        if (s->n_history > 1) {
            printf("  world size history:");
            for (size_t h = 0; h < s->n_history; h++)
                printf(" %" PRIu32 " from epoch %" PRIu64 " step %" PRIu64 "%s",
                       s->history[h]->world_size, s->history[h]->epoch, s->history[h]->start_step,
                       h + 1 < s->n_history ? "," : "\n");
        }
        printf("  %4s  %-7s  %-28s  %14s  %6s  %10s\n", "RANK", "LEASE", "HOLDER", "LAST HEARTBEAT",
               "EPOCH", "STEP");
        for (size_t r = 0; r < g->n_ranks; r++) {
            const Batchwire__V1__RankProgress *p = g->ranks[r];
            char holder[300] = "-", ago[32] = "-", epoch[24] = "-", step[24] = "-";
            if (p->holder) {
                snprintf(holder, sizeof(holder), "%.200s:%" PRIu32, p->holder->host,
                         p->holder->pid);
                snprintf(ago, sizeof(ago), "%.1fs ago", (double)p->ms_since_heartbeat / 1000.0);
            }
            if (p->committed) {
                snprintf(epoch, sizeof(epoch), "%" PRIu64, p->epoch);
                snprintf(step, sizeof(step), "%" PRIu64, p->step);
            }
            printf("  %4" PRIu32 "  %-7s  %-28s  %14s  %6s  %10s\n", p->rank, lease_name(p->lease),
                   holder, ago, epoch, step);
        }
    }
}
