/* The coordinator's metric families (metrics.h). Every name and label is listed with its
 * meaning in docs/operating.md, "Metrics": change both together. */
#include "metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/util.h"
#include "jobs_int.h"

static const double FSYNC_S[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                 0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};

#define GAUGE(name, help, ...) BW_METRIC_DEF(name, BW_GAUGE, help, __VA_ARGS__)
#define COUNTER(name, help, ...) BW_METRIC_DEF(name, BW_COUNTER, help, __VA_ARGS__)

/* Families read at each scrape, in the order shown. Jobs are labelled job_name: Prometheus
 * gives every series it scrapes a `job` label of its own. */
enum {
    WORKERS,
    JOBS,
    WORLD_SIZE,
    RANKS,
    COMMITS,
    TAKEOVERS,
    LEASE_LEN,
    JOURNAL_BYTES,
    RANK_EPOCH,
    RANK_STEP,
    RANK_BATCHES,
    RANK_RATE,
    RANK_COMMITTED_EPOCH,
    RANK_COMMITTED_STEP,
    RANK_COMMIT_AGE,
    PRINCIPAL_JOBS,
    JOBS_LIMIT,
    JOB_REPORTING,
    JOB_RATE,
    JOB_LAG,
    JOB_COMMITTED,
    JOB_COMMIT_AGE,
    NCOLLECTED
};

static const bw_metric_def COLLECTED[NCOLLECTED] = {
    [WORKERS] = GAUGE("batchwire_coordinator_workers",
                      "Registered storage workers by state: alive (heartbeating) or dead (missed "
                      "--dead-after heartbeats)",
                      "state"),
    [JOBS] = GAUGE("batchwire_coordinator_jobs", "Jobs the coordinator holds", NULL),
    [WORLD_SIZE] =
        GAUGE("batchwire_coordinator_job_world_size", "A job's current world size", "job_name"),
    [RANKS] = GAUGE("batchwire_coordinator_ranks",
                    "A job's ranks by lease state: held (lease live), expired (the holder was "
                    "not heard from within --lease-ms; another trainer may take it) or free "
                    "(never joined, left, or revoked by an elastic resume)",
                    "job_name", "state"),
    [COMMITS] = COUNTER("batchwire_coordinator_commits_total",
                        "Cursor commits accepted (journaled) since the coordinator started", NULL),
    [TAKEOVERS] = COUNTER("batchwire_coordinator_lease_takeovers_total",
                          "Joins that took a rank from another holder since the coordinator "
                          "started: its lease had expired, or it had exited (reclaimed)",
                          "reason"),
    [LEASE_LEN] = GAUGE("batchwire_coordinator_lease_seconds",
                        "The length a lease is given now: --lease-ms, or longer when the leases "
                        "held would heartbeat above --max-heartbeats-per-second",
                        NULL),
    [JOURNAL_BYTES] = GAUGE("batchwire_coordinator_journal_bytes",
                            "Record bytes in the journal files the next snapshot removes "
                            "(compaction starts at --snapshot-bytes)",
                            NULL),
    [RANK_EPOCH] = GAUGE("batchwire_coordinator_rank_epoch",
                         "The epoch the rank's holder last reported with its lease heartbeat",
                         "job_name", "rank"),
    [RANK_STEP] = GAUGE("batchwire_coordinator_rank_step",
                        "The step (batches handed out in the epoch) the rank's holder last "
                        "reported with its lease heartbeat",
                        "job_name", "rank"),
    [RANK_BATCHES] = COUNTER("batchwire_coordinator_rank_batches_total",
                             "Batches the rank's current holder has handed out since it "
                             "joined, as it last reported (starts over with a new holder)",
                             "job_name", "rank"),
    [RANK_RATE] = GAUGE("batchwire_coordinator_rank_batches_per_second",
                        "Batches per second the rank's holder handed out over its last "
                        "complete heartbeat window (at least 1 s)",
                        "job_name", "rank"),
    [RANK_COMMITTED_EPOCH] =
        GAUGE("batchwire_coordinator_rank_committed_epoch",
              "The epoch of the rank's last committed cursor", "job_name", "rank"),
    [RANK_COMMITTED_STEP] =
        GAUGE("batchwire_coordinator_rank_committed_step",
              "The step of the rank's last committed cursor", "job_name", "rank"),
    [RANK_COMMIT_AGE] = GAUGE("batchwire_coordinator_rank_last_commit_age_seconds",
                              "Seconds since the rank's last committed cursor was journaled "
                              "(wall clock)",
                              "job_name", "rank"),
    [PRINCIPAL_JOBS] = GAUGE("batchwire_coordinator_principal_jobs",
                             "Jobs each principal owns, against its quota (docs/security.md); "
                             "principal \"\" holds the jobs made while the service was open",
                             "principal"),
    [JOBS_LIMIT] = GAUGE("batchwire_coordinator_jobs_limit",
                         "The job quotas: global (--max-jobs) and per_principal "
                         "(--max-jobs-per-principal, for trainer principals)",
                         "quota"),
    /* Per job whatever its size: what the per-rank series say, summarised (a job of 10,000
     * ranks would otherwise be 70,000 series). */
    [JOB_REPORTING] = GAUGE("batchwire_coordinator_job_ranks_reporting",
                            "The job's ranks whose current holder has reported progress with "
                            "its lease heartbeats",
                            "job_name"),
    [JOB_RATE] = GAUGE("batchwire_coordinator_job_batches_per_second",
                       "Batches per second over the ranks that report, per holder's last "
                       "heartbeat window: the sum, and the slowest (min) and fastest (max) rank",
                       "job_name", "stat"),
    [JOB_LAG] = GAUGE("batchwire_coordinator_job_lag_steps",
                      "How many steps the ranks that report are behind the job's furthest "
                      "rank: the median and the furthest behind (max)",
                      "job_name", "stat"),
    [JOB_COMMITTED] = GAUGE("batchwire_coordinator_job_ranks_committed",
                            "The job's ranks that have committed a cursor", "job_name"),
    [JOB_COMMIT_AGE] = GAUGE("batchwire_coordinator_job_commit_age_seconds",
                             "Seconds since a rank's last committed cursor was journaled (wall "
                             "clock), over the ranks that committed: the newest (min) and the "
                             "oldest (max)",
                             "job_name", "stat"),
};

static const bw_metric_def FSYNC = {
    "batchwire_coordinator_journal_fsync_duration_seconds",
    "Time of each fdatasync that made journal records durable (one per group commit; every "
    "answer that changes state waits for one)",
    BW_HISTOGRAM,
    {NULL},
    FSYNC_S,
    sizeof(FSYNC_S) / sizeof(FSYNC_S[0]),
    0};
static const bw_metric_def SYNCED =
    COUNTER("batchwire_coordinator_journal_synced_bytes_total",
            "Record bytes the journal made durable since the coordinator started", NULL);

struct bw__cm {
    bw_coordinator *c;
    bw_metric *f[NCOLLECTED];
    bw_series *fsync, *synced;
};

static void on_sync(void *user, double seconds, uint64_t bytes)
{
    bw__cm *m = user;
    bw__histogram_observe(m->fsync, seconds);
    bw__counter_add(m->synced, bytes);
}

/* What a scrape shows of the jobs, copied under the jobs' lock and rendered after it is
 * released: formatting 7 series a rank for 100,000 ranks takes about a second
 * (bench/bench_metrics.c), copying them a few milliseconds. */
typedef struct job_row {
    char *name;
    char *owner; /* the principal that created it (quota use) */
    uint32_t world, held, expired;
    size_t first, nrows; /* its rank rows: ranks[first .. first + nrows) */
} job_row;

typedef struct rank_row {
    size_t job; /* index into the job rows */
    uint32_t rank;
    bool reported, committed;
    uint64_t epoch, step, batches, epoch_steps; /* reported by the holder */
    double per_s;
    uint64_t committed_epoch, committed_step;
    double commit_age_s;
} rank_row;

typedef struct snapshot {
    uint64_t njobs, commits, takeovers_expired, takeovers_reclaimed;
    uint32_t lease_ms;
    uint32_t max_jobs, max_jobs_per_principal;
    job_row *jobs;
    size_t nj;
    rank_row *ranks;
    size_t nr, rcap;
} snapshot;

static bool add_rank(snapshot *sn, const rank_row *row)
{
    if (sn->nr == sn->rcap) {
        size_t cap = sn->rcap ? sn->rcap * 2 : 256;
        rank_row *nr = realloc(sn->ranks, cap * sizeof(*nr));
        if (!nr)
            return false;
        sn->ranks = nr;
        sn->rcap = cap;
    }
    sn->ranks[sn->nr++] = *row;
    return true;
}

/* Under s->mu: one job's row and the rows of its ranks that committed or whose holder
 * reported. False when out of memory. */
static bool copy_job(snapshot *sn, const bw_jobs *s, const bw_job *job, uint64_t mono_ms,
                     uint64_t unix_ms)
{
    job_row *j = &sn->jobs[sn->nj];
    if (!(j->name = strdup(job->name)))
        return false;
    if (!(j->owner = strdup(job->owner))) {
        free(j->name);
        return false;
    }
    j->world = job->world_size;
    j->held = j->expired = 0;
    j->first = sn->nr;
    for (uint32_t k = 0; k < job->world_size; k++) {
        const bw_rank_state *r = &job->ranks[k];
        bool live = bw__jobs_lease_live(s, r, mono_ms);
        j->held += live;
        j->expired += r->leased && !live;
        const bw_rank_live *l = &r->live; /* what the current holder reported (jobs_live.c) */
        rank_row row = {sn->nj,
                        k,
                        r->leased && bw__lease_eq(l->lease, r->lease) && l->rate.at_ms,
                        r->committed,
                        l->epoch,
                        l->step,
                        l->rate.total[0],
                        l->epoch_steps,
                        l->rate.per_s[0],
                        r->epoch,
                        r->step,
                        unix_ms > r->committed_unix_ms
                            ? (double)(unix_ms - r->committed_unix_ms) / 1000.0
                            : 0.0};
        if ((row.reported || row.committed) && !add_rank(sn, &row)) {
            free(j->name);
            free(j->owner);
            return false;
        }
    }
    j->nrows = sn->nr - j->first;
    sn->nj++;
    return true;
}

/* The jobs' state into sn. False when out of memory (sn holds what was copied). */
static bool copy_jobs(bw_jobs *s, snapshot *sn)
{
    uint64_t mono_ms = bw__mono_ms(), unix_ms = bw__unix_ms();
    bool ok = true;
    pthread_mutex_lock(&s->mu);
    sn->njobs = s->njobs;
    sn->commits = s->commits;
    sn->takeovers_expired = s->takeovers_expired;
    sn->takeovers_reclaimed = s->takeovers_reclaimed;
    sn->lease_ms = bw__jobs_lease_ms(s);
    sn->max_jobs = s->opts.max_jobs;
    sn->max_jobs_per_principal = s->opts.max_jobs_per_principal;
    sn->jobs = calloc(s->njobs + 1, sizeof(*sn->jobs));
    ok = sn->jobs != NULL;
    for (size_t i = 0; ok && i < s->njobs; i++)
        ok = copy_job(sn, s, s->jobs[i], mono_ms, unix_ms);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static int by_owner(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Jobs per owner: the job rows' owners sorted, counted in runs. */
static void emit_quotas(bw__cm *m, bw_metrics_sink *sink, const snapshot *sn)
{
    bw__metrics_emit(sink, m->f[JOBS_LIMIT], (const char *[]){"global"}, sn->max_jobs);
    bw__metrics_emit(sink, m->f[JOBS_LIMIT], (const char *[]){"per_principal"},
                     sn->max_jobs_per_principal);
    char **owners = malloc((sn->nj + 1) * sizeof(*owners));
    if (!owners)
        return; /* this scrape without them */
    for (size_t i = 0; i < sn->nj; i++)
        owners[i] = sn->jobs[i].owner;
    qsort(owners, sn->nj, sizeof(*owners), by_owner);
    for (size_t i = 0, run = 1; i < sn->nj; i++, run++) {
        if (i + 1 < sn->nj && strcmp(owners[i], owners[i + 1]) == 0)
            continue;
        bw__metrics_emit(sink, m->f[PRINCIPAL_JOBS], (const char *[]){owners[i]}, (double)run);
        run = 0;
    }
    free(owners);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One job's rank rows (rows[0 .. j->nrows)) summarised into the JOB_* families. */
static void emit_job_summary(bw__cm *m, bw_metrics_sink *sink, const job_row *j,
                             const rank_row *rows)
{
    size_t reporting = 0, committed = 0;
    double rsum = 0, rmin = 0, rmax = 0, amin = 0, amax = 0;
    uint64_t front = 0;
    for (size_t k = 0; k < j->nrows; k++) {
        const rank_row *r = &rows[k];
        if (r->reported) {
            rmin = reporting == 0 || r->per_s < rmin ? r->per_s : rmin;
            rmax = reporting == 0 || r->per_s > rmax ? r->per_s : rmax;
            rsum += r->per_s;
            uint64_t pos = r->epoch * r->epoch_steps + r->step;
            front = pos > front ? pos : front;
            reporting++;
        }
        if (r->committed) {
            amin = committed == 0 || r->commit_age_s < amin ? r->commit_age_s : amin;
            amax = committed == 0 || r->commit_age_s > amax ? r->commit_age_s : amax;
            committed++;
        }
    }
    const char *name = j->name;
    bw__metrics_emit(sink, m->f[JOB_REPORTING], (const char *[]){name}, (double)reporting);
    bw__metrics_emit(sink, m->f[JOB_COMMITTED], (const char *[]){name}, (double)committed);
    if (committed) {
        bw__metrics_emit(sink, m->f[JOB_COMMIT_AGE], (const char *[]){name, "min"}, amin);
        bw__metrics_emit(sink, m->f[JOB_COMMIT_AGE], (const char *[]){name, "max"}, amax);
    }
    if (!reporting)
        return;
    bw__metrics_emit(sink, m->f[JOB_RATE], (const char *[]){name, "sum"}, rsum);
    bw__metrics_emit(sink, m->f[JOB_RATE], (const char *[]){name, "min"}, rmin);
    bw__metrics_emit(sink, m->f[JOB_RATE], (const char *[]){name, "max"}, rmax);
    uint64_t *lag = malloc(reporting * sizeof(*lag));
    if (!lag)
        return; /* this scrape without the lag */
    size_t n = 0;
    for (size_t k = 0; k < j->nrows; k++)
        if (rows[k].reported)
            lag[n++] = front - (rows[k].epoch * rows[k].epoch_steps + rows[k].step);
    qsort(lag, n, sizeof(*lag), cmp_u64);
    size_t mid = n / 2;
    bw__metrics_emit(sink, m->f[JOB_LAG], (const char *[]){name, "median"}, (double)lag[mid]);
    bw__metrics_emit(sink, m->f[JOB_LAG], (const char *[]){name, "max"}, (double)lag[n - 1]);
    free(lag);
}

static void emit_jobs(bw__cm *m, bw_metrics_sink *sink, const snapshot *sn)
{
    bw__metrics_emit(sink, m->f[JOBS], NULL, (double)sn->njobs);
    bw__metrics_emit(sink, m->f[COMMITS], NULL, (double)sn->commits);
    bw__metrics_emit(sink, m->f[TAKEOVERS], (const char *[]){"expired"},
                     (double)sn->takeovers_expired);
    bw__metrics_emit(sink, m->f[TAKEOVERS], (const char *[]){"reclaimed"},
                     (double)sn->takeovers_reclaimed);
    bw__metrics_emit(sink, m->f[LEASE_LEN], NULL, (double)sn->lease_ms / 1000.0);
    for (size_t i = 0; i < sn->nj; i++) {
        const job_row *j = &sn->jobs[i];
        bw__metrics_emit(sink, m->f[WORLD_SIZE], (const char *[]){j->name}, j->world);
        bw__metrics_emit(sink, m->f[RANKS], (const char *[]){j->name, "held"}, j->held);
        bw__metrics_emit(sink, m->f[RANKS], (const char *[]){j->name, "expired"}, j->expired);
        bw__metrics_emit(sink, m->f[RANKS], (const char *[]){j->name, "free"},
                         j->world - j->held - j->expired);
    }
    for (size_t i = 0; i < sn->nj; i++)
        emit_job_summary(m, sink, &sn->jobs[i], sn->ranks + sn->jobs[i].first);
    for (size_t i = 0; i < sn->nr; i++) {
        const rank_row *r = &sn->ranks[i];
        if ((int64_t)sn->jobs[r->job].world > m->c->cfg->metrics_rank_series)
            continue; /* summarised above */
        char rank[16];
        snprintf(rank, sizeof(rank), "%" PRIu32, r->rank);
        const char *v[] = {sn->jobs[r->job].name, rank};
        if (r->reported) {
            bw__metrics_emit(sink, m->f[RANK_EPOCH], v, (double)r->epoch);
            bw__metrics_emit(sink, m->f[RANK_STEP], v, (double)r->step);
            bw__metrics_emit(sink, m->f[RANK_BATCHES], v, (double)r->batches);
            bw__metrics_emit(sink, m->f[RANK_RATE], v, r->per_s);
        }
        if (r->committed) {
            bw__metrics_emit(sink, m->f[RANK_COMMITTED_EPOCH], v, (double)r->committed_epoch);
            bw__metrics_emit(sink, m->f[RANK_COMMITTED_STEP], v, (double)r->committed_step);
            bw__metrics_emit(sink, m->f[RANK_COMMIT_AGE], v, r->commit_age_s);
        }
    }
}

static void collect(void *user, bw_metrics_sink *sink)
{
    bw__cm *m = user;
    size_t alive = 0, dead = 0;
    bw__membership_counts(m->c->members, &alive, &dead);
    bw__metrics_emit(sink, m->f[WORKERS], (const char *[]){"alive"}, (double)alive);
    bw__metrics_emit(sink, m->f[WORKERS], (const char *[]){"dead"}, (double)dead);
    bw_jobs *s = m->c->jobs;
    bw__metrics_emit(sink, m->f[JOURNAL_BYTES], NULL,
                     (double)bw__journal_bytes_since_snapshot(bw__jobs_journal(s)));
    snapshot sn;
    memset(&sn, 0, sizeof(sn));
    if (copy_jobs(s, &sn)) {
        emit_jobs(m, sink, &sn);
        emit_quotas(m, sink, &sn);
    } else /* a scrape without the jobs' series; the next one tries again */
        BW_WARN("metrics: out of memory copying %llu jobs for a scrape: their series are left "
                "out of this one",
                (unsigned long long)sn.njobs);
    for (size_t i = 0; i < sn.nj; i++) {
        free(sn.jobs[i].name);
        free(sn.jobs[i].owner);
    }
    free(sn.jobs);
    free(sn.ranks);
}

bw__cm *bw__cm_new(bw_metrics *reg, bw_coordinator *c, int *rc)
{
    *rc = BW_OK;
    if (!reg)
        return NULL;
    bw__cm *m = calloc(1, sizeof(*m));
    bool ok = m != NULL;
    for (int i = 0; ok && i < NCOLLECTED; i++)
        ok = (m->f[i] = bw__metrics_add_collected(reg, &COLLECTED[i])) != NULL;
    if (ok) {
        m->c = c;
        m->fsync = bw__metric_series(bw__metrics_add(reg, &FSYNC), NULL);
        m->synced = bw__metric_series(bw__metrics_add(reg, &SYNCED), NULL);
        ok = m->fsync && m->synced && bw__metrics_add_collector(reg, collect, m, NULL) == BW_OK;
    }
    if (!ok) {
        free(m); /* families already added stay in the registry, unused */
        *rc = BW_NOMEM;
        return NULL;
    }
    bw__journal_set_sync_hook(bw__jobs_journal(c->jobs), on_sync, m);
    return m;
}

void bw__cm_free(bw__cm *m)
{
    if (!m)
        return;
    bw__journal_set_sync_hook(bw__jobs_journal(m->c->jobs), NULL, NULL);
    free(m);
}
