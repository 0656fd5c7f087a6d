/* The progress reporter (core/common/progress.c) and rates from reported counters
 * (core/common/rate.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/log.h"
#include "common/progress.h"
#include "common/rate.h"

static char lines[64][512];
static int nlines;

static void capture(void *user, bw_log_level level, const char *line)
{
    (void)user;
    (void)level;
    if (nlines < 64)
        snprintf(lines[nlines++], sizeof(lines[0]), "%s", line);
}

static void setup_log(uint64_t interval_ms)
{
    nlines = 0;
    bw_set_log_callback(capture, NULL, BW_LOG_INFO);
    bw__progress_interval_ms = interval_ms;
}

/* Work that ends before the first report shows nothing at all. */
static void test_quick_work_is_silent(void **state)
{
    (void)state;
    setup_log(60000);
    bw__progress p;
    bw__progress_begin(&p, "writing out=x", false, 1000);
    for (uint64_t i = 1; i <= 1000; i++)
        bw__progress_update(&p, i);
    bw__progress_end(&p, true);
    assert_int_equal(nlines, 0);
    bw_set_log_callback(NULL, NULL, BW_LOG_ERROR);
}

/* Slow work: a running line per interval with the share, rate and time left, then a done
 * line. */
static void test_lines_while_running(void **state)
{
    (void)state;
    setup_log(20);
    bw__progress p;
    bw__progress_begin(&p, "indexing dataset=tfrecord:a", true, 64 * 4 * 1024 * 1024);
    for (uint64_t i = 1; i <= 64 * 4; i++) {
        bw__progress_update(&p, i * 1024 * 1024); /* every 64th call reads the clock */
        if (i % 64 == 0)
            usleep(30 * 1000);
    }
    bw__progress_end(&p, true);
    assert_true(nlines >= 3);
    for (int i = 0; i < nlines - 1; i++) {
        assert_non_null(strstr(lines[i], "indexing dataset=tfrecord:a done="));
        assert_non_null(strstr(lines[i], "MiB total=256.0MiB pct="));
        assert_non_null(strstr(lines[i], " rate="));
        assert_non_null(strstr(lines[i], " eta="));
        assert_non_null(strstr(lines[i], "state=running"));
    }
    /* the clock is read at calls 64, 128, ...: after a 30 ms pause from call 128 on */
    int half = 0;
    for (int i = 0; i < nlines; i++)
        half += strstr(lines[i], "done=128.0MiB total=256.0MiB pct=50.0 ") != NULL;
    assert_int_equal(half, 1);
    assert_non_null(strstr(lines[nlines - 1], "done=256.0MiB total=256.0MiB pct=100.0"));
    assert_non_null(strstr(lines[nlines - 1], "state=done elapsed="));
    bw_set_log_callback(NULL, NULL, BW_LOG_ERROR);
}

/* An unknown total: the count and rate, no share or time left; a failure says so. */
static void test_unknown_total_and_failure(void **state)
{
    (void)state;
    setup_log(1);
    bw__progress p;
    bw__progress_begin(&p, "opening dataset=files:d", false, 0);
    usleep(5 * 1000);
    bw__progress_set(&p, 7);
    bw__progress_end(&p, false);
    assert_int_equal(nlines, 2);
    assert_non_null(strstr(lines[0], "opening dataset=files:d done=7 rate="));
    assert_null(strstr(lines[0], "pct="));
    assert_null(strstr(lines[0], "eta="));
    assert_non_null(strstr(lines[1], "state=failed"));
    /* interval 0: never */
    setup_log(0);
    bw__progress_begin(&p, "x", false, 10);
    usleep(2000);
    bw__progress_set(&p, 5);
    bw__progress_end(&p, true);
    assert_int_equal(nlines, 0);
    bw_set_log_callback(NULL, NULL, BW_LOG_ERROR);
    bw__progress_interval_ms = 5000;
}

static void test_rate_windows(void **state)
{
    (void)state;
    bw__rate r;
    memset(&r, 0, sizeof(r));
    uint64_t t[BW_RATE_COUNTERS] = {0, 0, 0};
    bw__rate_report(&r, 1000, t); /* the first report: no rate yet */
    assert_true(r.per_s[0] == 0);
    t[0] = 500, t[1] = 5000;
    bw__rate_report(&r, 1500, t); /* half a second: the window is not complete */
    assert_true(r.per_s[0] == 0);
    assert_int_equal(r.total[0], 500);
    t[0] = 2000, t[1] = 20000;
    bw__rate_report(&r, 3000, t); /* two seconds since the window began */
    assert_true(r.per_s[0] == 1000.0);
    assert_true(r.per_s[1] == 10000.0);
    t[0] = 2000;
    bw__rate_report(&r, 3400, t); /* shown rate stays until the next window completes */
    assert_true(r.per_s[0] == 1000.0);
    bw__rate_report(&r, 4000, t); /* nothing moved for a second: 0 */
    assert_true(r.per_s[0] == 0.0);
    t[0] = 10, t[1] = 10; /* the process restarted: counters went down */
    bw__rate_report(&r, 4100, t);
    assert_true(r.per_s[0] == 0.0 && r.total[0] == 10 && r.base[0] == 10);
    t[0] = 1010, t[1] = 10;
    bw__rate_report(&r, 5100, t);
    assert_true(r.per_s[0] == 1000.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quick_work_is_silent),
        cmocka_unit_test(test_lines_while_running),
        cmocka_unit_test(test_unknown_total_and_failure),
        cmocka_unit_test(test_rate_windows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
