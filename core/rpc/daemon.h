/* Process-level plumbing shared by the daemons: termination signals and the common
 * listener/TLS/log settings every daemon has. */
#ifndef BW_RPC_DAEMON_H
#define BW_RPC_DAEMON_H

#include <signal.h>

/*
 * Blocks SIGINT and SIGTERM in the calling thread (call it first in main, before grpc_init
 * and before any thread starts, so every thread inherits the mask) and ignores SIGPIPE.
 */
void bw__daemon_block_signals(void);

/* Waits up to timeout_ms for SIGINT or SIGTERM; returns the signal number or 0. */
int bw__daemon_wait_signal(int timeout_ms);

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/log.h"
#include "rpc/server.h"

/* Settings every daemon's listener has; embedded in each daemon's config struct. */
typedef struct bw_daemon_common {
    char *listen;
    char *tls_cert;
    char *tls_key;
    char *tls_client_ca;
    int64_t threads;
    int64_t max_message_bytes;
    int64_t grace_ms;
    int log_level; /* index into "error|warn|info|debug" == bw_log_level */
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
    {                                                                                              \
        "log-level", BW_OPT_ENUM, offsetof(T, F.log_level), "info", 0, 0, BW_LOG_LEVEL_CHOICES, 0, \
            NULL, "most verbose level logged to stderr"                                            \
    }

/* Sends gRPC's internal log lines through our logger (errors as warnings; all of them at
 * debug level). */
void bw__daemon_route_grpc_logs(bw_log_level level);

/* Fills server options from the common settings. */
void bw__daemon_server_opts(const bw_daemon_common *c, const char *role, bw_rpc_server_opts *o);

#endif
