/* A stand-in for a worker's data channel in the client's unit tests (docs/data-channel.md,
 * "Protocol" and "Versions"): accept a connection and read its request, answering a FEATURES
 * request first as a current worker does (END naming the features it uses) or as a worker
 * older than it does (ERROR BW_PROTOCOL, the connection closed unread: the client connects
 * again and asks without it). Static inline helpers, for the tests that include it. */
#ifndef BW_TEST_FAKE_DCHAN_WORKER_H
#define BW_TEST_FAKE_DCHAN_WORKER_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/util.h"
#include "rpc/dchan.h"

/* Reads exactly n bytes: false when the connection ended first. */
static inline bool fake_read_n(int fd, uint8_t *p, size_t n)
{
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r <= 0)
            return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

/* Writes one frame header, best effort. */
static inline void fake_put_frame(int fd, uint32_t type, int32_t code, uint64_t a, uint64_t b)
{
    uint8_t h[BW_DCHAN_FRAME_HEADER];
    bw_dchan_frame f = {type, (uint32_t)code, a, b};
    bw__dchan_put_frame(h, &f);
    ssize_t w = send(fd, h, sizeof(h), MSG_NOSIGNAL);
    (void)w;
}

/* How the stand-in answers a FEATURES request. */
typedef struct fake_versions {
    bool old;          /* as a worker older than FEATURES: ERROR BW_PROTOCOL and close */
    uint64_t features; /* else: END with these of the offered bits */
    uint64_t extra;    /* ... and these, offered or not (a worker that breaks the protocol) */
} fake_versions;

/* What the stand-in saw. */
typedef struct fake_request {
    uint8_t hdr[BW_DCHAN_REQ_HEADER];
    uint8_t body[4096];
    uint32_t kind;
    size_t len;
    unsigned connections; /* accepted, for this request */
    unsigned features_asked;
    uint64_t offered; /* the bits the last FEATURES request offered */
} fake_request;

/* Accepts a connection on lfd and reads its first read request (header and body, at most
 * sizeof(r->body)), answering FEATURES requests before it as v says; a refused FEATURES
 * closes that connection and the next one is accepted. Returns the connection (its request in
 * *r), or -1 when none came whole. */
static inline int fake_accept_request(int lfd, const fake_versions *v, fake_request *r)
{
    char err[256];
    uint64_t len = 0;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            return -1;
        r->connections++;
        for (;;) {
            if (!fake_read_n(fd, r->hdr, sizeof(r->hdr)) ||
                bw__dchan_get_req_header(r->hdr, &r->kind, &len, err, sizeof(err)) != BW_OK) {
                close(fd);
                return -1;
            }
            if (r->kind == BW_DCHAN_KIND_FEATURES && v->old) {
                static const char msg[] = "data channel: request kind 4 is unknown";
                r->features_asked++;
                fake_put_frame(fd, BW_DCHAN_ERROR, BW_PROTOCOL, sizeof(msg) - 1, 0);
                ssize_t w = send(fd, msg, sizeof(msg) - 1, MSG_NOSIGNAL);
                (void)w;
                close(fd); /* its body and the request after it unread, as an old worker */
                break;
            }
            if (len > sizeof(r->body) || !fake_read_n(fd, r->body, (size_t)len)) {
                close(fd);
                return -1;
            }
            r->len = (size_t)len;
            if (r->kind != BW_DCHAN_KIND_FEATURES)
                return fd;
            r->features_asked++;
            r->offered = len == BW_DCHAN_FEATURES_BODY ? bw__get_le64(r->body) : 0;
            fake_put_frame(fd, BW_DCHAN_END, 0, 0, (r->offered & v->features) | v->extra);
        }
    }
}

#endif
