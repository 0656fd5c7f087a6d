/* The client's end of the coordinator's commit channel (commit_client.h): the data channel's
 * sockets and TLS (core/rpc/dchan*.c) and the framing of server/commit_channel.h. */
#include "commit_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/errors.h"
#include "common/util.h"

enum { ANSWER_MAX = 64 << 10 }; /* a SessionResponse is well under 1 KiB; an error ~2 KiB */

int bw__cchan_client_init(bw__cchan_client *c, const char *address, const bw_tls_client_files *tls,
                          const char *tls_host, const char *token, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->sock.fd = -1;
    c->token = token;
    c->tls_host = tls_host;
    if (!(c->address = strdup(address))) {
        snprintf(err, errlen, "out of memory");
        return BW_NOMEM;
    }
    if (tls && bw__tls_client_enabled(tls)) {
        int rc = bw__dchan_tls_client_ctx(tls, &c->tls, err, errlen);
        if (rc != BW_OK) {
            free(c->address);
            c->address = NULL;
            return rc;
        }
    }
    return BW_OK;
}

bool bw__cchan_client_connected(const bw__cchan_client *c)
{
    return c->sock.fd >= 0;
}

static void cclose(bw__cchan_client *c)
{
    if (c->sock.fd >= 0)
        bw__dsock_close(&c->sock);
    c->sock.fd = -1;
    c->sock.ssl = NULL;
}

/* Reads one answer frame's header and, for ERROR and ANSWER, its body (malloc'd into *body). */
static int read_frame(bw__cchan_client *c, uint64_t deadline, bw_dchan_frame *f, uint8_t **body,
                      char *err, size_t errlen)
{
    *body = NULL;
    uint8_t h[BW_DCHAN_FRAME_HEADER];
    int rc = bw__dsock_read_all(&c->sock, h, sizeof(h), deadline, NULL, err, errlen);
    if (rc != BW_OK)
        return rc;
    bw__dchan_get_frame(h, f);
    if ((f->type != BW_DCHAN_END && f->type != BW_DCHAN_ERROR && f->type != BW_DCHAN_ANSWER) ||
        f->a > ANSWER_MAX) {
        snprintf(err, errlen, "commit channel at %s: a frame of type %u and length %llu",
                 c->address, f->type, (unsigned long long)f->a);
        return BW_PROTOCOL;
    }
    if (f->type == BW_DCHAN_END)
        return BW_OK;
    if (!(*body = malloc(f->a + 1))) {
        snprintf(err, errlen, "out of memory");
        return BW_NOMEM;
    }
    rc = bw__dsock_read_all(&c->sock, *body, (size_t)f->a, deadline, NULL, err, errlen);
    (*body)[f->a] = 0;
    if (rc == BW_OK && f->type == BW_DCHAN_ERROR) {
        int code = (int)(int32_t)f->code;
        snprintf(err, errlen, "commit channel at %s: %s", c->address, (char *)*body);
        rc = code < 0 ? code : BW_PROTOCOL;
    }
    if (rc != BW_OK) {
        free(*body);
        *body = NULL;
    }
    return rc;
}

static int send_frame(bw__cchan_client *c, uint32_t kind, const void *body, size_t len,
                      uint64_t deadline, char *err, size_t errlen)
{
    uint8_t h[BW_DCHAN_REQ_HEADER];
    bw__dchan_put_req_header(h, kind, len);
    struct iovec iov[2] = {{h, sizeof(h)}, {(void *)body, len}};
    return bw__dsock_writev_all(&c->sock, iov, len ? 2 : 1, deadline, err, errlen);
}

/* Sends a frame of `kind` and reads the answer into *f and *body (the caller frees *body): BW_OK
 * when it is a frame of type `want`, else BW_PROTOCOL naming `what` was answered otherwise. */
static int exchange(bw__cchan_client *c, uint32_t kind, const void *out, size_t n, uint32_t want,
                    const char *what, uint64_t deadline, bw_dchan_frame *f, uint8_t **body,
                    char *err, size_t errlen)
{
    int rc = send_frame(c, kind, out, n, deadline, err, errlen);
    if (rc == BW_OK)
        rc = read_frame(c, deadline, f, body, err, errlen);
    if (rc == BW_OK && f->type != want) {
        snprintf(err, errlen, "commit channel at %s: %s answered with frame type %u", c->address,
                 what, f->type);
        rc = BW_PROTOCOL;
    }
    return rc;
}

int bw__cchan_client_connect(bw__cchan_client *c, int timeout_ms, char *err, size_t errlen)
{
    cclose(c);
    uint64_t deadline = bw__mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
    int connect_ms =
        timeout_ms < BW_DCHAN_CONNECT_TIMEOUT_MS ? timeout_ms : BW_DCHAN_CONNECT_TIMEOUT_MS;
    int rc = bw__sock_connect(c->address, connect_ms, &c->sock.fd, err, errlen);
    if (rc == BW_OK && c->tls)
        rc = bw__dsock_tls(&c->sock, c->tls, c->tls_host, deadline, err, errlen);
    const char *tok = c->token ? c->token : "";
    bw_dchan_frame f;
    uint8_t *body = NULL;
    if (rc == BW_OK)
        rc = exchange(c, BW_DCHAN_KIND_AUTH, tok, strlen(tok), BW_DCHAN_END, "the hello was",
                      deadline, &f, &body, err, errlen);
    free(body);
    if (rc != BW_OK)
        cclose(c);
    return rc;
}

int bw__cchan_client_call(bw__cchan_client *c, const Batchwire__V1__SessionRequest *req,
                          bw_arena *a, Batchwire__V1__SessionResponse **resp, int timeout_ms,
                          char *err, size_t errlen)
{
    *resp = NULL;
    uint64_t deadline = bw__mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
    size_t n = protobuf_c_message_get_packed_size(&req->base);
    uint8_t small[1024];
    uint8_t *buf = n <= sizeof(small) ? small : malloc(n);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return BW_NOMEM;
    }
    protobuf_c_message_pack(&req->base, buf);
    bw_dchan_frame f;
    uint8_t *body = NULL;
    int rc = exchange(c, BW_DCHAN_KIND_SESSION, buf, n, BW_DCHAN_ANSWER, "a request was", deadline,
                      &f, &body, err, errlen);
    if (buf != small)
        free(buf);
    if (rc == BW_OK &&
        !(*resp = batchwire__v1__session_response__unpack(&a->pb, (size_t)f.a, body))) {
        snprintf(err, errlen, "commit channel at %s: an answer of %llu bytes is no SessionResponse",
                 c->address, (unsigned long long)f.a);
        rc = BW_PROTOCOL;
    }
    free(body);
    if (rc != BW_OK)
        cclose(c);
    return rc;
}

void bw__cchan_client_free(bw__cchan_client *c)
{
    if (!c->address) /* never prepared (a zeroed session): fd 0 is not ours */
        return;
    cclose(c);
    bw__dchan_tls_ctx_free(c->tls);
    free(c->address);
    memset(c, 0, sizeof(*c));
    c->sock.fd = -1;
}
