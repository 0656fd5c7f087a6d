/* A generic protobuf-c helper: what differs between two messages of one type, in words. */
#ifndef BW_RPC_PBDIFF_H
#define BW_RPC_PBDIFF_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

/* A field whose value reads better in other units than the wire's (a mixture's weight, kept
 * in units of 10^-9): format writes the value at value (the field's storage, one element)
 * as text. */
typedef struct bw__pb_diff_format {
    const ProtobufCMessageDescriptor *message; /* the message type holding the field */
    const char *field;                         /* the field's name */
    void (*format)(const void *value, char *out, size_t outlen);
} bw__pb_diff_format;

/* "x.y: A has 1, B has 2; z: A has [1, 2], B has []" into out for every field that differs
 * between a and b (both of type desc; A and B are a_name and b_name), "" if none. Sub-messages
 * are compared field by field (a missing one like an empty one), repeated sub-messages element
 * by element when their counts agree; strings are cut at 100 bytes and bytes shown by length.
 * A field named in formats (nformats entries; NULL/0: none) is shown by its formatter. A
 * difference that does not fit in outlen is cut. */
void bw__pb_diff(const ProtobufCMessageDescriptor *desc, const ProtobufCMessage *a,
                 const char *a_name, const ProtobufCMessage *b, const char *b_name,
                 const bw__pb_diff_format *formats, size_t nformats, char *out, size_t outlen);

#endif
