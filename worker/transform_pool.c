/* The worker's transform pool (transform_pool.h). */
#include "transform_pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"

/* One bw__tfpool_run call: lives on its caller's stack until every item is done, so queuing
 * allocates nothing. The pool's ring holds the oldest window of each principal with items
 * not yet handed out; the principal's later windows wait in a FIFO behind it (`later`, whose
 * last one the ring's window points to with `last`). */
typedef struct window {
    void (*fn)(void *arg, size_t i);
    void *arg;
    size_t n, next, done; /* items: total, handed out, finished */
    pthread_cond_t done_cv;
    char who[BW_TFPOOL_WHO_MAX];
    struct window *prev, *succ;  /* the ring (only while in it) */
    struct window *later, *last; /* the principal's FIFO behind it */
} window;

struct bw__tfpool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    window *turn; /* the ring window whose principal is served next; NULL: nothing queued */
    bool stopping;
    int nthreads;
    pthread_t *threads;
};

/* The ring window after w, NULL once the walk from p->turn is back at its start. */
static window *ring_next(const bw__tfpool *p, const window *w)
{
    return w->succ == p->turn ? NULL : w->succ;
}

/* The ring window of principal `who`, or NULL. The ring has one window per principal with
 * queued work: a worker holds a few dozen reads at most, so a walk costs little next to one
 * sample's decode. */
static window *ring_find(bw__tfpool *p, const char *who)
{
    for (window *w = p->turn; w; w = ring_next(p, w))
        if (strcmp(w->who, who) == 0)
            return w;
    return NULL;
}

/* Puts w (not in the ring) where `at` is (in it), or removes `at` when w is NULL. */
static void ring_replace(bw__tfpool *p, window *at, window *w)
{
    if (w) {
        bool alone = at->succ == at;
        w->prev = alone ? w : at->prev;
        w->succ = alone ? w : at->succ;
        w->prev->succ = w;
        w->succ->prev = w;
        w->last = at->last == w ? NULL : at->last;
        if (p->turn == at)
            p->turn = w;
    } else if (at->succ == at) {
        p->turn = NULL;
    } else {
        at->prev->succ = at->succ;
        at->succ->prev = at->prev;
        if (p->turn == at)
            p->turn = at->succ;
    }
}

/* Queues w: behind its principal's windows, or as a new principal last in the round. */
static void enqueue(bw__tfpool *p, window *w)
{
    window *head = ring_find(p, w->who);
    if (head) {
        (head->last ? head->last : head)->later = w;
        head->last = w;
    } else if (!p->turn) {
        w->prev = w->succ = p->turn = w;
    } else { /* before the turn: served once every principal queued before it had its turn */
        w->succ = p->turn;
        w->prev = p->turn->prev;
        w->prev->succ = w;
        p->turn->prev = w;
    }
}

static void *worker_main(void *arg)
{
    bw__tfpool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->turn && !p->stopping)
            pthread_cond_wait(&p->work_cv, &p->mu);
        if (!p->turn)
            break; /* stopping, and nothing left */
        window *w = p->turn;
        size_t i = w->next++;
        p->turn = w->succ;   /* the next principal's turn */
        if (w->next == w->n) /* every item handed out: the principal's next window, if any */
            ring_replace(p, w, w->later);
        pthread_mutex_unlock(&p->mu);
        w->fn(w->arg, i);
        pthread_mutex_lock(&p->mu);
        if (++w->done == w->n)
            pthread_cond_signal(&w->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int bw__tfpool_start(int threads, bw__tfpool **out, char *err, size_t errlen)
{
    *out = NULL;
    bw__tfpool *p = calloc(1, sizeof(*p));
    if (!p || !(p->threads = calloc((size_t)(threads > 0 ? threads : 1), sizeof(pthread_t)))) {
        free(p);
        snprintf(err, errlen, "out of memory for a transform pool of %d threads", threads);
        return BW_NOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    while (p->nthreads < threads &&
           pthread_create(&p->threads[p->nthreads], NULL, worker_main, p) == 0)
        p->nthreads++;
    if (p->nthreads < threads) {
        int started = p->nthreads;
        bw__tfpool_stop(p);
        snprintf(err, errlen, "cannot start transform thread %d of %d (--transform-threads)",
                 started + 1, threads);
        return BW_INTERNAL;
    }
    *out = p;
    return BW_OK;
}

void bw__tfpool_stop(bw__tfpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int bw__tfpool_threads(const bw__tfpool *p)
{
    return p ? p->nthreads : 0;
}

size_t bw__tfpool_pending(bw__tfpool *p, const char *who)
{
    size_t n = 0;
    if (!p)
        return 0;
    pthread_mutex_lock(&p->mu);
    for (window *h = p->turn; h; h = ring_next(p, h))
        if (!who || strncmp(h->who, who, sizeof(h->who) - 1) == 0)
            for (window *w = h; w; w = w->later)
                n += w->n - w->next;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void bw__tfpool_run(bw__tfpool *p, const char *who, void (*fn)(void *arg, size_t i), void *arg,
                    size_t n)
{
    if (!n)
        return;
    if (!p) {
        for (size_t i = 0; i < n; i++)
            fn(arg, i);
        return;
    }
    window w = {.fn = fn, .arg = arg, .n = n, .done_cv = PTHREAD_COND_INITIALIZER};
    snprintf(w.who, sizeof(w.who), "%s", who ? who : "");
    pthread_mutex_lock(&p->mu);
    /* w is queued from this stack frame, which waits below until every item is done: the
     * queue drops w when its last item is handed out, before that. */
    // cppcheck-suppress autoVariables
    enqueue(p, &w);
    pthread_cond_broadcast(&p->work_cv);
    while (w.done < w.n)
        pthread_cond_wait(&w.done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_cond_destroy(&w.done_cv);
}
