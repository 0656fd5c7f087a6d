/* Batches handed to the trainer: storage and accessors. */
#include <stdlib.h>
#include <string.h>

#include "loader_int.h"

int bw__batch_init(bw_batch *b, size_t max_count)
{
    memset(b, 0, sizeof(*b));
    size_t n = max_count ? max_count : 1;
    b->indices = calloc(n, sizeof(*b->indices));
    b->padding = calloc(n, sizeof(*b->padding));
    b->offsets = calloc(n, sizeof(*b->offsets));
    b->sizes = calloc(n, sizeof(*b->sizes));
    if (!b->indices || !b->padding || !b->offsets || !b->sizes) {
        bw__batch_free(b);
        return BW_NOMEM;
    }
    return BW_OK;
}

void bw__batch_free(bw_batch *b)
{
    free(b->indices);
    free(b->padding);
    free(b->offsets);
    free(b->sizes);
    free(b->data);
    memset(b, 0, sizeof(*b));
}

int bw__batch_reserve(bw_batch *b, size_t nbytes)
{
    if (nbytes <= b->cap)
        return BW_OK;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < nbytes)
        cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d)
        return BW_NOMEM;
    b->data = d;
    b->cap = cap;
    return BW_OK;
}

uint64_t bw_batch_epoch(const bw_batch *b)
{
    return b->epoch;
}

uint64_t bw_batch_step(const bw_batch *b)
{
    return b->step;
}

size_t bw_batch_count(const bw_batch *b)
{
    return b->count;
}

size_t bw_batch_real(const bw_batch *b)
{
    return b->real;
}

const uint64_t *bw_batch_indices(const bw_batch *b)
{
    return b->indices;
}

const uint8_t *bw_batch_padding(const bw_batch *b)
{
    return b->padding;
}

const void *bw_batch_data(const bw_batch *b)
{
    return b->data;
}

size_t bw_batch_nbytes(const bw_batch *b)
{
    return b->nbytes;
}

const char *bw_batch_dtype(const bw_batch *b)
{
    return b->dtype ? b->dtype : "";
}

size_t bw_batch_ndim(const bw_batch *b)
{
    return b->ndim;
}

const uint64_t *bw_batch_shape(const bw_batch *b)
{
    return b->shape;
}

int bw_batch_sample(const bw_batch *b, size_t i, const void **data, size_t *size)
{
    if (i >= b->count)
        return BW_OUT_OF_RANGE;
    *data = b->data + b->offsets[i];
    *size = b->sizes[i];
    return BW_OK;
}
