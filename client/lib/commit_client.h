/* The client's end of the coordinator's commit channel (server/commit_channel.h): one
 * connection a session, its hello, and one SessionRequest at a time on it. */
#ifndef BW_CLIENT_COMMIT_CLIENT_H
#define BW_CLIENT_COMMIT_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#include "jobs.pb-c.h"
#include "common/arena.h"
#include "rpc/dchan.h"
#include "rpc/tls.h"

typedef struct bw__cchan_client {
    char *address;          /* HOST:PORT */
    const char *token;      /* borrowed: the session's bearer token, or NULL */
    const char *tls_host;   /* borrowed: the name the server's certificate must carry */
    struct ssl_ctx_st *tls; /* NULL: plain TCP */
    bw_dsock sock;          /* fd -1: not connected */
} bw__cchan_client;

/* Prepares a client for `address` (copied): TLS when `tls` asks for it (bw__tls_client_enabled),
 * verifying `tls_host`. Connects on first use. BW_OK, or BW_TLS / BW_NOMEM with a sentence. */
int bw__cchan_client_init(bw__cchan_client *c, const char *address, const bw_tls_client_files *tls,
                          const char *tls_host, const char *token, char *err, size_t errlen);

/* Whether the connection is up (a failure of the last call closed it). */
bool bw__cchan_client_connected(const bw__cchan_client *c);

/* Connects and says hello within timeout_ms. BW_OK; the coordinator's refusal (its code, e.g.
 * BW_UNAUTHENTICATED, and sentence); or BW_UNAVAILABLE / BW_TIMEOUT / BW_TLS / BW_INTERRUPTED
 * when no connection could be made. */
int bw__cchan_client_connect(bw__cchan_client *c, int timeout_ms, char *err, size_t errlen);

/* Sends req and waits up to timeout_ms for its answer (*resp in `a`). BW_OK; otherwise the
 * connection failed or the coordinator closed it with an error (its code and sentence), and
 * the connection is closed (the next call connects again). Interrupts end the wait. */
int bw__cchan_client_call(bw__cchan_client *c, const Batchwire__V1__SessionRequest *req,
                          bw_arena *a, Batchwire__V1__SessionResponse **resp, int timeout_ms,
                          char *err, size_t errlen);

/* Closes the connection and frees what init made. */
void bw__cchan_client_free(bw__cchan_client *c);

#endif
