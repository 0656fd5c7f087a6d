/*
 * The worker's transform pool (docs/transforms.md, "On the workers"; --transform-threads): a
 * fixed set of threads, each with its own transform scratch, that run the samples of a read's
 * window in parallel. Reads queue their windows in arrival order and the threads take the
 * samples of the oldest window first, so a read waits for at most the windows queued before
 * its own, whoever sent them.
 *
 * Thread-safety: bw__tfpool_run may be called from any number of threads at once.
 */
#ifndef BW_WORKER_TRANSFORM_POOL_H
#define BW_WORKER_TRANSFORM_POOL_H

#include <stddef.h>

typedef struct bw__tfpool bw__tfpool;

/* Starts `threads` threads (>= 1). BW_OK, or BW_NOMEM / BW_INTERNAL with a sentence. */
int bw__tfpool_start(int threads, bw__tfpool **out, char *err, size_t errlen);

/* Stops the threads once the queued windows are done and frees the pool. NULL is a no-op.
 * Nothing may be run after it. */
void bw__tfpool_stop(bw__tfpool *p);

/* Runs fn(arg, i) for every i in [0, n) on the pool's threads (in any order, at once on
 * several) and returns when every call has returned. With p NULL, runs them on the caller's
 * thread. */
void bw__tfpool_run(bw__tfpool *p, void (*fn)(void *arg, size_t i), void *arg, size_t n);

/* The number of threads. */
int bw__tfpool_threads(const bw__tfpool *p);

#endif
