/* Samples' fields: the field table the worker puts in front of a tar sample (built from a
 * record, parsed and stripped by the client) and the client's scan of JSON Lines objects --
 * round trips, and malformed input refused with BW_CORRUPT, never overrun. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../client/lib/batch_int.h"
#include "formats/field_table.h"

/* A tar-like record of fields named names[i] holding datas[i]. */
static void make_record(bw__record *r, const char *key, const char *const *names,
                        const char *const *datas, size_t n)
{
    bw__record_init(r);
    r->has_names = true;
    r->key = 0;
    memcpy(r->text, key, strlen(key) + 1);
    r->textlen = (uint32_t)strlen(key) + 1;
    for (size_t i = 0; i < n; i++) {
        r->names[i] = r->textlen;
        memcpy(r->text + r->textlen, names[i], strlen(names[i]) + 1);
        r->textlen += (uint32_t)strlen(names[i]) + 1;
        r->parts[i].p = (const uint8_t *)datas[i];
        r->parts[i].len = strlen(datas[i]);
        r->size += r->parts[i].len;
    }
    r->nparts = n;
}

/* The record's bytes, as a transport sends them. */
static size_t flatten(const bw__record *r, uint8_t *out)
{
    size_t at = 0;
    for (size_t i = 0; i < r->nparts; i++) {
        memcpy(out + at, r->parts[i].p, r->parts[i].len);
        at += r->parts[i].len;
    }
    assert_int_equal(at, r->size);
    return at;
}

/* A batch of `count` samples laid out one after another in data. */
static void make_batch(bw_batch *b, uint8_t *data, const size_t *sizes, size_t count, uint64_t *idx,
                       size_t *offs, size_t *szs)
{
    memset(b, 0, sizeof(*b));
    b->data = data;
    b->count = count;
    b->indices = idx;
    b->offsets = offs;
    b->sizes = szs;
    size_t at = 0;
    for (size_t i = 0; i < count; i++) {
        idx[i] = 100 + i;
        offs[i] = at;
        szs[i] = sizes[i];
        at += sizes[i];
    }
    b->nbytes = at;
}

static void test_table_round_trip(void **state)
{
    (void)state;
    static const char *const n1[] = {"jpg", "seg.png", "cls"}, *const d1[] = {"JPEG!", "", "7"};
    static const char *const n2[] = {"txt"}, *const d2[] = {"hello world"};
    bw__record r1, r2;
    char err[256];
    make_record(&r1, "a/x", n1, d1, 3);
    make_record(&r2, "a/y", n2, d2, 1);
    assert_int_equal(bw__field_table_prepend(&r1, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__field_table_prepend(&r2, err, sizeof(err)), BW_OK);
    assert_false(r1.has_names);
    assert_int_equal(r1.nparts, 4);
    uint8_t data[512];
    size_t s1 = flatten(&r1, data), s2 = flatten(&r2, data + s1);
    uint64_t idx[2];
    size_t offs[2], szs[2], sizes[2] = {s1, s2};
    bw_batch b;
    make_batch(&b, data, sizes, 2, idx, offs, szs);
    assert_int_equal(bw__batch_split_fields(&b, BW_FIELDS_TABLE), BW_OK);
    /* The tables are gone: the samples are their fields' bytes, packed. */
    assert_int_equal(b.nbytes, strlen("JPEG!7hello world"));
    assert_memory_equal(b.data, "JPEG!7hello world", b.nbytes);
    assert_int_equal(b.offsets[1], 6);
    const bw_field *f;
    size_t n;
    assert_int_equal(bw_batch_fields(&b, 0, &f, &n), BW_OK);
    assert_int_equal(n, 3);
    assert_string_equal(f[0].name, "jpg");
    assert_string_equal(f[1].name, "seg.png");
    assert_string_equal(f[2].name, "cls");
    assert_int_equal(f[0].offset, 0);
    assert_int_equal(f[0].size, 5);
    assert_int_equal(f[1].size, 0);
    assert_int_equal(f[2].offset, 5);
    assert_memory_equal(b.data + b.offsets[0] + f[2].offset, "7", 1);
    assert_int_equal(bw_batch_fields(&b, 1, &f, &n), BW_OK);
    assert_int_equal(n, 1);
    assert_string_equal(f[0].name, "txt");
    assert_int_equal(f[0].size, 11);
    assert_int_equal(bw_batch_fields(&b, 2, &f, &n), BW_OUT_OF_RANGE);
    bw__batch_fields_free(&b);
    assert_int_equal(bw_batch_fields(&b, 0, &f, &n), BW_FAILED_PRECONDITION);
}

static void test_table_refusals(void **state)
{
    (void)state;
    static const char *const names[] = {"a", "bb"}, *const datas[] = {"xyz", "12"};
    bw__record r;
    char err[256];
    make_record(&r, "k", names, datas, 2);
    assert_int_equal(bw__field_table_prepend(&r, err, sizeof(err)), BW_OK);
    uint8_t good[128];
    size_t len = flatten(&r, good);
    bw__field_ref refs[8];
    size_t n, tlen;
    assert_int_equal(bw__field_table_parse(good, len, &tlen, refs, 8, &n, err, sizeof(err)), BW_OK);
    assert_int_equal(n, 2);
    assert_int_equal(tlen, len - 5);
    /* Every truncation is refused, none read past the end. */
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *p = malloc(cut ? cut : 1);
        memcpy(p, good, cut);
        assert_int_equal(bw__field_table_parse(p, cut, &tlen, refs, 8, &n, err, sizeof(err)),
                         BW_CORRUPT);
        free(p);
    }
    uint8_t bad[128];
    memcpy(bad, good, len);
    bad[0] = 'X'; /* magic */
    assert_int_equal(bw__field_table_parse(bad, len, &tlen, refs, 8, &n, err, sizeof(err)),
                     BW_CORRUPT);
    memcpy(bad, good, len);
    bad[8] = 200; /* the first field claims 200 bytes */
    assert_int_equal(bw__field_table_parse(bad, len, &tlen, refs, 8, &n, err, sizeof(err)),
                     BW_CORRUPT);
    memcpy(bad, good, len);
    bad[16] = 0xff; /* a name longer than the sample */
    assert_int_equal(bw__field_table_parse(bad, len, &tlen, refs, 8, &n, err, sizeof(err)),
                     BW_CORRUPT);
    assert_int_equal(bw__field_table_parse(good, len, &tlen, refs, 1, &n, err, sizeof(err)),
                     BW_TOO_BIG);
    /* A batch whose sample has no table fails with the sample named. */
    uint64_t idx[1];
    size_t offs[1], szs[1], sizes[1] = {5};
    bw_batch b;
    make_batch(&b, (uint8_t *)"plain", sizes, 1, idx, offs, szs);
    assert_int_equal(bw__batch_split_fields(&b, BW_FIELDS_TABLE), BW_CORRUPT);
    assert_non_null(strstr(b.err, "sample 100"));
    bw__batch_fields_free(&b);
}

static void check_json(const char *line, size_t nwant, const char *const *keys,
                       const char *const *values)
{
    size_t sizes[1] = {strlen(line)}, offs[1], szs[1];
    uint64_t idx[1];
    bw_batch b;
    make_batch(&b, (uint8_t *)line, sizes, 1, idx, offs, szs);
    assert_int_equal(bw__batch_split_fields(&b, BW_FIELDS_JSON), BW_OK);
    const bw_field *f;
    size_t n;
    assert_int_equal(bw_batch_fields(&b, 0, &f, &n), BW_OK);
    assert_int_equal(n, nwant);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(f[i].name, keys[i]);
        assert_int_equal(f[i].size, strlen(values[i]));
        assert_memory_equal(line + f[i].offset, values[i], f[i].size);
    }
    bw__batch_fields_free(&b);
}

static void test_json_scan(void **state)
{
    (void)state;
    static const char *const k1[] = {"index", "hex"}, *const v1[] = {"7", "\"0a1b\""};
    check_json("{\"index\":7,\"hex\":\"0a1b\"}", 2, k1, v1);
    static const char *const k2[] = {"a", "b\\\"q", "c", "d"};
    static const char *const v2[] = {"{\"x\":[1,{\"y\":\"}\"}],\"z\":null}", "\"s\\\"}\"", "true",
                                     "[ ]"};
    check_json(" { \"a\" : {\"x\":[1,{\"y\":\"}\"}],\"z\":null} , \"b\\\"q\":\"s\\\"}\","
               "\"c\":true,\"d\":[ ] } ",
               4, k2, v2);
    check_json("{}", 0, NULL, NULL);
    static const char *const bad[] = {"[1,2]",        "{\"a\":}",    "{\"a\" 1}", "{\"a\":1,}",
                                      "{\"a\":1",     "{\"a\":\"x}", "\"str\"",   "",
                                      "{\"a\":[1,2}", "{a:1}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t sizes[1] = {strlen(bad[i])}, offs[1], szs[1];
        uint64_t idx[1];
        bw_batch b;
        make_batch(&b, (uint8_t *)bad[i], sizes, 1, idx, offs, szs);
        if (bw__batch_split_fields(&b, BW_FIELDS_JSON) != BW_CORRUPT)
            fail_msg("'%s' was accepted as a JSON object", bad[i]);
        assert_non_null(strstr(b.err, "not a JSON object"));
        bw__batch_fields_free(&b);
    }
}

static void test_kinds(void **state)
{
    (void)state;
    enum bw__fields_kind k;
    char err[256];
    assert_int_equal(bw__fields_kind_of("tar", true, &k, err, sizeof(err)), BW_OK);
    assert_int_equal(k, BW_FIELDS_TABLE);
    assert_int_equal(bw__fields_kind_of("jsonl", true, &k, err, sizeof(err)), BW_OK);
    assert_int_equal(k, BW_FIELDS_JSON);
    assert_int_equal(bw__fields_kind_of("npy", false, &k, err, sizeof(err)), BW_OK);
    assert_int_equal(k, BW_FIELDS_NONE);
    assert_int_equal(bw__fields_kind_of("tfrecord", true, &k, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "tfrecord"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_round_trip),
        cmocka_unit_test(test_table_refusals),
        cmocka_unit_test(test_json_scan),
        cmocka_unit_test(test_kinds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
