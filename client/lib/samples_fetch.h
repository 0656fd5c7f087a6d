/* The map-style kind of read (samples_fetch.c): a batch's samples by dataset index, through the
 * one fetch loop (fetch.h). Nothing here is part of the public API. */
#ifndef BW_CLIENT_SAMPLES_FETCH_H
#define BW_CLIENT_SAMPLES_FETCH_H

#include "batch_int.h"
#include "fetch.h"

/* Fills b->data with the samples of b->indices[0..count) in order, from the workers that own
 * them. On error b->err says why. */
int bw__fetch_batch(const bw__fetch_ctx *ctx, bw_batch *b);

/* A batch of bw__fetch_batches whose samples have all arrived, laid out (b->rc says how that
 * went): the caller's from then on, touched by the fetch no more. Called on the fetching
 * thread. */
typedef void (*bw__batch_done_fn)(void *arg, bw_batch *b);

/* Fills bs[0..nb) as bw__fetch_batch does each; batches of fixed-size samples of one epoch
 * with one fetch, so that a worker is asked for its samples of all of them in one request.
 * Each batch complete while others are still on their way is handed over at once, in order,
 * through done (when not NULL). Each batch's rc and err say how it ended; returns the first
 * error, or BW_OK. */
int bw__fetch_batches(const bw__fetch_ctx *ctx, bw_batch *const *bs, size_t nb,
                      bw__batch_done_fn done, void *done_arg);

#endif
