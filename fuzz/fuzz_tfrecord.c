/* libFuzzer target: TFRecord framing and CRCs, and the offset index sidecar. With the first
 * byte even the input is a TFRecord file; odd, it is a sidecar checked against a fixed valid
 * file of three records (then every record is read through the installed index). */
#include <string.h>

#include "common/crc32c.h"
#include "formats/tfrecord.h"
#include "fuzz_reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t put(uint8_t *out, const char *d, uint64_t len)
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(len >> (8 * i));
    uint32_t c = bw__crc32c_mask(bw__crc32c(0, out, 8));
    memcpy(out + 8, &c, 4);
    memcpy(out + 12, d, len);
    c = bw__crc32c_mask(bw__crc32c(0, d, len));
    memcpy(out + 12 + len, &c, 4);
    return 16 + len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (!(data[0] & 1)) {
        bw_fuzz_reader(&bw__fmt_tfrecord, data + 1, size - 1);
        return 0;
    }
    uint8_t file[256];
    size_t n = 0;
    n += put(file + n, "abc", 3);
    n += put(file + n, "", 0);
    n += put(file + n, "0123456789", 10);
    char err[512];
    bw__source *s = NULL;
    if (bw__source_from_memory(&bw__fmt_tfrecord, "fuzz", file, n, &s, err, sizeof(err)) != BW_OK)
        __builtin_trap();
    if (bw__tfrecord_index_parse(s, data + 1, size - 1, err, sizeof(err)) == BW_OK) {
        s->count = 3;
        bw__record r;
        for (uint64_t i = 0; i < 3; i++)
            if (s->ops->get(s, i, &r, err, sizeof(err)) == BW_OK)
                bw_fuzz_touch(&r);
    }
    bw__source_free(s);
    return 0;
}
