/* The public API's ABI rules (include/batchwire/loader.h; docs/client.md, "The C API's
 * contracts"), without a cluster: bw_loader_options read by its size (a struct never
 * initialised and a newer program's set field refused with a sentence before any call, a newer
 * program's unset fields and an older program's shorter struct accepted), the init writing only
 * the caller's size, and bw_cursor_describe on a real cursor (binary and text), a damaged one,
 * and into shorter and longer structs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "batchwire/loader.h"
#include "common/arena.h"
#include "cursor/cursor.h"

enum { EXTRA = 64 };

/* A program built against a newer header: its struct is EXTRA bytes longer. */
typedef struct {
    bw_loader_options known;
    unsigned char newer[EXTRA];
} newer_options;

/* rank_steps fails on the first thing it checks; err says what. */
static int steps_err(const bw_loader_options *o, char *err, size_t errlen)
{
    uint64_t steps = 7;
    err[0] = '\0';
    int rc = bw_loader_rank_steps(o, 0, &steps, err, errlen);
    assert_int_equal(steps, 0);
    assert_true(err[0] != '\0'); /* every failure leaves a sentence */
    return rc;
}

static void options_by_size(void **state)
{
    (void)state;
    char err[512];
    /* Never initialised: size 0. */
    bw_loader_options o;
    memset(&o, 0, sizeof(o));
    o.coordinator = "127.0.0.1:1";
    o.job = "j";
    assert_int_equal(steps_err(&o, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "bw_loader_options_init"));
    bw_loader *l = (bw_loader *)&o;
    assert_int_equal(bw_loader_open(&o, &l, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_null(l);
    assert_non_null(strstr(err, "size is 0"));
    assert_int_equal(bw_loader_open(NULL, &l, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "none given"));

    /* The macro sets the caller's size; the defaults are there. */
    bw_loader_options_init(&o);
    assert_int_equal(o.size, sizeof(o));
    assert_int_equal(o.rank, -1);
    assert_int_equal(o.prefetch_batches, 0); /* auto (docs/client.md, "Fetches ahead") */
    assert_string_equal(o.mode, "torch");
    /* A valid struct gets past the size check to the options' own: no coordinator. */
    assert_int_equal(steps_err(&o, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "coordinator"));

    /* A newer program's longer struct: the init zeroes what the library does not know, and
     * unset (zero) fields past the library's are accepted... */
    newer_options n;
    memset(&n, 0xab, sizeof(n));
    bw_loader_options_init_sized(&n.known, sizeof(n));
    assert_int_equal(n.known.size, sizeof(n));
    for (size_t i = 0; i < EXTRA; i++)
        assert_int_equal(n.newer[i], 0);
    assert_int_equal(steps_err(&n.known, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "coordinator"));
    /* ... a set one is refused, naming the sizes. */
    n.known.coordinator = "127.0.0.1:1";
    n.known.job = "j";
    n.newer[5] = 1;
    assert_int_equal(steps_err(&n.known, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "newer batchwire"));
    char ck[64];
    assert_int_equal(bw_job_checkpoint(&n.known, ck, sizeof(ck), err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "newer batchwire"));

    /* An older program's shorter struct (the first version's size) is read as far as it goes;
     * the init writes no byte past it. */
    unsigned char buf[sizeof(bw_loader_options) + 8];
    memset(buf, 0xcd, sizeof(buf));
    size_t v1 = offsetof(bw_loader_options, n_dataset_fields) + sizeof(size_t);
    bw_loader_options_init_sized((bw_loader_options *)buf, v1);
    for (size_t i = v1; i < sizeof(buf); i++)
        assert_int_equal(buf[i], 0xcd);
    bw_loader_options *old = (bw_loader_options *)buf;
    assert_int_equal(old->size, v1);
    assert_int_equal(steps_err(old, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "coordinator"));
    /* One byte short of the first version: refused. */
    old->size = v1 - 1;
    assert_int_equal(steps_err(old, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "first version"));
}

static void cursor_describe(void **state)
{
    (void)state;
    Batchwire__V1__Cursor c = BATCHWIRE__V1__CURSOR__INIT;
    c.job = "run-17";
    c.job_fingerprint = 0x1234abcdu;
    c.rank = 2;
    c.world_size = 4;
    c.epoch = 3;
    c.step = 41;
    size_t len;
    uint8_t *bin = bw__cursor_encode(&c, &len);
    assert_non_null(bin);
    char text[256], err[512];
    assert_true(bw__cursor_to_text(bin, len, text, sizeof(text)) > 0);

    bw_cursor_info info;
    memset(&info, 0xff, sizeof(info));
    assert_int_equal(bw_cursor_describe(bin, len, &info, sizeof(info), err, sizeof(err)), BW_OK);
    assert_string_equal(info.job, "run-17");
    assert_int_equal(info.fingerprint, 0x1234abcdu);
    assert_int_equal(info.rank, 2);
    assert_int_equal(info.world_size, 4);
    assert_int_equal(info.epoch, 3);
    assert_int_equal(info.step, 41);
    assert_int_equal(info.nsources, 0);
    bw_cursor_info t;
    assert_int_equal(bw_cursor_describe(text, 0, &t, sizeof(t), err, sizeof(err)), BW_OK);
    assert_memory_equal(&t, &info, sizeof(t));

    /* A longer struct reads 0 past this library's; a shorter one gets what fits. */
    struct {
        bw_cursor_info known;
        uint64_t later[4];
    } big;
    memset(&big, 0xff, sizeof(big));
    assert_int_equal(bw_cursor_describe(bin, len, &big.known, sizeof(big), err, sizeof(err)),
                     BW_OK);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(big.later[i], 0);
    unsigned char small[offsetof(bw_cursor_info, rank) + 4];
    memset(small, 0xee, sizeof(small));
    assert_int_equal(bw_cursor_describe(bin, len, (bw_cursor_info *)small,
                                        offsetof(bw_cursor_info, rank), err, sizeof(err)),
                     BW_OK);
    assert_string_equal((const char *)small, "run-17");
    for (size_t i = offsetof(bw_cursor_info, rank); i < sizeof(small); i++)
        assert_int_equal(small[i], 0xee);

    /* A flipped bit, text that is not a cursor, no cursor: refused with the reason. */
    bin[len / 2] ^= 0x10;
    err[0] = '\0';
    assert_int_equal(bw_cursor_describe(bin, len, &info, sizeof(info), err, sizeof(err)),
                     BW_CORRUPT);
    assert_non_null(strstr(err, "cursor refused"));
    assert_int_equal(bw_cursor_describe("bwc1:!!", 0, &info, sizeof(info), err, sizeof(err)),
                     BW_CORRUPT);
    assert_int_equal(bw_cursor_describe(NULL, 3, &info, sizeof(info), err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "no cursor"));
    free(bin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(options_by_size),
        cmocka_unit_test(cursor_describe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
