/*
 * The gRPC side of the read path: SampleBatch messages built from the records an open read
 * (read_path.h) yields, encoded by hand around file memory. protobuf-c would need every
 * sample copied into the message; here the small framing bytes (and samples under REF_MIN)
 * are copied into buffers we own, while larger payloads become gRPC slices that point into
 * the mapped file and hold a reference on the mapping until gRPC has sent them. The bytes on
 * the wire are an ordinary SampleBatch (test_formats_wire checks with protobuf-c).
 *
 * Messages are filled in request order up to about SOFT_TARGET bytes (never past the limit);
 * a sample that does not fit in what is left starts the next message, and a sample larger than
 * twice the target (or than the limit) is cut into chunks (Sample.chunk_offset) of about the
 * target, one message each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/slice.h>

#include "read_path.h"

/* SOFT_TARGET: large messages cost more than they save (bench_worker: 16 MiB messages ran at
 * half the rate of 1 MiB ones over loopback), so messages close at about 1 MiB even when the
 * limit allows more. */
enum { REF_MIN = 32 << 10, BUF_MIN = 256 << 10, SLACK = 256, SOFT_TARGET = 1 << 20 };

struct bw__sstream {
    bw__rp *rp;
    size_t limit;  /* hard: no message is larger */
    size_t soft;   /* messages are closed at about this size */
    bool records;  /* ReadStream: samples carry offsets */
    bool located;  /* locate_only: the one answer was produced */
    bool have;     /* the record being sent (possibly in chunks) */
    uint64_t sent; /* its bytes already sent */
    bw__rp_rec cur;
};

/* ---- a message under construction: owned buffers and referencing slices ---- */

typedef struct wire {
    grpc_slice *slices;
    size_t n, cap;
    uint8_t *buf;
    size_t len, bufcap;
    bool oom; /* an allocation failed: the message is abandoned */
} wire;

static void add_slice(wire *w, grpc_slice s)
{
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        grpc_slice *ns = realloc(w->slices, cap * sizeof(*ns));
        if (!ns) {
            w->oom = true;
            grpc_slice_unref(s);
            return;
        }
        w->slices = ns;
        w->cap = cap;
    }
    w->slices[w->n++] = s;
}

static void flush_buf(wire *w)
{
    if (w->buf && w->len)
        add_slice(w, grpc_slice_new(w->buf, w->len, free));
    else
        free(w->buf);
    w->buf = NULL;
    w->len = w->bufcap = 0;
}

/* Space for `need` more bytes in the owned buffer; NULL (and w->oom) when out of memory. */
static uint8_t *room(wire *w, size_t need)
{
    if (w->bufcap - w->len < need) {
        flush_buf(w);
        size_t cap = need > BUF_MIN ? need : BUF_MIN;
        w->buf = malloc(cap);
        if (!w->buf) {
            w->oom = true;
            return NULL;
        }
        w->bufcap = cap;
    }
    return w->buf + w->len;
}

static void put_bytes(wire *w, const void *p, size_t len)
{
    uint8_t *q = len ? room(w, len) : NULL;
    if (!q)
        return;
    memcpy(q, p, len);
    w->len += len;
}

static void put_varint(wire *w, uint64_t v)
{
    uint8_t *p = room(w, 10), *q = p;
    if (!p)
        return;
    while (v >= 0x80) {
        *q++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *q++ = (uint8_t)v;
    w->len += (size_t)(q - p);
}

static void unref_mapping(void *m)
{
    bw__mapping_unref(m);
}

static void put_ref(wire *w, bw__mapping *m, const uint8_t *p, size_t len)
{
    flush_buf(w);
    bw__mapping_ref(m);
    add_slice(w, grpc_slice_new_with_user_data((void *)p, len, unref_mapping, m));
}

static void wire_free(wire *w)
{
    for (size_t i = 0; i < w->n; i++)
        grpc_slice_unref(w->slices[i]);
    free(w->slices);
    free(w->buf);
    memset(w, 0, sizeof(*w));
}

static grpc_byte_buffer *wire_finish(wire *w)
{
    flush_buf(w);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(w->slices, w->n);
    wire_free(w); /* the byte buffer holds its own references */
    return bb;
}

/* ---- Sample encoding ---- */

static size_t vlen(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t field_len(size_t payload)
{
    return 1 + vlen(payload) + payload;
}

/* Bytes of a Sample's fields other than data. */
static size_t meta_size(const bw__sstream *st, uint64_t chunk_off)
{
    const bw__record *r = &st->cur.rec;
    size_t m = 1 + vlen(st->cur.key) + 1 + vlen(r->size);
    if (chunk_off)
        m += 1 + vlen(chunk_off);
    if (chunk_off == 0 && r->has_names) {
        for (size_t i = 0; i < r->nparts; i++) {
            size_t nl = strlen(r->text + r->names[i]);
            m += field_len(field_len(nl) + 1 + vlen(r->parts[i].len));
        }
        m += field_len(strlen(r->text + r->key));
    }
    if (st->records)
        m += 1 + vlen(st->cur.offset) + 1 + vlen(st->cur.next_offset);
    return m;
}

static size_t item_size(size_t meta, size_t dlen)
{
    return field_len(meta + field_len(dlen));
}

static void put_tag(wire *w, unsigned field, unsigned type)
{
    put_varint(w, (uint64_t)(field << 3 | type));
}

static void put_data_range(wire *w, const bw__record *r, uint64_t from, size_t len)
{
    for (size_t i = 0; i < r->nparts && len; i++) {
        const bw__span *p = &r->parts[i];
        if (from >= p->len) {
            from -= p->len;
            continue;
        }
        size_t take = p->len - from < len ? (size_t)(p->len - from) : len;
        if (take >= REF_MIN)
            put_ref(w, bw__record_owner(r, i), p->p + from, take);
        else
            put_bytes(w, p->p + from, take);
        len -= take;
        from = 0;
    }
}

static void put_sample(wire *w, const bw__sstream *st, uint64_t chunk_off, size_t dlen)
{
    const bw__record *r = &st->cur.rec;
    size_t meta = meta_size(st, chunk_off);
    put_tag(w, 1, 2); /* SampleBatch.samples */
    put_varint(w, meta + field_len(dlen));
    put_tag(w, 1, 0);
    put_varint(w, st->cur.key);
    put_tag(w, 2, 0);
    put_varint(w, r->size);
    if (chunk_off) {
        put_tag(w, 3, 0);
        put_varint(w, chunk_off);
    }
    if (chunk_off == 0 && r->has_names) {
        for (size_t i = 0; i < r->nparts; i++) {
            const char *name = r->text + r->names[i];
            size_t nl = strlen(name);
            put_tag(w, 5, 2);
            put_varint(w, field_len(nl) + 1 + vlen(r->parts[i].len));
            put_tag(w, 1, 2);
            put_varint(w, nl);
            put_bytes(w, name, nl);
            put_tag(w, 2, 0);
            put_varint(w, r->parts[i].len);
        }
        const char *key = r->text + r->key;
        put_tag(w, 6, 2);
        put_varint(w, strlen(key));
        put_bytes(w, key, strlen(key));
    }
    if (st->records) {
        put_tag(w, 7, 0);
        put_varint(w, st->cur.offset);
        put_tag(w, 8, 0);
        put_varint(w, st->cur.next_offset);
    }
    put_tag(w, 4, 2);
    put_varint(w, dlen);
    put_data_range(w, r, chunk_off, dlen);
}

/* ---- the producer ---- */

bw__sstream *bw__sstream_new(bw__rp *rp, size_t limit)
{
    bw__sstream *st = rp ? calloc(1, sizeof(*st)) : NULL;
    if (!st) {
        bw__rp_close(rp);
        return NULL;
    }
    st->rp = rp;
    st->records = bw__rp_is_stream(rp);
    st->limit = limit > SLACK * 2 ? limit - SLACK : limit / 2;
    st->soft = st->limit < SOFT_TARGET ? st->limit : SOFT_TARGET;
    return st;
}

bw__sstream *bw__sstream_samples(bw__wds *e, const uint64_t *indices, size_t n, size_t limit,
                                 bw__data_stats *stats)
{
    return bw__sstream_new(bw__rp_samples(e, indices, n, stats), limit);
}

bw__sstream *bw__sstream_records(bw__wds *e, uint32_t src, uint64_t offset, uint64_t first_record,
                                 uint64_t max_records, size_t limit, bw__data_stats *stats)
{
    return bw__sstream_new(bw__rp_records(e, src, offset, first_record, max_records, stats), limit);
}

void bw__sstream_free(void *state)
{
    bw__sstream *st = state;
    if (!st)
        return;
    if (st->have)
        bw__record_release(&st->cur.rec);
    bw__rp_close(st->rp);
    free(st);
}

/* Loads the next record into st->cur: BW_OK, BW_RPC_END or an error. With locate_only the
 * one record is an empty sample whose offsets are first_record's. */
static int load(bw__sstream *st, char *err, size_t errlen)
{
    int rc;
    if (bw__rp_locate_only(st->rp)) {
        if (st->located)
            return BW_RPC_END;
        bw__record_init(&st->cur.rec);
        st->cur.key = bw__rp_first_key(st->rp);
        st->cur.offset = st->cur.next_offset = bw__rp_end_offset(st->rp);
        st->located = true;
        rc = BW_OK;
    } else {
        rc = bw__rp_next(st->rp, &st->cur, err, errlen);
        if (rc == BW_RP_END)
            return BW_RPC_END;
    }
    if (rc == BW_OK) {
        st->have = true;
        st->sent = 0;
    }
    return rc;
}

static void done_record(bw__sstream *st)
{
    bw__record_release(&st->cur.rec);
    st->have = false;
}

int bw__sstream_produce(bw__sstream *st, grpc_byte_buffer **out, char *err, size_t errlen)
{
    wire w;
    memset(&w, 0, sizeof(w));
    size_t used = 0;
    int rc = BW_OK;
    for (;;) {
        if (!st->have) {
            rc = load(st, err, errlen);
            if (rc != BW_OK)
                break;
        }
        uint64_t left = st->cur.rec.size - st->sent;
        size_t meta = meta_size(st, st->sent);
        size_t whole = left < SIZE_MAX / 2 ? item_size(meta, (size_t)left) : SIZE_MAX;
        /* Fill up to the soft target; a sample up to twice that may travel alone. */
        if ((used > 0 && used + whole <= st->soft) ||
            (used == 0 && whole <= st->limit && whole <= 2 * st->soft)) {
            put_sample(&w, st, st->sent, (size_t)left);
            used += whole;
            done_record(st);
            continue;
        }
        if (used > 0)
            break; /* starts the next message */
        /* A chunk of a large sample: as much as the soft target allows (varints of at most
         * 10 bytes each). */
        size_t avail = st->soft;
        size_t over = meta + 2 * (1 + 10);
        if (avail <= over) {
            snprintf(err, errlen, "message limit of %zu bytes is too small for a sample's header",
                     st->limit);
            rc = BW_INTERNAL;
            break;
        }
        size_t dlen = avail - over;
        if (dlen > left)
            dlen = (size_t)left;
        put_sample(&w, st, st->sent, dlen);
        used += item_size(meta, dlen);
        st->sent += dlen;
        if (st->sent == st->cur.rec.size)
            done_record(st);
        break;
    }
    /* Send what was built; an error is raised again by the next call (load is retried). */
    if (rc != BW_OK && used > 0)
        rc = BW_OK;
    if (rc == BW_OK && w.oom) {
        snprintf(err, errlen, "out of memory building a message");
        rc = BW_NOMEM;
    }
    if (rc != BW_OK) {
        wire_free(&w);
        return rc;
    }
    *out = wire_finish(&w);
    return BW_OK;
}

int bw__sstream_next(void *state, bw_rpc_call *call, bw_rpc_out *out)
{
    bw__sstream *st = state;
    if (bw__rpc_call_cancelled(call))
        return bw__rpc_fail(call, BW_CANCELLED, "deadline passed while streaming");
    char err[1024];
    int rc = bw__sstream_produce(st, &out->raw, err, sizeof(err));
    if (rc != BW_OK && rc != BW_RPC_END)
        return bw__rpc_fail(call, rc, "%s", err);
    return rc;
}
