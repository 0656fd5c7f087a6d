/* The client side of the gRPC runtime (client.h): channels, unary calls with a deadline,
 * server streams, and errors as a code and a sentence naming the method and target. */
#include "rpc/client.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "common/errors.h"
#include "common/interrupt.h"
#include "common/util.h"
#include "rpc/dchan.h"

enum { BW_CHANNEL_METHODS_MAX = 64 };

struct bw_rpc_channel {
    grpc_channel *channel;
    char *target;
    bool tls;
    /* grpc_channel_register_call handles, registered on first use of each method */
    pthread_mutex_t mu;
    /* "authorization: Bearer TOKEN" on every call when a token was given */
    grpc_metadata auth;
    size_t nauth;
    const bw_rpc_method *registered[BW_CHANNEL_METHODS_MAX];
    void *handles[BW_CHANNEL_METHODS_MAX];
    size_t nregistered;
    /* What the target's certificate names, read once (under mu) after gRPC's name check
     * failed: for the error; "": not read yet. */
    char peer_names[400];
};

/* Appends the channel argument key = value to args[*n]. */
static void int_arg(grpc_arg *args, size_t *n, const char *key, int value)
{
    args[*n].type = GRPC_ARG_INTEGER;
    args[*n].key = (char *)key;
    args[(*n)++].value.integer = value;
}

int bw__rpc_channel_open(const bw_rpc_channel_opts *opts, bw_rpc_channel **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    if (!opts->target || !*opts->target) {
        snprintf(err, errlen, "no target address given");
        return BW_INVALID_ARGUMENT;
    }
    grpc_channel_credentials *creds = opts->creds;
    int rc = creds ? BW_OK : bw__tls_client_credentials(&opts->tls, &creds, err, errlen);
    if (rc != BW_OK)
        return rc;
    grpc_init();
    bw_rpc_channel *ch = calloc(1, sizeof(*ch));
    if (!ch || !(ch->target = strdup(opts->target))) {
        free(ch);
        if (!opts->creds)
            grpc_channel_credentials_release(creds);
        grpc_shutdown();
        snprintf(err, errlen, "out of memory for a channel to %s", opts->target);
        return BW_NOMEM;
    }
    int backoff = opts->max_reconnect_ms > 0 ? opts->max_reconnect_ms : 1000;
    grpc_arg args[11];
    size_t nargs = 0;
    int_arg(args, &nargs, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
            opts->max_receive_bytes > 0 ? opts->max_receive_bytes : 4 << 20);
    /* A restarted peer should be reachable again within about a second, not gRPC's default
     * two minutes. */
    int_arg(args, &nargs, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, backoff);
    int_arg(args, &nargs, GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, backoff < 100 ? backoff : 100);
    /* Each connection attempt (TCP connect, TLS handshake, HTTP/2 settings) has its own
     * deadline: gRPC takes GRPC_ARG_MIN_RECONNECT_BACKOFF_MS as its minimum connect timeout,
     * 20 s by default, so an attempt that began during a partition would outlive the heal by
     * up to 20 s (SYNs retransmitted at 1, 3, 7, 15 s). After BW_RPC_CONNECT_TIMEOUT_MS the
     * attempt is abandoned and the next one starts on a fresh socket after the backoff above
     * (docs/operating.md, "Networks"). Not 100 ms: that cut slow TLS handshakes short on a
     * loaded machine (client.h, BW_RPC_CONNECT_TIMEOUT_MS). */
    int_arg(args, &nargs, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
            opts->connect_ms > 0 ? opts->connect_ms : BW_RPC_CONNECT_TIMEOUT_MS);
    /* Names are resolved again when a connection fails (a pod back on a new IP under the same
     * name), at most once per BW_RPC_RERESOLVE_MS instead of gRPC's 30 s. */
    int_arg(args, &nargs, GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, BW_RPC_RERESOLVE_MS);
    /* Keepalive: a connection whose peer went silent (a partition, a paused host) is found
     * dead within about four seconds and its calls fail at once, instead of waiting out TCP's
     * retransmissions; the channel then reconnects as above (docs/operating.md, "Networks").
     * Servers accept these pings (core/rpc/server.c). */
    int_arg(args, &nargs, GRPC_ARG_KEEPALIVE_TIME_MS, BW_RPC_KEEPALIVE_MS);
    int_arg(args, &nargs, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, BW_RPC_KEEPALIVE_TIMEOUT_MS);
    int_arg(args, &nargs, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    int_arg(args, &nargs, GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    if (opts->tls.server_name) {
        args[nargs].type = GRPC_ARG_STRING;
        args[nargs].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[nargs++].value.string = (char *)opts->tls.server_name;
    }
    grpc_channel_args cargs = {nargs, args};
    ch->channel = grpc_channel_create(opts->target, creds, &cargs);
    if (!opts->creds)
        grpc_channel_credentials_release(creds);
    if (!ch->channel) {
        snprintf(err, errlen, "cannot create a channel to %s", opts->target);
        free(ch->target);
        free(ch);
        grpc_shutdown();
        return BW_INVALID_ARGUMENT;
    }
    pthread_mutex_init(&ch->mu, NULL);
    ch->tls = bw__tls_client_enabled(&opts->tls);
    if (opts->tls.token && *opts->tls.token) {
        size_t len = strlen(opts->tls.token) + 8;
        char *v = malloc(len);
        if (v) {
            snprintf(v, len, "Bearer %s", opts->tls.token);
            ch->auth.key = grpc_slice_from_static_string("authorization");
            ch->auth.value = grpc_slice_from_copied_string(v);
            ch->nauth = 1;
            free(v);
        } else {
            bw__rpc_channel_close(ch);
            snprintf(err, errlen, "out of memory for the bearer token of a channel to %s",
                     opts->target);
            return BW_NOMEM;
        }
    } else if (opts->header_name && opts->header_value) {
        ch->auth.key = grpc_slice_from_static_string(opts->header_name);
        ch->auth.value = grpc_slice_from_copied_string(opts->header_value);
        ch->nauth = 1;
    }
    *out = ch;
    return BW_OK;
}

void bw__rpc_channel_close(bw_rpc_channel *ch)
{
    if (!ch)
        return;
    grpc_channel_destroy(ch->channel);
    if (ch->nauth)
        grpc_slice_unref(ch->auth.value);
    pthread_mutex_destroy(&ch->mu);
    free(ch->target);
    free(ch);
    grpc_shutdown();
}

const char *bw__rpc_channel_target(const bw_rpc_channel *ch)
{
    return ch->target;
}

/* The channel's handle for `m`, registering the method on first use. */
static void *method_handle(bw_rpc_channel *ch, const bw_rpc_method *m)
{
    void *h = NULL;
    pthread_mutex_lock(&ch->mu);
    for (size_t i = 0; i < ch->nregistered && !h; i++)
        if (ch->registered[i] == m)
            h = ch->handles[i];
    if (!h) {
        h = grpc_channel_register_call(ch->channel, m->path, NULL, NULL);
        if (ch->nregistered < BW_CHANNEL_METHODS_MAX) {
            ch->registered[ch->nregistered] = m;
            ch->handles[ch->nregistered++] = h;
        }
    }
    pthread_mutex_unlock(&ch->mu);
    return h;
}

/* The batchwire code a batchwire peer put in the "bw-error" trailer, or 1 if none. */
static int trailer_code(const grpc_metadata_array *md)
{
    for (size_t i = 0; i < md->count; i++) {
        if (grpc_slice_str_cmp(md->metadata[i].key, "bw-error") != 0)
            continue;
        char *v = grpc_slice_to_c_string(md->metadata[i].value);
        int rc = bw__err_from_name(v);
        gpr_free(v);
        return rc;
    }
    return 1;
}

/* What the certificate at ch's target names (bw__tls_probe_names), probed once per channel:
 * a peer that fails gRPC's name check fails it on every call. */
static void peer_names(bw_rpc_channel *ch, char *names, size_t len)
{
    pthread_mutex_lock(&ch->mu);
    snprintf(names, len, "%s", ch->peer_names);
    pthread_mutex_unlock(&ch->mu);
    if (*names || bw__tls_probe_names(ch->target, 1000, names, len) != BW_OK)
        return;
    pthread_mutex_lock(&ch->mu);
    snprintf(ch->peer_names, sizeof(ch->peer_names), "%s", names);
    pthread_mutex_unlock(&ch->mu);
}

/* The error for a failed call: the peer's exact code when it sent one, and a sentence. */
static int call_error(bw_rpc_channel *ch, const bw_rpc_method *m, grpc_status_code status,
                      grpc_slice details, const grpc_metadata_array *trailing, char *err,
                      size_t errlen)
{
    int rc = trailer_code(trailing);
    if (rc > 0)
        rc = bw__err_from_grpc(status);
    char *d = grpc_slice_to_c_string(details);
    /* A refused handshake reaches us as a closed socket: say where to look (once: a peer's
     * own error relayed here may carry the hint already). */
    const char *hint = "";
    char named[600];
    if (status == GRPC_STATUS_UNAVAILABLE && ch->tls && strncmp(d, "failed to connect", 17) == 0 &&
        strstr(d, "is not in peer certificate")) {
        /* gRPC says which name it checked, not what the certificate names: read it. Only for
         * this channel's own connection (gRPC's words), not for a peer's relayed error. */
        char names[400];
        peer_names(ch, names, sizeof(names));
        snprintf(named, sizeof(named),
                 " (the certificate there names %s: a CA-valid certificate for another host "
                 "is refused; docs/security.md, \"Worker certificates\")",
                 names);
        hint = named;
    } else if (status == GRPC_STATUS_UNAVAILABLE && ch->tls && !strstr(d, "(TLS: check") &&
               !strstr(d, "the certificate there names")) {
        hint = " (TLS: check that --tls-ca signed the server's certificate and, if the server "
               "requires client certificates, that --tls-cert/--tls-key are given and signed by "
               "its --tls-client-ca)";
    } else if (status == GRPC_STATUS_UNAVAILABLE && strstr(d, "Socket closed")) {
        hint = " (the server may require TLS: try --tls-ca)";
    }
    snprintf(err, errlen, "%s to %s: %s: %s%s", m->name, ch->target, bw__grpc_status_name(status),
             *d ? d : bw_strerror(rc), hint);
    gpr_free(d);
    return rc;
}

static void queue_destroy(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

static grpc_byte_buffer *pack(const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s); /* the byte buffer holds its own reference */
    return bb;
}

static int unpack_response(const bw_rpc_channel *ch, const bw_rpc_method *m, grpc_byte_buffer *recv,
                           bw_arena *arena, ProtobufCMessage **resp, char *err, size_t errlen)
{
    grpc_byte_buffer_reader reader;
    grpc_byte_buffer_reader_init(&reader, recv);
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    *resp = protobuf_c_message_unpack(m->response, &arena->pb, GRPC_SLICE_LENGTH(all),
                                      GRPC_SLICE_START_PTR(all));
    int rc = BW_OK;
    if (!*resp) {
        snprintf(err, errlen, "%s to %s: malformed %s (%zu bytes)", m->name, ch->target,
                 m->response->name, GRPC_SLICE_LENGTH(all));
        rc = BW_PROTOCOL;
    }
    grpc_slice_unref(all);
    return rc;
}

static gpr_timespec deadline_in(int timeout_ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(timeout_ms > 0 ? timeout_ms : 1, GPR_TIMESPAN));
}

bool bw__rpc_channel_wait(bw_rpc_channel *ch, int timeout_ms)
{
    uint64_t end = bw__mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_connectivity_state st = grpc_channel_check_connectivity_state(ch->channel, 1);
    /* Watched a slice at a time, so that an interrupt (bw_interrupt) ends the wait. */
    uint64_t now;
    while (st != GRPC_CHANNEL_READY && st != GRPC_CHANNEL_SHUTDOWN && !bw__interrupted() &&
           (now = bw__mono_ms()) < end) {
        grpc_channel_watch_connectivity_state(
            ch->channel, st, deadline_in(bw__interrupt_slice((int)(end - now))), cq, NULL);
        grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        st = grpc_channel_check_connectivity_state(ch->channel, 1);
    }
    queue_destroy(cq);
    return st == GRPC_CHANNEL_READY;
}

/* When a wait on a completion queue next looks at the interrupt: a slice from now, or never
 * in a process whose waits are not sliced (daemons). */
static gpr_timespec next_look(void)
{
    int ms = bw__interrupt_slice(-1);
    return ms < 0 ? gpr_inf_future(GPR_CLOCK_MONOTONIC) : deadline_in(ms);
}

/* Waits for the one batch outstanding on cq, telling `waiting` (when given) between slices
 * how long it has waited. When interrupted (and `interruptible`), cancels the call -- its
 * batch then completes at once -- and says so. */
static bool wait_batch(grpc_completion_queue *cq, grpc_call *call, bool interruptible,
                       bw_rpc_waiting_fn waiting, void *arg)
{
    bool cancelled = false;
    uint64_t t0 = bw__mono_ms();
    for (;;) {
        gpr_timespec until = (interruptible || waiting) && !cancelled
                                 ? next_look()
                                 : gpr_inf_future(GPR_CLOCK_MONOTONIC);
        grpc_event ev = grpc_completion_queue_next(cq, until, NULL);
        if (ev.type == GRPC_OP_COMPLETE)
            return cancelled;
        if (ev.type != GRPC_QUEUE_TIMEOUT)
            continue;
        if (interruptible && bw__interrupted()) {
            grpc_call_cancel(call, NULL);
            cancelled = true;
        } else if (waiting) {
            waiting(arg, bw__mono_ms() - t0);
        }
    }
}

static int interrupted_error(const bw_rpc_channel *ch, const bw_rpc_method *m, char *err,
                             size_t errlen)
{
    snprintf(err, errlen, "%s to %s: %s", m->name, ch->target, bw_strerror(BW_INTERRUPTED));
    return BW_INTERRUPTED;
}

bool bw__rpc_unknown_host(const char *err)
{
    /* gRPC's resolvers: c-ares says "Domain name not found" (ARES_ENOTFOUND), the native one
     * getaddrinfo's "Name or service not known"; a resolver that cannot be reached says
     * neither (that is an outage, retried). */
    return strstr(err, "DNS resolution failed") &&
           (strstr(err, "Domain name not found") || strstr(err, "Name or service not known") ||
            strstr(err, "No address associated with hostname"));
}

static int unary_call(bw_rpc_channel *ch, const bw_rpc_method *m, const ProtobufCMessage *req,
                      bw_arena *arena, ProtobufCMessage **resp, int timeout_ms, bool interruptible,
                      bw_rpc_waiting_fn waiting, void *arg, char *err, size_t errlen)
{
    *resp = NULL;
    if (interruptible && bw__interrupted())
        return interrupted_error(ch, m, err, errlen);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_call *call =
        grpc_channel_create_registered_call(ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                            method_handle(ch, m), deadline_in(timeout_ms), NULL);
    grpc_byte_buffer *send = pack(req);
    grpc_metadata_array initial_md, trailing_md;
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    grpc_byte_buffer *recv = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;

    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = ch->nauth;
    ops[0].data.send_initial_metadata.metadata = &ch->auth;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;

    int rc;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, &ops[0], NULL);
    if (e != GRPC_CALL_OK) {
        snprintf(err, errlen, "%s to %s: cannot start the call (error %d)", m->name, ch->target,
                 (int)e);
        rc = BW_INTERNAL;
    } else {
        /* The call's deadline bounds the wait; the batch always completes. */
        bool cancelled = wait_batch(cq, call, interruptible, waiting, arg);
        if (status != GRPC_STATUS_OK && cancelled) {
            rc = interrupted_error(ch, m, err, errlen);
        } else if (status != GRPC_STATUS_OK) {
            rc = call_error(ch, m, status, details, &trailing_md, err, errlen);
        } else if (!recv) {
            snprintf(err, errlen, "%s to %s: the response carried no message", m->name, ch->target);
            rc = BW_PROTOCOL;
        } else {
            rc = unpack_response(ch, m, recv, arena, resp, err, errlen);
        }
    }
    if (recv)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    if (error_string)
        gpr_free((void *)error_string);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    grpc_call_unref(call);
    queue_destroy(cq);
    return rc;
}

int bw__rpc_call(bw_rpc_channel *ch, const bw_rpc_method *m, const ProtobufCMessage *req,
                 bw_arena *arena, ProtobufCMessage **resp, int timeout_ms, char *err, size_t errlen)
{
    return unary_call(ch, m, req, arena, resp, timeout_ms, true, NULL, NULL, err, errlen);
}

int bw__rpc_call_watched(bw_rpc_channel *ch, const bw_rpc_method *m, const ProtobufCMessage *req,
                         bw_arena *arena, ProtobufCMessage **resp, int timeout_ms,
                         bw_rpc_waiting_fn waiting, void *arg, char *err, size_t errlen)
{
    return unary_call(ch, m, req, arena, resp, timeout_ms, true, waiting, arg, err, errlen);
}

int bw__rpc_call_uninterrupted(bw_rpc_channel *ch, const bw_rpc_method *m,
                               const ProtobufCMessage *req, bw_arena *arena,
                               ProtobufCMessage **resp, int timeout_ms, char *err, size_t errlen)
{
    return unary_call(ch, m, req, arena, resp, timeout_ms, false, NULL, NULL, err, errlen);
}

/* Tags of a stream's batches. */
enum { ST_START = 1, ST_STATUS, ST_MESSAGE };

struct bw_rpc_stream {
    bw_rpc_channel *ch;
    const bw_rpc_method *m;
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_byte_buffer *send;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code status;
    grpc_slice details;
    const char *error_string;
    grpc_byte_buffer *recv;
    int pending; /* batches started and not yet completed */
    int status_done, ended;
    bool cancelled; /* by an interrupt (bw_interrupt) */
    grpc_op ops[4];
    grpc_op status_op;
    grpc_op recv_op;
};

uint32_t bw__rpc_stream_retry_after_ms(const bw_rpc_stream *st)
{
    if (!st || !st->status_done)
        return 0;
    for (size_t i = 0; i < st->trailing_md.count; i++) {
        if (grpc_slice_str_cmp(st->trailing_md.metadata[i].key, "bw-retry-after-ms") != 0)
            continue;
        char *v = grpc_slice_to_c_string(st->trailing_md.metadata[i].value);
        char *end = NULL;
        unsigned long ms = strtoul(v, &end, 10);
        bool ok = end != v && *end == '\0';
        gpr_free(v);
        return ok ? (uint32_t)(ms > 60000 ? 60000 : ms) : 0;
    }
    return 0;
}

/* Takes one completion off the stream's queue; returns its tag (0 when the queue is done). */
static intptr_t stream_wait_one(bw_rpc_stream *st)
{
    grpc_event ev;
    for (;;) {
        gpr_timespec until = st->cancelled ? gpr_inf_future(GPR_CLOCK_MONOTONIC) : next_look();
        ev = grpc_completion_queue_next(st->cq, until, NULL);
        if (ev.type != GRPC_QUEUE_TIMEOUT)
            break;
        if (bw__interrupted() && !st->status_done) {
            grpc_call_cancel(st->call, NULL); /* its batches complete at once */
            st->cancelled = true;
        }
    }
    if (ev.type != GRPC_OP_COMPLETE)
        return 0;
    st->pending--;
    if ((intptr_t)ev.tag == ST_STATUS)
        st->status_done = 1;
    return (intptr_t)ev.tag;
}

/* Waits for the completion of batch `want`, recording the others. */
static void stream_wait(bw_rpc_stream *st, intptr_t want)
{
    intptr_t t;
    while ((t = stream_wait_one(st)) != 0 && t != want)
        ;
}

int bw__rpc_stream_open(bw_rpc_channel *ch, const bw_rpc_method *m, const ProtobufCMessage *req,
                        int timeout_ms, bw_rpc_stream **out, char *err, size_t errlen)
{
    *out = NULL;
    if (bw__interrupted())
        return interrupted_error(ch, m, err, errlen);
    bw_rpc_stream *st = calloc(1, sizeof(*st));
    if (!st)
        return BW_NOMEM;
    st->ch = ch;
    st->m = m;
    st->cq = grpc_completion_queue_create_for_next(NULL);
    st->call =
        grpc_channel_create_registered_call(ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, st->cq,
                                            method_handle(ch, m), deadline_in(timeout_ms), NULL);
    st->send = pack(req);
    st->details = grpc_empty_slice();
    grpc_metadata_array_init(&st->initial_md);
    grpc_metadata_array_init(&st->trailing_md);
    memset(st->ops, 0, sizeof(st->ops));
    st->ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    st->ops[0].data.send_initial_metadata.count = ch->nauth;
    st->ops[0].data.send_initial_metadata.metadata = &ch->auth;
    st->ops[1].op = GRPC_OP_SEND_MESSAGE;
    st->ops[1].data.send_message.send_message = st->send;
    st->ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    st->ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    st->ops[3].data.recv_initial_metadata.recv_initial_metadata = &st->initial_md;
    memset(&st->status_op, 0, sizeof(st->status_op));
    st->status_op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    st->status_op.data.recv_status_on_client.trailing_metadata = &st->trailing_md;
    st->status_op.data.recv_status_on_client.status = &st->status;
    st->status_op.data.recv_status_on_client.status_details = &st->details;
    st->status_op.data.recv_status_on_client.error_string = &st->error_string;
    bool started = grpc_call_start_batch(st->call, st->ops, 4, (void *)(intptr_t)ST_START, NULL) ==
                   GRPC_CALL_OK;
    st->pending += started;
    started = started && grpc_call_start_batch(st->call, &st->status_op, 1,
                                               (void *)(intptr_t)ST_STATUS, NULL) == GRPC_CALL_OK;
    st->pending += started;
    if (!started) {
        snprintf(err, errlen, "%s to %s: cannot start the call", st->m->name, ch->target);
        st->status_done = 1; /* nothing to cancel */
        bw__rpc_stream_close(st);
        return BW_INTERNAL;
    }
    *out = st;
    return BW_OK;
}

int bw__rpc_stream_next_raw(bw_rpc_stream *st, grpc_byte_buffer **msg, char *err, size_t errlen)
{
    *msg = NULL;
    if (!st->ended) {
        memset(&st->recv_op, 0, sizeof(st->recv_op));
        st->recv_op.op = GRPC_OP_RECV_MESSAGE;
        st->recv_op.data.recv_message.recv_message = &st->recv;
        st->recv = NULL;
        if (grpc_call_start_batch(st->call, &st->recv_op, 1, (void *)(intptr_t)ST_MESSAGE, NULL) !=
            GRPC_CALL_OK) {
            snprintf(err, errlen, "%s to %s: cannot read the stream", st->m->name, st->ch->target);
            return BW_INTERNAL;
        }
        st->pending++;
        stream_wait(st, ST_MESSAGE);
        if (st->recv) {
            *msg = st->recv;
            st->recv = NULL;
            return BW_OK;
        }
        st->ended = 1;
    }
    while (!st->status_done)
        stream_wait(st, ST_STATUS);
    if (st->status != GRPC_STATUS_OK && st->cancelled)
        return interrupted_error(st->ch, st->m, err, errlen);
    if (st->status != GRPC_STATUS_OK)
        return call_error(st->ch, st->m, st->status, st->details, &st->trailing_md, err, errlen);
    return BW_RPC_STREAM_END;
}

int bw__rpc_stream_next(bw_rpc_stream *st, bw_arena *arena, ProtobufCMessage **msg, char *err,
                        size_t errlen)
{
    *msg = NULL;
    grpc_byte_buffer *bb = NULL;
    int rc = bw__rpc_stream_next_raw(st, &bb, err, errlen);
    if (rc != BW_OK)
        return rc;
    rc = unpack_response(st->ch, st->m, bb, arena, msg, err, errlen);
    grpc_byte_buffer_destroy(bb);
    return rc;
}

void bw__rpc_stream_close(bw_rpc_stream *st)
{
    if (!st)
        return;
    if (!st->status_done)
        grpc_call_cancel(st->call, NULL);
    while (st->pending > 0 && stream_wait_one(st) != 0)
        ;
    grpc_call_unref(st->call);
    queue_destroy(st->cq);
    grpc_byte_buffer_destroy(st->send);
    if (st->recv)
        grpc_byte_buffer_destroy(st->recv);
    grpc_slice_unref(st->details);
    if (st->error_string)
        gpr_free((void *)st->error_string);
    grpc_metadata_array_destroy(&st->initial_md);
    grpc_metadata_array_destroy(&st->trailing_md);
    free(st);
}

/* ---- bidirectional streams (client.h) ---- */

enum { BI_OPEN = 1, BI_STATUS, BI_IO, BI_CLOSE };

struct bw_rpc_bidi {
    bw_rpc_channel *ch;
    const bw_rpc_method *m;
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code status;
    grpc_slice details;
    const char *error_string;
    grpc_byte_buffer *send, *recv;
    int pending; /* batches started and not yet completed */
    bool got_md; /* RECV_INITIAL_METADATA asked for */
    bool ended;  /* the status is in (or the call is cancelled): no more exchanges */
    bool status_done;
    grpc_op ops[3], status_op, close_op;
};

/* Takes one completion off the stream's queue, waiting at most until `until`; its tag, or 0
 * on timeout. */
static intptr_t bidi_next(bw_rpc_bidi *b, gpr_timespec until)
{
    grpc_event ev = grpc_completion_queue_next(b->cq, until, NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        return 0;
    b->pending--;
    if ((intptr_t)ev.tag == BI_STATUS)
        b->status_done = true;
    return (intptr_t)ev.tag;
}

int bw__rpc_bidi_open(bw_rpc_channel *ch, const bw_rpc_method *m, bw_rpc_bidi **out, char *err,
                      size_t errlen)
{
    *out = NULL;
    bw_rpc_bidi *b = calloc(1, sizeof(*b));
    if (!b) {
        snprintf(err, errlen, "%s to %s: out of memory for a stream", m->name, ch->target);
        return BW_NOMEM;
    }
    b->ch = ch;
    b->m = m;
    b->cq = grpc_completion_queue_create_for_next(NULL);
    b->call = grpc_channel_create_registered_call(ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, b->cq,
                                                  method_handle(ch, m),
                                                  gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    b->details = grpc_empty_slice();
    grpc_metadata_array_init(&b->initial_md);
    grpc_metadata_array_init(&b->trailing_md);
    memset(b->ops, 0, sizeof(b->ops));
    b->ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    b->ops[0].data.send_initial_metadata.count = ch->nauth;
    b->ops[0].data.send_initial_metadata.metadata = &ch->auth;
    memset(&b->status_op, 0, sizeof(b->status_op));
    b->status_op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    b->status_op.data.recv_status_on_client.trailing_metadata = &b->trailing_md;
    b->status_op.data.recv_status_on_client.status = &b->status;
    b->status_op.data.recv_status_on_client.status_details = &b->details;
    b->status_op.data.recv_status_on_client.error_string = &b->error_string;
    bool ok =
        grpc_call_start_batch(b->call, b->ops, 1, (void *)(intptr_t)BI_OPEN, NULL) == GRPC_CALL_OK;
    b->pending += ok;
    ok = ok && grpc_call_start_batch(b->call, &b->status_op, 1, (void *)(intptr_t)BI_STATUS,
                                     NULL) == GRPC_CALL_OK;
    b->pending += ok;
    if (!ok) {
        snprintf(err, errlen, "%s to %s: cannot start the call", m->name, ch->target);
        bw__rpc_bidi_close(b);
        return BW_INTERNAL;
    }
    *out = b;
    return BW_OK;
}

int bw__rpc_bidi_call(bw_rpc_bidi *b, const bw_rpc_method *as, const ProtobufCMessage *req,
                      bw_arena *arena, ProtobufCMessage **resp, int timeout_ms,
                      bw_rpc_waiting_fn waiting, void *arg, char *err, size_t errlen)
{
    *resp = NULL;
    if (bw__interrupted())
        return interrupted_error(b->ch, as, err, errlen);
    if (b->ended) {
        snprintf(err, errlen, "%s to %s: the stream %s has ended", as->name, b->ch->target,
                 b->m->name);
        return BW_UNAVAILABLE;
    }
    b->send = pack(req);
    b->recv = NULL;
    memset(b->ops, 0, sizeof(b->ops));
    size_t n = 0;
    b->ops[n].op = GRPC_OP_SEND_MESSAGE;
    b->ops[n++].data.send_message.send_message = b->send;
    if (!b->got_md) {
        b->ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        b->ops[n++].data.recv_initial_metadata.recv_initial_metadata = &b->initial_md;
        b->got_md = true;
    }
    b->ops[n].op = GRPC_OP_RECV_MESSAGE;
    b->ops[n++].data.recv_message.recv_message = &b->recv;
    if (grpc_call_start_batch(b->call, b->ops, n, (void *)(intptr_t)BI_IO, NULL) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(b->send);
        b->send = NULL;
        b->ended = true;
        snprintf(err, errlen, "%s to %s: cannot send on the stream %s", as->name, b->ch->target,
                 b->m->name);
        return BW_INTERNAL;
    }
    b->pending++;
    /* Waited a slice at a time: an interrupt cancels the call, as does the exchange's own
     * deadline (the call has none: it outlives every exchange). */
    uint64_t t0 = bw__mono_ms(), end = t0 + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
    bool cancelled = false, timed_out = false;
    for (;;) {
        uint64_t now = bw__mono_ms();
        int left = now < end ? (int)(end - now) : 0;
        int slice = bw__interrupt_slice(left);
        gpr_timespec until = cancelled || timed_out ? gpr_inf_future(GPR_CLOCK_MONOTONIC)
                                                    : deadline_in(slice > 0 ? slice : 1);
        intptr_t t = bidi_next(b, until);
        if (t == BI_IO)
            break;
        if (t != 0 || cancelled || timed_out)
            continue;
        if (bw__interrupted()) {
            grpc_call_cancel(b->call, NULL);
            cancelled = true;
        } else if (bw__mono_ms() >= end) {
            grpc_call_cancel(b->call, NULL);
            timed_out = true;
        } else if (waiting) {
            waiting(arg, bw__mono_ms() - t0);
        }
    }
    grpc_byte_buffer_destroy(b->send);
    b->send = NULL;
    if (b->recv && !cancelled && !timed_out) {
        int rc = unpack_response(b->ch, b->m, b->recv, arena, resp, err, errlen);
        grpc_byte_buffer_destroy(b->recv);
        b->recv = NULL;
        b->ended = rc != BW_OK;
        return rc;
    }
    if (b->recv)
        grpc_byte_buffer_destroy(b->recv);
    b->recv = NULL;
    b->ended = true;
    if (cancelled)
        return interrupted_error(b->ch, as, err, errlen);
    if (timed_out) {
        snprintf(err, errlen, "%s to %s: %s: no answer on the stream %s within %d ms", as->name,
                 b->ch->target, bw__grpc_status_name(GRPC_STATUS_DEADLINE_EXCEEDED), b->m->name,
                 timeout_ms);
        return BW_TIMEOUT;
    }
    /* The server ended the stream: its status says why. */
    while (!b->status_done && bidi_next(b, gpr_inf_future(GPR_CLOCK_MONOTONIC)) != 0)
        ;
    if (b->status == GRPC_STATUS_OK) {
        snprintf(err, errlen, "%s to %s: the server ended the stream %s", as->name, b->ch->target,
                 b->m->name);
        return BW_UNAVAILABLE;
    }
    return call_error(b->ch, as, b->status, b->details, &b->trailing_md, err, errlen);
}

void bw__rpc_bidi_close(bw_rpc_bidi *b)
{
    if (!b)
        return;
    if (!b->ended && !b->status_done) {
        /* Idle: say so, and let the server end the call with its status; a server that does
         * not in a moment is cut off. */
        memset(&b->close_op, 0, sizeof(b->close_op));
        b->close_op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        if (grpc_call_start_batch(b->call, &b->close_op, 1, (void *)(intptr_t)BI_CLOSE, NULL) ==
            GRPC_CALL_OK)
            b->pending++;
        while (!b->status_done && bidi_next(b, deadline_in(200)) != 0)
            ;
    }
    if (!b->status_done)
        grpc_call_cancel(b->call, NULL);
    while (b->pending > 0 && bidi_next(b, gpr_inf_future(GPR_CLOCK_MONOTONIC)) != 0)
        ;
    grpc_call_unref(b->call);
    queue_destroy(b->cq);
    if (b->send)
        grpc_byte_buffer_destroy(b->send);
    if (b->recv)
        grpc_byte_buffer_destroy(b->recv);
    grpc_slice_unref(b->details);
    if (b->error_string)
        gpr_free((void *)b->error_string);
    grpc_metadata_array_destroy(&b->initial_md);
    grpc_metadata_array_destroy(&b->trailing_md);
    free(b);
}
