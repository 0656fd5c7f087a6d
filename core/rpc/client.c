#include "rpc/client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "common/errors.h"

struct bw_rpc_channel {
    grpc_channel *channel;
    char *target;
    void *methods[BW_M__COUNT]; /* grpc_channel_register_call handles */
};

int bw__rpc_channel_open(const bw_rpc_channel_opts *opts, bw_rpc_channel **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    if (!opts->target || !*opts->target) {
        snprintf(err, errlen, "no target address given");
        return BW_INVALID_ARGUMENT;
    }
    grpc_channel_credentials *creds = NULL;
    int rc = bw__tls_client_credentials(&opts->tls, &creds, err, errlen);
    if (rc != BW_OK)
        return rc;
    grpc_init();
    bw_rpc_channel *ch = calloc(1, sizeof(*ch));
    if (!ch || !(ch->target = strdup(opts->target))) {
        free(ch);
        grpc_channel_credentials_release(creds);
        grpc_shutdown();
        return BW_NOMEM;
    }
    int backoff = opts->max_reconnect_ms > 0 ? opts->max_reconnect_ms : 1000;
    grpc_arg args[5];
    size_t nargs = 0;
    args[nargs].type = GRPC_ARG_INTEGER;
    args[nargs].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[nargs++].value.integer = opts->max_receive_bytes > 0 ? opts->max_receive_bytes : 4 << 20;
    /* A restarted peer should be reachable again within about a second, not gRPC's default
     * two minutes. */
    args[nargs].type = GRPC_ARG_INTEGER;
    args[nargs].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    args[nargs++].value.integer = backoff;
    args[nargs].type = GRPC_ARG_INTEGER;
    args[nargs].key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
    args[nargs++].value.integer = backoff < 100 ? backoff : 100;
    args[nargs].type = GRPC_ARG_INTEGER;
    args[nargs].key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS;
    args[nargs++].value.integer = backoff < 100 ? backoff : 100;
    if (opts->tls.server_name) {
        args[nargs].type = GRPC_ARG_STRING;
        args[nargs].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[nargs++].value.string = (char *)opts->tls.server_name;
    }
    grpc_channel_args cargs = {nargs, args};
    ch->channel = grpc_channel_create(opts->target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    if (!ch->channel) {
        snprintf(err, errlen, "cannot create a channel to %s", opts->target);
        free(ch->target);
        free(ch);
        grpc_shutdown();
        return BW_INVALID_ARGUMENT;
    }
    for (int m = 0; m < BW_M__COUNT; m++)
        ch->methods[m] = grpc_channel_register_call(ch->channel, bw__methods[m].path, NULL, NULL);
    *out = ch;
    return BW_OK;
}

void bw__rpc_channel_close(bw_rpc_channel *ch)
{
    if (!ch)
        return;
    grpc_channel_destroy(ch->channel);
    free(ch->target);
    free(ch);
    grpc_shutdown();
}

const char *bw__rpc_channel_target(const bw_rpc_channel *ch)
{
    return ch->target;
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

int bw__rpc_call(bw_rpc_channel *ch, bw_method_id method, const ProtobufCMessage *req,
                 bw_arena *arena, ProtobufCMessage **resp, int timeout_ms, char *err, size_t errlen)
{
    const bw_rpc_method *m = &bw__methods[method];
    *resp = NULL;
    if (timeout_ms <= 0)
        timeout_ms = 1;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_registered_call(
        ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, ch->methods[method], deadline, NULL);

    size_t len = protobuf_c_message_get_packed_size(req);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(req, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);

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
        grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (status != GRPC_STATUS_OK) {
            rc = trailer_code(&trailing_md);
            if (rc > 0)
                rc = bw__err_from_grpc(status);
            char *d = grpc_slice_to_c_string(details);
            snprintf(err, errlen, "%s to %s: %s: %s", m->name, ch->target,
                     bw__grpc_status_name(status), *d ? d : bw_strerror(rc));
            gpr_free(d);
        } else if (!recv) {
            snprintf(err, errlen, "%s to %s: the response carried no message", m->name, ch->target);
            rc = BW_PROTOCOL;
        } else {
            grpc_byte_buffer_reader reader;
            grpc_byte_buffer_reader_init(&reader, recv);
            grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
            grpc_byte_buffer_reader_destroy(&reader);
            *resp = protobuf_c_message_unpack(m->response, &arena->pb, GRPC_SLICE_LENGTH(all),
                                              GRPC_SLICE_START_PTR(all));
            if (!*resp) {
                snprintf(err, errlen, "%s to %s: malformed %s (%zu bytes)", m->name, ch->target,
                         m->response->name, GRPC_SLICE_LENGTH(all));
                rc = BW_PROTOCOL;
            } else {
                rc = BW_OK;
            }
            grpc_slice_unref(all);
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
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    return rc;
}
