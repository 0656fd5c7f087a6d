/*
 * The worker's bounded executor: a few threads for the work a request does before its first
 * byte goes out (opening, indexing and checking a dataset), and admission by bytes. Every
 * request in progress holds a charge -- its body, the most its decoding may allocate and its
 * response buffers -- against one budget (--inflight-bytes). A request that does not fit
 * waits a bounded time for room and then gets BW_BUSY with a retry hint; one that could never
 * fit gets BW_TOO_BIG at once. Both transports, gRPC and the data channel, go through it
 * (docs/data-channel.md, "Memory and admission").
 *
 * Thread-safety: every function may be called from any thread, except bw__exec_stop.
 */
#ifndef BW_WORKER_EXECUTOR_H
#define BW_WORKER_EXECUTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bw__exec bw__exec;

/* Bounds of the retry hint that comes with BW_BUSY (milliseconds). */
enum { BW_EXEC_HINT_MIN_MS = 50, BW_EXEC_HINT_MAX_MS = 10000 };

typedef struct bw__exec_opts {
    int threads;             /* pool threads (>= 1) */
    uint64_t budget;         /* bytes the requests in progress may hold together (> 0) */
    int wait_ms;             /* how long a request waits for room before BW_BUSY */
    const char *budget_flag; /* the setting that sets `budget`, for messages */
} bw__exec_opts;

/* A unit of work, embedded in its owner's state: the executor allocates nothing per task.
 * The fields after `why` are the executor's. */
typedef struct bw__exec_task bw__exec_task;
typedef void (*bw__exec_fn)(bw__exec_task *t, int rc);
struct bw__exec_task {
    bw__exec_fn fn;
    uint64_t charge;
    uint32_t retry_after_ms; /* with rc BW_BUSY: when room is likely */
    char why[256];           /* with rc other than BW_OK: a sentence naming the budget */
    uint64_t deadline_ms;
    bw__exec_task *next;
    bool sync, done;
};

/* Starts the pool. BW_OK, or BW_INVALID_ARGUMENT / BW_NOMEM / BW_INTERNAL with a sentence. */
int bw__exec_start(const bw__exec_opts *o, bw__exec **out, char *err, size_t errlen);

/* Ends the pool: tasks still queued, and requests waiting in bw__exec_admit, get
 * BW_UNAVAILABLE; joins the threads and frees everything. Nothing may be submitted after it.
 * NULL is a no-op. */
void bw__exec_stop(bw__exec *x);

/*
 * Queues t: t->fn(t, rc) is called exactly once, on a pool thread, with
 *   BW_OK          `charge` bytes were admitted: the caller holds them until bw__exec_release;
 *   BW_BUSY        no room came within wait_ms (t->retry_after_ms, t->why);
 *   BW_TOO_BIG     charge is more than the whole budget (t->why);
 *   BW_UNAVAILABLE the executor is stopping.
 * Tasks run in the order they were queued among those that fit; charge 0 always fits. t must
 * stay valid until fn is called; fn may free it.
 */
void bw__exec_submit(bw__exec *x, bw__exec_task *t, uint64_t charge, bw__exec_fn fn);

/* Runs fn(t, BW_OK or BW_UNAVAILABLE) on a pool thread without a charge and waits until it has
 * returned: for work that must not run on the caller's thread all at once (the data channel
 * opens datasets through the pool, as gRPC does). */
void bw__exec_run(bw__exec *x, bw__exec_task *t, bw__exec_fn fn);

/* Admission on the caller's thread: BW_OK once `charge` fits (held until bw__exec_release),
 * BW_BUSY with *retry_after_ms after waiting wait_ms, BW_TOO_BIG at once when charge is more
 * than the whole budget, BW_UNAVAILABLE when stopping; a sentence in why on failure. */
int bw__exec_admit(bw__exec *x, uint64_t charge, uint32_t *retry_after_ms, char *why,
                   size_t whylen);

/* Gives back a charge admitted by bw__exec_admit or a task (0 is a no-op). */
void bw__exec_release(bw__exec *x, uint64_t charge);

/* A held charge of `from` bytes becomes `to` (at most from): the difference is given back now,
 * `to` later with bw__exec_release. For memory a request no longer needs (its body once
 * decoded). */
void bw__exec_shrink(bw__exec *x, uint64_t from, uint64_t to);

/* Bytes held now (for tests and logs). */
uint64_t bw__exec_held(bw__exec *x);

#endif
