/* libFuzzer target: the client's reading of samples' fields (client/lib/fields.c) -- a tar
 * sample's field table (formats/field_table.h), which a worker sends in front of the sample,
 * and a JSON Lines sample scanned for its top-level keys. The first input byte picks which
 * (even: a table, odd: JSON); the rest is one sample. Either the batch fails with BW_CORRUPT
 * (or BW_TOO_BIG) and a sentence, or every field it reports lies inside the sample -- for a
 * table, the fields tile the sample left once the table is cut. */
#include <stdlib.h>
#include <string.h>

#include "../client/lib/batch_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum bw__fields_kind kind = data[0] & 1 ? BW_FIELDS_JSON : BW_FIELDS_TABLE;
    size_t len = size - 1;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, len);
    uint64_t idx = 7;
    size_t off = 0, sz = len;
    bw_batch b;
    memset(&b, 0, sizeof(b));
    b.data = buf;
    b.count = 1;
    b.indices = &idx;
    b.offsets = &off;
    b.sizes = &sz;
    b.nbytes = len;
    int rc = bw__batch_split_fields(&b, kind);
    if (rc != BW_OK) {
        if ((rc != BW_CORRUPT && rc != BW_TOO_BIG && rc != BW_NOMEM) || !b.err[0])
            abort();
    } else {
        const bw_field *f;
        size_t n, covered = 0;
        if (bw_batch_fields(&b, 0, &f, &n) != BW_OK)
            abort();
        for (size_t i = 0; i < n; i++) {
            if (f[i].offset > sz || f[i].size > sz - f[i].offset || !f[i].name ||
                strlen(f[i].name) > len)
                abort();
            if (kind == BW_FIELDS_TABLE && f[i].offset != covered)
                abort();
            covered += f[i].size;
        }
        if (kind == BW_FIELDS_TABLE && (covered != sz || b.nbytes != sz))
            abort();
    }
    bw__batch_fields_free(&b);
    free(buf);
    return 0;
}
