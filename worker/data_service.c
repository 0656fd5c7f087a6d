/* The Data service: Describe, ReadSamples and ReadStream. Every failure is a status with a
 * sentence naming the dataset, file, offset and reason; the worker keeps serving. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "data.h"
#include "placement/placement.h"
#include "worker.h"

static const char *first_source(const Batchwire__V1__Dataset *spec)
{
    return spec && spec->n_sources ? spec->sources[0] : "";
}

/* Opens and (when `index`) indexes the dataset; checks the expected fingerprint. On failure
 * the sentence in err names the method and the dataset. */
static int open_dataset_err(bw_worker *w, const char *peer, const char *method,
                            const Batchwire__V1__Dataset *spec, const char *fingerprint, bool index,
                            bw__wds **out, char *err, size_t errlen)
{
    char why[1024];
    bw__wds *e = NULL;
    int rc = bw__ds_get(w->datasets, spec, &e, why, sizeof(why));
    if (rc == BW_OK && index)
        rc = bw__dataset_index(bw__ds_dataset(e), why, sizeof(why));
    if (rc == BW_OK && fingerprint && fingerprint[0] &&
        strcmp(fingerprint, bw__ds_dataset(e)->fingerprint) != 0) {
        snprintf(why, sizeof(why),
                 "dataset fingerprint is %s, the request expects %s: the files changed since the "
                 "job described them",
                 bw__ds_dataset(e)->fingerprint, fingerprint);
        rc = BW_MISMATCH;
    }
    if (rc != BW_OK) {
        bw__ds_put(e);
        BW_DEBUG("worker=%s %s from %s: %s: %s", w->id, method, peer, bw_err_name(rc), why);
        snprintf(err, errlen, "%s: dataset %s %s%s: %s", method,
                 spec && spec->format ? spec->format : "?", first_source(spec),
                 spec && spec->n_sources > 1 ? ",..." : "", why);
        return rc;
    }
    *out = e;
    return BW_OK;
}

static int open_dataset(bw_worker *w, bw_rpc_call *call, const char *method,
                        const Batchwire__V1__Dataset *spec, const char *fingerprint, bool index,
                        bw__wds **out)
{
    char err[1200];
    int rc = open_dataset_err(w, bw__rpc_call_peer(call), method, spec, fingerprint, index, out,
                              err, sizeof(err));
    return rc == BW_OK ? BW_OK : bw__rpc_fail(call, rc, "%s", err);
}

static size_t message_limit(bw_worker *w, uint32_t asked)
{
    size_t limit = (size_t)w->cfg->common.max_message_bytes;
    if (asked && asked < limit)
        limit = asked < BW_DATA_MIN_MESSAGE ? BW_DATA_MIN_MESSAGE : asked;
    return limit;
}

/* Opens, indexes and describes the dataset: may read whole files (building a record index),
 * so it runs on a thread of its own, never on a completion-queue thread. */
static int describe(bw_worker *w, bw_rpc_call *call, const Batchwire__V1__DescribeRequest *r,
                    ProtobufCMessage **resp)
{
    bw__wds *e = NULL;
    int rc = open_dataset(w, call, "Describe", r->dataset, NULL, true, &e);
    if (rc != BW_OK)
        return rc;
    const bw__dataset *d = bw__ds_dataset(e);
    bw_arena *a = bw__rpc_call_arena(call);
    Batchwire__V1__DescribeResponse *out = bw__arena_alloc(a, sizeof(*out));
    Batchwire__V1__DatasetInfo *info = bw__arena_alloc(a, sizeof(*info));
    Batchwire__V1__SampleLayout *lay = bw__arena_alloc(a, sizeof(*lay));
    Batchwire__V1__SourceInfo *srcs = bw__arena_alloc(a, (d->nsources + 1) * sizeof(*srcs));
    Batchwire__V1__SourceInfo **sp = bw__arena_alloc(a, (d->nsources + 1) * sizeof(*sp));
    uint64_t *shape = bw__arena_alloc(a, (BW_FMT_MAX_DIMS + 1) * sizeof(*shape));
    if (!out || !info || !lay || !srcs || !sp || !shape) {
        bw__ds_put(e);
        return bw__rpc_fail(call, BW_TOO_BIG, "Describe: the description of %zu sources is too big",
                            d->nsources);
    }
    batchwire__v1__describe_response__init(out);
    batchwire__v1__dataset_info__init(info);
    batchwire__v1__sample_layout__init(lay);
    out->info = info;
    info->format = (char *)d->ops->name;
    info->length = d->length;
    info->fingerprint = bw__arena_strdup(a, d->fingerprint);
    info->total_bytes = d->total_bytes;
    info->layout = lay;
    lay->dtype = bw__arena_strdup(a, d->layout.dtype);
    lay->n_shape = (size_t)d->layout.ndim;
    memcpy(shape, d->layout.shape, sizeof(uint64_t) * (size_t)d->layout.ndim);
    lay->shape = shape;
    lay->sample_bytes = d->layout.sample_bytes;
    info->n_sources = d->nsources;
    info->sources = sp;
    for (size_t i = 0; i < d->nsources; i++) {
        const bw__source *s = d->sources[i];
        batchwire__v1__source_info__init(&srcs[i]);
        srcs[i].path = bw__arena_strdup(a, s->path);
        srcs[i].size_bytes = s->size;
        srcs[i].records = s->count;
        srcs[i].first_index = d->first[i];
        srcs[i].mtime_ns = s->mtime_ns;
        if (!srcs[i].path) {
            bw__ds_put(e);
            return bw__rpc_fail(call, BW_TOO_BIG, "Describe: the description is too big");
        }
        sp[i] = &srcs[i];
    }
    bw__ds_put(e); /* the strings live in the arena; format names are static */
    *resp = &out->base;
    return BW_OK;
}

typedef struct describe_task {
    bw_worker *w;
    bw_rpc_call *call;
    const Batchwire__V1__DescribeRequest *req; /* in the call's arena, alive until finish */
} describe_task;

static void *describe_thread(void *arg)
{
    describe_task *t = arg;
    ProtobufCMessage *resp = NULL;
    int rc = describe(t->w, t->call, t->req, &resp);
    bw__rpc_finish(t->call, rc, resp);
    free(t);
    return NULL;
}

int bw__data_describe(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                      ProtobufCMessage **resp)
{
    bw_worker *w = user;
    describe_task *t = malloc(sizeof(*t));
    pthread_t th;
    pthread_attr_t attr;
    if (t) {
        t->w = w;
        t->call = call;
        t->req = (const void *)req;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int started = pthread_create(&th, &attr, describe_thread, t) == 0;
        pthread_attr_destroy(&attr);
        /* The server's shutdown waits for this call, so the thread may outlive the handler. */
        if (started)
            return BW_RPC_DEFERRED;
        free(t);
    }
    return describe(w, call, (const void *)req, resp); /* no thread: answer inline */
}

/* Routing by source: the shard of the source holding dataset index `index` (indexed). */
static uint32_t source_shard(const bw__dataset *d, uint64_t index, const Batchwire__V1__Routing *rt)
{
    size_t lo = 0, hi = d->nsources;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->first[mid] <= index)
            lo = mid;
        else
            hi = mid;
    }
    return bw__placement_stream_shard((uint32_t)lo, d->sources[lo]->path,
                                      rt->num_shards ? rt->num_shards : 1,
                                      (bw_shard_mode)rt->shard_mode);
}

int bw__data_prepare_samples(bw_worker *w, const char *peer,
                             const Batchwire__V1__ReadSamplesRequest *r, bw__wds **out, char *err,
                             size_t errlen)
{
    *out = NULL;
    if (r->n_indices > BW_DATA_MAX_INDICES) {
        snprintf(err, errlen, "ReadSamples: %zu indices is more than the limit of %d", r->n_indices,
                 BW_DATA_MAX_INDICES);
        return BW_TOO_BIG;
    }
    bw__wds *e = NULL;
    int rc =
        open_dataset_err(w, peer, "ReadSamples", r->dataset, r->fingerprint, true, &e, err, errlen);
    if (rc != BW_OK)
        return rc;
    const bw__dataset *d = bw__ds_dataset(e);
    for (size_t i = 0; i < r->n_indices; i++)
        if (r->indices[i] >= d->length) {
            bw__ds_put(e);
            snprintf(err, errlen,
                     "ReadSamples: dataset %s %s: index %llu requested (position %zu) but the "
                     "dataset has %llu samples",
                     r->dataset->format, first_source(r->dataset),
                     (unsigned long long)r->indices[i], i, (unsigned long long)d->length);
            return BW_OUT_OF_RANGE;
        }
    const Batchwire__V1__Routing *rt = r->routing;
    if (rt && rt->placement_version) {
        uint32_t *shards = malloc((r->n_indices ? r->n_indices : 1) * sizeof(*shards));
        if (!shards)
            abort();
        uint32_t ns = rt->num_shards ? rt->num_shards : 1;
        for (size_t i = 0; i < r->n_indices; i++)
            shards[i] = rt->by_source
                            ? source_shard(d, r->indices[i], rt)
                            : bw__placement_shard(r->indices[i], ns, (bw_shard_mode)rt->shard_mode);
        char why[512];
        rc = bw__pview_check(&w->placement, w->id, rt, shards, r->n_indices, why, sizeof(why));
        free(shards);
        if (rc != BW_OK) {
            bw__ds_put(e);
            snprintf(err, errlen, "ReadSamples: %s", why);
            return rc;
        }
    }
    *out = e;
    return BW_OK;
}

int bw__data_read_samples(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                          ProtobufCMessage **resp)
{
    (void)resp;
    bw_worker *w = user;
    const Batchwire__V1__ReadSamplesRequest *r = (const void *)req;
    bw__wds *e = NULL;
    char err[1400];
    int rc = bw__data_prepare_samples(w, bw__rpc_call_peer(call), r, &e, err, sizeof(err));
    if (rc != BW_OK)
        return bw__rpc_fail(call, rc, "%s", err);
    bw__sstream *st = bw__sstream_samples(e, r->indices, r->n_indices,
                                          message_limit(w, r->max_message_bytes), &w->stats);
    bw__rpc_stream_start(call, bw__sstream_next, st, bw__sstream_free);
    return BW_RPC_STREAM;
}

/* ReadStream with locate_only: one message with one Sample that carries the offset. */
typedef struct locate_state {
    uint64_t record, offset;
    bool sent;
} locate_state;

static int locate_next(void *state, bw_rpc_call *call, bw_rpc_out *out)
{
    locate_state *ls = state;
    if (ls->sent)
        return BW_RPC_END;
    bw_arena *a = bw__rpc_call_msg_arena(call);
    Batchwire__V1__SampleBatch *sb = bw__arena_alloc(a, sizeof(*sb));
    Batchwire__V1__Sample *s = bw__arena_alloc(a, sizeof(*s));
    Batchwire__V1__Sample **sp = bw__arena_alloc(a, sizeof(*sp));
    if (!sb || !s || !sp)
        return bw__rpc_fail(call, BW_NOMEM, "ReadStream: out of memory");
    batchwire__v1__sample_batch__init(sb);
    batchwire__v1__sample__init(s);
    s->index = ls->record;
    s->offset = s->next_offset = ls->offset;
    sp[0] = s;
    sb->n_samples = 1;
    sb->samples = sp;
    out->msg = &sb->base;
    ls->sent = true;
    return BW_OK;
}

static int start_locate(bw_rpc_call *call, uint64_t record, uint64_t offset)
{
    locate_state *ls = calloc(1, sizeof(*ls));
    if (!ls)
        abort();
    ls->record = record;
    ls->offset = offset;
    bw__rpc_stream_start(call, locate_next, ls, free);
    return BW_RPC_STREAM;
}

int bw__data_read_stream(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                         ProtobufCMessage **resp)
{
    (void)resp;
    bw_worker *w = user;
    const Batchwire__V1__ReadStreamRequest *r = (const void *)req;
    bw__wds *e = NULL;
    int rc = open_dataset(w, call, "ReadStream", r->dataset, r->fingerprint, false, &e);
    if (rc != BW_OK)
        return rc;
    const bw__dataset *d = bw__ds_dataset(e);
    if (!d->ops->next) {
        bw__ds_put(e);
        return bw__rpc_fail(call, BW_UNIMPLEMENTED,
                            "ReadStream: format %s is not a stream: use ReadSamples", d->ops->name);
    }
    if (r->source >= d->nsources) {
        bw__ds_put(e);
        return bw__rpc_fail(call, BW_OUT_OF_RANGE,
                            "ReadStream: source %u requested but dataset %s %s has %zu sources",
                            r->source, r->dataset->format, first_source(r->dataset), d->nsources);
    }
    const Batchwire__V1__Routing *rt = r->routing;
    if (rt && rt->placement_version) {
        uint32_t shard = bw__placement_stream_shard(r->source, d->sources[r->source]->path,
                                                    rt->num_shards ? rt->num_shards : 1,
                                                    (bw_shard_mode)rt->shard_mode);
        char err[512];
        rc = bw__pview_check(&w->placement, w->id, rt, &shard, 1, err, sizeof(err));
        if (rc != BW_OK) {
            bw__ds_put(e);
            return bw__rpc_fail(call, rc, "ReadStream: %s", err);
        }
    }
    uint64_t offset = r->offset;
    if (r->seek_record || r->locate_only) {
        /* The offset comes from the source's index: no record before it is read. */
        char err[1024];
        rc = bw__dataset_locate(bw__ds_dataset(e), r->source, r->first_record, &offset, err,
                                sizeof(err));
        if (rc != BW_OK) {
            bw__ds_put(e);
            return bw__rpc_fail(call, rc, "ReadStream: dataset %s %s: %s", r->dataset->format,
                                first_source(r->dataset), err);
        }
        atomic_fetch_add(&w->stats.records_located, 1);
    }
    if (r->locate_only) {
        bw__ds_put(e);
        return start_locate(call, r->first_record, offset);
    }
    bw__sstream *st = bw__sstream_records(e, r->source, offset, r->first_record, r->max_records,
                                          message_limit(w, r->max_message_bytes), &w->stats);
    bw__rpc_stream_start(call, bw__sstream_next, st, bw__sstream_free);
    return BW_RPC_STREAM;
}

int bw__data_get_stats(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                       ProtobufCMessage **resp)
{
    (void)req;
    bw_worker *w = user;
    Batchwire__V1__StatsResponse *out = bw__arena_alloc(bw__rpc_call_arena(call), sizeof(*out));
    if (!out)
        return bw__rpc_fail(call, BW_NOMEM, "Stats: out of memory");
    batchwire__v1__stats_response__init(out);
    out->records_read = atomic_load(&w->stats.records_read);
    out->record_bytes_read = atomic_load(&w->stats.record_bytes_read);
    out->records_located = atomic_load(&w->stats.records_located);
    *resp = &out->base;
    return BW_OK;
}
