/* The process-wide interrupt: the flag bw_interrupt() raises, the SIGINT/SIGTERM handlers of
 * bw_interrupt_on_signals() that raise it and pass the signal on, and the sliced waits
 * (interrupt.h) through which blocking calls notice it. Semantics: include/batchwire/batchwire.h
 * and docs/client.md, "Signals". */
#include "common/interrupt.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "batchwire/batchwire.h"
#include "common/util.h"

/* Lock-free atomics: safe to touch from a signal handler. */
static atomic_int raised;
static atomic_bool sliced;

void bw_interrupt(void)
{
    atomic_store(&raised, 1);
}

void bw_interrupt_clear(void)
{
    atomic_store(&raised, 0);
}

int bw_interrupted(void)
{
    return atomic_load(&raised);
}

bool bw__interrupted(void)
{
    return atomic_load(&raised) != 0;
}

void bw__interrupt_enable(void)
{
    atomic_store(&sliced, true);
}

int bw__interrupt_slice(int ms)
{
    if (!atomic_load(&sliced) && !atomic_load(&raised))
        return ms;
    return ms < 0 || ms > BW_INTERRUPT_SLICE_MS ? BW_INTERRUPT_SLICE_MS : ms;
}

int bw__poll(struct pollfd *pf, nfds_t n, int timeout_ms)
{
    uint64_t end = bw__mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        if (bw__interrupted()) {
            errno = EINTR;
            return -1;
        }
        uint64_t now = bw__mono_ms();
        int left = timeout_ms < 0 ? -1 : now < end ? (int)(end - now) : 0;
        int r = poll(pf, n, bw__interrupt_slice(left));
        if (r > 0 || (r < 0 && errno != EINTR))
            return r;
        if (r == 0 && left >= 0 && bw__mono_ms() >= end)
            return 0;
    }
}

int bw__sleep_ms(uint64_t ms)
{
    uint64_t end = bw__mono_ms() + ms;
    for (;;) {
        if (bw__interrupted())
            return BW_INTERRUPTED;
        uint64_t now = bw__mono_ms();
        if (now >= end)
            return BW_OK;
        uint64_t part = end - now < BW_INTERRUPT_SLICE_MS ? end - now : BW_INTERRUPT_SLICE_MS;
        struct timespec ts = {(time_t)(part / 1000), (long)(part % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

void bw__cond_wait_slice(pthread_cond_t *cv, pthread_mutex_t *mu)
{
    struct timespec until = bw__mono_deadline(BW_INTERRUPT_SLICE_MS);
    pthread_cond_timedwait(cv, mu, &until);
}

/* ---- bw_interrupt_on_signals ---- */

static const int handled[2] = {SIGINT, SIGTERM};
/* What each signal did before our handler: written only while our handler is not installed
 * for that signal (under install_mu), read by the handler. */
static struct sigaction before[2];
/* Handlers running the chain: a chain that comes back to us (a handler that saved ours as
 * its predecessor) ends there instead of recursing. */
static atomic_int chaining[2];
static pthread_mutex_t install_mu = PTHREAD_MUTEX_INITIALIZER;

/* The signal's default disposition again (async-signal-safe). */
static void set_default(int sig)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
}

static void on_signal(int sig, siginfo_t *info, void *ctx)
{
    int saved = errno;
    bw_interrupt();
    size_t i = sig == handled[0] ? 0 : 1;
    if (atomic_fetch_add(&chaining[i], 1) == 0) {
        const struct sigaction *p = &before[i];
        if (p->sa_flags & SA_SIGINFO) {
            if (p->sa_sigaction)
                p->sa_sigaction(sig, info, ctx);
        } else if (p->sa_handler == SIG_DFL) {
            /* What the signal would have done: blocked while this handler runs, it takes
             * its default action as soon as the handler returns. */
            set_default(sig);
            raise(sig);
        } else if (p->sa_handler != SIG_IGN) {
            p->sa_handler(sig);
        }
        if (p->sa_flags & SA_RESETHAND) { /* it was to be called once, then the default */
            set_default(sig);
        }
    }
    atomic_fetch_sub(&chaining[i], 1);
    errno = saved;
}

int bw_interrupt_on_signals(void)
{
    int rc = BW_OK;
    pthread_mutex_lock(&install_mu);
    for (size_t i = 0; i < 2; i++) {
        struct sigaction cur;
        if (sigaction(handled[i], NULL, &cur) != 0) {
            rc = BW_INTERNAL;
            continue;
        }
        if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_signal)
            continue; /* ours, still in place */
        if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)
            continue; /* ignored on purpose (nohup): it interrupts nothing */
        before[i] = cur;
        struct sigaction mine;
        memset(&mine, 0, sizeof(mine));
        mine.sa_sigaction = on_signal;
        mine.sa_flags = SA_SIGINFO | (cur.sa_flags & (SA_RESTART | SA_ONSTACK));
        mine.sa_mask = cur.sa_mask;
        if (sigaction(handled[i], &mine, NULL) != 0)
            rc = BW_INTERNAL;
    }
    pthread_mutex_unlock(&install_mu);
    bw__interrupt_enable();
    return rc;
}
