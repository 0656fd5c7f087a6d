/* A JSON string of standard base64 (RFC 4648 section 4, with padding): the encoded image of a
 * JSON Lines field (transform.h; docs/transforms.md, "JSON Lines fields"). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "transform/transform.h"

/* The value of each base64 character, 255 for the other bytes. */
static const uint8_t sextets[256] = {
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 62,  255, 255, 255, 63,  52,  53,  54,  55,  56,  57,  58,  59,  60,
    61,  255, 255, 255, 255, 255, 255, 255, 0,   1,   2,   3,   4,   5,   6,   7,   8,   9,   10,
    11,  12,  13,  14,  15,  16,  17,  18,  19,  20,  21,  22,  23,  24,  25,  255, 255, 255, 255,
    255, 255, 26,  27,  28,  29,  30,  31,  32,  33,  34,  35,  36,  37,  38,  39,  40,  41,  42,
    43,  44,  45,  46,  47,  48,  49,  50,  51,  255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255,
};

/* Decodes whole quanta of four alphabet characters at v[*i..n) at once (all of a string
 * but its end, as encoders write it), advancing *i, *o and *chars; stops at anything else --
 * an escape, padding, a bad byte, the closing quote -- which the caller's loop reads. */
static void quanta(const uint8_t *v, size_t n, size_t *i, uint8_t *out, size_t *o, size_t *chars)
{
    size_t at = *i, w = *o;
    for (; n - at >= 4; at += 4) {
        uint32_t a = sextets[v[at]], b = sextets[v[at + 1]], c = sextets[v[at + 2]],
                 d = sextets[v[at + 3]];
        if ((a | b | c | d) & 0x80)
            break;
        uint32_t q = a << 18 | b << 12 | c << 6 | d;
        out[w++] = (uint8_t)(q >> 16);
        out[w++] = (uint8_t)(q >> 8);
        out[w++] = (uint8_t)q;
    }
    *chars += at - *i;
    *i = at;
    *o = w;
}

size_t bw__tf_base64_cap(size_t n)
{
    return n / 4 * 3 + 3;
}

int bw__tf_json_base64(const uint8_t *v, size_t n, uint8_t *out, size_t *outlen, char *why,
                       size_t whylen)
{
    *outlen = 0;
    size_t i = 0;
    while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == '\r' || v[i] == '\n'))
        i++;
    if (i >= n || v[i] != '"') {
        const char *what = i >= n                                        ? "empty"
                           : v[i] == '['                                 ? "an array"
                           : v[i] == '{'                                 ? "an object"
                           : v[i] == 't' || v[i] == 'f'                  ? "a boolean"
                           : v[i] == 'n'                                 ? "null"
                           : v[i] == '-' || (v[i] >= '0' && v[i] <= '9') ? "a number"
                                                                         : "not JSON";
        snprintf(why, whylen, "the value is %s, not a string of base64", what);
        return BW_CORRUPT;
    }
    uint32_t acc = 0;
    size_t chars = 0, pad = 0, o = 0;
    i++;
    quanta(v, n, &i, out, &o, &chars);
    for (; i < n && v[i] != '"'; i++) {
        uint8_t c = v[i];
        if (c == '\\') { /* JSON may escape '/' as "\/"; no other escape is base64 */
            if (i + 1 < n && v[i + 1] == '/') {
                c = '/';
                i++;
            } else {
                snprintf(why, whylen,
                         "not base64: character %zu of the string is an escape ('\\%c'), not in "
                         "the base64 alphabet",
                         chars, i + 1 < n ? v[i + 1] : '?');
                return BW_CORRUPT;
            }
        }
        if (c == '=') {
            pad++;
            chars++;
            continue;
        }
        int s = sextets[c] < 64 ? sextets[c] : -1;
        if (s < 0 || pad) {
            if (s < 0 && c >= 0x20 && c < 0x7f)
                snprintf(why, whylen,
                         "not base64: character %zu of the string ('%c') is not in the base64 "
                         "alphabet (A-Z, a-z, 0-9, +, /)",
                         chars, c);
            else if (s < 0)
                snprintf(why, whylen,
                         "not base64: character %zu of the string (byte 0x%02x) is not in the "
                         "base64 alphabet (A-Z, a-z, 0-9, +, /)",
                         chars, c);
            else
                snprintf(why, whylen,
                         "not base64: character %zu of the string comes after its '=' padding",
                         chars);
            return BW_CORRUPT;
        }
        acc = acc << 6 | (uint32_t)s;
        if (++chars % 4 == 0) {
            out[o++] = (uint8_t)(acc >> 16);
            out[o++] = (uint8_t)(acc >> 8);
            out[o++] = (uint8_t)acc;
            acc = 0;
            i++;
            quanta(v, n, &i, out, &o, &chars); /* back to whole quanta after an escape */
            i--;
        }
    }
    if (i >= n) {
        snprintf(why, whylen, "the string is not closed");
        return BW_CORRUPT;
    }
    for (i++; i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == '\r' || v[i] == '\n');)
        i++;
    if (i != n) {
        snprintf(why, whylen, "the value has bytes after its string");
        return BW_CORRUPT;
    }
    if (chars % 4 != 0 || pad > 2) {
        snprintf(why, whylen,
                 "not base64: %zu characters, %s (standard base64 is padded with '=' to a "
                 "multiple of 4)",
                 chars, pad > 2 ? "with more than two '='" : "not a multiple of 4");
        return BW_CORRUPT;
    }
    /* The last quantum's data characters: 2 with "==", 3 with "=". */
    if (pad) {
        acc <<= 6 * pad;
        out[o++] = (uint8_t)(acc >> 16);
        if (pad == 1)
            out[o++] = (uint8_t)(acc >> 8);
    }
    *outlen = o;
    return BW_OK;
}
