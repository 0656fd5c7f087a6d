/* Small helpers with no better home (util.h): clocks, deadlines and condition variables on
 * the monotonic clock, randomness, the host name, malloc tuning. */
#include "common/util.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

uint64_t bw__mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t bw__mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t bw__unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t bw__random_u64(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof(v), 0) == (ssize_t)sizeof(v))
        return v;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    v ^= v >> 33;
    v *= 0xff51afd7ed558ccdULL;
    v ^= v >> 33;
    return v;
}

void bw__hostname(char *out, size_t outlen)
{
    if (outlen == 0)
        return;
    if (gethostname(out, outlen) != 0)
        snprintf(out, outlen, "unknown");
    else
        out[outlen - 1] = '\0';
}

void bw__cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
}

struct timespec bw__mono_deadline(uint64_t ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static void tune_malloc_once(void)
{
    const char *off = getenv("BATCHWIRE_MALLOC_TUNING");
    if ((off && strcmp(off, "0") == 0) || getenv("MALLOC_MMAP_THRESHOLD_") ||
        getenv("MALLOC_TRIM_THRESHOLD_"))
        return;
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void bw__tune_malloc(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, tune_malloc_once);
}
