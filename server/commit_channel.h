/*
 * The coordinator's commit channel (docs/architecture.md, "The commit channel";
 * docs/operating.md, "Commit channel"): a trainer's cursor commits and lease heartbeats over a
 * plain TCP (or TLS) connection with the data channel's framing (core/rpc/dchan.h), for a
 * fraction of the CPU a gRPC message costs on each side (docs/performance.md, "The commit
 * channel").
 *
 * A connection (client to coordinator):
 *   1. the hello: kind AUTH, the body the bearer token (empty without one). Checked as a gRPC
 *      call of Jobs.Session is (bw__auth_check with the token and the verified client
 *      certificate's common name); answered END (a = 0, b = 0), or ERROR UNAUTHENTICATED /
 *      PERMISSION_DENIED and the connection closed.
 *   2. then any number of kind SESSION frames, each a packed SessionRequest (a commit or a
 *      heartbeat, at most BW_CCHAN_MAX_FRAME bytes), pipelined: each is answered by an ANSWER
 *      frame (a = body length, b = the request's id, then a packed SessionResponse) once its
 *      journal record is durable, in the order their group commits complete. The answer is the
 *      one the Session stream gives: the same operation (bw__jobs_session_begin), the same
 *      error_code and error_message.
 * A malformed frame, an unknown kind, a frame over the limit, a SESSION frame before the hello,
 * or a message the principal's role may not send is answered ERROR (code, a = message length,
 * b = 0, then the message) and the connection closed; the coordinator goes on.
 */
#ifndef BW_SERVER_COMMIT_CHANNEL_H
#define BW_SERVER_COMMIT_CHANNEL_H

#include <stddef.h>

#include "coordinator.h"

enum {
    BW_CCHAN_MAX_FRAME = 64 << 10, /* a SESSION frame's body, at most (a cursor is < 1 KiB) */
    BW_CCHAN_WINDOW = 256,         /* answers outstanding on one connection before it is not read */
    BW_CCHAN_HELLO_TIMEOUT_MS = 10000, /* a connection's TLS handshake and hello, at most */
    BW_CCHAN_MAX_CONNS = 16384,        /* connections open at once; more are refused */
};

typedef struct bw_cchan bw_cchan;

/* Listens on `addr` (port 0: any free one; the bound "HOST:PORT" into bound) with the
 * coordinator's TLS files (cfg->common) when it serves TLS, and serves on a thread of its own.
 * BW_OK with *out, or an error with a sentence naming the address or file. */
int bw__cchan_start(bw_coordinator *c, const char *addr, bw_cchan **out, char *bound,
                    size_t boundlen, char *err, size_t errlen);

/* The port bound (for the announcement in JoinJobResponse). */
int bw__cchan_port(const bw_cchan *s);

/* Stops serving, closes every connection, waits (up to grace_ms) for answers still waiting on
 * the journal, and frees. NULL is a no-op. */
void bw__cchan_stop(bw_cchan *s, int grace_ms);

#endif
