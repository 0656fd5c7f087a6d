/* The gRPC transport (transport.h): Data.ReadSamples or Data.ReadStream, each a server
 * stream of SampleBatch messages decoded straight from gRPC's slices into the sink's places
 * (its wire format is its own: bw__decode_sample_batch below, declared in sample_decode.h for
 * its unit test and fuzz target). gRPC has no descriptor to poll: recv reads the stream to
 * its end. Its state is its own: the channel to each worker, kept across placement versions,
 * and the credentials they share (the PEM files are read once, when the transport is created,
 * and never under its lock). Worker channels carry no bearer token: each request carries the
 * lease's read grant instead (docs/security.md, "Read grants"). */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>

#include "data.pb-c.h"
#include "rpc/dchan.h"
#include "sample_decode.h"
#include "transport.h"

/* The transport's state (one per loader). */
typedef struct grpc_state {
    grpc_channel_credentials *creds; /* every worker channel's */
    bw_rpc_channel_opts opts;        /* for each worker channel (target set per worker) */
    bw__grant_src grant;             /* each request's read grant */
    pthread_mutex_t mu;              /* guards the channel cache; held across no I/O */
    size_t n, cap;
    char **addrs;
    bw_rpc_channel **channels;
} grpc_state;

static void destroy(void *state)
{
    grpc_state *g = state;
    if (!g)
        return;
    for (size_t i = 0; i < g->n; i++) {
        bw__rpc_channel_close(g->channels[i]);
        free(g->addrs[i]);
    }
    free(g->channels);
    free(g->addrs);
    if (g->creds)
        grpc_channel_credentials_release(g->creds);
    pthread_mutex_destroy(&g->mu);
    free(g);
    grpc_shutdown();
}

static int create(const bw__worker_opts *wo, void **state, char *err, size_t errlen)
{
    *state = NULL;
    grpc_init(); /* balanced in destroy */
    grpc_state *g = calloc(1, sizeof(*g));
    if (!g) {
        grpc_shutdown();
        snprintf(err, errlen, "out of memory for the gRPC transport's state");
        return BW_NOMEM;
    }
    pthread_mutex_init(&g->mu, NULL);
    /* Workers are verified by their own names (no server-name override); the files are read
     * into g->creds now, so a channel opened later reads nothing. No token: g->opts.tls.token
     * stays NULL, so no channel to a worker sends "authorization". */
    const bw_rpc_channel_opts *opts = &wo->rpc;
    g->opts.max_receive_bytes = opts->max_receive_bytes;
    g->opts.max_reconnect_ms = opts->max_reconnect_ms;
    g->opts.tls.use_tls = bw__tls_client_enabled(&opts->tls);
    g->grant = wo->grant;
    int rc = bw__tls_client_credentials(&opts->tls, &g->creds, err, errlen);
    if (rc != BW_OK) {
        destroy(g);
        return rc;
    }
    g->opts.creds = g->creds;
    *state = g;
    return BW_OK;
}

/* The cached channel to a worker address; g->mu held. */
static bw_rpc_channel *cached(grpc_state *g, const char *address)
{
    for (size_t i = 0; i < g->n; i++)
        if (strcmp(g->addrs[i], address) == 0)
            return g->channels[i];
    return NULL;
}

/* The channel to a worker address: cached, else opened (outside the lock: it reads nothing,
 * but may take a while) and cached. NULL with err when out of memory. */
static bw_rpc_channel *worker_channel(grpc_state *g, const char *address, char *err, size_t errlen)
{
    pthread_mutex_lock(&g->mu);
    bw_rpc_channel *ch = cached(g, address);
    pthread_mutex_unlock(&g->mu);
    if (ch)
        return ch;
    bw_rpc_channel_opts o = g->opts;
    o.target = address;
    bw_rpc_channel *fresh = NULL;
    if (bw__rpc_channel_open(&o, &fresh, err, errlen) != BW_OK)
        return NULL;
    char *addr = strdup(address);
    pthread_mutex_lock(&g->mu);
    ch = cached(g, address); /* another fetch thread may have opened one meanwhile */
    if (!ch && addr && g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 8;
        char **a = realloc(g->addrs, cap * sizeof(*a));
        bw_rpc_channel **c = a ? realloc(g->channels, cap * sizeof(*c)) : NULL;
        if (a)
            g->addrs = a;
        if (c) {
            g->channels = c;
            g->cap = cap;
        }
    }
    if (!ch && addr && g->n < g->cap) {
        g->addrs[g->n] = addr;
        g->channels[g->n++] = ch = fresh;
        addr = NULL;
        fresh = NULL;
    }
    pthread_mutex_unlock(&g->mu);
    free(addr);
    bw__rpc_channel_close(fresh);
    if (!ch) /* out of memory: no channel, the caller fails over */
        snprintf(err, errlen, "out of memory for a channel to %s", address);
    return ch;
}

struct bw__xfer {
    bw_rpc_stream *st;
    const char *wid;
    bool locate_only; /* a ReadStream that only locates a record (bw__decoded) */
};

static bool usable(void *state, const bw__worker_ref *wr)
{
    (void)state;
    return wr->address[0] != '\0';
}

static int start(void *state, const bw__worker_ref *wr, const bw__read_req *req, int timeout_ms,
                 bw__xfer **out, bw__xres *res)
{
    grpc_state *g = state;
    *out = NULL;
    bw__xfer *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(res->err, sizeof(res->err), "out of memory for a request");
        return res->rc = BW_NOMEM;
    }
    x->wid = wr->id;
    x->locate_only = req->kind == BW_DCHAN_KIND_READ_STREAM &&
                     ((const Batchwire__V1__ReadStreamRequest *)req->msg)->locate_only;
    char e[BW_XFER_ERRLEN];
    bw_rpc_channel *ch = worker_channel(g, wr->address, e, sizeof(e));
    bw__granted granted;
    int rc = ch ? bw__rpc_stream_open(ch,
                                      req->kind == BW_DCHAN_KIND_READ_STREAM
                                          ? BW_METHOD(BW_M_DATA_READ_STREAM)
                                          : BW_METHOD(BW_M_DATA_READ_SAMPLES),
                                      bw__read_req_granted(req, &g->grant, wr->id, &granted),
                                      timeout_ms, &x->st, e, sizeof(e))
                : BW_UNAVAILABLE;
    if (ch)
        bw__granted_wipe(&granted);
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

/* SampleBatch messages decoded straight from gRPC's receive slices: each sample's bytes are
 * copied once, from the slices into their place in the batch, instead of being flattened
 * into one buffer, unpacked into another and copied a third time (see docs/performance.md). */
typedef struct reader {
    grpc_byte_buffer_reader r;
    grpc_slice cur;
    bool have;
    const uint8_t *p, *end;
    uint64_t pos; /* bytes consumed */
} reader;

static bool fill(reader *rd)
{
    while (rd->p == rd->end) {
        if (rd->have)
            grpc_slice_unref(rd->cur);
        rd->have = grpc_byte_buffer_reader_next(&rd->r, &rd->cur) != 0;
        if (!rd->have)
            return false;
        rd->p = GRPC_SLICE_START_PTR(rd->cur);
        rd->end = rd->p + GRPC_SLICE_LENGTH(rd->cur);
    }
    return true;
}

static bool varint(reader *rd, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (!fill(rd))
            return false;
        uint8_t b = *rd->p++;
        rd->pos++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* Copies (dst != NULL) or skips n bytes. */
static bool take(reader *rd, uint8_t *dst, uint64_t n)
{
    while (n > 0) {
        if (!fill(rd))
            return false;
        size_t chunk = (size_t)(rd->end - rd->p);
        if (chunk > n)
            chunk = (size_t)n;
        if (dst) {
            memcpy(dst, rd->p, chunk);
            dst += chunk;
        }
        rd->p += chunk;
        rd->pos += chunk;
        n -= chunk;
    }
    return true;
}

static bool skip_field(reader *rd, unsigned wire)
{
    uint64_t v;
    switch (wire) {
    case 0:
        return varint(rd, &v);
    case 1:
        return take(rd, NULL, 8);
    case 2:
        return varint(rd, &v) && take(rd, NULL, v);
    case 5:
        return take(rd, NULL, 4);
    default:
        return false;
    }
}

/* One Sample message of `len` bytes. Encoders write fields in number order (protobuf-c and
 * the worker's hand encoder do), so when the data field arrives its header -- index, size,
 * chunk offset, zero when absent -- is complete and the bytes go straight to their place; a
 * header field after the data is refused as malformed. */
static int sample(reader *rd, uint64_t len, bw__sample_place_fn place,
                  bw__sample_arrived_fn arrived, void *ctx, bw__decoded *last, char *err,
                  size_t errlen)
{
    uint64_t stop = rd->pos + len, index = 0, size = 0, chunk = 0, dlen = 0, next = 0;
    bool placed = false, has_next = false;
    while (rd->pos < stop) {
        uint64_t tag;
        if (!varint(rd, &tag))
            goto malformed;
        unsigned field = (unsigned)(tag >> 3), wire = (unsigned)(tag & 7);
        if (field >= 1 && field <= 3 && wire == 0) {
            uint64_t v;
            if (placed || !varint(rd, &v))
                goto malformed;
            if (field == 1)
                index = v;
            else if (field == 2)
                size = v;
            else
                chunk = v;
        } else if (field == 8 && wire == 0) {
            if (!varint(rd, &next))
                goto malformed;
            has_next = true;
        } else if (field == 4 && wire == 2) {
            if (placed || !varint(rd, &dlen) || dlen > stop - rd->pos)
                goto malformed;
            uint8_t *dest = NULL;
            int rc = last->locate_only && size == 0 && dlen == 0
                         ? BW_OK /* the answer to a locate-only request: no sample */
                         : place(ctx, index, size, chunk, dlen, &dest, err, errlen);
            if (rc != BW_OK)
                return rc;
            if (!take(rd, dest, dlen))
                goto malformed;
            placed = true;
        } else if (!skip_field(rd, wire)) {
            goto malformed;
        }
    }
    if (rd->pos != stop)
        goto malformed;
    if (!placed) {
        /* An empty sample (no data field at all). */
        uint8_t *dest = NULL;
        int rc = last->locate_only && size == 0
                     ? BW_OK
                     : place(ctx, index, size, chunk, 0, &dest, err, errlen);
        if (rc != BW_OK)
            return rc;
    }
    /* The chunk's bytes are in place and its message is whole. */
    if (arrived && !(last->locate_only && size == 0 && dlen == 0))
        arrived(ctx, placed ? dlen : 0);
    /* A stream record's next offset counts once the record is complete. */
    if (has_next && chunk + dlen == size) {
        last->has_next_offset = true;
        last->next_offset = next;
    }
    return BW_OK;
malformed:
    snprintf(err, errlen, "malformed SampleBatch message from the worker (at byte %llu)",
             (unsigned long long)rd->pos);
    return BW_PROTOCOL;
}

int bw__decode_sample_batch(struct grpc_byte_buffer *bb, bw__sample_place_fn place,
                            bw__sample_arrived_fn arrived, void *ctx, bw__decoded *last, char *err,
                            size_t errlen)
{
    reader rd;
    memset(&rd, 0, sizeof(rd));
    if (!grpc_byte_buffer_reader_init(&rd.r, bb)) {
        snprintf(err, errlen, "cannot read a message from the worker");
        return BW_PROTOCOL;
    }
    int rc = BW_OK;
    for (;;) {
        uint64_t tag, len;
        if (!fill(&rd))
            break; /* end of message */
        if (!varint(&rd, &tag)) {
            rc = BW_PROTOCOL;
            break;
        }
        if (tag == ((1u << 3) | 2)) {
            if (!varint(&rd, &len)) {
                rc = BW_PROTOCOL;
                break;
            }
            if ((rc = sample(&rd, len, place, arrived, ctx, last, err, errlen)) != BW_OK)
                break;
        } else if (!skip_field(&rd, (unsigned)(tag & 7))) {
            rc = BW_PROTOCOL;
            break;
        }
    }
    if (rc == BW_PROTOCOL && !err[0])
        snprintf(err, errlen, "malformed SampleBatch message from the worker (at byte %llu)",
                 (unsigned long long)rd.pos);
    if (rd.have)
        grpc_slice_unref(rd.cur);
    grpc_byte_buffer_reader_destroy(&rd.r);
    return rc;
}

static bool recv_all(bw__xfer *x, const bw__sink *sink, bw__xres *res)
{
    char e[BW_XFER_ERRLEN] = "";
    bw__decoded last = {.locate_only = x->locate_only};
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

const bw__transport_ops bw__transport_grpc_ops = {"grpc", usable, start,   fd,  recv_all,
                                                  finish, create, destroy, NULL};
