/* Checks of a serialized request before protobuf-c decodes it (proto_check.h,
 * docs/security.md "Input limits"): UTF-8 strings without NUL, string, repeated and depth
 * limits. */
#include "rpc/proto_check.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/text.h"

/* Reads a varint at *i; false when the bytes end first or it is longer than 10 bytes. */
static bool varint(const uint8_t *p, size_t n, size_t *i, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 70 && *i < n; shift += 7) {
        uint8_t b = p[(*i)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* The bytes of one element of a packed field of this type: 4 or 8 for the fixed-size types,
 * 0 for varints. */
static size_t fixed_width(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return 4;
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    default:
        return 0;
    }
}

static int check(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, int depth,
                 char *err, size_t errlen)
{
    if (depth > BW_PROTO_DEPTH_MAX) {
        snprintf(err, errlen, "%s: messages nest more than %d deep", d->name, BW_PROTO_DEPTH_MAX);
        return BW_INVALID_ARGUMENT;
    }
    /* Elements seen so far of each field, by field index, for the repeated bound. */
    uint32_t stack_counts[32];
    uint32_t *counts = d->n_fields <= 32 ? stack_counts : calloc(d->n_fields, sizeof(*counts));
    if (!counts) {
        snprintf(err, errlen, "%s: out of memory checking the request", d->name);
        return BW_NOMEM;
    }
    memset(counts, 0, d->n_fields * sizeof(*counts));
    int rc = BW_OK;
    size_t i = 0;
    while (rc == BW_OK && i < n) {
        uint64_t key, len = 0;
        if (!varint(p, n, &i, &key))
            break; /* malformed: the decoder refuses it */
        unsigned wire = (unsigned)(key & 7);
        const ProtobufCFieldDescriptor *f =
            key >> 3 <= UINT32_MAX
                ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3))
                : NULL;
        size_t start = i;
        if (wire == 0) {
            uint64_t v;
            if (!varint(p, n, &i, &v))
                break;
        } else if (wire == 1) {
            i += 8;
        } else if (wire == 5) {
            i += 4;
        } else if (wire == 2) {
            if (!varint(p, n, &i, &len) || len > n - i)
                break;
            start = i;
            i += (size_t)len;
        } else {
            break; /* groups and invalid wire types: the decoder refuses them */
        }
        if (i > n || !f)
            continue;
        uint64_t elems = 1;
        if (wire == 2 && f->label == PROTOBUF_C_LABEL_REPEATED &&
            f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_BYTES &&
            f->type != PROTOBUF_C_TYPE_MESSAGE) {
            size_t width = fixed_width(f->type);
            if (width && len % width) {
                snprintf(err, errlen, "%s.%s: %llu bytes, not a whole number of %zu-byte elements",
                         d->name, f->name, (unsigned long long)len, width);
                rc = BW_INVALID_ARGUMENT;
                break;
            }
            elems = width ? len / width : 0; /* packed: fixed-size elements, or varints */
            for (size_t k = start; !width && k < start + len; k++)
                elems += !(p[k] & 0x80);
        }
        size_t fi = (size_t)(f - d->fields);
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            uint64_t total = counts[fi] + elems;
            counts[fi] = total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
            if (total > BW_PROTO_REPEATED_MAX) {
                snprintf(err, errlen, "%s.%s: %llu %s, more than the limit of %d", d->name, f->name,
                         (unsigned long long)total, f->name, BW_PROTO_REPEATED_MAX);
                rc = BW_TOO_BIG;
                break;
            }
        }
        if (wire != 2)
            continue;
        if (f->type == PROTOBUF_C_TYPE_STRING) {
            size_t bad;
            if (len > BW_PROTO_STRING_MAX) {
                snprintf(err, errlen, "%s.%s: %llu bytes, more than the %d a string may have",
                         d->name, f->name, (unsigned long long)len, BW_PROTO_STRING_MAX);
                rc = BW_TOO_BIG;
            } else if (memchr(p + start, 0, (size_t)len)) {
                snprintf(
                    err, errlen, "%s.%s holds a NUL byte (at byte %zu)", d->name, f->name,
                    (size_t)((const uint8_t *)memchr(p + start, 0, (size_t)len) - (p + start)) + 1);
                rc = BW_INVALID_ARGUMENT;
            } else if (!bw__utf8_valid((const char *)p + start, (size_t)len, &bad)) {
                snprintf(err, errlen, "%s.%s is not valid UTF-8 (byte %zu)", d->name, f->name,
                         bad + 1);
                rc = BW_INVALID_ARGUMENT;
            }
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            rc = check(f->descriptor, p + start, (size_t)len, depth + 1, err, errlen);
        }
    }
    if (counts != stack_counts)
        free(counts);
    return rc;
}

int bw__proto_check(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, char *err,
                    size_t errlen)
{
    return check(d, p, n, 1, err, errlen);
}
