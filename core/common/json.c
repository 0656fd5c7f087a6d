#include "common/json.h"

#include <stddef.h>

/* Length of the valid UTF-8 sequence at s, or 0. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned char c = s[0];
    size_t n;
    unsigned min;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2, min = 0x80, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3, min = 0x800, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4, min = 0x10000, cp = c & 0x07;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

void bw__json_string(FILE *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', out);
    while (*p) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', out);
            fputc(c, out);
            p++;
        } else if (c < 0x20) {
            switch (c) {
            case '\n':
                fputs("\\n", out);
                break;
            case '\r':
                fputs("\\r", out);
                break;
            case '\t':
                fputs("\\t", out);
                break;
            default:
                fprintf(out, "\\u%04x", c);
            }
            p++;
        } else if (c < 0x80) {
            fputc(c, out);
            p++;
        } else {
            size_t n = utf8_len(p);
            if (n) {
                fwrite(p, 1, n, out);
                p += n;
            } else {
                fputs("\\ufffd", out);
                p++;
            }
        }
    }
    fputc('"', out);
}
