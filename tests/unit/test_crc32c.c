/* CRC-32C (core/common/crc32c.c): known values, chaining, and the table path against the
 * SSE4.2 path on every length and alignment (crc32c.h declares both for this test). */
#include <string.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/crc32c.h"

static void test_known_values(void **state)
{
    (void)state;
    assert_int_equal(bw__crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(bw__crc32c(0, "", 0), 0);
    uint8_t zeros[32] = {0}, ones[32];
    memset(ones, 0xff, sizeof(ones));
    assert_int_equal(bw__crc32c(0, zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4 */
    assert_int_equal(bw__crc32c(0, ones, 32), 0x62A8AB43u);
    /* TFRecord's mask of crc32c(""), as TensorFlow writes it for an empty record */
    assert_int_equal(bw__crc32c_mask(0), 0xa282ead8u);
}

static void test_chaining(void **state)
{
    (void)state;
    uint32_t a = bw__crc32c(0, "1234", 4);
    assert_int_equal(bw__crc32c(a, "56789", 5), 0xE3069283u);
    uint8_t big[1000];
    for (int i = 0; i < 1000; i++)
        big[i] = (uint8_t)(i * 7);
    assert_int_equal(bw__crc32c(bw__crc32c(0, big, 333), big + 333, 667), bw__crc32c(0, big, 1000));
}

static void test_paths_agree(void **state)
{
    (void)state;
    uint8_t buf[3000]; /* past 3 x 256 bytes: the three-way hardware loop, and its tail */
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(i * 131 + 17);
    assert_int_equal(~bw__crc32c_table(~0u, (const uint8_t *)"123456789", 9), 0xE3069283u);
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("sse4.2"))
        skip();
    for (size_t off = 0; off < 8; off++)
        for (size_t len = 0; off + len <= sizeof(buf); len += 1 + len / 16)
            assert_int_equal(bw__crc32c_table(0x12345678u, buf + off, len),
                             bw__crc32c_sse42(0x12345678u, buf + off, len));
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_values),
        cmocka_unit_test(test_chaining),
        cmocka_unit_test(test_paths_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
