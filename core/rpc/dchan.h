/*
 * The bulk data channel: ReadSamples over a plain TCP connection, so that sample bytes go
 * from the worker's mapped file into the client's batch buffer with no user-space copy on
 * either side (gRPC delivers messages in buffers of its own, which costs the client one more
 * copy of every byte). The protocol is in docs/data-channel.md; it carries exactly the
 * ReadSamplesRequest of the gRPC method and answers with the same checks and error codes.
 *
 * Request (client to worker): a 16-byte header, then `length` bytes of a protobuf
 * ReadSamplesRequest (kind 1) or ReadStreamRequest (kind 2), or of a bearer token (kind 3,
 * AUTH: the hello a client sends first on a worker with --auth-tokens; answered by END, or by
 * ERROR UNAUTHENTICATED / PERMISSION_DENIED and the connection closed; docs/security.md).
 *     u32 magic "BWD1" | u32 kind | u64 length
 * Response (worker to client): frames with a 24-byte header.
 *     u32 type | u32 code | u64 a | u64 b
 *     SAMPLE: a = dataset index (ReadSamples) or record number in its source (ReadStream),
 *             b = size; then b bytes of the sample
 *     END:    a = samples sent (the request is complete; the connection can be reused);
 *             ReadStream: b = byte offset in the source where the record after the last one
 *             sent starts (with locate_only: where first_record starts)
 *     ERROR:  code = batchwire error code, a = message length, b = retry-after hint in ms
 *             (BW_BUSY; 0 otherwise); then the message. After an error on a well-formed
 *             request the connection can be reused; after a malformed request, or one over
 *             the worker's request-size limit, the worker closes it.
 *     RUN:    code = n (1 to the samples still due), a = dataset index of the first, b = size
 *             of each (>= 1); then n * b bytes: the request's next n samples in request order
 *             (a ReadSamples answer is in request order: the others need no header). Only on a
 *             connection whose FEATURES request named BW_DCHAN_FEATURE_RUNS, and only for
 *             ReadSamples.
 *     ZRUN:   code = n (1 to the samples still due), a = dataset index of the first,
 *             b = (size of each << 32) | compressed length; then `compressed length` bytes:
 *             one zstd frame whose declared content size is n * size (at most
 *             BW_DCHAN_ZRUN_MAX), holding the request's next n samples in request order; the
 *             compressed length is below n * size (a run that does not shrink goes as RUN).
 *             Only on a connection whose FEATURES request named BW_DCHAN_FEATURE_ZSTD, and
 *             only for ReadSamples (docs/data-channel.md, "Compression").
 * FEATURES (kind 4): the body is a u64 of feature bits the client understands; the worker
 * answers END with a = 0 and b = the bits it will use on this connection (a subset). A worker
 * older than it answers ERROR BW_PROTOCOL (unknown kind) and closes the connection: the client
 * then connects again and sends only what such a worker knows (docs/data-channel.md,
 * "Versions").
 * Every integer is little-endian.
 */
#ifndef BW_RPC_DCHAN_H
#define BW_RPC_DCHAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

enum {
    BW_DCHAN_MAGIC = 0x31445742, /* "BWD1" read as a little-endian u32 */
    BW_DCHAN_KIND_READ_SAMPLES = 1,
    BW_DCHAN_KIND_READ_STREAM = 2,
    BW_DCHAN_KIND_AUTH = 3,
    BW_DCHAN_KIND_FEATURES = 4,
    /* the coordinator's commit channel (server/commit_channel.h): a packed SessionRequest */
    BW_DCHAN_KIND_SESSION = 5,
    BW_DCHAN_FEATURES_BODY = 8, /* the FEATURES request's body: a u64 */
    BW_DCHAN_REQ_HEADER = 16,
    BW_DCHAN_FRAME_HEADER = 24,
    BW_DCHAN_SAMPLE = 1,
    BW_DCHAN_END = 2,
    BW_DCHAN_ERROR = 3,
    BW_DCHAN_RUN = 4,
    BW_DCHAN_ZRUN = 5,
    /* the commit channel's answer: a = body length, b = the request's id; then a packed
     * SessionResponse */
    BW_DCHAN_ANSWER = 6,
    BW_DCHAN_ZRUN_MAX = 4 << 20, /* a ZRUN frame's samples, decompressed, at most (bytes) */
    /* the most a ZRUN frame's zstd window may be (a client refuses larger) */
    BW_DCHAN_ZSTD_WINDOW_LOG_MAX = 22,
    BW_DCHAN_ZSTD_LEVEL_MAX = 19,
    BW_DCHAN_RUN_MAX = 1 << 20,      /* samples in one RUN frame, at most (a request's indices) */
    BW_DCHAN_MAX_REQUEST = 32 << 20, /* 1M indices of up to 10 varint bytes, plus the dataset */
    BW_DCHAN_MAX_MESSAGE = 4096,     /* error messages */
};

/* Feature bits of the FEATURES request (docs/data-channel.md, "Versions", "Compression"). */
#define BW_DCHAN_FEATURE_RUNS ((uint64_t)1) /* RUN frames */
/* ZRUN frames: the client decodes them and asks for compression (needs RUN frames too) */
#define BW_DCHAN_FEATURE_ZSTD ((uint64_t)2)
/* with ZSTD: the worker sends a request raw when a probe of its first samples does not pay */
#define BW_DCHAN_FEATURE_ZSTD_AUTO ((uint64_t)4)
/* ReadSamples requests of several datasets (ReadSamplesRequest.datasets; docs/data-channel.md,
 * "Several datasets in one request"): the worker serves them, on any transport */
#define BW_DCHAN_FEATURE_DATASETS ((uint64_t)8)
/* ReadSamples requests whose indices are fixed-width (ReadSamplesRequest.indices_fixed and
 * index_datasets_bytes; docs/data-channel.md, "Fixed-width indices"): the worker reads them, on
 * any transport */
#define BW_DCHAN_FEATURE_FIXED ((uint64_t)16)
/* every feature this build speaks */
#define BW_DCHAN_FEATURES                                                                          \
    (BW_DCHAN_FEATURE_RUNS | BW_DCHAN_FEATURE_ZSTD | BW_DCHAN_FEATURE_ZSTD_AUTO |                  \
     BW_DCHAN_FEATURE_DATASETS | BW_DCHAN_FEATURE_FIXED)
/* with ZSTD, bits 8-15 are the zstd level: asked (0: the worker's choice), then used */
#define BW_DCHAN_ZSTD_LEVEL_SHIFT 8
#define BW_DCHAN_ZSTD_LEVEL_MASK ((uint64_t)0xff << BW_DCHAN_ZSTD_LEVEL_SHIFT)

typedef struct bw_dchan_frame {
    uint32_t type, code;
    uint64_t a, b;
} bw_dchan_frame;

void bw__dchan_put_req_header(uint8_t out[BW_DCHAN_REQ_HEADER], uint32_t kind, uint64_t length);
/* Checks a request header: BW_OK with kind and length, or BW_PROTOCOL / BW_TOO_BIG with a
 * sentence in err. */
int bw__dchan_get_req_header(const uint8_t in[BW_DCHAN_REQ_HEADER], uint32_t *kind,
                             uint64_t *length, char *err, size_t errlen);
void bw__dchan_put_frame(uint8_t out[BW_DCHAN_FRAME_HEADER], const bw_dchan_frame *f);
void bw__dchan_get_frame(const uint8_t in[BW_DCHAN_FRAME_HEADER], bw_dchan_frame *f);

/* ---- blocking sockets with deadlines (monotonic ms, 0: none) ---- */

/* Splits "HOST:PORT" / "[V6]:PORT" into host and port. BW_INVALID_ARGUMENT when malformed. */
int bw__sock_split(const char *addr, char *host, size_t hostlen, char *port, size_t portlen);

/* Listens on addr (port 0: any free one); *bound_port is the port bound. */
int bw__sock_listen(const char *addr, int *fd, int *bound_port, char *err, size_t errlen);

/* Connects to addr within timeout_ms; TCP_NODELAY, close-on-exec, and bw__sock_tune. While
 * no attempt has connected, another starts beside them every BW_SOCK_RACE_MS, up to
 * BW_SOCK_RACE_MAX at once (a SYN lost costs the kernel's first retransmission, 1 s). */
enum { BW_SOCK_RACE_MS = 200, BW_SOCK_RACE_MAX = 4 };
int bw__sock_connect(const char *addr, int timeout_ms, int *fd, char *err, size_t errlen);

/* A connected socket's settings for a network that may partition (docs/operating.md,
 * "Networks"): TCP_NODELAY; TCP keepalive probing an idle connection after
 * BW_SOCK_KEEPIDLE_S, every BW_SOCK_KEEPINTVL_S, dropping it after BW_SOCK_KEEPCNT misses;
 * TCP_USER_TIMEOUT, so that data unacknowledged for BW_SOCK_USER_TIMEOUT_MS fails the
 * connection instead of retransmitting for minutes; and TCP_THIN_LINEAR_TIMEOUTS, so that a
 * connection with few segments in flight (a request, a lossy network's small window) is
 * retransmitted every RTO (200 ms on a LAN) for its first 6 tries instead of at 200, 400, 800,
 * 1,600 ms...: under 10 % packet loss a doubling chain left a worker silent for a loader's
 * whole attempt (3.3 s). Best effort: a setting the kernel refuses is skipped. */
/* One connection attempt's deadlines on the data channel: the TCP connect and, on top of it,
 * the TLS handshake, whatever time the request still has; a failed attempt is made again on a
 * fresh socket (docs/operating.md, "Networks"). Without the cap a connect that began during a
 * partition lives on after the heal, its SYN retransmitted at 1, 3, 7, 15 s. */
enum { BW_DCHAN_CONNECT_TIMEOUT_MS = 1000, BW_DCHAN_HANDSHAKE_TIMEOUT_MS = 2000 };

enum {
    BW_SOCK_KEEPIDLE_S = 2,
    BW_SOCK_KEEPINTVL_S = 1,
    BW_SOCK_KEEPCNT = 3,
    BW_SOCK_USER_TIMEOUT_MS = 5000,
};
void bw__sock_tune(int fd);

/* Reads at least min and at most max bytes into buf (*got: how many). Errors as
 * bw__sock_read_all. */
int bw__sock_read_some(int fd, void *buf, size_t min, size_t max, uint64_t deadline_ms, size_t *got,
                       char *err, size_t errlen);

/* Reads exactly len bytes: BW_OK; BW_UNAVAILABLE when the peer closed or reset the
 * connection first (*got: the bytes that came before; may be NULL); BW_TIMEOUT at the
 * deadline. */
int bw__sock_read_all(int fd, void *buf, size_t len, uint64_t deadline_ms, size_t *got, char *err,
                      size_t errlen);

/* Writes all of iov[0..n) (modified as it goes). BW_OK, BW_UNAVAILABLE, BW_TIMEOUT. */
int bw__sock_writev_all(int fd, struct iovec *iov, size_t n, uint64_t deadline_ms, char *err,
                        size_t errlen);

/* ---- connections: plain TCP, or TLS over it (the same PEM files as gRPC's) ---- */

struct ssl_st;
struct ssl_ctx_st;
struct bw_tls_server_files;
struct bw_tls_client_files;

typedef struct bw_dsock {
    int fd;
    struct ssl_st *ssl; /* NULL: plain TCP */
} bw_dsock;

/* OpenSSL contexts for the data channel: the server's presents --tls-cert and, with
 * --tls-client-ca, requires client certificates signed by it; the client's verifies the
 * worker against --tls-ca (its host name or IP address) and presents --tls-cert if given.
 * TLS 1.2 or newer. BW_TLS with a sentence naming the file on failure. */
int bw__dchan_tls_server_ctx(const struct bw_tls_server_files *files, struct ssl_ctx_st **out,
                             char *err, size_t errlen);
int bw__dchan_tls_client_ctx(const struct bw_tls_client_files *files, struct ssl_ctx_st **out,
                             char *err, size_t errlen);
void bw__dchan_tls_ctx_free(struct ssl_ctx_st *ctx);

/* Runs the TLS handshake on s->fd (made non-blocking) before the deadline; `host` is the name
 * a client verifies (NULL on the server). BW_TLS with a sentence on failure. */
int bw__dsock_tls(bw_dsock *s, struct ssl_ctx_st *ctx, const char *host, uint64_t deadline_ms,
                  char *err, size_t errlen);

/* The names a certificate is valid for, for messages: "DNS:a.example, IP:10.0.0.7", or its
 * CN when it has no DNS or IP subject alternative name. Always NUL-terminates buf. */
struct x509_st;
void bw__tls_cert_names(const struct x509_st *cert, char *buf, size_t len);

/* Connects to addr (HOST:PORT) and names the certificate its TLS server presents (as
 * bw__tls_cert_names), without verifying it and within timeout_ms: for an error that says
 * why a verified handshake (gRPC's) failed. BW_OK, or BW_UNAVAILABLE with names set to
 * "(not available)". */
int bw__tls_probe_names(const char *addr, int timeout_ms, char *names, size_t len);

/* Up to n bytes without waiting (*got 0: none yet). BW_OK, or BW_UNAVAILABLE when the
 * connection closed or failed. */
int bw__dsock_recv(bw_dsock *s, void *buf, size_t n, size_t *got, char *err, size_t errlen);

/* bw__sock_read_all / bw__sock_writev_all over plain TCP or TLS. */
int bw__dsock_read_all(bw_dsock *s, void *buf, size_t len, uint64_t deadline_ms, size_t *got,
                       char *err, size_t errlen);
int bw__dsock_writev_all(bw_dsock *s, struct iovec *iov, size_t n, uint64_t deadline_ms, char *err,
                         size_t errlen);

/* Closes the connection (a TLS close_notify first, best effort). */
void bw__dsock_close(bw_dsock *s);

#endif
