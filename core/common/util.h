/* Small helpers with no better home: clocks, randomness, host name. */
#ifndef BW_COMMON_UTIL_H
#define BW_COMMON_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Milliseconds on the monotonic clock (for intervals). */
uint64_t bw__mono_ms(void);

/* Nanoseconds on the monotonic clock (for latencies). */
uint64_t bw__mono_ns(void);

/* Milliseconds since the Unix epoch (for timestamps shown to people). */
uint64_t bw__unix_ms(void);

/* 64 random bits from the kernel (getrandom); falls back to clock and pid mixing. */
uint64_t bw__random_u64(void);

/* The host name, or "unknown". */
void bw__hostname(char *out, size_t outlen);

/* Little-endian integers in byte buffers (file formats, journal, data channel). */
static inline void bw__put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void bw__put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t bw__get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t bw__get_le64(const uint8_t *p)
{
    return (uint64_t)bw__get_le32(p) | (uint64_t)bw__get_le32(p + 4) << 32;
}

#endif

#include <pthread.h>
#include <time.h>

/*
 * Tells glibc's malloc to keep freed memory for reuse instead of handing it back to the
 * kernel after every message: gRPC allocates and frees its receive buffers per message, and
 * with glibc's defaults every reuse page-faults freshly zeroed memory (a third of the client's
 * time at 1 MiB samples; docs/performance.md). Sets M_MMAP_THRESHOLD to 64 MiB and
 * M_TRIM_THRESHOLD to 1 GiB, once per process, unless the process set MALLOC_MMAP_THRESHOLD_
 * or MALLOC_TRIM_THRESHOLD_ itself or BATCHWIRE_MALLOC_TUNING=0. Memory stays bounded by the
 * peak in use (the loader's prefetch depth), it is just not returned early.
 */
void bw__tune_malloc(void);

/* A condition variable whose timed waits use CLOCK_MONOTONIC. */
void bw__cond_init_mono(pthread_cond_t *cv);

/* The CLOCK_MONOTONIC time `ms` from now, for pthread_cond_timedwait on such a variable. */
struct timespec bw__mono_deadline(uint64_t ms);
