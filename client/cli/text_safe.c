/* Escaping the text daemons report before `batchwire status` prints it (text_safe.h). */
#include "text_safe.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The length of the UTF-8 sequence at p (1 to 4), or 0 when p does not start a valid one. */
static size_t utf8_len(const unsigned char *p, uint32_t *cp)
{
    if (p[0] < 0x80) {
        *cp = p[0];
        return 1;
    }
    size_t n = p[0] >= 0xF0 && p[0] <= 0xF4 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC2 ? 2 : 0;
    if (n == 0)
        return 0;
    uint32_t v = p[0] & (0x7F >> n);
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        v = v << 6 | (p[i] & 0x3F);
    }
    static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return n;
}

bool bw__cli_safe_text(char *out, size_t cap, const char *s)
{
    size_t len = 0;
    bool escaped = false;
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        uint32_t cp = 0;
        size_t n = utf8_len(p, &cp);
        char esc[16];
        size_t elen;
        if (n == 0 || cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F)) {
            elen = 0; /* each byte of the character (or the bad byte) as \xHH */
            size_t k = n ? n : 1;
            for (size_t i = 0; i < k; i++)
                elen += (size_t)snprintf(esc + elen, sizeof(esc) - elen, "\\x%02X", p[i]);
            p += k;
            escaped = true;
        } else if (cp == '\\') {
            memcpy(esc, "\\\\", 2);
            elen = 2;
            p++;
            escaped = true;
        } else {
            memcpy(esc, p, n);
            elen = n;
            p += n;
        }
        if (len + elen >= cap)
            break;
        memcpy(out + len, esc, elen);
        len += elen;
    }
    out[len] = '\0';
    return escaped;
}

/* Whether s needs escaping. */
static bool needs(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        uint32_t cp;
        size_t n = utf8_len(p, &cp);
        if (n == 0 || cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F) || cp == '\\')
            return true;
        p += n;
    }
    return false;
}

/* *slot escaped into the arena when it needs it. */
static bool safe_string(char **slot, bw_arena *a)
{
    if (!*slot || !needs(*slot))
        return true;
    size_t cap = strlen(*slot) * 4 + 1; /* every byte as \xHH at most */
    char *copy = bw__arena_alloc(a, cap);
    if (!copy)
        return false;
    bw__cli_safe_text(copy, cap, *slot);
    *slot = copy;
    return true;
}

bool bw__cli_safe_message(ProtobufCMessage *m, bw_arena *a)
{
    if (!m)
        return true;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        char *base = (char *)m + f->offset;
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
            continue; /* not the member set */
        size_t n = 1;
        void **items = (void **)base;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            n = *(const size_t *)((const char *)m + f->quantifier_offset);
            items = *(void ***)base;
        }
        for (size_t k = 0; k < n && items; k++) {
            bool ok = f->type == PROTOBUF_C_TYPE_STRING
                          ? safe_string((char **)&items[k], a)
                          : bw__cli_safe_message((ProtobufCMessage *)items[k], a);
            if (!ok)
                return false;
        }
    }
    return true;
}
