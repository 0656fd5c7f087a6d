/*
 * A Data request as the worker receives it, whatever the transport: its size limit
 * (--max-request-bytes), the memory it is charged against the in-flight budget, and its
 * decoding, bounded by that charge. gRPC ReadSamples/ReadStream bodies and data-channel
 * bodies (core/rpc/dchan.h) go through the same functions (fuzz/fuzz_worker_request.c feeds
 * both).
 */
#ifndef BW_WORKER_REQUEST_H
#define BW_WORKER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

#include "rpc/dchan.h"
#include "rpc/methods.h"

/* The two kinds of read, numbered as on the data channel. */
enum { BW_REQ_SAMPLES = BW_DCHAN_KIND_READ_SAMPLES, BW_REQ_STREAM = BW_DCHAN_KIND_READ_STREAM };

/* What a request's response may hold in memory of its own while it is served (the rest
 * points into mapped files): the gRPC encoder keeps one message of about 1 MiB, up to 2 MiB
 * for a sample sent whole, and gRPC's write buffers about as much again; the data channel
 * keeps its staging buffer, iovec and pending records (data_channel.c). */
enum { BW_REQ_RESPONSE_GRPC = 4 << 20 };

/* Checks a data-channel request header against the worker's limit: BW_OK with kind and
 * length; BW_PROTOCOL (not "BWD1", unknown kind) or BW_TOO_BIG with a sentence that names the
 * announced size, the limit and `flag` ("--max-request-bytes"). */
int bw__req_header(const uint8_t h[BW_DCHAN_REQ_HEADER], uint64_t max_request, const char *flag,
                   uint32_t *kind, uint64_t *length, char *err, size_t errlen);

/* The most decoding a `length`-byte request of `kind` may allocate: protobuf-c allocates 8
 * bytes per index (only the first 2^20 + 1 can be served), a pointer and a copy per string,
 * and its scan state; a body that needs more fails to decode with BW_TOO_BIG. */
uint64_t bw__req_decode_cap(uint32_t kind, uint64_t length);

/* A request's charge: `copies` of its body held at once (the data channel reads it once;
 * gRPC holds its own buffer and a flat copy), its decoding cap and `response` bytes. */
uint64_t bw__req_charge(uint32_t kind, uint64_t length, unsigned copies, uint64_t response);

/* A decoded request. `msg` is a ReadSamplesRequest (BW_REQ_SAMPLES) or a ReadStreamRequest
 * (BW_REQ_STREAM); its memory is counted and capped. Its small pieces (strings, nested
 * messages, short index arrays) are cut from chunks of its own, freed with it: one malloc and
 * free per piece was about a tenth of a mixture request's decoding (docs/performance.md,
 * "The workers' CPU for a mixture"). */
typedef struct bw__req {
    uint32_t kind;
    ProtobufCMessage *msg;
    ProtobufCAllocator pb;
    uint64_t cap, used; /* used counts whole chunks */
    bool refused;       /* an allocation went past the cap */
    void *chunks;       /* the chunks, newest first (each starts with the one before) */
    size_t chunk_at;    /* the newest chunk's next free byte */
} bw__req;

/* The descriptor and method name of a kind ("ReadSamples", "ReadStream"); for any other kind
 * NULL and "request". */
const ProtobufCMessageDescriptor *bw__req_descriptor(uint32_t kind);
const char *bw__req_method(uint32_t kind);

/* Decodes body[0..len) as `kind` with memory capped at bw__req_decode_cap. BW_OK with r->msg;
 * BW_TOO_BIG when decoding needed more than the cap; BW_INVALID_ARGUMENT when the bytes are
 * not such a message, or `kind` is not a read (the data channel's hello, kind 3, included). A
 * sentence in err on failure; r holds nothing then. Free with bw__req_free. */
int bw__req_decode(bw__req *r, uint32_t kind, const uint8_t *body, size_t len, char *err,
                   size_t errlen);

/* Frees the decoded message. Safe on a zeroed or already freed bw__req. */
void bw__req_free(bw__req *r);

/* Memory for a request body: large buffers are mapped and unmapped again when freed, so that
 * a burst of large requests leaves nothing behind (the worker's malloc keeps freed memory).
 * NULL when out of memory. */
void *bw__req_buffer(size_t len);
void bw__req_buffer_free(void *p);

#endif
