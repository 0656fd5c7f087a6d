/*
 * ReadSamples and ReadStream over TCP or TLS (core/rpc/dchan.h, docs/data-channel.md). One
 * thread per connection: it reads a request header, refuses a body over --max-request-bytes
 * before reading any of it, waits for the request's charge in the in-flight budget (executor.h)
 * before reading the body, decodes it bounded by that charge (request.h), opens the read on the
 * executor's pool (read_path.h: the same checks as gRPC) and writes each record's frame header
 * (with RUN frames, which a connection's FEATURES request turns on, one header for a run of
 * samples of one size) and bytes with one sendmsg per batch of frames -- records straight from the
 * dataset's mapped file, frame headers and records under 1 KiB (or under 32 KiB, of a file mapped
 * for them alone) gathered into a staging buffer first. A client that sends garbage gets an ERROR
 * frame and the connection is closed; the worker keeps serving everyone else.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zstd.h>

#include "common/log.h"
#include "common/util.h"
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "read_path.h"
#include "request.h"
#include "rpc/dchan.h"
#include "worker.h"

enum {
    THREAD_STACK = 256 << 10, /* per connection; serve() needs a few KiB */
    STAGE_BYTES = 256 << 10,  /* frame headers and copied records, per send */
    COPY_MAX = 32 << 10,      /* records of their own below this are copied into the stage */
    REF_MIN = 1 << 10,        /* records in a dataset's mapping from this size are sent from it */
    PENDING_MAX = 32,         /* large samples gathered into one sendmsg, at most */
    SEND_BYTES = 4 << 20,     /* bytes gathered into one sendmsg, about */
    IOV_CAP = 1024,
    GATHER_MAX = 256,         /* small samples gathered by one call (bw__rp_next_gather), at most */
    DISCARD_CHUNK = 16 << 10, /* a refused body is read and dropped this much at a time */
    BODY_TIMEOUT_MS = 30000,  /* a request's body must arrive within this after its header */
    SEND_TIMEOUT_MS = 120000, /* a client that stops reading for this long is dropped */
    ACCEPT_POLL_MS = 200,
    /* compression (docs/data-channel.md, "Compression"): samples of one size are gathered,
     * copied, into groups of about ZGROUP bytes (ZPROBE for `auto`'s first, the probe), each
     * sent as one ZRUN frame; a sample over ZRAW_MAX goes raw */
    ZGROUP = 256 << 10,
    ZPROBE = 64 << 10,
    ZRAW_MAX = 1 << 20,
};

/* What one request's response holds of its own while it is served (part of its charge). */
#define RESPONSE_BYTES                                                                             \
    ((uint64_t)STAGE_BYTES + IOV_CAP * sizeof(struct iovec) + PENDING_MAX * sizeof(bw__rp_rec))

typedef struct conn {
    bw_dsock sock;
    pthread_t th;
    atomic_bool done;
    struct bw__dchan_server *srv;
    char peer[64];
    char host[48]; /* the peer's address without its port: connections are capped per host */
    /* credentials (docs/security.md): the hello's bearer token and the subject common name of
     * a verified client certificate; checked again for every request, so that a token removed
     * by a reload stops working at once */
    char *token;
    char cert_cn[BW_PRINCIPAL_NAME_MAX];
    bw_role role;      /* of the last request's credentials (authorize); NONE: without any */
    uint64_t features; /* what its FEATURES request asked for, that this worker speaks */
    int zlevel;        /* with BW_DCHAN_FEATURE_ZSTD: the level used */
    ZSTD_CCtx *zc;     /* made on its first compressed request, kept while it is open */
    struct conn *next;
} conn;

struct bw__dchan_server {
    bw_worker *w;
    int lfd;
    SSL_CTX *tls; /* NULL: plain TCP */
    pthread_t th;
    atomic_bool stopping;
    pthread_mutex_t mu;
    conn *conns;
    size_t nconns;
    uint64_t refused_logged_ms, refused_quiet; /* one warning per 10 s about refusals */
    bw_log_limit bad_log; /* malformed or refused connections: a port scanner cannot flood */
};

/* ---- sending ----
 * Frames are gathered into one iovec list: headers copied into the staging buffer, records as
 * pointers into the dataset's mapping (which the open read holds; copied into the staging
 * buffer below REF_MIN), records of a file mapped for them alone as pointers into it (held
 * until sent; copied below COPY_MAX), and written with one sendmsg per PENDING_MAX held
 * records, SEND_BYTES bytes or IOV_CAP pieces. A request's buffers are allocated
 * once it is admitted and freed when it is answered: an idle connection holds none. */

/* A run of samples being gathered into one RUN frame (docs/data-channel.md, "RUN frames"):
 * the next samples of the request, in request order, all of one size. Its frame header sits in
 * the stage at `hdr`, a SAMPLE header while it holds one sample, rewritten as RUN before it is
 * sent (run_close). */
typedef struct run {
    bool open;
    size_t hdr;
    uint64_t first, n, size;
    const uint8_t *next; /* the end of its last sample in a dataset's mapping (else NULL) */
    /* its last samples, back to back in the mapping up to `next`, copied: the last bytes
     * staged (sent from the mapping instead once they make REF_MIN bytes) */
    uint64_t nstaged;
} run;

typedef struct wbuf {
    bw_dsock *sock;
    uint8_t *stage; /* STAGE_BYTES */
    size_t len;
    struct iovec *iov; /* IOV_CAP */
    size_t niov, pending;
    bw__rp_rec *recs; /* PENDING_MAX, referenced by iov */
    size_t nrec;
    const uint8_t *gathered[GATHER_MAX]; /* bw__rp_next_gather's places */
    bool mapped; /* iov references a dataset's mapping (held by the open read) */
    bool runs;   /* RUN frames: the connection's FEATURES asked for them, and a ReadSamples */
    run run;
    /* ZRUN frames (the connection asked for them, and a ReadSamples): the group being
     * gathered -- n samples of `size` bytes from index `first`, copied into zraw */
    struct {
        ZSTD_CCtx *cc; /* the connection's; NULL: no compression */
        int level;
        bool autom;  /* `auto`: the first group is a probe; if it does not pay, off */
        bool probed; /* the first group was sent */
        bool off;    /* the rest of the request goes raw */
        uint8_t *raw, *out;
        size_t len, outcap;
        uint64_t first, n, size;
    } z;
    char err[256];
} wbuf;

static int wbuf_init(wbuf *o, bw_dsock *sock)
{
    memset(o, 0, sizeof(*o));
    o->sock = sock;
    o->stage = malloc(STAGE_BYTES);
    o->iov = malloc(IOV_CAP * sizeof(*o->iov));
    o->recs = malloc(PENDING_MAX * sizeof(*o->recs));
    return o->stage && o->iov && o->recs ? BW_OK : BW_NOMEM;
}

/* Compression's buffers, for a request that will use them. */
static int wbuf_zinit(wbuf *o, ZSTD_CCtx *cc, int level, bool autom)
{
    o->z.outcap = ZSTD_compressBound(ZRAW_MAX);
    o->z.raw = malloc(ZRAW_MAX);
    o->z.out = malloc(o->z.outcap);
    o->z.cc = cc;
    o->z.level = level;
    o->z.autom = autom;
    return o->z.raw && o->z.out ? BW_OK : BW_NOMEM;
}

/* What a compressing request holds on top of RESPONSE_BYTES: its two buffers and the
 * connection's compression context at its level for inputs up to ZRAW_MAX -- rounded up from
 * ZSTD_sizeof_CCtx after compressing 1 MiB with libzstd 1.5.4 (0.6 MB at level 1, 1.3 MB at
 * 3, 3.7 MB at 5-6, 6.8 MB at 7-8, 13.1 MB at 9-12, 18.1 MB at 19; its estimate functions are
 * not in the stable API). */
static uint64_t zresponse_bytes(int level)
{
    uint64_t ctx = level <= 3 ? 2 : level <= 6 ? 4 : level <= 8 ? 7 : level <= 12 ? 14 : 19;
    return (uint64_t)ZRAW_MAX + ZSTD_compressBound(ZRAW_MAX) + (ctx << 20);
}

static void wbuf_free(wbuf *o)
{
    for (size_t i = 0; i < o->nrec; i++)
        bw__record_release(&o->recs[i].rec);
    free(o->z.raw);
    free(o->z.out);
    free(o->stage);
    free(o->iov);
    free(o->recs);
    memset(o, 0, sizeof(*o));
}

static void add_iov(wbuf *o, const void *p, size_t len)
{
    if (!len)
        return;
    struct iovec *last = o->niov ? &o->iov[o->niov - 1] : NULL;
    if (last && (const uint8_t *)last->iov_base + last->iov_len == p)
        last->iov_len += len;
    else /* wbuf_init refuses the connection unless iov was allocated */
        // NOLINTNEXTLINE(clang-analyzer-core.NullDereference)
        o->iov[o->niov++] = (struct iovec){(void *)p, len};
    o->pending += len;
}

static void run_close(wbuf *o);

static int flush(wbuf *o)
{
    run_close(o); /* its header is final before it is sent */
    int rc = o->niov ? bw__dsock_writev_all(o->sock, o->iov, o->niov,
                                            bw__mono_ms() + SEND_TIMEOUT_MS, o->err, sizeof(o->err))
                     : BW_OK;
    for (size_t i = 0; i < o->nrec; i++)
        bw__record_release(&o->recs[i].rec);
    o->nrec = o->niov = o->pending = o->len = 0;
    o->mapped = false;
    return rc;
}

/* Flushes unless a frame header, COPY_MAX staged bytes and a record's parts still fit. */
static int make_room(wbuf *o)
{
    if (o->nrec < PENDING_MAX && o->pending < SEND_BYTES &&
        o->len + BW_DCHAN_FRAME_HEADER + COPY_MAX <= STAGE_BYTES &&
        o->niov + 2 + BW_FMT_MAX_FIELDS <= IOV_CAP)
        return BW_OK;
    return flush(o);
}

/* Every byte of r lies in a dataset's mapping, which the open read holds until it closes (not
 * in a file mapped for this record, nor in the record itself: a tar field table). */
static bool in_dataset_mapping(const bw__record *r)
{
    const uint8_t *self = (const uint8_t *)r, *after = (const uint8_t *)(r + 1);
    if (r->owner_is_own)
        return false;
    for (size_t p = 0; p < r->nparts; p++)
        if (r->parts[p].p >= self && r->parts[p].p < after)
            return false;
    return true;
}

/* Stages bytes (the caller made room). */
static void stage(wbuf *o, const void *p, size_t len)
{
    memcpy(o->stage + o->len, p, len);
    add_iov(o, o->stage + o->len, len);
    o->len += len;
}

static void stage_frame(wbuf *o, uint32_t type, int code, uint64_t a, uint64_t b)
{
    uint8_t h[BW_DCHAN_FRAME_HEADER];
    bw_dchan_frame f = {type, (uint32_t)(int32_t)code, a, b};
    bw__dchan_put_frame(h, &f);
    stage(o, h, sizeof(h));
}

/* What o has pending (o may be NULL: nothing), then an ERROR frame with its message and hint,
 * written at once. BW_OK unless the connection failed. */
static int send_error(bw_dsock *sock, wbuf *o, int code, uint32_t retry_after_ms, const char *msg)
{
    char why[256];
    int rc = o ? flush(o) : BW_OK;
    if (rc != BW_OK)
        return rc;
    size_t ml = strlen(msg);
    if (ml > BW_DCHAN_MAX_MESSAGE)
        ml = BW_DCHAN_MAX_MESSAGE;
    uint8_t h[BW_DCHAN_FRAME_HEADER];
    bw_dchan_frame f = {BW_DCHAN_ERROR, (uint32_t)(int32_t)code, ml, retry_after_ms};
    bw__dchan_put_frame(h, &f);
    struct iovec iov[2] = {{h, sizeof(h)}, {(void *)msg, ml}};
    return bw__dsock_writev_all(sock, iov, ml ? 2 : 1, bw__mono_ms() + SEND_TIMEOUT_MS, why,
                                sizeof(why));
}

/* Ends the open run: a SAMPLE frame while it has one sample, else its header becomes RUN. */
static void run_close(wbuf *o)
{
    run *u = &o->run;
    if (!u->open)
        return;
    u->open = false;
    if (u->n > 1) {
        bw_dchan_frame f = {BW_DCHAN_RUN, (uint32_t)u->n, u->first, u->size};
        bw__dchan_put_frame(o->stage + u->hdr, &f);
    }
}

/* The bytes of record r, after its frame header or its run's previous sample: pointers into
 * a dataset's mapping (which the open read holds until it closes) from REF_MIN, and below it
 * when they continue, back to back, a piece of the mapping already sent or run samples that
 * make REF_MIN bytes with it; else copied into the stage below COPY_MAX; else pointers into the
 * record's own mapping, held until sent (docs/performance.md, "Client": copying 4 KiB records
 * into the stage was a third of the worker's time; below REF_MIN the copy costs less than the
 * kernel's iovec piece per record -- at 256 B the worker spent about a fifth more CPU per
 * sample sending from the mapping -- unless the piece holds several samples). */
static void put_bytes(wbuf *o, bw__rp_rec *r)
{
    run *u = &o->run;
    bool mapped = r->rec.size > 0 && in_dataset_mapping(&r->rec);
    bool single = mapped && r->rec.nparts == 1;
    const uint8_t *p0 = single ? r->rec.parts[0].p : NULL;
    bool follows = single && u->next && p0 == u->next;
    uint64_t group = follows ? u->nstaged : 0; /* copied samples it would continue */
    u->next = single ? p0 + r->rec.size : NULL;
    u->nstaged = 0;
    bool rejoin = follows && group && (group + 1) * r->rec.size >= REF_MIN;
    if (rejoin) {
        /* Those copies are taken back (the last bytes staged: nothing comes between two
         * samples of a run) and sent from the mapping with this one, as one piece. */
        size_t back = (size_t)(group * r->rec.size);
        o->iov[o->niov - 1].iov_len -= back;
        o->len -= back;
        o->pending -= back;
        add_iov(o, p0 - back, back);
    }
    /* (follows with no copies before it: the previous sample went from the mapping, and this
     * one joins its piece) */
    if (mapped && (r->rec.size >= REF_MIN || (follows && !group) || rejoin)) {
        for (size_t p = 0; p < r->rec.nparts; p++)
            add_iov(o, r->rec.parts[p].p, r->rec.parts[p].len);
        o->mapped = true;
        bw__record_release(&r->rec);
    } else if (r->rec.size < COPY_MAX) {
        for (size_t p = 0; p < r->rec.nparts; p++)
            stage(o, r->rec.parts[p].p, r->rec.parts[p].len);
        u->nstaged = single ? group + 1 : 0;
        bw__record_release(&r->rec);
    } else {
        for (size_t p = 0; p < r->rec.nparts; p++)
            add_iov(o, r->rec.parts[p].p, r->rec.parts[p].len);
        o->nrec++; /* released once sent */
    }
}

/* The next n samples of `size` bytes, from index `first`, join the open run when it is of their
 * size and has room, else open one (its header staged): the run, counting them. */
static run *run_join(wbuf *o, uint64_t first, uint64_t n, uint64_t size)
{
    run *u = &o->run;
    if (!u->open || size != u->size || u->n + n > BW_DCHAN_RUN_MAX) {
        run_close(o);
        *u = (run){true, o->len, first, 0, size, NULL, 0};
        stage_frame(o, BW_DCHAN_SAMPLE, 0, first, size);
    }
    u->n += n;
    return u;
}

/* A span of samples (bw__rp_next_span), all of one size, lying back to back in a dataset's mapping:
 * it joins the open run when it is of the run's size, else opens one; its bytes are one piece,
 * sent from the mapping from REF_MIN bytes and copied into the stage below that, as put_bytes
 * sends such samples one at a time. */
static void put_span(wbuf *o, const bw__rp_span *sp)
{
    run *u = run_join(o, sp->first, sp->n, sp->size);
    size_t bytes = (size_t)(sp->n * sp->size);
    u->next = sp->p + bytes;
    u->nstaged = bytes < REF_MIN ? sp->n : 0; /* put_bytes may take them back (rejoin) */
    if (bytes < REF_MIN) {
        stage(o, sp->p, bytes);
    } else {
        add_iov(o, sp->p, bytes);
        o->mapped = true;
    }
}

/* Small samples gathered (bw__rp_next_gather), all of one size, from anywhere in a dataset's
 * mapping: they join the open run when it is of their size, else open one, and are copied into
 * the stage one after the other, as put_bytes copies such samples one at a time, each sample
 * BW_RP_PREFETCH_AHEAD places on asked for as one is copied (the read path asked for the first
 * ones). */
static void put_gather(wbuf *o, const bw__rp_gather *g)
{
    run *u = run_join(o, g->first, g->n, g->size);
    u->next = NULL; /* copies only: nothing for a later sample to rejoin */
    u->nstaged = 0;
    const uint8_t *const *p = o->gathered;
    size_t size = (size_t)g->size;
    for (size_t i = 0; i < g->n; i++) {
        if (i + BW_RP_PREFETCH_AHEAD < g->n)
            bw__prefetch_bytes(p[i + BW_RP_PREFETCH_AHEAD], size);
        memcpy(o->stage + o->len, p[i], size);
        o->len += size;
    }
    add_iov(o, o->stage + o->len - g->n * size, g->n * size);
}

/* ---- compression (docs/data-channel.md, "Compression") ---- */

/* Sends the group gathered (if any), after what o has pending: as one ZRUN frame when it
 * compresses to fewer bytes (`auto`: at least a tenth fewer on the probe, else the rest of the
 * request goes raw too), else as it is (RUN, or SAMPLE for one sample). BW_OK unless the
 * connection failed. */
static int zgroup_send(wbuf *o)
{
    if (!o->z.n)
        return BW_OK;
    int rc = flush(o);
    if (rc != BW_OK)
        return rc;
    size_t c = ZSTD_compressCCtx(o->z.cc, o->z.out, o->z.outcap, o->z.raw, o->z.len, o->z.level);
    bool pays = !ZSTD_isError(c) && c < o->z.len;
    if (o->z.autom && !o->z.probed) {
        pays = pays && c * 10 <= o->z.len * 9;
        o->z.off = !pays;
    }
    o->z.probed = true;
    uint8_t h[BW_DCHAN_FRAME_HEADER];
    bw_dchan_frame f = {BW_DCHAN_SAMPLE, 0, o->z.first, o->z.size};
    if (pays)
        f = (bw_dchan_frame){BW_DCHAN_ZRUN, (uint32_t)o->z.n, o->z.first, o->z.size << 32 | c};
    else if (o->z.n > 1)
        f = (bw_dchan_frame){BW_DCHAN_RUN, (uint32_t)o->z.n, o->z.first, o->z.size};
    bw__dchan_put_frame(h, &f);
    struct iovec iov[2] = {{h, sizeof(h)}, {pays ? o->z.out : o->z.raw, pays ? c : o->z.len}};
    o->z.n = o->z.len = 0;
    return bw__dsock_writev_all(o->sock, iov, 2, bw__mono_ms() + SEND_TIMEOUT_MS, o->err,
                                sizeof(o->err));
}

/* Takes record r into the group when the request compresses it (*taken; the record is then
 * released), sending the group first when r does not join it. A record not taken (the
 * request's compression off, an empty sample or one over ZRAW_MAX) goes raw after the group.
 * BW_OK unless the connection failed. */
static int zgroup_take(wbuf *o, bw__rp_rec *r, bool *taken)
{
    uint64_t s = r->rec.size;
    *taken = false;
    size_t target = o->z.autom && !o->z.probed ? ZPROBE : ZGROUP;
    bool joins = o->z.n && s == o->z.size && o->z.len + s <= target && o->z.n < BW_DCHAN_RUN_MAX;
    if (o->z.n && !joins) {
        int rc = zgroup_send(o);
        if (rc != BW_OK)
            return rc;
    }
    if (!o->z.cc || o->z.off || s == 0 || s > ZRAW_MAX)
        return BW_OK;
    if (!o->z.n) {
        o->z.first = r->key;
        o->z.size = s;
    }
    for (size_t p = 0; p < r->rec.nparts; p++) {
        memcpy(o->z.raw + o->z.len, r->rec.parts[p].p, r->rec.parts[p].len);
        o->z.len += r->rec.parts[p].len;
    }
    o->z.n++;
    bw__record_release(&r->rec);
    *taken = true;
    return BW_OK;
}

/* The records of an open read, then END (or ERROR at the first record that cannot be read:
 * its code in *status). BW_OK unless the connection failed. */
static int serve_read(wbuf *o, bw__rp *rp, int *status)
{
    char err[1400];
    for (;;) {
        int rc = make_room(o);
        if (rc != BW_OK)
            return rc;
        /* With RUN frames and no compression, the next samples lying back to back in the
         * dataset's mapping come as one span (bw__rp_next_span), one call for them all. */
        if (o->runs && !o->z.cc) {
            /* small samples that are not neighbours in the file, gathered and copied; the
             * stage keeps room for COPY_MAX bytes and a header (make_room) */
            bw__rp_gather g;
            rc = bw__rp_next_gather(rp, GATHER_MAX, COPY_MAX, REF_MIN, o->gathered, &g, err,
                                    sizeof(err));
            if (rc != BW_OK)
                return send_error(o->sock, o, *status = rc, 0, err);
            if (g.n) {
                put_gather(o, &g);
                continue;
            }
            bw__rp_span sp;
            uint64_t room = o->pending < SEND_BYTES ? SEND_BYTES - o->pending : 0;
            rc = bw__rp_next_span(rp, BW_DCHAN_RUN_MAX, room, &sp, err, sizeof(err));
            if (rc != BW_OK)
                return send_error(o->sock, o, *status = rc, 0, err);
            if (sp.n) {
                put_span(o, &sp);
                continue;
            }
        }
        bw__rp_rec *r = &o->recs[o->nrec];
        rc = bw__rp_next(rp, r, err, sizeof(err));
        if (rc == BW_RP_END)
            break;
        if (rc != BW_OK) { /* the samples before it first */
            int wr = zgroup_send(o);
            return wr != BW_OK ? wr : send_error(o->sock, o, *status = rc, 0, err);
        }
        bool taken = false;
        if (o->z.cc && (rc = zgroup_take(o, r, &taken)) != BW_OK) {
            bw__record_release(&r->rec);
            return rc;
        }
        if (taken)
            continue;
        /* With RUN frames, a sample of the open run's size joins it without a header. */
        run *u = &o->run;
        if (o->runs && u->open && r->rec.size == u->size && u->n < BW_DCHAN_RUN_MAX) {
            u->n++;
            put_bytes(o, r);
            continue;
        }
        run_close(o);
        *u = (run){o->runs && r->rec.size > 0, o->len, r->key, 1, r->rec.size, NULL, 0};
        stage_frame(o, BW_DCHAN_SAMPLE, 0, r->key, r->rec.size);
        put_bytes(o, r);
    }
    int rc = zgroup_send(o);
    if (rc != BW_OK)
        return rc;
    run_close(o);
    if (o->nrec || o->mapped) {
        /* Records still to be sent straight from the mapping: the kernel copies them after
         * the read's end check, so send them, then check the files again before END -- a
         * file changed meanwhile fails the request (docs/formats.md, "Files that change
         * under a worker"). Small records were copied before that check. */
        if ((rc = flush(o)) != BW_OK)
            return rc;
        if ((rc = bw__rp_recheck(rp, err, sizeof(err))) != BW_OK)
            return send_error(o->sock, o, *status = rc, 0, err);
    }
    rc = make_room(o);
    if (rc == BW_OK)
        stage_frame(o, BW_DCHAN_END, 0, bw__rp_count(rp), bw__rp_end_offset(rp));
    return rc == BW_OK ? flush(o) : rc;
}

/* ---- a request ---- */

/* Reads and drops len bytes of a body that will not be served. */
static int discard(conn *c, uint64_t len)
{
    uint8_t buf[DISCARD_CHUNK];
    char err[256];
    uint64_t deadline = bw__mono_ms() + BODY_TIMEOUT_MS;
    while (len) {
        size_t n = len < sizeof(buf) ? (size_t)len : sizeof(buf);
        int rc = bw__dsock_read_all(&c->sock, buf, n, deadline, NULL, err, sizeof(err));
        if (rc != BW_OK)
            return rc;
        len -= n;
    }
    return BW_OK;
}

/* Opening a read on the executor's pool, as gRPC does. */
typedef struct open_task {
    bw__exec_task t; /* first: the executor hands it back */
    bw_worker *w;
    const char *peer;
    const ProtobufCMessage *req;
    bw__rp *rp;
    int rc;
    char err[1400];
} open_task;

static void open_on_pool(bw__exec_task *t, int rc)
{
    open_task *ot = (open_task *)t;
    if (rc != BW_OK)
        snprintf(ot->err, sizeof(ot->err), "data channel: %s", t->why);
    else if ((rc = bw__rp_open(ot->w, ot->peer, ot->req, &ot->rp, ot->err, sizeof(ot->err))) ==
             BW_OK)
        bw__rp_meter(ot->rp, ot->w->metrics, BW_WM_DATA_CHANNEL);
    ot->rc = rc;
}

/* Serves one request of `kind` whose header announced `len` bytes (within the limit): admission,
 * body, decoding, checks, records. BW_OK to keep the connection; anything else closes it. */
static int serve_request(conn *c, uint32_t kind, uint64_t len)
{
    bw_worker *w = c->srv->w;
    const char *method = bw__req_method(kind);
    char err[1400];
    uint32_t hint = 0;
    uint64_t t0 = bw__wm_begin(w->metrics, BW_WM_DATA_CHANNEL);
    /* A ReadSamples request on a connection that asked for compression also holds its
     * buffers and the connection's compression context. */
    bool zstd = (c->features & BW_DCHAN_FEATURE_ZSTD) && kind == BW_REQ_SAMPLES;
    /* ... unless that is over a quarter of the whole budget (a small --inflight-bytes with a
     * high level): then it is sent raw, which the client always takes. */
    if (zstd && zresponse_bytes(c->zlevel) > (uint64_t)w->cfg->inflight_bytes / 4)
        zstd = false;
    uint64_t response = RESPONSE_BYTES + (zstd ? zresponse_bytes(c->zlevel) : 0);
    uint64_t charge = bw__req_charge(kind, len, 1, response);
    int rc = bw__exec_admit(w->exec, charge, &hint, err, sizeof(err));
    if (rc != BW_OK) {
        bw__wm_end(w->metrics, BW_WM_DATA_CHANNEL, kind, t0, rc);
        /* Not admitted: the body is read and dropped (nothing of it kept), the refusal sent,
         * and the connection takes the next request. */
        char msg[1500];
        snprintf(msg, sizeof(msg), "%s: %s", method, err);
        BW_DEBUG("data channel: request not admitted peer=%s err=%s", c->peer, msg);
        int wr = discard(c, len);
        if (wr == BW_OK)
            wr = send_error(&c->sock, NULL, rc, hint, msg);
        return rc == BW_UNAVAILABLE ? rc : wr;
    }
    uint8_t *body = bw__req_buffer(len);
    wbuf o;
    memset(&o, 0, sizeof(o));
    bw__req req;
    memset(&req, 0, sizeof(req));
    bw__rp *rp = NULL;
    bool hang_up = false;
    size_t got = 0;
    int status = BW_OK; /* what the client is told: END, or an ERROR frame's code */
    if (zstd && !c->zc)
        c->zc = ZSTD_createCCtx();
    if (!body || wbuf_init(&o, &c->sock) != BW_OK ||
        (zstd &&
         (!c->zc || wbuf_zinit(&o, c->zc, c->zlevel,
                               (c->features & BW_DCHAN_FEATURE_ZSTD_AUTO) != 0) != BW_OK))) {
        status = BW_NOMEM;
        rc = discard(c, len);
        if (rc == BW_OK)
            rc = send_error(&c->sock, NULL, BW_NOMEM, 0,
                            "data channel: out of memory for the request");
        hang_up = rc != BW_OK;
    } else if ((rc = bw__dsock_read_all(&c->sock, body, (size_t)len,
                                        bw__mono_ms() + BODY_TIMEOUT_MS, &got, err, sizeof(err))) !=
               BW_OK) {
        bw__log_limited(&c->srv->bad_log, BW_LOG_INFO,
                        "data channel: request body cut short peer=%s got=%zu of=%llu err=%s",
                        c->peer, got, (unsigned long long)len, err);
        status = rc;
        hang_up = true;
    } else {
        rc = bw__req_decode(&req, kind, body, (size_t)len, err, sizeof(err));
        bw__req_buffer_free(body);
        body = NULL;
        /* From here it holds its decoded message and its send buffers. */
        uint64_t keep = response + req.used;
        bw__exec_shrink(w->exec, charge, keep);
        charge = charge < keep ? charge : keep;
        const Batchwire__V1__ReadSamplesRequest *sr =
            rc == BW_OK && kind == BW_REQ_SAMPLES ? (const void *)req.msg : NULL;
        const Batchwire__V1__Dataset *ds =
            sr ? sr->dataset
            : rc == BW_OK && kind == BW_REQ_STREAM
                ? ((const Batchwire__V1__ReadStreamRequest *)req.msg)->dataset
                : NULL;
        bool several = sr && sr->n_datasets; /* checked when the read opens (read_path.c) */
        if (rc == BW_INVALID_ARGUMENT || (rc == BW_OK && !ds && !several)) {
            /* Not the message the header announced: a confused or hostile peer. */
            if (rc == BW_OK)
                snprintf(err, sizeof(err),
                         "data channel: the %llu-byte request is not a %sRequest with a dataset",
                         (unsigned long long)len, method);
            bw__log_limited(&c->srv->bad_log, BW_LOG_INFO,
                            "data channel: closing the connection peer=%s err=%s", c->peer, err);
            send_error(&c->sock, NULL, status = BW_INVALID_ARGUMENT, 0, err);
            hang_up = true;
        } else if (rc != BW_OK || (rc = bw__worker_grant_check(w, c->role, req.msg, c->peer, err,
                                                               sizeof(err))) != BW_OK) {
            hang_up = send_error(&c->sock, NULL, status = rc, 0, err) != BW_OK;
        } else {
            open_task ot;
            memset(&ot, 0, sizeof(ot));
            ot.w = w;
            ot.peer = c->peer;
            ot.req = req.msg;
            /* Opening or re-checking a dataset reads files: on the executor's threads, so
             * that only so many run at once. A dataset already open is checked here. */
            bool ready = several || bw__ds_ready(w->datasets, ds);
            for (size_t k = 0; several && ready && k < sr->n_datasets; k++)
                ready =
                    sr->datasets[k]->dataset && bw__ds_ready(w->datasets, sr->datasets[k]->dataset);
            if (ready)
                open_on_pool(&ot.t, BW_OK);
            else
                bw__exec_run(w->exec, &ot.t, open_on_pool);
            rp = ot.rp;
            status = ot.rc;
            o.runs = (c->features & BW_DCHAN_FEATURE_RUNS) && kind == BW_REQ_SAMPLES;
            rc = ot.rc == BW_OK ? serve_read(&o, rp, &status)
                                : send_error(&c->sock, NULL, ot.rc, 0, ot.err);
            hang_up = rc != BW_OK || ot.rc == BW_UNAVAILABLE;
            if (rc != BW_OK) {
                BW_DEBUG("data channel: request failed peer=%s err=%s", c->peer, o.err);
                status = status == BW_OK ? rc : status; /* the connection failed meanwhile */
            }
        }
    }
    bw__wm_end(w->metrics, BW_WM_DATA_CHANNEL, kind, t0, status);
    bw__rp_close(rp);
    bw__req_free(&req);
    wbuf_free(&o);
    bw__req_buffer_free(body);
    bw__exec_release(w->exec, charge);
    return hang_up ? BW_UNAVAILABLE : BW_OK;
}

/* ---- versions ---- */

/* FEATURES (kind 4): the bits the client understands, of which this worker uses those it
 * speaks on this connection, answered with END (docs/data-channel.md, "Versions"). Another
 * body size is malformed: BW_PROTOCOL, and the connection is closed. */
static int serve_features(conn *c, uint64_t len)
{
    char err[256];
    uint8_t body[BW_DCHAN_FEATURES_BODY];
    if (len != sizeof(body)) {
        snprintf(err, sizeof(err),
                 "data channel: a FEATURES request's body is %d bytes (a u64), not %llu",
                 BW_DCHAN_FEATURES_BODY, (unsigned long long)len);
        bw__log_limited(&c->srv->bad_log, BW_LOG_INFO,
                        "data channel: closing the connection peer=%s err=%s", c->peer, err);
        send_error(&c->sock, NULL, BW_PROTOCOL, 0, err);
        return BW_PROTOCOL;
    }
    int rc = bw__dsock_read_all(&c->sock, body, sizeof(body), bw__mono_ms() + BODY_TIMEOUT_MS, NULL,
                                err, sizeof(err));
    if (rc != BW_OK)
        return rc;
    uint64_t asked = bw__get_le64(body);
    c->features = asked & BW_DCHAN_FEATURES;
    /* Compression (docs/data-channel.md, "Compression"): ZRUN frames need RUN frames (a group
     * that does not shrink goes as a RUN), and --data-compress-max-level 0 turns it off; the
     * level is the one asked for (0: 1, which on token arrays compressed as well as zstd's
     * default 3 at 1.5 times its speed -- docs/performance.md, "Wire compression"), at most
     * the worker's maximum. */
    int64_t max = c->srv->w->cfg->data_compress_max_level;
    c->features &= ~BW_DCHAN_ZSTD_LEVEL_MASK;
    if (!(c->features & BW_DCHAN_FEATURE_RUNS) || max <= 0)
        c->features &= ~(BW_DCHAN_FEATURE_ZSTD | BW_DCHAN_FEATURE_ZSTD_AUTO);
    if (!(c->features & BW_DCHAN_FEATURE_ZSTD))
        c->features &= ~BW_DCHAN_FEATURE_ZSTD_AUTO;
    if (c->features & BW_DCHAN_FEATURE_ZSTD) {
        int64_t level = (int64_t)((asked & BW_DCHAN_ZSTD_LEVEL_MASK) >> BW_DCHAN_ZSTD_LEVEL_SHIFT);
        if (level == 0)
            level = 1;
        c->zlevel = (int)(level < max ? level : max);
        c->features |= (uint64_t)c->zlevel << BW_DCHAN_ZSTD_LEVEL_SHIFT;
    }
    uint8_t hdr[BW_DCHAN_FRAME_HEADER];
    bw_dchan_frame f = {BW_DCHAN_END, 0, 0, c->features};
    bw__dchan_put_frame(hdr, &f);
    struct iovec iov = {hdr, sizeof(hdr)};
    return bw__dsock_writev_all(&c->sock, &iov, 1, bw__mono_ms() + SEND_TIMEOUT_MS, err,
                                sizeof(err));
}

/* ---- credentials ---- */

/* The hello (kind AUTH): reads the token and checks it. BW_OK to keep the connection. */
static int serve_auth(conn *c, uint64_t len)
{
    bw_worker *w = c->srv->w;
    char err[512];
    if (len == 0 || len > BW_TOKEN_MAX) {
        snprintf(err, sizeof(err), "data channel: the hello's token is %llu bytes (1 to %d)",
                 (unsigned long long)len, BW_TOKEN_MAX);
        send_error(&c->sock, NULL, BW_UNAUTHENTICATED, 0, err);
        return BW_UNAUTHENTICATED;
    }
    char *token = malloc((size_t)len + 1);
    size_t got = 0;
    if (!token)
        return BW_NOMEM;
    int rc = bw__dsock_read_all(&c->sock, token, (size_t)len, bw__mono_ms() + BODY_TIMEOUT_MS, &got,
                                err, sizeof(err));
    if (rc != BW_OK) {
        free(token);
        return rc;
    }
    token[len] = 0;
    free(c->token);
    c->token = token;
    bw_principal who;
    rc = bw__auth_check(w->auth, BW_M_DATA_READ_SAMPLES, c->token,
                        c->cert_cn[0] ? c->cert_cn : NULL, &who, err, sizeof(err));
    if (rc != BW_OK) {
        bw__log_limited(&c->srv->bad_log, BW_LOG_INFO,
                        "data channel: refused the hello peer=%s code=%s err=%s", c->peer,
                        bw_err_name(rc), err);
        char msg[600];
        snprintf(msg, sizeof(msg), "data channel hello: %s", err);
        send_error(&c->sock, NULL, rc, 0, msg);
        return rc;
    }
    uint8_t hdr[BW_DCHAN_FRAME_HEADER];
    bw_dchan_frame f = {BW_DCHAN_END, 0, 0, 0};
    bw__dchan_put_frame(hdr, &f);
    struct iovec iov = {hdr, sizeof(hdr)};
    return bw__dsock_writev_all(&c->sock, &iov, 1, bw__mono_ms() + SEND_TIMEOUT_MS, err,
                                sizeof(err));
}

/* Whether the connection's credentials may call the method of `kind`; on refusal the body is
 * dropped, the error sent and logged, and the connection is to be closed. */
static int authorize(conn *c, uint32_t kind, uint64_t len)
{
    bw_worker *w = c->srv->w;
    if (!bw__auth_enabled(w->auth))
        return BW_OK;
    bw_method_id m = kind == BW_REQ_STREAM ? BW_M_DATA_READ_STREAM : BW_M_DATA_READ_SAMPLES;
    bw_principal who;
    char err[512];
    int rc = bw__auth_check(w->auth, m, c->token, c->cert_cn[0] ? c->cert_cn : NULL, &who, err,
                            sizeof(err));
    /* Without credentials (trainers send grants, not tokens): the request's grant is checked
     * once it is decoded (grant_check.c). */
    if (rc == BW_UNAUTHENTICATED && w->grants && !c->token) {
        who.role = BW_ROLE_NONE;
        rc = BW_OK;
    }
    c->role = who.role;
    if (rc == BW_OK)
        return BW_OK;
    bw__log_limited(&c->srv->bad_log, BW_LOG_INFO,
                    "data channel: refused a request peer=%s method=%s code=%s err=%s", c->peer,
                    bw__req_method(kind), bw_err_name(rc), err);
    char msg[600];
    snprintf(msg, sizeof(msg), "%s: %s", bw__req_method(kind), err);
    if (discard(c, len) == BW_OK)
        send_error(&c->sock, NULL, rc, 0, msg);
    return rc;
}

/* The subject common name of the verified client certificate, if any. */
static void peer_cert_name(conn *c)
{
    c->cert_cn[0] = 0;
    if (!c->sock.ssl)
        return;
    X509 *cert = SSL_get1_peer_certificate(c->sock.ssl);
    if (!cert)
        return;
    if (SSL_get_verify_result(c->sock.ssl) == X509_V_OK) {
        int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, c->cert_cn,
                                          (int)sizeof(c->cert_cn));
        if (n < 0 || (size_t)n >= sizeof(c->cert_cn) || strlen(c->cert_cn) != (size_t)n)
            c->cert_cn[0] = 0; /* absent, too long, or holding a NUL */
    }
    X509_free(cert);
}

/* ---- a connection ---- */

static void *serve(void *arg)
{
    conn *c = arg;
    bw_worker *w = c->srv->w;
    char err[1400];
    bool ok = true;
    /* A new connection has --data-hello-timeout-ms to finish its handshake and start its first
     * request (or hello): one that sends nothing holds a thread and a slot of its peer's only
     * that long (docs/data-channel.md). */
    uint64_t hello_by = bw__mono_ms() + (uint64_t)w->cfg->data_hello_timeout_ms;
    bool first = true;
    if (c->srv->tls &&
        bw__dsock_tls(&c->sock, c->srv->tls, NULL, hello_by, err, sizeof(err)) != BW_OK) {
        bw__log_limited(&c->srv->bad_log, BW_LOG_INFO,
                        "data channel: closing the connection peer=%s err=%s", c->peer, err);
        ok = false;
    }
    if (ok)
        peer_cert_name(c);
    while (ok && !atomic_load(&c->srv->stopping)) {
        uint8_t h[BW_DCHAN_REQ_HEADER];
        size_t got = 0;
        /* Between requests the connection sits in the client's pool: it is closed after
         * --data-idle-timeout-ms (the client then connects again); stop() shuts the socket
         * down to end the wait. */
        int64_t idle = w->cfg->data_idle_timeout_ms;
        uint64_t until = first ? hello_by : idle > 0 ? bw__mono_ms() + (uint64_t)idle : 0;
        int rc = bw__dsock_read_all(&c->sock, h, sizeof(h), until, &got, err, sizeof(err));
        if (rc == BW_TIMEOUT && first)
            bw__log_limited(&c->srv->bad_log, BW_LOG_INFO,
                            "data channel: closing a connection that sent no request peer=%s "
                            "hello_timeout_ms=%lld",
                            c->peer, (long long)w->cfg->data_hello_timeout_ms);
        else if (rc == BW_TIMEOUT && !got)
            BW_DEBUG("data channel: closing an idle connection peer=%s idle_ms=%lld", c->peer,
                     (long long)idle);
        first = false;
        if (rc != BW_OK) {
            if (got)
                BW_DEBUG("data channel: connection ended inside a request header peer=%s", c->peer);
            break;
        }
        uint32_t kind;
        uint64_t len;
        rc = bw__req_header(h, (uint64_t)w->cfg->max_request_bytes, "--max-request-bytes", &kind,
                            &len, err, sizeof(err));
        if (rc != BW_OK) {
            bw__log_limited(&c->srv->bad_log, BW_LOG_INFO,
                            "data channel: closing the connection peer=%s err=%s", c->peer, err);
            send_error(&c->sock, NULL, rc, 0, err);
            break;
        }
        if (kind == BW_DCHAN_KIND_AUTH)
            ok = serve_auth(c, len) == BW_OK;
        else if (kind == BW_DCHAN_KIND_FEATURES)
            ok = serve_features(c, len) == BW_OK;
        else
            ok = authorize(c, kind, len) == BW_OK && serve_request(c, kind, len) == BW_OK;
    }
    shutdown(c->sock.fd, SHUT_RDWR);
    atomic_store(&c->done, true);
    return NULL;
}

static void reap(bw__dchan_server *s, bool all)
{
    pthread_mutex_lock(&s->mu);
    conn **pp = &s->conns;
    while (*pp) {
        conn *c = *pp;
        if (all)
            shutdown(c->sock.fd, SHUT_RDWR);
        if (all || atomic_load(&c->done)) {
            pthread_join(c->th, NULL);
            bw__dsock_close(&c->sock);
            *pp = c->next;
            s->nconns--;
            free(c->token);
            ZSTD_freeCCtx(c->zc);
            free(c);
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* "HOST:PORT" into c->peer (for logs) and HOST into c->host (numeric). */
static void peer_name(int fd, conn *c)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char port[16] = "?";
    snprintf(c->host, sizeof(c->host), "?");
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        getnameinfo((struct sockaddr *)&ss, sl, c->host, sizeof(c->host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(c->peer, sizeof(c->peer), "%s:%s", c->host, port);
}

/* Connections open now from host (s->mu held). */
static size_t from_host(const bw__dchan_server *s, const char *host)
{
    size_t n = 0;
    for (const conn *c = s->conns; c; c = c->next)
        n += strcmp(c->host, host) == 0;
    return n;
}

static void *accept_loop(void *arg)
{
    bw__dchan_server *s = arg;
    while (!atomic_load(&s->stopping)) {
        struct pollfd p = {s->lfd, POLLIN, 0};
        int n = poll(&p, 1, ACCEPT_POLL_MS);
        reap(s, false);
        if (n <= 0)
            continue;
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                usleep(ACCEPT_POLL_MS * 1000); /* out of descriptors: let connections end */
            continue;
        }
        bw__sock_tune(fd);
        conn *c = calloc(1, sizeof(*c));
        if (!c) {
            BW_WARN("data channel: out of memory for a new connection; closing it");
            close(fd);
            continue;
        }
        c->sock = (bw_dsock){fd, NULL};
        c->srv = s;
        peer_name(fd, c);
        pthread_mutex_lock(&s->mu);
        bool full = s->nconns >= (size_t)s->w->cfg->data_max_connections;
        /* one host cannot take every slot (docs/data-channel.md, "Connections") */
        bool peer_full =
            !full && from_host(s, c->host) >= (size_t)s->w->cfg->data_max_connections_per_peer;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, THREAD_STACK);
        bool started = !full && !peer_full && pthread_create(&c->th, &attr, serve, c) == 0;
        pthread_attr_destroy(&attr);
        if (started) {
            c->next = s->conns;
            s->conns = c;
            s->nconns++;
        }
        pthread_mutex_unlock(&s->mu);
        if (!started) {
            char msg[200];
            if (peer_full)
                snprintf(msg, sizeof(msg),
                         "data channel: this peer address holds %lld connections, the worker's "
                         "limit per peer (--data-max-connections-per-peer)",
                         (long long)s->w->cfg->data_max_connections_per_peer);
            else
                snprintf(msg, sizeof(msg),
                         "data channel: the worker is at its limit of %lld connections%s",
                         (long long)s->w->cfg->data_max_connections,
                         full ? "" : " (it cannot start another thread)");
            uint64_t now = bw__mono_ms();
            if (!s->refused_logged_ms || now - s->refused_logged_ms >= 10000) {
                BW_WARN("data channel: connection refused; such clients fetch over gRPC peer=%s "
                        "refused_since_last_warning=%llu err=%s",
                        c->peer, (unsigned long long)s->refused_quiet, msg);
                s->refused_logged_ms = now;
                s->refused_quiet = 0;
            } else {
                s->refused_quiet++;
            }
            if (!s->tls) /* over TLS the refusal is the closed connection (no handshake) */
                send_error(&c->sock, NULL, BW_UNAVAILABLE, 0, msg);
            close(fd);
            free(c);
        }
    }
    return NULL;
}

int bw__dchan_server_start(bw_worker *w, const char *listen, SSL_CTX *tls, bw__dchan_server **out,
                           int *port, char *err, size_t errlen)
{
    *out = NULL;
    bw__dchan_server *s = calloc(1, sizeof(*s));
    if (!s) {
        bw__dchan_tls_ctx_free(tls);
        snprintf(err, errlen, "data channel: out of memory");
        return BW_NOMEM;
    }
    s->w = w;
    s->tls = tls;
    int rc = bw__sock_listen(listen, &s->lfd, port, err, errlen);
    if (rc != BW_OK) {
        bw__dchan_tls_ctx_free(tls);
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    if (pthread_create(&s->th, NULL, accept_loop, s) != 0) {
        snprintf(err, errlen, "data channel: cannot start its thread");
        close(s->lfd);
        pthread_mutex_destroy(&s->mu);
        bw__dchan_tls_ctx_free(tls);
        free(s);
        return BW_INTERNAL;
    }
    *out = s;
    return BW_OK;
}

size_t bw__dchan_server_connections(bw__dchan_server *s)
{
    if (!s)
        return 0;
    pthread_mutex_lock(&s->mu);
    size_t n = s->nconns;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void bw__dchan_server_stop(bw__dchan_server *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, true);
    pthread_join(s->th, NULL);
    close(s->lfd);
    reap(s, true);
    pthread_mutex_destroy(&s->mu);
    bw__dchan_tls_ctx_free(s->tls);
    free(s);
}
