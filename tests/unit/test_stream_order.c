/* The global order of multi-source streams and the pre-sharded layout (core/jobs/stream_order):
 * position <-> (source, record) round trips, empty sources, the per-epoch source reshuffle
 * against torch.randperm values, records consumed at a position, and pre-sharded batches. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "jobs/stream_order.h"

static void test_declared_order(void **state)
{
    (void)state;
    const uint64_t counts[] = {5, 0, 3, 7};
    bw__stream_order o;
    char err[256];
    assert_int_equal(bw__stream_order_init(&o, counts, 4, false, 0, 0, err, sizeof(err)), BW_OK);
    assert_int_equal(o.total, 15);
    uint64_t pos = 0;
    for (uint32_t s = 0; s < 4; s++)
        for (uint64_t r = 0; r < counts[s]; r++, pos++) {
            uint32_t src;
            uint64_t rec;
            assert_int_equal(bw__stream_order_locate(&o, pos, &src, &rec), BW_OK);
            assert_int_equal(src, s);
            assert_int_equal(rec, r);
            assert_int_equal(bw__stream_order_position(&o, s, r), pos);
        }
    uint32_t src;
    uint64_t rec;
    assert_int_equal(bw__stream_order_locate(&o, 15, &src, &rec), BW_OUT_OF_RANGE);
    /* consumed at a position: sources before it whole, the one holding it partly */
    assert_int_equal(bw__stream_order_consumed(&o, 0, 6), 5);
    assert_int_equal(bw__stream_order_consumed(&o, 1, 6), 0);
    assert_int_equal(bw__stream_order_consumed(&o, 2, 6), 1);
    assert_int_equal(bw__stream_order_consumed(&o, 3, 6), 0);
    assert_int_equal(bw__stream_order_consumed(&o, 3, 15), 7);
    bw__stream_order_free(&o);
    bw__stream_order_free(&o); /* idempotent */
    assert_int_equal(bw__stream_order_init(&o, counts, 0, false, 0, 0, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
}

static void test_shuffled_sources(void **state)
{
    (void)state;
    /* torch.randperm(7, generator=torch.Generator().manual_seed(11)) and seed 0 (python3-torch) */
    const uint32_t perm11[] = {4, 0, 2, 6, 3, 1, 5};
    const uint32_t perm0[] = {4, 0, 5, 3, 2, 6, 1};
    uint64_t counts[7];
    for (int i = 0; i < 7; i++)
        counts[i] = (uint64_t)i + 1;
    bw__stream_order o;
    char err[256];
    /* seed 10, epoch 1: seeded with 11 */
    assert_int_equal(bw__stream_order_init(&o, counts, 7, true, 10, 1, err, sizeof(err)), BW_OK);
    assert_memory_equal(o.order, perm11, sizeof(perm11));
    uint64_t pos = 0;
    for (int k = 0; k < 7; k++)
        for (uint64_t r = 0; r < counts[perm11[k]]; r++, pos++) {
            uint32_t src;
            uint64_t rec;
            assert_int_equal(bw__stream_order_locate(&o, pos, &src, &rec), BW_OK);
            assert_int_equal(src, perm11[k]);
            assert_int_equal(rec, r);
        }
    bw__stream_order_free(&o);
    /* seed + epoch wraps as a 64-bit sum */
    assert_int_equal(bw__stream_order_init(&o, counts, 7, true, UINT64_MAX, 1, err, sizeof(err)),
                     BW_OK);
    assert_memory_equal(o.order, perm0, sizeof(perm0));
    bw__stream_order_free(&o);
}

static void test_preshard(void **state)
{
    (void)state;
    const uint64_t counts[] = {7, 3, 5};
    bw__preshard p;
    char err[256];
    uint64_t rec[4];
    uint8_t pad[4];
    size_t real;
    /* ceil(7/4) = 2 steps for everyone; rank 1 cycles its 3 records */
    assert_int_equal(bw__preshard_init(&p, counts, 3, 4, false, err, sizeof(err)), BW_OK);
    assert_int_equal(p.steps, 2);
    assert_int_equal(bw__preshard_batch(&p, 1, 0, rec, pad, &real), 4);
    assert_int_equal(real, 3);
    assert_int_equal(rec[3], 0);
    assert_int_equal(pad[3], 1);
    assert_int_equal(bw__preshard_batch(&p, 1, 1, rec, pad, &real), 4);
    assert_int_equal(real, 0);
    const uint64_t want[] = {1, 2, 0, 1};
    assert_memory_equal(rec, want, sizeof(want));
    assert_int_equal(bw__preshard_batch(&p, 0, 2, rec, pad, &real), 0);
    assert_int_equal(bw__preshard_consumed(&p, 0, 1), 4);
    assert_int_equal(bw__preshard_consumed(&p, 1, 2), 3);
    /* drop_last: floor(3/4) = 0 steps for everyone */
    assert_int_equal(bw__preshard_init(&p, counts, 3, 4, true, err, sizeof(err)), BW_OK);
    assert_int_equal(p.steps, 0);
    assert_int_equal(bw__preshard_init(&p, counts, 3, 2, true, err, sizeof(err)), BW_OK);
    assert_int_equal(p.steps, 1);
    /* an empty source cannot be padded */
    const uint64_t holes[] = {4, 0};
    assert_int_equal(bw__preshard_init(&p, holes, 2, 2, false, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "cannot be padded"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declared_order),
        cmocka_unit_test(test_shuffled_sources),
        cmocka_unit_test(test_preshard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
