/* Process-level plumbing shared by the daemons (daemon.h): termination signals, the logging
 * and listener settings every daemon has, gRPC's own log lines routed through our logger, and
 * loading (and reloading on SIGHUP) --auth-tokens. */
#include "rpc/daemon.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

static void term_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
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

#include <grpc/support/log.h>
#include <stdio.h>
#include <string.h>

#include "common/progress.h"

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

void bw__daemon_logging(const bw_daemon_common *c, const char *component)
{
    bw__log_to_stderr(component, (bw_log_level)c->log_level);
    bw__log_set_format((bw__log_format)c->log_format);
    bw__daemon_route_grpc_logs((bw_log_level)c->log_level);
    bw__progress_interval_ms = (uint64_t)c->progress_ms;
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

int bw__daemon_auth(const bw_daemon_common *c, bw_auth **auth, char **token, char *err,
                    size_t errlen)
{
    *auth = NULL;
    *token = NULL;
    int rc = bw__auth_open(c->auth_tokens, auth, err, errlen);
    if (rc == BW_OK && c->token_file)
        rc = bw__auth_read_token_file(c->token_file, token, err, errlen);
    if (rc != BW_OK) {
        bw__auth_free(*auth);
        *auth = NULL;
        return rc;
    }
    return BW_OK;
}

void bw__daemon_auth_reload(bw_auth *auth)
{
    char err[512];
    size_t n = 0;
    if (bw__auth_reload(auth, &n, err, sizeof(err)) == BW_OK)
        BW_INFO("received SIGHUP: reloaded --auth-tokens principals=%zu", n);
    else
        BW_WARN("received SIGHUP: --auth-tokens refused; the principals loaded before stay in "
                "force err=%s",
                err);
}

int bw__daemon_grants(const bw_daemon_common *c, const bw_auth *auth, bw_grants **grants, char *err,
                      size_t errlen)
{
    *grants = NULL;
    if (!bw__auth_enabled(auth)) {
        if (c->grant_key)
            BW_WARN("--grant-key %s has no effect without --auth-tokens: read grants are used "
                    "only with authentication on",
                    c->grant_key);
        return BW_OK;
    }
    if (!c->grant_key) {
        snprintf(err, errlen,
                 "--auth-tokens needs --grant-key FILE too (the key the coordinator signs read "
                 "grants with and its workers verify them with; make one with: printf 'k1 %%s\\n' "
                 "\"$(openssl rand -hex 32)\" > grant.key; docs/security.md, \"Read grants\")");
        return BW_INVALID_ARGUMENT;
    }
    return bw__grants_open(c->grant_key, grants, err, errlen);
}

void bw__daemon_grants_reload(bw_grants *grants)
{
    if (!grants)
        return;
    char err[512];
    size_t n = 0;
    if (bw__grants_reload(grants, &n, err, sizeof(err)) == BW_OK)
        BW_INFO("received SIGHUP: reloaded --grant-key keys=%zu", n);
    else
        BW_WARN("received SIGHUP: --grant-key refused; the keys loaded before stay in force "
                "err=%s",
                err);
}

void bw__daemon_auth_announce(const bw_daemon_common *c, const char *role, const bw_auth *auth,
                              bool calls_tls)
{
    if (bw__auth_enabled(auth)) {
        BW_INFO("auth: on: callers are authenticated with the principals of %s%s", c->auth_tokens,
                c->tls_client_ca ? " (bearer tokens, or client certificates by common name)" : "");
        if (!c->tls_cert || !calls_tls)
            BW_WARN("auth: on without TLS: bearer tokens and read grants cross the network in "
                    "clear (this %s %s), where anyone who can watch it may take and replay them. "
                    "Give --tls-cert/--tls-key and the CA flags (docs/security.md, \"TLS\")",
                    role,
                    !c->tls_cert && !calls_tls ? "serves and calls in plaintext"
                    : !c->tls_cert             ? "serves plaintext"
                                               : "calls in plaintext");
    } else
        BW_WARN("auth: OFF. Anyone who can reach this %s may call every RPC: register workers, "
                "read every dataset, move any rank's cursor. Give --auth-tokens FILE "
                "(docs/security.md)%s",
                role,
                c->tls_client_ca ? "; client certificates are verified, but without "
                                   "--auth-tokens they authorize nothing"
                                 : "");
}
