/*
 * ReadSamples over TCP or TLS (core/rpc/dchan.h, docs/data-channel.md). One thread per
 * connection: it reads a request, runs the same checks as the gRPC method
 * (bw__data_prepare_samples) and writes each sample's frame header and bytes with one
 * sendmsg per batch of frames -- large samples straight from the mapped file, small ones
 * gathered into a staging buffer first. A client that sends garbage gets an ERROR frame and
 * the connection is closed; the worker keeps serving everyone else.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include <openssl/ssl.h>

#include "rpc/dchan.h"
#include "worker.h"

enum {
    THREAD_STACK = 256 << 10, /* per connection; serve() needs a few KiB */
    STAGE_BYTES = 256 << 10,  /* small samples are gathered up to this much per send */
    COPY_MAX = 32 << 10,      /* samples below this are copied into the staging buffer */
    PENDING_MAX = 32,         /* large samples gathered into one sendmsg, at most */
    SEND_BYTES = 4 << 20,     /* bytes gathered into one sendmsg, about */
    IOV_CAP = 1024,
    BODY_TIMEOUT_MS = 30000,  /* a request's body must arrive within this after its header */
    SEND_TIMEOUT_MS = 120000, /* a client that stops reading for this long is dropped */
    ACCEPT_POLL_MS = 200,
};

typedef struct conn {
    bw_dsock sock;
    pthread_t th;
    atomic_bool done;
    struct bw__dchan_server *srv;
    char peer[64];
    struct conn *next;
} conn;

struct bw__dchan_server {
    bw_worker *w;
    int lfd;
    SSL_CTX *tls; /* NULL: plain TCP */
    pthread_t th;
    atomic_bool stopping;
    pthread_mutex_t mu;
    conn *conns;
    size_t nconns;
    uint64_t refused_logged_ms, refused_quiet;     /* one warning per 10 s about refusals */
    atomic_uint_fast64_t bad_logged_ms, bad_quiet; /* malformed connections: one line a second */
};

/* Whether a malformed connection may be logged now: at most one line a second, so that a
 * port scanner cannot flood the log; *quiet is how many were not logged before it. */
static bool bad_log_allowed(bw__dchan_server *s, uint64_t *quiet)
{
    uint64_t now = bw__mono_ms(), last = atomic_load(&s->bad_logged_ms);
    if ((last && now - last < 1000) ||
        !atomic_compare_exchange_strong(&s->bad_logged_ms, &last, now)) {
        atomic_fetch_add(&s->bad_quiet, 1);
        return false;
    }
    *quiet = atomic_exchange(&s->bad_quiet, 0);
    return true;
}

static void bad_conn_log(bw__dchan_server *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void bad_conn_log(bw__dchan_server *s, const char *fmt, ...)
{
    uint64_t quiet;
    if (!bad_log_allowed(s, &quiet))
        return;
    char line[1800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (quiet)
        BW_INFO("%s (and %llu more such connections before it, not logged)", line,
                (unsigned long long)quiet);
    else
        BW_INFO("%s", line);
}

/* ---- sending ----
 * Frames are gathered into one iovec list: headers and small samples copied into the staging
 * buffer, large samples as pointers into the mapped file (their records held until sent), and
 * written with one sendmsg per PENDING_MAX samples or SEND_BYTES bytes. */

typedef struct wbuf {
    bw_dsock *sock;
    uint8_t *stage; /* STAGE_BYTES */
    size_t len;
    struct iovec *iov; /* IOV_CAP */
    size_t niov, pending;
    bw__record *recs; /* PENDING_MAX, referenced by iov */
    size_t nrec;
    char err[256];
} wbuf;

static int wbuf_init(wbuf *o, bw_dsock *sock)
{
    memset(o, 0, sizeof(*o));
    o->sock = sock;
    o->stage = malloc(STAGE_BYTES);
    o->iov = malloc(IOV_CAP * sizeof(*o->iov));
    o->recs = malloc(PENDING_MAX * sizeof(*o->recs));
    return o->stage && o->iov && o->recs ? BW_OK : BW_NOMEM;
}

static void wbuf_free(wbuf *o)
{
    for (size_t i = 0; i < o->nrec; i++)
        bw__record_release(&o->recs[i]);
    free(o->stage);
    free(o->iov);
    free(o->recs);
}

static void add_iov(wbuf *o, const void *p, size_t len)
{
    if (!len)
        return;
    struct iovec *last = o->niov ? &o->iov[o->niov - 1] : NULL;
    if (last && (const uint8_t *)last->iov_base + last->iov_len == p)
        last->iov_len += len;
    else
        o->iov[o->niov++] = (struct iovec){(void *)p, len};
    o->pending += len;
}

static int flush(wbuf *o)
{
    int rc = o->niov ? bw__dsock_writev_all(o->sock, o->iov, o->niov,
                                            bw__mono_ms() + SEND_TIMEOUT_MS, o->err, sizeof(o->err))
                     : BW_OK;
    for (size_t i = 0; i < o->nrec; i++)
        bw__record_release(&o->recs[i]);
    o->nrec = o->niov = o->pending = o->len = 0;
    return rc;
}

/* Flushes unless a frame header, COPY_MAX staged bytes and a record's parts still fit. */
static int make_room(wbuf *o)
{
    if (o->nrec < PENDING_MAX && o->pending < SEND_BYTES &&
        o->len + BW_DCHAN_FRAME_HEADER + COPY_MAX <= STAGE_BYTES &&
        o->niov + 2 + BW_FMT_MAX_FIELDS <= IOV_CAP)
        return BW_OK;
    return flush(o);
}

/* Stages bytes (the caller made room). */
static void stage(wbuf *o, const void *p, size_t len)
{
    memcpy(o->stage + o->len, p, len);
    add_iov(o, o->stage + o->len, len);
    o->len += len;
}

static void stage_frame(wbuf *o, uint32_t type, int code, uint64_t a, uint64_t b)
{
    uint8_t h[BW_DCHAN_FRAME_HEADER];
    bw_dchan_frame f = {type, (uint32_t)(int32_t)code, a, b};
    bw__dchan_put_frame(h, &f);
    stage(o, h, sizeof(h));
}

/* What is pending, then an ERROR frame with its message, flushed. */
static int send_error(wbuf *o, int code, const char *msg)
{
    size_t ml = strlen(msg);
    if (ml > BW_DCHAN_MAX_MESSAGE)
        ml = BW_DCHAN_MAX_MESSAGE;
    int rc = make_room(o);
    if (rc != BW_OK)
        return rc;
    stage_frame(o, BW_DCHAN_ERROR, code, ml, 0);
    stage(o, msg, ml); /* ml <= COPY_MAX */
    return flush(o);
}

/* The samples of one checked request, in request order, then END (or ERROR at the first
 * sample that cannot be read). BW_OK unless the connection failed. */
static int serve_samples(bw_worker *w, wbuf *o, bw__wds *e,
                         const Batchwire__V1__ReadSamplesRequest *r)
{
    bw__dataset *d = bw__ds_dataset(e);
    char err[1024];
    for (size_t i = 0; i < r->n_indices; i++) {
        int rc = make_room(o);
        if (rc != BW_OK)
            return rc;
        bw__record *rec = &o->recs[o->nrec];
        rc = bw__dataset_get(d, r->indices[i], rec, err, sizeof(err));
        if (rc != BW_OK) {
            char msg[1400];
            snprintf(msg, sizeof(msg), "ReadSamples: dataset %s %s: %s", r->dataset->format,
                     r->dataset->n_sources ? r->dataset->sources[0] : "", err);
            return send_error(o, rc, msg);
        }
        atomic_fetch_add(&w->stats.records_read, 1);
        atomic_fetch_add(&w->stats.record_bytes_read, rec->size);
        stage_frame(o, BW_DCHAN_SAMPLE, 0, r->indices[i], rec->size);
        if (rec->size < COPY_MAX) {
            for (size_t p = 0; p < rec->nparts; p++)
                stage(o, rec->parts[p].p, rec->parts[p].len);
            bw__record_release(rec);
        } else {
            for (size_t p = 0; p < rec->nparts; p++)
                add_iov(o, rec->parts[p].p, rec->parts[p].len);
            o->nrec++; /* released once sent */
        }
    }
    int rc = make_room(o);
    if (rc == BW_OK)
        stage_frame(o, BW_DCHAN_END, 0, r->n_indices, 0);
    return rc == BW_OK ? flush(o) : rc;
}

/* ---- a connection ---- */

static void *serve(void *arg)
{
    conn *c = arg;
    bw_worker *w = c->srv->w;
    wbuf o;
    char err[1400];
    bool ok = wbuf_init(&o, &c->sock) == BW_OK;
    if (ok && c->srv->tls &&
        bw__dsock_tls(&c->sock, c->srv->tls, NULL, bw__mono_ms() + BODY_TIMEOUT_MS, err,
                      sizeof(err)) != BW_OK) {
        bad_conn_log(c->srv, "data channel peer=%s: %s; closing the connection", c->peer, err);
        ok = false;
    }
    while (ok && !atomic_load(&c->srv->stopping)) {
        uint8_t h[BW_DCHAN_REQ_HEADER];
        size_t got = 0;
        /* Between requests the connection sits in the client's pool: it is closed after
         * --data-idle-timeout-ms (the client then connects again); stop() shuts the socket
         * down to end the wait. */
        int64_t idle = w->cfg->data_idle_timeout_ms;
        int rc = bw__dsock_read_all(&c->sock, h, sizeof(h),
                                    idle > 0 ? bw__mono_ms() + (uint64_t)idle : 0, &got, err,
                                    sizeof(err));
        if (rc == BW_TIMEOUT && !got)
            BW_DEBUG("data channel peer=%s: closing a connection idle for %lld ms", c->peer,
                     (long long)idle);
        if (rc != BW_OK) {
            if (got)
                BW_DEBUG("data channel peer=%s: connection ended inside a request header", c->peer);
            break;
        }
        uint32_t kind;
        uint64_t len;
        rc = bw__dchan_get_req_header(h, &kind, &len, err, sizeof(err));
        if (rc != BW_OK) {
            bad_conn_log(c->srv, "data channel peer=%s: %s; closing the connection", c->peer, err);
            send_error(&o, rc, err);
            break;
        }
        uint8_t *body = malloc(len ? len : 1);
        if (!body) {
            send_error(&o, BW_NOMEM, "data channel: out of memory for the request");
            break;
        }
        rc = bw__dsock_read_all(&c->sock, body, (size_t)len, bw__mono_ms() + BODY_TIMEOUT_MS, &got,
                                err, sizeof(err));
        if (rc != BW_OK) {
            bad_conn_log(c->srv, "data channel peer=%s: request body: %zu of %llu bytes came: %s",
                         c->peer, got, (unsigned long long)len, err);
            free(body);
            break;
        }
        Batchwire__V1__ReadSamplesRequest *req =
            batchwire__v1__read_samples_request__unpack(NULL, (size_t)len, body);
        free(body);
        if (!req || !req->dataset) {
            snprintf(err, sizeof(err),
                     "data channel: the %llu-byte request is not a ReadSamplesRequest with a "
                     "dataset",
                     (unsigned long long)len);
            bad_conn_log(c->srv, "data channel peer=%s: %s; closing the connection", c->peer, err);
            if (req)
                batchwire__v1__read_samples_request__free_unpacked(req, NULL);
            send_error(&o, BW_INVALID_ARGUMENT, err);
            break;
        }
        bw__wds *e = NULL;
        rc = bw__data_prepare_samples(w, c->peer, req, &e, err, sizeof(err));
        rc = rc == BW_OK ? serve_samples(w, &o, e, req) : send_error(&o, rc, err);
        bw__ds_put(e);
        batchwire__v1__read_samples_request__free_unpacked(req, NULL);
        if (rc != BW_OK) {
            BW_DEBUG("data channel peer=%s: %s", c->peer, o.err);
            break;
        }
    }
    wbuf_free(&o);
    shutdown(c->sock.fd, SHUT_RDWR);
    atomic_store(&c->done, true);
    return NULL;
}

static void reap(bw__dchan_server *s, bool all)
{
    pthread_mutex_lock(&s->mu);
    conn **pp = &s->conns;
    while (*pp) {
        conn *c = *pp;
        if (all)
            shutdown(c->sock.fd, SHUT_RDWR);
        if (all || atomic_load(&c->done)) {
            pthread_join(c->th, NULL);
            bw__dsock_close(&c->sock);
            *pp = c->next;
            s->nconns--;
            free(c);
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

static void peer_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[64] = "?", port[16] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(buf, len, "%s:%s", host, port);
}

static void *accept_loop(void *arg)
{
    bw__dchan_server *s = arg;
    while (!atomic_load(&s->stopping)) {
        struct pollfd p = {s->lfd, POLLIN, 0};
        int n = poll(&p, 1, ACCEPT_POLL_MS);
        reap(s, false);
        if (n <= 0)
            continue;
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                usleep(ACCEPT_POLL_MS * 1000); /* out of descriptors: let connections end */
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conn *c = calloc(1, sizeof(*c));
        if (!c)
            abort();
        c->sock = (bw_dsock){fd, NULL};
        c->srv = s;
        peer_name(fd, c->peer, sizeof(c->peer));
        pthread_mutex_lock(&s->mu);
        bool full = s->nconns >= (size_t)s->w->cfg->data_max_connections;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, THREAD_STACK);
        bool started = !full && pthread_create(&c->th, &attr, serve, c) == 0;
        pthread_attr_destroy(&attr);
        if (started) {
            c->next = s->conns;
            s->conns = c;
            s->nconns++;
        }
        pthread_mutex_unlock(&s->mu);
        if (!started) {
            char msg[160];
            snprintf(msg, sizeof(msg),
                     "data channel: the worker is at its limit of %lld connections%s",
                     (long long)s->w->cfg->data_max_connections,
                     full ? "" : " (it cannot start another thread)");
            uint64_t now = bw__mono_ms();
            if (!s->refused_logged_ms || now - s->refused_logged_ms >= 10000) {
                BW_WARN("data channel peer=%s refused: %s (%llu more refused since the last "
                        "warning; such clients fetch over gRPC)",
                        c->peer, msg, (unsigned long long)s->refused_quiet);
                s->refused_logged_ms = now;
                s->refused_quiet = 0;
            } else {
                s->refused_quiet++;
            }
            wbuf o; /* over TLS the refusal is the closed connection (no handshake) */
            if (!s->tls && wbuf_init(&o, &c->sock) == BW_OK)
                send_error(&o, BW_UNAVAILABLE, msg);
            if (!s->tls)
                wbuf_free(&o);
            close(fd);
            free(c);
        }
    }
    return NULL;
}

int bw__dchan_server_start(bw_worker *w, const char *listen, SSL_CTX *tls, bw__dchan_server **out,
                           int *port, char *err, size_t errlen)
{
    *out = NULL;
    bw__dchan_server *s = calloc(1, sizeof(*s));
    if (!s)
        abort();
    s->w = w;
    s->tls = tls;
    int rc = bw__sock_listen(listen, &s->lfd, port, err, errlen);
    if (rc != BW_OK) {
        bw__dchan_tls_ctx_free(tls);
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    if (pthread_create(&s->th, NULL, accept_loop, s) != 0) {
        snprintf(err, errlen, "data channel: cannot start its thread");
        close(s->lfd);
        pthread_mutex_destroy(&s->mu);
        bw__dchan_tls_ctx_free(tls);
        free(s);
        return BW_INTERNAL;
    }
    *out = s;
    return BW_OK;
}

void bw__dchan_server_stop(bw__dchan_server *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, true);
    pthread_join(s->th, NULL);
    close(s->lfd);
    reap(s, true);
    pthread_mutex_destroy(&s->mu);
    bw__dchan_tls_ctx_free(s->tls);
    free(s);
}
