/* Decoding SampleBatch messages straight from gRPC's receive slices: each sample's bytes are
 * copied once, from the slices into their place in the batch, instead of being flattened
 * into one buffer, unpacked into another and copied a third time (see docs/performance.md). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>

#include "batchwire/batchwire.h"
#include "sample_decode.h"

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
