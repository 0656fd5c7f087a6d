/* CRC-32C (Castagnoli), as used by iSCSI, ext4 and LevelDB: polynomial 0x1EDC6F41, reflected,
 * initial value and final xor 0xFFFFFFFF. crc32c("123456789") == 0xE3069283. */
#ifndef BW_JOURNAL_CRC32C_H
#define BW_JOURNAL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends `crc` (0 for a fresh checksum) over `len` bytes. Pure; thread-safe. */
uint32_t bw__crc32c(uint32_t crc, const void *data, size_t len);

#endif
