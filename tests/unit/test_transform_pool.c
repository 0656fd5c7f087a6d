/* The worker's transform pool (worker/transform_pool.h): every item of a window runs exactly
 * once, on the pool's threads (several at once), before bw__tfpool_run returns, also with
 * windows from several callers at once; without a pool on the caller's thread; principals are
 * served in turn, so one principal's long queue does not hold back another's window. */
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
#include "worker/sample_transform.h"
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
        bw__tfpool_run(p, "a", item, &j, n);
        each_once(&j, n);
        assert_int_equal(atomic_load(&j.on_caller), 0);
    }
    /* Slow items: the three threads run some at once. */
    new_job(&j, 2000);
    bw__tfpool_run(p, NULL, item, &j, 30);
    each_once(&j, 30);
    assert_true(atomic_load(&j.most) >= 2);
    assert_true(atomic_load(&j.most) <= 3);
    bw__tfpool_stop(p);
}

typedef struct caller_arg {
    bw__tfpool *p;
    const char *who;
    job j;
} caller_arg;

static void *caller_main(void *arg)
{
    caller_arg *c = arg;
    new_job(&c->j, 0);
    for (int rep = 0; rep < 20; rep++) {
        memset(c->j.runs, 0, sizeof(c->j.runs));
        bw__tfpool_run(c->p, c->who, item, &c->j, N);
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
        args[k].who = k == 1 ? "job:b" : "job:a"; /* two of one principal, one of another */
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
    bw__tfpool_run(NULL, "a", item, &j, 9);
    each_once(&j, 9);
    assert_int_equal(atomic_load(&j.on_caller), 9);
    assert_int_equal(bw__tfpool_threads(NULL), 0);
    assert_int_equal(bw__tfpool_pending(NULL, NULL), 0);
    bw__tfpool_stop(NULL);
}

/* ---- fairness: one principal's flood against another's single window ---- */

enum { FLOOD = 4, FLOOD_N = 25 }; /* principal A's windows and their items */

typedef struct order {
    atomic_int seq;     /* items run so far, in any window */
    atomic_int gate;    /* 0: the first item of A waits (holding the pool's one thread) */
    atomic_int started; /* the first item of A is running */
} order;

static order ord;

typedef struct fair_win {
    bw__tfpool *p;
    const char *who;
    size_t n;
    atomic_int at[FLOOD_N]; /* each item's place in the pool's order (from 1) */
} fair_win;

static void fair_item(void *arg, size_t i)
{
    fair_win *f = arg;
    if (atomic_exchange(&ord.started, 1) == 0)
        while (!atomic_load(&ord.gate))
            usleep(100);
    atomic_store(&f->at[i], atomic_fetch_add(&ord.seq, 1) + 1);
}

static void *fair_caller(void *arg)
{
    fair_win *f = arg;
    bw__tfpool_run(f->p, f->who, fair_item, f, f->n);
    return NULL;
}

static void wait_pending(bw__tfpool *p, const char *who, size_t n)
{
    for (int spins = 0; bw__tfpool_pending(p, who) != n; spins++) {
        assert_true(spins < 100000); /* 10 s */
        usleep(100);
    }
}

static void test_a_second_principal_is_not_starved(void **state)
{
    (void)state;
    char err[256];
    bw__tfpool *p = NULL;
    assert_int_equal(bw__tfpool_start(1, &p, err, sizeof(err)), BW_OK);
    memset(&ord, 0, sizeof(ord));
    static fair_win a[FLOOD], b;
    pthread_t ta[FLOOD], tb;
    /* A queues FLOOD windows; its first item holds the one thread until all are queued. */
    for (int k = 0; k < FLOOD; k++) {
        memset(&a[k], 0, sizeof(a[k]));
        a[k] = (fair_win){.p = p, .who = "job:a", .n = FLOOD_N};
        assert_int_equal(pthread_create(&ta[k], NULL, fair_caller, &a[k]), 0);
        if (k == 0)
            while (!atomic_load(&ord.started))
                usleep(100);
        wait_pending(p, "job:a", (size_t)(k + 1) * FLOOD_N - 1); /* queued in this order */
    }
    /* Then B queues one window of 3 behind A's 99 queued samples. */
    memset(&b, 0, sizeof(b));
    b = (fair_win){.p = p, .who = "job:b", .n = 3};
    assert_int_equal(pthread_create(&tb, NULL, fair_caller, &b), 0);
    wait_pending(p, "job:b", 3);
    assert_int_equal(bw__tfpool_pending(p, NULL), FLOOD * FLOOD_N - 1 + 3);
    atomic_store(&ord.gate, 1);
    for (int k = 0; k < FLOOD; k++)
        assert_int_equal(pthread_join(ta[k], NULL), 0);
    assert_int_equal(pthread_join(tb, NULL), 0);
    /* Turns alternate after A's held item: B's samples run 2nd or 3rd, 4th or 5th, 6th or 7th
     * of 103 (first come, first served would run them 101st to 103rd). */
    for (size_t i = 0; i < 3; i++) {
        assert_true(atomic_load(&b.at[i]) >= 2);
        assert_true(atomic_load(&b.at[i]) <= 3 + 2 * (int)i);
    }
    /* A's samples still run in its windows' arrival order, each exactly once. */
    int last = 0;
    for (int k = 0; k < FLOOD; k++)
        for (size_t i = 0; i < FLOOD_N; i++) {
            int at = atomic_load(&a[k].at[i]);
            assert_true(at > last);
            last = at;
        }
    assert_int_equal(last, FLOOD * FLOOD_N + 3);
    assert_int_equal(bw__tfpool_pending(p, NULL), 0);
    bw__tfpool_stop(p);
}

/* The principal a read's windows are queued for (worker/sample_transform.h). */
static void test_principal_of_a_read(void **state)
{
    (void)state;
    static bw__stf t;
    const char *peers[][2] = {
        {"ipv4:10.0.0.7:41234", "peer:10.0.0.7"}, {"10.0.0.7:5", "peer:10.0.0.7"},
        {"ipv6:[::1]:41234", "peer:::1"},         {"::1:41234", "peer:::1"},
        {"unix:/tmp/s", "peer:unix:/tmp/s"},      {"", "peer:"},
    };
    for (size_t i = 0; i < sizeof(peers) / sizeof(peers[0]); i++) {
        bw__stf_principal(&t, NULL, 0, peers[i][0]);
        assert_string_equal(t.who, peers[i][1]);
    }
    Batchwire__V1__GrantClaims c = BATCHWIRE__V1__GRANT_CLAIMS__INIT;
    c.job = "run1";
    uint8_t buf[256];
    size_t len = batchwire__v1__grant_claims__pack(&c, buf);
    bw__stf_principal(&t, buf, len, "ipv4:10.0.0.7:41234");
    assert_string_equal(t.who, "job:run1");
    /* Claims without a job, or not claims at all: the peer. */
    c.job = "";
    len = batchwire__v1__grant_claims__pack(&c, buf);
    bw__stf_principal(&t, buf, len, "10.0.0.8:1");
    assert_string_equal(t.who, "peer:10.0.0.8");
    const uint8_t junk[] = {0xff, 0xff, 0xff};
    bw__stf_principal(&t, junk, sizeof(junk), "10.0.0.9:1");
    assert_string_equal(t.who, "peer:10.0.0.9");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_item_once_on_the_pool),
        cmocka_unit_test(test_windows_of_several_callers),
        cmocka_unit_test(test_no_pool_runs_on_the_caller),
        cmocka_unit_test(test_a_second_principal_is_not_starved),
        cmocka_unit_test(test_principal_of_a_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
