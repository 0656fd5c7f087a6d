/* Client side of the gRPC runtime: a channel to one address and unary calls with a deadline.
 * Every call has a deadline; errors come back as a code and a sentence naming the method and
 * the target. */
#ifndef BW_RPC_CLIENT_H
#define BW_RPC_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

#include "batchwire/batchwire.h"
#include "common/arena.h"
#include "rpc/methods.h"
#include "rpc/tls.h"

typedef struct bw_rpc_channel bw_rpc_channel;

typedef struct bw_rpc_channel_opts {
    const char *target; /* HOST:PORT */
    bw_tls_client_files tls;
    int max_receive_bytes; /* largest response accepted (0: 4 MiB) */
    int max_reconnect_ms;  /* cap on the reconnect backoff (0: 1000) */
    int connect_ms;        /* one connection attempt's deadline (0: BW_RPC_CONNECT_TIMEOUT_MS) */
    /* Credentials built once by the caller (bw__tls_client_credentials from tls; borrowed,
     * the channel keeps its own reference), so that opening a channel reads no file; NULL:
     * built from tls at each open. tls.token and tls.server_name apply either way. */
    grpc_channel_credentials *creds;
    /* Instead of a token: one header sent on every call (the coordinator's proof to a worker,
     * core/auth/grant.h). header_name must be a string literal; NULL: none. */
    const char *header_name;
    const char *header_value;
} bw_rpc_channel_opts;

/* Opens a channel (connects lazily). Returns BW_OK, or BW_TLS/BW_INVALID_ARGUMENT with a
 * sentence in err. Calls grpc_init itself (balanced by bw__rpc_channel_close). */
int bw__rpc_channel_open(const bw_rpc_channel_opts *opts, bw_rpc_channel **out, char *err,
                         size_t errlen);

/* NULL is a no-op. No call may be running on the channel. */
void bw__rpc_channel_close(bw_rpc_channel *ch);

/* The target the channel was opened with. */
const char *bw__rpc_channel_target(const bw_rpc_channel *ch);

/*
 * One unary call: sends `req`, waits up to timeout_ms, and unpacks the response into `arena`
 * (*resp lives until the arena is reset). Returns BW_OK, or the peer's batchwire code (or one
 * derived from the gRPC status) with "Method to TARGET: STATUS: details" in err. Thread-safe:
 * several threads may call on one channel. An interrupt (bw_interrupt) cancels the call and
 * returns BW_INTERRUPTED within a slice (common/interrupt.h); so does a call made while the
 * interrupt is raised, at once. Streams below behave the same.
 */
int bw__rpc_call(bw_rpc_channel *ch, const bw_rpc_method *method, const ProtobufCMessage *req,
                 bw_arena *arena, ProtobufCMessage **resp, int timeout_ms, char *err,
                 size_t errlen);

/* As bw__rpc_call, telling waiting(arg, ms) between slices (common/interrupt.h: in client
 * processes) how long the call has waited for its answer so far: a caller that retries can say
 * that a peer is silent before the call's deadline passes. */
typedef void (*bw_rpc_waiting_fn)(void *arg, uint64_t waited_ms);
int bw__rpc_call_watched(bw_rpc_channel *ch, const bw_rpc_method *method,
                         const ProtobufCMessage *req, bw_arena *arena, ProtobufCMessage **resp,
                         int timeout_ms, bw_rpc_waiting_fn waiting, void *arg, char *err,
                         size_t errlen);

/* As bw__rpc_call, but not cut short by bw_interrupt: a last best-effort call under a short
 * deadline (LeaveJob while a loader closes). */
int bw__rpc_call_uninterrupted(bw_rpc_channel *ch, const bw_rpc_method *method,
                               const ProtobufCMessage *req, bw_arena *arena,
                               ProtobufCMessage **resp, int timeout_ms, char *err, size_t errlen);

/* Whether a call's error sentence says that the target's host name does not exist (as
 * opposed to a resolver that could not be reached). */
bool bw__rpc_unknown_host(const char *err);

/* Waits up to timeout_ms for the channel to be connected, driving its connection attempts
 * meanwhile; true when it is (false at once when interrupted). A retry loop pauses with this
 * instead of sleeping: gRPC makes progress on a connection only while some thread polls for it, and
 * a call that failed fast leaves none (the next attempt would then wait for gRPC's 5 s backup
 * poller). */
bool bw__rpc_channel_wait(bw_rpc_channel *ch, int timeout_ms);

/* gRPC keepalive (client pings, server acceptance): a silent peer is found dead within
 * about BW_RPC_KEEPALIVE_MS + BW_RPC_KEEPALIVE_TIMEOUT_MS. */
enum { BW_RPC_KEEPALIVE_MS = 2000, BW_RPC_KEEPALIVE_TIMEOUT_MS = 2000 };

/* One connection attempt's deadline (TCP, TLS, HTTP/2 settings) -- 2 s by default, since a
 * trainer process shares its cores with training (with two ASan-built torch ranks on 2 cores,
 * 1 s attempts did not complete); 1 s for a worker's channel to its coordinator, a daemon's
 * (BW_RPC_DAEMON_CONNECT_MS) -- and the least time between two resolutions of a channel's name
 * (docs/operating.md, "Networks"). */
enum {
    BW_RPC_CONNECT_TIMEOUT_MS = 2000,
    BW_RPC_DAEMON_CONNECT_MS = 1000,
    BW_RPC_RERESOLVE_MS = 1000,
};

/* A server-streaming call being read. Not thread-safe: one reader per stream. */
typedef struct bw_rpc_stream bw_rpc_stream;

/* Starts a server-streaming call with `req`; timeout_ms bounds the whole stream. */
int bw__rpc_stream_open(bw_rpc_channel *ch, const bw_rpc_method *method,
                        const ProtobufCMessage *req, int timeout_ms, bw_rpc_stream **out, char *err,
                        size_t errlen);

/* The next message, unpacked into `arena`: BW_OK with *msg set; BW_RPC_STREAM_END (positive)
 * when the server ended the stream with OK; or the stream's error with a sentence in err. */
enum { BW_RPC_STREAM_END = 3 };
int bw__rpc_stream_next(bw_rpc_stream *st, bw_arena *arena, ProtobufCMessage **msg, char *err,
                        size_t errlen);

/* As bw__rpc_stream_next, but hands over the received message undecoded: the caller decodes
 * it straight from gRPC's slices (one copy fewer) and destroys it with
 * grpc_byte_buffer_destroy. */
struct grpc_byte_buffer;
int bw__rpc_stream_next_raw(bw_rpc_stream *st, struct grpc_byte_buffer **msg, char *err,
                            size_t errlen);

/* After a stream failed with BW_BUSY: the server's hint, from its "bw-retry-after-ms"
 * trailer, of how long to wait before asking again (at most 60000; 0 when none). */
uint32_t bw__rpc_stream_retry_after_ms(const bw_rpc_stream *st);

/* Cancels the call if it has not ended and frees everything. NULL is a no-op. */
void bw__rpc_stream_close(bw_rpc_stream *st);

/* ---- bidirectional streams: one request and its answer at a time ----
 *
 * A long-lived call (Jobs.Session) on which each bw__rpc_bidi_call sends one message and
 * waits for the next one. The call has no deadline of its own; each exchange has one. Not
 * thread-safe: one caller at a time per stream (the caller serializes). */
typedef struct bw_rpc_bidi bw_rpc_bidi;

/* Starts the call (nothing is sent until the first exchange). BW_OK, or an error with a
 * sentence in err. */
int bw__rpc_bidi_open(bw_rpc_channel *ch, const bw_rpc_method *method, bw_rpc_bidi **out, char *err,
                      size_t errlen);

/*
 * Sends `req` and waits up to timeout_ms for the stream's next message, unpacked into `arena`
 * as method->response. Errors read as those of a unary call of method `as` (the call the
 * message carries: "Jobs.CommitCursor to TARGET: STATUS: details"): the stream's status when
 * it ended (BW_UNIMPLEMENTED from a server without the method), BW_TIMEOUT when no answer came
 * in time, BW_INTERRUPTED on bw_interrupt (as bw__rpc_call_watched, with `waiting`). After any
 * error the stream is over: close it (a new one may be opened).
 */
int bw__rpc_bidi_call(bw_rpc_bidi *b, const bw_rpc_method *as, const ProtobufCMessage *req,
                      bw_arena *arena, ProtobufCMessage **resp, int timeout_ms,
                      bw_rpc_waiting_fn waiting, void *arg, char *err, size_t errlen);

/* Ends the call (half-closes it when it is idle, else cancels it) and frees everything. NULL
 * is a no-op. */
void bw__rpc_bidi_close(bw_rpc_bidi *b);

#endif
