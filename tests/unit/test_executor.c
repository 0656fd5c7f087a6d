/* The worker's bounded executor (worker/executor.h): admission by bytes on the caller's thread
 * and for queued tasks, waiting for room, BW_BUSY with a retry hint after the wait, the refusal
 * of a charge larger than the whole budget, the pool's bound on concurrent work, and stopping
 * with work still queued. */
#include <stdio.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "batchwire/batchwire.h"
#include "worker/executor.h"

enum { WAIT_MS = 200 };

static bw__exec *start(int threads, uint64_t budget)
{
    bw__exec_opts o = {threads, budget, WAIT_MS, "--inflight-bytes"};
    bw__exec *x = NULL;
    char err[256];
    assert_int_equal(bw__exec_start(&o, &x, err, sizeof(err)), BW_OK);
    return x;
}

static void test_admit_within_budget(void **state)
{
    (void)state;
    bw__exec *x = start(1, 100);
    uint32_t hint = 7;
    char why[256];
    assert_int_equal(bw__exec_admit(x, 40, &hint, why, sizeof(why)), BW_OK);
    assert_int_equal(hint, 0);
    assert_int_equal(bw__exec_admit(x, 60, &hint, why, sizeof(why)), BW_OK);
    assert_int_equal(bw__exec_held(x), 100);
    bw__exec_release(x, 40);
    bw__exec_release(x, 60);
    assert_int_equal(bw__exec_held(x), 0);
    /* a charge made smaller leaves room at once; the rest is given back later */
    assert_int_equal(bw__exec_admit(x, 100, &hint, why, sizeof(why)), BW_OK);
    bw__exec_shrink(x, 100, 30);
    assert_int_equal(bw__exec_held(x), 30);
    assert_int_equal(bw__exec_admit(x, 70, &hint, why, sizeof(why)), BW_OK);
    bw__exec_shrink(x, 70, 70); /* no-op */
    bw__exec_release(x, 30);
    bw__exec_release(x, 70);
    assert_int_equal(bw__exec_held(x), 0);
    bw__exec_stop(x);
}

static void test_too_big_refused_at_once(void **state)
{
    (void)state;
    bw__exec *x = start(1, 100);
    uint32_t hint = 0;
    char why[256];
    uint64_t t0 = bw__mono_ms();
    assert_int_equal(bw__exec_admit(x, 101, &hint, why, sizeof(why)), BW_TOO_BIG);
    assert_true(bw__mono_ms() - t0 < WAIT_MS / 2); /* no wait: it could never fit */
    assert_non_null(strstr(why, "101 bytes"));
    assert_non_null(strstr(why, "budget of 100 bytes (--inflight-bytes)"));
    assert_int_equal(hint, 0);
    assert_int_equal(bw__exec_held(x), 0);
    bw__exec_stop(x);
}

static void test_busy_after_the_wait(void **state)
{
    (void)state;
    bw__exec *x = start(1, 100);
    uint32_t hint = 0;
    char why[256];
    assert_int_equal(bw__exec_admit(x, 90, &hint, why, sizeof(why)), BW_OK);
    uint64_t t0 = bw__mono_ms();
    assert_int_equal(bw__exec_admit(x, 20, &hint, why, sizeof(why)), BW_BUSY);
    uint64_t waited = bw__mono_ms() - t0;
    assert_true(waited >= WAIT_MS - 5 && waited < WAIT_MS * 5);
    assert_true(hint >= BW_EXEC_HINT_MIN_MS && hint <= BW_EXEC_HINT_MAX_MS);
    char want[64];
    snprintf(want, sizeof(want), "retry after %u ms", hint);
    assert_non_null(strstr(why, want));
    assert_non_null(strstr(why, "hold 90 of its 100-byte"));
    assert_int_equal(bw__exec_held(x), 90); /* the refused request holds nothing */
    bw__exec_release(x, 90);
    bw__exec_stop(x);
}

typedef struct releaser {
    bw__exec *x;
    uint64_t bytes;
    int after_ms;
} releaser;

static void *release_later(void *arg)
{
    releaser *r = arg;
    usleep((useconds_t)r->after_ms * 1000);
    bw__exec_release(r->x, r->bytes);
    return NULL;
}

static void test_waits_for_room(void **state)
{
    (void)state;
    bw__exec *x = start(1, 100);
    uint32_t hint = 0;
    char why[256];
    assert_int_equal(bw__exec_admit(x, 100, &hint, why, sizeof(why)), BW_OK);
    releaser r = {x, 100, WAIT_MS / 4};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, release_later, &r), 0);
    uint64_t t0 = bw__mono_ms();
    assert_int_equal(bw__exec_admit(x, 70, &hint, why, sizeof(why)), BW_OK);
    uint64_t waited = bw__mono_ms() - t0;
    assert_true(waited >= WAIT_MS / 4 - 5 && waited < WAIT_MS);
    pthread_join(th, NULL);
    assert_int_equal(bw__exec_held(x), 70);
    bw__exec_release(x, 70);
    bw__exec_stop(x);
}

/* Tasks: what each was called with, on which thread, and in what order. */
typedef struct probe {
    bw__exec_task t;
    bw__exec *x;
    atomic_int calls;
    int rc;
    uint32_t hint;
    char why[256];
    pthread_t thread;
    uint64_t at_ms;
    bool release; /* give the charge back at once */
} probe;

static void on_task(bw__exec_task *t, int rc)
{
    probe *p = (probe *)t;
    p->rc = rc;
    p->hint = t->retry_after_ms;
    snprintf(p->why, sizeof(p->why), "%s", t->why);
    p->thread = pthread_self();
    p->at_ms = bw__mono_ms();
    if (rc == BW_OK && p->release)
        bw__exec_release(p->x, t->charge);
    atomic_fetch_add(&p->calls, 1);
}

static void wait_called(probe *p)
{
    for (int i = 0; i < 500 && atomic_load(&p->calls) == 0; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&p->calls), 1);
}

static void test_tasks_admitted_by_bytes(void **state)
{
    (void)state;
    bw__exec *x = start(2, 100);
    uint32_t hint = 0;
    char why[256];
    /* fits: runs on a pool thread at once */
    probe a = {.x = x, .release = true};
    bw__exec_submit(x, &a.t, 60, on_task);
    wait_called(&a);
    assert_int_equal(a.rc, BW_OK);
    assert_false(pthread_equal(a.thread, pthread_self()));

    /* does not fit until the caller's charge is given back */
    assert_int_equal(bw__exec_admit(x, 80, &hint, why, sizeof(why)), BW_OK);
    probe b = {.x = x, .release = true};
    uint64_t t0 = bw__mono_ms();
    bw__exec_submit(x, &b.t, 50, on_task);
    usleep(WAIT_MS / 4 * 1000);
    assert_int_equal(atomic_load(&b.calls), 0);
    bw__exec_release(x, 80);
    wait_called(&b);
    assert_int_equal(b.rc, BW_OK);
    assert_true(b.at_ms - t0 >= WAIT_MS / 4 - 5 && b.at_ms - t0 < WAIT_MS);

    /* never gets room: BW_BUSY with a hint after the wait */
    assert_int_equal(bw__exec_admit(x, 100, &hint, why, sizeof(why)), BW_OK);
    probe c = {.x = x};
    t0 = bw__mono_ms();
    bw__exec_submit(x, &c.t, 10, on_task);
    wait_called(&c);
    assert_int_equal(c.rc, BW_BUSY);
    assert_true(c.at_ms - t0 >= WAIT_MS - 5);
    assert_true(c.hint >= BW_EXEC_HINT_MIN_MS);
    assert_non_null(strstr(c.why, "--inflight-bytes"));

    /* larger than the whole budget: BW_TOO_BIG without waiting */
    probe d = {.x = x};
    t0 = bw__mono_ms();
    bw__exec_submit(x, &d.t, 1000, on_task);
    wait_called(&d);
    assert_int_equal(d.rc, BW_TOO_BIG);
    assert_true(d.at_ms - t0 < WAIT_MS / 2);
    /* charge 0 always runs */
    probe e = {.x = x};
    bw__exec_submit(x, &e.t, 0, on_task);
    wait_called(&e);
    assert_int_equal(e.rc, BW_OK);
    bw__exec_release(x, 100);
    assert_int_equal(bw__exec_held(x), 0);
    bw__exec_stop(x);
}

/* bw__exec_run: no more tasks run at once than the pool has threads. */
typedef struct counted {
    bw__exec_task t;
    atomic_int *running, *most;
} counted;

static atomic_int g_running, g_most, g_bad;

static void on_counted(bw__exec_task *t, int rc)
{
    counted *c = (counted *)t;
    if (rc != BW_OK)
        atomic_fetch_add(&g_bad, 1); /* checked by the test's thread */
    int now = atomic_fetch_add(c->running, 1) + 1;
    int m = atomic_load(c->most);
    while (now > m && !atomic_compare_exchange_weak(c->most, &m, now))
        ;
    usleep(30000);
    atomic_fetch_sub(c->running, 1);
}

static void *run_one(void *arg)
{
    bw__exec *x = arg;
    counted c = {.running = &g_running, .most = &g_most};
    bw__exec_run(x, &c.t, on_counted);
    return NULL;
}

static void test_run_bounded_by_threads(void **state)
{
    (void)state;
    bw__exec *x = start(2, 100);
    pthread_t th[6];
    for (int i = 0; i < 6; i++)
        assert_int_equal(pthread_create(&th[i], NULL, run_one, x), 0);
    for (int i = 0; i < 6; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&g_running), 0);
    assert_int_equal(atomic_load(&g_bad), 0);
    assert_int_equal(atomic_load(&g_most), 2);
    bw__exec_stop(x);
}

typedef struct admitter {
    bw__exec *x;
    int rc;
} admitter;

static void *admit_blocked(void *arg)
{
    admitter *a = arg;
    uint32_t hint;
    char why[256];
    a->rc = bw__exec_admit(a->x, 50, &hint, why, sizeof(why));
    return NULL;
}

static void test_stop_with_work_waiting(void **state)
{
    (void)state;
    bw__exec_opts o = {1, 100, 10000, "--inflight-bytes"}; /* waits far longer than the test */
    bw__exec *x = NULL;
    char err[256];
    assert_int_equal(bw__exec_start(&o, &x, err, sizeof(err)), BW_OK);
    uint32_t hint;
    assert_int_equal(bw__exec_admit(x, 100, &hint, err, sizeof(err)), BW_OK);
    probe p = {.x = x};
    bw__exec_submit(x, &p.t, 30, on_task);
    admitter a = {x, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, admit_blocked, &a), 0);
    usleep(50000);
    assert_int_equal(atomic_load(&p.calls), 0);
    uint64_t t0 = bw__mono_ms();
    bw__exec_stop(x); /* the caller's 100 bytes are never given back: stop does not wait */
    pthread_join(th, NULL);
    assert_true(bw__mono_ms() - t0 < 2000);
    assert_int_equal(atomic_load(&p.calls), 1);
    assert_int_equal(p.rc, BW_UNAVAILABLE);
    assert_int_equal(a.rc, BW_UNAVAILABLE);
}

static void test_bad_options(void **state)
{
    (void)state;
    bw__exec *x = NULL;
    char err[256];
    bw__exec_opts o = {0, 100, 10, NULL};
    assert_int_equal(bw__exec_start(&o, &x, err, sizeof(err)), BW_INVALID_ARGUMENT);
    bw__exec_opts o2 = {1, 0, 10, NULL};
    assert_int_equal(bw__exec_start(&o2, &x, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_null(x);
    bw__exec_stop(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admit_within_budget),
        cmocka_unit_test(test_too_big_refused_at_once),
        cmocka_unit_test(test_busy_after_the_wait),
        cmocka_unit_test(test_waits_for_room),
        cmocka_unit_test(test_tasks_admitted_by_bytes),
        cmocka_unit_test(test_run_bounded_by_threads),
        cmocka_unit_test(test_stop_with_work_waiting),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
