/* Subcommands of the batchwire command-line tool. Each takes argv with argv[0] the
 * subcommand's name and returns the process exit status (0 ok, 1 failure, 2 bad usage). */
#ifndef BW_CLI_COMMANDS_H
#define BW_CLI_COMMANDS_H

#include <stdbool.h>

#include "auth/auth.h"
#include "batchwire/batchwire.h"
#include "common/config.h"
#include "rpc/client.h"

int bw__cmd_status(int argc, char **argv);
int bw__cmd_health(int argc, char **argv);
int bw__cmd_plan(int argc, char **argv);
int bw__cmd_fetch(int argc, char **argv);
int bw__cmd_gen(int argc, char **argv);
int bw__cmd_job(int argc, char **argv);

/* Client-side TLS settings shared by every subcommand that talks to a daemon. */
typedef struct bw_cli_tls {
    char *tls_ca;
    char *tls_cert;
    char *tls_key;
    char *tls_server_name;
    bool tls;
    char *token_file; /* bearer token to present (docs/security.md) */
} bw_cli_tls;

#define BW_CLI_TLS_OPTS(T, F)                                                                      \
    {"tls-ca",                                                                                     \
     BW_OPT_PATH,                                                                                  \
     offsetof(T, F.tls_ca),                                                                        \
     NULL,                                                                                         \
     0,                                                                                            \
     0,                                                                                            \
     NULL,                                                                                         \
     0,                                                                                            \
     "FILE",                                                                                       \
     "PEM CA to verify the server: use TLS"},                                                      \
        {"tls-cert",                                                                               \
         BW_OPT_PATH,                                                                              \
         offsetof(T, F.tls_cert),                                                                  \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "FILE",                                                                                   \
         "PEM client certificate, for servers that require mutual TLS"},                           \
        {"tls-key", BW_OPT_PATH, offsetof(T, F.tls_key),         NULL, 0, 0, NULL,                 \
         0,         "FILE",      "PEM private key of --tls-cert"},                                 \
        {"tls-server-name",                                                                        \
         BW_OPT_STRING,                                                                            \
         offsetof(T, F.tls_server_name),                                                           \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "NAME",                                                                                   \
         "name to verify in the server's certificate instead of its host"},                        \
        BW_OPT_TOKEN_FILE(T, F.token_file),                                                        \
    {                                                                                              \
        "tls", BW_OPT_BOOL, offsetof(T, F.tls), "false", 0, 0, NULL, 0, NULL,                      \
            "use TLS with the system's roots (implied by --tls-ca)"                                \
    }

/* Channel options from the shared TLS and token settings. BW_OK, or an error reading
 * --token-file with a sentence in err. */
int bw__cli_channel_opts(const bw_cli_tls *t, const char *target, bw_rpc_channel_opts *o, char *err,
                         size_t errlen);

#endif
