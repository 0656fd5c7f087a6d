/* The rules for names people choose (text.h): job names, worker ids, principal names,
 * dataset paths, and UTF-8 checks. */
#include "common/text.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"

/* Decodes one code point at p (n bytes left): its length, or 0 when invalid. */
static size_t utf8_one(const unsigned char *p, size_t n, uint32_t *cp)
{
    if (p[0] < 0x80) {
        *cp = p[0];
        return 1;
    }
    size_t len;
    uint32_t min;
    if ((p[0] & 0xe0) == 0xc0) {
        len = 2;
        min = 0x80;
        *cp = p[0] & 0x1f;
    } else if ((p[0] & 0xf0) == 0xe0) {
        len = 3;
        min = 0x800;
        *cp = p[0] & 0x0f;
    } else if ((p[0] & 0xf8) == 0xf0) {
        len = 4;
        min = 0x10000;
        *cp = p[0] & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        *cp = *cp << 6 | (p[i] & 0x3f);
    }
    if (*cp < min || *cp > 0x10ffff || (*cp >= 0xd800 && *cp <= 0xdfff))
        return 0;
    return len;
}

bool bw__utf8_valid(const char *p, size_t n, size_t *bad)
{
    const unsigned char *u = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = utf8_one(u + i, n - i, &cp);
        if (!len) {
            if (bad)
                *bad = i;
            return false;
        }
        i += len;
    }
    return true;
}

int bw__check_text(const char *what, const char *v, size_t max, char *err, size_t errlen)
{
    size_t len = v ? strlen(v) : 0;
    if (len == 0 || len > max) {
        snprintf(err, errlen, "%s must be 1 to %zu bytes (got %zu)", what, max, len);
        return BW_INVALID_ARGUMENT;
    }
    const unsigned char *u = (const unsigned char *)v;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n = utf8_one(u + i, len - i, &cp);
        if (!n) {
            snprintf(err, errlen, "%s is not valid UTF-8 (byte %zu, 0x%02x)", what, i + 1, u[i]);
            return BW_INVALID_ARGUMENT;
        }
        if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) {
            snprintf(err, errlen, "%s holds a control character (U+%04X at byte %zu)", what,
                     (unsigned)cp, i + 1);
            return BW_INVALID_ARGUMENT;
        }
        i += n;
    }
    return BW_OK;
}

int bw__check_name(const char *what, const char *v, size_t max, char *err, size_t errlen)
{
    int rc = bw__check_text(what, v, max, err, errlen);
    const char *sp = rc == BW_OK ? strchr(v, ' ') : NULL;
    if (sp) {
        snprintf(err, errlen, "%s '%.64s': character %zu is a space", what, v,
                 (size_t)(sp - v) + 1);
        rc = BW_INVALID_ARGUMENT;
    }
    return rc;
}

int bw__check_field_name(const char *v, char *err, size_t errlen)
{
    int rc = bw__check_name("a field name", v, BW_FIELD_NAME_MAX, err, errlen);
    const char *bad = rc == BW_OK ? strpbrk(v, "=,") : NULL;
    if (bad) {
        snprintf(err, errlen, "field name '%.64s': character %zu ('%c') separates fields", v,
                 (size_t)(bad - v) + 1, *bad);
        rc = BW_INVALID_ARGUMENT;
    }
    return rc;
}
