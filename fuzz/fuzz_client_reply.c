/*
 * libFuzzer target: a worker's reply as the client reads it, through the real fetch loop
 * (client/lib/fetch.c, through samples_fetch.c's bw__fetch_batch and stream_fetch.c's
 * bw__stream_fetch_batch) and each real reply parser:
 *
 * - data channel: the real transport (client/lib/data_channel.c, created for each input)
 *   connects to a listener thread on loopback, which reads the request and answers with the
 *   input's bytes as they are, then closes the connection;
 * - gRPC: the input's SampleBatch messages go through the real decoder
 *   (bw__decode_sample_batch, client/lib/transport_grpc.c) inside a transport of this file
 *   that does what transport_grpc.c does with a stream's messages and status, so that the
 *   loop's place() checks every sample.
 *
 * Input: byte 0 chooses
 *   bit 0     gRPC messages (1) or data-channel frames (0)
 *   bit 1     a stream read (ReadStream of records 3.. of one source) or ReadSamples
 *   bit 2     ReadSamples of fixed-size samples (1 + byte 1 % 64 bytes each) or of any size
 *             (then the batch buffer has room for byte 1 * 256 bytes before the fetch, as a
 *             slot used before has: samples land in it as they come while they fit)
 *   bits 3-5  batch size - 1; ReadSamples asks for indices 13 2 7 2 40 5 13 21 (the first n;
 *             repeats are padding, fetched once)
 *   bits 6-7  gRPC: the call's status after the messages: OK, UNAVAILABLE, BUSY (retry after
 *             byte 1 * 10 ms), CORRUPT; data channel: bit 6 the client asks for compression
 *             (zstd, docs/data-channel.md "Compression"), which the fake worker grants: ZRUN
 *             frames are then the protocol's
 * byte 1 is the parameter above, and the rest is the reply: data-channel frames as a worker
 * writes them, or gRPC messages, each as a u16 length (little-endian) and its bytes (the last
 * cut where the input ends), handed to the decoder in two slices.
 *
 * Only the first request of an input is answered so: any other (a retry, the other transport,
 * a failover to the placement's second worker) is refused at once with a non-retryable error.
 * So no bytes but the input's can reach the batch, and an input ends within a round or two.
 * When the fetch succeeds, every sample of the batch must be, in full, what the reply carried
 * for it by the protocol's rules (an independent parser below); anything else traps.
 *
 * The seeds (fuzz/capture_replies.py) are a real worker's replies to these requests over both
 * transports and the known hard cases (among them replies cut inside a sample, and empty
 * samples in a batch without a buffer). BW_FUZZ_VERBOSE=1 prints each input's outcome and
 * the library's log.
 */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <zstd.h>

#include "../client/lib/batch_int.h"
#include "../client/lib/fetch.h"
#include "../client/lib/loader_limits.h"
#include "../client/lib/samples_fetch.h"
#include "../client/lib/sample_decode.h"
#include "../client/lib/stream_fetch.h"
#include "common/util.h"
#include "rpc/dchan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The loop pauses between rounds (a backoff, a busy worker's hint) with usleep. Here the pause
 * is skipped, so that an input takes microseconds instead of tens of milliseconds: what is
 * fuzzed is what the client makes of the bytes, not how long it waits (tests/unit/
 * test_fetch_loop.c checks the waits). */
int usleep(useconds_t us)
{
    (void)us;
    return 0;
}

enum {
    MAXN = 8,
    FIRST_RECORD = 3,     /* stream reads start at this record of the source */
    SOURCE_RECORDS = 64,  /* ... which has this many */
    MAX_SAMPLE = 1 << 16, /* max_sample_bytes, and the source's size */
};

static const uint64_t BATCH[MAXN] = {13, 2, 7, 2, 40, 5, 13, 21};

/* ---- the listener: the worker's side of the data channel ---- */

static struct {
    pthread_mutex_t mu;
    int fd, port;
    unsigned gen;    /* the current input */
    unsigned served; /* the input whose first request was answered with its bytes */
    const uint8_t *reply;
    size_t len;
    uint32_t kind; /* what that request asked */
    uint64_t keys[MAXN];
    size_t nkeys;
} L = {PTHREAD_MUTEX_INITIALIZER, -1, 0, 0, 0, NULL, 0, 0, {0}, 0};

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void send_all(int fd, const uint8_t *p, size_t n)
{
    char err[256];
    struct iovec iov = {(void *)p, n};
    bw__sock_writev_all(fd, &iov, 1, bw__mono_ms() + 5000, err, sizeof(err));
}

static void serve(int fd)
{
    char err[256];
    uint8_t hdr[BW_DCHAN_REQ_HEADER];
    uint64_t deadline = bw__mono_ms() + 5000, length = 0;
    uint32_t kind = 0;
    if (bw__sock_read_all(fd, hdr, sizeof(hdr), deadline, NULL, err, sizeof(err)) != BW_OK)
        return;
    /* Read here rather than with bw__dchan_get_req_header: the fake worker takes every kind
     * the client may send, whatever the real workers know. */
    kind = (uint32_t)le(hdr + 4, 4);
    length = le(hdr + 8, 8);
    if (le(hdr, 4) != BW_DCHAN_MAGIC || length > BW_DCHAN_MAX_REQUEST)
        __builtin_trap(); /* the client sent a request no worker would take */
    if (kind == BW_DCHAN_KIND_FEATURES) {
        /* A fresh connection's FEATURES request: answered as a current worker does (END
         * naming the features it uses: RUN frames), then the request follows
         * (docs/data-channel.md, "Versions"). */
        uint8_t bits[BW_DCHAN_FEATURES_BODY], end[BW_DCHAN_FRAME_HEADER];
        if (length != sizeof(bits))
            __builtin_trap();
        if (bw__sock_read_all(fd, bits, sizeof(bits), deadline, NULL, err, sizeof(err)) != BW_OK)
            return;
        uint64_t use = BW_DCHAN_FEATURE_RUNS | BW_DCHAN_FEATURE_ZSTD | BW_DCHAN_ZSTD_LEVEL_MASK;
        bw_dchan_frame f = {BW_DCHAN_END, 0, 0, le(bits, 8) & use};
        bw__dchan_put_frame(end, &f);
        send_all(fd, end, sizeof(end));
        if (bw__sock_read_all(fd, hdr, sizeof(hdr), deadline, NULL, err, sizeof(err)) != BW_OK)
            return;
        kind = (uint32_t)le(hdr + 4, 4);
        length = le(hdr + 8, 8);
        if (le(hdr, 4) != BW_DCHAN_MAGIC || length > BW_DCHAN_MAX_REQUEST)
            __builtin_trap();
    }
    uint8_t *body = malloc(length ? length : 1);
    if (!body || bw__sock_read_all(fd, body, length, deadline, NULL, err, sizeof(err)) != BW_OK) {
        free(body);
        return;
    }
    /* The request as a worker reads it; its fingerprint names the input it belongs to. */
    uint64_t keys[MAXN];
    size_t nkeys = 0;
    unsigned gen = 0;
    if (kind == BW_DCHAN_KIND_READ_SAMPLES) {
        Batchwire__V1__ReadSamplesRequest *r =
            batchwire__v1__read_samples_request__unpack(NULL, length, body);
        if (!r || r->n_indices > MAXN || sscanf(r->fingerprint, "fuzz-%u", &gen) != 1)
            __builtin_trap(); /* the client sent something no worker would take */
        for (size_t i = 0; i < r->n_indices; i++)
            keys[nkeys++] = r->indices[i];
        batchwire__v1__read_samples_request__free_unpacked(r, NULL);
    } else if (kind == BW_DCHAN_KIND_READ_STREAM) {
        Batchwire__V1__ReadStreamRequest *r =
            batchwire__v1__read_stream_request__unpack(NULL, length, body);
        if (!r || r->max_records > MAXN || sscanf(r->fingerprint, "fuzz-%u", &gen) != 1)
            __builtin_trap();
        for (uint32_t i = 0; i < r->max_records; i++)
            keys[nkeys++] = r->first_record + i;
        batchwire__v1__read_stream_request__free_unpacked(r, NULL);
    } else {
        __builtin_trap();
    }
    free(body);
    uint8_t *copy = NULL;
    size_t len = 0;
    pthread_mutex_lock(&L.mu);
    if (gen == L.gen && L.served != gen && L.reply) {
        L.served = gen;
        L.kind = kind;
        memcpy(L.keys, keys, nkeys * sizeof(keys[0]));
        L.nkeys = nkeys;
        len = L.len;
        copy = malloc(len ? len : 1);
        if (copy)
            memcpy(copy, L.reply, len);
    }
    pthread_mutex_unlock(&L.mu);
    if (copy) {
        send_all(fd, copy, len);
        free(copy);
        return;
    }
    static const char msg[] = "fuzz: one answer per input";
    uint8_t f[BW_DCHAN_FRAME_HEADER + sizeof(msg)];
    bw_dchan_frame e = {BW_DCHAN_ERROR, (uint32_t)BW_INVALID_ARGUMENT, sizeof(msg) - 1, 0};
    bw__dchan_put_frame(f, &e);
    memcpy(f + BW_DCHAN_FRAME_HEADER, msg, sizeof(msg) - 1);
    send_all(fd, f, BW_DCHAN_FRAME_HEADER + sizeof(msg) - 1);
}

static void *listener(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept4(L.fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        serve(fd);
        close(fd);
    }
    return NULL;
}

/* ---- the gRPC side: SampleBatch messages through the real decoder ---- */

typedef struct fake {
    bool answers; /* the transport carrying the input (else: the terminator) */
    const uint8_t *reply;
    size_t len;
    unsigned status, param;
    int started;
} fake;

struct bw__xfer {
    fake *f;
};

static bool fake_usable(void *state, const bw__worker_ref *wr)
{
    (void)state;
    (void)wr;
    return true;
}

static int fake_start(void *state, const bw__worker_ref *wr, const bw__read_req *req,
                      int timeout_ms, bw__xfer **out, bw__xres *res)
{
    (void)req;
    (void)timeout_ms;
    fake *f = state;
    *out = NULL;
    if (!f->answers || f->started++ > 0 || strcmp(wr->id, "w1") != 0) {
        snprintf(res->err, sizeof(res->err), "worker %s: fuzz: one answer per input", wr->id);
        return res->rc = BW_INVALID_ARGUMENT;
    }
    bw__xfer *x = calloc(1, sizeof(*x));
    if (!x)
        abort();
    x->f = f;
    *out = x;
    return BW_OK;
}

static int fake_fd(bw__xfer *x)
{
    (void)x;
    return -1;
}

/* What transport_grpc.c's recv_all does with a stream: each message decoded into the sink's
 * places, then the call's status. */
static bool fake_recv(bw__xfer *x, const bw__sink *sink, bw__xres *res)
{
    const fake *f = x->f;
    char e[BW_XFER_ERRLEN] = "";
    bw__decoded last = {0};
    int rc = BW_OK;
    for (size_t pos = 0; pos < f->len && rc == BW_OK;) {
        size_t n = f->reply[pos];
        if (pos + 1 < f->len)
            n |= (size_t)f->reply[pos + 1] << 8;
        pos += 2;
        if (pos > f->len)
            pos = f->len;
        if (n > f->len - pos)
            n = f->len - pos;
        size_t cut = n * 3 / 7;
        grpc_slice s[2] = {
            grpc_slice_from_copied_buffer((const char *)f->reply + pos, cut),
            grpc_slice_from_copied_buffer((const char *)f->reply + pos + cut, n - cut)};
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, 2);
        grpc_slice_unref(s[0]);
        grpc_slice_unref(s[1]);
        rc =
            bw__decode_sample_batch(bb, sink->place, sink->arrived, sink->ctx, &last, e, sizeof(e));
        grpc_byte_buffer_destroy(bb);
        pos += n;
    }
    res->has_end_offset = last.has_next_offset;
    res->end_offset = last.next_offset;
    static const int status[4] = {BW_OK, BW_UNAVAILABLE, BW_BUSY, BW_CORRUPT};
    if (rc == BW_OK && status[f->status] == BW_OK) {
        res->rc = BW_OK;
        return true;
    }
    if (rc == BW_OK) {
        rc = status[f->status];
        snprintf(e, sizeof(e), "fuzz: the call ended with %s", bw_err_name(rc));
    }
    res->rc = rc;
    if (rc == BW_BUSY)
        res->retry_after_ms = f->param * 10;
    snprintf(res->err, sizeof(res->err), "worker w1: %.1000s", e);
    return true;
}

static void fake_finish(bw__xfer *x)
{
    free(x);
}

static const bw__transport_ops fake_ops = {"fuzz",      fake_usable, fake_start, fake_fd, fake_recv,
                                           fake_finish, NULL,        NULL,       NULL};

/* ---- the reference: what the client may accept from a reply ---- */

/* Samples in request order, assembled from pieces (a sample, or a chunk of one) by the rules
 * of docs/data-channel.md and proto/data.proto: each piece continues the sample due -- its key,
 * at the offset reached, within its size, which stays the same, is at most the limit and, for
 * fixed-size samples, that size. The first piece breaking a rule ends the request. */
typedef struct ref {
    const uint64_t *keys;
    size_t m, done;
    uint64_t max, fixed;
    bool stopped, started;
    bool cut; /* stopped because the reply ends inside a sample's bytes */
    uint64_t size, got;
    uint8_t *bytes[MAXN];
    uint64_t sizes[MAXN];
} ref;

/* A piece whose first `have` of `len` bytes are in the reply. */
static void piece(ref *r, uint64_t key, uint64_t size, uint64_t off, uint64_t len,
                  const uint8_t *data, uint64_t have)
{
    if (r->stopped)
        return;
    if (r->done == r->m || key != r->keys[r->done] || off != r->got || off > size ||
        len > size - off || size > r->max || (r->fixed && size != r->fixed) ||
        (r->started && size != r->size)) {
        r->stopped = true;
        return;
    }
    if (!r->started) {
        r->started = true;
        r->size = size;
        r->bytes[r->done] = malloc(size ? size : 1);
        if (!r->bytes[r->done])
            abort();
    }
    if (have < len) { /* the reply ends inside this piece: it is never complete */
        r->stopped = r->cut = true;
        return;
    }
    if (len)
        memcpy(r->bytes[r->done] + off, data, len);
    r->got += len;
    if (r->got == r->size) {
        r->sizes[r->done++] = r->size;
        r->started = false;
        r->got = 0;
    }
}

/* Data-channel frames: SAMPLE frames in order, and with `runs` (a ReadSamples request on a
 * connection that asked for them) RUN frames: n samples of b bytes each, the request's next
 * ones from the one due, which the frame names (docs/data-channel.md, "RUN frames"), and with
 * `zstd` as well ZRUN frames: such n samples of b >> 32 bytes in a zstd frame of b & 0xffffffff
 * bytes, fewer than the samples', which decompresses to them ("Compression"); any other frame
 * ends the samples. */
static void ref_frames(ref *r, const uint8_t *p, size_t n, bool runs, bool zstd)
{
    size_t pos = 0;
    while (!r->stopped && n - pos >= BW_DCHAN_FRAME_HEADER) {
        uint32_t type = (uint32_t)le(p + pos, 4), code = (uint32_t)le(p + pos + 4, 4);
        uint64_t a = le(p + pos + 8, 8), b = le(p + pos + 16, 8);
        pos += BW_DCHAN_FRAME_HEADER;
        if (type == BW_DCHAN_ZRUN && runs && zstd) {
            uint64_t size = b >> 32, clen = b & 0xffffffffu;
            uint8_t *raw = NULL;
            size_t got = 0;
            if (code && code <= r->m - r->done && a == r->keys[r->done] && size &&
                size <= BW_DCHAN_ZRUN_MAX / code && clen && clen < size * code && clen <= n - pos &&
                (raw = malloc((size_t)(size * code))) != NULL)
                got = ZSTD_decompress(raw, (size_t)(size * code), p + pos, (size_t)clen);
            if (!raw || ZSTD_isError(got) || got != size * code) {
                free(raw);
                r->stopped = true;
                return;
            }
            for (uint32_t i = 0; i < code; i++)
                piece(r, r->keys[r->done], size, 0, size, raw + i * size, size);
            free(raw);
            pos += (size_t)clen;
            continue;
        }
        if (type == BW_DCHAN_RUN && runs) {
            if (code == 0 || code > r->m - r->done || a != r->keys[r->done] || b == 0) {
                r->stopped = true;
                return;
            }
            for (uint32_t i = 0; i < code && !r->stopped; i++) {
                uint64_t have = n - pos < b ? n - pos : b;
                piece(r, r->keys[r->done], b, 0, b, p + pos, have);
                pos += (size_t)have;
            }
            continue;
        }
        if (type != BW_DCHAN_SAMPLE)
            return;
        uint64_t have = n - pos < b ? n - pos : b;
        piece(r, a, b, 0, b, p + pos, have);
        pos += (size_t)have;
    }
    r->stopped = true;
}

typedef struct cur {
    const uint8_t *p;
    size_t pos, end;
} cur;

static bool ref_varint(cur *c, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (c->pos >= c->end)
            return false;
        uint8_t b = c->p[c->pos++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

static bool ref_skip(cur *c, unsigned wire)
{
    uint64_t v, k = 0;
    switch (wire) {
    case 0:
        return ref_varint(c, &v);
    case 1:
        k = 8;
        break;
    case 2:
        if (!ref_varint(c, &k))
            return false;
        break;
    case 5:
        k = 4;
        break;
    default:
        return false;
    }
    if (k > c->end - c->pos)
        return false;
    c->pos += (size_t)k;
    return true;
}

/* One Sample of `len` bytes at c (a protobuf message: fields index=1, size=2, chunk_offset=3
 * as varints, data=4; the header fields come before the data). False when malformed. */
static bool ref_sample(ref *r, cur *c, uint64_t len)
{
    uint64_t stop = c->pos + len, index = 0, size = 0, chunk = 0;
    bool placed = false;
    while (c->pos < stop) {
        uint64_t tag, v;
        if (!ref_varint(c, &tag))
            return false;
        unsigned field = (unsigned)(tag >> 3), wire = (unsigned)(tag & 7);
        if (field >= 1 && field <= 3 && wire == 0) {
            if (placed || !ref_varint(c, &v))
                return false;
            if (field == 1)
                index = v;
            else if (field == 2)
                size = v;
            else
                chunk = v;
        } else if (field == 4 && wire == 2) {
            if (placed || !ref_varint(c, &v) || v > stop - c->pos)
                return false;
            uint64_t have = c->end - c->pos < v ? c->end - c->pos : v;
            piece(r, index, size, chunk, v, c->p + c->pos, have);
            if (have < v)
                return false;
            c->pos += (size_t)v;
            placed = true;
        } else if (!ref_skip(c, wire)) {
            return false;
        }
    }
    if (c->pos != stop)
        return false;
    if (!placed)
        piece(r, index, size, chunk, 0, NULL, 0);
    return true;
}

/* gRPC: each message a SampleBatch (samples = field 1); a malformed one ends the request. */
static void ref_messages(ref *r, const uint8_t *p, size_t n)
{
    for (size_t pos = 0; pos < n && !r->stopped;) {
        size_t len = p[pos];
        if (pos + 1 < n)
            len |= (size_t)p[pos + 1] << 8;
        pos += 2;
        if (pos > n)
            pos = n;
        if (len > n - pos)
            len = n - pos;
        cur c = {p, pos, pos + len};
        while (c.pos < c.end && !r->stopped) {
            uint64_t tag, slen;
            if (!ref_varint(&c, &tag)) {
                r->stopped = true;
            } else if (tag == ((1u << 3) | 2)) {
                if (!ref_varint(&c, &slen) || !ref_sample(r, &c, slen))
                    r->stopped = true;
            } else if (!ref_skip(&c, (unsigned)(tag & 7))) {
                r->stopped = true;
            }
        }
        pos += len;
    }
}

/* ---- the target ---- */

static bool g_verbose; /* BW_FUZZ_VERBOSE=1: each input's outcome on stderr */
static bw__placement *g_table;

static bw__placement *placement(void *arg, bool refresh, char *err, size_t errlen)
{
    (void)arg;
    (void)refresh;
    (void)err;
    (void)errlen;
    atomic_fetch_add(&g_table->refs, 1);
    return g_table;
}

/* Two workers: w1 answers (over the data channel, or the gRPC fake), w2 is where the loop
 * fails over to. Every shard is w1's. */
static bw__placement *make_table(bool dchan)
{
    bw__placement *p = calloc(1, sizeof(*p));
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", L.port);
    if (!p || !(p->workers = calloc(2, sizeof(*p->workers))) ||
        !(p->owners = calloc(BW_LOADER_NUM_SHARDS, sizeof(*p->owners))))
        abort();
    atomic_init(&p->refs, 1);
    p->version = 1;
    p->nworkers = 2;
    p->num_shards = BW_LOADER_NUM_SHARDS;
    p->workers[0] =
        (bw__worker_ref){strdup("w1"), strdup(dchan ? "" : "fuzz-w1:1"), strdup(dchan ? addr : "")};
    p->workers[1] = (bw__worker_ref){strdup("w2"), strdup("fuzz-w2:1"), strdup("")};
    return p;
}

static void log_line(void *user, bw_log_level level, const char *line)
{
    (void)user;
    (void)level;
    fprintf(stderr, "  %s\n", line);
}

static void init(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    g_verbose = getenv("BW_FUZZ_VERBOSE") != NULL;
    if (g_verbose)
        bw_set_log_callback(log_line, NULL, BW_LOG_DEBUG);
    signal(SIGPIPE, SIG_IGN);
    grpc_init();
    char err[256];
    if (bw__sock_listen("127.0.0.1:0", &L.fd, &L.port, err, sizeof(err)) != BW_OK) {
        fprintf(stderr, "fuzz_client_reply: %s\n", err);
        abort();
    }
    pthread_t t;
    if (pthread_create(&t, NULL, listener, NULL) != 0)
        abort();
    pthread_detach(t);
}

/* A stream of one source of SOURCE_RECORDS records, read in batches of n by one rank: its
 * context and its epoch 0 plan, as the loader has them. */
static void stream_of_one_source(size_t n, bw__stream_ctx **sc, bw__plan **plan)
{
    char err[256];
    Batchwire__V1__SourceInfo src = BATCHWIRE__V1__SOURCE_INFO__INIT;
    Batchwire__V1__SourceInfo *srcs[1] = {&src};
    src.path = "part-0.tfrecord";
    src.records = SOURCE_RECORDS;
    src.size_bytes = MAX_SAMPLE;
    Batchwire__V1__DatasetInfo info = BATCHWIRE__V1__DATASET_INFO__INIT;
    info.n_sources = 1;
    info.sources = srcs;
    Batchwire__V1__JobSummary job = BATCHWIRE__V1__JOB_SUMMARY__INIT;
    job.dataset = &info;
    Batchwire__V1__WorldSegment seg = BATCHWIRE__V1__WORLD_SEGMENT__INIT;
    const Batchwire__V1__WorldSegment *history[1] = {&seg};
    seg.world_size = 1;
    uint64_t records[1] = {SOURCE_RECORDS};
    bw__plan_spec spec;
    memset(&spec, 0, sizeof(spec));
    bw__sampler_cfg_init(&spec.sampler);
    spec.sampler.mode = BW__MODE_ITERABLE;
    spec.sampler.batch_size = n;
    spec.records = records;
    spec.nsources = 1;
    spec.history = history;
    spec.nhistory = 1;
    if (bw__stream_open(sc, &job, err, sizeof(err)) != BW_OK ||
        bw__plan_new(&spec, 0, false, plan, err, sizeof(err)) != BW_OK) {
        fprintf(stderr, "fuzz_client_reply: %s\n", err);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    init();
    bool grpc = data[0] & 1, stream = data[0] & 2, fixed = (data[0] & 4) && !stream;
    size_t n = 1 + ((data[0] >> 3) & 7);
    unsigned status = data[0] >> 6, param = data[1];
    bool zstd = !grpc && (data[0] & 0x40);
    const uint8_t *reply = data + 2;
    size_t len = size - 2;

    pthread_mutex_lock(&L.mu);
    unsigned gen = ++L.gen;
    L.reply = grpc ? NULL : reply;
    L.len = len;
    pthread_mutex_unlock(&L.mu);
    char fingerprint[32];
    snprintf(fingerprint, sizeof(fingerprint), "fuzz-%u", gen);

    fake answer = {true, reply, len, status, param, 0}, terminator = {false, NULL, 0, 0, 0, 0};
    char *sources[1] = {"part-0"};
    Batchwire__V1__Dataset ds = BATCHWIRE__V1__DATASET__INIT;
    ds.format = fixed ? "npy" : "tfrecord";
    ds.n_sources = 1;
    ds.sources = sources;
    g_table = make_table(!grpc);
    bw__fetch_ctx ctx = {0};
    ctx.placement = placement;
    if (grpc) {
        ctx.fallback = (bw__transport){&fake_ops, &answer};
    } else {
        bw__worker_opts plain = {0}; /* TCP, no grant */
        if (zstd)
            plain.compress = BW_DCHAN_FEATURE_ZSTD;
        char err[256];
        if (bw__transport_open(&bw__transport_dchan_ops, &plain, &ctx.preferred, err,
                               sizeof(err)) != BW_OK)
            abort();
        ctx.fallback = (bw__transport){&fake_ops, &terminator};
    }
    ctx.dataset = &ds;
    ctx.fingerprint = fingerprint;
    ctx.sample_bytes = fixed ? 1 + param % 64 : 0;
    ctx.max_sample_bytes = MAX_SAMPLE;
    ctx.max_message_bytes = 4u << 20;
    ctx.timeout_ms = 5000;

    bw_batch b;
    if (bw__batch_init(&b, n, 0, false) != BW_OK)
        abort();
    b.count = b.real = n;
    size_t room = fixed ? 0 : (size_t)param * 256;
    /* Room for exactly that much (the allocation may be larger); none: no buffer at all. */
    if (room) {
        if (bw__batch_reserve(&b, room) != BW_OK)
            abort();
        b.cap = room;
    }
    uint64_t keys[MAXN];
    size_t m = 0;
    int rc;
    if (stream) {
        for (size_t i = 0; i < n; i++)
            keys[m++] = b.indices[i] = FIRST_RECORD + i;
        bw__stream_ctx *sc = NULL;
        bw__plan *plan = NULL;
        stream_of_one_source(n, &sc, &plan);
        rc = bw__stream_fetch_batch(&ctx, sc, plan, &b);
        bw__stream_free(sc);
        bw__plan_free(plan);
    } else {
        /* the distinct indices in batch order (their first places): the request's order */
        for (size_t i = 0; i < n; i++) {
            b.indices[i] = BATCH[i];
            size_t j = 0;
            while (j < m && keys[j] != BATCH[i])
                j++;
            if (j == m)
                keys[m++] = BATCH[i];
        }
        rc = bw__fetch_batch(&ctx, &b);
    }

    if (g_verbose)
        fprintf(stderr, "fuzz_client_reply: %s%s%s: %s %s\n", grpc ? "grpc" : "data channel",
                stream ? " stream" : "", fixed ? " fixed" : "", bw_err_name(rc), b.err);
    pthread_mutex_lock(&L.mu);
    L.reply = NULL;
    bool served = L.served == gen;
    bool asked_right = L.nkeys == m && memcmp(L.keys, keys, m * sizeof(keys[0])) == 0 &&
                       L.kind == (stream ? BW_DCHAN_KIND_READ_STREAM : BW_DCHAN_KIND_READ_SAMPLES);
    pthread_mutex_unlock(&L.mu);
    bw__transport_close(&ctx.preferred); /* its idle connections and suspensions too */
    if (!grpc && served && !asked_right)
        __builtin_trap(); /* the request did not ask for the batch's samples */
    if (rc == BW_OK && !grpc && !served)
        __builtin_trap(); /* a batch without the only worker's answer */

    if (rc == BW_OK) {
        ref r = {keys, m, 0, MAX_SAMPLE, ctx.sample_bytes, false, false, false, 0, 0, {NULL}, {0}};
        if (grpc)
            ref_messages(&r, reply, len);
        else
            ref_frames(&r, reply, len, !stream, zstd && !stream);
        if (r.done != m)
            __builtin_trap(); /* succeeded without every sample complete in the reply */
        for (size_t i = 0; i < n; i++) {
            size_t k = 0;
            /* The batch's indices are the m keys set above, each found before keys[m]. */
            // NOLINTNEXTLINE(clang-analyzer-core.UndefinedBinaryOperatorResult)
            while (keys[k] != b.indices[i])
                k++;
            const void *p = NULL;
            size_t sz = 0;
            if (bw_batch_sample(&b, i, &p, &sz) != BW_OK || sz != r.sizes[k] ||
                (sz && memcmp(p, r.bytes[k], sz) != 0))
                __builtin_trap(); /* the batch differs from what the worker sent */
        }
        for (size_t k = 0; k < MAXN; k++)
            free(r.bytes[k]);
    }
    bw__batch_free(&b);
    bw__placement_put(g_table);
    g_table = NULL;
    return 0;
}
