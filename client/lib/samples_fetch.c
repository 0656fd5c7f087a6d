/*
 * The map-style kind of read (fetch.h, bw__fetch_batch): a batch's samples by dataset index.
 * Its items are the batch's distinct indices (padding repeats an index: it is fetched once),
 * routed by the index's shard; any indices one worker owns share its request, a
 * ReadSamplesRequest (a mixture's: of one source, or of several where the worker takes them;
 * docs/data-channel.md, "Several datasets in one request"). The one fetch loop (fetch.c) does
 * the rest; named arrays are split by field afterwards (arrays.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_int.h"
#include "common/log.h"
#include "jobs/mixture.h"
#include "placement/placement.h"
#include "rpc/dchan.h"
#include "samples_fetch.h"

/* Sorts n (key, position) pairs by key, keeping positions in order among equal keys: a stable
 * LSD radix sort over the key bytes that differ, through tmp (as large). A batch in plan order
 * is sorted already and costs one pass; qsort's comparisons through a function pointer were a
 * tenth of the client's time at 256-byte samples (docs/performance.md, "Client"). */
static void sort_pairs(uint64_t *pairs, uint64_t *tmp, size_t n)
{
    uint64_t diff = 0;
    bool sorted = true;
    for (size_t i = 1; i < n; i++) {
        diff |= pairs[2 * i] ^ pairs[0];
        sorted = sorted && pairs[2 * i] >= pairs[2 * i - 2];
    }
    for (unsigned shift = 0; !sorted && shift < 64; shift += 8) {
        if (!(diff >> shift & 0xff))
            continue;
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++)
            count[(pairs[2 * i] >> shift & 0xff) + 1]++;
        for (size_t d = 0; d < 256; d++)
            count[d + 1] += count[d];
        for (size_t i = 0; i < n; i++) {
            size_t to = count[pairs[2 * i] >> shift & 0xff]++;
            tmp[2 * to] = pairs[2 * i];
            tmp[2 * to + 1] = pairs[2 * i + 1];
        }
        memcpy(pairs, tmp, n * 2 * sizeof(uint64_t));
    }
}

/* A stable counting sort of n (key, position) pairs by src[position] (< 256), through tmp:
 * after sort_pairs by index, pairs in (source, index) order. */
static void sort_by_source(uint64_t *pairs, uint64_t *tmp, size_t n, const uint32_t *src)
{
    size_t count[257] = {0};
    for (size_t i = 0; i < n; i++)
        count[(src[pairs[2 * i + 1]] & 0xff) + 1]++;
    if (count[(src[pairs[1]] & 0xff) + 1] == n)
        return; /* one source */
    for (size_t d = 0; d < 256; d++)
        count[d + 1] += count[d];
    for (size_t i = 0; i < n; i++) {
        size_t to = count[src[pairs[2 * i + 1]] & 0xff]++;
        tmp[2 * to] = pairs[2 * i];
        tmp[2 * to + 1] = pairs[2 * i + 1];
    }
    memcpy(pairs, tmp, n * 2 * sizeof(uint64_t));
}

/* The distinct indices of a batch of one dataset, in batch order (the order of their first
 * places), each with its first place; uid[pos] = item. A batch in index order (plan order)
 * compares neighbours; another (shuffled, or padded: padding repeats the first indices) finds
 * repeats in a hash table. Not sorted: a shuffled batch's samples then reach each worker's
 * request in batch order, so the samples one worker sends land in runs of neighbouring places
 * (about two with two workers) rather than one place each -- about half as many pieces for the
 * client to receive into -- and the workers gather them wherever they lie anyway (sorting each
 * batch was 8.6 % of the client's time at 256-byte samples shuffled; docs/performance.md,
 * "Per-sample cost, eleventh pass"). */
static int dedupe_indices(const bw_batch *b, uint64_t max_size, bw__fetch_item *w, size_t *nout,
                          size_t *uid)
{
    size_t n = b->count, m = 0;
    const uint64_t *idx = b->indices;
    bool sorted = true;
    for (size_t i = 1; i < n && sorted; i++)
        sorted = idx[i] >= idx[i - 1];
    if (sorted) {
        for (size_t i = 0; i < n; i++) {
            if (i == 0 || idx[i] != idx[i - 1]) /* the whole item (not cleared before) */
                w[m++] = (bw__fetch_item){.key = idx[i], .first = i, .max_size = max_size};
            uid[i] = m - 1;
        }
        *nout = m;
        return BW_OK;
    }
    unsigned bits = 1;
    while (((size_t)1 << bits) < 2 * n)
        bits++;
    size_t mask = ((size_t)1 << bits) - 1;
    size_t *slot = malloc((mask + 1) * sizeof(*slot)); /* item + 1; 0: empty */
    if (!slot)
        return BW_NOMEM;
    memset(slot, 0, (mask + 1) * sizeof(*slot));
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)((idx[i] * 0x9e3779b97f4a7c15ull) >> (64 - bits));
        while (slot[h] && w[slot[h] - 1].key != idx[i])
            h = (h + 1) & mask;
        if (!slot[h]) {
            w[m] = (bw__fetch_item){.key = idx[i], .first = i, .max_size = max_size};
            slot[h] = ++m;
        }
        uid[i] = slot[h] - 1;
    }
    free(slot);
    *nout = m;
    return BW_OK;
}

/* The batch's distinct samples (indices; for a mixture, (source, index) pairs) with their first
 * position; uid[pos] = item. Padding repeats a sample: it is fetched once. A mixture's are
 * sorted, so that each source's samples are together (samples_join); one dataset's come in
 * batch order (dedupe_indices). */
static int dedupe(const bw_batch *b, uint64_t max_size, bw__fetch_item *w, size_t *nout,
                  size_t *uid)
{
    if (!b->mixture)
        return dedupe_indices(b, max_size, w, nout, uid);
    size_t n = b->count;
    uint64_t *pairs = malloc((n ? n : 1) * 4 * sizeof(uint64_t)); /* and sort_pairs' tmp */
    if (!pairs)
        return BW_NOMEM;
    const uint32_t *src = b->sources; /* BW__MIX_MAX_SOURCES is 256 */
    /* A mixture's (source, index) pairs sort as one key, the source in the bits above the
     * batch's largest index: one radix sort, whose passes over the index's top byte order the
     * sources too (a second sort by source was ~1.5 % of a 2-source fetch's instructions at
     * 256-byte samples; docs/performance.md, "The workers' CPU for a mixture"). Indices too
     * large to leave room for the source take the second sort. */
    uint64_t most = 0;
    uint32_t smost = 0;
    for (size_t i = 0; i < n; i++) {
        most |= b->indices[i];
        smost |= src[i];
    }
    unsigned shift = most ? 64 - (unsigned)__builtin_clzll(most) : 0;
    unsigned sbits = smost ? 32 - (unsigned)__builtin_clz(smost) : 0;
    bool fold = sbits && shift + sbits <= 64; /* then shift < 64 */
    for (size_t i = 0; fold && i < n; i++) {
        pairs[2 * i] = b->indices[i] | (uint64_t)src[i] << shift;
        pairs[2 * i + 1] = i;
    }
    for (size_t i = 0; !fold && i < n; i++) {
        pairs[2 * i] = b->indices[i];
        pairs[2 * i + 1] = i;
    }
    sort_pairs(pairs, pairs + 2 * n, n);
    bool by_src = sbits && !fold; /* equal keys may still differ in source */
    if (by_src)
        sort_by_source(pairs, pairs + 2 * n, n, src);
    uint64_t mask = fold ? ((uint64_t)1 << shift) - 1 : UINT64_MAX;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || pairs[2 * i] != pairs[2 * i - 2] ||
            (by_src && src[pairs[2 * i + 1]] != src[pairs[2 * i - 1]])) {
            /* the whole item (bw__fetch_batches does not clear them first) */
            w[m++] = (bw__fetch_item){.key = pairs[2 * i] & mask,
                                      .src = src[pairs[2 * i + 1]],
                                      .first = (size_t)pairs[2 * i + 1],
                                      .max_size = max_size};
        }
        uid[pairs[2 * i + 1]] = m - 1;
    }
    free(pairs);
    *nout = m;
    return BW_OK;
}

static bool samples_join(const bw__fetch_item *a, const bw__fetch_item *b)
{
    return a->src == b->src; /* any indices of one worker (and one mixture source) share a
                                request; of several sources, where the worker takes them
                                (fetch.c, joins_all) */
}

/* What a batch's requests are built from: the loader's settings and the batch's epoch (the
 * key of a transform's random choices). */
typedef struct samples_kctx {
    const bw__fetch_ctx *ctx;
    uint64_t epoch;
} samples_kctx;

/* A request of a mixture's items from several sources: the sources it reads, in order of
 * first appearance, and each index's position among them. */
static int several_datasets(const bw__fetch_ctx *ctx, bw__fetch_item *const *items, size_t n,
                            bw_arena *a, Batchwire__V1__ReadSamplesRequest *req)
{
    const Batchwire__V1__Mixture *mx = ctx->mixture;
    uint32_t *of = bw__arena_alloc(a, n * sizeof(uint32_t));
    Batchwire__V1__DatasetRef **refs = bw__arena_alloc(a, mx->n_sources * sizeof(*refs));
    Batchwire__V1__DatasetRef *ref = bw__arena_alloc(a, mx->n_sources * sizeof(*ref));
    uint32_t pos[BW__MIX_MAX_SOURCES];
    if (!of || !refs || !ref || mx->n_sources > BW__MIX_MAX_SOURCES)
        return BW_NOMEM;
    memset(pos, 0xff, sizeof(pos));
    size_t nd = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t j = items[i]->src;
        if (pos[j] == UINT32_MAX) {
            batchwire__v1__dataset_ref__init(&ref[nd]);
            ref[nd].dataset = mx->sources[j]->dataset;
            ref[nd].fingerprint = ctx->mix_infos[j]->fingerprint;
            refs[nd] = &ref[nd];
            pos[j] = (uint32_t)nd++;
        }
        of[i] = pos[j];
    }
    req->n_datasets = nd;
    req->datasets = refs;
    req->n_index_datasets = n;
    req->index_datasets = of;
    return BW_OK;
}

static int samples_message(void *kctx, bw__fetch_item *const *items, size_t n,
                           const bw__placement *p, bool checked, bw_arena *a,
                           ProtobufCMessage **out)
{
    const samples_kctx *k = kctx;
    const bw__fetch_ctx *ctx = k->ctx;
    Batchwire__V1__ReadSamplesRequest *req = bw__arena_alloc(a, sizeof(*req));
    Batchwire__V1__Routing *rt = bw__arena_alloc(a, sizeof(*rt));
    uint64_t *idx = bw__arena_alloc(a, (n ? n : 1) * sizeof(uint64_t));
    Batchwire__V1__Transform *tf = NULL;
    if (ctx->transform && ctx->transform[0] && (tf = bw__arena_alloc(a, sizeof(*tf))) != NULL) {
        batchwire__v1__transform__init(tf);
        tf->spec = (char *)ctx->transform;
        if (ctx->transform_field && ctx->transform_field[0])
            tf->field = (char *)ctx->transform_field;
        tf->seed = ctx->seed;
        tf->epoch = k->epoch;
    }
    if (!req || !rt || !idx || (ctx->transform && ctx->transform[0] && !tf))
        return BW_NOMEM;
    batchwire__v1__routing__init(rt);
    rt->placement_version = checked ? p->version : 0;
    rt->num_shards = p->num_shards;
    rt->shard_mode = BATCHWIRE__V1__SHARD_MODE__SHARD_MODE_MODULO;
    rt->block_samples = ctx->block;
    batchwire__v1__read_samples_request__init(req);
    /* A mixture's request reads one source (samples_join), or, from a worker that speaks it,
     * several (docs/data-channel.md, "Several datasets in one request"). */
    const Batchwire__V1__Mixture *mx = ctx->mixture;
    uint32_t j = n ? items[0]->src : 0, other = 0, most = j;
    for (size_t i = 0; !mx && i < n; i++)
        idx[i] = items[i]->key;
    for (size_t i = 0; mx && i < n; i++) {
        idx[i] = items[i]->key;
        other |= items[i]->src ^ j;
        most = items[i]->src > most ? items[i]->src : most;
    }
    if (mx && most >= mx->n_sources)
        return BW_INTERNAL;
    bool several = mx && other;
    int rc = several ? several_datasets(ctx, items, n, a, req) : BW_OK;
    if (rc != BW_OK)
        return rc;
    if (!several) {
        req->dataset = mx ? mx->sources[j]->dataset : (Batchwire__V1__Dataset *)ctx->dataset;
        req->fingerprint = mx ? ctx->mix_infos[j]->fingerprint : (char *)ctx->fingerprint;
    }
    req->n_indices = n;
    req->indices = idx;
    req->routing = rt;
    req->max_message_bytes = ctx->max_message_bytes;
    req->field_table = ctx->field_table;
    req->transform = tf;
    *out = &req->base;
    return BW_OK;
}

/* Before a batch's fetch: its distinct samples into items (b->count entries; *n of them used,
 * uid[pos] = item) and room for its bytes -- the scratch buffer for named arrays, else the
 * batch buffer when samples have a fixed size. BW_OK, or an error with b->err. */
static int prepare(const bw__fetch_ctx *ctx, bw_batch *b, bw__fetch_item *items, size_t *n,
                   size_t *uid)
{
    b->err[0] = '\0';
    int rc = dedupe(b, ctx->max_sample_bytes, items, n, uid);
    /* Named arrays: whole samples arrive in the scratch buffer, then split by field. */
    size_t want = b->count * (size_t)ctx->sample_bytes;
    if (rc == BW_OK && b->narrays && want > b->scratch_cap) {
        uint8_t *s = realloc(b->scratch, want);
        rc = s ? BW_OK : BW_NOMEM;
        if (s) {
            b->scratch = s;
            b->scratch_cap = want;
        }
    } else if (rc == BW_OK && ctx->sample_bytes && !b->narrays)
        rc = bw__batch_reserve(b, want);
    if (rc != BW_OK)
        snprintf(b->err, sizeof(b->err), "out of memory for a batch of %zu samples", b->count);
    return rc;
}

/* After a batch's fetch ended with rc: its bytes laid out in batch order (uid from prepare;
 * dest: where the fetch put them). b->rc. */
static int finish(bw_batch *b, int rc, bw__fetch_item *items, size_t *uid,
                  const bw__fetch_dest *dest)
{
    if (rc != BW_OK && rc != BW_NOMEM && b->err[0])
        BW_DEBUG("batch fetch failed step=%" PRIu64 " err=%s", b->step, b->err);
    if (rc == BW_OK && b->narrays) {
        for (size_t i = 0; i < b->count; i++) /* uid[i]: the item; where it landed: first */
            // NOLINTNEXTLINE(clang-analyzer-core.uninitialized.ArraySubscript): dedupe set all
            uid[i] = items[uid[i]].first;
        rc = bw__batch_unpack_arrays(b, uid, dest->sample_bytes);
    } else if (rc == BW_OK)
        rc = bw__fetch_pack(b, items, uid, dest);
    return b->rc = rc;
}

int bw__fetch_batch(const bw__fetch_ctx *ctx, bw_batch *b)
{
    return bw__fetch_batches(ctx, &b, 1, NULL, NULL);
}

/* Whether batches bs[0..nb) may be read together: fixed-size samples of one epoch (a
 * transform's random choices are keyed by it), of one dataset or of one mixture's sources
 * (each item names its source: a request of several batches is built as one of one batch). */
static bool together(const bw__fetch_ctx *ctx, bw_batch *const *bs, size_t nb)
{
    bool ok = nb > 1 && ctx->sample_bytes;
    for (size_t j = 0; ok && j < nb; j++)
        ok = bs[j]->mixture == (ctx->mixture != NULL) && bs[j]->epoch == bs[0]->epoch;
    return ok;
}

/* A group's batches, handed over one by one as each completes (bw__fetch_batches): batch j's
 * items are items[at[j], at[j + 1]), its places uid[upos...] for the first not handed over
 * (next); items before `scan` are done. */
typedef struct group {
    const bw__fetch_ctx *ctx;
    bw_batch *const *bs;
    size_t nb, next, scan, upos, stride;
    bw__fetch_item *items;
    const size_t *at;
    size_t *uid;
    bw__batch_done_fn done;
    void *done_arg;
} group;

/* Batch g->next ended with rc: its bytes laid out in batch order (finish), b->rc; the next
 * one is due. */
static bw_batch *finish_next(group *g, int rc)
{
    size_t j = g->next;
    bw_batch *b = g->bs[j];
    bw__fetch_item *own = g->items + g->at[j];
    for (size_t u = 0; rc == BW_OK && u < g->at[j + 1] - g->at[j]; u++)
        own[u].first -= j * g->stride; /* its place in its own batch */
    bw__fetch_dest one = {
        b, g->ctx->sample_bytes, 0, 0, b->narrays ? b->scratch : NULL, NULL, 0, NULL, NULL};
    finish(b, rc, own, g->uid + g->upos, &one);
    g->upos += b->count;
    g->next++;
    return b;
}

/* The fetch's progress (bw__fetch_dest.progress): the batches whose items are all done now,
 * in order, handed over -- so that a batch is not held back by the rest of its group (a
 * group of 32 small batches read under 10 % packet loss delivered them all after the slowest:
 * 5.8 s without a batch; docs/operating.md, "Measured recovery"). */
static void group_progress(void *arg)
{
    group *g = arg;
    while (g->next < g->nb) {
        size_t end = g->at[g->next + 1];
        while (g->scan < end && g->items[g->scan].done)
            g->scan++;
        if (g->scan < end)
            return;
        bw_batch *b = finish_next(g, BW_OK);
        g->done(g->done_arg, b);
    }
}

int bw__fetch_batches(const bw__fetch_ctx *ctx, bw_batch *const *bs, size_t nb,
                      bw__batch_done_fn done, void *done_arg)
{
    bool grouped = together(ctx, bs, nb);
    if (!grouped && nb > 1) {
        int rc = BW_OK;
        for (size_t j = 0; j < nb; j++) {
            int r = bw__fetch_batch(ctx, bs[j]);
            if (r == BW_OK && done)
                done(done_arg, bs[j]);
            rc = rc == BW_OK ? r : rc;
        }
        return rc;
    }
    /* One fetch for all: batch j's positions are j * stride + [0, count), its items
     * items[at[j], at[j + 1]) -- so each worker gets one request for its samples of every
     * batch, not one per batch (docs/performance.md, "Per-sample cost, third pass"). */
    size_t stride = 0, total = 0;
    for (size_t j = 0; j < nb; j++) {
        stride = bs[j]->count > stride ? bs[j]->count : stride;
        total += bs[j]->count;
    }
    size_t *uid = malloc((total ? total : 1) * sizeof(*uid));
    size_t *at = malloc((nb + 1) * sizeof(*at));
    uint8_t **bases = malloc(nb * sizeof(*bases));
    bw__fetch_item *items = malloc((total ? total : 1) * sizeof(*items)); /* set by dedupe */
    int rc = BW_OK;
    if (!uid || !at || !bases || !items) {
        for (size_t j = 0; j < nb; j++) {
            snprintf(bs[j]->err, sizeof(bs[j]->err), "out of memory for a batch of %zu samples",
                     bs[j]->count);
            bs[j]->rc = BW_NOMEM;
        }
        goto out;
    }
    size_t n = 0, pos = 0;
    for (size_t j = 0; j < nb; j++) {
        size_t m = 0;
        bs[j]->err[0] = '\0';
        if (rc == BW_OK)
            rc = prepare(ctx, bs[j], items + n, &m, uid + pos);
        else
            snprintf(bs[j]->err, sizeof(bs[j]->err), "out of memory for a batch of %zu samples",
                     bs[j]->count);
        at[j] = n;
        for (size_t u = n; grouped && u < n + m; u++)
            items[u].first += j * stride;
        n += m;
        pos += bs[j]->count;
        bases[j] = bs[j]->narrays ? bs[j]->scratch : bs[j]->data;
    }
    at[nb] = n;
    samples_kctx kctx = {ctx, bs[0]->epoch};
    /* routed by their blocks' shards, modulo (shard NULL); one dataset's samples all join
     * (samples_join): no call an item for either */
    bw__fetch_kind kind = {BW_DCHAN_KIND_READ_SAMPLES,
                           NULL,
                           ctx->mixture ? samples_join : NULL,
                           samples_message,
                           NULL,
                           &kctx};
    group g = {ctx, bs, nb, 0, 0, 0, stride, items, at, uid, done, done_arg};
    bw__fetch_dest dest = {bs[0],
                           ctx->sample_bytes,
                           0,
                           0,
                           bs[0]->narrays ? bs[0]->scratch : NULL,
                           grouped ? bases : NULL,
                           stride,
                           grouped && done ? group_progress : NULL,
                           &g};
    /* The fetch's own sentence: a batch handed over early is the caller's, err included. */
    char err[sizeof(bs[0]->err)] = "";
    if (rc == BW_OK)
        rc = bw__fetch_items(ctx, &kind, items, n, &dest, err, sizeof(err));
    /* Every batch of a failed group not handed over says why: the fetch's sentence, or the
     * first a batch's preparation wrote. */
    const char *why = err[0] ? err : NULL;
    for (size_t j = g.next; rc != BW_OK && !why && j < nb; j++)
        why = bs[j]->err[0] ? bs[j]->err : NULL;
    for (size_t j = g.next; j < nb; j++) {
        if (rc != BW_OK && bs[j]->err[0] == '\0')
            snprintf(bs[j]->err, sizeof(bs[j]->err), "%s", why ? why : "out of memory");
        if (grouped)
            finish_next(&g, rc);
        else /* one batch, laid out by dest itself */
            finish(bs[j], rc, items, uid, &dest);
    }
    bw__fetch_items_free(items, n);
out:
    free(items);
    free(uid);
    free(at);
    free(bases);
    for (size_t j = 0; j < nb; j++)
        if (bs[j]->rc != BW_OK)
            return bs[j]->rc;
    return BW_OK;
}
