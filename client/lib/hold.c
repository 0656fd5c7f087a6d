/* Holds: a batch's host bytes kept valid after the loader has moved on (bw_loader_hold).
 *
 * A hold points at its slot's buffer while the trainer still has that batch. When the loader
 * reuses the slot and the hold is still referenced, the buffer is handed to the hold and the
 * slot continues with a spare buffer (one a released hold gave back) or none (the fetch then
 * allocates). So the bytes a view shows are never overwritten, no byte is copied, and a loop
 * that drops each batch's views soon after the next batch arrives settles on one or two spare
 * buffers (docs/client.md, "Views of a batch").
 *
 * Holds may be released from any thread and after the loader has closed: the loader and its
 * holds share `bw__holds`, reference-counted, whose mutex guards every hold's state. */
#include <pthread.h>
#include <stdlib.h>

#include "gpu.h"
#include "batch_int.h"
#include "hold.h"

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
        bw__gpu_host_free(p->spare[i].data, p->spare[i].pinned);
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

int bw__hold_take(bw__holds *p, bw_hold **slot_hold, const bw_batch *b, bw_hold **out)
{
    pthread_mutex_lock(&p->mu);
    bw_hold *h = *slot_hold;
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
        *slot_hold = h;
    }
    h->refs++;
    pthread_mutex_unlock(&p->mu);
    *out = h;
    return BW_OK;
}

void bw__hold_leave_slot(bw_hold **slot_hold, bw_batch *b)
{
    bw_hold *h = *slot_hold;
    if (!h)
        return;
    *slot_hold = NULL;
    bw__holds *p = h->pool;
    pthread_mutex_lock(&p->mu);
    h->in_slot = false;
    if (h->refs == 0) { /* every view was released before the loader moved on */
        free(h);
        holds_put(p);
        return;
    }
    /* Still viewed: the buffer becomes the hold's, the slot takes a spare one. */
    h->cap = b->cap;
    h->pinned = b->pinned;
    h->detached = true;
    b->data = NULL;
    b->cap = 0;
    for (size_t i = 0; i < p->nspare; i++)
        if (p->spare[i].pinned == b->pinned) {
            b->data = p->spare[i].data;
            b->cap = p->spare[i].cap;
            p->spare[i] = p->spare[--p->nspare];
            break;
        }
    pthread_mutex_unlock(&p->mu);
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
            bw__gpu_host_free(h->data, h->pinned);
        }
    }
    free(h);
    holds_put(p);
}
