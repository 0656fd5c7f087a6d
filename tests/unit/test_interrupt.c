/* bw_interrupt (include/batchwire/batchwire.h, "Interrupting the library") from another
 * thread and from signals: a loader joining an unreachable coordinator, a gRPC call and a
 * stream in flight to a peer that never answers, a data-channel read, each return
 * BW_INTERRUPTED promptly instead of waiting out their deadlines; calls made while the flag is
 * raised return at once; the last-chance call of a closing loader ignores it. And
 * bw_interrupt_on_signals: chaining to the previous handler (plain and SA_SIGINFO), the
 * default disposition re-raised, SIG_IGN left alone, idempotence and reinstalling on top of a
 * replacement. Bounds are generous (the sanitizer build is slow): what they tell apart is a
 * prompt return from a 10 s deadline or a 60 s retry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "batchwire/loader.h"
#include "common/interrupt.h"
#include "common/util.h"
#include "health.pb-c.h"
#include "rpc/client.h"
#include "rpc/dchan.h"

enum { AFTER_MS = 300, PROMPT_MS = 1500 };

static uint64_t raised_at;

static void *interrupt_later(void *arg)
{
    (void)arg;
    usleep(AFTER_MS * 1000);
    raised_at = bw__mono_ms();
    bw_interrupt();
    return NULL;
}

/* Runs interrupt_later; returns the thread to join. */
static pthread_t start_interrupter(void)
{
    bw_interrupt_clear();
    raised_at = 0;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, interrupt_later, NULL), 0);
    return t;
}

/* How long after the interrupt the call returned; the interrupt must have come first. */
static uint64_t since_interrupt(pthread_t t)
{
    uint64_t now = bw__mono_ms();
    pthread_join(t, NULL);
    assert_true(raised_at != 0 && now >= raised_at);
    return now - raised_at;
}

/* A loopback port nothing listens on. */
static int closed_port(void)
{
    int fd, port;
    char err[256];
    assert_int_equal(bw__sock_listen("127.0.0.1:0", &fd, &port, err, sizeof(err)), BW_OK);
    close(fd);
    return port;
}

static void loader_options(bw_loader_options *o, const char *addr)
{
    bw_loader_options_init(o);
    o->coordinator = addr;
    o->job = "interrupt";
    o->dataset = "npy:none.npy";
    o->rank = 0;
    o->world_size = 1;
    o->retry_ms = 60000;
}

static void test_open_while_retrying(void **state)
{
    (void)state;
    char addr[64], err[1024];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", closed_port());
    bw_loader_options o;
    loader_options(&o, addr);
    bw_loader *l = (bw_loader *)1;
    pthread_t t = start_interrupter();
    assert_int_equal(bw_loader_open(&o, &l, err, sizeof(err)), BW_INTERRUPTED);
    uint64_t took = since_interrupt(t);
    assert_null(l);
    assert_non_null(strstr(err, "interrupted"));
    assert_non_null(strstr(err, addr));
    assert_true(took < PROMPT_MS);

    /* Raised: every blocking entry returns at once, before doing anything. */
    uint64_t t0 = bw__mono_ms();
    assert_int_equal(bw_loader_open(&o, &l, err, sizeof(err)), BW_INTERRUPTED);
    uint64_t steps = 7;
    assert_int_equal(bw_loader_rank_steps(&o, 0, &steps, err, sizeof(err)), BW_INTERRUPTED);
    assert_int_equal(steps, 0);
    char buf[256];
    assert_int_equal(bw_job_checkpoint(&o, buf, sizeof(buf), err, sizeof(err)), BW_INTERRUPTED);
    assert_true(bw__mono_ms() - t0 < PROMPT_MS);
    assert_true(bw_interrupted());
    bw_interrupt_clear();
    assert_false(bw_interrupted());

    /* Cleared: the call retries again (retry_ms bounds it now). */
    o.retry_ms = 300;
    assert_int_equal(bw_loader_open(&o, &l, err, sizeof(err)), BW_UNAVAILABLE);
    assert_non_null(strstr(err, " tries in "));
}

/* A peer that accepts TCP connections (the kernel does, from the backlog) and never speaks. */
static int silent_listener(char *addr, size_t len)
{
    int fd, port;
    char err[256];
    assert_int_equal(bw__sock_listen("127.0.0.1:0", &fd, &port, err, sizeof(err)), BW_OK);
    snprintf(addr, len, "127.0.0.1:%d", port);
    return fd;
}

static void test_call_in_flight(void **state)
{
    (void)state;
    char addr[64], err[1024];
    int lfd = silent_listener(addr, sizeof(addr));
    bw_rpc_channel_opts co;
    memset(&co, 0, sizeof(co));
    co.target = addr;
    bw_rpc_channel *ch = NULL;
    assert_int_equal(bw__rpc_channel_open(&co, &ch, err, sizeof(err)), BW_OK);
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp = NULL;

    pthread_t t = start_interrupter();
    int rc = bw__rpc_call(ch, BW_METHOD(BW_M_HEALTH_CHECK), &req.base, &a, &resp, 10000, err,
                          sizeof(err));
    uint64_t took = since_interrupt(t);
    assert_int_equal(rc, BW_INTERRUPTED);
    assert_non_null(strstr(err, "interrupted"));
    assert_true(took < PROMPT_MS);

    /* Raised: a call returns at once; the last-chance call ignores the flag and waits its
     * (short) deadline out. */
    uint64_t t0 = bw__mono_ms();
    assert_int_equal(bw__rpc_call(ch, BW_METHOD(BW_M_HEALTH_CHECK), &req.base, &a, &resp, 10000,
                                  err, sizeof(err)),
                     BW_INTERRUPTED);
    assert_true(bw__mono_ms() - t0 < PROMPT_MS);
    t0 = bw__mono_ms();
    rc = bw__rpc_call_uninterrupted(ch, BW_METHOD(BW_M_HEALTH_CHECK), &req.base, &a, &resp, 300,
                                    err, sizeof(err));
    assert_int_not_equal(rc, BW_INTERRUPTED);
    assert_int_not_equal(rc, BW_OK);
    assert_true(bw__mono_ms() - t0 >= 250);

    /* A server stream being read. */
    t = start_interrupter();
    bw_rpc_stream *st = NULL;
    assert_int_equal(bw__rpc_stream_open(ch, BW_METHOD(BW_M_HEALTH_CHECK), &req.base, 10000, &st,
                                         err, sizeof(err)),
                     BW_OK);
    struct grpc_byte_buffer *msg = NULL;
    rc = bw__rpc_stream_next_raw(st, &msg, err, sizeof(err));
    took = since_interrupt(t);
    assert_int_equal(rc, BW_INTERRUPTED);
    assert_null(msg);
    assert_true(took < PROMPT_MS);
    bw__rpc_stream_close(st);
    bw_interrupt_clear();

    /* Waiting for the channel to connect. */
    t = start_interrupter();
    assert_false(bw__rpc_channel_wait(ch, 10000));
    assert_true(since_interrupt(t) < PROMPT_MS);
    bw_interrupt_clear();

    bw__arena_reset(&a);
    bw__rpc_channel_close(ch);
    close(lfd);
}

static void test_socket_read(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    char buf[16], err[256];
    bw__interrupt_enable(); /* what opening a loader does */
    pthread_t t = start_interrupter();
    int rc =
        bw__sock_read_all(sv[0], buf, sizeof(buf), bw__mono_ms() + 10000, NULL, err, sizeof(err));
    uint64_t took = since_interrupt(t);
    assert_int_equal(rc, BW_INTERRUPTED);
    assert_non_null(strstr(err, "interrupted"));
    assert_true(took < PROMPT_MS);
    assert_int_equal(bw__sleep_ms(10000), BW_INTERRUPTED); /* raised: at once */
    bw_interrupt_clear();
    assert_int_equal(bw__sleep_ms(20), BW_OK);
    close(sv[0]);
    close(sv[1]);
}

/* ---- bw_interrupt_on_signals ---- */

static volatile sig_atomic_t plain_calls, other_calls, info_calls, info_signo;

static void plain_handler(int sig)
{
    (void)sig;
    plain_calls++;
}

static void other_handler(int sig)
{
    (void)sig;
    other_calls++;
}

static void info_handler(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    info_calls++;
    info_signo = info ? info->si_signo : -1;
}

static bool ours_installed(int sig)
{
    struct sigaction cur;
    sigaction(sig, NULL, &cur);
    return (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction != info_handler;
}

static void test_signals(void **state)
{
    (void)state;
    struct sigaction saved_int, saved_term;
    sigaction(SIGINT, NULL, &saved_int);
    sigaction(SIGTERM, NULL, &saved_term);
    bw_interrupt_clear();

    /* The previous handler is called after the interrupt is raised. */
    signal(SIGTERM, plain_handler);
    signal(SIGINT, SIG_IGN);
    assert_int_equal(bw_interrupt_on_signals(), BW_OK);
    assert_true(ours_installed(SIGTERM));
    raise(SIGTERM);
    assert_int_equal(plain_calls, 1);
    assert_true(bw_interrupted());
    bw_interrupt_clear();

    /* SIG_IGN stays ignored: no handler, no interrupt. */
    struct sigaction cur;
    sigaction(SIGINT, NULL, &cur);
    assert_true(!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN);
    raise(SIGINT);
    assert_false(bw_interrupted());

    /* Idempotent: the previous handler is still called once per signal. */
    assert_int_equal(bw_interrupt_on_signals(), BW_OK);
    raise(SIGTERM);
    assert_int_equal(plain_calls, 2);
    bw_interrupt_clear();

    /* Replaced since (as Python's signal.signal does): installed again on top, chaining to
     * the replacement. */
    signal(SIGTERM, other_handler);
    raise(SIGTERM);
    assert_false(bw_interrupted()); /* ours was gone */
    assert_int_equal(other_calls, 1);
    assert_int_equal(bw_interrupt_on_signals(), BW_OK);
    raise(SIGTERM);
    assert_true(bw_interrupted());
    assert_int_equal(other_calls, 2);
    assert_int_equal(plain_calls, 2);
    bw_interrupt_clear();

    /* A previous SA_SIGINFO handler gets its siginfo. */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = info_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    assert_int_equal(bw_interrupt_on_signals(), BW_OK);
    raise(SIGINT);
    assert_int_equal(info_calls, 1);
    assert_int_equal(info_signo, SIGINT);
    assert_true(bw_interrupted());
    bw_interrupt_clear();

    /* The default disposition: the process still ends by the signal. */
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        bw_interrupt_on_signals();
        raise(SIGTERM);
        _exit(3); /* not reached */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGTERM);

    sigaction(SIGINT, &saved_int, NULL);
    sigaction(SIGTERM, &saved_term, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signals),
        cmocka_unit_test(test_socket_read),
        cmocka_unit_test(test_call_in_flight),
        cmocka_unit_test(test_open_while_retrying),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
