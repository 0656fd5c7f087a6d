/*
 * Mixture jobs with stream sources (docs/semantics.md, "Streams in a mixture"). The plan gives
 * each sample's source and, for a stream source, the record it reads (pass-relative: under
 * `cycle` a new pass starts again at record 0). A stream source's record k is record
 * k - start[f] of its f-th file (start: the prefix sums of its files' record counts, from the
 * source's own description), read as a single stream's are (stream_fetch.c): runs of
 * consecutive records of one file in one ReadStream, from the worker that owns the file, by
 * offset when known, else by the worker's offset index: every stream source of a batch in one
 * fetch, its files numbered across the sources. The map-style samples of the batch are then
 * read by index as for any mixture (samples_fetch.c), and everything is laid out in batch
 * order. A cursor records where each stream stands (docs/streams.md, "Resume by seek").
 */
#include "mix_stream.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs/mixture.h"
#include "jobs/stream_order.h"
#include "samples_fetch.h"

typedef struct mix_source {
    bw__stream_ctx *sc;                     /* a stream source's files; NULL: map-style */
    const Batchwire__V1__Dataset *dataset;  /* borrowed from the job summary */
    const Batchwire__V1__DatasetInfo *info; /* its description (mix_sources[j]) */
    bw__stream_order files;                 /* its files in declared order: record -> file */
} mix_source;

struct bw__mixstream {
    size_t n;
    mix_source *src;
    /* The stream sources' files numbered together (an item's src in one fetch of every stream
     * source of a batch): file g is file g - base[j] of source owner[g]. */
    size_t nfiles;
    uint32_t *owner;
    uint64_t *base; /* per source */
};

void bw__mixstream_free(bw__mixstream *ms)
{
    if (!ms)
        return;
    for (size_t j = 0; j < ms->n; j++) {
        bw__stream_free(ms->src[j].sc);
        bw__stream_order_free(&ms->src[j].files);
    }
    free(ms->src);
    free(ms->owner);
    free(ms->base);
    free(ms);
}

int bw__mixstream_open(bw__mixstream **out, const Batchwire__V1__JobSummary *job, char *err,
                       size_t errlen)
{
    *out = NULL;
    const Batchwire__V1__Mixture *mx = job->config ? job->config->mixture : NULL;
    bool any = false;
    for (size_t j = 0; mx && j < mx->n_sources; j++)
        any = any || mx->sources[j]->stream;
    if (!any)
        return BW_OK;
    const Batchwire__V1__DatasetInfo *d = job->dataset;
    if (d->n_mix_sources != mx->n_sources) {
        snprintf(err, errlen,
                 "job '%s' is a mixture of %zu sources but the coordinator described %zu",
                 job->name, mx->n_sources, d->n_mix_sources);
        return BW_PROTOCOL;
    }
    bw__mixstream *ms = calloc(1, sizeof(*ms));
    if (ms && !(ms->src = calloc(mx->n_sources, sizeof(*ms->src)))) {
        free(ms);
        ms = NULL;
    }
    if (!ms) {
        snprintf(err, errlen, "out of memory for a mixture of %zu sources", mx->n_sources);
        return BW_NOMEM;
    }
    ms->n = mx->n_sources;
    int rc = BW_OK;
    for (size_t j = 0; j < ms->n && rc == BW_OK; j++) {
        mix_source *s = &ms->src[j];
        s->dataset = mx->sources[j]->dataset;
        s->info = d->mix_sources[j];
        if (!mx->sources[j]->stream)
            continue;
        if ((rc = bw__stream_open_info(&s->sc, s->info, err, errlen)) != BW_OK)
            break;
        uint64_t *counts = calloc(s->info->n_sources ? s->info->n_sources : 1, sizeof(*counts));
        for (size_t f = 0; counts && f < s->info->n_sources; f++)
            counts[f] = s->info->sources[f]->records;
        rc = counts ? bw__stream_order_init(&s->files, counts, s->info->n_sources, false, 0, 0, err,
                                            errlen)
                    : BW_NOMEM;
        free(counts);
        if (rc == BW_NOMEM)
            snprintf(err, errlen, "out of memory for the files of mixture source %zu", j);
        if (rc == BW_OK && s->files.total != s->info->length) {
            snprintf(err, errlen,
                     "mixture source %zu: its files hold %" PRIu64 " records but it was described "
                     "with %" PRIu64,
                     j, s->files.total, s->info->length);
            rc = BW_PROTOCOL;
        }
    }
    for (size_t j = 0; j < ms->n && rc == BW_OK; j++)
        ms->nfiles += ms->src[j].sc ? ms->src[j].files.nsources : 0;
    if (rc == BW_OK && (!(ms->owner = calloc(ms->nfiles ? ms->nfiles : 1, sizeof(*ms->owner))) ||
                        !(ms->base = calloc(ms->n, sizeof(*ms->base))))) {
        snprintf(err, errlen, "out of memory for the files of a mixture of %zu sources", ms->n);
        rc = BW_NOMEM;
    }
    for (size_t j = 0, g = 0; j < ms->n && rc == BW_OK; j++) {
        ms->base[j] = g;
        for (size_t f = 0; ms->src[j].sc && f < ms->src[j].files.nsources; f++)
            ms->owner[g++] = (uint32_t)j;
    }
    if (rc != BW_OK) {
        bw__mixstream_free(ms);
        return rc;
    }
    *out = ms;
    return BW_OK;
}

/* Record k (<= the source's count) of stream source s: its file and record in that file; the
 * count itself is the end of the last file. */
static void file_of(const mix_source *s, uint64_t k, uint32_t *file, uint64_t *rec)
{
    if (bw__stream_order_locate(&s->files, k, file, rec) != BW_OK) {
        *file = (uint32_t)(s->files.nsources - 1);
        *rec = s->files.counts[*file];
    }
}

/* The loader's fetch settings for source j alone: its dataset and fingerprint. */
static bw__fetch_ctx source_ctx(const bw__fetch_ctx *ctx, const mix_source *s)
{
    bw__fetch_ctx c = *ctx;
    c.dataset = s->dataset;
    c.fingerprint = s->info->fingerprint;
    c.mixture = NULL;
    c.mix_infos = NULL;
    c.sample_bytes = 0;
    return c;
}

/* The batch's map-style samples (positions where !stream) by index, each into all[i]'s own
 * buffer. */
static int fetch_map(const bw__fetch_ctx *ctx, const bw__mixstream *ms, bw_batch *b,
                     bw__fetch_item *all)
{
    size_t n = 0;
    for (size_t i = 0; i < b->count; i++)
        n += ms->src[b->sources[i]].sc == NULL;
    if (n == 0)
        return BW_OK;
    bw_batch sub;
    int rc = bw__batch_init(&sub, n, 0, false);
    if (rc != BW_OK) {
        snprintf(b->err, sizeof(b->err), "out of memory for a batch of %zu samples", n);
        return rc;
    }
    sub.epoch = b->epoch;
    sub.step = b->step;
    sub.mixture = true;
    for (size_t i = 0; i < b->count; i++)
        if (!ms->src[b->sources[i]].sc) {
            sub.indices[sub.count] = b->indices[i];
            sub.sources[sub.count++] = b->sources[i];
        }
    rc = bw__fetch_batch(ctx, &sub);
    if (rc != BW_OK)
        snprintf(b->err, sizeof(b->err), "%s", sub.err);
    for (size_t i = 0, k = 0; rc == BW_OK && i < b->count; i++) {
        if (ms->src[b->sources[i]].sc)
            continue;
        all[i].size = sub.sizes[k];
        if (sub.sizes[k] && !(all[i].buf = malloc(sub.sizes[k]))) {
            snprintf(b->err, sizeof(b->err), "out of memory for a sample of %zu bytes",
                     sub.sizes[k]);
            rc = BW_NOMEM;
            break;
        }
        if (sub.sizes[k])
            memcpy(all[i].buf, sub.data + sub.offsets[k], sub.sizes[k]);
        k++;
    }
    bw__batch_free(&sub);
    return rc;
}

/* One fetch of every stream source's records: each source's settings for its files. */
typedef struct streams_map {
    const bw__mixstream *ms;
    bw__fetch_ctx *ctx; /* per source: the loader's settings with its dataset */
} streams_map;

static void streams_of(void *arg, uint32_t g, const bw__fetch_ctx **ctx, bw__stream_ctx **sc,
                       uint32_t *file)
{
    const streams_map *m = arg;
    uint32_t j = m->ms->owner[g];
    *ctx = &m->ctx[j];
    *sc = m->ms->src[j].sc;
    *file = (uint32_t)(g - m->ms->base[j]);
}

/* The batch's stream records, read in one fetch: listed source by source, each source's in
 * batch order (so a worker's consecutive records of one file share a ReadStream), placed
 * into the batch buffer as they arrive in batch order (a mixture of one stream: as a single
 * stream's), else into buffers of their own; each then moved into all[i]. */
static int fetch_streams(const bw__fetch_ctx *ctx, const bw__mixstream *ms, bw_batch *b,
                         bw__fetch_item *all, bw__fetch_dest *dest)
{
    size_t n = 0;
    for (size_t i = 0; i < b->count; i++)
        n += ms->src[b->sources[i]].sc != NULL;
    if (n == 0)
        return BW_OK;
    bw__fetch_item *items = calloc(n, sizeof(*items));
    bw__fetch_ctx *cx = calloc(ms->n, sizeof(*cx));
    if (!items || !cx) {
        free(items);
        free(cx);
        snprintf(b->err, sizeof(b->err), "out of memory for a batch of %zu records", n);
        return BW_NOMEM;
    }
    int rc = BW_OK;
    size_t t = 0;
    for (uint32_t j = 0; j < ms->n && rc == BW_OK; j++) {
        const mix_source *s = &ms->src[j];
        if (!s->sc)
            continue;
        cx[j] = source_ctx(ctx, s);
        for (size_t i = 0; i < b->count && rc == BW_OK; i++) {
            if (b->sources[i] != j)
                continue;
            if (b->indices[i] >= s->files.total) {
                snprintf(b->err, sizeof(b->err),
                         "mixture source %" PRIu32 ": record %" PRIu64 " is past its %" PRIu64
                         " records",
                         j, b->indices[i], s->files.total);
                rc = BW_INTERNAL;
                break;
            }
            uint32_t file;
            file_of(s, b->indices[i], &file, &items[t].key);
            items[t].src = (uint32_t)(ms->base[j] + file);
            items[t].first = i;
            items[t].max_size = s->info->sources[file]->size_bytes;
            t++;
        }
    }
    streams_map m = {ms, cx};
    bw__stream_map map = {streams_of, &m};
    if (rc == BW_OK)
        rc = bw__stream_fetch_map(ctx, &map, items, n, dest, b->err, sizeof(b->err));
    for (t = 0; rc == BW_OK && t < n; t++) {
        bw__fetch_item *x = &all[items[t].first];
        x->size = items[t].size;
        x->buf = items[t].buf;
        x->direct = items[t].direct;
        x->off = items[t].off;
        items[t].buf = NULL;
    }
    bw__fetch_items_free(items, n);
    free(items);
    free(cx);
    return rc;
}

int bw__mixstream_fetch_batch(const bw__fetch_ctx *ctx, bw__mixstream *ms, bw_batch *b)
{
    b->err[0] = '\0';
    size_t n = b->count;
    bw__fetch_item *all = calloc(n ? n : 1, sizeof(*all));
    if (!all) {
        snprintf(b->err, sizeof(b->err), "out of memory for a batch of %zu samples", n);
        return b->rc = BW_NOMEM;
    }
    int rc = BW_OK;
    for (size_t i = 0; i < n && rc == BW_OK; i++) {
        all[i].first = i;
        if (b->sources[i] >= ms->n) {
            snprintf(b->err, sizeof(b->err), "sample %zu: source %" PRIu32 " of %zu", i,
                     b->sources[i], ms->n);
            rc = BW_INTERNAL;
        }
    }
    bw__fetch_dest dest = {b, 0, 0, 0, NULL, NULL, 0, NULL, NULL};
    if (rc == BW_OK)
        rc = fetch_streams(ctx, ms, b, all, &dest);
    if (rc == BW_OK)
        rc = fetch_map(ctx, ms, b, all);
    if (rc == BW_OK && (rc = bw__fetch_pack(b, all, NULL, &dest)) != BW_OK)
        snprintf(b->err, sizeof(b->err), "out of memory for a batch of %zu samples", n);
    bw__fetch_items_free(all, n);
    free(all);
    return b->rc = rc;
}

/* ---- cursors ---- */

int bw__mixstream_cursor_fill(const bw__fetch_ctx *ctx, bw__mixstream *ms, const bw__plan *plan,
                              uint32_t rank, uint64_t step, Batchwire__V1__Cursor *c, char *err,
                              size_t errlen)
{
    const bw__mixture *m = bw__plan_mixture(plan);
    size_t n = ms->n;
    c->source_offsets = calloc(n, sizeof(uint64_t));
    c->source_records = calloc(n, sizeof(uint64_t));
    if (!c->source_offsets || !c->source_records || !m) {
        snprintf(err, errlen, "out of memory for a cursor of %zu sources", n);
        return BW_NOMEM;
    }
    c->n_source_offsets = c->n_source_records = n;
    c->stream_position = bw__plan_stream_position(plan, rank, step);
    for (size_t j = 0; j < n; j++) {
        const mix_source *s = &ms->src[j];
        if (!s->sc)
            continue;
        uint64_t pass, rec = bw__mixture_next_record(m, (uint32_t)j, c->stream_position, &pass);
        uint32_t file;
        uint64_t in_file;
        file_of(s, rec, &file, &in_file);
        c->source_records[j] = rec;
        bw__fetch_ctx sctx = source_ctx(ctx, s);
        int rc = bw__stream_locate(&sctx, s->sc, file, in_file, &c->source_offsets[j], err, errlen);
        if (rc != BW_OK)
            return rc;
    }
    return BW_OK;
}

int bw__mixstream_cursor_check(bw__mixstream *ms, const bw__plan *plan,
                               const Batchwire__V1__Cursor *c, uint32_t rank, char *err,
                               size_t errlen)
{
    const bw__mixture *m = bw__plan_mixture(plan);
    size_t n = ms->n;
    if (!m) {
        snprintf(err, errlen, "the plan is not a mixture's");
        return BW_INTERNAL;
    }
    /* A cursor without stream fields (an epoch's start; the resume point the coordinator
     * gives a new world after an elastic resume) needs none: each stream's record is the
     * formula's, and its worker seeks to it with its offset index. */
    if (c->n_source_offsets == 0 && c->n_source_records == 0)
        return BW_OK;
    uint64_t pos = bw__plan_stream_position(plan, rank, c->step);
    int rc = bw__stream_cursor_header(c, n, pos, "mixture", rank, err, errlen);
    if (rc != BW_OK)
        return rc;
    for (size_t j = 0; j < n; j++) {
        const mix_source *s = &ms->src[j];
        uint64_t pass, rec = s->sc ? bw__mixture_next_record(m, (uint32_t)j, pos, &pass) : 0;
        uint32_t file = 0;
        uint64_t in_file = 0;
        if (s->sc)
            file_of(s, rec, &file, &in_file);
        uint64_t size = s->sc ? s->info->sources[file]->size_bytes : 0;
        if (c->source_records[j] != rec || c->source_offsets[j] > size) {
            snprintf(err, errlen,
                     "cursor refused: mixture source %zu is at record %" PRIu64 " (offset %" PRIu64
                     ") in the cursor; step %" PRIu64 " is at record %" PRIu64,
                     j, c->source_records[j], c->source_offsets[j], c->step, rec);
            return BW_MISMATCH;
        }
        /* Where this stream resumes: a seek, not a replay. */
        if (s->sc && in_file > 0 && in_file < s->info->sources[file]->records)
            bw__stream_learn(s->sc, file, in_file, c->source_offsets[j]);
    }
    return BW_OK;
}
