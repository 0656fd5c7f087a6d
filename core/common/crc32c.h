/* CRC-32C (Castagnoli), as TFRecord uses it: with SSE4.2 when the CPU has it, else a
 * slicing-by-8 table. Pure functions; thread-safe. */
#ifndef BW_FORMATS_CRC32C_H
#define BW_FORMATS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends `crc` (0 to start) over len bytes. */
uint32_t bw__fmt_crc32c(uint32_t crc, const void *data, size_t len);

/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
static inline uint32_t bw__fmt_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

#endif
