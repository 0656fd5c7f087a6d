/* The resume cursor (cursor.h): its binary and "bwc1:" text forms, encoded and decoded with
 * every length checked. */
#include "cursor/cursor.h"

#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/crc32c.h"

/* The checksum field ends the packed cursor: tag (15 << 3 | 5 = 0x7d), then 4 bytes LE. */
enum { CHECKSUM_TAG = 0x7d, CHECKSUM_BYTES = 5 };

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t bw__cursor_text_len(size_t binlen)
{
    return strlen(BW_CURSOR_TEXT_PREFIX) + (binlen + 2) / 3 * 4 + 1;
}

size_t bw__cursor_to_text(const uint8_t *bin, size_t len, char *out, size_t outlen)
{
    size_t need = bw__cursor_text_len(len);
    if (outlen < need)
        return 0;
    size_t o = (size_t)snprintf(out, outlen, "%s", BW_CURSOR_TEXT_PREFIX);
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)bin[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)bin[i + 1] << 8;
        if (i + 2 < len)
            v |= bin[i + 2];
        out[o++] = b64[(v >> 18) & 63];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = i + 1 < len ? b64[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? b64[v & 63] : '=';
    }
    out[o] = '\0';
    return o;
}

static int b64_value(uint8_t ch)
{
    const char *p = ch ? strchr(b64, ch) : NULL;
    return p ? (int)(p - b64) : -1;
}

/* Decodes base64 text (len chars) into out (at least len * 3 / 4 bytes). */
static int from_b64(const uint8_t *text, size_t len, uint8_t *out, size_t *outlen, char *err,
                    size_t errlen)
{
    if (len % 4 != 0) {
        snprintf(err, errlen, "text cursor: base64 length %zu is not a multiple of 4", len);
        return BW_INVALID_ARGUMENT;
    }
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            uint8_t ch = text[i + k];
            if (ch == '=' && i + 4 == len && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            v[k] = pad ? -1 : b64_value(ch);
            if (v[k] < 0) {
                snprintf(err, errlen,
                         "text cursor: character %zu (0x%02x) is not base64 after \"%s\"",
                         i + (size_t)k + 1, ch, BW_CURSOR_TEXT_PREFIX);
                return BW_INVALID_ARGUMENT;
            }
        }
        uint32_t w =
            (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(w >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)w;
    }
    *outlen = o;
    return BW_OK;
}

int bw__cursor_decode(const uint8_t *data, size_t len, bw_arena *arena, Batchwire__V1__Cursor **out,
                      char *err, size_t errlen)
{
    *out = NULL;
    if (len == 0) {
        snprintf(err, errlen, "cursor is empty");
        return BW_INVALID_ARGUMENT;
    }
    if (len > BW_CURSOR_MAX_BYTES) {
        snprintf(err, errlen, "cursor of %zu bytes is larger than the limit of %u", len,
                 BW_CURSOR_MAX_BYTES);
        return BW_TOO_BIG;
    }
    size_t plen = strlen(BW_CURSOR_TEXT_PREFIX);
    if (len >= plen && memcmp(data, BW_CURSOR_TEXT_PREFIX, plen) == 0) {
        uint8_t *bin = bw__arena_alloc(arena, len);
        size_t binlen = 0;
        if (!bin)
            return BW_NOMEM;
        int rc = from_b64(data + plen, len - plen, bin, &binlen, err, errlen);
        if (rc != BW_OK)
            return rc;
        data = bin;
        len = binlen;
        if (len == 0) {
            snprintf(err, errlen, "text cursor holds no data after \"%s\"", BW_CURSOR_TEXT_PREFIX);
            return BW_INVALID_ARGUMENT;
        }
    } else if (len >= 3 && memcmp(data, "bwc", 3) == 0) {
        snprintf(err, errlen, "text cursor with an unknown prefix (this coordinator reads \"%s\")",
                 BW_CURSOR_TEXT_PREFIX);
        return BW_INVALID_ARGUMENT;
    }
    if (len <= CHECKSUM_BYTES || data[len - CHECKSUM_BYTES] != CHECKSUM_TAG) {
        snprintf(err, errlen, "cursor of %zu bytes is corrupt: it does not end with its checksum",
                 len);
        return BW_INVALID_ARGUMENT;
    }
    const uint8_t *t = data + len - 4;
    uint32_t stored =
        (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
    uint32_t computed = bw__crc32c(0, data, len - CHECKSUM_BYTES);
    if (stored != computed) {
        snprintf(err, errlen,
                 "cursor of %zu bytes is corrupt: checksum mismatch (stored 0x%08x, computed "
                 "0x%08x)",
                 len, stored, computed);
        return BW_INVALID_ARGUMENT;
    }
    Batchwire__V1__Cursor *c = batchwire__v1__cursor__unpack(&arena->pb, len, data);
    if (!c) {
        snprintf(err, errlen, "cursor of %zu bytes is corrupt: not a batchwire cursor", len);
        return BW_INVALID_ARGUMENT;
    }
    if (c->version != BW_CURSOR_VERSION) {
        snprintf(err, errlen,
                 "cursor version %u is not one this coordinator reads (it reads version %d)%s",
                 c->version, BW_CURSOR_VERSION,
                 c->version == 0 ? "; the bytes are probably not a batchwire cursor" : "");
        return BW_INVALID_ARGUMENT;
    }
    if (c->job_fingerprint == 0) {
        snprintf(err, errlen, "cursor carries no job fingerprint");
        return BW_INVALID_ARGUMENT;
    }
    if (c->world_size == 0 || c->rank >= c->world_size) {
        snprintf(err, errlen, "cursor rank %u is not below its world size %u", c->rank,
                 c->world_size);
        return BW_INVALID_ARGUMENT;
    }
    /* Only the one encoding this code writes is accepted: no unknown fields, no field twice,
     * no string cut at a NUL byte. Then what a caller stores (bw__cursor_encode of *out) is
     * byte for byte what was checked, and decodes again. */
    if (c->base.n_unknown_fields) {
        snprintf(err, errlen,
                 "cursor of %zu bytes holds %u field(s) a batchwire cursor does not "
                 "have (field %u first)",
                 len, c->base.n_unknown_fields, c->base.unknown_fields[0].tag);
        return BW_INVALID_ARGUMENT;
    }
    size_t again_len;
    uint8_t *again = bw__cursor_encode(c, &again_len);
    if (!again) {
        snprintf(err, errlen, "out of memory checking a cursor");
        return BW_NOMEM;
    }
    bool canonical = again_len == len && memcmp(again, data, len) == 0;
    free(again);
    if (!canonical) {
        snprintf(err, errlen,
                 "cursor of %zu bytes is not in the form batchwire writes (a field repeated, "
                 "out of order or not minimally encoded, or a NUL byte in the job name)",
                 len);
        return BW_INVALID_ARGUMENT;
    }
    *out = c;
    return BW_OK;
}

uint8_t *bw__cursor_encode(const Batchwire__V1__Cursor *c, size_t *len)
{
    Batchwire__V1__Cursor copy = *c;
    copy.version = BW_CURSOR_VERSION;
    copy.checksum = 0;
    size_t body = batchwire__v1__cursor__get_packed_size(&copy); /* checksum 0 is not packed */
    *len = body + CHECKSUM_BYTES;
    uint8_t *buf = malloc(*len);
    if (!buf)
        return NULL;
    batchwire__v1__cursor__pack(&copy, buf);
    uint32_t crc = bw__crc32c(0, buf, body);
    buf[body] = CHECKSUM_TAG;
    for (int i = 0; i < 4; i++)
        buf[body + 1 + (size_t)i] = (uint8_t)(crc >> (8 * i));
    return buf;
}
