#include "rpc/daemon.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

static void term_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
}

void bw__daemon_block_signals(void)
{
    sigset_t set;
    term_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int bw__daemon_wait_signal(int timeout_ms)
{
    sigset_t set;
    term_set(&set);
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    int sig = sigtimedwait(&set, NULL, &ts);
    if (sig < 0)
        return 0; /* EAGAIN (timeout) or EINTR */
    return sig;
}

#include <stdio.h>
#include <grpc/support/log.h>
#include <string.h>

/* gRPC's own log lines (handshake failures and the like) in our format and level. */
static void grpc_log(gpr_log_func_args *args)
{
    bw_log_level level = args->severity == GPR_LOG_SEVERITY_ERROR  ? BW_LOG_WARN
                         : args->severity == GPR_LOG_SEVERITY_INFO ? BW_LOG_INFO
                                                                   : BW_LOG_DEBUG;
    BW_LOG(level, "grpc: %s", args->message);
}

void bw__daemon_route_grpc_logs(bw_log_level level)
{
    gpr_set_log_function(grpc_log);
    gpr_set_log_verbosity(level >= BW_LOG_DEBUG ? GPR_LOG_SEVERITY_DEBUG : GPR_LOG_SEVERITY_ERROR);
}

void bw__daemon_server_opts(const bw_daemon_common *c, const char *role, bw_rpc_server_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->listen = c->listen;
    o->tls.cert = c->tls_cert;
    o->tls.key = c->tls_key;
    o->tls.client_ca = c->tls_client_ca;
    o->threads = (int)c->threads;
    o->requests_per_method = 4;
    o->max_receive_bytes = (int)c->max_message_bytes;
    /* An unpacked request can be a few times its wire size; the response shares the arena. */
    o->call_memory_limit = (size_t)c->max_message_bytes * 4 + (1u << 20);
    o->role = role;
}
