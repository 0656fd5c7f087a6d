/*
 * The worker's transform pool (docs/transforms.md, "On the workers"; --transform-threads): a
 * fixed set of threads, each with its own transform scratch, that run the samples of a read's
 * window in parallel. Windows are queued per principal (the caller the read is served for:
 * its grant's job, else its peer's address; docs/transforms.md, "Fairness"): the threads take
 * one sample at a time from each principal with queued work in turn (round robin), and each
 * principal's windows in arrival order. A principal that queues many windows therefore delays
 * another's by at most one sample per turn, not by its whole queue.
 *
 * Thread-safety: bw__tfpool_run and bw__tfpool_pending may be called from any number of
 * threads at once.
 */
#ifndef BW_WORKER_TRANSFORM_POOL_H
#define BW_WORKER_TRANSFORM_POOL_H

#include <stddef.h>

typedef struct bw__tfpool bw__tfpool;

/* The longest principal key the pool tells apart (longer keys are compared by this prefix). */
enum { BW_TFPOOL_WHO_MAX = 96 };

/* Starts `threads` threads (>= 1). BW_OK, or BW_NOMEM / BW_INTERNAL with a sentence. */
int bw__tfpool_start(int threads, bw__tfpool **out, char *err, size_t errlen);

/* Stops the threads once the queued windows are done and frees the pool. NULL is a no-op.
 * Nothing may be run after it. */
void bw__tfpool_stop(bw__tfpool *p);

/* Runs fn(arg, i) for every i in [0, n) on the pool's threads (in any order, at once on
 * several) and returns when every call has returned. `who` (borrowed; NULL or "": one
 * anonymous principal) is the principal the window is queued for. With p NULL, runs them on
 * the caller's thread. */
void bw__tfpool_run(bw__tfpool *p, const char *who, void (*fn)(void *arg, size_t i), void *arg,
                    size_t n);

/* The samples queued for principal `who` (NULL: every principal) and not yet handed to a
 * thread; 0 for NULL p. */
size_t bw__tfpool_pending(bw__tfpool *p, const char *who);

/* The number of threads. */
int bw__tfpool_threads(const bw__tfpool *p);

#endif
