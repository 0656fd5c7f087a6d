/* A JSON string of standard base64 (RFC 4648 section 4, with padding): the encoded image of a
 * JSON Lines field (transform.h; docs/transforms.md, "JSON Lines fields"). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "transform/transform.h"

static int sextet(uint8_t c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
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
    for (i++; i < n && v[i] != '"'; i++) {
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
        int s = sextet(c);
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
