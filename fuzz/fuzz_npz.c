/* libFuzzer target: the .npz (zip) reader -- the archive's member list, then every member
 * opened as an array and read row by row. */
#include <stdio.h>
#include <string.h>

#include "fuzz_reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bw_fuzz_reader(&bw__fmt_npz, data, size); /* the archive alone: listed, no rows */
    char err[1024], names[4096];
    bw__source *s = NULL;
    /* without a member: the archive is only listed and checked */
    if (bw__source_from_memory(&bw__fmt_npz, "fuzz", data, size, &s, err, sizeof(err)) != BW_OK)
        return 0;
    size_t n = 0;
    if (bw__npz_members(s, names, sizeof(names), &n, err, sizeof(err)) == BW_OK)
        for (size_t k = 0, off = 0; k < n; k++, off += strlen(names + off) + 1) {
            snprintf(s->member, sizeof(s->member), "%s.npy", names + off);
            if (bw__fmt_npz.open(s, err, sizeof(err)) != BW_OK)
                continue;
            bw__record r;
            if (bw__fmt_npz.index(s, err, sizeof(err)) == BW_OK)
                for (uint64_t i = 0; i < s->count && i < 4096; i++)
                    if (bw__fmt_npz.get(s, i, &r, err, sizeof(err)) == BW_OK)
                        bw_fuzz_touch(&r);
            bw__fmt_npz.close(s);
            memset(&s->layout, 0, sizeof(s->layout));
            s->indexed = false;
        }
    bw__source_free(s);
    return 0;
}
