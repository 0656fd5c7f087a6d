/*
 * Progress of long work (writing a dataset with `batchwire gen`, opening and indexing one in
 * a worker): how much is done, the share of the total, the rate and the time left. On a
 * terminal (the process logs to stderr in the text format and stderr is a tty) one status
 * line updates in place a few times a second (core/common/log.h); otherwise a log line
 *     indexing dataset=tfrecord:a.tfrecord done=1.2GiB total=4.0GiB pct=30.0 rate=410.3MiB/s eta=7s
 * state=running every bw__progress_interval_ms. Work that ends before the first report shows
 * nothing; work that was reported ends with a line with state=done (or failed) and the time it
 * took.
 *
 * One reporter is used by one thread. bw__progress_update is cheap (the clock is read every
 * 64th call), so it can be called per record.
 */
#ifndef BW_COMMON_PROGRESS_H
#define BW_COMMON_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

/* How often a log line reports progress (ms; 0: never, not even on a terminal). Programs set
 * it from their settings before starting work (daemons: --progress-ms); default 5000. */
extern uint64_t bw__progress_interval_ms;

typedef struct bw__progress {
    char what[256]; /* "indexing dataset=npy:train.npy": the text and fields first shown */
    bool bytes;     /* counts are bytes (shown in KiB/MiB/GiB), else items */
    uint64_t total; /* 0: unknown (no share and no time left) */
    uint64_t done;
    uint64_t start_ms, next_ms; /* next report due */
    bool tty, shown;
    unsigned calls;
} bw__progress;

/* Starts reporting `what` (a message in the log's style: text then key=value fields) of
 * `total` items or bytes. */
void bw__progress_begin(bw__progress *p, const char *what, bool bytes, uint64_t total);

/* Reports when one is due (called by bw__progress_update). */
void bw__progress_tick(bw__progress *p);

/* Sets how much is done (not added: the count so far). */
static inline void bw__progress_update(bw__progress *p, uint64_t done)
{
    p->done = done;
    if ((++p->calls & 63) == 0)
        bw__progress_tick(p);
}

/* As bw__progress_update, reading the clock every time: for steps that each take long. */
static inline void bw__progress_set(bw__progress *p, uint64_t done)
{
    p->done = done;
    bw__progress_tick(p);
}

/* Ends the work: when anything was shown, a last line with state=done (ok) or state=failed
 * and the time taken, and the status line removed. */
void bw__progress_end(bw__progress *p, bool ok);

#endif
