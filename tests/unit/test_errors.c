/* The error list: names, messages and the mapping to and from gRPC status codes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/errors.h"

static void test_names_and_messages(void **state)
{
    (void)state;
    assert_string_equal(bw_err_name(BW_OK), "BW_OK");
    assert_string_equal(bw_err_name(BW_TIMEOUT), "BW_TIMEOUT");
    assert_string_equal(bw_strerror(BW_TIMEOUT), "deadline exceeded");
    assert_string_equal(bw_err_name(-9999), "BW_UNKNOWN_ERROR");
    assert_string_equal(bw_strerror(-9999), "unknown error");
    assert_string_equal(bw_err_name(42), "BW_UNKNOWN_ERROR");
}

/* Stable numbers: these are part of the ABI and must never change. */
static void test_numbers_are_stable(void **state)
{
    (void)state;
    assert_int_equal(BW_OK, 0);
    assert_int_equal(BW_INVALID_ARGUMENT, -1);
    assert_int_equal(BW_UNAVAILABLE, -7);
    assert_int_equal(BW_CORRUPT, -10);
    assert_int_equal(BW_WRONG_OWNER, -19);
    assert_int_equal(BW_INTERNAL, -23);
    assert_int_equal(BW_BUSY, -24);
    assert_int_equal(BW_LEASE_LOST, -25);
}

static void test_every_code_is_distinct_and_named(void **state)
{
    (void)state;
    static const int codes[] = {
#define X(name, num, grpc, msg) num,
        BW_ERR_MAP(X)
#undef X
    };
    size_t n = sizeof(codes) / sizeof(codes[0]);
    for (size_t i = 0; i < n; i++) {
        assert_string_not_equal(bw_err_name(codes[i]), "BW_UNKNOWN_ERROR");
        assert_int_equal(bw__err_from_name(bw_err_name(codes[i])), codes[i]);
        for (size_t j = i + 1; j < n; j++)
            assert_int_not_equal(codes[i], codes[j]);
    }
    assert_int_equal(bw__err_from_name("BW_NOPE"), 1);
}

static void test_grpc_mapping(void **state)
{
    (void)state;
    assert_int_equal(bw__err_to_grpc(BW_OK), GRPC_STATUS_OK);
    assert_int_equal(bw__err_to_grpc(BW_INVALID_ARGUMENT), GRPC_STATUS_INVALID_ARGUMENT);
    assert_int_equal(bw__err_to_grpc(BW_UNAVAILABLE), GRPC_STATUS_UNAVAILABLE);
    assert_int_equal(bw__err_to_grpc(BW_TIMEOUT), GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_int_equal(bw__err_to_grpc(BW_TOO_BIG), GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_int_equal(bw__err_to_grpc(BW_CORRUPT), GRPC_STATUS_DATA_LOSS);
    assert_int_equal(bw__err_to_grpc(BW_ABORTED), GRPC_STATUS_ABORTED);
    /* gRPC's rule: do not retry a placement change blindly, refresh first. */
    assert_int_equal(bw__err_to_grpc(BW_WRONG_OWNER), GRPC_STATUS_FAILED_PRECONDITION);
    assert_int_equal(bw__err_to_grpc(BW_ALREADY_EXISTS), GRPC_STATUS_ALREADY_EXISTS);
    assert_int_equal(bw__err_to_grpc(BW_UNIMPLEMENTED), GRPC_STATUS_UNIMPLEMENTED);
    assert_int_equal(bw__err_to_grpc(-9999), GRPC_STATUS_UNKNOWN);

    /* Status codes that carry one meaning come back as that code. */
    assert_int_equal(bw__err_from_grpc(GRPC_STATUS_OK), BW_OK);
    assert_int_equal(bw__err_from_grpc(GRPC_STATUS_UNAVAILABLE), BW_UNAVAILABLE);
    assert_int_equal(bw__err_from_grpc(GRPC_STATUS_DEADLINE_EXCEEDED), BW_TIMEOUT);
    assert_int_equal(bw__err_from_grpc(GRPC_STATUS_UNIMPLEMENTED), BW_UNIMPLEMENTED);
    assert_int_equal(bw__err_from_grpc(GRPC_STATUS_UNKNOWN), BW_INTERNAL);
    assert_int_equal(bw__err_from_grpc((grpc_status_code)99), BW_INTERNAL);

    /* Round trip: mapping a code to gRPC and back lands on a code with the same status. */
#define X(name, num, grpc, msg)                                                                    \
    assert_int_equal(bw__err_to_grpc(bw__err_from_grpc(GRPC_STATUS_##grpc)), GRPC_STATUS_##grpc);
    BW_ERR_MAP(X)
#undef X
    assert_string_equal(bw__grpc_status_name(GRPC_STATUS_UNAVAILABLE), "UNAVAILABLE");
    assert_string_equal(bw__grpc_status_name((grpc_status_code)77), "UNKNOWN_STATUS");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_messages),
        cmocka_unit_test(test_numbers_are_stable),
        cmocka_unit_test(test_every_code_is_distinct_and_named),
        cmocka_unit_test(test_grpc_mapping),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
