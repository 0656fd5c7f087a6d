/*
 * The one fetch loop (docs/architecture.md, "The client"): map-style batches and stream
 * batches are lists of items -- samples by dataset index, or stream records -- that the loop
 * routes to workers (route.h), asks for over a transport (transport.h) and receives straight
 * into place, retrying and failing over until every item has arrived or the deadline passes.
 * What differs between the two kinds of read is a small table (bw__fetch_kind): which items
 * may share a request, and the request message.
 */
#ifndef BW_CLIENT_FETCH_H
#define BW_CLIENT_FETCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/arena.h"
#include "data.pb-c.h"
#include "jobs.pb-c.h"
#include "transport.h"

/* Items per request at most: a worker's request-size limit is never approached. A fetch
 * lasting longer than BW_FETCH_PROGRESS_AFTER_MS tells its owner of completed samples
 * (bw__fetch_dest.progress). */
enum { BW_FETCH_MAX_PER_REQUEST = 1 << 16, BW_FETCH_PROGRESS_AFTER_MS = 10 };

typedef struct bw__fetch_item {
    uint64_t key;      /* what the worker sends back: dataset index, or record number */
    uint32_t src;      /* streams: the record's source; mixtures: the sample's */
    size_t first;      /* its first position in the batch */
    uint64_t max_size; /* the largest size a worker may announce for it */
    uint64_t size, got;
    uint8_t *buf; /* its own buffer (samples of differing sizes) until packed */
    bool direct;  /* ... or in place in the batch buffer, at `off` */
    size_t off;
    bool started, done;
    bool probe; /* asks for no bytes (a stream offset): done when its request succeeds */
} bw__fetch_item;

typedef struct bw__fetch_kind {
    uint32_t req_kind; /* BW_DCHAN_KIND_READ_SAMPLES or _READ_STREAM */
    /* The storage shard (of num_shards) an item is routed by; NULL: its key's block's
     * (the context's block), modulo (bw__placement_shard, BW_SHARD_MODULO), without a call
     * an item. */
    uint32_t (*shard)(void *kctx, const bw__fetch_item *it, uint32_t num_shards);
    /* Whether b may follow a in one request (both pending, a before b); NULL: any items of
     * one worker may. */
    bool (*joins)(const bw__fetch_item *a, const bw__fetch_item *b);
    /* The request for items[0..n) (pending, in order) from a worker of placement p: *out from
     * arena a. `checked`: the request carries p's version for the worker to check. */
    int (*message)(void *kctx, bw__fetch_item *const *items, size_t n, const bw__placement *p,
                   bool checked, bw_arena *a, ProtobufCMessage **out);
    /* A request ended with res, its first k items complete (NULL: nothing to learn). */
    void (*finished)(void *kctx, bw__fetch_item *const *items, size_t k, const bw__xres *res);
    void *kctx;
} bw__fetch_kind;

/* What the loop counts (the loader's statistics, bw_loader_get_stats), each where it
 * happens: requests started, requests that ended without all their samples and whose rest
 * was asked again (retries), workers found failed during a fetch and routed around
 * (failovers), busy answers, and the samples and sample bytes that arrived. */
typedef struct bw__fetch_stats {
    atomic_uint_fast64_t requests, retries, failovers, busy;
    atomic_uint_fast64_t samples_received, bytes_received;
} bw__fetch_stats;

/* Workers this loader found failed in recent fetches (silent for an attempt's time,
 * unreachable, gone mid-request): later fetches route around them from their start, as around
 * a worker that failed during the fetch itself (route.h), until `until`: one attempt's time
 * after the first failure, doubled with each failure in a row up to BW_FETCH_AVOID_MAX_MS. A
 * request it answers forgets it, and so does its return at another address. So a worker that stays
 * up but stops answering -- its disk stalls, one direction of its network is cut -- costs a loader
 * one attempt now and then, not one per batch, while the coordinator still lists it
 * (docs/operating.md, "Networks"). */
enum { BW_FETCH_AVOID_MAX = 64, BW_FETCH_AVOID_MAX_MS = 30000 };
typedef struct bw__fetch_avoid {
    pthread_mutex_t mu;
    size_t n;
    struct {
        char *id;
        char *address;    /* where it failed: at another address it is another process */
        uint64_t until;   /* monotonic ms */
        unsigned strikes; /* failures in a row */
    } e[BW_FETCH_AVOID_MAX];
} bw__fetch_avoid;

void bw__fetch_avoid_init(bw__fetch_avoid *a);
void bw__fetch_avoid_destroy(bw__fetch_avoid *a);

typedef struct bw__fetch_ctx {
    /* The current placement table, a reference (refreshed first when `refresh`); NULL when
     * none was ever fetched (err says why). */
    bw__placement *(*placement)(void *arg, bool refresh, char *err, size_t errlen);
    void *placement_arg;
    bw__transport preferred; /* the data channel (ops NULL: never) */
    bw__transport fallback;  /* gRPC: every worker has it */
    const Batchwire__V1__Dataset *dataset;
    const char *fingerprint;   /* the dataset's, checked by workers */
    uint64_t sample_bytes;     /* fixed sample size, 0 if samples differ */
    uint64_t max_sample_bytes; /* the largest sample a worker may announce */
    /* Map-style samples are routed by the shard of their block of this many neighbouring
     * indices (bw__placement_shard; 0 or 1: each alone), and requests say so
     * (Routing.block_samples). */
    uint32_t block;
    uint32_t max_message_bytes; /* asked of gRPC streams */
    int timeout_ms;             /* for one batch, all retries included */
    /* One attempt's: a worker that sends nothing for this long (or a gRPC call not done in
     * it) has failed, and its samples go elsewhere while the batch's time lasts. 0: a third
     * of timeout_ms, at least 1000. */
    int attempt_ms;
    bw__fetch_stats *stats; /* counted into when not NULL */
    bw__fetch_avoid *avoid; /* remembered across fetches when not NULL */
    bool field_table;       /* tar: ask for each sample's field table (formats/field_table.h) */
    /* The job's transform (canonical text; NULL: none), the member it runs on ("" or NULL:
     * the whole sample) and the sampler's seed: sent with every ReadSamples request, with the
     * batch's epoch (docs/transforms.md, "On the workers"). */
    const char *transform, *transform_field;
    uint64_t seed;
    /* A mixture job (docs/semantics.md, "Mixtures"), or NULL: an item of source j (its src)
     * is read from mixture->sources[j]->dataset, checked against mix_infos[j]'s fingerprint,
     * instead of `dataset` and `fingerprint`. */
    const Batchwire__V1__Mixture *mixture;
    Batchwire__V1__DatasetInfo *const *mix_infos;
} bw__fetch_ctx;

/*
 * Where received bytes go: into the batch. Samples of a fixed size (sample_bytes) go to
 * b->data + first * sample_bytes. Samples of differing sizes go straight into b->data, laid out
 * in batch order, while they arrive in that order and the buffer has room (positions
 * [0, pos) fill b->data up to off; the buffer is never reallocated while bytes are in flight);
 * the others into buffers of their own, copied into place by bw__fetch_pack.
 */
struct bw_batch;
typedef struct bw__fetch_dest {
    struct bw_batch *b;
    uint64_t sample_bytes;
    size_t pos, off;
    uint8_t *base; /* fixed-size samples go to base + first * sample_bytes (NULL: b->data) */
    /* Several batches in one fetch (fixed-size samples only; bw__fetch_batches): position
     * `first` is sample first % stride of the batch whose bytes start at
     * bases[first / stride]. NULL: one batch, as above. */
    uint8_t *const *bases;
    size_t stride;
    /* Called, when set, once the fetch has lasted BW_FETCH_PROGRESS_AFTER_MS, if samples
     * completed by then, and after each read that completed samples from then on: the owner
     * may take the batches whose items are all done -- their bytes are in place and the fetch
     * touches them no more (bw__fetch_batches hands each batch of a group over so). A fetch
     * over sooner makes no call: its batches are all the owner's at once, at no cost per
     * batch. */
    void (*progress)(void *arg);
    void *progress_arg;
} bw__fetch_dest;

/*
 * Receives items[0..n) (pending ones: not done), routing each by its shard, until every one
 * is done, into `dest` (NULL: every item into a buffer of its own; freed by
 * bw__fetch_items_free). BW_OK, or an error with a sentence in err: a non-retryable one from
 * a worker (the data itself is bad), BW_UNAVAILABLE at the deadline, BW_NOMEM.
 */
int bw__fetch_items(const bw__fetch_ctx *ctx, const bw__fetch_kind *kind, bw__fetch_item *items,
                    size_t n, bw__fetch_dest *dest, char *err, size_t errlen);
void bw__fetch_items_free(bw__fetch_item *items, size_t n);

/* Lays the batch's data out in batch order: position i holds item uid[i] (uid NULL: item
 * i), from where bw__fetch_items put it. BW_OK or BW_NOMEM. */
int bw__fetch_pack(struct bw_batch *b, bw__fetch_item *items, const size_t *uid,
                   const bw__fetch_dest *dest);

#endif
