#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int bw__log_max_level = -1;

static bw_log_fn log_fn;
static void *log_user;
static const char *log_component = "batchwire";

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

const char *bw__log_level_name(bw_log_level level)
{
    if ((unsigned)level < sizeof(level_names) / sizeof(level_names[0]))
        return level_names[level];
    return "?";
}

int bw__log_level_parse(const char *text, bw_log_level *out)
{
    for (unsigned i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
        if (strcasecmp(text, level_names[i]) == 0) {
            *out = (bw_log_level)i;
            return BW_OK;
        }
    }
    if (strcasecmp(text, "warning") == 0) {
        *out = BW_LOG_WARN;
        return BW_OK;
    }
    return BW_INVALID_ARGUMENT;
}

static void stderr_sink(void *user, bw_log_level level, const char *line)
{
    (void)user;
    (void)level;
    /* One write per line keeps lines from different threads whole. */
    size_t n = strlen(line);
    char buf[4096];
    if (n > sizeof(buf) - 1)
        n = sizeof(buf) - 1;
    memcpy(buf, line, n);
    buf[n] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, n + 1);
    (void)w;
}

void bw__log_to_stderr(const char *component, bw_log_level max_level)
{
    log_component = component;
    log_fn = stderr_sink;
    log_user = NULL;
    bw__log_max_level = (int)max_level;
}

void bw_set_log_callback(bw_log_fn fn, void *user, bw_log_level max_level)
{
    log_fn = fn;
    log_user = user;
    bw__log_max_level = fn ? (int)max_level : -1;
}

void bw__log_write(bw_log_level level, const char *fmt, ...)
{
    bw_log_fn fn = log_fn;
    if (!fn)
        return;
    char line[4000];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s[%d]: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, bw__log_level_name(level), log_component, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof(line))
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    /* Keep one event on one line whatever the message held. */
    for (char *p = line; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    fn(log_user, level, line);
}

void bw__invariant_broken(const char *what, const char *file, int line)
{
    /* Also through the embedder's callback when there is one, then always on stderr: the
     * process is about to stop and the line is the only account of why. */
    BW_ERROR("invariant broken: %s (%s:%d)", what, file, line);
    fprintf(stderr, "batchwire: invariant broken: %s (%s:%d)\n", what, file, line);
    fflush(stderr);
    abort();
}
