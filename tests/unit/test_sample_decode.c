/* The client's SampleBatch decoder: messages split into slices at every possible point decode
 * to the same samples as protobuf-c; malformed messages are refused, never overrun. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "../../client/lib/sample_decode.h"
#include "batchwire/batchwire.h"
#include "data.pb-c.h"

typedef struct got {
    uint64_t index[8], size[8], chunk[8], len[8];
    uint8_t buf[8][64];
    int n;
    int fail_at; /* place() fails for this sample */
} got;

static int collect(void *ctx, uint64_t index, uint64_t size, uint64_t chunk_offset, uint64_t len,
                   uint8_t **dest, char *err, size_t errlen)
{
    got *g = ctx;
    if (g->n == g->fail_at) {
        snprintf(err, errlen, "refused sample %llu", (unsigned long long)index);
        return BW_PROTOCOL;
    }
    assert_true(g->n < 8 && len <= 64);
    g->index[g->n] = index;
    g->size[g->n] = size;
    g->chunk[g->n] = chunk_offset;
    g->len[g->n] = len;
    *dest = g->buf[g->n++];
    return BW_OK;
}

/* A SampleBatch of three samples packed by protobuf-c. */
static size_t packed(uint8_t *out)
{
    Batchwire__V1__Sample s[3];
    Batchwire__V1__Sample *ps[3];
    static const char *const data[3] = {"hello", "", "a longer sample, 31 bytes long."};
    for (int i = 0; i < 3; i++) {
        batchwire__v1__sample__init(&s[i]);
        s[i].index = (uint64_t)i * 1000;
        s[i].size = strlen(data[i]) + (i == 2 ? 5 : 0);
        s[i].chunk_offset = i == 2 ? 5 : 0;
        s[i].data.data = (uint8_t *)data[i];
        s[i].data.len = strlen(data[i]);
        s[i].key = i == 1 ? "key-with-text" : "";
        s[i].next_offset = 77;
        ps[i] = &s[i];
    }
    Batchwire__V1__SampleBatch b = BATCHWIRE__V1__SAMPLE_BATCH__INIT;
    b.n_samples = 3;
    b.samples = ps;
    return protobuf_c_message_pack(&b.base, out);
}

/* The message as a byte buffer of slices cut at the given points. */
static grpc_byte_buffer *sliced(const uint8_t *msg, size_t len, const size_t *cuts, size_t ncuts)
{
    grpc_slice slices[16];
    size_t prev = 0, n = 0;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : len;
        slices[n++] = grpc_slice_from_copied_buffer((const char *)msg + prev, end - prev);
        prev = end;
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, n);
    for (size_t i = 0; i < n; i++)
        grpc_slice_unref(slices[i]);
    return bb;
}

static void check_three(const got *g)
{
    assert_int_equal(g->n, 3);
    assert_int_equal(g->index[0], 0);
    assert_int_equal(g->len[0], 5);
    assert_memory_equal(g->buf[0], "hello", 5);
    assert_int_equal(g->index[1], 1000);
    assert_int_equal(g->len[1], 0);
    assert_int_equal(g->index[2], 2000);
    assert_int_equal(g->chunk[2], 5);
    assert_int_equal(g->size[2], 36);
    assert_memory_equal(g->buf[2], "a longer sample, 31 bytes long.", 31);
}

static void test_every_split(void **state)
{
    (void)state;
    uint8_t msg[512];
    size_t len = packed(msg);
    char err[256];
    for (size_t a = 0; a <= len; a++) {
        for (size_t b = a; b <= len; b += 7) {
            size_t cuts[2] = {a, b};
            grpc_byte_buffer *bb = sliced(msg, len, cuts, 2);
            got g;
            memset(&g, 0, sizeof(g));
            g.fail_at = -1;
            err[0] = '\0';
            assert_int_equal(
                bw__decode_sample_batch(bb, collect, NULL, &g, &(bw__decoded){0}, err, sizeof(err)),
                BW_OK);
            check_three(&g);
            grpc_byte_buffer_destroy(bb);
        }
    }
}

static void test_truncated_and_garbage(void **state)
{
    (void)state;
    uint8_t msg[512];
    size_t len = packed(msg);
    char err[256];
    /* Every truncation that cuts a field refuses; none reads past the end. */
    int refused = 0;
    for (size_t cut = 1; cut < len; cut++) {
        grpc_byte_buffer *bb = sliced(msg, cut, NULL, 0);
        got g;
        memset(&g, 0, sizeof(g));
        g.fail_at = -1;
        err[0] = '\0';
        int rc =
            bw__decode_sample_batch(bb, collect, NULL, &g, &(bw__decoded){0}, err, sizeof(err));
        if (rc != BW_OK) {
            assert_int_equal(rc, BW_PROTOCOL);
            assert_non_null(strstr(err, "malformed SampleBatch"));
            refused++;
        }
        grpc_byte_buffer_destroy(bb);
    }
    assert_true(refused > 0);
    /* An endless varint. */
    uint8_t bad[12];
    memset(bad, 0xff, sizeof(bad));
    grpc_byte_buffer *bb = sliced(bad, sizeof(bad), NULL, 0);
    got g;
    memset(&g, 0, sizeof(g));
    g.fail_at = -1;
    assert_int_equal(
        bw__decode_sample_batch(bb, collect, NULL, &g, &(bw__decoded){0}, err, sizeof(err)),
        BW_PROTOCOL);
    grpc_byte_buffer_destroy(bb);
    /* A data length beyond its sample. */
    const uint8_t over[] = {0x0a, 0x04, 0x22, 0x7f, 'a', 'b'};
    bb = sliced(over, sizeof(over), NULL, 0);
    assert_int_equal(
        bw__decode_sample_batch(bb, collect, NULL, &g, &(bw__decoded){0}, err, sizeof(err)),
        BW_PROTOCOL);
    grpc_byte_buffer_destroy(bb);
    /* A header field after the data (the bytes were already placed). */
    const uint8_t late[] = {0x0a, 0x05, 0x22, 0x01, 'x', 0x08, 0x03};
    bb = sliced(late, sizeof(late), NULL, 0);
    assert_int_equal(
        bw__decode_sample_batch(bb, collect, NULL, &g, &(bw__decoded){0}, err, sizeof(err)),
        BW_PROTOCOL);
    grpc_byte_buffer_destroy(bb);
}

static void test_placer_refusal_stops(void **state)
{
    (void)state;
    uint8_t msg[512];
    size_t len = packed(msg);
    char err[256];
    grpc_byte_buffer *bb = sliced(msg, len, NULL, 0);
    got g;
    memset(&g, 0, sizeof(g));
    g.fail_at = 1;
    assert_int_equal(
        bw__decode_sample_batch(bb, collect, NULL, &g, &(bw__decoded){0}, err, sizeof(err)),
        BW_PROTOCOL);
    assert_string_equal(err, "refused sample 1000");
    assert_int_equal(g.n, 1);
    grpc_byte_buffer_destroy(bb);
}

/* A locate-only ReadStream's answer over gRPC: one empty sample carrying the record's offset.
 * It is the wire's way of saying the offset, not a sample: nothing is placed, and the offset is
 * learned. Without locate_only the same message is an empty sample like any other. */
static void test_locate_only_answer(void **state)
{
    (void)state;
    Batchwire__V1__Sample s = BATCHWIRE__V1__SAMPLE__INIT;
    Batchwire__V1__Sample *ps[1] = {&s};
    s.index = 42;
    s.next_offset = 4096;
    Batchwire__V1__SampleBatch b = BATCHWIRE__V1__SAMPLE_BATCH__INIT;
    b.n_samples = 1;
    b.samples = ps;
    uint8_t msg[64];
    size_t len = protobuf_c_message_pack(&b.base, msg);
    char err[256] = "";
    for (int locate = 0; locate <= 1; locate++) {
        grpc_byte_buffer *bb = sliced(msg, len, NULL, 0);
        got g;
        memset(&g, 0, sizeof(g));
        g.fail_at = -1;
        bw__decoded last = {.locate_only = locate};
        assert_int_equal(bw__decode_sample_batch(bb, collect, NULL, &g, &last, err, sizeof(err)),
                         BW_OK);
        assert_int_equal(g.n, locate ? 0 : 1);
        assert_true(last.has_next_offset);
        assert_int_equal(last.next_offset, 4096);
        grpc_byte_buffer_destroy(bb);
    }
}

int main(void)
{
    grpc_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_split),
        cmocka_unit_test(test_truncated_and_garbage),
        cmocka_unit_test(test_placer_refusal_stops),
        cmocka_unit_test(test_locate_only_answer),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    grpc_shutdown();
    return rc;
}
