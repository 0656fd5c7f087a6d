/* Writing JSON text (json.h): strings escaped per RFC 8259. */
#include "common/json.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

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

/* The escaped form of the character at p (n bytes left, n > 0) into e (at least 7 bytes, not
 * terminated): returns its length and sets *used to the input bytes it stands for. */
static size_t escape_one(const unsigned char *p, size_t n, char *e, size_t *used)
{
    unsigned char c = *p;
    *used = 1;
    if (c == '"' || c == '\\') {
        e[0] = '\\';
        e[1] = (char)c;
        return 2;
    }
    if (c < 0x20) {
        const char *named = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
        if (named) {
            memcpy(e, named, 2);
            return 2;
        }
        static const char hex[] = "0123456789abcdef";
        memcpy(e, "\\u00", 4);
        e[4] = hex[c >> 4];
        e[5] = hex[c & 15];
        return 6;
    }
    if (c < 0x80) {
        e[0] = (char)c;
        return 1;
    }
    size_t k = n >= 4 ? utf8_len(p) : 0;
    if (!k && n < 4) { /* a sequence cut by the end of the input is checked on a copy */
        unsigned char tmp[4] = {0};
        memcpy(tmp, p, n);
        k = utf8_len(tmp);
        k = k <= n ? k : 0;
    }
    if (k) {
        memcpy(e, p, k);
        *used = k;
        return k;
    }
    memcpy(e, "\\ufffd", 6);
    return 6;
}

void bw__json_string(FILE *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    fputc('"', out);
    while (n) {
        char e[8];
        size_t used, k = escape_one(p, n, e, &used);
        fwrite(e, 1, k, out);
        p += used;
        n -= used;
    }
    fputc('"', out);
}

bool bw__json_escape(char *out, size_t cap, size_t *len, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    bool fit = true;
    while (n) {
        char e[8];
        size_t used, k = escape_one(p, n, e, &used);
        if (*len + k + 1 > cap) {
            fit = false;
            break;
        }
        memcpy(out + *len, e, k);
        *len += k;
        p += used;
        n -= used;
    }
    out[*len] = '\0';
    return fit;
}
