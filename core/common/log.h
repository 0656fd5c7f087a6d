/* Leveled logging: one line per event, context in the line ("worker=w1 peer=..."). The
 * level is checked before anything is formatted. Daemons log to stderr; the client library
 * logs only through the callback its embedder sets (bw_set_log_callback). */
#ifndef BW_COMMON_LOG_H
#define BW_COMMON_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "batchwire/batchwire.h"

/* The most verbose level currently emitted; -1 when logging is off. */
extern int bw__log_max_level;

void bw__log_write(bw_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define BW_LOG(lvl, ...)                                                                           \
    do {                                                                                           \
        if ((int)(lvl) <= bw__log_max_level)                                                       \
            bw__log_write((lvl), __VA_ARGS__);                                                     \
    } while (0)
#define BW_ERROR(...) BW_LOG(BW_LOG_ERROR, __VA_ARGS__)
#define BW_WARN(...) BW_LOG(BW_LOG_WARN, __VA_ARGS__)
#define BW_INFO(...) BW_LOG(BW_LOG_INFO, __VA_ARGS__)
#define BW_DEBUG(...) BW_LOG(BW_LOG_DEBUG, __VA_ARGS__)

/*
 * The failure rule (docs/architecture.md, "Failure"): library code never aborts or exits on
 * bad input or on allocation failure -- it returns BW_NOMEM or another error with a
 * sentence. Only a broken invariant stops a process: BW_INVARIANT(cond, what) writes
 * "invariant broken: WHAT (FILE:LINE)" to stderr, whatever the log level, and aborts. `what`
 * names the invariant ("a slot handed out is HELD"), never the input that reached it: input
 * is validated, so a breach is a bug, and continuing would corrupt data.
 */
void bw__invariant_broken(const char *what, const char *file, int line) __attribute__((noreturn));
#define BW_INVARIANT(cond, what)                                                                   \
    do {                                                                                           \
        if (!(cond))                                                                               \
            bw__invariant_broken((what), __FILE__, __LINE__);                                      \
    } while (0)

/*
 * Daemons and tools: log lines to stderr, one write(2) per line. Messages are written as
 * "what happened key=value key=value ..." (docs/operating.md, "Logs"): the text, then the
 * event's context as fields. In the text format a line is
 *     TIME LEVEL component[pid]: what happened key=value ...
 * In the JSON format it is one object per line,
 *     {"ts":"TIME","level":"info","component":"worker","pid":N,"msg":"what
 * happened","key":"value",...} where every word `key=value` is a field (key: a-z, 0-9, _ and -,
 * starting with a letter; not ts, level, component, pid or msg; the first of each key) and the
 * other words, in order, are msg. A value is one word, except err=, which takes the rest of the
 * line (so it comes last and may hold a sentence). Values are strings.
 */
typedef enum bw__log_format { BW_LOG_FORMAT_TEXT = 0, BW_LOG_FORMAT_JSON = 1 } bw__log_format;
#define BW_LOG_FORMAT_CHOICES "text|json"

void bw__log_to_stderr(const char *component, bw_log_level max_level);
void bw__log_set_format(bw__log_format format);

/*
 * A status line (progress on a terminal, core/common/progress.h). When the process logs to
 * stderr in the text format and stderr is a terminal, bw__log_has_status_line is true and
 * bw__log_status_line shows `text` as the one line that updates in place at the bottom (NULL
 * removes it); log lines written meanwhile appear above it. Otherwise it does nothing: report
 * with log lines instead.
 */
bool bw__log_has_status_line(void);
void bw__log_status_line(const char *text);

/*
 * A limit for lines about events a peer can cause at will (refused requests, malformed
 * connections): at most one line a second from one limit, so that a hostile client cannot
 * flood the log. bw__log_limit_allow says whether a line may be written now, and *quiet how
 * many were left out since the last one (say so in the line). Zero-initialised; thread-safe.
 */
typedef struct bw_log_limit {
    atomic_uint_fast64_t logged_ms, quiet;
} bw_log_limit;
bool bw__log_limit_allow(bw_log_limit *l, uint64_t *quiet);

/* A line at `level` under the limit l: written when the level is on and l allows it, with
 * "not_logged_before=N" first when N lines were left out since the last one. */
void bw__log_limited(bw_log_limit *l, bw_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parses "error", "warn", "info", "debug"; returns BW_OK or BW_INVALID_ARGUMENT. */
int bw__log_level_parse(const char *text, bw_log_level *out);

const char *bw__log_level_name(bw_log_level level);

#endif
