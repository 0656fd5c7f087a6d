/* The Data service over gRPC: Describe, ReadSamples, ReadStream and Stats. Describe, ReadSamples
 * and ReadStream leave the completion-queue thread at once: the handler queues the call on the
 * executor with its charge and returns BW_RPC_DEFERRED; a pool thread then decodes the request
 * (bounded by its charge), opens the read (every check, read_path.c) and begins the stream, or
 * answers the error. Every failure is a status with a sentence naming the dataset, file, offset
 * and reason; the worker keeps serving. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "read_path.h"
#include "request.h"
#include "worker.h"

/* Describe's charge: its response is built in the call's arena. */
enum { DESCRIBE_CHARGE = 1 << 20 };

const bw_rpc_method *const bw__data_raw_methods[] = {
    BW_METHOD(BW_M_DATA_READ_SAMPLES),
    BW_METHOD(BW_M_DATA_READ_STREAM),
};
const size_t bw__data_nraw_methods = sizeof(bw__data_raw_methods) / sizeof(bw__data_raw_methods[0]);

static size_t message_limit(bw_worker *w, uint32_t asked)
{
    size_t limit = (size_t)w->cfg->common.max_message_bytes;
    if (asked && asked < limit)
        limit = asked < BW_DATA_MIN_MESSAGE ? BW_DATA_MIN_MESSAGE : asked;
    return limit;
}

/* Ends a deferred call that was not admitted (rc from the executor, with its sentence). */
static void refuse(bw_rpc_call *call, const char *method, int rc, const bw__exec_task *t)
{
    if (rc == BW_BUSY)
        bw__rpc_retry_after(call, t->retry_after_ms);
    bw__rpc_fail(call, rc, "%s: %s", method, t->why);
    bw__rpc_finish(call, rc, NULL);
}

/* ---- Describe ---- */

/* d's sources as SourceInfo (in arena a), or NULL when out of memory. */
static Batchwire__V1__SourceInfo **source_infos(bw_arena *a, const bw__dataset *d)
{
    Batchwire__V1__SourceInfo *srcs = bw__arena_alloc(a, (d->nsources + 1) * sizeof(*srcs));
    Batchwire__V1__SourceInfo **sp = bw__arena_alloc(a, (d->nsources + 1) * sizeof(*sp));
    for (size_t i = 0; srcs && sp && i < d->nsources; i++) {
        const bw__source *s = d->sources[i];
        batchwire__v1__source_info__init(&srcs[i]);
        srcs[i].path = bw__arena_strdup(a, s->path);
        srcs[i].size_bytes = s->size;
        srcs[i].records = s->count;
        srcs[i].first_index = d->first[i];
        srcs[i].mtime_ns = s->mtime_ns;
        if (!srcs[i].path)
            return NULL;
        sp[i] = &srcs[i];
    }
    return srcs && sp ? sp : NULL;
}

/* d's layout (in arena a), or NULL when out of memory. */
static Batchwire__V1__SampleLayout *layout_info(bw_arena *a, const bw__dataset *d)
{
    Batchwire__V1__SampleLayout *lay = bw__arena_alloc(a, sizeof(*lay));
    uint64_t *shape = bw__arena_alloc(a, (BW_FMT_MAX_DIMS + 1) * sizeof(*shape));
    if (!lay || !shape)
        return NULL;
    batchwire__v1__sample_layout__init(lay);
    lay->dtype = bw__arena_strdup(a, d->layout.dtype);
    lay->n_shape = (size_t)d->layout.ndim;
    memcpy(shape, d->layout.shape, sizeof(uint64_t) * (size_t)d->layout.ndim);
    lay->shape = shape;
    lay->sample_bytes = d->layout.sample_bytes;
    return lay->dtype ? lay : NULL;
}

/* Named arrays: each field's name, layout and files; false when out of memory. */
static bool field_infos(bw_arena *a, const bw__dataset *d, Batchwire__V1__DatasetInfo *info)
{
    if (!d->nfields)
        return true;
    Batchwire__V1__FieldInfo *fi = bw__arena_alloc(a, d->nfields * sizeof(*fi));
    Batchwire__V1__FieldInfo **fp = bw__arena_alloc(a, d->nfields * sizeof(*fp));
    if (!fi || !fp)
        return false;
    for (size_t k = 0; k < d->nfields; k++) {
        batchwire__v1__field_info__init(&fi[k]);
        fi[k].name = bw__arena_strdup(a, d->field_names[k]);
        fi[k].layout = layout_info(a, d->fields[k]);
        fi[k].n_sources = d->fields[k]->nsources;
        fi[k].sources = source_infos(a, d->fields[k]);
        if (!fi[k].name || !fi[k].layout || !fi[k].sources)
            return false;
        fp[k] = &fi[k];
    }
    info->n_fields = d->nfields;
    info->fields = fp;
    return true;
}

/* Opens, indexes and describes the dataset: may read whole files (building a record index). */
static int describe(bw_worker *w, bw_rpc_call *call, const Batchwire__V1__DescribeRequest *r,
                    ProtobufCMessage **resp)
{
    bw__wds *e = NULL;
    char err[1400];
    int rc = bw__rp_open_dataset_until(w, bw__rpc_call_peer(call), "Describe", r->dataset, NULL,
                                       true, bw__rpc_call_deadline_ms(call), &e, err, sizeof(err));
    if (rc != BW_OK)
        return bw__rpc_fail(call, rc, "%s", err);
    const bw__dataset *d = bw__ds_dataset(e);
    bw_arena *a = bw__rpc_call_arena(call);
    Batchwire__V1__DescribeResponse *out = bw__arena_alloc(a, sizeof(*out));
    Batchwire__V1__DatasetInfo *info = bw__arena_alloc(a, sizeof(*info));
    if (out && info) {
        batchwire__v1__describe_response__init(out);
        batchwire__v1__dataset_info__init(info);
        out->info = info;
        info->format = (char *)d->ops->name;
        info->length = d->length;
        info->fingerprint = bw__arena_strdup(a, d->fingerprint);
        info->total_bytes = d->total_bytes;
        info->layout = layout_info(a, d);
        info->n_sources = d->nsources;
        info->sources = source_infos(a, d);
    }
    if (!out || !info || !info->fingerprint || !info->layout || !info->sources ||
        !field_infos(a, d, info))
        rc = bw__rpc_fail(call, BW_TOO_BIG, "Describe: the description of %zu sources is too big",
                          d->nsources);
    bw__ds_put(e); /* the strings live in the arena; format names are static */
    if (rc == BW_OK)
        *resp = &out->base;
    return rc;
}

typedef struct describe_task {
    bw__exec_task t; /* first: the executor hands it back */
    bw_worker *w;
    bw_rpc_call *call;
    const Batchwire__V1__DescribeRequest *req; /* in the call's arena, alive until finish */
} describe_task;

static void describe_admitted(bw__exec_task *t, int rc)
{
    describe_task *dt = (describe_task *)t;
    if (rc != BW_OK) {
        refuse(dt->call, "Describe", rc, t);
    } else {
        ProtobufCMessage *resp = NULL;
        rc = describe(dt->w, dt->call, dt->req, &resp);
        bw__exec_release(dt->w->exec, t->charge);
        bw__rpc_finish(dt->call, rc, resp);
    }
    free(dt);
}

int bw__data_describe(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                      ProtobufCMessage **resp)
{
    (void)resp;
    bw_worker *w = user;
    describe_task *dt = calloc(1, sizeof(*dt));
    if (!dt)
        return bw__rpc_fail(call, BW_NOMEM, "Describe: out of memory");
    dt->w = w;
    dt->call = call;
    dt->req = (const void *)req;
    bw__exec_submit(w->exec, &dt->t, DESCRIBE_CHARGE, describe_admitted);
    return BW_RPC_DEFERRED;
}

/* ---- ReadSamples and ReadStream ---- */

/* A read call from admission to its end: the charge it holds, its decoded request and the
 * producer of its messages. */
typedef struct read_call {
    bw__exec_task t; /* first: the executor hands it back */
    bw_worker *w;
    bw_rpc_call *call;
    uint32_t kind;
    bool admitted;
    bw__req req;
    bw__sstream *st;
    uint64_t t0; /* arrival (bw__wm_begin) */
    int status;  /* what the client is told; a stream is BW_CANCELLED until it ends */
} read_call;

static void read_call_free(void *state)
{
    read_call *rc = state;
    bw__wm_end(rc->w->metrics, BW_WM_GRPC, rc->kind, rc->t0, rc->status);
    bw__sstream_free(rc->st);
    bw__req_free(&rc->req);
    if (rc->admitted)
        bw__exec_release(rc->w->exec, rc->t.charge);
    free(rc);
}

static int read_next(void *state, bw_rpc_call *call, bw_rpc_out *out)
{
    read_call *rc = state;
    int r = bw__sstream_next(rc->st, call, out);
    if (r != BW_OK)
        rc->status = r == BW_RPC_END ? BW_OK : r;
    return r;
}

/* Decodes the request and opens the read: BW_OK with rc->st set, or an error with a sentence. */
static int read_open(read_call *rc, char *err, size_t errlen)
{
    size_t len = 0;
    const uint8_t *body = bw__rpc_call_request(rc->call, &len);
    if (!body) {
        snprintf(err, errlen, "%s: cannot read the request", bw__req_method(rc->kind));
        return BW_PROTOCOL;
    }
    int r = bw__req_decode(&rc->req, rc->kind, body, len, err, errlen);
    bw__rpc_call_drop_request(rc->call);
    /* From here it holds its decoded message and one message being sent. */
    uint64_t keep = BW_REQ_RESPONSE_GRPC + rc->req.used;
    bw__exec_shrink(rc->w->exec, rc->t.charge, keep);
    rc->t.charge = rc->t.charge < keep ? rc->t.charge : keep;
    if (r != BW_OK)
        return r;
    r = bw__worker_grant_check(rc->w, bw__rpc_call_principal(rc->call)->role, rc->req.msg,
                               bw__rpc_call_peer(rc->call), err, errlen);
    if (r != BW_OK)
        return r;
    bw__rp *rp = NULL;
    r = bw__rp_open_until(rc->w, bw__rpc_call_peer(rc->call), rc->req.msg,
                          bw__rpc_call_deadline_ms(rc->call), &rp, err, errlen);
    if (r != BW_OK)
        return r;
    bw__rp_meter(rp, rc->w->metrics, BW_WM_GRPC);
    uint32_t asked =
        rc->kind == BW_REQ_STREAM
            ? ((const Batchwire__V1__ReadStreamRequest *)rc->req.msg)->max_message_bytes
            : ((const Batchwire__V1__ReadSamplesRequest *)rc->req.msg)->max_message_bytes;
    rc->st = bw__sstream_new(rp, message_limit(rc->w, asked));
    if (!rc->st) {
        snprintf(err, errlen, "%s: out of memory", bw__req_method(rc->kind));
        return BW_NOMEM;
    }
    return BW_OK;
}

static void read_admitted(bw__exec_task *t, int r)
{
    read_call *rc = (read_call *)t;
    bw_rpc_call *call = rc->call;
    if (r != BW_OK) {
        refuse(call, bw__req_method(rc->kind), r, t);
        rc->status = r;
        read_call_free(rc);
        return;
    }
    rc->admitted = true;
    char err[1400];
    if (bw__rpc_call_cancelled(call)) { /* waited past its deadline: nobody wants it now */
        snprintf(err, sizeof(err), "%s: the deadline passed before the request was served",
                 bw__req_method(rc->kind));
        r = BW_CANCELLED;
    } else {
        r = read_open(rc, err, sizeof(err));
    }
    if (r != BW_OK) {
        rc->status = r;
        read_call_free(rc);
        bw__rpc_fail(call, r, "%s", err);
        bw__rpc_finish(call, r, NULL);
        return;
    }
    rc->status = BW_CANCELLED; /* unless read_next sees it end */
    bw__rpc_stream_begin(call, read_next, rc, read_call_free);
}

static int read_deferred(bw_worker *w, bw_rpc_call *call, uint32_t kind)
{
    read_call *rc = calloc(1, sizeof(*rc));
    if (!rc) {
        bw__wm_end(w->metrics, BW_WM_GRPC, kind, bw__wm_begin(w->metrics, BW_WM_GRPC), BW_NOMEM);
        return bw__rpc_fail(call, BW_NOMEM, "%s: out of memory", bw__req_method(kind));
    }
    rc->t0 = bw__wm_begin(w->metrics, BW_WM_GRPC);
    rc->w = w;
    rc->call = call;
    rc->kind = kind;
    /* gRPC's buffer and its flat copy are held at once while the request is decoded. */
    uint64_t charge =
        bw__req_charge(kind, bw__rpc_call_request_size(call), 2, BW_REQ_RESPONSE_GRPC);
    bw__exec_submit(w->exec, &rc->t, charge, read_admitted);
    return BW_RPC_DEFERRED;
}

int bw__data_read_samples(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                          ProtobufCMessage **resp)
{
    (void)req;
    (void)resp;
    return read_deferred(user, call, BW_REQ_SAMPLES);
}

int bw__data_read_stream(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                         ProtobufCMessage **resp)
{
    (void)req;
    (void)resp;
    return read_deferred(user, call, BW_REQ_STREAM);
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
