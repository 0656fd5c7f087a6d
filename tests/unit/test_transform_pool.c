/* The worker's transform pool (worker/transform_pool.h): every item of a window runs exactly
 * once, on the pool's threads (several at once), before bw__tfpool_run returns, also with
 * windows from several callers at once; without a pool on the caller's thread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "worker/transform_pool.h"

enum { N = 500, CALLERS = 3 };

typedef struct job {
    atomic_int runs[N];
    atomic_int running, most; /* items running at once now, and at most */
    pthread_t caller;
    atomic_int on_caller; /* items run on the caller's thread */
    int sleep_us;
} job;

static void item(void *arg, size_t i)
{
    job *j = arg;
    int now = atomic_fetch_add(&j->running, 1) + 1;
    int most = atomic_load(&j->most);
    while (now > most && !atomic_compare_exchange_weak(&j->most, &most, now))
        ;
    if (pthread_equal(pthread_self(), j->caller))
        atomic_fetch_add(&j->on_caller, 1);
    if (j->sleep_us)
        usleep((useconds_t)j->sleep_us);
    atomic_fetch_add(&j->runs[i], 1);
    atomic_fetch_sub(&j->running, 1);
}

static void new_job(job *j, int sleep_us)
{
    memset(j, 0, sizeof(*j));
    j->caller = pthread_self();
    j->sleep_us = sleep_us;
}

static void each_once(job *j, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atomic_load(&j->runs[i]), 1);
    for (size_t i = n; i < N; i++)
        assert_int_equal(atomic_load(&j->runs[i]), 0);
}

static void test_every_item_once_on_the_pool(void **state)
{
    (void)state;
    char err[256];
    bw__tfpool *p = NULL;
    assert_int_equal(bw__tfpool_start(3, &p, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__tfpool_threads(p), 3);
    static job j;
    for (size_t n = 0; n <= 7; n++) { /* windows smaller and larger than the threads */
        new_job(&j, 0);
        bw__tfpool_run(p, item, &j, n);
        each_once(&j, n);
        assert_int_equal(atomic_load(&j.on_caller), 0);
    }
    /* Slow items: the three threads run some at once. */
    new_job(&j, 2000);
    bw__tfpool_run(p, item, &j, 30);
    each_once(&j, 30);
    assert_true(atomic_load(&j.most) >= 2);
    assert_true(atomic_load(&j.most) <= 3);
    bw__tfpool_stop(p);
}

typedef struct caller_arg {
    bw__tfpool *p;
    job j;
} caller_arg;

static void *caller_main(void *arg)
{
    caller_arg *c = arg;
    new_job(&c->j, 0);
    for (int rep = 0; rep < 20; rep++) {
        memset(c->j.runs, 0, sizeof(c->j.runs));
        bw__tfpool_run(c->p, item, &c->j, N);
        for (size_t i = 0; i < N; i++)
            if (atomic_load(&c->j.runs[i]) != 1)
                return (void *)1;
    }
    return NULL;
}

static void test_windows_of_several_callers(void **state)
{
    (void)state;
    char err[256];
    bw__tfpool *p = NULL;
    assert_int_equal(bw__tfpool_start(2, &p, err, sizeof(err)), BW_OK);
    static caller_arg args[CALLERS];
    pthread_t t[CALLERS];
    for (int k = 0; k < CALLERS; k++) {
        args[k].p = p;
        assert_int_equal(pthread_create(&t[k], NULL, caller_main, &args[k]), 0);
    }
    for (int k = 0; k < CALLERS; k++) {
        void *bad = (void *)1;
        assert_int_equal(pthread_join(t[k], &bad), 0);
        assert_null(bad);
    }
    bw__tfpool_stop(p);
}

static void test_no_pool_runs_on_the_caller(void **state)
{
    (void)state;
    static job j;
    new_job(&j, 0);
    bw__tfpool_run(NULL, item, &j, 9);
    each_once(&j, 9);
    assert_int_equal(atomic_load(&j.on_caller), 9);
    assert_int_equal(bw__tfpool_threads(NULL), 0);
    bw__tfpool_stop(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_item_once_on_the_pool),
        cmocka_unit_test(test_windows_of_several_callers),
        cmocka_unit_test(test_no_pool_runs_on_the_caller),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
