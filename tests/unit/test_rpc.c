/* The gRPC runtime end to end, in one process over loopback: unary calls, exact error codes,
 * deferred responses, server streams (whole, failing midway, abandoned by the client), the
 * catch-all for unknown methods, the receive limit, deadlines, concurrent callers and TLS. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_dir.h"
#include "common/util.h"
#include "rpc/client.h"
#include "rpc/server.h"

/* Test-only methods, typed with the health messages: `service` carries the instruction. */
static const bw_rpc_method echo = {"/batchwire.test.Rpc/Echo", "Echo",
                                   &grpc__health__v1__health_check_request__descriptor,
                                   &grpc__health__v1__health_check_response__descriptor};
static const bw_rpc_method count = {"/batchwire.test.Rpc/Count", "Count",
                                    &grpc__health__v1__health_check_request__descriptor,
                                    &grpc__health__v1__health_check_response__descriptor};
static const bw_rpc_method nobody = {"/batchwire.test.Rpc/Nobody", "Nobody",
                                     &grpc__health__v1__health_check_request__descriptor,
                                     &grpc__health__v1__health_check_response__descriptor};

typedef Grpc__Health__V1__HealthCheckRequest req_t;
typedef Grpc__Health__V1__HealthCheckResponse resp_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int streams_freed;

static void *finish_later(void *arg)
{
    bw_rpc_call *call = arg;
    usleep(50 * 1000);
    resp_t *out = bw__arena_alloc(bw__rpc_call_arena(call), sizeof(*out));
    grpc__health__v1__health_check_response__init(out);
    out->status = 7;
    bw__rpc_finish(call, BW_OK, &out->base);
    return NULL;
}

static void *finish_much_later(void *arg)
{
    usleep(600 * 1000);
    bw__rpc_finish(arg, BW_UNAVAILABLE, NULL);
    return NULL;
}

static int on_echo(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                   ProtobufCMessage **resp)
{
    (void)user;
    const req_t *r = (const void *)req;
    pthread_t t;
    if (strcmp(r->service, "wrong-owner") == 0)
        return bw__rpc_fail(call, BW_WRONG_OWNER, "shard 3 moved to worker w2");
    if (strcmp(r->service, "defer") == 0 || strcmp(r->service, "defer-long") == 0) {
        pthread_create(&t, NULL, r->service[5] ? finish_much_later : finish_later, call);
        pthread_detach(t);
        return BW_RPC_DEFERRED;
    }
    resp_t *out = bw__arena_alloc(bw__rpc_call_arena(call), sizeof(*out));
    grpc__health__v1__health_check_response__init(out);
    out->status = (int)strlen(r->service);
    *resp = &out->base;
    return BW_OK;
}

typedef struct counter {
    int next, total, fail_at;
} counter;

static int count_next(void *state, bw_rpc_call *call, bw_rpc_out *out)
{
    counter *c = state;
    if (c->next == c->fail_at)
        return bw__rpc_fail(call, BW_CORRUPT, "record %d is corrupt", c->next);
    if (c->next == c->total)
        return BW_RPC_END;
    resp_t *m = bw__arena_alloc(bw__rpc_call_msg_arena(call), sizeof(*m));
    grpc__health__v1__health_check_response__init(m);
    m->status = c->next++;
    out->msg = &m->base;
    return BW_OK;
}

static void count_free(void *state)
{
    free(state);
    pthread_mutex_lock(&mu);
    streams_freed++;
    pthread_mutex_unlock(&mu);
}

static int on_count(void *user, bw_rpc_call *call, const ProtobufCMessage *req,
                    ProtobufCMessage **resp)
{
    (void)user;
    (void)resp;
    const req_t *r = (const void *)req;
    counter *c = calloc(1, sizeof(*c));
    c->fail_at = -1;
    if (sscanf(r->service, "%d/%d", &c->total, &c->fail_at) < 1) {
        free(c);
        return bw__rpc_fail(call, BW_INVALID_ARGUMENT, "bad count '%s'", r->service);
    }
    bw__rpc_stream_start(call, count_next, c, count_free);
    return BW_RPC_STREAM;
}

static const bw_rpc_handler handlers[] = {{&echo, on_echo}, {&count, on_count}};

static bw_rpc_server *srv;
static bw_rpc_channel *ch;
static char bound[128];
static char err[1024];

static int start(const char *cert, const char *key)
{
    bw_rpc_server_opts o;
    memset(&o, 0, sizeof(o));
    o.listen = "127.0.0.1:0";
    o.tls.cert = cert;
    o.tls.key = key;
    o.threads = 2;
    o.requests_per_method = 2;
    o.max_receive_bytes = 64 * 1024;
    o.call_memory_limit = 1 << 20;
    o.role = "test";
    return bw__rpc_server_start(&o, handlers, 2, NULL, &srv, bound, sizeof(bound), err,
                                sizeof(err));
}

static int setup(void **state)
{
    (void)state;
    assert_int_equal(start(NULL, NULL), BW_OK);
    bw_rpc_channel_opts co;
    memset(&co, 0, sizeof(co));
    co.target = bound;
    assert_int_equal(bw__rpc_channel_open(&co, &ch, err, sizeof(err)), BW_OK);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    bw__rpc_channel_close(ch);
    bw__rpc_server_stop(srv, 1000);
    return 0;
}

static int call(const bw_rpc_method *m, const char *service, int *status, int timeout_ms)
{
    req_t r = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    r.service = (char *)service;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp = NULL;
    err[0] = '\0';
    int rc = bw__rpc_call(ch, m, &r.base, &a, &resp, timeout_ms, err, sizeof(err));
    if (rc == BW_OK && status)
        *status = ((resp_t *)resp)->status;
    bw__arena_reset(&a);
    return rc;
}

static void test_unary(void **state)
{
    (void)state;
    int status = -1;
    assert_int_equal(call(&echo, "hello", &status, 5000), BW_OK);
    assert_int_equal(status, 5);
}

static void test_exact_error_code_and_message(void **state)
{
    (void)state;
    assert_int_equal(call(&echo, "wrong-owner", NULL, 5000), BW_WRONG_OWNER);
    assert_non_null(strstr(err, "Echo to 127.0.0.1:"));
    assert_non_null(strstr(err, "FAILED_PRECONDITION: shard 3 moved to worker w2"));
}

static void test_deferred(void **state)
{
    (void)state;
    int status = -1;
    assert_int_equal(call(&echo, "defer", &status, 5000), BW_OK);
    assert_int_equal(status, 7);
}

static void test_deadline(void **state)
{
    (void)state;
    uint64_t t0 = bw__mono_ms();
    assert_int_equal(call(&echo, "defer-long", NULL, 200), BW_TIMEOUT);
    uint64_t took = bw__mono_ms() - t0;
    assert_true(took >= 150 && took < 550);
    assert_non_null(strstr(err, "DEADLINE_EXCEEDED"));
    usleep(700 * 1000); /* let the server finish the abandoned call */
}

static void test_unknown_method(void **state)
{
    (void)state;
    uint64_t t0 = bw__mono_ms();
    assert_int_equal(call(&nobody, "x", NULL, 5000), BW_UNIMPLEMENTED);
    assert_true(bw__mono_ms() - t0 < 2000);
    assert_non_null(strstr(err, "unknown method /batchwire.test.Rpc/Nobody"));
}

static void test_receive_limit(void **state)
{
    (void)state;
    char *big = malloc(100 * 1024);
    memset(big, 'a', 100 * 1024 - 1);
    big[100 * 1024 - 1] = '\0';
    assert_int_equal(call(&echo, big, NULL, 5000), BW_TOO_BIG);
    free(big);
    int status;
    assert_int_equal(call(&echo, "still up", &status, 5000), BW_OK);
}

static int read_stream(const char *spec, int *got, int timeout_ms)
{
    req_t r = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    r.service = (char *)spec;
    bw_rpc_stream *st = NULL;
    int rc = bw__rpc_stream_open(ch, &count, &r.base, timeout_ms, &st, err, sizeof(err));
    assert_int_equal(rc, BW_OK);
    *got = 0;
    for (;;) {
        bw_arena a;
        bw__arena_init(&a, 0);
        ProtobufCMessage *m = NULL;
        rc = bw__rpc_stream_next(st, &a, &m, err, sizeof(err));
        if (rc == BW_OK) {
            assert_int_equal(((resp_t *)m)->status, *got);
            (*got)++;
        }
        bw__arena_reset(&a);
        if (rc != BW_OK)
            break;
    }
    bw__rpc_stream_close(st);
    return rc;
}

static void test_stream(void **state)
{
    (void)state;
    int got;
    assert_int_equal(read_stream("1000", &got, 10000), BW_RPC_STREAM_END);
    assert_int_equal(got, 1000);
    assert_int_equal(read_stream("0", &got, 10000), BW_RPC_STREAM_END);
    assert_int_equal(got, 0);
}

static void test_stream_error_midway(void **state)
{
    (void)state;
    int got;
    assert_int_equal(read_stream("100/37", &got, 10000), BW_CORRUPT);
    assert_int_equal(got, 37);
    assert_non_null(strstr(err, "record 37 is corrupt"));
    assert_int_equal(read_stream("bad", &got, 10000), BW_INVALID_ARGUMENT);
}

static void test_stream_abandoned(void **state)
{
    (void)state;
    pthread_mutex_lock(&mu);
    int before = streams_freed;
    pthread_mutex_unlock(&mu);
    req_t r = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    r.service = "1000000";
    bw_rpc_stream *st = NULL;
    assert_int_equal(bw__rpc_stream_open(ch, &count, &r.base, 10000, &st, err, sizeof(err)), BW_OK);
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *m;
    for (int i = 0; i < 10; i++)
        assert_int_equal(bw__rpc_stream_next(st, &a, &m, err, sizeof(err)), BW_OK);
    bw__arena_reset(&a);
    bw__rpc_stream_close(st); /* cancels */
    /* The server notices and releases the producer's state. */
    int freed = before;
    for (int i = 0; i < 200 && freed == before; i++) {
        usleep(10 * 1000);
        pthread_mutex_lock(&mu);
        freed = streams_freed;
        pthread_mutex_unlock(&mu);
    }
    assert_int_equal(freed, before + 1);
}

static void *hammer(void *arg)
{
    (void)arg;
    req_t r = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    r.service = "abc";
    char e[512];
    for (int i = 0; i < 200; i++) {
        bw_arena a;
        bw__arena_init(&a, 0);
        ProtobufCMessage *resp;
        if (bw__rpc_call(ch, &echo, &r.base, &a, &resp, 5000, e, sizeof(e)) != BW_OK ||
            ((resp_t *)resp)->status != 3)
            return (void *)1;
        bw__arena_reset(&a);
    }
    return NULL;
}

static void test_concurrent_callers(void **state)
{
    (void)state;
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, hammer, NULL);
    for (int i = 0; i < 8; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        assert_null(ret);
    }
}

static void test_unreachable(void **state)
{
    (void)state;
    bw_rpc_channel *c2;
    bw_rpc_channel_opts co;
    memset(&co, 0, sizeof(co));
    co.target = "127.0.0.1:1";
    assert_int_equal(bw__rpc_channel_open(&co, &c2, err, sizeof(err)), BW_OK);
    req_t r = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp;
    assert_int_equal(bw__rpc_call(c2, &echo, &r.base, &a, &resp, 2000, err, sizeof(err)),
                     BW_UNAVAILABLE);
    assert_non_null(strstr(err, "Echo to 127.0.0.1:1: UNAVAILABLE"));
    bw__rpc_channel_close(c2);
}

static void test_tls(void **state)
{
    (void)state;
    char dir[200];
    assert_int_equal(bw_test_dir_make(dir, sizeof(dir), "bw_test_rpc"), 0);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
             "-keyout ca.key -out ca.pem -subj /CN=ca -days 1 && openssl req -newkey ec -pkeyopt "
             "ec_paramgen_curve:P-256 -nodes -keyout s.key -out s.csr -subj /CN=localhost && "
             "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san && openssl x509 -req "
             "-in s.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out s.pem -days 1 -extfile san"
             " >/dev/null 2>&1",
             dir);
    assert_int_equal(system(cmd), 0);
    char cert[256], key[256], ca[256];
    snprintf(cert, sizeof(cert), "%s/s.pem", dir);
    snprintf(key, sizeof(key), "%s/s.key", dir);
    snprintf(ca, sizeof(ca), "%s/ca.pem", dir);

    bw_rpc_server *plain = srv;
    bw_rpc_channel *plain_ch = ch;
    assert_int_equal(start(cert, key), BW_OK);
    bw_rpc_channel_opts co;
    memset(&co, 0, sizeof(co));
    co.target = bound;
    co.tls.ca = ca;
    assert_int_equal(bw__rpc_channel_open(&co, &ch, err, sizeof(err)), BW_OK);
    int status = -1;
    assert_int_equal(call(&echo, "secure", &status, 5000), BW_OK);
    assert_int_equal(status, 6);
    bw__rpc_channel_close(ch);

    /* A plaintext client cannot talk to a TLS server. */
    co.tls.ca = NULL;
    assert_int_equal(bw__rpc_channel_open(&co, &ch, err, sizeof(err)), BW_OK);
    assert_int_equal(call(&echo, "x", NULL, 2000), BW_UNAVAILABLE);
    bw__rpc_channel_close(ch);
    bw__rpc_server_stop(srv, 1000);

    srv = plain;
    ch = plain_ch;
    assert_int_equal(bw_test_dir_remove(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_exact_error_code_and_message),
        cmocka_unit_test(test_deferred),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_unknown_method),
        cmocka_unit_test(test_receive_limit),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_stream_error_midway),
        cmocka_unit_test(test_stream_abandoned),
        cmocka_unit_test(test_concurrent_callers),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_tls),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
