/* Connections to the workers' data channels (core/rpc/dchan.h), kept open across batches:
 * a request that ended cleanly leaves its connection on the loader's idle list. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "loader_int.h"
#include "rpc/dchan.h"

static void dconn_free(bw__dconn *c)
{
    if (!c)
        return;
    bw__dsock_close(&c->s);
    free(c->buf);
    free(c->address);
    free(c);
}

int bw__dconn_get(bw__session *s, const char *address, int timeout_ms, bw__dconn **out, char *err,
                  size_t errlen)
{
    *out = NULL;
    pthread_mutex_lock(&s->mu);
    for (size_t i = s->nidle; i-- > 0;)
        if (strcmp(s->idle[i]->address, address) == 0) {
            *out = s->idle[i];
            s->idle[i] = s->idle[--s->nidle];
            break;
        }
    pthread_mutex_unlock(&s->mu);
    if (*out) {
        (*out)->reused = true;
        return BW_OK;
    }
    uint64_t deadline = bw__mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
    bw_dsock sock = {-1, NULL};
    int rc = bw__sock_connect(address, timeout_ms, &sock.fd, err, errlen);
    if (rc == BW_OK && s->dchan_tls) {
        char host[256], port[16];
        rc = bw__sock_split(address, host, sizeof(host), port, sizeof(port));
        if (rc != BW_OK)
            snprintf(err, errlen, "address %s is not HOST:PORT", address);
        else
            rc = bw__dsock_tls(&sock, s->dchan_tls, host, deadline, err, errlen);
    }
    if (rc != BW_OK) {
        bw__dsock_close(&sock);
        return rc;
    }
    bw__dconn *c = calloc(1, sizeof(*c));
    if (!c || !(c->address = strdup(address)) || !(c->buf = malloc(BW_DCONN_BUF)))
        abort();
    c->s = sock;
    c->read_ahead = true;
    *out = c;
    return BW_OK;
}

int bw__dconn_take(bw__dconn *c, uint8_t *dst, size_t n, bool direct, size_t *got, char *err,
                   size_t errlen)
{
    *got = 0;
    if (c->pos < c->len) {
        size_t take = c->len - c->pos < n ? c->len - c->pos : n;
        memcpy(dst, c->buf + c->pos, take);
        c->pos += take;
        *got = take;
        return BW_OK;
    }
    c->pos = c->len = 0;
    if (c->s.ssl) { /* decrypted straight into dst, or through the buffer */
        size_t want = direct             ? n
                      : c->read_ahead    ? BW_DCONN_BUF
                      : n < BW_DCONN_BUF ? n
                                         : BW_DCONN_BUF;
        int rc = bw__dsock_recv(&c->s, direct ? dst : c->buf, want, got, err, errlen);
        if (rc != BW_OK || direct)
            return rc;
        c->len = *got;
        *got = c->len < n ? c->len : n;
        memcpy(dst, c->buf, *got);
        c->pos = *got;
        return BW_OK;
    }
    /* Read ahead (frame headers, small samples) only while samples are small: a large
     * sample's bytes must land in the batch, not in the buffer. */
    size_t ahead = c->read_ahead ? BW_DCONN_BUF : BW_DCHAN_FRAME_HEADER;
    struct iovec iov[2] = {{dst, n}, {c->buf, ahead}};
    if (!direct)
        iov[0] = (struct iovec){c->buf, c->read_ahead || n > ahead ? BW_DCONN_BUF : n};
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = iov;
    mh.msg_iovlen = direct ? 2 : 1;
    ssize_t r;
    do
        r = recvmsg(c->s.fd, &mh, MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return BW_OK;
    if (r <= 0) {
        snprintf(err, errlen, "%s", r == 0 ? "the worker closed the connection" : strerror(errno));
        return BW_UNAVAILABLE;
    }
    if (direct) {
        *got = (size_t)r < n ? (size_t)r : n;
        c->len = (size_t)r - *got;
        return BW_OK;
    }
    c->len = (size_t)r;
    *got = c->len < n ? c->len : n;
    memcpy(dst, c->buf, *got);
    c->pos = *got;
    return BW_OK;
}

void bw__dconn_put(bw__session *s, bw__dconn *c, bool reusable)
{
    if (!c)
        return;
    reusable = reusable && c->pos == c->len; /* nothing may follow a response */
    c->pos = c->len = 0;
    bw__dconn *drop = NULL;
    if (reusable) {
        pthread_mutex_lock(&s->mu);
        if (s->nidle == BW_DCONN_IDLE_MAX) { /* drop the oldest */
            drop = s->idle[0];
            memmove(s->idle, s->idle + 1, (s->nidle - 1) * sizeof(s->idle[0]));
            s->nidle--;
        }
        s->idle[s->nidle++] = c;
        pthread_mutex_unlock(&s->mu);
    } else {
        drop = c;
    }
    dconn_free(drop);
}

void bw__dconn_drop_idle(bw__session *s, const char *address)
{
    bw__dconn *drop[BW_DCONN_IDLE_MAX];
    size_t n = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nidle;)
        if (strcmp(s->idle[i]->address, address) == 0) {
            drop[n++] = s->idle[i];
            s->idle[i] = s->idle[--s->nidle];
        } else {
            i++;
        }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++)
        dconn_free(drop[i]);
}

void bw__dconn_close_idle(bw__session *s)
{
    for (size_t i = 0; i < s->nidle; i++)
        dconn_free(s->idle[i]);
    s->nidle = 0;
    for (size_t i = 0; i < s->nsuspended; i++)
        free(s->suspended[i].address);
    s->nsuspended = 0;
}

/* The entry for address (NULL if none); s->mu held. */
static size_t find_suspended(bw__session *s, const char *address)
{
    for (size_t i = 0; i < s->nsuspended; i++)
        if (strcmp(s->suspended[i].address, address) == 0)
            return i;
    return s->nsuspended;
}

void bw__dconn_suspend(bw__session *s, const char *address, const char *worker, const char *why)
{
    uint64_t until = bw__mono_ms() + BW_DCONN_SUSPEND_MS;
    pthread_mutex_lock(&s->mu);
    size_t i = find_suspended(s, address);
    bool fresh = i == s->nsuspended;
    if (fresh && s->nsuspended == BW_DCONN_SUSPENDED_MAX) { /* forget the oldest */
        free(s->suspended[0].address);
        memmove(s->suspended, s->suspended + 1, (s->nsuspended - 1) * sizeof(s->suspended[0]));
        i = --s->nsuspended;
    }
    if (fresh) {
        if (!(s->suspended[i].address = strdup(address)))
            abort();
        s->nsuspended++;
    }
    bool was_active = !fresh && s->suspended[i].until > bw__mono_ms();
    s->suspended[i].until = until;
    pthread_mutex_unlock(&s->mu);
    if (!was_active)
        BW_WARN("worker=%s data channel %s: %s; fetching from this worker over gRPC for the next "
                "%d s (docs/data-channel.md)",
                worker, address, why, BW_DCONN_SUSPEND_MS / 1000);
}

bool bw__dconn_suspended(bw__session *s, const char *address)
{
    pthread_mutex_lock(&s->mu);
    size_t i = find_suspended(s, address);
    bool on = i < s->nsuspended && s->suspended[i].until > bw__mono_ms();
    pthread_mutex_unlock(&s->mu);
    return on;
}
