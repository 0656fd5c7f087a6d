/* TLS credentials for listeners and channels. PEM files are read and checked with OpenSSL
 * first, so a missing, empty or mismatched file is a clear error at start-up rather than an
 * opaque handshake failure later. */
#ifndef BW_RPC_TLS_H
#define BW_RPC_TLS_H

#include <stddef.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

typedef struct bw_tls_server_files {
    const char *cert;      /* --tls-cert: certificate chain (PEM); NULL: plaintext */
    const char *key;       /* --tls-key: private key (PEM) */
    const char *client_ca; /* --tls-client-ca: require client certificates signed by it */
} bw_tls_server_files;

typedef struct bw_tls_client_files {
    const char *ca;          /* --tls-ca: roots to verify the server (PEM) */
    const char *cert;        /* --tls-cert: client certificate for mutual TLS */
    const char *key;         /* --tls-key */
    const char *server_name; /* --tls-server-name: name to verify instead of the target host */
    int use_tls;             /* TLS with gRPC's default roots even without --tls-ca */
    /* Not a file but the other credential a client presents: the bearer token read from
     * --token-file, sent as "authorization: Bearer TOKEN" on every call and in the data
     * channel's hello (docs/security.md); NULL: none. */
    const char *token;
} bw_tls_client_files;

/* Server credentials: insecure when files->cert is NULL. Returns BW_OK or BW_TLS with a
 * sentence in err naming the flag and file. *out is owned by the caller (release with
 * grpc_server_credentials_release). */
int bw__tls_server_credentials(const bw_tls_server_files *files, grpc_server_credentials **out,
                               char *err, size_t errlen);

/* Channel credentials: insecure unless a CA, a client certificate or use_tls is given. */
int bw__tls_client_credentials(const bw_tls_client_files *files, grpc_channel_credentials **out,
                               char *err, size_t errlen);

/* Whether the client settings ask for TLS. */
int bw__tls_client_enabled(const bw_tls_client_files *files);

/* Reads --tls-cert and --tls-key (cert_path, key_path) and checks that the key belongs to the
 * first certificate: BW_OK with malloc'd PEM copies in *cert and *key (the caller frees both,
 * also on failure: each is NULL or a copy), or an error with a sentence naming the setting and
 * file at fault. */
int bw__tls_load_pair(const char *cert_path, const char *key_path, char **cert, char **key,
                      char *err, size_t errlen);

/* Reads a PEM file and checks it holds at least one certificate (want_key == 0) or a private
 * key (want_key == 1). Returns a NUL-terminated malloc'd copy in *pem. `flag` names the
 * setting for messages. */
int bw__tls_load_pem(const char *flag, const char *path, int want_key, char **pem, char *err,
                     size_t errlen);

#endif
