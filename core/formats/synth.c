/* The synthetic content `batchwire gen` writes (synth.h, docs/formats.md): every byte of
 * sample i a pure function of i. */
#include "formats/synth.h"

#include <string.h>

#include "placement/placement.h"

uint64_t bw__synth_word(uint64_t index, uint64_t w)
{
    return bw__placement_mix64(index * 0x9e3779b97f4a7c15ull + (w + 1) * 0xd1b54a32d192ed03ull);
}

void bw__synth_fill(uint64_t index, uint8_t *out, size_t len)
{
    uint64_t w = 0;
    for (; len >= 8; len -= 8, out += 8, w++) {
        uint64_t v = bw__synth_word(index, w);
        for (int k = 0; k < 8; k++)
            out[k] = (uint8_t)(v >> (8 * k));
    }
    uint64_t v = bw__synth_word(index, w);
    for (size_t k = 0; k < len; k++)
        out[k] = (uint8_t)(v >> (8 * k));
}

uint64_t bw__synth_len(uint64_t index, uint64_t min, uint64_t max)
{
    if (max <= min)
        return min;
    uint64_t span = max - min + 1;
    return min + (span ? bw__placement_mix64(index ^ 0x5851f42d4c957f2dull) % span : 0);
}

/* ---- synthetic images (synth.h, docs/formats.md "Synthetic JPEG images") ---- */

uint64_t bw__synth_image_word(uint64_t seed, uint64_t index, uint64_t w)
{
    uint64_t s = bw__placement_mix64(seed ^ 0x632be59bd9b4e019ull);
    return bw__placement_mix64(s + index * 0x9e3779b97f4a7c15ull + (w + 1) * 0xd1b54a32d192ed03ull);
}

void bw__synth_image_size(uint64_t seed, uint64_t index, int min, int max, int *h, int *w)
{
    uint64_t span = (uint64_t)(max - min) + 1;
    *h = min + (int)(bw__synth_image_word(seed, index, 0) % span);
    *w = min + (int)(bw__synth_image_word(seed, index, 1) % span);
}

static uint8_t clamp8(int v)
{
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

void bw__synth_image_fill(uint64_t seed, uint64_t index, int h, int w, uint8_t *rgb)
{
#define W(k) bw__synth_image_word(seed, index, (k))
    uint64_t bg = W(4);
    int dir = (int)(bg % 4);
    int64_t span = dir == 0 ? w : dir == 1 ? h : (int64_t)w + h;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int64_t t = dir == 0   ? x
                        : dir == 1 ? y
                        : dir == 2 ? (int64_t)x + y
                                   : (int64_t)w - 1 - x + y;
            uint8_t *p = rgb + ((size_t)y * (size_t)w + (size_t)x) * 3;
            for (int c = 0; c < 3; c++) {
                int c0 = (int)((bg >> (8 * c)) & 0xff), c1 = (int)((bg >> (8 * c + 24)) & 0xff);
                p[c] = (uint8_t)(c0 + (c1 - c0) * t / span);
            }
        }
    int shapes = 2 + (int)(W(5) % 4);
    int side = h < w ? h : w;
    for (int s = 0; s < shapes; s++) {
        uint64_t a = W(6 + 2 * (uint64_t)s), b = W(7 + 2 * (uint64_t)s);
        int kind = (int)(a % 3), cx = (int)((a >> 8) % (uint64_t)w),
            cy = (int)((a >> 24) % (uint64_t)h);
        int r = 1 + (int)((a >> 40) % (uint64_t)(side / 2 + 1));
        int ry = kind == 0 ? 1 + (int)((b >> 24) % (uint64_t)(side / 2 + 1)) : r;
        for (int y = cy - ry < 0 ? 0 : cy - ry; y <= cy + ry && y < h; y++)
            for (int x = cx - r < 0 ? 0 : cx - r; x <= cx + r && x < w; x++) {
                int64_t dx = x - cx, dy = y - cy;
                int in = kind == 0 || (kind == 1 && dx * dx + dy * dy <= (int64_t)r * r) ||
                         (kind == 2 && dx * dx + dy * dy <= (int64_t)r * r && ((x + y) / 4) % 2);
                if (!in)
                    continue;
                uint8_t *p = rgb + ((size_t)y * (size_t)w + (size_t)x) * 3;
                for (int c = 0; c < 3; c++)
                    p[c] = (uint8_t)(b >> (8 * c));
            }
    }
    uint64_t noise = W(1000);
    for (size_t i = 0; i < (size_t)h * (size_t)w; i++) {
        uint64_t z = bw__placement_mix64(noise + i * 0x9e3779b97f4a7c15ull);
        for (int c = 0; c < 3; c++)
            rgb[i * 3 + (size_t)c] =
                clamp8(rgb[i * 3 + (size_t)c] + (int)((z >> (8 * c)) % 25) - 12);
    }
#undef W
}
