/* The gRPC server runtime shared by every daemon (server.h): completion-queue threads,
 * pre-posted requests per method, authorization and request checks before a handler, one
 * arena per call, deferred calls and server streams, and orderly shutdown. */
#include "rpc/server.h"

#include "rpc/client.h" /* BW_RPC_KEEPALIVE_MS */

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/grpc_security_constants.h>
#include <grpc/support/alloc.h>

#include "common/errors.h"
#include "common/log.h"
#include "common/util.h"
#include "rpc/proto_check.h"

/* Everything placed on a completion queue starts with a tag: the handler of its event. */
typedef struct tag tag;
struct tag {
    void (*done)(tag *t, bool ok);
};

typedef struct queue {
    grpc_completion_queue *cq;
    pthread_t thread;
    bool started;
} queue;

struct bw_rpc_server {
    grpc_server *server;
    queue *queues;
    int nqueues;
    const bw_rpc_handler *handlers; /* copy, indexed like `registered` */
    bool *raw;                      /* per handler: a raw method (the handler decodes) */
    size_t nhandlers;
    void **registered; /* grpc_server_register_method handles */
    void *user;
    int requests_per_method;
    size_t call_memory_limit;
    const char *role;
    bw_auth *auth;
    bw_grants *grants;     /* opts->grants */
    const char *self_id;   /* opts->self_id */
    bw_log_limit refusals; /* refused calls are logged at most once a second */
    atomic_int stopping;
    atomic_long live_calls;

    tag shutdown_tag;
    /* Bidirectional streams still open (under mu): a stop cancels them at once, since they
     * would otherwise hold the grace period whole (they end only when a client says so). */
    struct bidi *streams;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool shutdown_done;
};

typedef struct request request;
typedef struct unknown_request unknown_request;

/* A pre-posted request for one registered method on one queue; posted again as soon as a call
 * arrives on it, so the runtime allocates nothing to keep requests posted. */
struct request {
    tag t;
    bw_rpc_server *srv;
    size_t handler;
    int qi;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;
};

/* A pre-posted catch-all request (methods nobody registered), reused the same way. */
struct unknown_request {
    tag t;
    bw_rpc_server *srv;
    int qi;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
};

struct bw_rpc_call {
    tag t;
    bw_rpc_server *srv;
    grpc_call *call;
    const bw_rpc_method *method;
    bw_rpc_handler_fn fn;
    bw_arena arena;
    bw_arena msg_arena;
    /* raw methods: the request as received, then flattened */
    grpc_byte_buffer *payload;
    grpc_slice request;
    bool have_request;
    uint32_t retry_after_ms;
    /* server streaming */
    bw_rpc_next_fn next;
    void *stream_state;
    void (*free_state)(void *state);
    bool metadata_sent;
    gpr_timespec deadline;
    char *peer;
    bw_principal principal;
    char message[512];
    grpc_byte_buffer *send;
    grpc_slice details;
    grpc_slice retry_value;
    grpc_metadata trailers[2];
    int cancelled;
    grpc_op ops[4];
    struct bidi *bidi; /* a bidirectional stream's state (bw__rpc_bidi_start) */
};

static void post_request(request *r);
static void post_unknown(unknown_request *u);
static void bidi_begin(bw_rpc_call *c);

static void *queue_thread(void *arg)
{
    grpc_completion_queue *cq = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE) {
            tag *t = ev.tag;
            t->done(t, ev.success != 0);
        }
    }
    return NULL;
}

bw_arena *bw__rpc_call_arena(bw_rpc_call *call)
{
    return &call->arena;
}

const char *bw__rpc_call_peer(bw_rpc_call *call)
{
    if (!call->peer)
        call->peer = grpc_call_get_peer(call->call);
    return call->peer ? call->peer : "?";
}

const bw_principal *bw__rpc_call_principal(bw_rpc_call *call)
{
    return &call->principal;
}

/* The value of header `key` into out ("" when absent, too long or holding a NUL). */
static void header_value(const grpc_metadata_array *md, const char *key, char *out, size_t outlen)
{
    out[0] = 0;
    for (size_t i = 0; i < md->count; i++)
        if (!grpc_slice_str_cmp(md->metadata[i].key, key)) {
            size_t len = GRPC_SLICE_LENGTH(md->metadata[i].value);
            const void *v = GRPC_SLICE_START_PTR(md->metadata[i].value);
            if (len < outlen && !memchr(v, 0, len)) {
                memcpy(out, v, len);
                out[len] = 0;
            }
            return;
        }
}

/* The token of an "authorization: Bearer TOKEN" header into out ("" when there is none; a
 * header in another form is kept whole, so that it fails as a token). */
static void bearer_token(const grpc_metadata_array *md, char *out, size_t outlen)
{
    out[0] = 0;
    for (size_t i = 0; i < md->count; i++) {
        if (!grpc_slice_str_cmp(md->metadata[i].key, "authorization")) {
            const char *v = (const char *)GRPC_SLICE_START_PTR(md->metadata[i].value);
            size_t len = GRPC_SLICE_LENGTH(md->metadata[i].value);
            if (len > 7 && strncasecmp(v, "Bearer ", 7) == 0) {
                v += 7;
                len -= 7;
            }
            if (len >= outlen)
                len = outlen - 1; /* longer than any token: fails as one */
            memcpy(out, v, len);
            out[len] = 0;
            if (!out[0] || memchr(v, 0, len))
                snprintf(out, outlen, "%s", "\x00"); /* never a valid token */
            return;
        }
    }
}

/* The subject common name of the caller's verified client certificate ("" without one). */
static void cert_name(grpc_call *call, char *out, size_t outlen)
{
    out[0] = 0;
    grpc_auth_context *ctx = grpc_call_auth_context(call);
    if (!ctx)
        return;
    grpc_auth_property_iterator it =
        grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_CN_PROPERTY_NAME);
    const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
    if (p && p->value && p->value_length < outlen && !memchr(p->value, 0, p->value_length)) {
        memcpy(out, p->value, p->value_length);
        out[p->value_length] = 0;
    }
    grpc_auth_context_release(ctx);
}

/* With read grants: the principal of a call that carries the coordinator's proof and no
 * token (core/auth/grant.h). */
static int coordinator_principal(bw_rpc_call *c, bw_method_id id, const char *proof, char *why,
                                 size_t whylen)
{
    int rc =
        bw__grant_coord_verify(c->srv->grants, c->srv->self_id, proof, bw__unix_ms(), why, whylen);
    if (rc != BW_OK)
        return rc;
    c->principal.role = BW_ROLE_COORDINATOR;
    snprintf(c->principal.name, sizeof(c->principal.name), "coordinator");
    if (bw__auth_allowed(BW_ROLE_COORDINATOR, id))
        return BW_OK;
    snprintf(why, whylen,
             "the coordinator's proof allows only Data.Describe and Worker.Info, "
             "not %s",
             bw__methods[id].name);
    return BW_PERMISSION_DENIED;
}

/* Authenticates and authorizes a new call (core/auth/auth.h); on refusal records the error
 * and logs it with the peer. */
static int authorize(bw_rpc_call *c, const char *token, const char *coord_proof)
{
    char cn[BW_PRINCIPAL_NAME_MAX];
    cert_name(c->call, cn, sizeof(cn));
    char why[384];
    bw_method_id id = (bw_method_id)(c->method - bw__methods);
    int rc;
    if (c->srv->grants && coord_proof[0] && !token[0]) {
        rc = coordinator_principal(c, id, coord_proof, why, sizeof(why));
    } else {
        rc = bw__auth_check(c->srv->auth, id, token[0] ? token : NULL, cn[0] ? cn : NULL,
                            &c->principal, why, sizeof(why));
        /* A read without credentials (a trainer sends its grant, never its token, to a
         * worker): its handler checks the grant before anything is opened. */
        if (rc == BW_UNAUTHENTICATED && c->srv->grants && !token[0] &&
            (id == BW_M_DATA_READ_SAMPLES || id == BW_M_DATA_READ_STREAM)) {
            memset(&c->principal, 0, sizeof(c->principal));
            rc = BW_OK;
        }
    }
    if (rc == BW_OK)
        return BW_OK;
    uint64_t quiet;
    if (bw__log_limit_allow(&c->srv->refusals, &quiet))
        BW_WARN("request refused role=%s method=%s peer=%s code=%s not_logged_before=%llu err=%s",
                c->srv->role, c->method->name, bw__rpc_call_peer(c), bw_err_name(rc),
                (unsigned long long)quiet, why);
    return bw__rpc_fail(c, rc, "%s: %s", c->method->name, why);
}

int bw__rpc_fail(bw_rpc_call *call, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call->message, sizeof(call->message), fmt, ap);
    va_end(ap);
    return rc;
}

void bw__rpc_retry_after(bw_rpc_call *call, uint32_t ms)
{
    call->retry_after_ms = ms;
}

size_t bw__rpc_call_request_size(bw_rpc_call *c)
{
    if (c->have_request)
        return GRPC_SLICE_LENGTH(c->request);
    return c->payload ? grpc_byte_buffer_length(c->payload) : 0;
}

const uint8_t *bw__rpc_call_request(bw_rpc_call *c, size_t *len)
{
    *len = 0;
    if (!c->have_request && c->payload) {
        grpc_byte_buffer_reader reader;
        if (!grpc_byte_buffer_reader_init(&reader, c->payload))
            return NULL;
        c->request = grpc_byte_buffer_reader_readall(&reader);
        grpc_byte_buffer_reader_destroy(&reader);
        c->have_request = true;
        grpc_byte_buffer_destroy(c->payload);
        c->payload = NULL;
    }
    if (!c->have_request)
        return NULL;
    *len = GRPC_SLICE_LENGTH(c->request);
    return GRPC_SLICE_START_PTR(c->request);
}

void bw__rpc_call_drop_request(bw_rpc_call *c)
{
    if (c->payload)
        grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    if (c->have_request)
        grpc_slice_unref(c->request);
    c->have_request = false;
}

static void call_free(bw_rpc_call *c)
{
    if (c->free_state)
        c->free_state(c->stream_state);
    bw__rpc_call_drop_request(c);
    bw__arena_reset(&c->msg_arena);
    if (c->send)
        grpc_byte_buffer_destroy(c->send);
    grpc_slice_unref(c->details);
    grpc_slice_unref(c->retry_value);
    if (c->call)
        grpc_call_unref(c->call);
    if (c->peer)
        gpr_free(c->peer);
    bw__arena_reset(&c->arena);
    atomic_fetch_sub(&c->srv->live_calls, 1);
    free(c);
}

static void call_sent(tag *t, bool ok)
{
    bw_rpc_call *c = (bw_rpc_call *)t;
    if (!ok)
        BW_DEBUG("response not delivered method=%s peer=%s", c->method->name, bw__rpc_call_peer(c));
    call_free(c);
}

/* Fills *st with the call's status for rc: on an error the message recorded by bw__rpc_fail
 * (or bw_strerror(rc)), the "bw-error" trailer and, when set, "bw-retry-after-ms". */
static void status_op(bw_rpc_call *c, grpc_op *st, int rc)
{
    st->op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    st->data.send_status_from_server.status = bw__err_to_grpc(rc);
    if (rc != BW_OK) {
        if (c->message[0] == '\0')
            snprintf(c->message, sizeof(c->message), "%s", bw_strerror(rc));
        c->details = grpc_slice_from_copied_string(c->message);
        st->data.send_status_from_server.status_details = &c->details;
        /* The exact code, for batchwire peers (gRPC status codes are coarser). */
        c->trailers[0].key = grpc_slice_from_static_string("bw-error");
        c->trailers[0].value = grpc_slice_from_static_string(bw_err_name(rc));
        size_t ntrailers = 1;
        if (c->retry_after_ms) {
            char ms[16];
            snprintf(ms, sizeof(ms), "%u", c->retry_after_ms);
            grpc_slice_unref(c->retry_value);
            c->retry_value = grpc_slice_from_copied_string(ms);
            c->trailers[1].key = grpc_slice_from_static_string("bw-retry-after-ms");
            c->trailers[1].value = c->retry_value;
            ntrailers++;
        }
        st->data.send_status_from_server.trailing_metadata_count = ntrailers;
        st->data.send_status_from_server.trailing_metadata = c->trailers;
    }
}

/* A message packed into a new byte buffer (destroy with grpc_byte_buffer_destroy). */
static grpc_byte_buffer *pack_msg(const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice sl = grpc_slice_malloc(len);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(sl));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl); /* the byte buffer holds its own reference */
    return bb;
}

void bw__rpc_finish(bw_rpc_call *c, int rc, const ProtobufCMessage *resp)
{
    memset(c->ops, 0, sizeof(c->ops));
    size_t nops = 0;
    if (c->send) {
        grpc_byte_buffer_destroy(c->send);
        c->send = NULL;
    }
    if (!c->metadata_sent)
        c->ops[nops++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->metadata_sent = true;
    if (rc == BW_OK && !resp && !c->next)
        rc = bw__rpc_fail(c, BW_INTERNAL, "%s: handler returned no response", c->method->name);
    if (rc == BW_OK && resp) {
        c->send = pack_msg(resp);
        c->ops[nops].op = GRPC_OP_SEND_MESSAGE;
        c->ops[nops++].data.send_message.send_message = c->send;
    }
    status_op(c, &c->ops[nops++], rc);
    if (rc != BW_OK)
        BW_DEBUG("call failed method=%s peer=%s code=%s err=%s", c->method->name,
                 bw__rpc_call_peer(c), bw_err_name(rc), c->message);
    c->ops[nops].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    c->ops[nops++].data.recv_close_on_server.cancelled = &c->cancelled;
    c->t.done = call_sent;
    grpc_call_error e = grpc_call_start_batch(c->call, c->ops, nops, &c->t, NULL);
    if (e != GRPC_CALL_OK) {
        BW_ERROR("cannot send the response method=%s grpc_call_error=%d", c->method->name, (int)e);
        call_free(c);
    }
}

bw_arena *bw__rpc_call_msg_arena(bw_rpc_call *call)
{
    return &call->msg_arena;
}

int bw__rpc_call_cancelled(bw_rpc_call *call)
{
    return gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_convert_clock_type(call->deadline, GPR_CLOCK_MONOTONIC)) > 0;
}

uint64_t bw__rpc_call_deadline_ms(const bw_rpc_call *call)
{
    if (gpr_time_cmp(call->deadline, gpr_inf_future(call->deadline.clock_type)) == 0)
        return 0;
    gpr_timespec left = gpr_time_sub(gpr_convert_clock_type(call->deadline, GPR_CLOCK_MONOTONIC),
                                     gpr_now(GPR_CLOCK_MONOTONIC));
    int64_t ms = gpr_time_to_millis(left);
    return bw__mono_ms() + (uint64_t)(ms > 0 ? ms : 0); /* passed: now, which is not 0 */
}

void bw__rpc_stream_start(bw_rpc_call *call, bw_rpc_next_fn next, void *state,
                          void (*free_state)(void *state))
{
    call->next = next;
    call->stream_state = state;
    call->free_state = free_state;
}

static void stream_sent(tag *t, bool ok);
static void stream_pump(bw_rpc_call *c);

void bw__rpc_stream_begin(bw_rpc_call *call, bw_rpc_next_fn next, void *state,
                          void (*free_state)(void *state))
{
    bw__rpc_stream_start(call, next, state, free_state);
    stream_pump(call);
}

/* Produces and sends the next message of a stream, or ends the call. */
static void stream_pump(bw_rpc_call *c)
{
    bw__arena_reset(&c->msg_arena);
    if (c->send) {
        grpc_byte_buffer_destroy(c->send);
        c->send = NULL;
    }
    bw_rpc_out out = {NULL, NULL};
    int rc = c->next(c->stream_state, c, &out);
    if (rc == BW_RPC_END) {
        bw__rpc_finish(c, BW_OK, NULL);
        return;
    }
    if (rc == BW_OK && !out.msg && !out.raw)
        rc = bw__rpc_fail(c, BW_INTERNAL, "%s: stream produced no message", c->method->name);
    if (rc != BW_OK) {
        bw__rpc_finish(c, rc, NULL);
        return;
    }
    if (out.raw) {
        c->send = out.raw;
    } else {
        c->send = pack_msg(out.msg);
    }
    memset(c->ops, 0, sizeof(c->ops));
    size_t nops = 0;
    if (!c->metadata_sent)
        c->ops[nops++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->metadata_sent = true;
    c->ops[nops].op = GRPC_OP_SEND_MESSAGE;
    c->ops[nops++].data.send_message.send_message = c->send;
    c->t.done = stream_sent;
    grpc_call_error e = grpc_call_start_batch(c->call, c->ops, nops, &c->t, NULL);
    if (e != GRPC_CALL_OK) {
        BW_ERROR("cannot send a stream message method=%s grpc_call_error=%d", c->method->name,
                 (int)e);
        call_free(c);
    }
}

static void stream_sent(tag *t, bool ok)
{
    bw_rpc_call *c = (bw_rpc_call *)t;
    if (!ok) {
        /* The client went away or the deadline passed: close our side and clean up. */
        BW_DEBUG("stream ended early method=%s peer=%s", c->method->name, bw__rpc_call_peer(c));
        bw__rpc_fail(c, BW_CANCELLED, "stream cancelled");
        bw__rpc_finish(c, BW_CANCELLED, NULL);
        return;
    }
    stream_pump(c);
}

static int unpack_into(bw_rpc_call *c, grpc_byte_buffer *payload, bw_arena *arena,
                       ProtobufCMessage **req);

static int unpack(bw_rpc_call *c, grpc_byte_buffer *payload, ProtobufCMessage **req)
{
    return unpack_into(c, payload, &c->arena, req);
}

/* Unpacks one message of c's method into `arena`, after the checks of rpc/proto_check.h. */
static int unpack_into(bw_rpc_call *c, grpc_byte_buffer *payload, bw_arena *arena,
                       ProtobufCMessage **req)
{
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, payload))
        return bw__rpc_fail(c, BW_PROTOCOL, "%s: cannot read the request", c->method->name);
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    size_t len = GRPC_SLICE_LENGTH(all);
    char why[384];
    int rc = bw__proto_check(c->method->request, GRPC_SLICE_START_PTR(all), len, why, sizeof(why));
    if (rc != BW_OK) {
        grpc_slice_unref(all);
        return bw__rpc_fail(c, rc, "%s: %s", c->method->name, why);
    }
    *req =
        protobuf_c_message_unpack(c->method->request, &arena->pb, len, GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
    if (!*req)
        return bw__rpc_fail(c, BW_INVALID_ARGUMENT,
                            "%s: malformed request: %zu bytes are not a valid %s message"
                            " (or it needs more than %zu bytes of memory)",
                            c->method->name, len, c->method->request->name,
                            c->srv->call_memory_limit);
    return BW_OK;
}

/* ---- bidirectional streams (server.h) ----
 *
 * Every change of a stream's state happens under its lock: completions arrive on the call's
 * completion-queue thread, answers on any thread (the journal's notifier). `refs` counts what
 * may still touch the state -- each batch in flight and each message not yet answered -- and
 * the last one frees it. Batches: one RECV_MESSAGE, one SEND_MESSAGE and, once,
 * SEND_STATUS_FROM_SERVER with RECV_CLOSE_ON_SERVER. No batch waits for the call's end from
 * the start: each operation outstanding on a completion queue costs every completion on it
 * (libgrpc scans its outstanding tags: 14% of the coordinator's CPU with 10,000 streams each
 * holding one more); a client that goes away fails the read or the send under way instead. */

struct bw_rpc_msg {
    bw_rpc_msg *next; /* the stream's queue, in arrival order */
    struct bidi *b;
    bw_arena arena;
    bool answered;
    size_t size;           /* the request's size as received */
    grpc_byte_buffer *out; /* the packed answer */
};

typedef struct btag {
    tag t;
    struct bidi *b;
} btag;

typedef struct bidi {
    pthread_mutex_t mu;
    bw_rpc_call *call;
    bw_rpc_msg_fn fn;
    void *state;
    void (*free_state)(void *state);
    struct bidi *prev, *next; /* bw_rpc_server.streams */
    bw_rpc_msg *head, *tail;  /* received, not yet sent (answered or not) */
    int queued;               /* messages in the queue */
    size_t queued_bytes;      /* their requests' sizes as received */
    int refs;
    bool reading, sending, half_closed, ending, status_started;
    int end_rc;    /* the status the stream ends with (BW_OK: a clean end) */
    uint64_t sent; /* answers sent */
    btag recv_t, send_t, status_t;
    grpc_byte_buffer *recv;
    grpc_op recv_op, send_ops[2], status_ops[3];
} bidi;

void bw__rpc_bidi_start(bw_rpc_call *call, bw_rpc_msg_fn fn, void *state,
                        void (*free_state)(void *state))
{
    bidi *b = calloc(1, sizeof(*b));
    if (!b) {
        call->bidi = NULL; /* request_arrived answers BW_INTERNAL */
        if (free_state)
            free_state(state);
        return;
    }
    pthread_mutex_init(&b->mu, NULL);
    b->call = call;
    b->fn = fn;
    b->state = state;
    b->free_state = free_state;
    call->bidi = b;
}

bw_arena *bw__rpc_msg_arena(bw_rpc_msg *m)
{
    return &m->arena;
}

bw_rpc_call *bw__rpc_msg_call(bw_rpc_msg *m)
{
    return m->b->call;
}

int bw__rpc_authorize_as(bw_rpc_call *c, bw_method_id id)
{
    if (bw__auth_allowed(c->principal.role, id))
        return BW_OK;
    uint64_t quiet;
    if (bw__log_limit_allow(&c->srv->refusals, &quiet))
        BW_WARN("request refused role=%s method=%s on=%s peer=%s code=%s not_logged_before=%llu",
                c->srv->role, bw__methods[id].name, c->method->name, bw__rpc_call_peer(c),
                bw_err_name(BW_PERMISSION_DENIED), (unsigned long long)quiet);
    return bw__rpc_fail(c, BW_PERMISSION_DENIED, "%s: principal '%s' (role %s) may not call %s",
                        c->method->name, c->principal.name, bw__role_name(c->principal.role),
                        bw__methods[id].name);
}

static void msg_free(bw_rpc_msg *m)
{
    if (m->out)
        grpc_byte_buffer_destroy(m->out);
    bw__arena_reset(&m->arena);
    free(m);
}

static void bidi_free(bidi *b)
{
    while (b->head) {
        bw_rpc_msg *m = b->head;
        b->head = m->next;
        msg_free(m);
    }
    if (b->recv)
        grpc_byte_buffer_destroy(b->recv);
    if (b->free_state)
        b->free_state(b->state);
    pthread_mutex_destroy(&b->mu);
    bw_rpc_call *c = b->call;
    bw_rpc_server *srv = c->srv;
    pthread_mutex_lock(&srv->mu);
    if (b->prev)
        b->prev->next = b->next;
    else if (srv->streams == b)
        srv->streams = b->next;
    if (b->next)
        b->next->prev = b->prev;
    pthread_mutex_unlock(&srv->mu);
    c->bidi = NULL;
    free(b);
    call_free(c);
}

/* Ends the stream with rc (under b->mu): nothing more is read or sent but the status. */
static void bidi_end(bidi *b, int rc)
{
    if (b->ending)
        return;
    b->ending = true;
    b->end_rc = rc;
}

static void bidi_recv_done(tag *t, bool ok);
static void bidi_send_done(tag *t, bool ok);
static void bidi_batch_done(tag *t, bool ok);

/* Starts what the stream's state allows (under b->mu): the next answer's send, the next read,
 * the status. Returns true when the state is to be freed (nothing may touch it any more). */
static bool bidi_progress(bidi *b)
{
    bw_rpc_call *c = b->call;
    if (!b->sending && !b->ending && b->head && b->head->answered) {
        memset(b->send_ops, 0, sizeof(b->send_ops));
        size_t n = 0;
        if (!c->metadata_sent)
            b->send_ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        b->send_ops[n].op = GRPC_OP_SEND_MESSAGE;
        b->send_ops[n++].data.send_message.send_message = b->head->out;
        if (grpc_call_start_batch(c->call, b->send_ops, n, &b->send_t.t, NULL) == GRPC_CALL_OK) {
            c->metadata_sent = true;
            b->sending = true;
            b->refs++;
        } else {
            bidi_end(b, bw__rpc_fail(c, BW_INTERNAL, "%s: cannot send an answer", c->method->name));
        }
    }
    if (!b->reading && !b->half_closed && !b->ending && b->queued < BW_RPC_BIDI_WINDOW &&
        b->queued_bytes < BW_RPC_BIDI_WINDOW_BYTES) {
        memset(&b->recv_op, 0, sizeof(b->recv_op));
        b->recv_op.op = GRPC_OP_RECV_MESSAGE;
        b->recv_op.data.recv_message.recv_message = &b->recv;
        b->recv = NULL;
        if (grpc_call_start_batch(c->call, &b->recv_op, 1, &b->recv_t.t, NULL) == GRPC_CALL_OK) {
            b->reading = true;
            b->refs++;
        } else {
            bidi_end(b,
                     bw__rpc_fail(c, BW_INTERNAL, "%s: cannot read the stream", c->method->name));
        }
    }
    if (!b->status_started && !b->sending && (b->ending || (b->half_closed && !b->head))) {
        b->status_started = true;
        int rc = b->ending ? b->end_rc : BW_OK;
        memset(b->status_ops, 0, sizeof(b->status_ops));
        size_t n = 0;
        if (!c->metadata_sent)
            b->status_ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->metadata_sent = true;
        status_op(c, &b->status_ops[n++], rc);
        BW_DEBUG("stream ended method=%s peer=%s messages=%llu code=%s err=%s", c->method->name,
                 bw__rpc_call_peer(c), (unsigned long long)b->sent, bw_err_name(rc),
                 rc == BW_OK ? "" : c->message);
        b->status_ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        b->status_ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
        if (grpc_call_start_batch(c->call, b->status_ops, n, &b->status_t.t, NULL) == GRPC_CALL_OK)
            b->refs++;
    }
    return b->refs == 0;
}

static void bidi_unlock(bidi *b)
{
    bool done = bidi_progress(b);
    pthread_mutex_unlock(&b->mu);
    if (done)
        bidi_free(b);
}

/* The call is a stream now: its end is watched, and the first message read. */
static void bidi_begin(bw_rpc_call *c)
{
    bidi *b = c->bidi;
    b->recv_t = (btag){{bidi_recv_done}, b};
    b->send_t = (btag){{bidi_send_done}, b};
    b->status_t = (btag){{bidi_batch_done}, b};
    pthread_mutex_lock(&c->srv->mu);
    b->next = c->srv->streams;
    if (b->next)
        b->next->prev = b;
    c->srv->streams = b;
    pthread_mutex_unlock(&c->srv->mu);
    pthread_mutex_lock(&b->mu);
    bidi_unlock(b);
}

void bw__rpc_msg_answer(bw_rpc_msg *m, int rc, const ProtobufCMessage *resp)
{
    bidi *b = m->b;
    grpc_byte_buffer *out = NULL;
    if (rc == BW_OK && !resp)
        rc = bw__rpc_fail(b->call, BW_INTERNAL, "%s: message handler returned no answer",
                          b->call->method->name);
    if (rc == BW_OK)
        out = pack_msg(resp); /* outside the lock */
    pthread_mutex_lock(&b->mu);
    m->answered = true;
    m->out = out;
    b->refs--;
    if (rc != BW_OK)
        bidi_end(b, rc);
    bidi_unlock(b);
}

static void bidi_recv_done(tag *t, bool ok)
{
    bidi *b = ((btag *)t)->b;
    bw_rpc_call *c = b->call;
    pthread_mutex_lock(&b->mu);
    b->reading = false;
    b->refs--;
    grpc_byte_buffer *payload = b->recv;
    b->recv = NULL;
    bool stopping = atomic_load(&c->srv->stopping);
    if (!ok || !payload || b->ending || stopping) {
        if (stopping)
            bidi_end(b, bw__rpc_fail(c, BW_UNAVAILABLE, "%s: the %s is shutting down: retry",
                                     c->method->name, c->srv->role));
        else if (!ok)
            bidi_end(b, bw__rpc_fail(c, BW_CANCELLED, "%s: stream cancelled", c->method->name));
        else if (!payload)
            b->half_closed = true; /* the client sends no more */
        if (payload)
            grpc_byte_buffer_destroy(payload);
        bidi_unlock(b);
        return;
    }
    bw_rpc_msg *m = calloc(1, sizeof(*m));
    if (!m) {
        grpc_byte_buffer_destroy(payload);
        bidi_end(b, bw__rpc_fail(c, BW_NOMEM, "%s: out of memory for a message", c->method->name));
        bidi_unlock(b);
        return;
    }
    m->b = b;
    m->size = grpc_byte_buffer_length(payload);
    b->queued_bytes += m->size;
    bw__arena_init(&m->arena, c->srv->call_memory_limit);
    if (b->tail)
        b->tail->next = m;
    else
        b->head = m;
    b->tail = m;
    b->queued++;
    b->refs++; /* until answered */
    pthread_mutex_unlock(&b->mu);

    /* Messages of one stream are handled one at a time: the next read starts only below. */
    ProtobufCMessage *req = NULL, *resp = NULL;
    int rc = unpack_into(c, payload, &m->arena, &req);
    grpc_byte_buffer_destroy(payload);
    if (rc == BW_OK)
        rc = b->fn(b->state, m, req, &resp);
    if (rc != BW_RPC_DEFERRED)
        bw__rpc_msg_answer(m, rc, rc == BW_OK ? resp : NULL);
    else {
        pthread_mutex_lock(&b->mu);
        bidi_unlock(b); /* the next read */
    }
}

static void bidi_send_done(tag *t, bool ok)
{
    bidi *b = ((btag *)t)->b;
    bw_rpc_call *c = b->call;
    pthread_mutex_lock(&b->mu);
    b->sending = false;
    b->refs--;
    bw_rpc_msg *m = b->head;
    b->head = m->next;
    if (!b->head)
        b->tail = NULL;
    b->queued--;
    b->queued_bytes -= m->size;
    b->sent += ok;
    msg_free(m);
    if (!ok)
        bidi_end(b, bw__rpc_fail(c, BW_CANCELLED, "%s: stream cancelled", c->method->name));
    bidi_unlock(b);
}

/* The status went out (or the call was over already). */
static void bidi_batch_done(tag *t, bool ok)
{
    (void)ok;
    bidi *b = ((btag *)t)->b;
    pthread_mutex_lock(&b->mu);
    b->refs--;
    bidi_unlock(b);
}

/* A new call's state, or NULL when out of memory (the call is then refused and released). */
static bw_rpc_call *call_new(bw_rpc_server *srv, grpc_call *call, size_t limit)
{
    bw_rpc_call *c = calloc(1, sizeof(*c));
    if (!c) {
        BW_WARN("out of memory for a new call; refusing it");
        grpc_call_cancel_with_status(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "server out of memory",
                                     NULL);
        grpc_call_unref(call);
        return NULL;
    }
    atomic_fetch_add(&srv->live_calls, 1);
    c->srv = srv;
    c->call = call;
    c->details = grpc_empty_slice();
    c->retry_value = grpc_empty_slice();
    bw__arena_init(&c->arena, limit);
    bw__arena_init(&c->msg_arena, limit);
    return c;
}

static void request_free(request *r)
{
    if (r->call) {
        grpc_call_cancel_with_status(r->call, GRPC_STATUS_UNAVAILABLE, "server shutting down",
                                     NULL);
        grpc_call_unref(r->call);
    }
    if (r->payload)
        grpc_byte_buffer_destroy(r->payload);
    grpc_metadata_array_destroy(&r->md);
    free(r);
}

static void request_arrived(tag *t, bool ok)
{
    request *r = (request *)t;
    bw_rpc_server *srv = r->srv;
    if (!ok || atomic_load(&srv->stopping)) {
        /* Shutdown: the request was cancelled (or the call must not start). */
        request_free(r);
        return;
    }
    grpc_call *call = r->call;
    gpr_timespec deadline = r->deadline;
    grpc_byte_buffer *payload = r->payload;
    size_t h = r->handler;
    char token[BW_TOKEN_MAX + 8], coord_proof[BW_GRANT_COORD_PROOF_MAX + 1];
    bearer_token(&r->md, token, sizeof(token));
    header_value(&r->md, BW_GRANT_COORD_HEADER, coord_proof, sizeof(coord_proof));
    /* Keep the method's request count up before doing any work: r goes back out. */
    r->call = NULL;
    r->payload = NULL;
    grpc_metadata_array_destroy(&r->md);
    post_request(r);

    bw_rpc_call *c = call_new(srv, call, srv->call_memory_limit);
    if (!c) {
        if (payload)
            grpc_byte_buffer_destroy(payload);
        return;
    }
    c->method = srv->handlers[h].method;
    c->fn = srv->handlers[h].fn;
    c->deadline = deadline;

    ProtobufCMessage *req = NULL;
    ProtobufCMessage *resp = NULL;
    int rc = authorize(c, token, coord_proof);
    bool is_bidi = bw__method_bidi(c->method);
    if (rc == BW_OK && is_bidi)
        ; /* its messages come later, one at a time (bidi_read) */
    else if (rc == BW_OK && !payload)
        rc = bw__rpc_fail(c, BW_INVALID_ARGUMENT, "%s: the request carried no message",
                          c->method->name);
    else if (rc == BW_OK && srv->raw[h])
        c->payload = payload; /* the handler decodes it */
    else if (rc == BW_OK)
        rc = unpack(c, payload, &req);
    if (payload && payload != c->payload)
        grpc_byte_buffer_destroy(payload);
    if (rc == BW_OK) {
        rc = c->fn(srv->user, c, req, &resp);
        if (rc == BW_RPC_DEFERRED)
            return; /* c may be gone already */
        if (rc == BW_RPC_STREAM && is_bidi) {
            if (c->bidi) {
                bidi_begin(c);
                return;
            }
            rc = bw__rpc_fail(c, BW_INTERNAL, "%s: stream handler set no message handler",
                              c->method->name);
        } else if (rc == BW_RPC_STREAM) {
            if (!c->next)
                rc = bw__rpc_fail(c, BW_INTERNAL, "%s: stream handler set no producer",
                                  c->method->name);
            else {
                stream_pump(c);
                return;
            }
        }
    }
    bw__rpc_finish(c, rc, resp);
}

/* Posts (or posts again) a request for its method on its queue. */
static void post_request(request *r)
{
    bw_rpc_server *srv = r->srv;
    r->t.done = request_arrived;
    r->call = NULL;
    r->payload = NULL;
    grpc_metadata_array_init(&r->md);
    grpc_completion_queue *cq = srv->queues[r->qi].cq;
    grpc_call_error e = grpc_server_request_registered_call(
        srv->server, srv->registered[r->handler], &r->call, &r->deadline, &r->md,
        bw__method_bidi(srv->handlers[r->handler].method) ? NULL : &r->payload, cq, cq, &r->t);
    if (e != GRPC_CALL_OK)
        request_free(r); /* only happens while shutting down */
}

static void unknown_replied(tag *t, bool ok)
{
    (void)ok;
    bw_rpc_call *c = (bw_rpc_call *)t;
    call_free(c);
}

static void unknown_free(unknown_request *u)
{
    if (u->call)
        grpc_call_unref(u->call);
    grpc_call_details_destroy(&u->details);
    grpc_metadata_array_destroy(&u->md);
    free(u);
}

static void unknown_arrived(tag *t, bool ok)
{
    unknown_request *u = (unknown_request *)t;
    bw_rpc_server *srv = u->srv;
    if (!ok || atomic_load(&srv->stopping)) {
        unknown_free(u);
        return;
    }
    grpc_call *call = u->call;
    char *method = grpc_slice_to_c_string(u->details.method);
    u->call = NULL;
    grpc_call_details_destroy(&u->details);
    grpc_metadata_array_destroy(&u->md);
    post_unknown(u);
    bw_rpc_call *c = call_new(srv, call, 0);
    if (c) {
        snprintf(c->message, sizeof(c->message), "unknown method %s", method);
        BW_INFO("call refused peer=%s err=%s", bw__rpc_call_peer(c), c->message);
        c->details = grpc_slice_from_copied_string(c->message);
        grpc_op *ops = c->ops;
        memset(ops, 0, sizeof(c->ops));
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[1].data.send_status_from_server.status = GRPC_STATUS_UNIMPLEMENTED;
        ops[1].data.send_status_from_server.status_details = &c->details;
        ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[2].data.recv_close_on_server.cancelled = &c->cancelled;
        c->t.done = unknown_replied;
        if (grpc_call_start_batch(c->call, ops, 3, &c->t, NULL) != GRPC_CALL_OK)
            call_free(c);
    }
    gpr_free(method);
}

/* Posts (or posts again) the catch-all request on its queue. */
static void post_unknown(unknown_request *u)
{
    bw_rpc_server *srv = u->srv;
    u->t.done = unknown_arrived;
    u->call = NULL;
    grpc_call_details_init(&u->details);
    grpc_metadata_array_init(&u->md);
    grpc_completion_queue *cq = srv->queues[u->qi].cq;
    if (grpc_server_request_call(srv->server, &u->call, &u->details, &u->md, cq, cq, &u->t) !=
        GRPC_CALL_OK)
        unknown_free(u);
}

static void shutdown_done(tag *t, bool ok)
{
    (void)ok;
    bw_rpc_server *srv = (bw_rpc_server *)((char *)t - offsetof(bw_rpc_server, shutdown_tag));
    pthread_mutex_lock(&srv->mu);
    srv->shutdown_done = true;
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
}

/* Waits for the shutdown tag until `ms` from now (ms < 0: forever); true when it arrived. */
static bool wait_shutdown(bw_rpc_server *srv, int ms)
{
    struct timespec until = bw__mono_deadline(ms > 0 ? (uint64_t)ms : 0);
    pthread_mutex_lock(&srv->mu);
    while (!srv->shutdown_done) {
        if (ms < 0)
            pthread_cond_wait(&srv->cv, &srv->mu);
        else if (pthread_cond_timedwait(&srv->cv, &srv->mu, &until) != 0)
            break;
    }
    bool done = srv->shutdown_done;
    pthread_mutex_unlock(&srv->mu);
    return done;
}

static void destroy(bw_rpc_server *srv)
{
    if (srv->server)
        grpc_server_destroy(srv->server);
    for (int i = 0; srv->queues && i < srv->nqueues; i++) {
        if (!srv->queues[i].cq)
            continue;
        grpc_completion_queue_shutdown(srv->queues[i].cq);
        if (srv->queues[i].started) {
            pthread_join(srv->queues[i].thread, NULL);
        } else {
            while (grpc_completion_queue_next(srv->queues[i].cq,
                                              gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                       .type != GRPC_QUEUE_SHUTDOWN)
                ;
        }
        grpc_completion_queue_destroy(srv->queues[i].cq);
    }
    free(srv->queues);
    free(srv->registered);
    free(srv->raw);
    free((void *)srv->handlers);
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->cv);
    free(srv);
    grpc_shutdown();
}

/* "127.0.0.1:0" + 40123 -> "127.0.0.1:40123" */
static void bound_address(const char *listen, int port, char *out, size_t outlen)
{
    const char *colon = strrchr(listen, ':');
    if (strncmp(listen, "unix:", 5) == 0 || !colon)
        snprintf(out, outlen, "%s", listen);
    else
        snprintf(out, outlen, "%.*s:%d", (int)(colon - listen), listen, port);
}

/* Every request the server keeps posted, allocated before it starts (nothing is allocated
 * for them afterwards). false when out of memory (nothing is left allocated). */
static bool make_requests(bw_rpc_server *srv, request ***reqs, size_t *nreqs,
                          unknown_request ***unks)
{
    size_t nr = (size_t)srv->nqueues * srv->nhandlers * (size_t)srv->requests_per_method;
    *nreqs = 0;
    *reqs = calloc(nr ? nr : 1, sizeof(**reqs));
    *unks = calloc((size_t)srv->nqueues, sizeof(**unks));
    bool ok = *reqs && *unks;
    for (int i = 0; ok && i < srv->nqueues; i++) {
        for (size_t h = 0; ok && h < srv->nhandlers; h++)
            for (int k = 0; ok && k < srv->requests_per_method; k++) {
                request *r = calloc(1, sizeof(*r));
                if ((ok = r != NULL)) {
                    r->srv = srv;
                    r->handler = h;
                    r->qi = i;
                    (*reqs)[(*nreqs)++] = r;
                }
            }
        unknown_request *u = ok ? calloc(1, sizeof(*u)) : NULL;
        if ((ok = ok && u != NULL)) {
            u->srv = srv;
            u->qi = i;
            (*unks)[i] = u;
        }
    }
    if (!ok) {
        for (size_t i = 0; *reqs && i < *nreqs; i++)
            free((*reqs)[i]);
        for (int i = 0; *unks && i < srv->nqueues; i++)
            free((*unks)[i]);
        free(*reqs);
        free(*unks);
        *reqs = NULL;
        *unks = NULL;
    }
    return ok;
}

static bool is_raw(const bw_rpc_server_opts *opts, const bw_rpc_method *m)
{
    for (size_t i = 0; i < opts->nraw_methods; i++)
        if (opts->raw_methods[i] == m)
            return true;
    return false;
}

void bw__rpc_quiet_mutex_checks(void)
{
    /* absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore), under the inline
     * namespaces of the builds we know (Debian 12's first); an enum class is an int to the
     * ABI. */
    static const char *const names[] = {
        "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
        "_ZN4absl29SetMutexDeadlockDetectionModeENS_15OnDeadlockCycleE",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *sym = dlsym(RTLD_DEFAULT, names[i]);
        if (sym) {
            void (*set_mode)(int);
            memcpy(&set_mode, &sym, sizeof(set_mode));
            set_mode(0); /* kIgnore */
            return;
        }
    }
}

int bw__rpc_server_start(const bw_rpc_server_opts *opts, const bw_rpc_handler *handlers, size_t n,
                         void *user, bw_rpc_server **out, char *bound, size_t boundlen, char *err,
                         size_t errlen)
{
    *out = NULL;
    bw__rpc_quiet_mutex_checks();
    grpc_server_credentials *creds = NULL;
    int rc = bw__tls_server_credentials(&opts->tls, &creds, err, errlen);
    if (rc != BW_OK)
        return rc;

    grpc_init();
    bw_rpc_server *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        grpc_server_credentials_release(creds);
        grpc_shutdown();
        snprintf(err, errlen, "out of memory");
        return BW_NOMEM;
    }
    pthread_mutex_init(&srv->mu, NULL);
    bw__cond_init_mono(&srv->cv);
    srv->shutdown_tag.done = shutdown_done;
    srv->nhandlers = n;
    srv->user = user;
    srv->role = opts->role ? opts->role : "server";
    srv->requests_per_method = opts->requests_per_method > 0 ? opts->requests_per_method : 4;
    srv->call_memory_limit = opts->call_memory_limit;
    srv->auth = opts->auth;
    srv->grants = opts->grants;
    srv->self_id = opts->self_id;
    srv->nqueues = opts->threads > 0 ? opts->threads : 1;
    bw_rpc_handler *hcopy = calloc(n ? n : 1, sizeof(*hcopy));
    srv->handlers = hcopy;
    srv->raw = calloc(n ? n : 1, sizeof(*srv->raw));
    srv->queues = calloc((size_t)srv->nqueues, sizeof(queue));
    srv->registered = calloc(n ? n : 1, sizeof(void *));
    request **reqs = NULL;
    unknown_request **unks = NULL;
    size_t nreqs = 0;
    if (!hcopy || !srv->raw || !srv->queues || !srv->registered ||
        !make_requests(srv, &reqs, &nreqs, &unks)) {
        grpc_server_credentials_release(creds);
        destroy(srv);
        snprintf(err, errlen, "out of memory");
        return BW_NOMEM;
    }
    memcpy(hcopy, handlers, n * sizeof(*hcopy));
    for (size_t h = 0; h < n; h++)
        srv->raw[h] = is_raw(opts, handlers[h].method);

    grpc_arg args[8];
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = opts->max_receive_bytes > 0 ? opts->max_receive_bytes : 4 << 20;
    /* Clients ping every BW_RPC_KEEPALIVE_MS, also between calls (core/rpc/client.c): accept
     * that instead of answering GOAWAY "too many pings", and ping idle clients too, so that
     * a call whose client vanished is cancelled. */
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS;
    args[1].value.integer = BW_RPC_KEEPALIVE_MS / 2;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS;
    args[2].value.integer = 1;
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_HTTP2_MAX_PING_STRIKES;
    args[3].value.integer = 0;
    args[4].type = GRPC_ARG_INTEGER;
    args[4].key = GRPC_ARG_KEEPALIVE_TIME_MS;
    args[4].value.integer = 5 * BW_RPC_KEEPALIVE_MS;
    args[5].type = GRPC_ARG_INTEGER;
    args[5].key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS;
    args[5].value.integer = BW_RPC_KEEPALIVE_TIMEOUT_MS;
    /* gRPC sets SO_REUSEPORT by default: two daemons could then listen on one port and split
     * its connections. One process per address (a worker restarted at its address is the same
     * worker: server/membership.c relies on it). */
    args[6].type = GRPC_ARG_INTEGER;
    args[6].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[6].value.integer = 0;
    /* A server with bidirectional streams (the coordinator) keeps gRPC's receive window per
     * stream at its 64 KiB default: with BDP probing it grows to megabytes, which a client
     * that never reads its answers fills on every stream while the runtime has stopped
     * reading it (server.h; 130 MiB with 16 such streams). Their messages are small. */
    bool any_bidi = false;
    for (size_t h = 0; h < n; h++)
        any_bidi = any_bidi || bw__method_bidi(handlers[h].method);
    args[7].type = GRPC_ARG_INTEGER;
    args[7].key = GRPC_ARG_HTTP2_BDP_PROBE;
    args[7].value.integer = 0;
    grpc_channel_args cargs = {any_bidi ? 8 : 7, args};
    srv->server = grpc_server_create(&cargs, NULL);
    for (int i = 0; i < srv->nqueues; i++) {
        srv->queues[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(srv->server, srv->queues[i].cq, NULL);
    }
    for (size_t h = 0; h < n; h++)
        srv->registered[h] = grpc_server_register_method(
            srv->server, handlers[h].method->path, NULL,
            bw__method_bidi(handlers[h].method) ? GRPC_SRM_PAYLOAD_NONE
                                                : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
            0);
    /* The threads start before the port is bound: a server that has bound a port cannot be
     * destroyed without a shutdown, and nothing fails after the port. */
    for (int i = 0; i < srv->nqueues && rc == BW_OK; i++) {
        if (pthread_create(&srv->queues[i].thread, NULL, queue_thread, srv->queues[i].cq) != 0) {
            snprintf(err, errlen, "cannot start completion-queue thread %d of %d", i + 1,
                     srv->nqueues);
            rc = BW_INTERNAL;
        }
        srv->queues[i].started = rc == BW_OK;
    }
    int port = rc == BW_OK ? grpc_server_add_http2_port(srv->server, opts->listen, creds) : 0;
    grpc_server_credentials_release(creds);
    if (rc == BW_OK && port == 0) {
        snprintf(err, errlen, "cannot listen on %s (address in use, or not a local address?)",
                 opts->listen);
        rc = BW_UNAVAILABLE;
    }
    if (rc == BW_OK) {
        bound_address(opts->listen, port, bound, boundlen);
        if (opts->on_bound)
            opts->on_bound(user, bound);
        grpc_server_start(srv->server);
    }
    /* Every request goes out, or, when the server could not start, is freed. */
    for (size_t i = 0; i < nreqs; i++) {
        if (rc == BW_OK)
            post_request(reqs[i]);
        else
            free(reqs[i]);
    }
    for (int i = 0; i < srv->nqueues; i++) {
        if (rc == BW_OK && unks[i]) /* every one is set when rc is BW_OK */
            post_unknown(unks[i]);
        else
            free(unks[i]);
    }
    free(reqs);
    free(unks);
    if (rc != BW_OK) {
        destroy(srv);
        return rc;
    }
    *out = srv;
    return BW_OK;
}

void bw__rpc_server_stop(bw_rpc_server *srv, int grace_ms)
{
    if (!srv)
        return;
    atomic_store(&srv->stopping, 1);
    grpc_server_shutdown_and_notify(srv->server, srv->queues[0].cq, &srv->shutdown_tag);
    /* Open streams end now (their clients reopen them elsewhere or later); answers already
     * owed still arrive, and are dropped (bw__rpc_msg_answer). */
    pthread_mutex_lock(&srv->mu);
    for (struct bidi *b = srv->streams; b; b = b->next)
        grpc_call_cancel_with_status(b->call->call, GRPC_STATUS_UNAVAILABLE,
                                     "the server is shutting down: retry", NULL);
    pthread_mutex_unlock(&srv->mu);
    if (!wait_shutdown(srv, grace_ms)) {
        BW_WARN("calls still running after the grace period; cancelling them calls=%ld grace_ms=%d",
                atomic_load(&srv->live_calls), grace_ms);
        grpc_server_cancel_all_calls(srv->server);
        wait_shutdown(srv, -1);
    }
    destroy(srv);
}
