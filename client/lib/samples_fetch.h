/* The map-style kind of read (samples_fetch.c): a batch's samples by dataset index, through the
 * one fetch loop (fetch.h). Nothing here is part of the public API. */
#ifndef BW_CLIENT_SAMPLES_FETCH_H
#define BW_CLIENT_SAMPLES_FETCH_H

#include "batch_int.h"
#include "fetch.h"

/* Fills b->data with the samples of b->indices[0..count) in order, from the workers that own
 * them. On error b->err says why. */
int bw__fetch_batch(const bw__fetch_ctx *ctx, bw_batch *b);

#endif
