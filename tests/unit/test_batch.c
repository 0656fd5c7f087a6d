/* A batch's memory (client/lib/batch.c): the buffer a hold takes when the loader fills the
 * slot again (bw__batch_reuse), the spare buffers released holds give back, and held bytes
 * that outlive the batch and the loader (docs/client.md, "Views of a batch"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "../../client/lib/batch_int.h"

/* A batch of 4 samples whose buffer holds `n` bytes of `byte`, as a fetch leaves it. */
static void filled(bw_batch *b, size_t n, uint8_t byte)
{
    assert_int_equal(bw__batch_init(b, 4, 0, false), BW_OK);
    assert_int_equal(bw__batch_reserve(b, n), BW_OK);
    memset(b->data, byte, n);
    b->nbytes = n;
}

/* A loader's holds, and a filled batch with a hold on it. */
static bw__holds *held(bw_batch *b, size_t n, uint8_t byte, bw_hold **h)
{
    bw__holds *holds = NULL;
    assert_int_equal(bw__holds_new(&holds), BW_OK);
    filled(b, n, byte);
    assert_int_equal(bw__hold_take(holds, b, h), BW_OK);
    return holds;
}

static void assert_bytes(const void *p, size_t n, uint8_t byte)
{
    for (size_t i = 0; i < n; i++)
        assert_int_equal(((const uint8_t *)p)[i], byte);
}

/* Nobody holds the batch: filling it again keeps its buffer. */
static void test_reuse_unheld(void **state)
{
    (void)state;
    bw_batch b;
    filled(&b, 5000, 0xab);
    uint8_t *data = b.data;
    size_t cap = b.cap;
    bw__batch_reuse(&b);
    assert_ptr_equal(b.data, data);
    assert_int_equal(b.cap, cap);
    bw__batch_free(&b);
}

/* A hold still viewing the batch takes its buffer (its bytes unchanged while the slot is
 * filled again); the slot continues with a new buffer as large; once released, the buffer is
 * a spare that the next reuse of a held slot takes instead of allocating. */
static void test_reuse_held(void **state)
{
    (void)state;
    bw_batch b;
    bw_hold *h = NULL;
    bw__holds *holds = held(&b, 5000, 0xab, &h);
    uint8_t *first = b.data;
    size_t cap = b.cap;
    assert_ptr_equal(bw_hold_data(h), first);
    assert_int_equal(bw_hold_nbytes(h), 5000);

    bw__batch_reuse(&b);
    assert_null(b.hold);
    assert_non_null(b.data);
    assert_ptr_not_equal(b.data, first);
    assert_int_equal(b.cap, cap);
    memset(b.data, 0xcd, 5000); /* the next batch */
    assert_ptr_equal(bw_hold_data(h), first);
    assert_bytes(bw_hold_data(h), 5000, 0xab);

    bw_hold_release(h); /* the first buffer becomes a spare */
    bw_hold *h2 = NULL;
    assert_int_equal(bw__hold_take(holds, &b, &h2), BW_OK);
    uint8_t *second = b.data;
    bw__batch_reuse(&b);
    assert_ptr_equal(b.data, first);
    assert_bytes(bw_hold_data(h2), 5000, 0xcd);
    assert_ptr_equal(bw_hold_data(h2), second);
    bw_hold_release(h2);
    bw__batch_free(&b);
    bw__holds_close(holds);
}

/* Every view released before the slot is filled again: the hold goes, the buffer stays. */
static void test_reuse_released(void **state)
{
    (void)state;
    bw_batch b;
    bw_hold *h = NULL, *again = NULL;
    bw__holds *holds = held(&b, 100, 0x11, &h);
    uint8_t *data = b.data;
    assert_int_equal(bw__hold_take(holds, &b, &again), BW_OK);
    assert_ptr_equal(h, again); /* one hold per batch, referenced twice */
    bw_hold_release(h);
    bw_hold_release(again);
    bw__batch_reuse(&b);
    assert_null(b.hold);
    assert_ptr_equal(b.data, data);
    bw__batch_free(&b);
    bw__holds_close(holds);
}

/* Held bytes outlive the batch and the loader's holds; the last release frees them. */
static void test_hold_outlives_loader(void **state)
{
    (void)state;
    bw_batch b;
    bw_hold *h = NULL;
    bw__holds *holds = held(&b, 3000, 0x5a, &h);
    bw__batch_free(&b);
    bw__holds_close(holds);
    assert_bytes(bw_hold_data(h), 3000, 0x5a);
    bw_hold_release(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_unheld),
        cmocka_unit_test(test_reuse_held),
        cmocka_unit_test(test_reuse_released),
        cmocka_unit_test(test_hold_outlives_loader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
