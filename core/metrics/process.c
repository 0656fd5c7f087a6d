/* The process_* families every Prometheus client library exports, read from /proc and
 * getrusage at each scrape (metrics.h, bw__metrics_add_process). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "metrics/metrics.h"

static const bw_metric_def DEFS[] = {
    BW_METRIC_DEF("process_cpu_seconds_total", BW_COUNTER,
                  "User and system CPU time of the process, in seconds", NULL),
    BW_METRIC_DEF("process_resident_memory_bytes", BW_GAUGE,
                  "Resident memory of the process, in bytes", NULL),
    BW_METRIC_DEF("process_virtual_memory_bytes", BW_GAUGE,
                  "Virtual memory of the process, in bytes", NULL),
    BW_METRIC_DEF("process_open_fds", BW_GAUGE, "File descriptors the process has open", NULL),
    BW_METRIC_DEF("process_max_fds", BW_GAUGE, "The process's limit on open file descriptors",
                  NULL),
    BW_METRIC_DEF("process_start_time_seconds", BW_GAUGE,
                  "When the process started, in seconds since the Unix epoch", NULL),
};
enum { CPU, RSS, VSZ, FDS, MAX_FDS, START, NDEFS };

typedef struct proc {
    bw_metric *f[NDEFS];
    double start; /* seconds since the epoch; 0: unknown */
} proc;

/* Seconds since the epoch at which this process started: its start in clock ticks after
 * boot (/proc/self/stat, field 22) plus the boot time (/proc/stat, btime). 0 when unknown. */
static double start_time(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ticks = 0;
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    char *end = NULL;
    if (p) /* strtoull rather than sscanf: a field that is no number is seen (cert-err34-c) */
        ticks = strtoull(p + 1, &end, 10);
    if (!p || end == p + 1)
        return 0;
    unsigned long long btime = 0;
    char line[256];
    f = fopen("/proc/stat", "r");
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, "btime ", 6) == 0) {
            btime = strtoull(line + 6, NULL, 10);
            break;
        }
    if (f)
        fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    return btime && hz > 0 ? (double)btime + (double)ticks / (double)hz : 0;
}

static size_t open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    size_t n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n > 0 ? n - 1 : 0; /* the directory's own descriptor */
}

static void collect(void *user, bw_metrics_sink *sink)
{
    proc *p = user;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        /* whole microseconds, divided once: 0.022363, not 0.022362999999999997 */
        long long us = (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 +
                       ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
        bw__metrics_emit(sink, p->f[CPU], NULL, (double)us / 1e6);
    }
    unsigned long long vsz = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    char line[128], *end = NULL;
    if (f && fgets(line, sizeof(line), f)) {
        vsz = strtoull(line, &end, 10);
        rss = strtoull(end, &end, 10);
    }
    if (end && end != line) {
        double page = (double)sysconf(_SC_PAGESIZE);
        bw__metrics_emit(sink, p->f[RSS], NULL, (double)rss * page);
        bw__metrics_emit(sink, p->f[VSZ], NULL, (double)vsz * page);
    }
    if (f)
        fclose(f);
    bw__metrics_emit(sink, p->f[FDS], NULL, (double)open_fds());
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        bw__metrics_emit(sink, p->f[MAX_FDS], NULL, (double)rl.rlim_cur);
    if (p->start > 0)
        bw__metrics_emit(sink, p->f[START], NULL, p->start);
}

int bw__metrics_add_process(bw_metrics *m)
{
    if (!m)
        return BW_OK;
    proc *p = calloc(1, sizeof(*p));
    if (!p)
        return BW_NOMEM;
    for (int i = 0; i < NDEFS; i++)
        if (!(p->f[i] = bw__metrics_add_collected(m, &DEFS[i]))) {
            free(p);
            return BW_NOMEM;
        }
    p->start = start_time();
    int rc = bw__metrics_add_collector(m, collect, p, free);
    if (rc != BW_OK)
        free(p);
    return rc;
}
