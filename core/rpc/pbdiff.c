/* A field-by-field difference of two protobuf-c messages of one type, as a sentence
 * (pbdiff.h): the coordinator names what differs between a job and a request for it. */
#include "rpc/pbdiff.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* What diff_rec passes down: the names of the two sides and the formatters. */
typedef struct diff_ctx {
    const char *a_name, *b_name;
    const bw__pb_diff_format *formats;
    size_t nformats;
} diff_ctx;

static void one_value(const ProtobufCFieldDescriptor *f, const void *p,
                      const bw__pb_diff_format *fmt, char *out, size_t outlen)
{
    if (fmt) {
        fmt->format(p, out, outlen);
        return;
    }
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        snprintf(out, outlen, "%" PRId32, *(const int32_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        snprintf(out, outlen, "%" PRIu32, *(const uint32_t *)p);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        snprintf(out, outlen, "%" PRId64, *(const int64_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        snprintf(out, outlen, "%" PRIu64, *(const uint64_t *)p);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        snprintf(out, outlen, "%g", (double)*(const float *)p);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        snprintf(out, outlen, "%g", *(const double *)p);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        snprintf(out, outlen, "%s", *(const protobuf_c_boolean *)p ? "true" : "false");
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int *)p);
        snprintf(out, outlen, "%s", ev ? ev->name : "?");
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *sv = *(char *const *)p;
        snprintf(out, outlen, "\"%.100s\"", sv ? sv : "");
        break;
    }
    case PROTOBUF_C_TYPE_BYTES:
        snprintf(out, outlen, "<%zu bytes>", ((const ProtobufCBinaryData *)p)->len);
        break;
    default:
        snprintf(out, outlen, "<message>");
        break;
    }
}

/* The formatter of field f of message type desc, if one was given. */
static const bw__pb_diff_format *format_of(const diff_ctx *c,
                                           const ProtobufCMessageDescriptor *desc,
                                           const ProtobufCFieldDescriptor *f)
{
    for (size_t i = 0; i < c->nformats; i++)
        if (c->formats[i].message == desc && strcmp(c->formats[i].field, f->name) == 0)
            return &c->formats[i];
    return NULL;
}

/* One field's value as text; repeated fields as [a, b]. */
static void field_text(const ProtobufCFieldDescriptor *f, const void *base,
                       const bw__pb_diff_format *fmt, char *out, size_t outlen)
{
    const char *p = (const char *)base + f->offset;
    if (f->label != PROTOBUF_C_LABEL_REPEATED) {
        one_value(f, p, fmt, out, outlen);
        return;
    }
    size_t n = *(const size_t *)((const char *)base + f->quantifier_offset);
    const char *arr = *(char *const *)p;
    size_t elem = f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE
                      ? sizeof(void *)
                  : f->type == PROTOBUF_C_TYPE_BYTES ? sizeof(ProtobufCBinaryData)
                  : f->type == PROTOBUF_C_TYPE_INT64 || f->type == PROTOBUF_C_TYPE_UINT64 ||
                          f->type == PROTOBUF_C_TYPE_SINT64 || f->type == PROTOBUF_C_TYPE_FIXED64 ||
                          f->type == PROTOBUF_C_TYPE_SFIXED64 || f->type == PROTOBUF_C_TYPE_DOUBLE
                      ? 8
                  : f->type == PROTOBUF_C_TYPE_BOOL ? sizeof(protobuf_c_boolean)
                                                    : 4;
    size_t o = (size_t)snprintf(out, outlen, "[");
    for (size_t i = 0; i < n && o + 8 < outlen; i++) {
        char v[128];
        if (f->type == PROTOBUF_C_TYPE_MESSAGE)
            snprintf(v, sizeof(v), "<message>");
        else
            one_value(f, arr + i * elem, fmt, v, sizeof(v));
        o += (size_t)snprintf(out + o, outlen - o, "%s%s", i ? ", " : "", v);
    }
    if (o + 2 < outlen)
        snprintf(out + o, outlen - o, "]");
}

static void diff_rec(const diff_ctx *c, const ProtobufCMessageDescriptor *desc,
                     const ProtobufCMessage *a, const ProtobufCMessage *b, const char *prefix,
                     char *out, size_t outlen)
{
    const char *a_name = c->a_name, *b_name = c->b_name;
    /* A missing sub-message compares like an empty one. */
    union {
        ProtobufCMessage m;
        max_align_t align;
        uint8_t bytes[1024];
    } empty_a, empty_b;
    if (!a && desc->sizeof_message <= sizeof(empty_a)) {
        desc->message_init(&empty_a.m);
        a = &empty_a.m;
    }
    if (!b && desc->sizeof_message <= sizeof(empty_b)) {
        desc->message_init(&empty_b.m);
        b = &empty_b.m;
    }
    if (!a || !b)
        return;
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        char name[160];
        snprintf(name, sizeof(name), "%s%s", prefix, f->name);
        if (f->type == PROTOBUF_C_TYPE_MESSAGE && f->label != PROTOBUF_C_LABEL_REPEATED) {
            char sub[168];
            snprintf(sub, sizeof(sub), "%s.", name);
            diff_rec(c, f->descriptor, *(ProtobufCMessage *const *)((const char *)a + f->offset),
                     *(ProtobufCMessage *const *)((const char *)b + f->offset), sub, out, outlen);
            continue;
        }
        /* Repeated messages (a dataset's fields): element by element when the counts agree. */
        size_t na = 0, nb = 0;
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            na = *(const size_t *)((const char *)a + f->quantifier_offset);
            nb = *(const size_t *)((const char *)b + f->quantifier_offset);
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE && na == nb) {
            ProtobufCMessage *const *ea =
                *(ProtobufCMessage *const *const *)((const char *)a + f->offset);
            ProtobufCMessage *const *eb =
                *(ProtobufCMessage *const *const *)((const char *)b + f->offset);
            for (size_t k = 0; k < na; k++) {
                char sub[200];
                snprintf(sub, sizeof(sub), "%.160s[%zu].", name, k);
                diff_rec(c, f->descriptor, ea[k], eb[k], sub, out, outlen);
            }
            continue;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            size_t used = strlen(out);
            snprintf(out + used, outlen - used, "%s%s: %s has %zu, %s has %zu", used ? "; " : "",
                     name, a_name, na, b_name, nb);
            continue;
        }
        char va[512], vb[512];
        const bw__pb_diff_format *fmt = format_of(c, desc, f);
        field_text(f, a, fmt, va, sizeof(va));
        field_text(f, b, fmt, vb, sizeof(vb));
        if (strcmp(va, vb) == 0)
            continue;
        size_t used = strlen(out);
        snprintf(out + used, outlen - used, "%s%s: %s has %s, %s has %s", used ? "; " : "", name,
                 a_name, va, b_name, vb);
    }
}

void bw__pb_diff(const ProtobufCMessageDescriptor *desc, const ProtobufCMessage *a,
                 const char *a_name, const ProtobufCMessage *b, const char *b_name,
                 const bw__pb_diff_format *formats, size_t nformats, char *out, size_t outlen)
{
    diff_ctx c = {a_name, b_name, formats, nformats};
    out[0] = '\0';
    diff_rec(&c, desc, a, b, "", out, outlen);
}
