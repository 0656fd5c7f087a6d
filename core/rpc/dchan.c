/* The bulk data channel's framing and the blocking socket helpers both ends use. */
#include "rpc/dchan.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/util.h"

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
    if (*kind != BW_DCHAN_KIND_READ_SAMPLES) {
        snprintf(err, errlen, "data channel: request kind %u is unknown (1 = ReadSamples)", *kind);
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
        int n = poll(&p, 1, timeout);
        if (n > 0)
            return BW_OK;
        if (n == 0)
            return BW_TIMEOUT;
        if (errno != EINTR)
            return BW_UNAVAILABLE;
    }
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
        int ok = connect(s, ai->ai_addr, ai->ai_addrlen) == 0;
        if (!ok && errno == EINPROGRESS && wait_fd(s, POLLOUT, deadline) == BW_OK) {
            int e = 0;
            socklen_t el = sizeof(e);
            getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &el);
            ok = e == 0;
            errno = e ? e : ETIMEDOUT;
        } else if (!ok && errno == EINPROGRESS) {
            errno = ETIMEDOUT;
        }
        if (!ok) {
            saved = errno;
            close(s);
            s = -1;
        }
    }
    freeaddrinfo(res);
    if (s < 0) {
        snprintf(err, errlen, "cannot connect to %s: %s", addr, strerror(saved));
        return saved == ETIMEDOUT ? BW_TIMEOUT : BW_UNAVAILABLE;
    }
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd = s;
    return BW_OK;
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
            snprintf(err, errlen,
                     rc == BW_TIMEOUT ? "no data before the deadline" : "waiting for data failed");
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
                snprintf(err, errlen,
                         rc == BW_TIMEOUT ? "the peer did not read before the deadline"
                                          : "waiting to send failed");
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
