/* The data channel's framing (core/rpc/dchan.h) and its socket helpers, over socket pairs
 * and a loopback listener. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/util.h"
#include "rpc/dchan.h"

static void test_request_header(void **state)
{
    (void)state;
    uint8_t h[BW_DCHAN_REQ_HEADER];
    bw__dchan_put_req_header(h, BW_DCHAN_KIND_READ_SAMPLES, 1234567);
    assert_memory_equal(h, "BWD1", 4); /* the magic reads as text on the wire */
    uint32_t kind;
    uint64_t len;
    char err[256];
    assert_int_equal(bw__dchan_get_req_header(h, &kind, &len, err, sizeof(err)), BW_OK);
    assert_int_equal(kind, BW_DCHAN_KIND_READ_SAMPLES);
    assert_int_equal(len, 1234567);

    memcpy(h, "GET ", 4);
    assert_int_equal(bw__dchan_get_req_header(h, &kind, &len, err, sizeof(err)), BW_PROTOCOL);
    assert_non_null(strstr(err, "BWD1"));
    assert_non_null(strstr(err, "47 45 54 20"));

    bw__dchan_put_req_header(h, 7, 10);
    assert_int_equal(bw__dchan_get_req_header(h, &kind, &len, err, sizeof(err)), BW_PROTOCOL);
    assert_non_null(strstr(err, "kind 7"));

    bw__dchan_put_req_header(h, BW_DCHAN_KIND_READ_SAMPLES, (uint64_t)BW_DCHAN_MAX_REQUEST + 1);
    assert_int_equal(bw__dchan_get_req_header(h, &kind, &len, err, sizeof(err)), BW_TOO_BIG);
    bw__dchan_put_req_header(h, BW_DCHAN_KIND_READ_SAMPLES, UINT64_MAX);
    assert_int_equal(bw__dchan_get_req_header(h, &kind, &len, err, sizeof(err)), BW_TOO_BIG);
    bw__dchan_put_req_header(h, BW_DCHAN_KIND_READ_SAMPLES, BW_DCHAN_MAX_REQUEST);
    assert_int_equal(bw__dchan_get_req_header(h, &kind, &len, err, sizeof(err)), BW_OK);
}

static void test_frames_little_endian(void **state)
{
    (void)state;
    bw_dchan_frame f = {BW_DCHAN_ERROR, (uint32_t)(int32_t)BW_WRONG_OWNER, 0x0102030405060708ull,
                        UINT64_MAX};
    uint8_t h[BW_DCHAN_FRAME_HEADER];
    bw__dchan_put_frame(h, &f);
    static const uint8_t want[BW_DCHAN_FRAME_HEADER] = {
        3, 0, 0, 0, 0xed, 0xff, 0xff, 0xff, 8,    7,    6,    5,
        4, 3, 2, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_memory_equal(h, want, sizeof(want));
    bw_dchan_frame g;
    bw__dchan_get_frame(h, &g);
    assert_int_equal(g.type, BW_DCHAN_ERROR);
    assert_int_equal((int32_t)g.code, BW_WRONG_OWNER);
    assert_true(g.a == f.a && g.b == f.b);
}

static void test_split(void **state)
{
    (void)state;
    char host[64], port[8];
    assert_int_equal(bw__sock_split("127.0.0.1:7702", host, sizeof(host), port, sizeof(port)),
                     BW_OK);
    assert_string_equal(host, "127.0.0.1");
    assert_string_equal(port, "7702");
    assert_int_equal(bw__sock_split("[::1]:0", host, sizeof(host), port, sizeof(port)), BW_OK);
    assert_string_equal(host, "::1");
    assert_string_equal(port, "0");
    assert_int_equal(bw__sock_split("w-0.svc:1", host, sizeof(host), port, sizeof(port)), BW_OK);
    assert_string_equal(host, "w-0.svc");
    static const char *bad[] = {"",         "host",   "host:", ":7702",
                                "host:77a", "[::1:7", "[]:7",  "host:123456789"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(bw__sock_split(bad[i], host, sizeof(host), port, sizeof(port)),
                         BW_INVALID_ARGUMENT);
}

typedef struct writer {
    int fd;
    const uint8_t *data;
    size_t len;
    int rc;
} writer;

static void *write_main(void *arg)
{
    writer *w = arg;
    /* Three pieces, the middle one empty: writev_all must skip it and resume partial writes. */
    struct iovec iov[3] = {{(void *)w->data, w->len / 3},
                           {NULL, 0},
                           {(void *)(w->data + w->len / 3), w->len - w->len / 3}};
    char err[128];
    w->rc = bw__sock_writev_all(w->fd, iov, 3, bw__mono_ms() + 10000, err, sizeof(err));
    return NULL;
}

/* Several MiB through a socket pair: more than the socket buffers, so both sides wait. */
static void test_write_and_read_everything(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    size_t len = 6 << 20;
    uint8_t *data = malloc(len), *got = calloc(1, len);
    assert_non_null(data);
    assert_non_null(got);
    for (size_t i = 0; i < len; i++)
        data[i] = (uint8_t)(i * 2654435761u >> 13);
    writer w = {sv[0], data, len, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, write_main, &w), 0);
    char err[128];
    size_t n = 0;
    assert_int_equal(
        bw__sock_read_some(sv[1], got, 10, 100, bw__mono_ms() + 10000, &n, err, sizeof(err)),
        BW_OK);
    assert_true(n >= 10 && n <= 100);
    assert_int_equal(
        bw__sock_read_all(sv[1], got + n, len - n, bw__mono_ms() + 10000, NULL, err, sizeof(err)),
        BW_OK);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, BW_OK);
    assert_memory_equal(got, data, len);
    close(sv[0]);
    close(sv[1]);
    free(data);
    free(got);
}

static void test_peer_closed_and_deadline(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    char err[128], buf[16];
    size_t n = 99;
    /* Nothing arrives: the deadline ends the wait. */
    uint64_t t0 = bw__mono_ms();
    assert_int_equal(bw__sock_read_all(sv[1], buf, 4, t0 + 50, &n, err, sizeof(err)), BW_TIMEOUT);
    assert_true(bw__mono_ms() - t0 >= 45);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err, "deadline"));
    /* Two bytes, then the peer closes: BW_UNAVAILABLE, and the two bytes are counted. */
    assert_int_equal(write(sv[0], "ab", 2), 2);
    close(sv[0]);
    assert_int_equal(bw__sock_read_all(sv[1], buf, 4, bw__mono_ms() + 5000, &n, err, sizeof(err)),
                     BW_UNAVAILABLE);
    assert_int_equal(n, 2);
    assert_memory_equal(buf, "ab", 2);
    assert_non_null(strstr(err, "closed"));
    /* Writing to a closed peer fails without SIGPIPE. */
    struct iovec iov = {buf, sizeof(buf)};
    assert_int_equal(bw__sock_writev_all(sv[1], &iov, 1, bw__mono_ms() + 5000, err, sizeof(err)),
                     BW_UNAVAILABLE);
    close(sv[1]);
}

/* A reader that never reads: the writer gives up at its deadline. */
static void test_write_deadline(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    size_t len = 16 << 20;
    uint8_t *data = calloc(1, len);
    assert_non_null(data);
    struct iovec iov = {data, len};
    char err[128];
    assert_int_equal(bw__sock_writev_all(sv[0], &iov, 1, bw__mono_ms() + 100, err, sizeof(err)),
                     BW_TIMEOUT);
    close(sv[0]);
    close(sv[1]);
    free(data);
}

static void test_listen_and_connect(void **state)
{
    (void)state;
    int lfd = -1, port = 0, cfd = -1;
    char err[256], addr[64];
    assert_int_equal(bw__sock_listen("127.0.0.1:0", &lfd, &port, err, sizeof(err)), BW_OK);
    assert_true(port > 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    assert_int_equal(bw__sock_connect(addr, 2000, &cfd, err, sizeof(err)), BW_OK);
    int afd = accept(lfd, NULL, NULL);
    assert_true(afd >= 0);
    assert_int_equal(write(cfd, "x", 1), 1);
    char c = 0;
    assert_int_equal(read(afd, &c, 1), 1);
    assert_int_equal(c, 'x');
    close(afd);
    close(cfd);
    close(lfd);
    /* Nobody listens there any more: refused, with the address in the message. */
    assert_int_equal(bw__sock_connect(addr, 2000, &cfd, err, sizeof(err)), BW_UNAVAILABLE);
    assert_non_null(strstr(err, addr));
    assert_int_equal(bw__sock_connect("no-port", 2000, &cfd, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_int_equal(bw__sock_listen("127.0.0.1:x", &lfd, &port, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_header),
        cmocka_unit_test(test_frames_little_endian),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_write_and_read_everything),
        cmocka_unit_test(test_peer_closed_and_deadline),
        cmocka_unit_test(test_write_deadline),
        cmocka_unit_test(test_listen_and_connect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
