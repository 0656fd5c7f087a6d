/* CRC-32C (Castagnoli), as used by iSCSI, ext4, LevelDB, the coordinator's journal and
 * TFRecord: polynomial 0x1EDC6F41, reflected, initial value and final xor 0xFFFFFFFF;
 * crc32c("123456789") == 0xE3069283. With SSE4.2 when the CPU has it, else a slicing-by-8
 * table. Pure functions; thread-safe. */
#ifndef BW_COMMON_CRC32C_H
#define BW_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends `crc` (0 for a fresh checksum) over `len` bytes:
 * bw__crc32c(bw__crc32c(0, a, n), b, m) is the checksum of a followed by b. */
uint32_t bw__crc32c(uint32_t crc, const void *data, size_t len);

/* The two paths bw__crc32c chooses between, on the inverted register (~crc in, ~result out),
 * for the test that checks they agree: the slicing-by-8 table, and on x86-64 SSE4.2's crc32
 * instruction (call it only where __builtin_cpu_supports("sse4.2")). */
uint32_t bw__crc32c_table(uint32_t crc, const uint8_t *p, size_t len);
#if defined(__x86_64__)
uint32_t bw__crc32c_sse42(uint32_t crc, const uint8_t *p, size_t len);
#endif

/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
static inline uint32_t bw__crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

#endif
