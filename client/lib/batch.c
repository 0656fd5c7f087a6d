/* A batch as the loader fills it and hands it out (batch_int.h): its memory and its
 * accessors. The memory: the host buffer -- page-locked (cudaHostAlloc) when the batch goes to
 * a GPU, so the copy is asynchronous, else malloc'ed -- its growth, and the holds that keep a
 * batch's bytes valid after the loader has moved on (bw_loader_hold). The device side is
 * gpu.c's.
 *
 * Holds. A hold points at its slot's buffer while the trainer still has that batch. When the
 * loader fills the slot again (bw__batch_reuse) and the hold is still referenced, the buffer is
 * handed to the hold and the slot continues with a spare buffer (one a released hold gave back)
 * or a new one. So the bytes a view shows are never overwritten, no byte is copied, and a loop
 * that drops each batch's views soon after the next batch arrives settles on one or two spare
 * buffers (docs/client.md, "Views of a batch"). Holds may be released from any thread and after
 * the loader has closed: the loader and its holds share `bw__holds`, reference-counted, whose
 * mutex guards every hold's state. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifdef BW_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "batch_int.h"
#include "gpu.h"

/* Buffers from this size are aligned to and advised into transparent huge pages: a new
 * batch buffer's pages are faulted in by the kernel's copy of the first samples received into
 * it, and with 4 KiB pages those faults were a tenth of the client's CPU at 1 MiB samples
 * (docs/performance.md, "Client"). */
enum { HUGE_FROM = 4 << 20, HUGE_PAGE = 2 << 20 };

static void *plain_alloc(size_t n)
{
    if (n < HUGE_FROM)
        return malloc(n ? n : 1);
    size_t whole = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *p = aligned_alloc(HUGE_PAGE, whole);
    if (p)
        (void)madvise(p, whole, MADV_HUGEPAGE); /* advice: without it, 4 KiB pages */
    return p;
}

/* Page-locked host memory when `pinned` (faster, asynchronous copies to a device), else
 * plain_alloc. */
static void *host_alloc(size_t n, bool pinned)
{
#ifdef BW_HAVE_CUDA
    void *p = NULL;
    if (pinned && cudaHostAlloc(&p, n ? n : 1, cudaHostAllocPortable) == cudaSuccess)
        return p;
    return pinned ? NULL : plain_alloc(n);
#else
    (void)pinned;
    return plain_alloc(n);
#endif
}

static void host_free(void *p, bool pinned)
{
#ifdef BW_HAVE_CUDA
    if (p && pinned) {
        cudaFreeHost(p);
        return;
    }
#else
    (void)pinned;
#endif
    free(p);
}

enum { SPARE_MAX = 8 };

struct bw__holds {
    pthread_mutex_t mu;
    unsigned refs; /* the loader (until it closes) + holds not yet freed */
    bool closed;   /* the loader is gone: buffers given back are freed */
    size_t nspare;
    struct {
        uint8_t *data;
        size_t cap;
        bool pinned;
    } spare[SPARE_MAX];
};

struct bw_hold {
    bw__holds *pool;
    uint8_t *data;
    size_t nbytes, cap;
    bool pinned;
    unsigned refs; /* the trainer's references */
    bool in_slot;  /* the loader still has the batch's slot (and a pointer to this hold) */
    bool detached; /* the buffer is the hold's own */
};

int bw__holds_new(bw__holds **out)
{
    bw__holds *p = calloc(1, sizeof(*p));
    if (!p)
        return BW_NOMEM;
    pthread_mutex_init(&p->mu, NULL);
    p->refs = 1;
    *out = p;
    return BW_OK;
}

/* Drops one reference (p->mu held; it is released here). */
static void holds_put(bw__holds *p)
{
    bool last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (!last)
        return;
    for (size_t i = 0; i < p->nspare; i++)
        host_free(p->spare[i].data, p->spare[i].pinned);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void bw__holds_close(bw__holds *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->closed = true;
    holds_put(p);
}

int bw__hold_take(bw__holds *p, bw_batch *b, bw_hold **out)
{
    pthread_mutex_lock(&p->mu);
    bw_hold *h = b->hold;
    if (!h) {
        h = calloc(1, sizeof(*h));
        if (!h) {
            pthread_mutex_unlock(&p->mu);
            return BW_NOMEM;
        }
        h->pool = p;
        h->data = b->data;
        h->nbytes = b->nbytes;
        h->in_slot = true;
        p->refs++;
        b->hold = h;
    }
    h->refs++;
    pthread_mutex_unlock(&p->mu);
    *out = h;
    return BW_OK;
}

/* b's hold, if any, lets go of b: freed when no view remains, else it takes b's buffer and b
 * continues with a spare one of its kind when `spare` allows, else with none. */
static void leave_hold(bw_batch *b, bool spare)
{
    bw_hold *h = b->hold;
    if (!h)
        return;
    b->hold = NULL;
    bw__holds *p = h->pool;
    pthread_mutex_lock(&p->mu);
    h->in_slot = false;
    if (h->refs == 0) { /* every view was released before the loader came back to b */
        free(h);
        holds_put(p);
        return;
    }
    h->cap = b->cap;
    h->pinned = b->pinned;
    h->detached = true;
    b->data = NULL;
    b->cap = 0;
    for (size_t i = 0; spare && i < p->nspare; i++)
        if (p->spare[i].pinned == b->pinned) {
            b->data = p->spare[i].data;
            b->cap = p->spare[i].cap;
            p->spare[i] = p->spare[--p->nspare];
            break;
        }
    pthread_mutex_unlock(&p->mu);
}

int bw__batch_init(bw_batch *b, size_t max_count, size_t data_bytes, bool pinned)
{
    memset(b, 0, sizeof(*b));
    b->device = -1;
    if (data_bytes && pinned && (b->data = host_alloc(data_bytes, true)) != NULL) {
        b->pinned = true;
        b->cap = data_bytes;
    }
    size_t n = max_count ? max_count : 1;
    b->indices = calloc(n, sizeof(*b->indices));
    b->padding = calloc(n, sizeof(*b->padding));
    b->offsets = calloc(n, sizeof(*b->offsets));
    b->sizes = calloc(n, sizeof(*b->sizes));
    b->sources = calloc(n, sizeof(*b->sources));
    b->passes = calloc(n, sizeof(*b->passes));
    if (!b->indices || !b->padding || !b->offsets || !b->sizes || !b->sources || !b->passes) {
        bw__batch_free(b);
        return BW_NOMEM;
    }
    return BW_OK;
}

void bw__batch_free(bw_batch *b)
{
    leave_hold(b, false); /* held bytes outlive the batch (and the loader) */
    free(b->indices);
    free(b->padding);
    free(b->offsets);
    free(b->sizes);
    free(b->sources);
    free(b->passes);
    host_free(b->data, b->pinned);
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
    uint8_t *d = host_alloc(cap, b->pinned);
    if (!d)
        return BW_NOMEM;
    if (b->data)
        memcpy(d, b->data, b->cap);
    host_free(b->data, b->pinned);
    b->data = d;
    b->cap = cap;
    return BW_OK;
}

void bw__batch_reuse(bw_batch *b)
{
    size_t cap = b->cap;
    leave_hold(b, true);
    /* No spare: a new buffer as large, as the next batch likely needs as much (out of memory:
     * none, and the fetch's own reservation says so). */
    if (!b->data)
        (void)bw__batch_reserve(b, cap);
}

const void *bw_hold_data(const bw_hold *h)
{
    return h->data;
}

size_t bw_hold_nbytes(const bw_hold *h)
{
    return h->nbytes;
}

void bw_hold_release(bw_hold *h)
{
    if (!h)
        return;
    bw__holds *p = h->pool;
    pthread_mutex_lock(&p->mu);
    if (--h->refs > 0 || h->in_slot) {
        pthread_mutex_unlock(&p->mu); /* more views, or the slot frees it when reused */
        return;
    }
    if (h->detached && h->data) {
        if (!p->closed && p->nspare < SPARE_MAX) {
            p->spare[p->nspare].data = h->data;
            p->spare[p->nspare].cap = h->cap;
            p->spare[p->nspare].pinned = h->pinned;
            p->nspare++;
        } else {
            host_free(h->data, h->pinned);
        }
    }
    free(h);
    holds_put(p);
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

const uint32_t *bw_batch_sources(const bw_batch *b)
{
    return b->mixture ? b->sources : NULL;
}

const uint64_t *bw_batch_passes(const bw_batch *b)
{
    return b->has_passes ? b->passes : NULL;
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
