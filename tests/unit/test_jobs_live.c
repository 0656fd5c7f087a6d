/* What ranks report with their lease heartbeats (server/jobs_live.c): kept per rank, rates
 * over heartbeat windows, reset for another holder, and shown only for the current one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "batchwire/batchwire.h"
#include "server/jobs_int.h"

static Batchwire__V1__RankLive live(uint64_t step, uint64_t batches, uint64_t samples,
                                    uint64_t bytes)
{
    Batchwire__V1__RankLive l = BATCHWIRE__V1__RANK_LIVE__INIT;
    l.epoch = 2;
    l.step = step;
    l.epoch_steps = 100;
    l.batches = batches;
    l.samples = samples;
    l.bytes = bytes;
    l.wait_ms = 7;
    return l;
}

static void test_reports_rates_and_holders(void **state)
{
    (void)state;
    bw_rank_state r;
    memset(&r, 0, sizeof(r));
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__RankProgress p = BATCHWIRE__V1__RANK_PROGRESS__INIT;

    /* nothing reported yet: no live part */
    r.leased = true;
    r.lease = (bw_lease){1, 2};
    assert_int_equal(bw__jobs_live_fill(&r, 1000, &a, &p), BW_OK);
    assert_null(p.live);

    Batchwire__V1__RankLive l = live(10, 10, 80, 8000);
    bw__jobs_live_report(&r, r.lease, &l, 1000);
    l = live(30, 30, 240, 24000);
    bw__jobs_live_report(&r, r.lease, &l, 3000); /* 2 s later: 10 batches/s */
    assert_int_equal(bw__jobs_live_fill(&r, 3500, &a, &p), BW_OK);
    assert_non_null(p.live);
    assert_int_equal(p.live->epoch, 2);
    assert_int_equal(p.live->step, 30);
    assert_int_equal(p.live->epoch_steps, 100);
    assert_int_equal(p.live->batches, 30);
    assert_int_equal(p.live->samples, 240);
    assert_int_equal(p.live->bytes, 24000);
    assert_int_equal(p.live->wait_ms, 7);
    assert_true(p.batches_per_s == 10.0 && p.samples_per_s == 80.0 && p.bytes_per_s == 8000.0);
    assert_int_equal(p.ms_since_live, 500);

    /* another holder: its counters start over, the old holder's rate is gone */
    r.lease = (bw_lease){3, 4};
    Batchwire__V1__RankProgress q = BATCHWIRE__V1__RANK_PROGRESS__INIT;
    assert_int_equal(bw__jobs_live_fill(&r, 3600, &a, &q), BW_OK);
    assert_null(q.live); /* reported under the previous lease */
    l = live(31, 1, 8, 800);
    bw__jobs_live_report(&r, r.lease, &l, 4000);
    assert_int_equal(bw__jobs_live_fill(&r, 4000, &a, &q), BW_OK);
    assert_non_null(q.live);
    assert_int_equal(q.live->batches, 1);
    assert_true(q.batches_per_s == 0.0);

    /* a rank no longer leased shows nothing */
    r.leased = false;
    Batchwire__V1__RankProgress z = BATCHWIRE__V1__RANK_PROGRESS__INIT;
    assert_int_equal(bw__jobs_live_fill(&r, 4100, &a, &z), BW_OK);
    assert_null(z.live);
    bw__arena_reset(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reports_rates_and_holders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
