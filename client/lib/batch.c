/* Batches handed to the trainer: storage and accessors. */
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "batch_int.h"

int bw__batch_init(bw_batch *b, size_t max_count, size_t data_bytes, bool pinned)
{
    memset(b, 0, sizeof(*b));
    b->device = -1;
    if (data_bytes && pinned && (b->data = bw__gpu_host_alloc(data_bytes, true)) != NULL) {
        b->pinned = true;
        b->cap = data_bytes;
    }
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
    bw__gpu_host_free(b->data, b->pinned);
    bw__gpu_free(b->gpu, b->dev);
    bw__gpu_stream_free(b->gpu);
    bw__batch_fields_free(b);
    free(b->arrays);
    free(b->scratch);
    memset(b, 0, sizeof(*b));
}

int bw__batch_reserve(bw_batch *b, size_t nbytes)
{
    if (nbytes <= b->cap)
        return BW_OK;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < nbytes)
        cap *= 2;
    uint8_t *d = bw__gpu_host_alloc(cap, b->pinned);
    if (!d)
        return BW_NOMEM;
    if (b->data)
        memcpy(d, b->data, b->cap);
    bw__gpu_host_free(b->data, b->pinned);
    b->data = d;
    b->cap = cap;
    return BW_OK;
}

int bw__batch_to_device(bw_batch *b)
{
    if (!b->gpu)
        return BW_OK;
    int rc;
    if (b->nbytes > b->dev_cap) {
        bw__gpu_free(b->gpu, b->dev);
        b->dev = NULL;
        b->dev_cap = 0;
        if ((rc = bw__gpu_alloc(b->gpu, b->nbytes, &b->dev, b->err, sizeof(b->err))) != BW_OK)
            return rc;
        b->dev_cap = b->nbytes;
    }
    return bw__gpu_copy(b->gpu, b->dev, b->data, b->nbytes, b->err, sizeof(b->err));
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
    return b->gpu ? b->dev : b->data;
}

const void *bw_batch_host_data(const bw_batch *b)
{
    return b->data;
}

int bw_batch_device(const bw_batch *b)
{
    return b->gpu ? b->device : -1;
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
    if (b->narrays)
        return BW_FAILED_PRECONDITION; /* rows of several tensors: bw_batch_array */
    if (i >= b->count)
        return BW_OUT_OF_RANGE;
    *size = b->sizes[i];
    *data = *size ? b->data + b->offsets[i] : b->data; /* no arithmetic on a NULL buffer */
    return BW_OK;
}
