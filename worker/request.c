/* Request limits, charges and bounded decoding (request.h). */
#include "request.h"

#include "rpc/proto_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "batchwire/batchwire.h"
#include "data.h"

enum {
    DECODE_BASE = 1 << 20, /* protobuf-c's scan state and the small fields of any request */
    HEADER = 16,           /* before every block: its size and how it was obtained */
    MAP_MIN = 256 << 10,   /* blocks this large are mapped, and unmapped when freed */
    CHUNK = 8 << 10,       /* the request's chunks of small pieces */
    PIECE_MAX = 1 << 10,   /* pieces up to this size are cut from a chunk */
};

int bw__req_header(const uint8_t h[BW_DCHAN_REQ_HEADER], uint64_t max_request, const char *flag,
                   uint32_t *kind, uint64_t *length, char *err, size_t errlen)
{
    int rc = bw__dchan_get_req_header(h, kind, length, err, errlen);
    if (rc == BW_PROTOCOL)
        return rc;
    if (rc == BW_TOO_BIG || *length > max_request) {
        snprintf(err, errlen,
                 "data channel: the request header announces a %llu-byte body, more than this "
                 "worker's limit of %llu bytes (%s); the body was not read",
                 (unsigned long long)*length, (unsigned long long)max_request, flag);
        return BW_TOO_BIG;
    }
    return rc;
}

uint64_t bw__req_decode_cap(uint32_t kind, uint64_t length)
{
    /* Strings cost a pointer, a copy and this allocator's header: about 4 bytes per byte of
     * realistic paths. Indices cost 8 bytes each, and one byte of body can be one index. */
    uint64_t cap = DECODE_BASE + 4 * length;
    if (kind == BW_REQ_SAMPLES)
        cap += 8 * (length < BW_DATA_MAX_INDICES + 1 ? length : BW_DATA_MAX_INDICES + 1);
    return cap;
}

uint64_t bw__req_charge(uint32_t kind, uint64_t length, unsigned copies, uint64_t response)
{
    return copies * length + bw__req_decode_cap(kind, length) + response;
}

const ProtobufCMessageDescriptor *bw__req_descriptor(uint32_t kind)
{
    return kind == BW_REQ_STREAM    ? &batchwire__v1__read_stream_request__descriptor
           : kind == BW_REQ_SAMPLES ? &batchwire__v1__read_samples_request__descriptor
                                    : NULL;
}

const char *bw__req_method(uint32_t kind)
{
    return kind == BW_REQ_STREAM    ? "ReadStream"
           : kind == BW_REQ_SAMPLES ? "ReadSamples"
                                    : "request";
}

/* ---- blocks: malloc'd when small, mapped when large ---- */

static void *block_alloc(size_t size, size_t *total)
{
    if (size > SIZE_MAX - HEADER - 4096)
        return NULL;
    size_t t = size + HEADER;
    uint8_t *p;
    if (t >= MAP_MIN) {
        t = (t + 4095) & ~(size_t)4095;
        p = mmap(NULL, t, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
    } else {
        p = malloc(t);
        if (!p)
            return NULL;
    }
    memcpy(p, &t, sizeof(t));
    *total = t;
    return p + HEADER;
}

static size_t block_free(void *q)
{
    if (!q)
        return 0;
    uint8_t *p = (uint8_t *)q - HEADER;
    size_t t;
    memcpy(&t, p, sizeof(t));
    if (t >= MAP_MIN)
        munmap(p, t);
    else
        free(p);
    return t;
}

void *bw__req_buffer(size_t len)
{
    size_t t;
    return block_alloc(len, &t);
}

void bw__req_buffer_free(void *p)
{
    block_free(p);
}

/* ---- the counting allocator protobuf-c decodes with ---- */

/* A piece of the newest chunk (a new chunk when it does not fit), after a header of zeros
 * (a block's header holds its size: count_free tells them apart); NULL when a chunk would
 * pass the cap or memory is out (the caller takes a block instead). Freed with the request's
 * chunks (chunks_free), never alone. */
static void *piece_alloc(bw__req *r, size_t size)
{
    size_t need = HEADER + ((size + 15) & ~(size_t)15);
    if (!r->chunks || r->chunk_at + need > CHUNK) {
        if (r->used + CHUNK > r->cap)
            return NULL;
        uint8_t *c = malloc(CHUNK);
        if (!c)
            return NULL;
        memcpy(c, &r->chunks, sizeof(r->chunks)); /* the chunk before */
        r->chunks = c;
        r->chunk_at = HEADER;
        r->used += CHUNK;
    }
    uint8_t *p = (uint8_t *)r->chunks + r->chunk_at;
    r->chunk_at += need;
    memset(p, 0, HEADER);
    return p + HEADER;
}

/* The request's chunks, and what is counted for them. */
static void chunks_free(bw__req *r)
{
    for (uint8_t *c = r->chunks; c;) {
        uint8_t *next;
        memcpy(&next, c, sizeof(next));
        free(c);
        r->used -= CHUNK;
        c = next;
    }
    r->chunks = NULL;
    r->chunk_at = 0;
}

static void *count_alloc(void *ud, size_t size)
{
    bw__req *r = ud;
    size_t t;
    if (size > r->cap || r->used + size + HEADER > r->cap) {
        r->refused = true;
        return NULL;
    }
    void *p = size <= PIECE_MAX ? piece_alloc(r, size) : NULL;
    if (p)
        return p;
    p = block_alloc(size, &t);
    if (!p) {
        r->refused = true;
        return NULL;
    }
    r->used += t;
    return p;
}

static void count_free(void *ud, void *p)
{
    bw__req *r = ud;
    size_t t = 0;
    if (p)
        memcpy(&t, (uint8_t *)p - HEADER, sizeof(t));
    if (t) /* a block; a piece (0) goes with its chunk */
        r->used -= block_free(p);
}

int bw__req_decode(bw__req *r, uint32_t kind, const uint8_t *body, size_t len, char *err,
                   size_t errlen)
{
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->cap = bw__req_decode_cap(kind, len);
    r->pb.alloc = count_alloc;
    r->pb.free = count_free;
    r->pb.allocator_data = r;
    const ProtobufCMessageDescriptor *d = bw__req_descriptor(kind);
    if (!d) { /* only read requests decode here (the hello, kind 3, is the data channel's) */
        snprintf(err, errlen,
                 "request kind %u is not a read request (ReadSamples %d, ReadStream %d)", kind,
                 BW_REQ_SAMPLES, BW_REQ_STREAM);
        return BW_INVALID_ARGUMENT;
    }
    char why[384];
    int rc = bw__proto_check(d, body, len, why, sizeof(why));
    if (rc != BW_OK) {
        snprintf(err, errlen, "%s: %s", bw__req_method(kind), why);
        return rc;
    }
    r->msg = protobuf_c_message_unpack(d, &r->pb, len, body);
    if (r->msg)
        return BW_OK;
    chunks_free(r); /* protobuf-c freed the rest */
    if (r->refused) {
        snprintf(err, errlen,
                 "%s: decoding the %zu-byte request needs more than the %llu bytes of memory it "
                 "may use%s",
                 bw__req_method(kind), len, (unsigned long long)r->cap,
                 kind == BW_REQ_SAMPLES ? " (a request carries at most 1048576 indices)" : "");
        return BW_TOO_BIG;
    }
    snprintf(err, errlen, "%s: the %zu-byte request is not a valid %s", bw__req_method(kind), len,
             d->name);
    return BW_INVALID_ARGUMENT;
}

void bw__req_free(bw__req *r)
{
    if (r->msg)
        protobuf_c_message_free_unpacked(r->msg, &r->pb);
    r->msg = NULL;
    chunks_free(r);
}
