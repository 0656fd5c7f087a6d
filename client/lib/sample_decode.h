/* Decoding a gRPC SampleBatch straight into the places a caller gives: the gRPC transport's
 * own wire format, defined in transport_grpc.c (declared here for its unit test and fuzz
 * target). Nothing here is part of the public API. */
#ifndef BW_CLIENT_SAMPLE_DECODE_H
#define BW_CLIENT_SAMPLE_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Called for each sample (or chunk of one) in a SampleBatch before its data is copied: checks
 * the header and sets *dest to where the len data bytes go (NULL: nowhere, len is 0). */
typedef int (*bw__sample_place_fn)(void *ctx, uint64_t index, uint64_t size, uint64_t chunk_offset,
                                   uint64_t len, uint8_t **dest, char *err, size_t errlen);

/* Called once the len bytes of the chunk place() last gave a place for have landed there. */
typedef void (*bw__sample_arrived_fn)(void *ctx, uint64_t len);

/* What decoding learned across messages: the next_offset of the last complete stream record.
 * locate_only is set by the caller: the request was a ReadStream that only locates a record,
 * which gRPC answers with one empty sample carrying the offset (the data channel says it in
 * END): that sample is not passed to place() or arrived(). */
typedef struct bw__decoded {
    bool has_next_offset;
    uint64_t next_offset;
    bool locate_only;
} bw__decoded;

/* Decodes a SampleBatch straight from the received slices, copying each sample's bytes once
 * into the place `place` gives, then telling `arrived` (may be NULL). BW_OK, BW_PROTOCOL for
 * a malformed message, or place's error. */
struct grpc_byte_buffer;
int bw__decode_sample_batch(struct grpc_byte_buffer *bb, bw__sample_place_fn place,
                            bw__sample_arrived_fn arrived, void *ctx, bw__decoded *last, char *err,
                            size_t errlen);

#endif
