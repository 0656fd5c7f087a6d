/* Blocking sockets with deadlines for the data channel (dchan.h): address splitting and
 * resolution, connecting, the settings of a connected socket, and reads and writes that wait
 * with poll until a monotonic deadline. The listening end is in dchan_listen.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/interrupt.h"
#include "common/util.h"
#include "rpc/dchan.h"
#include "rpc/dchan_int.h"

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

int bw__sock_resolve(const char *addr, bool passive, struct addrinfo **res, char *err,
                     size_t errlen)
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

int bw__sock_wait(int fd, short events, uint64_t deadline_ms)
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

const char *bw__sock_wait_failed(int rc, const char *on_timeout, const char *otherwise)
{
    return rc == BW_TIMEOUT ? on_timeout : rc == BW_INTERRUPTED ? bw_strerror(rc) : otherwise;
}

/* Attempts racing to connect (bw__sock_connect): the name's addresses (the first
 * BW_SOCK_RACE_ADDRS), those that refused, and the attempts in flight with their address. */
enum { BW_SOCK_RACE_ADDRS = 16 };
typedef struct race {
    const struct addrinfo *ai[BW_SOCK_RACE_ADDRS];
    bool dead[BW_SOCK_RACE_ADDRS];
    size_t naddr, live, next; /* addresses; not refused; the next to try */
    struct pollfd pf[BW_SOCK_RACE_MAX];
    size_t of[BW_SOCK_RACE_MAX];
    size_t n;
} race;

/* Address k refused (or cannot be reached): it is not tried again. */
static void race_dead(race *r, size_t k)
{
    if (!r->dead[k]) {
        r->dead[k] = true;
        r->live--;
    }
}

/* Starts an attempt beside those in flight, to the next address not refused: the socket
 * when it connected at once, else -1 (*saved: why it failed at once, if it did). */
static int race_start(race *r, int *saved)
{
    size_t k = r->next;
    while (r->dead[k])
        k = (k + 1) % r->naddr;
    r->next = (k + 1) % r->naddr;
    const struct addrinfo *ai = r->ai[k];
    int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (s >= 0 && connect(s, ai->ai_addr, ai->ai_addrlen) == 0)
        return s;
    if (s >= 0 && errno == EINPROGRESS) {
        r->pf[r->n] = (struct pollfd){s, POLLOUT, 0};
        r->of[r->n++] = k;
        return -1;
    }
    *saved = errno;
    if (s >= 0)
        close(s);
    race_dead(r, k);
    return -1;
}

int bw__sock_connect(const char *addr, int timeout_ms, int *fd, char *err, size_t errlen)
{
    struct addrinfo *res = NULL;
    int rc = bw__sock_resolve(addr, false, &res, err, errlen);
    if (rc != BW_OK)
        return rc;
    /* A lost SYN, or its answer, costs the kernel's first retransmission: 1 s. So while no
     * attempt has connected another starts beside them every BW_SOCK_RACE_MS -- a fresh SYN,
     * to the name's next address (one that refused is not tried again) -- up to
     * BW_SOCK_RACE_MAX at once; the first to connect wins, the others are closed
     * (docs/operating.md, "Networks"). */
    race r;
    memset(&r, 0, sizeof(r));
    for (const struct addrinfo *a = res; a && r.naddr < BW_SOCK_RACE_ADDRS; a = a->ai_next)
        r.ai[r.naddr++] = a;
    r.live = r.naddr;
    uint64_t now = bw__mono_ms(), deadline = now + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
    uint64_t next = now;
    int s = -1, saved = ETIMEDOUT;
    for (;;) {
        while (s < 0 && r.live > 0 && r.n < BW_SOCK_RACE_MAX && (now >= next || r.n == 0)) {
            s = race_start(&r, &saved);
            next = now + BW_SOCK_RACE_MS;
        }
        if (s >= 0 || (r.n == 0 && r.live == 0))
            break;
        if (now >= deadline) {
            saved = ETIMEDOUT;
            break;
        }
        bool more = r.live > 0 && r.n < BW_SOCK_RACE_MAX && next < deadline;
        uint64_t wake = more ? next : deadline;
        int ready = bw__poll(r.pf, r.n, (int)(wake > now ? wake - now : 0));
        if (bw__interrupted()) {
            saved = EINTR;
            break;
        }
        if (ready < 0 && errno != EINTR) {
            saved = errno;
            break;
        }
        for (size_t k = r.n; ready > 0 && k-- > 0;) {
            if (!r.pf[k].revents)
                continue;
            int e = 0;
            socklen_t el = sizeof(e);
            if (getsockopt(r.pf[k].fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
                e = errno;
            if (e == 0 && s < 0) {
                s = r.pf[k].fd;
            } else {
                if (e != 0) { /* refused, unreachable: the address answered */
                    saved = e;
                    race_dead(&r, r.of[k]);
                }
                close(r.pf[k].fd);
            }
            r.pf[k] = r.pf[r.n - 1];
            r.of[k] = r.of[--r.n];
        }
        now = bw__mono_ms();
    }
    for (size_t k = 0; k < r.n; k++) /* the attempts that lost the race */
        close(r.pf[k].fd);
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
    setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, &one, sizeof(one));
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
            rc = bw__sock_wait(fd, POLLIN, deadline_ms);
            if (rc == BW_OK)
                continue;
            snprintf(
                err, errlen, "%s",
                bw__sock_wait_failed(rc, "no data before the deadline", "waiting for data failed"));
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
                int rc = bw__sock_wait(fd, POLLOUT, deadline_ms);
                if (rc == BW_OK)
                    continue;
                snprintf(err, errlen, "%s",
                         bw__sock_wait_failed(rc, "the peer did not read before the deadline",
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
