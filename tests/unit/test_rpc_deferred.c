/* The gRPC runtime's deferred streams, in one process over loopback: a raw method whose
 * handler defers, reads its request's bytes on another thread and begins the stream there
 * (bw__rpc_call_request, bw__rpc_stream_begin); an error with a retry hint
 * (bw__rpc_retry_after, read back with bw__rpc_stream_retry_after_ms); a stream begun for a
 * client that has gone; and a server stop that waits for a deferred call begun late. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "rpc/client.h"
#include "rpc/server.h"

/* Test-only method typed with the health messages: `service` says what to do, "N" streams N
 * messages, "busy" fails with a hint, "late" begins after 400 ms. */
static const bw_rpc_method count = {"/batchwire.test.Deferred/Count", "Count",
                                    &grpc__health__v1__health_check_request__descriptor,
                                    &grpc__health__v1__health_check_response__descriptor};
static const bw_rpc_method *const raw[] = {&count};

typedef Grpc__Health__V1__HealthCheckRequest req_t;
typedef Grpc__Health__V1__HealthCheckResponse resp_t;

static atomic_int freed, begun_off_cq, sizes_ok;
static pthread_t cq_thread_seen;

typedef struct stream {
    int next, total;
} stream;

static int next_msg(void *state, bw_rpc_call *call, bw_rpc_out *out)
{
    stream *s = state;
    if (s->next == s->total)
        return BW_RPC_END;
    resp_t *m = bw__arena_alloc(bw__rpc_call_msg_arena(call), sizeof(*m));
    grpc__health__v1__health_check_response__init(m);
    m->status = s->next++;
    out->msg = &m->base;
    return BW_OK;
}

static void free_stream(void *state)
{
    free(state);
    atomic_fetch_add(&freed, 1);
}

/* What a worker's pool thread does: the request's bytes, decoded here, then the stream. */
static void *serve_later(void *arg)
{
    bw_rpc_call *call = arg;
    size_t announced = bw__rpc_call_request_size(call), len = 0;
    const uint8_t *p = bw__rpc_call_request(call, &len);
    if (p && len == announced)
        atomic_fetch_add(&sizes_ok, 1);
    req_t *r = p ? grpc__health__v1__health_check_request__unpack(NULL, len, p) : NULL;
    bw__rpc_call_drop_request(call);
    size_t after = 1;
    bw__rpc_call_request(call, &after); /* dropped: nothing */
    if (!r || after != 0) {
        bw__rpc_fail(call, BW_INTERNAL, "the request's bytes were not as received");
        bw__rpc_finish(call, BW_INTERNAL, NULL);
    } else if (strcmp(r->service, "busy") == 0) {
        bw__rpc_retry_after(call, 1234);
        bw__rpc_fail(call, BW_BUSY, "busy: retry after 1234 ms");
        bw__rpc_finish(call, BW_BUSY, NULL);
    } else {
        if (strcmp(r->service, "late") == 0)
            usleep(400 * 1000);
        stream *s = calloc(1, sizeof(*s));
        s->total = strcmp(r->service, "late") == 0 ? 2 : (int)strtol(r->service, NULL, 10);
        if (!pthread_equal(pthread_self(), cq_thread_seen))
            atomic_fetch_add(&begun_off_cq, 1);
        bw__rpc_stream_begin(call, next_msg, s, free_stream);
    }
    if (r)
        grpc__health__v1__health_check_request__free_unpacked(r, NULL);
    return NULL;
}

static int on_count(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                    ProtobufCMessage **resp)
{
    (void)user;
    (void)resp;
    if (req) /* a raw method: the runtime must not have unpacked it */
        return bw__rpc_fail(call, BW_INTERNAL, "the runtime unpacked a raw method's request");
    cq_thread_seen = pthread_self();
    pthread_t t;
    pthread_create(&t, NULL, serve_later, call);
    pthread_detach(t);
    return BW_RPC_DEFERRED;
}

static const bw_rpc_handler handlers[] = {{&count, on_count}};

static bw_rpc_server *start(char *bound, size_t boundlen)
{
    bw_rpc_server_opts o;
    memset(&o, 0, sizeof(o));
    o.listen = "127.0.0.1:0";
    o.threads = 1;
    o.requests_per_method = 2;
    o.max_receive_bytes = 1 << 20;
    o.call_memory_limit = 1 << 20;
    o.role = "test";
    o.raw_methods = raw;
    o.nraw_methods = 1;
    bw_rpc_server *s = NULL;
    char err[256];
    assert_int_equal(
        bw__rpc_server_start(&o, handlers, 1, NULL, &s, bound, boundlen, err, sizeof(err)), BW_OK);
    return s;
}

static bw_rpc_channel *channel(const char *bound)
{
    bw_rpc_channel_opts co;
    memset(&co, 0, sizeof(co));
    co.target = bound;
    bw_rpc_channel *ch = NULL;
    char err[256];
    assert_int_equal(bw__rpc_channel_open(&co, &ch, err, sizeof(err)), BW_OK);
    return ch;
}

/* Reads a whole stream: the number of messages (each status counting from 0), or the error. */
static int read_all(bw_rpc_channel *ch, const char *what, int *n, uint32_t *hint, char *err,
                    size_t errlen)
{
    req_t r = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    r.service = (char *)what;
    bw_rpc_stream *st = NULL;
    int rc = bw__rpc_stream_open(ch, &count, &r.base, 10000, &st, err, errlen);
    assert_int_equal(rc, BW_OK);
    bw_arena a;
    bw__arena_init(&a, 0);
    *n = 0;
    for (;;) {
        ProtobufCMessage *m = NULL;
        rc = bw__rpc_stream_next(st, &a, &m, err, errlen);
        if (rc != BW_OK)
            break;
        assert_int_equal(((resp_t *)m)->status, *n);
        (*n)++;
    }
    *hint = bw__rpc_stream_retry_after_ms(st);
    bw__arena_reset(&a);
    bw__rpc_stream_close(st);
    return rc == BW_RPC_STREAM_END ? BW_OK : rc;
}

static void test_begin_on_another_thread(void **state)
{
    (void)state;
    char bound[64], err[512];
    bw_rpc_server *s = start(bound, sizeof(bound));
    bw_rpc_channel *ch = channel(bound);
    int n = 0;
    uint32_t hint = 7;
    assert_int_equal(read_all(ch, "25", &n, &hint, err, sizeof(err)), BW_OK);
    assert_int_equal(n, 25);
    assert_int_equal(hint, 0);
    assert_int_equal(read_all(ch, "0", &n, &hint, err, sizeof(err)), BW_OK);
    assert_int_equal(n, 0);
    assert_int_equal(atomic_load(&begun_off_cq), 2);
    assert_int_equal(atomic_load(&sizes_ok), 2);
    bw__rpc_channel_close(ch);
    bw__rpc_server_stop(s, 1000);
    assert_int_equal(atomic_load(&freed), 2);
}

static void test_error_with_hint(void **state)
{
    (void)state;
    char bound[64], err[512];
    bw_rpc_server *s = start(bound, sizeof(bound));
    bw_rpc_channel *ch = channel(bound);
    int n = 0;
    uint32_t hint = 0;
    assert_int_equal(read_all(ch, "busy", &n, &hint, err, sizeof(err)), BW_BUSY);
    assert_int_equal(n, 0);
    assert_int_equal(hint, 1234);
    assert_non_null(strstr(err, "retry after 1234 ms"));
    bw__rpc_channel_close(ch);
    bw__rpc_server_stop(s, 1000);
}

/* The client gives up before the stream begins; the stream's state is still freed. */
static void test_begin_after_the_client_left(void **state)
{
    (void)state;
    char bound[64], err[512];
    atomic_store(&freed, 0);
    bw_rpc_server *s = start(bound, sizeof(bound));
    bw_rpc_channel *ch = channel(bound);
    req_t r = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    r.service = "late";
    bw_rpc_stream *st = NULL;
    assert_int_equal(bw__rpc_stream_open(ch, &count, &r.base, 100, &st, err, sizeof(err)), BW_OK);
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *m = NULL;
    assert_int_equal(bw__rpc_stream_next(st, &a, &m, err, sizeof(err)), BW_TIMEOUT);
    bw__rpc_stream_close(st);
    bw__arena_reset(&a);
    for (int i = 0; i < 200 && atomic_load(&freed) == 0; i++)
        usleep(10 * 1000);
    assert_int_equal(atomic_load(&freed), 1);
    bw__rpc_channel_close(ch);
    bw__rpc_server_stop(s, 1000);
}

/* A stop while a deferred call has not begun yet waits for it. */
static void *read_late(void *arg)
{
    bw_rpc_channel *ch = arg;
    int n = 0;
    uint32_t hint;
    char err[512];
    static int rc;
    rc = read_all(ch, "late", &n, &hint, err, sizeof(err));
    return &rc;
}

static void test_stop_waits_for_deferred(void **state)
{
    (void)state;
    char bound[64];
    atomic_store(&freed, 0);
    bw_rpc_server *s = start(bound, sizeof(bound));
    bw_rpc_channel *ch = channel(bound);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, read_late, ch), 0);
    usleep(150 * 1000); /* the call is deferred, its stream not begun */
    uint64_t t0 = bw__mono_ms();
    bw__rpc_server_stop(s, 2000);
    assert_true(bw__mono_ms() - t0 >= 200);
    assert_int_equal(atomic_load(&freed), 1); /* begun and ended before stop returned */
    void *rc;
    pthread_join(t, &rc);
    bw__rpc_channel_close(ch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_begin_on_another_thread),
        cmocka_unit_test(test_error_with_hint),
        cmocka_unit_test(test_begin_after_the_client_left),
        cmocka_unit_test(test_stop_waits_for_deferred),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
