/* The process-wide interrupt (bw_interrupt, include/batchwire/batchwire.h): whether it is
 * raised, and the waits through which the client's blocking calls notice it -- every wait of
 * a client call is cut into slices of at most BW_INTERRUPT_SLICE_MS and looks at the flag
 * between them. */
#ifndef BW_COMMON_INTERRUPT_H
#define BW_COMMON_INTERRUPT_H

#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

enum { BW_INTERRUPT_SLICE_MS = 50 };

/* Whether bw_interrupt() was called and not cleared since. */
bool bw__interrupted(void);

/* From now on this process's waits are sliced (the client library calls it when it connects;
 * daemons never do, so their waits stay whole). */
void bw__interrupt_enable(void);

/* The part of a wait of `ms` (-1: without end) to wait before looking at the flag again: ms
 * itself while waits are not sliced. */
int bw__interrupt_slice(int ms);

/* poll() until an event, the timeout (-1: none), or an interrupt. Returns poll's result, or -1
 * with errno EINTR when interrupted (a signal's own EINTR is waited through). */
int bw__poll(struct pollfd *pf, nfds_t n, int timeout_ms);

/* Sleeps `ms`; BW_OK, or BW_INTERRUPTED as soon as the flag is raised. */
int bw__sleep_ms(uint64_t ms);

/* pthread_cond_timedwait on a CLOCK_MONOTONIC condition variable (bw__cond_init_mono) for at
 * most one slice; the caller looks at its condition and at bw__interrupted() again. */
void bw__cond_wait_slice(pthread_cond_t *cv, pthread_mutex_t *mu);

#endif
