/* Progress reports of long work (progress.h): the status line or periodic log lines, with
 * the share done, the rate and the time left. */
#include "common/progress.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

uint64_t bw__progress_interval_ms = 5000;

/* A terminal's status line is redrawn this often; the first one waits as long, so that
 * quick work shows nothing. */
enum { TTY_REFRESH_MS = 250 };

void bw__progress_begin(bw__progress *p, const char *what, bool bytes, uint64_t total)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->what, sizeof(p->what), "%s", what);
    p->bytes = bytes;
    p->total = total;
    p->start_ms = bw__mono_ms();
    p->tty = bw__log_has_status_line();
    p->next_ms = p->start_ms + (p->tty ? TTY_REFRESH_MS : bw__progress_interval_ms);
}

static void amount(char *out, size_t len, bool bytes, double v)
{
    if (!bytes)
        snprintf(out, len, "%.0f", v);
    else if (v >= 1024.0 * 1024 * 1024)
        snprintf(out, len, "%.1fGiB", v / (1024.0 * 1024 * 1024));
    else if (v >= 1024.0 * 1024)
        snprintf(out, len, "%.1fMiB", v / (1024.0 * 1024));
    else
        snprintf(out, len, "%.1fKiB", v / 1024.0);
}

/* "WHAT done=... total=... pct=... rate=.../s eta=...s" (no total: no pct or eta). */
static void describe(const bw__progress *p, uint64_t now, char *out, size_t len)
{
    double secs = (double)(now - p->start_ms) / 1000.0;
    double rate = secs > 0 ? (double)p->done / secs : 0;
    char done[32], total[32], per[32];
    amount(done, sizeof(done), p->bytes, (double)p->done);
    amount(total, sizeof(total), p->bytes, (double)p->total);
    amount(per, sizeof(per), p->bytes, rate);
    int n = snprintf(out, len, "%s done=%s", p->what, done);
    if (p->total && n > 0 && (size_t)n < len)
        n += snprintf(out + n, len - (size_t)n, " total=%s pct=%.1f", total,
                      100.0 * (double)p->done / (double)p->total);
    if (n > 0 && (size_t)n < len)
        n += snprintf(out + n, len - (size_t)n, " rate=%s/s", per);
    if (p->total && rate > 0 && p->done <= p->total && n > 0 && (size_t)n < len)
        snprintf(out + n, len - (size_t)n, " eta=%.0fs", (double)(p->total - p->done) / rate);
}

void bw__progress_tick(bw__progress *p)
{
    if (bw__progress_interval_ms == 0)
        return;
    uint64_t now = bw__mono_ms();
    if (now < p->next_ms)
        return;
    char line[512];
    describe(p, now, line, sizeof(line));
    if (p->tty) {
        bw__log_status_line(line);
        p->next_ms = now + TTY_REFRESH_MS;
    } else {
        BW_INFO("%s state=running", line);
        p->next_ms = now + bw__progress_interval_ms;
    }
    p->shown = true;
}

void bw__progress_end(bw__progress *p, bool ok)
{
    if (!p->shown)
        return;
    uint64_t now = bw__mono_ms();
    char line[512];
    describe(p, now, line, sizeof(line));
    if (p->tty)
        bw__log_status_line(NULL);
    BW_INFO("%s state=%s elapsed=%.1fs", line, ok ? "done" : "failed",
            (double)(now - p->start_ms) / 1000.0);
    p->shown = false;
}
