/* libFuzzer target: cursor decoding (core/cursor/cursor.c), binary or text. A cursor that
 * decodes is canonical (docs/security.md, "Input limits"): encoding what was decoded gives
 * back exactly the binary bytes that were checked (so what the coordinator journals is what
 * it verified), and those bytes decode again to the same position. Every refusal says why. */
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "cursor/cursor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The binary form of the input: the input, or its base64 after "bwc1:" (decoded with the
 * decoder's own rules: standard alphabet and padding). */
static uint8_t *binary_of(const uint8_t *data, size_t size, size_t *len)
{
    size_t plen = strlen(BW_CURSOR_TEXT_PREFIX);
    if (size < plen || memcmp(data, BW_CURSOR_TEXT_PREFIX, plen) != 0) {
        uint8_t *b = malloc(size ? size : 1);
        if (b)
            memcpy(b, data, size);
        *len = size;
        return b;
    }
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const uint8_t *t = data + plen;
    size_t n = size - plen;
    uint8_t *b = malloc(n + 1);
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; b && i < n && t[i] != '='; i++) {
        const char *p = memchr(alphabet, t[i], 64);
        if (!p)
            break;
        acc = acc << 6 | (uint32_t)(p - alphabet);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            b[o++] = (uint8_t)(acc >> bits);
        }
    }
    *len = o;
    return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bw_arena a;
    bw__arena_init(&a, 1 << 22);
    Batchwire__V1__Cursor *c = NULL;
    char err[512] = "";
    int rc = bw__cursor_decode(data, size, &a, &c, err, sizeof(err));
    if (rc != BW_OK) {
        if (!err[0])
            __builtin_trap(); /* every refusal says why */
        bw__arena_reset(&a);
        return 0;
    }
    if (c->rank >= c->world_size || c->job_fingerprint == 0)
        __builtin_trap();
    size_t blen = 0, elen = 0;
    uint8_t *bin = binary_of(data, size, &blen);
    uint8_t *enc = bw__cursor_encode(c, &elen);
    if (bin && enc && (blen != elen || memcmp(bin, enc, elen) != 0))
        __builtin_trap(); /* not canonical: what would be journaled differs from the input */
    Batchwire__V1__Cursor *again = NULL;
    if (enc && bw__cursor_decode(enc, elen, &a, &again, err, sizeof(err)) != BW_OK)
        __builtin_trap(); /* a stored cursor must decode again */
    if (again && (again->epoch != c->epoch || again->step != c->step || again->rank != c->rank))
        __builtin_trap();
    free(bin);
    free(enc);
    bw__arena_reset(&a);
    return 0;
}
