/*
 * The gRPC server runtime shared by every daemon: one completion queue per thread, every
 * registered method with several requests pre-posted on every queue, a catch-all that answers
 * UNIMPLEMENTED for unknown methods, one arena per call, and orderly shutdown.
 *
 * Handlers run on a completion-queue thread, which also polls I/O: they must not block long.
 * A handler returns BW_OK with *resp set (memory from the call's arena, or static), an error
 * code (after bw__rpc_fail for a message), or BW_RPC_DEFERRED and later calls
 * bw__rpc_finish from any thread.
 *
 * Server-streaming methods: the handler calls bw__rpc_stream_start and returns BW_RPC_STREAM,
 * or returns BW_RPC_DEFERRED and later calls bw__rpc_stream_begin from any thread. The runtime
 * then asks the producer for one message at a time, sending the next only when the previous
 * one has gone out (gRPC allows one send in flight), so a slow client holds at most one
 * message of the server's memory.
 *
 * Bidirectional streams (methods for which bw__method_bidi is true): the handler runs once when
 * the call opens, with req == NULL, calls bw__rpc_bidi_start and returns BW_RPC_STREAM. The
 * runtime then reads one message at a time, unpacks and checks it (a malformed one ends the
 * stream with INVALID_ARGUMENT) and hands it to the message handler, which answers it at once
 * or later from any thread (bw__rpc_msg_answer). Answers go out in the order the messages
 * came, one send in flight; at most BW_RPC_BIDI_WINDOW messages (BW_RPC_BIDI_WINDOW_BYTES) of a
 * stream are received and not yet answered and sent: beyond that the runtime stops reading
 * (backpressure), and gRPC's receive window per stream stays at 64 KiB, so a client that never
 * reads its answers holds a bounded share of the server's memory. The stream ends
 * with OK once the client has half-closed and every answer is out; with the error of a message
 * handler that returned one; or when the client cancels or the server stops. Its state lives
 * until every message has been answered, also when the call ended first.
 *
 * Raw methods (bw_rpc_server_opts.raw_methods): the runtime does not unpack the request; the
 * handler gets req == NULL and reads the bytes with bw__rpc_call_request when it chooses (from
 * any thread, e.g. once memory for decoding them has been granted).
 */
#ifndef BW_RPC_SERVER_H
#define BW_RPC_SERVER_H

#include <stddef.h>
#include <protobuf-c/protobuf-c.h>

#include "batchwire/batchwire.h"
#include "auth/auth.h"
#include "auth/grant.h"
#include "common/arena.h"
#include "rpc/methods.h"
#include "rpc/tls.h"

typedef struct bw_rpc_server bw_rpc_server;
typedef struct bw_rpc_call bw_rpc_call;

enum { BW_RPC_DEFERRED = 1, BW_RPC_STREAM = 2, BW_RPC_END = 3 };

typedef int (*bw_rpc_handler_fn)(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                                 ProtobufCMessage **resp);

typedef struct bw_rpc_handler {
    const bw_rpc_method *method;
    bw_rpc_handler_fn fn;
} bw_rpc_handler;

typedef struct bw_rpc_server_opts {
    const char *listen; /* HOST:PORT; port 0 picks a free one */
    bw_tls_server_files tls;
    int threads;              /* completion-queue threads (>= 1) */
    int requests_per_method;  /* requests pre-posted per method per queue (>= 1) */
    int max_receive_bytes;    /* largest request accepted */
    size_t call_memory_limit; /* cap on one call's arena (unpacked request + response) */
    const char *role;         /* "coordinator", for log lines */
    /* Methods whose requests the handler decodes itself (see above); may be NULL. */
    const bw_rpc_method *const *raw_methods;
    size_t nraw_methods;
    /* Who may call what (borrowed; NULL: an open service). Every call is authenticated and
     * authorized against the table of core/auth/auth.h before its handler runs; a refusal
     * answers UNAUTHENTICATED or PERMISSION_DENIED naming the method and is logged with the
     * peer's address. */
    bw_auth *auth;
    /* With authentication on, a worker's read grants (core/auth/grant.h; borrowed, NULL:
     * none) and its id (`self_id`, borrowed: set by on_bound at the latest): a call carrying
     * the coordinator's proof for self_id (metadata BW_GRANT_COORD_HEADER) and no token is
     * the principal "coordinator" (role BW_ROLE_COORDINATOR), and ReadSamples and ReadStream
     * from a caller without credentials reach their handler as role BW_ROLE_NONE: the handler
     * lets them read only with a valid grant (worker/grant_check.c). */
    bw_grants *grants;
    const char *self_id;
    /* Called once with the bound address (port 0 resolved) after the port is bound and before
     * the first call can run, so that what depends on the port (a worker's default id) is set
     * before any handler reads it; may be NULL. */
    void (*on_bound)(void *user, const char *bound);
} bw_rpc_server_opts;

/*
 * Binds, registers `handlers` (n of them; `user` is passed to each) and starts the threads.
 * The port is bound without SO_REUSEPORT: a second process on the same HOST:PORT fails to
 * start ("address in use") instead of silently sharing the port's connections.
 * On success *out is the running server and `bound` holds the bound address
 * ("127.0.0.1:40123"). On failure returns an error with a sentence in err; nothing is left
 * running. Calls grpc_init itself (balanced by bw__rpc_server_stop).
 */
int bw__rpc_server_start(const bw_rpc_server_opts *opts, const bw_rpc_handler *handlers, size_t n,
                         void *user, bw_rpc_server **out, char *bound, size_t boundlen, char *err,
                         size_t errlen);

/* gRPC's locks are abseil's, and Debian's abseil is built with its deadlock detection on: a
 * debug aid that updates a graph of lock acquisitions on every lock, 8-10% of the
 * coordinator's CPU per call (docs/performance.md, "Coordinator"). This turns it off, as a
 * release build of abseil has it; with an abseil whose symbol it does not know, nothing
 * changes. Process-wide; any thread, any time. bw__rpc_server_start calls it. */
void bw__rpc_quiet_mutex_checks(void);

/* Stops accepting calls, lets running calls finish for up to grace_ms, cancels the rest,
 * joins the threads and frees everything. It waits for every deferred call to be finished (or
 * begun and ended) by its owner: whatever finishes them must keep running until it returns.
 * NULL is a no-op. */
void bw__rpc_server_stop(bw_rpc_server *srv, int grace_ms);

/* The call's arena, for the response and anything it points to. */
bw_arena *bw__rpc_call_arena(bw_rpc_call *call);

/* The peer's address ("ipv4:127.0.0.1:5555"); valid for the call's life. */
const char *bw__rpc_call_peer(bw_rpc_call *call);

/* The authenticated caller (the anonymous principal on an open service); valid for the
 * call's life. */
const bw_principal *bw__rpc_call_principal(bw_rpc_call *call);

/* Records a message for the error the handler is about to return; returns rc. */
int bw__rpc_fail(bw_rpc_call *call, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The error status the call ends with also carries the trailer "bw-retry-after-ms: MS" (next
 * to "bw-error"): for BW_BUSY, when the client should try again. */
void bw__rpc_retry_after(bw_rpc_call *call, uint32_t ms);

/* Completes a deferred call: rc BW_OK sends resp, anything else sends the error status with
 * the message recorded by bw__rpc_fail (or bw_strerror(rc)). Thread-safe. */
void bw__rpc_finish(bw_rpc_call *call, int rc, const ProtobufCMessage *resp);

/* Raw methods: the size of the request's bytes as received (before bw__rpc_call_request). */
size_t bw__rpc_call_request_size(bw_rpc_call *call);

/* Raw methods: the request's bytes, made contiguous on the first call (a copy: gRPC's own
 * buffer is released then); valid until bw__rpc_call_drop_request or the call ends. NULL with
 * *len 0 when they were dropped. Call from the one thread handling the deferred call. */
const uint8_t *bw__rpc_call_request(bw_rpc_call *call, size_t *len);

/* Raw methods: releases the request's bytes early (once decoded). */
void bw__rpc_call_drop_request(bw_rpc_call *call);

/* One message of a stream, produced by a bw_rpc_next_fn: either `msg` (packed by the runtime;
 * memory from bw__rpc_call_msg_arena) or `raw` (a ready byte buffer whose ownership passes to
 * the runtime, e.g. built from slices that reference mapped file memory without copying). */
typedef struct bw_rpc_out {
    const ProtobufCMessage *msg;
    struct grpc_byte_buffer *raw;
} bw_rpc_out;

/* Produces the next message into *out and returns BW_OK, returns BW_RPC_END when the stream is
 * complete, or an error code (after bw__rpc_fail) that ends the call with that status. Runs on
 * a completion-queue thread (the first one of bw__rpc_stream_begin: on its caller's). */
typedef int (*bw_rpc_next_fn)(void *state, bw_rpc_call *call, bw_rpc_out *out);

/* Makes the call a server stream: `next` is called for each message; `free_state` (may be
 * NULL) releases `state` once the call is over, however it ended. Call from the handler, then
 * return BW_RPC_STREAM. */
void bw__rpc_stream_start(bw_rpc_call *call, bw_rpc_next_fn next, void *state,
                          void (*free_state)(void *state));

/* The same for a call whose handler returned BW_RPC_DEFERRED, from any thread, once, instead of
 * bw__rpc_finish: the first message is produced on the calling thread and sent; the rest follow
 * on the call's completion-queue thread, one in flight at a time. free_state runs once the call
 * is over, also when the client has gone already. */
void bw__rpc_stream_begin(bw_rpc_call *call, bw_rpc_next_fn next, void *state,
                          void (*free_state)(void *state));

/* An arena reset after each streamed message has been sent: for per-message allocations. */
bw_arena *bw__rpc_call_msg_arena(bw_rpc_call *call);

/* ---- bidirectional streams (see the top of this file) ---- */

/* A stream is read while fewer than BW_RPC_BIDI_WINDOW messages of at most
 * BW_RPC_BIDI_WINDOW_BYTES bytes in all are received and not yet answered and sent. */
enum { BW_RPC_BIDI_WINDOW = 64, BW_RPC_BIDI_WINDOW_BYTES = 1 << 20 };

typedef struct bw_rpc_msg bw_rpc_msg;

/* Handles one message of a bidirectional stream: returns BW_OK with *resp set (memory from
 * bw__rpc_msg_arena, or static), BW_RPC_DEFERRED and later calls bw__rpc_msg_answer once from
 * any thread, or an error code (after bw__rpc_fail on bw__rpc_msg_call) that ends the stream
 * with that status. Runs on the stream's completion-queue thread, one message at a time. */
typedef int (*bw_rpc_msg_fn)(void *state, bw_rpc_msg *m, const ProtobufCMessage *req,
                             ProtobufCMessage **resp);

/* Makes the call a bidirectional stream whose messages go to `fn` with `state`; free_state
 * (may be NULL) releases `state` once the stream is over and every message answered. Call
 * from the handler, then return BW_RPC_STREAM. */
void bw__rpc_bidi_start(bw_rpc_call *call, bw_rpc_msg_fn fn, void *state,
                        void (*free_state)(void *state));

/* The message's arena: its unpacked request, and its answer. Valid until it is answered and
 * sent. */
bw_arena *bw__rpc_msg_arena(bw_rpc_msg *m);

/* The stream the message came on (principal, peer, bw__rpc_fail); valid while the message is
 * unanswered. */
bw_rpc_call *bw__rpc_msg_call(bw_rpc_msg *m);

/* Answers a message whose handler returned BW_RPC_DEFERRED: rc BW_OK sends resp (after the
 * answers of every earlier message), anything else ends the stream with that status (the
 * message recorded by bw__rpc_fail, or bw_strerror(rc)). Once per message; thread-safe. After
 * the stream ended the answer is dropped. */
void bw__rpc_msg_answer(bw_rpc_msg *m, int rc, const ProtobufCMessage *resp);

/* Authorizes one message of a stream as a call of method `id` by the stream's principal (the
 * table of core/auth/auth.c): BW_OK, or BW_PERMISSION_DENIED recorded as the call's error,
 * naming the method, and logged as a refused call is. */
int bw__rpc_authorize_as(bw_rpc_call *call, bw_method_id id);

/* The call's deadline has passed or the client went away. */
int bw__rpc_call_cancelled(bw_rpc_call *call);

/* The call's deadline on the bw__mono_ms clock, 0 when it has none. */
uint64_t bw__rpc_call_deadline_ms(const bw_rpc_call *call);

#endif
