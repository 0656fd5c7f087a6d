/* Batches of named arrays (bw_batch_array; docs/formats.md, "Named arrays"): a sample of such
 * a dataset arrives whole -- row i of field 0, then of field 1, ... -- and the batch holds one
 * contiguous [count, ...] tensor per field, one after the other. This file owns that layout:
 * the fields' shapes and offsets for a batch, and the split of arrived samples by field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_int.h"

int bw__arrays_check(const Batchwire__V1__DatasetInfo *info, char *err, size_t errlen)
{
    uint64_t sum = 0;
    for (size_t k = 0; k < info->n_fields; k++) {
        const Batchwire__V1__FieldInfo *f = info->fields[k];
        const Batchwire__V1__SampleLayout *lay = f->layout;
        if (!lay || !lay->dtype || !*lay->dtype || lay->sample_bytes == 0 ||
            lay->n_shape + 1 > BW_LOADER_MAX_NDIM) {
            snprintf(err, errlen,
                     "field '%s' of the job's dataset has no fixed layout of at most %d dims",
                     f->name ? f->name : "?", BW_LOADER_MAX_NDIM - 1);
            return BW_PROTOCOL;
        }
        sum += lay->sample_bytes;
    }
    if (info->n_fields && (!info->layout || info->layout->sample_bytes != sum)) {
        snprintf(err, errlen,
                 "the job's dataset describes samples of %llu bytes but its fields add up to "
                 "%llu",
                 (unsigned long long)(info->layout ? info->layout->sample_bytes : 0),
                 (unsigned long long)sum);
        return BW_PROTOCOL;
    }
    return BW_OK;
}

int bw__batch_plan_arrays(bw_batch *b, const Batchwire__V1__DatasetInfo *info)
{
    if (!info->n_fields)
        return BW_OK;
    if (!b->arrays && !(b->arrays = calloc(info->n_fields, sizeof(*b->arrays))))
        return BW_NOMEM;
    b->narrays = info->n_fields;
    size_t off = 0;
    for (size_t k = 0; k < info->n_fields; k++) {
        const Batchwire__V1__FieldInfo *f = info->fields[k];
        bw__array *a = &b->arrays[k];
        a->name = f->name;
        a->dtype = f->layout->dtype;
        a->ndim = 1 + f->layout->n_shape;
        a->shape[0] = b->count;
        for (size_t d = 0; d < f->layout->n_shape; d++)
            a->shape[d + 1] = f->layout->shape[d];
        a->row_bytes = f->layout->sample_bytes;
        a->offset = off;
        off += b->count * (size_t)a->row_bytes;
    }
    return BW_OK;
}

int bw__batch_unpack_arrays(bw_batch *b, const size_t *from, uint64_t sample_bytes)
{
    size_t total = b->count * (size_t)sample_bytes;
    int rc = bw__batch_reserve(b, total);
    if (rc != BW_OK)
        return rc;
    size_t at = 0; /* field k's bytes within a sample */
    for (size_t k = 0; k < b->narrays && b->count; k++) {
        const bw__array *a = &b->arrays[k];
        size_t row = (size_t)a->row_bytes;
        uint8_t *to = b->data + a->offset;
        for (size_t i = 0; i < b->count; i++)
            memcpy(to + i * row, b->scratch + from[i] * sample_bytes + at, row);
        at += row;
    }
    for (size_t i = 0; i < b->count; i++) {
        b->offsets[i] = 0;
        b->sizes[i] = 0;
    }
    b->nbytes = total;
    return BW_OK;
}

size_t bw_batch_narrays(const bw_batch *b)
{
    return b->narrays;
}

int bw_batch_array(const bw_batch *b, size_t k, bw_array *out)
{
    if (k >= b->narrays)
        return BW_OUT_OF_RANGE;
    const bw__array *a = &b->arrays[k];
    *out = (bw_array){a->name,  a->dtype,  a->ndim,
                      a->shape, a->offset, b->count * (size_t)a->row_bytes};
    return BW_OK;
}
