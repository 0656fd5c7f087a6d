/* Process-level plumbing shared by the daemons: termination signals and the common
 * listener/TLS/log settings every daemon has. */
#ifndef BW_RPC_DAEMON_H
#define BW_RPC_DAEMON_H

#include <signal.h>

/*
 * Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (call it first in main, before grpc_init
 * and before any thread starts, so every thread inherits the mask) and ignores SIGPIPE.
 */
void bw__daemon_block_signals(void);

/* Waits up to timeout_ms for SIGINT, SIGTERM or SIGHUP (reload the principals); returns the
 * signal number or 0. */
int bw__daemon_wait_signal(int timeout_ms);

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth/auth.h"
#include "auth/grant.h"
#include "common/config.h"
#include "common/log.h"
#include "rpc/server.h"

/* Settings every daemon's listener has; embedded in each daemon's config struct. */
typedef struct bw_daemon_common {
    char *listen;
    char *metrics_listen; /* /metrics (core/metrics/metrics.h); NULL: off */
    char *metrics_auth;   /* its bearer token file; NULL: no token asked */
    char *tls_cert;
    char *tls_key;
    char *tls_client_ca;
    char *auth_tokens; /* principals: who may call (core/auth/auth.h); NULL: open service */
    char *token_file;  /* this daemon's own bearer token, for the calls it makes */
    char *grant_key;   /* read grants' keys (core/auth/grant.h); required with auth_tokens */
    int64_t threads;
    int64_t max_message_bytes;
    int64_t grace_ms;
    int log_level;       /* index into "error|warn|info|debug" == bw_log_level */
    int log_format;      /* bw__log_format */
    int64_t progress_ms; /* how often long work logs its progress (core/common/progress.h) */
} bw_daemon_common;

#define BW_LOG_LEVEL_CHOICES "error|warn|info|debug"

/* Table rows for bw_daemon_common at field F of struct T; `listen_def` is the default. */
#define BW_DAEMON_OPTS(T, F, listen_def)                                                           \
    {"listen",                                                                                     \
     BW_OPT_ADDR,                                                                                  \
     offsetof(T, F.listen),                                                                        \
     listen_def,                                                                                   \
     0,                                                                                            \
     0,                                                                                            \
     NULL,                                                                                         \
     0,                                                                                            \
     "HOST:PORT",                                                                                  \
     "address to serve gRPC on; port 0 picks a free port (the bound address is logged)"},          \
        {"metrics-listen",                                                                         \
         BW_OPT_ADDR,                                                                              \
         offsetof(T, F.metrics_listen),                                                            \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "HOST:PORT",                                                                              \
         "serve Prometheus metrics at /metrics on this address (HTTPS with --tls-cert); port 0 "   \
         "picks a free port (logged). Unset: off (docs/operating.md, Metrics)"},                   \
        {"metrics-auth",                                                                           \
         BW_OPT_PATH,                                                                              \
         offsetof(T, F.metrics_auth),                                                              \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "FILE",                                                                                   \
         "/metrics answers only scrapes that send \"Authorization: Bearer TOKEN\", TOKEN the "     \
         "first line of FILE (401 otherwise; docs/security.md, Metrics)"},                         \
        {"tls-cert",                                                                               \
         BW_OPT_PATH,                                                                              \
         offsetof(T, F.tls_cert),                                                                  \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "FILE",                                                                                   \
         "PEM certificate chain: serve TLS (with --tls-key); also this process's client "          \
         "certificate when it calls another daemon"},                                              \
        {"tls-key", BW_OPT_PATH, offsetof(T, F.tls_key),         NULL, 0, 0, NULL,                 \
         0,         "FILE",      "PEM private key of --tls-cert"},                                 \
        {"tls-client-ca",                                                                          \
         BW_OPT_PATH,                                                                              \
         offsetof(T, F.tls_client_ca),                                                             \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "FILE",                                                                                   \
         "require client certificates signed by this CA (mutual TLS)"},                            \
        {"auth-tokens",                                                                            \
         BW_OPT_PATH,                                                                              \
         offsetof(T, F.auth_tokens),                                                               \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "FILE",                                                                                   \
         "principals allowed to call, one a line: ROLE NAME TOKEN (docs/security.md); reloaded "   \
         "on SIGHUP. Unset: anyone who reaches the daemon may do anything"},                       \
        BW_OPT_TOKEN_FILE(T, F.token_file),                                                        \
        {"grant-key",                                                                              \
         BW_OPT_PATH,                                                                              \
         offsetof(T, F.grant_key),                                                                 \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "FILE",                                                                                   \
         "keys of read grants, one a line: KEYID HEX (the first signs; docs/security.md, Read "    \
         "grants); the same file on the coordinator and every worker; required with "              \
         "--auth-tokens; reloaded on SIGHUP. The coordinator proves itself to workers with it: "   \
         "its --token-file is not sent to them"},                                                  \
        {"threads", BW_OPT_INT, offsetof(T, F.threads),         "2", 1, 64, NULL,                  \
         0,         "N",        "gRPC completion-queue threads"},                                  \
        {"max-message-bytes",                                                                      \
         BW_OPT_INT,                                                                               \
         offsetof(T, F.max_message_bytes),                                                         \
         "16777216",                                                                               \
         65536,                                                                                    \
         1073741824,                                                                               \
         NULL,                                                                                     \
         0,                                                                                        \
         "BYTES",                                                                                  \
         "largest gRPC message accepted"},                                                         \
        {"shutdown-grace-ms",                                                                      \
         BW_OPT_INT,                                                                               \
         offsetof(T, F.grace_ms),                                                                  \
         "5000",                                                                                   \
         0,                                                                                        \
         600000,                                                                                   \
         NULL,                                                                                     \
         0,                                                                                        \
         "MS",                                                                                     \
         "on SIGTERM, how long running calls may take before they are cancelled"},                 \
        {"log-level",                                                                              \
         BW_OPT_ENUM,                                                                              \
         offsetof(T, F.log_level),                                                                 \
         "info",                                                                                   \
         0,                                                                                        \
         0,                                                                                        \
         BW_LOG_LEVEL_CHOICES,                                                                     \
         0,                                                                                        \
         NULL,                                                                                     \
         "most verbose level logged to stderr"},                                                   \
        {"log-format",                                                                             \
         BW_OPT_ENUM,                                                                              \
         offsetof(T, F.log_format),                                                                \
         "text",                                                                                   \
         0,                                                                                        \
         0,                                                                                        \
         BW_LOG_FORMAT_CHOICES,                                                                    \
         0,                                                                                        \
         NULL,                                                                                     \
         "stderr log lines as text or as one JSON object per line (docs/operating.md, Logs)"},     \
    {                                                                                              \
        "progress-ms", BW_OPT_INT, offsetof(T, F.progress_ms), "5000", 0, 3600000, NULL, 0, "MS",  \
            "long work (opening and indexing a dataset) logs its progress this often; on a "       \
            "terminal one line updates in place (0: never)"                                        \
    }

/* Sends gRPC's internal log lines through our logger (errors as warnings; all of them at
 * debug level). */
void bw__daemon_route_grpc_logs(bw_log_level level);

/* A daemon's logging from its common settings: stderr as `component` at --log-level in
 * --log-format, gRPC's lines routed through it, progress every --progress-ms. */
void bw__daemon_logging(const bw_daemon_common *c, const char *component);

/* The daemon's credentials from its common settings (docs/security.md): *auth, the principals
 * of --auth-tokens (an open service without it), and *token, the bearer token of --token-file
 * for the calls it makes (NULL without it; free it). BW_OK, or an error with a sentence naming
 * the file. */
int bw__daemon_auth(const bw_daemon_common *c, bw_auth **auth, char **token, char *err,
                    size_t errlen);

/* Logs whether callers are authenticated; without --auth-tokens, a loud warning; with them
 * but without TLS on this daemon's listener or on the calls it makes (calls_tls false), a
 * warning that tokens and grants cross the network in clear. Call once, after the "listening
 * on" line (the first line, which tools wait for). */
void bw__daemon_auth_announce(const bw_daemon_common *c, const char *role, const bw_auth *auth,
                              bool calls_tls);

/* On SIGHUP: reloads --auth-tokens and logs what happened. */
void bw__daemon_auth_reload(bw_auth *auth);

/* The read grants' keys of --grant-key (docs/security.md, "Read grants"): *grants NULL when
 * authentication is off (a --grant-key without --auth-tokens is warned about: it has no
 * effect). --auth-tokens without --grant-key is refused with a sentence naming both flags.
 * BW_OK, or an error with a sentence naming the file. */
int bw__daemon_grants(const bw_daemon_common *c, const bw_auth *auth, bw_grants **grants, char *err,
                      size_t errlen);

/* On SIGHUP: reloads --grant-key (NULL: nothing) and logs what happened. */
void bw__daemon_grants_reload(bw_grants *grants);

/* Fills server options from the common settings. */
void bw__daemon_server_opts(const bw_daemon_common *c, const char *role, bw_rpc_server_opts *o);

#endif
