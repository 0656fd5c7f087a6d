/* The coordinator's commit channel (commit_channel.h): one thread runs an epoll loop over every
 * connection -- TLS handshake, reads, decoding, the operation -- and the journal's notifier
 * thread queues each answer once its group commit is durable. A plain connection whose queue
 * was empty is written by the notifier at once (no hand-off); otherwise, and always with TLS
 * (an SSL object belongs to one thread), the loop writes it after an eventfd wake-up. Why a
 * loop and not gRPC: docs/performance.md, "The commit channel". */
#include "commit_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth/auth.h"
#include "common/arena.h"
#include "common/log.h"
#include "common/util.h"
#include "jobs_service.h"
#include "rpc/dchan.h"
#include "rpc/tls.h"

typedef struct cconn cconn;

struct bw_cchan {
    bw_coordinator *c;
    int lfd, efd, epfd, port;
    SSL_CTX *tls; /* NULL: plain TCP */
    pthread_t th;
    atomic_bool stopping;
    cconn *conns; /* every open connection (the loop thread's alone) */
    size_t nconns;
    cconn *graveyard; /* dropped in this round of events; freed after it (loop thread) */
    bw_log_limit bad_log;
    pthread_mutex_t mu; /* flush list and pending */
    pthread_cond_t idle;
    cconn *flush;   /* connections with answers for the loop to write */
    size_t pending; /* answers waiting on the journal, all connections */
};

struct cconn {
    bw_cchan *srv;
    cconn *prev, *next; /* srv->conns */
    int fd;
    SSL *ssl;
    bool handshaking, authed, closing; /* the loop thread's */
    bool gone; /* dropped: its later events in the same round are skipped (loop thread) */
    uint64_t hello_by;
    bw_principal who;
    char *token; /* the hello's, checked again with each frame (NULL: none) */
    char peer[64];
    char cert_cn[BW_PRINCIPAL_NAME_MAX];
    uint8_t *in; /* received, not yet decoded */
    size_t in_len, in_cap;
    /* under mu: */
    pthread_mutex_t mu;
    uint8_t *out; /* encoded answers not yet written */
    size_t out_off, out_len, out_cap;
    int pending;       /* answers waiting on the journal */
    uint64_t answered; /* answers queued */
    bool broken;       /* an answer could not be queued or written: the loop drops it */
    bool dead;         /* the loop dropped it: answers only count down */
    bool reaped;       /* ... and let it go: freed by the last answer */
    bool on_flush;
    cconn *flush_next;
};

/* One SESSION frame in flight: its request and answer live in the arena. */
typedef struct pend {
    cconn *conn;
    bw_arena arena;
    bw_session_answer ans;
} pend;

/* ---- bytes in and out (plain or TLS) ---- */

/* > 0 bytes read; 0: nothing now; -1: closed or failed. */
static ssize_t conn_recv(cconn *c, void *buf, size_t n)
{
    if (!c->ssl) {
        ssize_t r;
        do
            r = recv(c->fd, buf, n, MSG_DONTWAIT);
        while (r < 0 && errno == EINTR);
        if (r > 0)
            return r;
        return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    ERR_clear_error();
    int r = SSL_read(c->ssl, buf, n > 1 << 30 ? 1 << 30 : (int)n);
    if (r > 0)
        return r;
    int e = SSL_get_error(c->ssl, r);
    return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
}

/* Under c->mu: writes what it can of c->out without waiting. false: the connection failed. */
static bool conn_flush_locked(cconn *c)
{
    while (c->out_off < c->out_len) {
        size_t n = c->out_len - c->out_off;
        ssize_t r;
        if (!c->ssl) {
            do
                r = send(c->fd, c->out + c->out_off, n, MSG_DONTWAIT | MSG_NOSIGNAL);
            while (r < 0 && errno == EINTR);
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return true;
        } else {
            ERR_clear_error();
            r = SSL_write(c->ssl, c->out + c->out_off, n > 1 << 30 ? 1 << 30 : (int)n);
            if (r <= 0) {
                int e = SSL_get_error(c->ssl, (int)r);
                if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
                    return true;
            }
        }
        if (r <= 0)
            return false;
        c->out_off += (size_t)r;
    }
    c->out_off = c->out_len = 0;
    return true;
}

/* Under c->mu: room for n more bytes in c->out. */
static bool out_reserve(cconn *c, size_t n)
{
    if (c->out_off > 0 && c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len + n <= c->out_cap)
        return true;
    if (c->out_off > 0) { /* what was written goes first */
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
        if (c->out_len + n <= c->out_cap)
            return true;
    }
    size_t cap = c->out_cap ? c->out_cap : 4096;
    while (cap < c->out_len + n)
        cap *= 2;
    uint8_t *p = realloc(c->out, cap);
    if (!p)
        return false;
    c->out = p;
    c->out_cap = cap;
    return true;
}

/* Under c->mu: queues one frame (header and body). */
static bool out_frame(cconn *c, const bw_dchan_frame *f, const void *body, size_t len)
{
    if (!out_reserve(c, BW_DCHAN_FRAME_HEADER + len))
        return false;
    bw__dchan_put_frame(c->out + c->out_len, f);
    if (len)
        memcpy(c->out + c->out_len + BW_DCHAN_FRAME_HEADER, body, len);
    c->out_len += BW_DCHAN_FRAME_HEADER + len;
    return true;
}

/* Under c->mu: hands c to the loop to write (it wakes on the eventfd). */
static void want_flush_locked(cconn *c)
{
    if (c->on_flush)
        return;
    c->on_flush = true;
    bw_cchan *s = c->srv;
    pthread_mutex_lock(&s->mu);
    bool wake = s->flush == NULL;
    c->flush_next = s->flush;
    s->flush = c;
    pthread_mutex_unlock(&s->mu);
    if (wake) {
        uint64_t one = 1;
        ssize_t w = write(s->efd, &one, sizeof(one));
        (void)w; /* a full counter already wakes the loop */
    }
}

static void conn_free(cconn *c)
{
    if (c->ssl)
        SSL_free(c->ssl);
    if (c->fd >= 0)
        close(c->fd);
    pthread_mutex_destroy(&c->mu);
    if (c->token)
        OPENSSL_cleanse(c->token, strlen(c->token));
    free(c->token);
    free(c->in);
    free(c->out);
    free(c);
}

/* ---- answers (the journal's notifier thread, or the loop when already durable) ---- */

static void answer_durable(void *arg, int jrc)
{
    pend *p = arg;
    cconn *c = p->conn;
    bw_cchan *s = c->srv;
    bw__jobs_session_settle(s->c, &p->ans, jrc);
    uint8_t small[512];
    size_t len = protobuf_c_message_get_packed_size(&p->ans.resp.base);
    uint8_t *body = len <= sizeof(small) ? small : malloc(len);
    bool freeit = false;
    pthread_mutex_lock(&c->mu);
    if (!c->dead) {
        bool ok = body != NULL;
        if (ok) {
            protobuf_c_message_pack(&p->ans.resp.base, body);
            bw_dchan_frame f = {BW_DCHAN_ANSWER, 0, len, p->ans.resp.id};
            bool was_empty = c->out_len == c->out_off;
            ok = out_frame(c, &f, body, len);
            c->answered += ok;
            /* A plain socket is written here: the loop thread may be reading it, which TCP
             * allows; a TLS one only by the loop. */
            if (ok && was_empty && !c->ssl && !c->on_flush)
                ok = conn_flush_locked(c);
        }
        if (!ok)
            c->broken = true; /* out of memory or a failed socket: the loop drops it */
        if (!ok || c->out_len > c->out_off || c->pending == BW_CCHAN_WINDOW)
            want_flush_locked(c); /* the rest, or reading again after a full window */
    }
    c->pending--;
    freeit = c->reaped && c->pending == 0;
    pthread_mutex_unlock(&c->mu);
    if (body != small)
        free(body);
    bw__arena_reset(&p->arena);
    free(p);
    if (freeit)
        conn_free(c);
    pthread_mutex_lock(&s->mu);
    if (--s->pending == 0)
        pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
}

/* ---- the loop: decoding ---- */

/* Queues an ERROR frame and marks the connection to be closed once it is written. */
static void fail_conn(cconn *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail_conn(cconn *c, int code, const char *fmt, ...)
{
    char msg[BW_DCHAN_MAX_MESSAGE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
    va_end(ap);
    bw__log_limited(&c->srv->bad_log, BW_LOG_WARN,
                    "commit channel: closing the connection peer=%s code=%s err=%s", c->peer,
                    bw_err_name(code), msg);
    size_t len = strlen(msg);
    bw_dchan_frame f = {BW_DCHAN_ERROR, (uint32_t)code, len, 0};
    c->closing = true;
    pthread_mutex_lock(&c->mu);
    out_frame(c, &f, msg, len);
    pthread_mutex_unlock(&c->mu);
}

static void hello(cconn *c, const uint8_t *body, size_t len)
{
    bw_cchan *s = c->srv;
    if (len >= BW_TOKEN_MAX) {
        fail_conn(c, BW_UNAUTHENTICATED,
                  "commit channel: the hello's token is %zu bytes (at most %d)", len,
                  BW_TOKEN_MAX - 1);
        return;
    }
    char token[BW_TOKEN_MAX];
    memcpy(token, body, len);
    token[len] = '\0';
    if (strlen(token) != len) {
        fail_conn(c, BW_UNAUTHENTICATED, "commit channel: the hello's token holds a NUL byte");
        return;
    }
    char err[1024] = "";
    int rc = bw__auth_check(s->c->auth, BW_M_JOBS_SESSION, len ? token : NULL,
                            c->cert_cn[0] ? c->cert_cn : NULL, &c->who, err, sizeof(err));
    if (rc != BW_OK) {
        fail_conn(c, rc, "Jobs.Session: %s", err);
        return;
    }
    if (len && !(c->token = strdup(token))) {
        fail_conn(c, BW_NOMEM, "commit channel: out of memory for the hello");
        return;
    }
    c->authed = true;
    bw_dchan_frame f = {BW_DCHAN_END, 0, 0, 0};
    pthread_mutex_lock(&c->mu);
    if (!out_frame(c, &f, NULL, 0))
        c->broken = true;
    pthread_mutex_unlock(&c->mu);
}

static void session(cconn *c, const uint8_t *body, size_t len)
{
    bw_cchan *s = c->srv;
    if (!c->authed) {
        fail_conn(c, BW_UNAUTHENTICATED,
                  "commit channel: a SESSION frame before the hello (send kind %d with the bearer "
                  "token first; docs/operating.md, \"Commit channel\")",
                  BW_DCHAN_KIND_AUTH);
        return;
    }
    pend *p = calloc(1, sizeof(*p));
    if (!p) {
        fail_conn(c, BW_NOMEM, "commit channel: out of memory for a request");
        return;
    }
    bw__arena_init(&p->arena, 4 * BW_CCHAN_MAX_FRAME + (1u << 16));
    p->conn = c;
    Batchwire__V1__SessionRequest *r =
        batchwire__v1__session_request__unpack(&p->arena.pb, len, body);
    bw_method_id as = r ? bw__jobs_session_method(r) : BW_M__COUNT;
    /* Each frame is checked against the principals in force now, as each data-channel request
     * is: a token removed on SIGHUP stops working on open connections too (docs/security.md,
     * "Rotating tokens"). */
    char aerr[512] = "";
    int arc = as == BW_M__COUNT
                  ? BW_OK
                  : bw__auth_check(s->c->auth, as, c->token, c->cert_cn[0] ? c->cert_cn : NULL,
                                   &c->who, aerr, sizeof(aerr));
    if (!r || as == BW_M__COUNT || arc != BW_OK) {
        if (!r)
            fail_conn(c, BW_INVALID_ARGUMENT,
                      "Jobs.Session: a SESSION frame of %zu bytes is no SessionRequest", len);
        else if (as == BW_M__COUNT)
            fail_conn(c, BW_INVALID_ARGUMENT,
                      "Jobs.Session: message %llu carries no request (a SessionRequest holds a "
                      "commit or a heartbeat)",
                      (unsigned long long)r->id);
        else
            fail_conn(c, arc, "Jobs.Session: %s", aerr);
        bw__arena_reset(&p->arena);
        free(p);
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->pending++;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&s->mu);
    s->pending++;
    pthread_mutex_unlock(&s->mu);
    uint64_t wait_seq = bw__jobs_session_begin(s->c, &c->who, r, &p->arena, &p->ans);
    bw__journal_when_durable(bw__jobs_journal(s->c->jobs), wait_seq, answer_durable, p);
}

/* Decodes every whole frame in c->in, up to the window. */
static void decode(cconn *c)
{
    size_t off = 0;
    while (!c->closing && c->in_len - off >= BW_DCHAN_REQ_HEADER) {
        pthread_mutex_lock(&c->mu);
        bool full = c->pending >= BW_CCHAN_WINDOW;
        pthread_mutex_unlock(&c->mu);
        if (full)
            break;
        /* The data channel's request header (dchan.h) with the commit channel's own kinds
         * and limit: bw__dchan_get_req_header knows the worker's. */
        const uint8_t *h = c->in + off;
        uint32_t magic = bw__get_le32(h), kind = bw__get_le32(h + 4);
        uint64_t len = bw__get_le64(h + 8);
        if (magic != BW_DCHAN_MAGIC) {
            fail_conn(c, BW_PROTOCOL,
                      "commit channel: the frame does not start with \"BWD1\" (got bytes %02x %02x "
                      "%02x %02x): not a batchwire client, or a gRPC client on the commit port",
                      h[0], h[1], h[2], h[3]);
            break;
        }
        if (len > BW_CCHAN_MAX_FRAME) {
            fail_conn(c, BW_TOO_BIG,
                      "commit channel: a frame of %llu bytes (kind %u) is over the limit of %d",
                      (unsigned long long)len, kind, BW_CCHAN_MAX_FRAME);
            break;
        }
        if (c->in_len - off < BW_DCHAN_REQ_HEADER + len)
            break;
        const uint8_t *body = c->in + off + BW_DCHAN_REQ_HEADER;
        off += BW_DCHAN_REQ_HEADER + len;
        if (kind == BW_DCHAN_KIND_AUTH && !c->authed)
            hello(c, body, len);
        else if (kind == BW_DCHAN_KIND_SESSION)
            session(c, body, len);
        else
            fail_conn(c, BW_PROTOCOL,
                      "commit channel: frame kind %u %s (a connection sends the hello, kind %d, "
                      "then SESSION frames, kind %d)",
                      kind, kind == BW_DCHAN_KIND_AUTH ? "a second time" : "is unknown",
                      BW_DCHAN_KIND_AUTH, BW_DCHAN_KIND_SESSION);
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
}

/* ---- the loop: connections ---- */

static void drop(bw_cchan *s, cconn *c)
{
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    pthread_mutex_lock(&s->mu); /* off the flush list */
    for (cconn **pp = &s->flush; *pp; pp = &(*pp)->flush_next)
        if (*pp == c) {
            *pp = c->flush_next;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&c->mu);
    BW_DEBUG("commit channel: connection closed peer=%s principal=%s answered=%llu pending=%d",
             c->peer, c->who.name, (unsigned long long)c->answered, c->pending);
    c->dead = true;
    c->on_flush = false;
    shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&c->mu);
    c->gone = true;
    c->next = s->graveyard;
    s->graveyard = c;
}

/* Lets the dropped connections go: each is freed now, or by its last answer. */
static void reap(bw_cchan *s)
{
    while (s->graveyard) {
        cconn *c = s->graveyard;
        s->graveyard = c->next;
        pthread_mutex_lock(&c->mu);
        c->reaped = true;
        bool freeit = c->pending == 0;
        pthread_mutex_unlock(&c->mu);
        if (freeit)
            conn_free(c);
    }
}

/* The epoll events c needs now (reading while under the window; writing while answers wait). */
static void rearm(bw_cchan *s, cconn *c)
{
    pthread_mutex_lock(&c->mu);
    bool out = c->out_len > c->out_off;
    bool in = !c->closing && c->pending < BW_CCHAN_WINDOW;
    pthread_mutex_unlock(&c->mu);
    struct epoll_event ev = {(in ? EPOLLIN : 0) | (out ? EPOLLOUT : 0), {.ptr = c}};
    epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

static void peer_cert_name(cconn *c)
{
    X509 *cert = SSL_get1_peer_certificate(c->ssl);
    if (!cert)
        return;
    if (SSL_get_verify_result(c->ssl) == X509_V_OK) {
        int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, c->cert_cn,
                                          (int)sizeof(c->cert_cn));
        if (n < 0 || (size_t)n >= sizeof(c->cert_cn) || strlen(c->cert_cn) != (size_t)n)
            c->cert_cn[0] = 0;
    }
    X509_free(cert);
}

/* Handles c's events; false: drop it. */
static bool serve(bw_cchan *s, cconn *c)
{
    if (c->handshaking) {
        ERR_clear_error();
        int r = SSL_do_handshake(c->ssl);
        if (r != 1) {
            int e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
                struct epoll_event ev = {e == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT, {.ptr = c}};
                epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev);
                return true;
            }
            char why[256];
            unsigned long code = ERR_get_error();
            if (code)
                ERR_error_string_n(code, why, sizeof(why));
            else
                snprintf(why, sizeof(why), "the peer closed the connection");
            ERR_clear_error();
            bw__log_limited(&s->bad_log, BW_LOG_WARN,
                            "commit channel: TLS handshake failed peer=%s err=%s", c->peer, why);
            return false;
        }
        c->handshaking = false;
        peer_cert_name(c);
    }
    while (!c->closing) {
        if (c->in_cap - c->in_len < 16384) {
            size_t cap = c->in_cap ? c->in_cap * 2 : 32768;
            uint8_t *p = realloc(c->in, cap);
            if (!p)
                return false;
            c->in = p;
            c->in_cap = cap;
        }
        ssize_t r = conn_recv(c, c->in + c->in_len, c->in_cap - c->in_len);
        if (r < 0) {
            if (c->in_len)
                bw__log_limited(&s->bad_log, BW_LOG_WARN,
                                "commit channel: the connection ended inside a frame peer=%s",
                                c->peer);
            return false;
        }
        c->in_len += (size_t)r;
        decode(c);
        pthread_mutex_lock(&c->mu);
        bool full = c->pending >= BW_CCHAN_WINDOW;
        pthread_mutex_unlock(&c->mu);
        if (r == 0 || full)
            break; /* nothing more now, or the window is full (decode left the rest) */
    }
    pthread_mutex_lock(&c->mu);
    bool ok = !c->broken && conn_flush_locked(c);
    bool done = c->closing && c->out_len == c->out_off;
    pthread_mutex_unlock(&c->mu);
    if (!ok || done)
        return false;
    rearm(s, c);
    return true;
}

/* false: nothing more to accept now. */
static bool accept_one(bw_cchan *s)
{
    int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return errno == EINTR || errno == ECONNABORTED;
    if (s->nconns >= BW_CCHAN_MAX_CONNS) {
        bw__log_limited(&s->bad_log, BW_LOG_WARN,
                        "commit channel: refusing a connection: %d are open (the most)",
                        BW_CCHAN_MAX_CONNS);
        close(fd);
        return true;
    }
    bw__sock_tune(fd);
    cconn *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return true;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->srv = s;
    c->fd = fd;
    c->hello_by = bw__mono_ms() + BW_CCHAN_HELLO_TIMEOUT_MS;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[48] = "?", port[16] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(c->peer, sizeof(c->peer), "%s:%s", host, port);
    if (s->tls) {
        c->ssl = SSL_new(s->tls);
        if (!c->ssl || SSL_set_fd(c->ssl, fd) != 1) {
            conn_free(c);
            return true;
        }
        SSL_set_accept_state(c->ssl);
        c->handshaking = true;
    }
    struct epoll_event ev = {EPOLLIN, {.ptr = c}};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        conn_free(c);
        return true;
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    return true;
}

static void *loop(void *arg)
{
    bw_cchan *s = arg;
    struct epoll_event evs[256];
    uint64_t sweep = bw__mono_ms();
    while (!atomic_load(&s->stopping)) {
        int n = epoll_wait(s->epfd, evs, 256, 1000);
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &s->lfd) {
                for (int k = 0; k < 64 && accept_one(s); k++)
                    ;
            } else if (p == &s->efd) {
                uint64_t v;
                ssize_t r = read(s->efd, &v, sizeof(v));
                (void)r;
                pthread_mutex_lock(&s->mu);
                cconn *list = s->flush;
                s->flush = NULL;
                pthread_mutex_unlock(&s->mu);
                /* Each is served (decoded further, written) as if its socket were ready. Lock
                 * order: an answer holds c->mu when it takes s->mu, so never the other way. */
                cconn *next;
                for (cconn *c = list; c; c = next) {
                    next = c->flush_next;
                    pthread_mutex_lock(&c->mu);
                    c->on_flush = false;
                    pthread_mutex_unlock(&c->mu);
                    if (!c->gone && !serve(s, c))
                        drop(s, c);
                }
            } else {
                cconn *c = p;
                if (!c->gone && !serve(s, c))
                    drop(s, c);
            }
        }
        reap(s);
        uint64_t now = bw__mono_ms();
        if (now - sweep >= 1000) { /* connections that never said hello */
            sweep = now;
            cconn *next;
            for (cconn *c = s->conns; c; c = next) {
                next = c->next;
                if (!c->authed && now > c->hello_by) {
                    bw__log_limited(&s->bad_log, BW_LOG_WARN,
                                    "commit channel: closing a connection that sent no hello in %d "
                                    "ms peer=%s",
                                    BW_CCHAN_HELLO_TIMEOUT_MS, c->peer);
                    drop(s, c);
                }
            }
        }
    }
    return NULL;
}

int bw__cchan_start(bw_coordinator *co, const char *addr, bw_cchan **out, char *bound,
                    size_t boundlen, char *err, size_t errlen)
{
    *out = NULL;
    bw_cchan *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory for the commit channel");
        return BW_NOMEM;
    }
    s->c = co;
    s->lfd = s->efd = s->epfd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    const bw_daemon_common *cm = &co->cfg->common;
    int rc = BW_OK;
    if (cm->tls_cert) {
        struct bw_tls_server_files files = {cm->tls_cert, cm->tls_key, cm->tls_client_ca};
        rc = bw__dchan_tls_server_ctx(&files, &s->tls, err, errlen);
    }
    if (rc == BW_OK) {
        char why[512];
        rc = bw__sock_listen(addr, &s->lfd, &s->port, why, sizeof(why));
        if (rc != BW_OK) /* which of the coordinator's listeners it was */
            snprintf(err, errlen, "--commit-listen: %s", why);
    }
    if (rc == BW_OK && fcntl(s->lfd, F_SETFL, fcntl(s->lfd, F_GETFL) | O_NONBLOCK) != 0) {
        snprintf(err, errlen, "commit channel on %s: %s", addr, strerror(errno));
        rc = BW_INTERNAL;
    }
    if (rc == BW_OK) {
        s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        s->epfd = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event l = {EPOLLIN, {.ptr = &s->lfd}}, e = {EPOLLIN, {.ptr = &s->efd}};
        int fl = s->lfd;
        if (s->efd < 0 || s->epfd < 0 || epoll_ctl(s->epfd, EPOLL_CTL_ADD, fl, &l) != 0 ||
            epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->efd, &e) != 0) {
            snprintf(err, errlen, "commit channel on %s: %s", addr, strerror(errno));
            rc = BW_INTERNAL;
        }
    }
    if (rc == BW_OK) {
        int e = pthread_create(&s->th, NULL, loop, s);
        if (e != 0) {
            snprintf(err, errlen, "commit channel on %s: cannot start its thread: %s", addr,
                     strerror(e));
            rc = BW_INTERNAL;
        }
    }
    if (rc != BW_OK) {
        if (s->lfd >= 0)
            close(s->lfd);
        if (s->efd >= 0)
            close(s->efd);
        if (s->epfd >= 0)
            close(s->epfd);
        bw__dchan_tls_ctx_free(s->tls);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->idle);
        free(s);
        return rc;
    }
    char host[256], port[32];
    if (bw__sock_split(addr, host, sizeof(host), port, sizeof(port)) != BW_OK)
        host[0] = 0;
    snprintf(bound, boundlen, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, s->port);
    *out = s;
    return BW_OK;
}

int bw__cchan_port(const bw_cchan *s)
{
    return s ? s->port : 0;
}

void bw__cchan_stop(bw_cchan *s, int grace_ms)
{
    if (!s)
        return;
    atomic_store(&s->stopping, true);
    uint64_t one = 1;
    ssize_t w = write(s->efd, &one, sizeof(one));
    (void)w;
    pthread_join(s->th, NULL);
    while (s->conns)
        drop(s, s->conns);
    reap(s);
    /* Answers still waiting on the journal hold their connection: it goes with the last. */
    pthread_mutex_lock(&s->mu);
    uint64_t until = bw__mono_ms() + (uint64_t)grace_ms;
    while (s->pending > 0 && bw__mono_ms() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->idle, &s->mu, &ts);
    }
    size_t left = s->pending;
    pthread_mutex_unlock(&s->mu);
    if (left) {
        BW_WARN("commit channel: %zu answers still wait on the journal after %d ms; leaving them",
                left, grace_ms);
        return; /* their callbacks still reference s */
    }
    close(s->lfd);
    close(s->efd);
    close(s->epfd);
    bw__dchan_tls_ctx_free(s->tls);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->idle);
    free(s);
}
