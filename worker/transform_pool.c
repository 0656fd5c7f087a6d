/* The worker's transform pool (transform_pool.h). */
#include "transform_pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "batchwire/batchwire.h"

/* One bw__tfpool_run call: lives on its caller's stack until every item is done. */
typedef struct window {
    void (*fn)(void *arg, size_t i);
    void *arg;
    size_t n, next, done; /* items: total, handed out, finished */
    pthread_cond_t done_cv;
    struct window *later;
} window;

struct bw__tfpool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    window *head, *tail; /* windows with items not yet handed out, oldest first */
    bool stopping;
    int nthreads;
    pthread_t *threads;
};

static void *worker_main(void *arg)
{
    bw__tfpool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stopping)
            pthread_cond_wait(&p->work_cv, &p->mu);
        if (!p->head)
            break; /* stopping, and nothing left */
        window *w = p->head;
        size_t i = w->next++;
        if (w->next == w->n) { /* every item handed out: the next window's turn */
            p->head = w->later;
            if (!p->head)
                p->tail = NULL;
        }
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

void bw__tfpool_run(bw__tfpool *p, void (*fn)(void *arg, size_t i), void *arg, size_t n)
{
    if (!n)
        return;
    if (!p) {
        for (size_t i = 0; i < n; i++)
            fn(arg, i);
        return;
    }
    window w = {fn, arg, n, 0, 0, PTHREAD_COND_INITIALIZER, NULL};
    pthread_mutex_lock(&p->mu);
    /* w is queued from this stack frame, which waits below until every item is done: the
     * queue drops w when its last item is handed out, before that. */
    if (p->tail)
        p->tail->later = &w;
    else
        // cppcheck-suppress autoVariables
        p->head = &w;
    // cppcheck-suppress autoVariables
    p->tail = &w;
    pthread_cond_broadcast(&p->work_cv);
    while (w.done < w.n)
        pthread_cond_wait(&w.done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_cond_destroy(&w.done_cv);
}
