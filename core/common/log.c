/* The logger (log.h): levels, the text and JSON line formats, the status line of a terminal,
 * rate-limited warnings, the failure rule's report (BW_INVARIANT), and the embedder's
 * callback for the client library. */
#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/json.h"

int bw__log_max_level = -1;

static bw_log_fn log_fn;
static void *log_user;
static const char *log_component = "batchwire";
static bw__log_format log_format = BW_LOG_FORMAT_TEXT;

/* The status line on a terminal (bw__log_status_line), redrawn below each log line. */
static pthread_mutex_t stderr_mu = PTHREAD_MUTEX_INITIALIZER;
static bool stderr_is_tty;
static char status_text[512];
static bool status_shown;

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
static const char *const level_json[] = {"error", "warn", "info", "debug"};

enum { LINE_MAX_BYTES = 8192, MSG_MAX_BYTES = 4000, MAX_FIELDS = 32 };

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

static void write_all(const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, buf, n);
        if (w <= 0)
            return;
        buf += w;
        n -= (size_t)w;
    }
}

static void stderr_sink(void *user, bw_log_level level, const char *line)
{
    (void)user;
    (void)level;
    /* One write per line keeps lines from different threads whole; a status line on the
     * terminal is erased first and drawn again below. */
    char buf[LINE_MAX_BYTES + sizeof(status_text) + 16];
    size_t n = 0, len = strlen(line);
    if (len > LINE_MAX_BYTES)
        len = LINE_MAX_BYTES;
    pthread_mutex_lock(&stderr_mu);
    if (status_shown) {
        memcpy(buf, "\r\033[K", 4);
        n = 4;
    }
    memcpy(buf + n, line, len);
    n += len;
    buf[n++] = '\n';
    if (status_shown) {
        size_t sl = strlen(status_text);
        memcpy(buf + n, status_text, sl);
        n += sl;
    }
    write_all(buf, n);
    pthread_mutex_unlock(&stderr_mu);
}

void bw__log_to_stderr(const char *component, bw_log_level max_level)
{
    log_component = component;
    log_fn = stderr_sink;
    log_user = NULL;
    bw__log_max_level = (int)max_level;
    stderr_is_tty = isatty(STDERR_FILENO) == 1;
}

void bw__log_set_format(bw__log_format format)
{
    log_format = format;
}

void bw_set_log_callback(bw_log_fn fn, void *user, bw_log_level max_level)
{
    log_fn = fn;
    log_user = user;
    bw__log_max_level = fn ? (int)max_level : -1;
}

bool bw__log_has_status_line(void)
{
    return log_fn == stderr_sink && stderr_is_tty && log_format == BW_LOG_FORMAT_TEXT;
}

void bw__log_status_line(const char *text)
{
    if (!bw__log_has_status_line())
        return;
    char buf[sizeof(status_text) + 8];
    pthread_mutex_lock(&stderr_mu);
    memcpy(buf, "\r\033[K", 4);
    size_t n = 4;
    if (text) {
        snprintf(status_text, sizeof(status_text), "%s", text);
        size_t sl = strlen(status_text);
        memcpy(buf + n, status_text, sl);
        n += sl;
    }
    status_shown = text != NULL;
    if (!text)
        status_text[0] = '\0';
    write_all(buf, n);
    pthread_mutex_unlock(&stderr_mu);
}

static void append(char *out, size_t cap, size_t *len, const char *s)
{
    size_t n = strlen(s);
    if (*len + n + 1 > cap)
        n = cap - *len - 1;
    memcpy(out + *len, s, n);
    *len += n;
    out[*len] = '\0';
}

static bool reserved(const char *key, size_t len)
{
    static const char *const names[] = {"ts", "level", "component", "pid", "msg"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strlen(names[i]) == len && memcmp(names[i], key, len) == 0)
            return true;
    return false;
}

/* The length of the key when the word at w (len n) is a field `key=value`, else 0. */
static size_t key_of(const char *w, size_t n)
{
    if (n < 2 || !(w[0] >= 'a' && w[0] <= 'z'))
        return 0;
    size_t j = 1;
    while (j < n && ((w[j] >= 'a' && w[j] <= 'z') || (w[j] >= '0' && w[j] <= '9') || w[j] == '_' ||
                     w[j] == '-'))
        j++;
    return j < n && w[j] == '=' && !reserved(w, j) ? j : 0;
}

/* Appends one JSON member "key":"value" (key and value escaped; the value cut to fit). */
static void member(char *out, size_t room, size_t *len, const char *k, size_t kl, const char *v,
                   size_t vl)
{
    if (*len + kl * 6 + 16 >= room)
        return; /* no room for it whole: left out */
    append(out, room, len, ",\"");
    bw__json_escape(out, room, len, k, kl);
    append(out, room, len, "\":\"");
    bw__json_escape(out, room - 1, len, v, vl); /* leaves room for the closing quote */
    append(out, room, len, "\"");
}

/* The JSON object of one event into out: always a complete object (docs/operating.md,
 * "Logs"). The message's words `key=value` become members (the first of each key; err= takes
 * the rest of the line); the other words, in order, are "msg". */
static void json_line(char *out, size_t cap, const char *ts, bw_log_level level, const char *msg)
{
    char text[MSG_MAX_BYTES], fields[LINE_MAX_BYTES];
    size_t tl = 0, fl = 0;
    fields[0] = '\0';
    size_t seen[MAX_FIELDS][2], nseen = 0; /* keys taken: offset and length in msg */
    size_t ends[MAX_FIELDS], nends = 0;    /* where each member ends in fields */
    for (const char *p = msg; *p;) {
        while (*p == ' ')
            p++;
        size_t n = strcspn(p, " ");
        if (!n)
            break;
        size_t kl = key_of(p, n);
        for (size_t i = 0; kl && i < nseen; i++)
            if (seen[i][1] == kl && memcmp(msg + seen[i][0], p, kl) == 0)
                kl = 0; /* a key seen before is part of the text */
        if (kl && nseen == MAX_FIELDS)
            kl = 0;
        if (kl == 3 && memcmp(p, "err", 3) == 0) {
            size_t vl = strlen(p + 4);
            while (vl && p[4 + vl - 1] == ' ')
                vl--;
            member(fields, sizeof(fields), &fl, p, kl, p + 4, vl);
            ends[nends++] = fl;
            break;
        }
        if (kl) {
            seen[nseen][0] = (size_t)(p - msg);
            seen[nseen++][1] = kl;
            member(fields, sizeof(fields), &fl, p, kl, p + kl + 1, n - kl - 1);
            ends[nends++] = fl;
        } else {
            if (tl)
                text[tl++] = ' ';
            memcpy(text + tl, p, n);
            tl += n;
        }
        p += n;
    }
    /* What closes the object is always given room: the parts before it stop short of it. */
    size_t room = cap - 4, len = 0;
    char head[160];
    snprintf(head, sizeof(head), "{\"ts\":\"%s\",\"level\":\"%s\",\"component\":\"", ts,
             (unsigned)level < 4 ? level_json[level] : "?");
    append(out, room, &len, head);
    bw__json_escape(out, room, &len, log_component, strlen(log_component));
    snprintf(head, sizeof(head), "\",\"pid\":%d,\"msg\":\"", (int)getpid());
    append(out, room, &len, head);
    bw__json_escape(out, room - 1, &len, text, tl);
    append(out, room, &len, "\"");
    /* Whole members only: one that does not fit is left out with those after it. */
    for (size_t i = 0, at = 0; i < nends; at = ends[i++]) {
        size_t n = ends[i] - at;
        if (len + n + 1 >= room)
            break;
        memcpy(out + len, fields + at, n);
        len += n;
        out[len] = '\0';
    }
    append(out, cap, &len, "}");
}

void bw__log_write(bw_log_level level, const char *fmt, ...)
{
    bw_log_fn fn = log_fn;
    if (!fn)
        return;
    char msg[MSG_MAX_BYTES], ts[96];
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(now.tv_nsec / 1000000));
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n < 0)
        msg[0] = '\0';
    /* Keep one event on one line whatever the message held. */
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    char line[LINE_MAX_BYTES];
    if (log_format == BW_LOG_FORMAT_JSON)
        json_line(line, sizeof(line), ts, level, msg);
    else
        snprintf(line, sizeof(line), "%s %-5s %s[%d]: %s", ts, bw__log_level_name(level),
                 log_component, (int)getpid(), msg);
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

void bw__log_limited(bw_log_limit *l, bw_log_level level, const char *fmt, ...)
{
    uint64_t quiet;
    if ((int)level > bw__log_max_level || !bw__log_limit_allow(l, &quiet))
        return;
    char line[1800];
    va_list ap;
    va_start(ap, fmt);
    /* va_start is the line above: clang-analyzer 14 loses it on some callers' paths. */
    vsnprintf(line, sizeof(line), fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
    va_end(ap);
    if (quiet)
        bw__log_write(level, "not_logged_before=%llu %s", (unsigned long long)quiet, line);
    else
        bw__log_write(level, "%s", line);
}

bool bw__log_limit_allow(bw_log_limit *l, uint64_t *quiet)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    uint64_t last = atomic_load(&l->logged_ms);
    if ((last && now - last < 1000) || !atomic_compare_exchange_strong(&l->logged_ms, &last, now)) {
        atomic_fetch_add(&l->quiet, 1);
        return false;
    }
    *quiet = atomic_exchange(&l->quiet, 0);
    return true;
}
