/*
 * Checks a serialized request before protobuf-c decodes it, for what protobuf-c does not
 * check (docs/security.md, "Input limits"): every string field is valid UTF-8 without a NUL
 * byte (protobuf-c would silently cut "a\0b" to "a"), no string is longer than
 * BW_PROTO_STRING_MAX bytes, no repeated field has more than BW_PROTO_REPEATED_MAX elements,
 * and messages nest at most BW_PROTO_DEPTH_MAX deep. Unknown fields are skipped (a newer
 * client's); malformed wire data is left for the decoder to refuse.
 */
#ifndef BW_RPC_PROTO_CHECK_H
#define BW_RPC_PROTO_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

enum {
    BW_PROTO_STRING_MAX = 4096,
    BW_PROTO_REPEATED_MAX = 1 << 20,
    BW_PROTO_DEPTH_MAX = 16,
};

/* BW_OK; BW_INVALID_ARGUMENT (a bad string, or nesting too deep) or BW_TOO_BIG (a string or
 * repeated field over its bound) with a sentence naming the field ("JoinJobRequest.job: ...")
 * in err. */
int bw__proto_check(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, char *err,
                    size_t errlen);

#endif
