/* The bulk data channel's framing and the blocking socket helpers both ends use. */
#include "rpc/dchan.h"

#include <arpa/inet.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <time.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/interrupt.h"
#include "common/util.h"
#include "rpc/tls.h"

void bw__dchan_put_req_header(uint8_t out[BW_DCHAN_REQ_HEADER], uint32_t kind, uint64_t length)
{
    bw__put_le32(out, BW_DCHAN_MAGIC);
    bw__put_le32(out + 4, kind);
    bw__put_le64(out + 8, length);
}

int bw__dchan_get_req_header(const uint8_t in[BW_DCHAN_REQ_HEADER], uint32_t *kind,
                             uint64_t *length, char *err, size_t errlen)
{
    uint32_t magic = bw__get_le32(in);
    *kind = bw__get_le32(in + 4);
    *length = bw__get_le64(in + 8);
    if (magic != BW_DCHAN_MAGIC) {
        snprintf(err, errlen,
                 "data channel: the request does not start with \"BWD1\" (got bytes %02x %02x %02x "
                 "%02x): not a batchwire client, or a gRPC client on the data port",
                 in[0], in[1], in[2], in[3]);
        return BW_PROTOCOL;
    }
    if (*kind != BW_DCHAN_KIND_READ_SAMPLES && *kind != BW_DCHAN_KIND_READ_STREAM &&
        *kind != BW_DCHAN_KIND_AUTH) {
        snprintf(err, errlen,
                 "data channel: request kind %u is unknown (1 = ReadSamples, 2 = ReadStream, 3 = "
                 "Auth)",
                 *kind);
        return BW_PROTOCOL;
    }
    if (*length > BW_DCHAN_MAX_REQUEST) {
        snprintf(err, errlen, "data channel: a request of %llu bytes is more than the limit of %d",
                 (unsigned long long)*length, BW_DCHAN_MAX_REQUEST);
        return BW_TOO_BIG;
    }
    return BW_OK;
}

void bw__dchan_put_frame(uint8_t out[BW_DCHAN_FRAME_HEADER], const bw_dchan_frame *f)
{
    bw__put_le32(out, f->type);
    bw__put_le32(out + 4, f->code);
    bw__put_le64(out + 8, f->a);
    bw__put_le64(out + 16, f->b);
}

void bw__dchan_get_frame(const uint8_t in[BW_DCHAN_FRAME_HEADER], bw_dchan_frame *f)
{
    f->type = bw__get_le32(in);
    f->code = bw__get_le32(in + 4);
    f->a = bw__get_le64(in + 8);
    f->b = bw__get_le64(in + 16);
}

/* ---- sockets ---- */

int bw__sock_split(const char *addr, char *host, size_t hostlen, char *port, size_t portlen)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || !colon[1])
        return BW_INVALID_ARGUMENT;
    const char *h = addr;
    size_t hl = (size_t)(colon - addr);
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']')
            return BW_INVALID_ARGUMENT;
        h++;
        hl -= 2;
    }
    if (hl >= hostlen || strlen(colon + 1) >= portlen)
        return BW_INVALID_ARGUMENT;
    for (const char *p = colon + 1; *p; p++)
        if (*p < '0' || *p > '9')
            return BW_INVALID_ARGUMENT;
    memcpy(host, h, hl);
    host[hl] = '\0';
    snprintf(port, portlen, "%s", colon + 1);
    return BW_OK;
}

static int resolve(const char *addr, bool passive, struct addrinfo **res, char *err, size_t errlen)
{
    char host[256], port[16];
    if (bw__sock_split(addr, host, sizeof(host), port, sizeof(port)) != BW_OK) {
        snprintf(err, errlen, "address %s is not HOST:PORT", addr);
        return BW_INVALID_ARGUMENT;
    }
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    int g = getaddrinfo(host[0] ? host : NULL, port, &hints, res);
    if (g != 0) {
        snprintf(err, errlen, "address %s: %s", addr, gai_strerror(g));
        return BW_UNAVAILABLE;
    }
    return BW_OK;
}

int bw__sock_listen(const char *addr, int *fd, int *bound_port, char *err, size_t errlen)
{
    struct addrinfo *res = NULL;
    int rc = resolve(addr, true, &res, err, errlen);
    if (rc != BW_OK)
        return rc;
    int s = -1, saved = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (s < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, 128) == 0)
            break;
        saved = errno;
        close(s);
        s = -1;
    }
    freeaddrinfo(res);
    if (s < 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", addr, strerror(saved));
        return BW_UNAVAILABLE;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    getsockname(s, (struct sockaddr *)&ss, &sl);
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    *fd = s;
    return BW_OK;
}

static int wait_fd(int fd, short events, uint64_t deadline_ms)
{
    for (;;) {
        int timeout = -1;
        if (deadline_ms) {
            uint64_t now = bw__mono_ms();
            if (now >= deadline_ms)
                return BW_TIMEOUT;
            timeout = (int)(deadline_ms - now);
        }
        struct pollfd p = {fd, events, 0};
        int n = bw__poll(&p, 1, timeout);
        if (n > 0)
            return BW_OK;
        if (n == 0)
            return BW_TIMEOUT;
        if (bw__interrupted())
            return BW_INTERRUPTED;
        if (errno != EINTR)
            return BW_UNAVAILABLE;
    }
}

/* The sentence for a failed wait_fd: its timeout's, an interrupt's, or the other one. */
static const char *wait_failed(int rc, const char *on_timeout, const char *otherwise)
{
    return rc == BW_TIMEOUT ? on_timeout : rc == BW_INTERRUPTED ? bw_strerror(rc) : otherwise;
}

int bw__sock_connect(const char *addr, int timeout_ms, int *fd, char *err, size_t errlen)
{
    struct addrinfo *res = NULL;
    int rc = resolve(addr, false, &res, err, errlen);
    if (rc != BW_OK)
        return rc;
    uint64_t deadline = bw__mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
    int s = -1, saved = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai && s < 0; ai = ai->ai_next) {
        s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (s < 0) {
            saved = errno;
            continue;
        }
        int ok = connect(s, ai->ai_addr, ai->ai_addrlen) == 0, wrc = BW_TIMEOUT;
        if (!ok && errno == EINPROGRESS && (wrc = wait_fd(s, POLLOUT, deadline)) == BW_OK) {
            int e = 0;
            socklen_t el = sizeof(e);
            getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &el);
            ok = e == 0;
            errno = e ? e : ETIMEDOUT;
        } else if (!ok && errno == EINPROGRESS) {
            errno = wrc == BW_INTERRUPTED ? EINTR : ETIMEDOUT;
        }
        if (!ok) {
            saved = errno;
            close(s);
            s = -1;
        }
    }
    freeaddrinfo(res);
    if (s < 0 && saved == EINTR) {
        snprintf(err, errlen, "connecting to %s: %s", addr, bw_strerror(BW_INTERRUPTED));
        return BW_INTERRUPTED;
    }
    if (s < 0) {
        snprintf(err, errlen, "cannot connect to %s: %s", addr, strerror(saved));
        return saved == ETIMEDOUT ? BW_TIMEOUT : BW_UNAVAILABLE;
    }
    bw__sock_tune(s);
    *fd = s;
    return BW_OK;
}

void bw__sock_tune(int fd)
{
    int one = 1, idle = BW_SOCK_KEEPIDLE_S, intvl = BW_SOCK_KEEPINTVL_S, cnt = BW_SOCK_KEEPCNT;
    unsigned user = BW_SOCK_USER_TIMEOUT_MS;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof(user));
}

/* recvmsg into iov[0..n) (advanced as bytes arrive) until at least min bytes came. */
static int readv_min(int fd, struct iovec *iov, size_t n, size_t min, uint64_t deadline_ms,
                     size_t *got, char *err, size_t errlen)
{
    size_t done = 0, i = 0;
    int rc = BW_OK;
    while (done < min) {
        while (i < n && iov[i].iov_len == 0)
            i++;
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov + i;
        mh.msg_iovlen = n - i;
        ssize_t r = recvmsg(fd, &mh, MSG_DONTWAIT);
        if (r > 0) {
            done += (size_t)r;
            for (size_t left = (size_t)r; left > 0; i++) {
                size_t take = left < iov[i].iov_len ? left : iov[i].iov_len;
                iov[i].iov_base = (uint8_t *)iov[i].iov_base + take;
                iov[i].iov_len -= take;
                left -= take;
                if (iov[i].iov_len)
                    break;
            }
            continue;
        }
        if (r == 0) {
            snprintf(err, errlen, "the peer closed the connection");
            rc = BW_UNAVAILABLE;
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            rc = wait_fd(fd, POLLIN, deadline_ms);
            if (rc == BW_OK)
                continue;
            snprintf(err, errlen, "%s",
                     wait_failed(rc, "no data before the deadline", "waiting for data failed"));
            break;
        }
        snprintf(err, errlen, "receive failed: %s", strerror(errno));
        rc = BW_UNAVAILABLE;
        break;
    }
    if (got)
        *got = done;
    return rc;
}

int bw__sock_read_all(int fd, void *buf, size_t len, uint64_t deadline_ms, size_t *got, char *err,
                      size_t errlen)
{
    return bw__sock_read_some(fd, buf, len, len, deadline_ms, got, err, errlen);
}

int bw__sock_read_some(int fd, void *buf, size_t min, size_t max, uint64_t deadline_ms, size_t *got,
                       char *err, size_t errlen)
{
    struct iovec iov = {buf, max};
    return readv_min(fd, &iov, 1, min, deadline_ms, got, err, errlen);
}

int bw__sock_writev_all(int fd, struct iovec *iov, size_t n, uint64_t deadline_ms, char *err,
                        size_t errlen)
{
    size_t i = 0;
    while (i < n) {
        if (iov[i].iov_len == 0) {
            i++;
            continue;
        }
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov + i;
        mh.msg_iovlen = n - i > 1024 ? 1024 : n - i;
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = wait_fd(fd, POLLOUT, deadline_ms);
                if (rc == BW_OK)
                    continue;
                snprintf(err, errlen, "%s",
                         wait_failed(rc, "the peer did not read before the deadline",
                                     "waiting to send failed"));
                return rc;
            }
            snprintf(err, errlen, "send failed: %s", strerror(errno));
            return BW_UNAVAILABLE;
        }
        size_t left = (size_t)w;
        while (i < n && left >= iov[i].iov_len) {
            left -= iov[i].iov_len;
            i++;
        }
        if (left) {
            iov[i].iov_base = (uint8_t *)iov[i].iov_base + left;
            iov[i].iov_len -= left;
        }
    }
    return BW_OK;
}

/* ---- TLS ---- */

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

static void tls_reason(char *buf, size_t len, const char *fallback)
{
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, buf, len);
    else
        snprintf(buf, len, "%s", fallback);
    ERR_clear_error();
}

static SSL_CTX *new_ctx(const SSL_METHOD *m, char *err, size_t errlen)
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

/* Loads the certificate chain and key (already checked to match by bw__tls_*). */
static int load_pair(SSL_CTX *ctx, const char *cert, const char *key, char *err, size_t errlen)
{
    char why[256];
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        tls_reason(why, sizeof(why), "unreadable");
        snprintf(err, errlen, "--tls-cert %s: %s", cert, why);
        return BW_TLS;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        tls_reason(why, sizeof(why), "does not match the certificate");
        snprintf(err, errlen, "--tls-key %s: %s", key, why);
        return BW_TLS;
    }
    return BW_OK;
}

int bw__dchan_tls_server_ctx(const struct bw_tls_server_files *files, SSL_CTX **out, char *err,
                             size_t errlen)
{
    *out = NULL;
    SSL_CTX *ctx = new_ctx(TLS_server_method(), err, errlen);
    if (!ctx)
        return BW_TLS;
    int rc = load_pair(ctx, files->cert, files->key, err, errlen);
    if (rc == BW_OK && files->client_ca) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(files->client_ca);
        if (SSL_CTX_load_verify_locations(ctx, files->client_ca, NULL) != 1 || !names) {
            char why[256];
            tls_reason(why, sizeof(why), "no certificate");
            snprintf(err, errlen, "--tls-client-ca %s: %s", files->client_ca, why);
            rc = BW_TLS;
        } else {
            SSL_CTX_set_client_CA_list(ctx, names);
            names = NULL;
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
        }
        sk_X509_NAME_pop_free(names, X509_NAME_free);
    }
    if (rc != BW_OK) {
        SSL_CTX_free(ctx);
        return rc;
    }
    *out = ctx;
    return BW_OK;
}

int bw__dchan_tls_client_ctx(const struct bw_tls_client_files *files, SSL_CTX **out, char *err,
                             size_t errlen)
{
    *out = NULL;
    SSL_CTX *ctx = new_ctx(TLS_client_method(), err, errlen);
    if (!ctx)
        return BW_TLS;
    int rc = BW_OK;
    char why[256];
    if (files->ca ? SSL_CTX_load_verify_locations(ctx, files->ca, NULL) != 1
                  : SSL_CTX_set_default_verify_paths(ctx) != 1) {
        tls_reason(why, sizeof(why), "no certificate");
        snprintf(err, errlen, "--tls-ca %s: %s", files->ca ? files->ca : "(system roots)", why);
        rc = BW_TLS;
    }
    if (rc == BW_OK && files->cert && files->key)
        rc = load_pair(ctx, files->cert, files->key, err, errlen);
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
        int rc = wait_fd(s->fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline_ms);
        if (rc != BW_OK)
            snprintf(
                err, errlen, "%s",
                wait_failed(rc, "no progress before the deadline", "waiting for the peer failed"));
        return rc;
    }
    if (e == SSL_ERROR_ZERO_RETURN) {
        snprintf(err, errlen, "the peer closed the TLS connection");
    } else if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
        snprintf(err, errlen, "%s",
                 errno && r < 0 ? strerror(errno) : "the peer closed the connection");
    } else {
        char why[256];
        tls_reason(why, sizeof(why), "TLS error");
        snprintf(err, errlen, "TLS: %s", why);
    }
    return BW_UNAVAILABLE;
}

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
        char why[300];
        int rc = ssl_wait(s, r, deadline_ms, why, sizeof(why));
        if (rc != BW_OK) {
            long v = SSL_get_verify_result(s->ssl);
            if (v != X509_V_OK)
                snprintf(why, sizeof(why), "certificate verification failed: %s",
                         X509_verify_cert_error_string(v));
            snprintf(err, errlen, "TLS handshake: %s", why);
            return BW_TLS;
        }
    }
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
        if (n == 0 && (rc = wait_fd(s->fd, POLLIN, deadline_ms)) != BW_OK) {
            snprintf(err, errlen, "%s",
                     wait_failed(rc, "no data before the deadline", "waiting for data failed"));
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
