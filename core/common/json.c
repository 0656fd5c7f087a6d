/* Writing JSON text (json.h): strings escaped per RFC 8259; and finding the top-level keys of
 * a JSON object (JSON Lines samples). */
#include "common/json.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "batchwire/batchwire.h"

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

/* ---- the top-level keys of an object (bw__json_keys) ---- */

static size_t skip_ws(const uint8_t *p, size_t n, size_t i)
{
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n'))
        i++;
    return i;
}

/* The end of the JSON string starting at p[i] == '"' (one past its closing quote), or 0. */
static size_t string_end(const uint8_t *p, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (p[i] == '\\')
            i++;
        else if (p[i] == '"')
            return i + 1;
    }
    return 0;
}

/* The end of the JSON value starting at p[i] (one past it), or 0 when it is cut short. */
static size_t value_end(const uint8_t *p, size_t n, size_t i)
{
    if (i >= n)
        return 0;
    if (p[i] == '"')
        return string_end(p, n, i);
    if (p[i] == '{' || p[i] == '[') {
        size_t depth = 0;
        for (; i < n; i++) {
            if (p[i] == '"') {
                size_t e = string_end(p, n, i);
                if (!e)
                    return 0;
                i = e - 1;
            } else if (p[i] == '{' || p[i] == '[') {
                depth++;
            } else if ((p[i] == '}' || p[i] == ']') && --depth == 0) {
                return i + 1;
            }
        }
        return 0;
    }
    size_t s = i; /* a number, true, false or null */
    while (i < n && p[i] != ',' && p[i] != '}' && p[i] != ']' && p[i] != ' ' && p[i] != '\t' &&
           p[i] != '\r' && p[i] != '\n')
        i++;
    return i > s ? i : 0;
}

int bw__json_keys(const uint8_t *p, size_t n, bw__json_key_fn fn, void *arg, size_t *at)
{
    size_t i = skip_ws(p, n, 0);
    if (i >= n || p[i] != '{') {
        *at = i;
        return BW_CORRUPT;
    }
    i = skip_ws(p, n, i + 1);
    if (i < n && p[i] == '}')
        return BW_OK;
    for (;;) {
        size_t ke = i < n && p[i] == '"' ? string_end(p, n, i) : 0;
        if (!ke) {
            *at = i;
            return BW_CORRUPT;
        }
        size_t v = skip_ws(p, n, ke);
        if (v >= n || p[v] != ':') {
            *at = v;
            return BW_CORRUPT;
        }
        v = skip_ws(p, n, v + 1);
        size_t ve = value_end(p, n, v);
        if (!ve) {
            *at = v;
            return BW_CORRUPT;
        }
        int rc = fn(arg, (const char *)p + i + 1, ke - i - 2, v, ve - v);
        if (rc != BW_OK)
            return rc;
        i = skip_ws(p, n, ve);
        if (i < n && p[i] == '}')
            return BW_OK;
        if (i >= n || p[i] != ',') {
            *at = i;
            return BW_CORRUPT;
        }
        i = skip_ws(p, n, i + 1);
    }
}
