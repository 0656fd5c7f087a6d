/* The data channel's connections (dchan.h): plain TCP, or TLS over it with OpenSSL -- the
 * contexts' shared set-up, the client's context, the handshake, and reads and writes with
 * SIGPIPE kept from the embedding process. The server's context is in dchan_listen.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/util.h"
#include "rpc/dchan.h"
#include "rpc/dchan_int.h"
#include "rpc/tls.h"

/* OpenSSL writes with write(2): on a connection the peer closed that raises SIGPIPE, which
 * would kill a process embedding libbatchwire (the daemons ignore it). SIGPIPE is blocked in
 * the calling thread around SSL calls, and one that they raised is taken off again. */
typedef struct pipe_guard {
    sigset_t old;
    bool was_pending;
} pipe_guard;

static bool sigpipe_pending(void)
{
    sigset_t p;
    return sigpending(&p) == 0 && sigismember(&p, SIGPIPE);
}

static void guard_on(pipe_guard *g)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    g->was_pending = sigpipe_pending();
    pthread_sigmask(SIG_BLOCK, &s, &g->old);
}

static void guard_off(pipe_guard *g)
{
    if (!g->was_pending && sigpipe_pending()) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGPIPE);
        struct timespec zero = {0, 0};
        while (sigtimedwait(&s, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

void bw__dchan_tls_reason(char *buf, size_t len, const char *fallback)
{
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, buf, len);
    else
        snprintf(buf, len, "%s", fallback);
    ERR_clear_error();
}

SSL_CTX *bw__dchan_tls_new_ctx(const SSL_METHOD *m, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(m);
    if (!ctx) {
        snprintf(err, errlen, "data channel: OpenSSL cannot create a TLS context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return ctx;
}

int bw__dchan_tls_load_pair(SSL_CTX *ctx, const char *cert, const char *key, char *err,
                            size_t errlen)
{
    char why[256];
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        bw__dchan_tls_reason(why, sizeof(why), "unreadable");
        snprintf(err, errlen, "--tls-cert %s: %s", cert, why);
        return BW_TLS;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        bw__dchan_tls_reason(why, sizeof(why), "does not match the certificate");
        snprintf(err, errlen, "--tls-key %s: %s", key, why);
        return BW_TLS;
    }
    return BW_OK;
}

int bw__dchan_tls_client_ctx(const struct bw_tls_client_files *files, SSL_CTX **out, char *err,
                             size_t errlen)
{
    *out = NULL;
    SSL_CTX *ctx = bw__dchan_tls_new_ctx(TLS_client_method(), err, errlen);
    if (!ctx)
        return BW_TLS;
    int rc = BW_OK;
    char why[256];
    if (files->ca ? SSL_CTX_load_verify_locations(ctx, files->ca, NULL) != 1
                  : SSL_CTX_set_default_verify_paths(ctx) != 1) {
        bw__dchan_tls_reason(why, sizeof(why), "no certificate");
        snprintf(err, errlen, "--tls-ca %s: %s", files->ca ? files->ca : "(system roots)", why);
        rc = BW_TLS;
    }
    if (rc == BW_OK && files->cert && files->key)
        rc = bw__dchan_tls_load_pair(ctx, files->cert, files->key, err, errlen);
    if (rc != BW_OK) {
        SSL_CTX_free(ctx);
        return rc;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    *out = ctx;
    return BW_OK;
}

void bw__dchan_tls_ctx_free(SSL_CTX *ctx)
{
    SSL_CTX_free(ctx);
}

/* After an SSL call returned r <= 0: waits for what OpenSSL wants (BW_OK: call again), or
 * says why the connection failed. */
static int ssl_wait(bw_dsock *s, int r, uint64_t deadline_ms, char *err, size_t errlen)
{
    int e = SSL_get_error(s->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        int rc = bw__sock_wait(s->fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline_ms);
        if (rc != BW_OK)
            snprintf(err, errlen, "%s",
                     bw__sock_wait_failed(rc, "no progress before the deadline",
                                          "waiting for the peer failed"));
        return rc;
    }
    if (e == SSL_ERROR_ZERO_RETURN) {
        snprintf(err, errlen, "the peer closed the TLS connection");
    } else if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
        snprintf(err, errlen, "%s",
                 errno && r < 0 ? strerror(errno) : "the peer closed the connection");
    } else {
        char why[256];
        bw__dchan_tls_reason(why, sizeof(why), "TLS error");
        snprintf(err, errlen, "TLS: %s", why);
    }
    return BW_UNAVAILABLE;
}

static void mismatch(SSL *ssl, const char *host, char *why, size_t len);

int bw__dsock_tls(bw_dsock *s, SSL_CTX *ctx, const char *host, uint64_t deadline_ms, char *err,
                  size_t errlen)
{
    int fl = fcntl(s->fd, F_GETFL);
    s->ssl = SSL_new(ctx);
    if (fl < 0 || fcntl(s->fd, F_SETFL, fl | O_NONBLOCK) < 0 || !s->ssl ||
        SSL_set_fd(s->ssl, s->fd) != 1) {
        snprintf(err, errlen, "TLS: cannot set up the connection");
        return BW_TLS;
    }
    if (host) {
        unsigned char ip[16];
        int is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
        X509_VERIFY_PARAM *vp = SSL_get0_param(s->ssl);
        if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(vp, host) != 1
                  : (SSL_set_tlsext_host_name(s->ssl, host) != 1 ||
                     SSL_set1_host(s->ssl, host) != 1)) {
            snprintf(err, errlen, "TLS: cannot verify against the name %s", host);
            return BW_TLS;
        }
    }
    for (;;) {
        ERR_clear_error();
        pipe_guard g;
        guard_on(&g);
        int r = host ? SSL_connect(s->ssl) : SSL_accept(s->ssl);
        guard_off(&g);
        if (r == 1)
            return BW_OK;
        char why[600];
        int rc = ssl_wait(s, r, deadline_ms, why, sizeof(why));
        if (rc != BW_OK) {
            long v = SSL_get_verify_result(s->ssl);
            if (v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH)
                mismatch(s->ssl, host, why, sizeof(why));
            else if (v != X509_V_OK)
                snprintf(why, sizeof(why), "certificate verification failed: %s",
                         X509_verify_cert_error_string(v));
            snprintf(err, errlen, "TLS handshake: %s", why);
            /* A handshake that ran out of time is a silent peer, not a TLS failure: the
             * caller tries again on a fresh connection. */
            return rc == BW_TIMEOUT || rc == BW_INTERRUPTED ? rc : BW_TLS;
        }
    }
}

void bw__tls_cert_names(const struct x509_st *cert, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    GENERAL_NAMES *gens = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
    for (int i = 0; gens && i < sk_GENERAL_NAME_num(gens) && n < len; i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(gens, i);
        char ip[INET6_ADDRSTRLEN] = "";
        int t = -1;
        if (g->type == GEN_DNS) {
            const unsigned char *d = ASN1_STRING_get0_data(g->d.dNSName);
            t = snprintf(buf + n, len - n, "%sDNS:%.*s", n ? ", " : "",
                         ASN1_STRING_length(g->d.dNSName), (const char *)d);
        } else if (g->type == GEN_IPADD) {
            int il = ASN1_STRING_length(g->d.iPAddress);
            const unsigned char *d = ASN1_STRING_get0_data(g->d.iPAddress);
            if (il == 4 || il == 16)
                inet_ntop(il == 4 ? AF_INET : AF_INET6, d, ip, sizeof(ip));
            t = snprintf(buf + n, len - n, "%sIP:%s", n ? ", " : "", *ip ? ip : "?");
        }
        if (t > 0)
            n += (size_t)t;
    }
    GENERAL_NAMES_free(gens);
    if (n == 0) {
        char cn[256] = "";
        X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
        snprintf(buf, len, "no DNS or IP subject alternative name (CN=%s)", cn);
    }
}

/* The sentence for a certificate that is valid but names another host: which address was
 * dialled and what the certificate names (docs/security.md, "Worker certificates"). */
static void mismatch(SSL *ssl, const char *host, char *why, size_t len)
{
    /* A failed verification leaves the chain the peer sent (its leaf first on a client). */
    STACK_OF(X509) *chain = SSL_get_peer_cert_chain(ssl);
    X509 *leaf = chain && sk_X509_num(chain) > 0 ? sk_X509_value(chain, 0) : NULL;
    char names[400] = "(not available)";
    if (leaf)
        bw__tls_cert_names(leaf, names, sizeof(names));
    snprintf(why, len,
             "the certificate names %s, not %s, the address dialled (a CA-valid certificate for "
             "another host: docs/security.md, \"Worker certificates\")",
             names, host);
}

int bw__tls_probe_names(const char *addr, int timeout_ms, char *names, size_t len)
{
    char host[256], port[16], why[256];
    int fd = -1;
    snprintf(names, len, "(not available)");
    if (bw__sock_split(addr, host, sizeof(host), port, sizeof(port)) != BW_OK ||
        bw__sock_connect(addr, timeout_ms, &fd, why, sizeof(why)) != BW_OK)
        return BW_UNAVAILABLE;
    SSL_CTX *ctx = bw__dchan_tls_new_ctx(TLS_client_method(), why, sizeof(why));
    bw_dsock s = {fd, NULL};
    int rc = BW_UNAVAILABLE;
    if (ctx) {
        /* Not verified: only read, to name what the peer presents. */
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
        unsigned char ip[16];
        bool is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
        s.ssl = SSL_new(ctx);
        if (s.ssl && SSL_set_fd(s.ssl, fd) == 1 &&
            (is_ip || SSL_set_tlsext_host_name(s.ssl, host) == 1)) {
            uint64_t deadline = bw__mono_ms() + (uint64_t)timeout_ms;
            for (;;) {
                ERR_clear_error();
                pipe_guard g;
                guard_on(&g);
                int r = SSL_connect(s.ssl);
                guard_off(&g);
                /* A server that requires a client certificate may refuse after sending its
                 * own: the chain is what counts. */
                STACK_OF(X509) *chain = SSL_get_peer_cert_chain(s.ssl);
                if (chain && sk_X509_num(chain) > 0) {
                    bw__tls_cert_names(sk_X509_value(chain, 0), names, len);
                    rc = BW_OK;
                    break;
                }
                if (r == 1 || ssl_wait(&s, r, deadline, why, sizeof(why)) != BW_OK)
                    break;
            }
        }
    }
    ERR_clear_error();
    bw__dsock_close(&s);
    SSL_CTX_free(ctx);
    return rc;
}

int bw__dsock_recv(bw_dsock *s, void *buf, size_t n, size_t *got, char *err, size_t errlen)
{
    *got = 0;
    if (n == 0)
        return BW_OK;
    if (!s->ssl) {
        ssize_t r;
        do
            r = recv(s->fd, buf, n, MSG_DONTWAIT);
        while (r < 0 && errno == EINTR);
        if (r > 0) {
            *got = (size_t)r;
            return BW_OK;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return BW_OK;
        snprintf(err, errlen, "%s", r == 0 ? "the peer closed the connection" : strerror(errno));
        return BW_UNAVAILABLE;
    }
    ERR_clear_error();
    pipe_guard g;
    guard_on(&g);
    int r = SSL_read(s->ssl, buf, n > INT_MAX ? INT_MAX : (int)n);
    guard_off(&g);
    if (r > 0) {
        *got = (size_t)r;
        return BW_OK;
    }
    int e = SSL_get_error(s->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return BW_OK;
    return ssl_wait(s, r, 0, err, errlen);
}

int bw__dsock_read_all(bw_dsock *s, void *buf, size_t len, uint64_t deadline_ms, size_t *got,
                       char *err, size_t errlen)
{
    if (!s->ssl)
        return bw__sock_read_all(s->fd, buf, len, deadline_ms, got, err, errlen);
    uint8_t *p = buf;
    size_t done = 0;
    int rc = BW_OK;
    while (done < len) {
        size_t n = 0;
        rc = bw__dsock_recv(s, p + done, len - done, &n, err, errlen);
        if (rc != BW_OK)
            break;
        done += n;
        if (n == 0 && (rc = bw__sock_wait(s->fd, POLLIN, deadline_ms)) != BW_OK) {
            snprintf(
                err, errlen, "%s",
                bw__sock_wait_failed(rc, "no data before the deadline", "waiting for data failed"));
            break;
        }
    }
    if (got)
        *got = done;
    return rc;
}

/* SSL_write of all of p[0..len). */
static int ssl_write_all(bw_dsock *s, const uint8_t *p, size_t len, uint64_t deadline_ms, char *err,
                         size_t errlen)
{
    while (len > 0) {
        ERR_clear_error();
        pipe_guard g;
        guard_on(&g);
        int r = SSL_write(s->ssl, p, len > INT_MAX ? INT_MAX : (int)len);
        guard_off(&g);
        if (r > 0) {
            p += r;
            len -= (size_t)r;
            continue;
        }
        int rc = ssl_wait(s, r, deadline_ms, err, errlen);
        if (rc != BW_OK)
            return rc;
    }
    return BW_OK;
}

enum { TLS_GATHER = 16 << 10 }; /* one TLS record's worth of small pieces per SSL_write */

int bw__dsock_writev_all(bw_dsock *s, struct iovec *iov, size_t n, uint64_t deadline_ms, char *err,
                         size_t errlen)
{
    if (!s->ssl)
        return bw__sock_writev_all(s->fd, iov, n, deadline_ms, err, errlen);
    /* Small pieces (frame headers) are gathered so that they do not each become a record. */
    uint8_t gather[TLS_GATHER];
    size_t g = 0;
    int rc = BW_OK;
    for (size_t i = 0; i < n && rc == BW_OK; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t len = iov[i].iov_len;
        if (len <= TLS_GATHER - g) {
            memcpy(gather + g, p, len);
            g += len;
            continue;
        }
        if (g && (rc = ssl_write_all(s, gather, g, deadline_ms, err, errlen)) != BW_OK)
            break;
        g = 0;
        if (len < TLS_GATHER) {
            memcpy(gather, p, len);
            g = len;
        } else {
            rc = ssl_write_all(s, p, len, deadline_ms, err, errlen);
        }
    }
    if (rc == BW_OK && g)
        rc = ssl_write_all(s, gather, g, deadline_ms, err, errlen);
    return rc;
}

void bw__dsock_close(bw_dsock *s)
{
    if (s->ssl) {
        pipe_guard g;
        guard_on(&g);
        SSL_shutdown(s->ssl); /* non-blocking: sends close_notify if it can */
        guard_off(&g);
        SSL_free(s->ssl);
        s->ssl = NULL;
    }
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}
