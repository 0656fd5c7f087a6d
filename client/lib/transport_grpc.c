/* The gRPC transport (transport.h): Data.ReadSamples or Data.ReadStream, each a server
 * stream of SampleBatch messages decoded straight from gRPC's slices into the sink's places
 * (sample_decode.c). gRPC has no descriptor to poll: recv reads the stream to its end. */
#include <stdio.h>
#include <stdlib.h>

#include <grpc/grpc.h>

#include "loader_int.h"
#include "rpc/dchan.h"
#include "transport.h"

struct bw__xfer {
    bw_rpc_stream *st;
    const char *wid;
};

static bool usable(void *state, const bw__worker_ref *wr)
{
    (void)state;
    return wr->address[0] != '\0';
}

static int start(void *state, const bw__worker_ref *wr, const bw__read_req *req, int timeout_ms,
                 bw__xfer **out, bw__xres *res)
{
    bw__session *s = state;
    *out = NULL;
    bw__xfer *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(res->err, sizeof(res->err), "out of memory for a request");
        return res->rc = BW_NOMEM;
    }
    x->wid = wr->id;
    char e[BW_XFER_ERRLEN];
    bw_rpc_channel *ch = bw__session_worker_channel(s, wr->address, e, sizeof(e));
    int rc = ch ? bw__rpc_stream_open(ch,
                                      req->kind == BW_DCHAN_KIND_READ_STREAM
                                          ? BW_METHOD(BW_M_DATA_READ_STREAM)
                                          : BW_METHOD(BW_M_DATA_READ_SAMPLES),
                                      req->msg, timeout_ms, &x->st, e, sizeof(e))
                : BW_UNAVAILABLE;
    if (rc != BW_OK) {
        free(x);
        snprintf(res->err, sizeof(res->err), "worker %s: %.900s", wr->id, e);
        return res->rc = rc;
    }
    *out = x;
    return BW_OK;
}

static int fd(bw__xfer *x)
{
    (void)x;
    return -1;
}

static bool recv_all(bw__xfer *x, const bw__sink *sink, bw__xres *res)
{
    char e[BW_XFER_ERRLEN] = "";
    bw__decoded last = {0};
    int rc;
    for (;;) {
        grpc_byte_buffer *msg = NULL;
        rc = bw__rpc_stream_next_raw(x->st, &msg, e, sizeof(e));
        if (rc != BW_OK)
            break;
        rc = bw__decode_sample_batch(msg, sink->place, sink->arrived, sink->ctx, &last, e,
                                     sizeof(e));
        grpc_byte_buffer_destroy(msg);
        if (rc != BW_OK)
            break;
    }
    res->has_end_offset = last.has_next_offset;
    res->end_offset = last.next_offset;
    if (rc == BW_RPC_STREAM_END) {
        res->rc = BW_OK;
        return true;
    }
    res->rc = rc;
    if (rc == BW_BUSY)
        res->retry_after_ms = bw__rpc_stream_retry_after_ms(x->st);
    snprintf(res->err, sizeof(res->err), "worker %s: %.900s", x->wid, e);
    return true;
}

static void finish(bw__xfer *x)
{
    if (!x)
        return;
    bw__rpc_stream_close(x->st);
    free(x);
}

static const bw__transport_ops grpc_ops = {"grpc", usable, start, fd, recv_all, finish};

bw__transport bw__transport_grpc(bw__session *s)
{
    return (bw__transport){&grpc_ops, s};
}
