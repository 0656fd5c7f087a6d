/* Helpers shared by the data channel's files (dchan_socket.c, dchan_tls.c, dchan_listen.c);
 * not part of dchan.h's interface. */
#ifndef BW_RPC_DCHAN_INT_H
#define BW_RPC_DCHAN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct addrinfo;
struct ssl_ctx_st;
struct ssl_method_st;

/* getaddrinfo of "HOST:PORT" (passive: for bind, an empty host is any address). BW_OK with
 * *res (freeaddrinfo it); BW_INVALID_ARGUMENT or BW_UNAVAILABLE with a sentence naming addr. */
int bw__sock_resolve(const char *addr, bool passive, struct addrinfo **res, char *err,
                     size_t errlen);

/* Polls fd for `events` until the deadline (monotonic ms, 0: none): BW_OK when ready,
 * BW_TIMEOUT, BW_INTERRUPTED (bw_interrupt), or BW_UNAVAILABLE. */
int bw__sock_wait(int fd, short events, uint64_t deadline_ms);

/* The sentence for a failed bw__sock_wait: on_timeout's, an interrupt's, or `otherwise`. */
const char *bw__sock_wait_failed(int rc, const char *on_timeout, const char *otherwise);

/* OpenSSL's first queued error as text into buf (fallback when none), and the queue cleared. */
void bw__dchan_tls_reason(char *buf, size_t len, const char *fallback);

/* A TLS 1.2-or-newer context with partial writes allowed; NULL with a sentence in err. */
struct ssl_ctx_st *bw__dchan_tls_new_ctx(const struct ssl_method_st *m, char *err, size_t errlen);

/* Loads the certificate chain and key (already checked to match by bw__tls_load_pair):
 * BW_OK, or BW_TLS with a sentence naming the file. */
int bw__dchan_tls_load_pair(struct ssl_ctx_st *ctx, const char *cert, const char *key, char *err,
                            size_t errlen);

#endif
