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
