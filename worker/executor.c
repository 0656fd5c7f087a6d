/* The bounded executor (executor.h): one lock, one condition for every change of the budget or
 * the queue, and pool threads that pick the oldest queued task that fits. Picking the oldest
 * that fits rather than strictly the oldest lets small requests pass a large one waiting for
 * room; the large one is bounded by its wait and then told to retry, so nothing waits
 * forever. */
#include "executor.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/util.h"

enum { WARN_EVERY_MS = 10000 };

struct bw__exec {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* room freed, a task queued, stopping */
    pthread_cond_t done_cv; /* a bw__exec_run task has returned, or a caller left */
    bw__exec_opts o;
    uint64_t used;  /* bytes held */
    size_t held;    /* charges held */
    size_t waiting; /* charged requests queued or blocked in admit */
    size_t callers; /* threads inside bw__exec_admit or bw__exec_run */
    bw__exec_task *head, *tail;
    bool stopping;
    uint64_t warned_ms, busy, too_big; /* refusals since the last warning */
    pthread_t *threads;
    int nthreads;
};

/* About when room is likely: the wait again, longer when more requests wait per charge held. */
static uint32_t hint_ms(const bw__exec *x)
{
    uint64_t h = (uint64_t)x->o.wait_ms * (x->waiting + 1) / (x->held + 1);
    return (uint32_t)(h < BW_EXEC_HINT_MIN_MS   ? BW_EXEC_HINT_MIN_MS
                      : h > BW_EXEC_HINT_MAX_MS ? BW_EXEC_HINT_MAX_MS
                                                : h);
}

static void too_big(const bw__exec *x, uint64_t charge, char *why, size_t whylen)
{
    snprintf(why, whylen,
             "the request needs %llu bytes of memory, more than the worker's whole in-flight "
             "budget of %llu bytes (%s)",
             (unsigned long long)charge, (unsigned long long)x->o.budget, x->o.budget_flag);
}

static void busy(const bw__exec *x, uint64_t charge, uint32_t hint, char *why, size_t whylen)
{
    snprintf(why, whylen,
             "the worker is busy: requests in progress hold %llu of its %llu-byte in-flight "
             "budget (%s) and this one needs %llu; no room came within %d ms: retry after %u ms",
             (unsigned long long)x->used, (unsigned long long)x->o.budget, x->o.budget_flag,
             (unsigned long long)charge, x->o.wait_ms, hint);
}

/* Counts a refusal (x->mu held) and warns at most once per WARN_EVERY_MS, so that an operator
 * sees the budget being hit without a line per request. */
static void note_refusal(bw__exec *x, int rc)
{
    if (rc == BW_BUSY)
        x->busy++;
    else
        x->too_big++;
    uint64_t now = bw__mono_ms();
    if (x->warned_ms && now - x->warned_ms < WARN_EVERY_MS)
        return;
    BW_WARN("in-flight budget of %llu bytes (%s) hit: %llu requests found no room within %d ms "
            "and were told to retry (BW_BUSY), %llu needed more than all of it (BW_TOO_BIG) since "
            "the last such warning; %llu bytes held by %zu requests, %zu waiting",
            (unsigned long long)x->o.budget, x->o.budget_flag, (unsigned long long)x->busy,
            x->o.wait_ms, (unsigned long long)x->too_big, (unsigned long long)x->used, x->held,
            x->waiting);
    x->warned_ms = now;
    x->busy = x->too_big = 0;
}

static bool fits(const bw__exec *x, uint64_t charge)
{
    return charge == 0 || (charge <= x->o.budget && x->used <= x->o.budget - charge);
}

static void take(bw__exec *x, uint64_t charge)
{
    if (!charge)
        return;
    x->used += charge;
    x->held++;
}

/* The next task to call and its rc (x->mu held), unlinked; NULL when none can run yet, with
 * *wake the earliest deadline among those waiting (0: none). */
static bw__exec_task *pick(bw__exec *x, int *rc, uint64_t *wake)
{
    uint64_t now = bw__mono_ms();
    *wake = 0;
    bw__exec_task *prev = NULL;
    for (bw__exec_task *t = x->head; t; prev = t, t = t->next) {
        if (x->stopping)
            *rc = BW_UNAVAILABLE;
        else if (t->charge > x->o.budget)
            *rc = BW_TOO_BIG;
        else if (fits(x, t->charge))
            *rc = BW_OK;
        else if (now >= t->deadline_ms)
            *rc = BW_BUSY;
        else {
            if (!*wake || t->deadline_ms < *wake)
                *wake = t->deadline_ms;
            continue;
        }
        if (prev)
            prev->next = t->next;
        else
            x->head = t->next;
        if (x->tail == t)
            x->tail = prev;
        t->next = NULL;
        if (t->charge)
            x->waiting--;
        switch (*rc) {
        case BW_OK:
            take(x, t->charge);
            break;
        case BW_TOO_BIG:
            too_big(x, t->charge, t->why, sizeof(t->why));
            note_refusal(x, *rc);
            break;
        case BW_BUSY:
            busy(x, t->charge, t->retry_after_ms = hint_ms(x), t->why, sizeof(t->why));
            note_refusal(x, *rc);
            break;
        default:
            snprintf(t->why, sizeof(t->why), "the worker is shutting down");
        }
        return t;
    }
    return NULL;
}

static void *pool_thread(void *arg)
{
    bw__exec *x = arg;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        int rc = BW_OK;
        uint64_t wake = 0;
        bw__exec_task *t = pick(x, &rc, &wake);
        if (!t) {
            if (x->stopping)
                break;
            if (wake) {
                uint64_t now = bw__mono_ms();
                struct timespec until = bw__mono_deadline(wake > now ? wake - now : 0);
                pthread_cond_timedwait(&x->cv, &x->mu, &until);
            } else {
                pthread_cond_wait(&x->cv, &x->mu);
            }
            continue;
        }
        bool sync = t->sync; /* fn may free t unless it is a bw__exec_run task */
        pthread_mutex_unlock(&x->mu);
        t->fn(t, rc);
        pthread_mutex_lock(&x->mu);
        if (sync) {
            t->done = true;
            pthread_cond_broadcast(&x->done_cv);
        }
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

int bw__exec_start(const bw__exec_opts *o, bw__exec **out, char *err, size_t errlen)
{
    *out = NULL;
    if (o->threads < 1 || o->budget == 0 || o->wait_ms < 0) {
        snprintf(err, errlen, "executor: threads %d, budget %llu and wait %d ms must be positive",
                 o->threads, (unsigned long long)o->budget, o->wait_ms);
        return BW_INVALID_ARGUMENT;
    }
    bw__exec *x = calloc(1, sizeof(*x));
    pthread_t *th = calloc((size_t)o->threads, sizeof(*th));
    if (!x || !th) {
        free(x);
        free(th);
        snprintf(err, errlen, "executor: out of memory");
        return BW_NOMEM;
    }
    x->o = *o;
    if (!x->o.budget_flag)
        x->o.budget_flag = "the in-flight budget";
    x->threads = th;
    pthread_mutex_init(&x->mu, NULL);
    bw__cond_init_mono(&x->cv);
    bw__cond_init_mono(&x->done_cv);
    for (; x->nthreads < o->threads; x->nthreads++)
        if (pthread_create(&x->threads[x->nthreads], NULL, pool_thread, x) != 0)
            break;
    if (x->nthreads < o->threads) {
        snprintf(err, errlen, "executor: cannot start thread %d of %d", x->nthreads + 1,
                 o->threads);
        bw__exec_stop(x);
        return BW_INTERNAL;
    }
    *out = x;
    return BW_OK;
}

void bw__exec_stop(bw__exec *x)
{
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    x->stopping = true;
    pthread_cond_broadcast(&x->cv);
    while (x->callers) /* they return BW_UNAVAILABLE; the pool still runs their tasks */
        pthread_cond_wait(&x->done_cv, &x->mu);
    pthread_mutex_unlock(&x->mu);
    for (int i = 0; i < x->nthreads; i++)
        pthread_join(x->threads[i], NULL);
    BW_INVARIANT(!x->head, "an executor's queue is empty once its threads have ended");
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    pthread_cond_destroy(&x->done_cv);
    free(x->threads);
    free(x);
}

static void enqueue(bw__exec *x, bw__exec_task *t, uint64_t charge, bw__exec_fn fn, bool sync)
{
    t->fn = fn;
    t->charge = charge;
    t->retry_after_ms = 0;
    t->why[0] = '\0';
    t->deadline_ms = bw__mono_ms() + (uint64_t)x->o.wait_ms;
    t->next = NULL;
    t->sync = sync;
    t->done = false;
    if (x->tail)
        x->tail->next = t;
    else
        x->head = t;
    x->tail = t;
    if (charge)
        x->waiting++;
    pthread_cond_broadcast(&x->cv);
}

void bw__exec_submit(bw__exec *x, bw__exec_task *t, uint64_t charge, bw__exec_fn fn)
{
    pthread_mutex_lock(&x->mu);
    enqueue(x, t, charge, fn, false);
    pthread_mutex_unlock(&x->mu);
}

void bw__exec_run(bw__exec *x, bw__exec_task *t, bw__exec_fn fn)
{
    pthread_mutex_lock(&x->mu);
    x->callers++;
    enqueue(x, t, 0, fn, true);
    while (!t->done)
        pthread_cond_wait(&x->done_cv, &x->mu);
    x->callers--;
    pthread_cond_broadcast(&x->done_cv);
    pthread_mutex_unlock(&x->mu);
}

int bw__exec_admit(bw__exec *x, uint64_t charge, uint32_t *retry_after_ms, char *why, size_t whylen)
{
    *retry_after_ms = 0;
    pthread_mutex_lock(&x->mu);
    x->callers++;
    int rc = BW_OK;
    if (charge > x->o.budget) {
        too_big(x, charge, why, whylen);
        rc = BW_TOO_BIG;
    } else if (!fits(x, charge) && !x->stopping) {
        struct timespec until = bw__mono_deadline((uint64_t)x->o.wait_ms);
        x->waiting++;
        while (!x->stopping && !fits(x, charge))
            if (pthread_cond_timedwait(&x->cv, &x->mu, &until) != 0)
                break;
        x->waiting--;
        if (!x->stopping && !fits(x, charge)) {
            busy(x, charge, *retry_after_ms = hint_ms(x), why, whylen);
            rc = BW_BUSY;
        }
    }
    if (rc == BW_OK && x->stopping) {
        snprintf(why, whylen, "the worker is shutting down");
        rc = BW_UNAVAILABLE;
    }
    if (rc == BW_OK)
        take(x, charge);
    else if (rc != BW_UNAVAILABLE)
        note_refusal(x, rc);
    x->callers--;
    if (x->stopping) /* bw__exec_stop waits for callers to leave */
        pthread_cond_broadcast(&x->done_cv);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

void bw__exec_release(bw__exec *x, uint64_t charge)
{
    if (!charge)
        return;
    pthread_mutex_lock(&x->mu);
    BW_INVARIANT(x->used >= charge && x->held > 0, "a charge given back was admitted");
    x->used -= charge;
    x->held--;
    if (x->waiting) /* only those waiting for room: idle threads need no wake-up */
        pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

void bw__exec_shrink(bw__exec *x, uint64_t from, uint64_t to)
{
    if (to >= from)
        return;
    pthread_mutex_lock(&x->mu);
    BW_INVARIANT(x->used >= from - to && x->held > 0, "a charge made smaller was admitted");
    x->used -= from - to;
    if (x->waiting)
        pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

uint64_t bw__exec_held(bw__exec *x)
{
    pthread_mutex_lock(&x->mu);
    uint64_t u = x->used;
    pthread_mutex_unlock(&x->mu);
    return u;
}
