/* The table path is ~1-2 GB/s and byte-order independent; SSE4.2's crc32 instruction is
 * several times faster and serves TFRecord reads where the CPU has it. The instruction has a
 * latency of three cycles and a throughput of one, so the hardware path runs three
 * independent CRCs over three adjacent blocks and joins them: the register after a block of
 * S bytes started from r is shift_S(r) ^ (the register of the block started from 0), and
 * shift_S, being linear, is four table lookups (tables made once). */
#include "common/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

enum { BLOCK = 256 }; /* bytes per stream of the three-way hardware loop */

static uint32_t table[8][256];
static uint32_t shift1[4][256], shift2[4][256]; /* by BLOCK and by 2 * BLOCK zero bytes */
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

/* The register after n zero bytes, from r (table[0] made). */
static uint32_t zeros(uint32_t r, size_t n)
{
    while (n--)
        r = (r >> 8) ^ table[0][r & 0xff];
    return r;
}

static void table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
    for (uint32_t k = 0; k < 4; k++)
        for (uint32_t i = 0; i < 256; i++) {
            shift1[k][i] = zeros(i << (8 * k), BLOCK);
            shift2[k][i] = zeros(shift1[k][i], BLOCK);
        }
}

static uint32_t shift(const uint32_t t[4][256], uint32_t r)
{
    return t[0][r & 0xff] ^ t[1][(r >> 8) & 0xff] ^ t[2][(r >> 16) & 0xff] ^ t[3][r >> 24];
}

uint32_t bw__crc32c_table(uint32_t crc, const uint8_t *p, size_t len)
{
    pthread_once(&table_once, table_init);
    while (len >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
              table[4][lo >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^
              table[0][p[7]];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t bw__crc32c_sse42(uint32_t crc, const uint8_t *p,
                                                            size_t len)
{
    uint64_t c = crc;
    if (len >= 3 * BLOCK)
        pthread_once(&table_once, table_init);
    while (len >= 3 * BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < BLOCK; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + BLOCK + i, 8);
            memcpy(&w2, p + 2 * BLOCK + i, 8);
            c = _mm_crc32_u64(c, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        c = shift(shift2, (uint32_t)c) ^ shift(shift1, (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * BLOCK;
        len -= 3 * BLOCK;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}
#endif

uint32_t bw__crc32c(uint32_t crc, const void *data, size_t len)
{
    crc = ~crc;
#if defined(__x86_64__)
    static _Atomic int hw = -1; /* benign race: every thread computes the same */
    if (hw < 0)
        hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    if (hw)
        return ~bw__crc32c_sse42(crc, data, len);
#endif
    return ~bw__crc32c_table(crc, data, len);
}
