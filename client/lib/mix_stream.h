/* Mixture jobs with stream sources (mix_stream.c; docs/semantics.md, "Streams in a mixture"):
 * a batch's map-style samples and stream records read together, and the cursor's per-stream
 * records and offsets. Nothing here is part of the public API. */
#ifndef BW_CLIENT_MIX_STREAM_H
#define BW_CLIENT_MIX_STREAM_H

#include "batch_int.h"
#include "fetch.h"
#include "jobs/plan.h"
#include "stream_fetch.h"

typedef struct bw__mixstream bw__mixstream;

/* The stream sources of a mixture job (job->config->mixture with a source marked `stream`):
 * *out NULL when it has none. The job summary is borrowed and must outlive the context.
 * BW_OK, or BW_NOMEM / BW_PROTOCOL with a sentence. */
int bw__mixstream_open(bw__mixstream **out, const Batchwire__V1__JobSummary *job, char *err,
                       size_t errlen);
/* Accepts NULL. */
void bw__mixstream_free(bw__mixstream *ms);

/* Fills b (its sources and indices from the plan: a stream source's index is its record)
 * with its samples in batch order: the map-style ones by index (bw__fetch_batch), each stream
 * source's records as runs through ReadStream from the owner of the record's file. ctx is
 * the loader's (its mixture, transports and placement). On error b->err says why. */
int bw__mixstream_fetch_batch(const bw__fetch_ctx *ctx, bw__mixstream *ms, bw_batch *b);

/* A cursor's stream fields for `step` of `rank`: stream_position, and for each mixture source
 * j source_records[j] (a stream: the record it reads next, bw__mixture_next_record) and
 * source_offsets[j] (that record's byte offset in its file); 0 for map-style sources. Arrays
 * malloc'ed: free them. */
int bw__mixstream_cursor_fill(const bw__fetch_ctx *ctx, bw__mixstream *ms, const bw__plan *plan,
                              uint32_t rank, uint64_t step, Batchwire__V1__Cursor *c, char *err,
                              size_t errlen);
/* Checks a cursor's stream fields against the formula for its step (BW_MISMATCH with a
 * sentence) and learns its offsets, so each stream resumes by seek. */
int bw__mixstream_cursor_check(bw__mixstream *ms, const bw__plan *plan,
                               const Batchwire__V1__Cursor *c, uint32_t rank, char *err,
                               size_t errlen);

#endif
