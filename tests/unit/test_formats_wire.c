/* The worker's hand-built SampleBatch messages, decoded by protobuf-c: every message stays
 * under the limit, samples larger than it arrive in chunks that reassemble, tar fields and
 * stream offsets are encoded, and payloads are the generator's bytes; and the dataset cache's
 * canonical keys and open-files budget. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>

#include "test_dir.h"
#include "worker/data.h"
#include "worker/metrics.h"
#include "worker/read_path.h"
#include "common/crc32c.h"
#include "formats/synth.h"

static char root[512];
static char err[1024];

typedef struct got {
    size_t messages, max_message, samples, max_chunks;
} got;

/* Drains a stream, checking each message; sample k must be synth(expect_index(k), size). */
static void drain(bw__sstream *st, size_t limit, const uint64_t *indices, size_t n, got *g,
                  bool tar)
{
    memset(g, 0, sizeof(*g));
    uint8_t *buf = NULL;
    uint64_t have = 0, cur_size = 0, cur_index = UINT64_MAX;
    size_t k = 0, chunks = 0;
    for (;;) {
        grpc_byte_buffer *bb = NULL;
        int rc = bw__sstream_produce(st, &bb, err, sizeof(err));
        if (rc == BW_RPC_END)
            break;
        if (rc != BW_OK)
            fail_msg("produce: %s", err);
        grpc_byte_buffer_reader rd;
        assert_true(grpc_byte_buffer_reader_init(&rd, bb));
        grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
        grpc_byte_buffer_destroy(bb);
        size_t len = GRPC_SLICE_LENGTH(all);
        assert_true(len <= limit);
        g->messages++;
        if (len > g->max_message)
            g->max_message = len;
        Batchwire__V1__SampleBatch *b =
            batchwire__v1__sample_batch__unpack(NULL, len, GRPC_SLICE_START_PTR(all));
        grpc_slice_unref(all);
        assert_non_null(b);
        assert_true(b->n_samples > 0);
        for (size_t i = 0; i < b->n_samples; i++) {
            const Batchwire__V1__Sample *s = b->samples[i];
            if (s->chunk_offset == 0) {
                assert_true(k < n);
                cur_index = s->index;
                assert_int_equal(cur_index, indices[k]);
                cur_size = s->size;
                free(buf);
                buf = malloc(cur_size + 1);
                have = 0;
                chunks = 0;
                if (tar) {
                    assert_int_equal(s->n_fields, 2);
                    assert_string_equal(s->fields[0]->name, "bin");
                    assert_string_equal(s->fields[1]->name, "json");
                    assert_int_equal(s->fields[0]->size + s->fields[1]->size, s->size);
                }
            } else {
                assert_int_equal(s->index, cur_index);
                assert_int_equal(s->chunk_offset, have);
                assert_int_equal(s->n_fields, 0);
            }
            assert_true(have + s->data.len <= cur_size);
            memcpy(buf + have, s->data.data, s->data.len);
            have += s->data.len;
            chunks++;
            if (chunks > g->max_chunks)
                g->max_chunks = chunks;
            if (have == cur_size) {
                uint64_t want_len = bw__synth_len(cur_index, 1000, 300000);
                uint8_t *want = malloc(want_len + 1);
                bw__synth_fill(cur_index, want, want_len);
                assert_true(cur_size >= want_len);
                assert_memory_equal(buf, want, want_len);
                free(want);
                k++;
                g->samples++;
            }
        }
        batchwire__v1__sample_batch__free_unpacked(b, NULL);
    }
    free(buf);
    assert_int_equal(k, n);
}

static void write_tfrecords(const char *rel, uint64_t first, uint64_t count)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (uint64_t i = first; i < first + count; i++) {
        uint64_t len = bw__synth_len(i, 1000, 300000);
        uint8_t *d = malloc(len);
        bw__synth_fill(i, d, len);
        uint8_t h[12];
        for (int b = 0; b < 8; b++)
            h[b] = (uint8_t)(len >> (8 * b));
        uint32_t c = bw__crc32c_mask(bw__crc32c(0, h, 8));
        memcpy(h + 8, &c, 4);
        fwrite(h, 1, 12, f);
        fwrite(d, 1, len, f);
        c = bw__crc32c_mask(bw__crc32c(0, d, len));
        fwrite(&c, 1, 4, f);
        free(d);
    }
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    grpc_init();
    assert_int_equal(bw_test_dir_make(root, sizeof(root), "wire"), 0);
    write_tfrecords("a.tfrecord", 0, 20);
    write_tfrecords("b.tfrecord", 20, 7);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (bw_test_dir_remove(root) != 0)
        return -1;
    grpc_shutdown();
    return 0;
}

static Batchwire__V1__Dataset spec(const char *format, char **sources, size_t n)
{
    Batchwire__V1__Dataset d = BATCHWIRE__V1__DATASET__INIT;
    d.format = (char *)format;
    d.sources = sources;
    d.n_sources = n;
    return d;
}

static void test_samples_chunked(void **state)
{
    (void)state;
    bw__ds_cache *c = bw__ds_cache_new(root);
    char *srcs[] = {"*.tfrecord"};
    Batchwire__V1__Dataset d = spec("tfrecord", srcs, 1);
    bw__wds *e = NULL;
    assert_int_equal(bw__ds_get(c, &d, &e, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__dataset_index(bw__ds_dataset(e), err, sizeof(err)), BW_OK);
    assert_int_equal(bw__ds_dataset(e)->length, 27);
    uint64_t idx[60];
    for (int i = 0; i < 60; i++)
        idx[i] = (uint64_t)((i * 7) % 27);
    size_t limits[] = {65536, 1 << 20, 16 << 20};
    for (size_t l = 0; l < 3; l++) {
        bw__wds *e2 = NULL;
        assert_int_equal(bw__ds_get(c, &d, &e2, err, sizeof(err)), BW_OK);
        assert_ptr_equal(e2, e); /* cached */
        bw__sstream *st = bw__sstream_samples(e2, idx, 60, limits[l], NULL);
        got g;
        drain(st, limits[l], idx, 60, &g, false);
        bw__sstream_free(st);
        if (l == 0)
            assert_true(g.max_chunks >= 4);
        if (l == 2)
            assert_true(g.max_message <= (2u << 20) + 64); /* closed at the ~1 MiB target */
    }
    bw__ds_put(e);
    bw__ds_cache_free(c);
}

static void test_stream_records(void **state)
{
    (void)state;
    bw__ds_cache *c = bw__ds_cache_new(root);
    char *srcs[] = {"b.tfrecord"};
    Batchwire__V1__Dataset d = spec("tfrecord", srcs, 1);
    bw__wds *e = NULL;
    assert_int_equal(bw__ds_get(c, &d, &e, err, sizeof(err)), BW_OK);
    bw__sstream *st = bw__sstream_records(e, 0, 0, 0, 0, 100000, NULL);
    /* every record once, with offsets that chain */
    size_t total = 0;
    for (;;) {
        grpc_byte_buffer *bb = NULL;
        int rc = bw__sstream_produce(st, &bb, err, sizeof(err));
        if (rc == BW_RPC_END)
            break;
        assert_int_equal(rc, BW_OK);
        grpc_byte_buffer_reader rd;
        grpc_byte_buffer_reader_init(&rd, bb);
        grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
        grpc_byte_buffer_destroy(bb);
        Batchwire__V1__SampleBatch *b = batchwire__v1__sample_batch__unpack(
            NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
        grpc_slice_unref(all);
        assert_non_null(b);
        for (size_t i = 0; i < b->n_samples; i++)
            if (b->samples[i]->chunk_offset == 0) {
                const Batchwire__V1__Sample *s = b->samples[i];
                assert_true(s->next_offset == s->offset + 16 + s->size);
                total++;
            }
        batchwire__v1__sample_batch__free_unpacked(b, NULL);
    }
    assert_int_equal(total, 7);
    bw__sstream_free(st); /* puts e */
    bw__ds_cache_free(c);
}

static void test_corrupt_midway(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof(path), "%s/c.tfrecord", root);
    write_tfrecords("c.tfrecord", 0, 3);
    FILE *f = fopen(path, "r+b");
    uint64_t len0 = bw__synth_len(0, 1000, 300000);
    fseek(f, (long)(16 + len0 + 12 + 5), SEEK_SET); /* a payload byte of record 1 */
    fputc(0xAA, f);
    fclose(f);
    bw__ds_cache *c = bw__ds_cache_new(root);
    char *srcs[] = {"c.tfrecord"};
    Batchwire__V1__Dataset d = spec("tfrecord", srcs, 1);
    bw__wds *e = NULL;
    assert_int_equal(bw__ds_get(c, &d, &e, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__dataset_index(bw__ds_dataset(e), err, sizeof(err)), BW_OK);
    uint64_t idx[] = {0, 1, 2};
    bw__sstream *st = bw__sstream_samples(e, idx, 3, 16 << 20, NULL);
    grpc_byte_buffer *bb = NULL;
    /* sample 0 goes out first; then the error names the file and record 1's offset */
    assert_int_equal(bw__sstream_produce(st, &bb, err, sizeof(err)), BW_OK);
    grpc_byte_buffer_destroy(bb);
    assert_int_equal(bw__sstream_produce(st, &bb, err, sizeof(err)), BW_CORRUPT);
    char want[128];
    snprintf(want, sizeof(want), "c.tfrecord: offset %llu: data CRC mismatch", 16ULL + len0);
    assert_non_null(strstr(err, want));
    bw__sstream_free(st);
    bw__ds_cache_free(c);
}

/* The dataset cache (worker/datasets.c): one entry however a path is spelled, and the
 * open-files budget -- idle datasets are closed to make room, one in use is not (BW_BUSY), a
 * dataset over the whole budget is BW_TOO_BIG naming the flag. */
static void test_cache_budgets(void **state)
{
    (void)state;
    bw__ds_cache *c = bw__ds_cache_new(root);
    bw__ds_limits lim = {.max_open_files = 2};
    bw__ds_cache_set_limits(c, &lim);
    char *a[] = {"a.tfrecord"}, *dot[] = {"./a.tfrecord"}, *glob[] = {"[ab].tfrecord"};
    char *three[] = {"a.tfrecord", "a.tfrecord", "a.tfrecord"};
    Batchwire__V1__Dataset da = spec("tfrecord", a, 1), ddot = spec("tfrecord", dot, 1);
    Batchwire__V1__Dataset dglob = spec("tfrecord", glob, 1), d3 = spec("tfrecord", three, 3);
    bw__wds *e = NULL, *e2 = NULL;
    assert_int_equal(bw__ds_get(c, &da, &e, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__ds_get(c, &ddot, &e2, err, sizeof(err)), BW_OK);
    assert_ptr_equal(e2, e); /* "./a.tfrecord" is "a.tfrecord" */
    assert_false(bw__ds_ready(c, &dglob));
    bw__ds_put(e2);
    /* a.tfrecord and b.tfrecord need 2 files; a.tfrecord's dataset holds 1 and is in use */
    assert_int_equal(bw__ds_get(c, &dglob, &e2, err, sizeof(err)), BW_BUSY);
    assert_non_null(strstr(err, "--max-open-files"));
    bw__ds_put(e); /* now idle: closed to make room */
    assert_int_equal(bw__ds_get(c, &dglob, &e2, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__ds_dataset(e2)->nsources, 2);
    assert_false(bw__ds_ready(c, &da));
    bw__ds_put(e2);
    assert_int_equal(bw__ds_get(c, &d3, &e, err, sizeof(err)), BW_TOO_BIG);
    assert_non_null(strstr(err, "alone needs more open files than the worker's budget of 2"));
    bw__ds_cache_free(c);
}

/* ---- spans (bw__rp_next_span) ---- */

enum { ROW = 48 };

static uint8_t row_byte(uint64_t i, size_t j)
{
    return (uint8_t)(i * 7 + j * 13 + (i >> 8));
}

/* An .npy file of `rows` uint8 rows of ROW bytes: dataset rows first, first + 1, ... */
static void write_rows(const char *rel, uint64_t first, uint64_t rows)
{
    char path[1024], dict[128];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    int dl = snprintf(dict, sizeof(dict),
                      "{'descr': '|u1', 'fortran_order': False, 'shape': (%llu, %d), }",
                      (unsigned long long)rows, ROW);
    size_t hl = 10 + (size_t)dl + 1, pad = (64 - hl % 64) % 64;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t h[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    h[8] = (uint8_t)((size_t)dl + pad + 1);
    h[9] = (uint8_t)(((size_t)dl + pad + 1) >> 8);
    assert_int_equal(fwrite(h, 1, 10, f), 10);
    assert_int_equal(fwrite(dict, 1, (size_t)dl, f), (size_t)dl);
    for (size_t k = 0; k < pad; k++)
        fputc(' ', f);
    fputc('\n', f);
    for (uint64_t i = first; i < first + rows; i++)
        for (size_t j = 0; j < ROW; j++)
            fputc(row_byte(i, j), f);
    assert_int_equal(fclose(f), 0);
}

/* Overwrites the last byte of `rel` in place (same size), on a later clock tick than its
 * opening, so its change time moves. */
static void touch_in_place(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -1, SEEK_END), 0);
    fputc(0x5a, f);
    assert_int_equal(fclose(f), 0);
}

/* How read_all takes a read's samples: gathers of at most `gather` samples under `below` bytes
 * first (0: none), as the data channel does, then spans of at most `max` samples and
 * `max_bytes` (0: none), then bw__rp_next. What it saw: the most a span and a gather held. */
typedef struct reading {
    size_t gather;
    uint64_t below;
    size_t max;
    uint64_t max_bytes;
    size_t widest, widest_gather, gathers;
} reading;

/* Checks a gather of g->n samples at p[] against idx[*pos ..]: the keys due, their bytes, one
 * file, and no `streak` of neighbours in the file (those are left to spans). */
static void check_gather(const uint64_t *idx, size_t n, size_t *pos, const bw__rp_gather *g,
                         const uint8_t *const *p, size_t streak)
{
    assert_int_equal(g->size, ROW);
    assert_int_equal(g->first, idx[*pos]);
    size_t run = 0;
    for (size_t k = 0; k < g->n; k++) {
        assert_true(*pos < n);
        uint64_t i = idx[*pos];
        assert_true((i < 100) == (g->first < 100)); /* one file's rows (s0.npy: 0-99) */
        for (size_t j = 0; j < ROW; j++)
            assert_int_equal(p[k][j], row_byte(i, j));
        run = k && p[k] == p[k - 1] + ROW ? run + 1 : 1;
        assert_true(run < streak);
        (*pos)++;
    }
}

/* One read of idx, taken as `how` says (reading). Checks every sample's key and bytes and every
 * span's and gather's form; returns the samples served before the read ended (*rc: BW_RP_END
 * or the error). */
static size_t read_with(bw__wds *e, const uint64_t *idx, size_t n, reading *how, bw__data_stats *st,
                        int *rc)
{
    bw__rp *rp = bw__rp_samples(e, idx, n, st);
    assert_non_null(rp);
    size_t pos = 0, max = how->max;
    uint64_t max_bytes = how->max_bytes;
    const uint8_t *gp[64];
    assert_true(how->gather <= 64);
    how->widest = how->widest_gather = how->gathers = 0;
    for (;;) {
        if (how->gather) {
            bw__rp_gather g = {0};
            *rc =
                bw__rp_next_gather(rp, how->gather, 1 << 20, how->below, gp, &g, err, sizeof(err));
            if (*rc != BW_OK)
                break;
            if (g.n) {
                assert_true(g.n <= how->gather);
                check_gather(idx, n, &pos, &g, gp, (size_t)((how->below + ROW - 1) / ROW));
                how->widest_gather = g.n > how->widest_gather ? g.n : how->widest_gather;
                how->gathers++;
                continue;
            }
        }
        bw__rp_span sp = {0};
        if (max) {
            *rc = bw__rp_next_span(rp, max, max_bytes, &sp, err, sizeof(err));
            if (*rc != BW_OK)
                break;
        }
        if (sp.n) {
            assert_true(sp.n <= max && (sp.n == 1 || sp.n * sp.size <= max_bytes));
            assert_int_equal(sp.size, ROW);
            /* one file's rows: never across s0.npy (rows 0-99) and s1.npy (100-199) */
            assert_true(sp.first >= 100 || sp.first + sp.n <= 100);
            for (size_t k = 0; k < sp.n; k++) {
                assert_true(pos < n);
                assert_int_equal(idx[pos], sp.first + k);
                for (size_t j = 0; j < ROW; j++)
                    assert_int_equal(sp.p[k * ROW + j], row_byte(sp.first + k, j));
                pos++;
            }
            how->widest = sp.n > how->widest ? sp.n : how->widest;
            continue;
        }
        bw__rp_rec r;
        *rc = bw__rp_next(rp, &r, err, sizeof(err));
        if (*rc != BW_OK)
            break;
        assert_true(pos < n);
        assert_int_equal(r.key, idx[pos]);
        assert_int_equal(r.rec.size, ROW);
        for (size_t j = 0; j < ROW; j++)
            assert_int_equal(r.rec.parts[0].p[j], row_byte(r.key, j));
        bw__record_release(&r.rec);
        pos++;
    }
    assert_int_equal(bw__rp_count(rp), pos);
    bw__rp_close(rp);
    return pos;
}

/* read_with spans alone (max 0: bw__rp_next alone); *widest: the most a span held. */
static size_t read_all(bw__wds *e, const uint64_t *idx, size_t n, size_t max, uint64_t max_bytes,
                       bw__data_stats *st, int *rc, size_t *widest)
{
    reading how = {0, 0, max, max_bytes, 0, 0, 0};
    size_t served = read_with(e, idx, n, &how, st, rc);
    *widest = how.widest;
    return served;
}

/* ---- the file checks of spans and gathers ---- */

/* Dataset d from cache c, indexed: a reference the caller puts (or a read opened on it closes). */
static bw__wds *opened(bw__ds_cache *c, const Batchwire__V1__Dataset *d)
{
    bw__wds *e = NULL;
    assert_int_equal(bw__ds_get(c, d, &e, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__dataset_index(bw__ds_dataset(e), err, sizeof(err)), BW_OK);
    return e;
}

/* Files P0.npy (rows 0-99) and P1.npy (rows 100-199). */
static void write_pair(const char *prefix)
{
    char name[32];
    snprintf(name, sizeof(name), "%s0.npy", prefix);
    write_rows(name, 0, 100);
    snprintf(name, sizeof(name), "%s1.npy", prefix);
    write_rows(name, 100, 100);
}

/* The read's next samples as a span or a gather of at most `max` (at most 8): how many (0 where
 * there is none), *rc the call's result. */
typedef size_t (*take_fn)(bw__rp *rp, size_t max, int *rc);

static size_t take_span(bw__rp *rp, size_t max, int *rc)
{
    bw__rp_span sp = {0};
    *rc = bw__rp_next_span(rp, max, 1 << 20, &sp, err, sizeof(err));
    return sp.n;
}

static size_t take_gather(bw__rp *rp, size_t max, int *rc)
{
    const uint8_t *gp[8];
    bw__rp_gather g = {0};
    assert_true(max <= 8);
    *rc = bw__rp_next_gather(rp, max, 1 << 20, 4 * ROW, gp, &g, err, sizeof(err));
    return g.n;
}

/* The read's samples, taken `max` at a time until none is left or a call fails: how many were
 * taken after the first call (which must take `max`), and that call's result. `between` runs
 * once, after the first call. */
static size_t take_all(take_fn take, bw__rp *rp, size_t max, void (*between)(const char *),
                       const char *arg, int *rc)
{
    assert_int_equal(take(rp, max, rc), max);
    assert_int_equal(*rc, BW_OK);
    between(arg);
    size_t served = max, k;
    while ((k = take(rp, max, rc)) > 0 && *rc == BW_OK)
        served += k;
    return served;
}

/* Spans and gathers (take) check the files as bw__rp_next does: the first record of a file
 * before its bytes are handed on, again once 64 records and 256 KiB have been read from it,
 * and every file served from at the end. Over files P0.npy (rows 0-99) and P1.npy (100-199),
 * and Pbig.npy, every `step`-th row (1: spans, neighbours; 2: gathers, none). */
static void files_checked(take_fn take, const char *prefix, uint64_t step)
{
    char f0[32], f1[32], fbig[32], glob[32], want[64];
    snprintf(f0, sizeof(f0), "%s0.npy", prefix);
    snprintf(f1, sizeof(f1), "%s1.npy", prefix);
    snprintf(fbig, sizeof(fbig), "%sbig.npy", prefix);
    snprintf(glob, sizeof(glob), "%s[01].npy", prefix);
    write_pair(prefix);
    bw__ds_cache *c = bw__ds_cache_new(root);
    char *srcs[] = {glob};
    Batchwire__V1__Dataset d = spec("npy", srcs, 1);
    bw__wds *e = NULL;
    int rc;

    /* P0 changed after the read's first span or gather of it: the read may go on (the next
     * check is CHECK_EVERY records later) but cannot end well */
    uint64_t first[20];
    for (uint64_t i = 0; i < 20; i++)
        first[i] = i * step;
    e = opened(c, &d);
    bw__rp *rp = bw__rp_samples(e, first, 20, NULL);
    assert_int_equal(take_all(take, rp, 4, touch_in_place, f0, &rc), 20);
    assert_int_equal(rc, BW_OK);
    bw__rp_rec r;
    assert_int_equal(bw__rp_next(rp, &r, err, sizeof(err)), BW_FAILED_PRECONDITION);
    snprintf(want, sizeof(want), "%s changed on disk", f0);
    assert_non_null(strstr(err, want));
    bw__rp_close(rp); /* and with it the dataset it was opened on */

    /* a file changed before the read's first record of it: refused before any byte of it
     * (the dataset opened before the change, as a read that began before it holds it) */
    e = opened(c, &d);
    touch_in_place(f1);
    uint64_t late[] = {100, 100 + step};
    rp = bw__rp_samples(e, late, 2, NULL);
    assert_int_equal(take(rp, 8, &rc), 0);
    assert_int_equal(rc, BW_FAILED_PRECONDITION);
    snprintf(want, sizeof(want), "%s changed on disk", f1);
    assert_non_null(strstr(err, want));
    bw__rp_close(rp); /* and with it the dataset it was opened on */
    bw__ds_cache_free(c);

    /* ... and once 64 records and 256 KiB have been read from a file since its last check, a
     * span or gather checks it again: rows of 48 bytes, 8 at a time, the first 8 checked --
     * the call that brings the count past 256 KiB is refused, none before it */
    enum { BIG = 6000 };
    write_rows(fbig, 0, BIG * step);
    char *big[] = {fbig};
    d = spec("npy", big, 1);
    c = bw__ds_cache_new(root);
    e = opened(c, &d);
    uint64_t *all = malloc(BIG * sizeof(*all));
    assert_non_null(all);
    for (uint64_t i = 0; i < BIG; i++)
        all[i] = i * step;
    rp = bw__rp_samples(e, all, BIG, NULL);
    size_t served = take_all(take, rp, 8, touch_in_place, fbig, &rc);
    assert_int_equal(rc, BW_FAILED_PRECONDITION);
    size_t rows_due = ((256u << 10) + ROW - 1) / ROW; /* 5462 rows after the first 8 */
    assert_int_equal(served, 8 + ((rows_due + 7) / 8 - 1) * 8);
    snprintf(want, sizeof(want), "%s changed on disk", fbig);
    assert_non_null(strstr(err, want));
    bw__rp_close(rp);
    free(all);
    bw__ds_cache_free(c);
}

/* Spans serve what bw__rp_next serves, counted alike, and check the files as it does: the
 * first record of a file before its bytes are handed on, again once 64 records and 256 KiB have
 * been read from it, and every file served from at the end. */
static void test_spans(void **state)
{
    (void)state;
    write_pair("s");
    bw__ds_cache *c = bw__ds_cache_new(root);
    char *srcs[] = {"s*.npy"};
    Batchwire__V1__Dataset d = spec("npy", srcs, 1);
    bw__wds *e = opened(c, &d);
    assert_int_equal(bw__ds_dataset(e)->length, 200);

    /* runs, gaps, a file boundary inside a run, repeats, backwards */
    uint64_t idx[128];
    size_t n = 0;
    for (uint64_t i = 0; i < 10; i++)
        idx[n++] = i;
    uint64_t more[] = {50, 52, 53, 54, 98, 99, 100, 101, 3, 4, 4, 199, 0};
    for (size_t k = 0; k < sizeof(more) / sizeof(*more); k++)
        idx[n++] = more[k];
    for (uint64_t i = 150; i < 200; i++)
        idx[n++] = i;
    bw__data_stats a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    int rc;
    size_t widest;
    bw__wds *e2 = NULL;
    assert_int_equal(bw__ds_get(c, &d, &e2, err, sizeof(err)), BW_OK);
    assert_int_equal(read_all(e2, idx, n, 0, 0, &b, &rc, &widest), n);
    assert_int_equal(rc, BW_RP_END);
    uint64_t limits[][2] = {{4, 1 << 20}, {1000, 5 * ROW}, {1000, 1}, {1, 1 << 20}};
    for (size_t l = 0; l < 4; l++) {
        memset(&a, 0, sizeof(a));
        assert_int_equal(bw__ds_get(c, &d, &e2, err, sizeof(err)), BW_OK);
        assert_int_equal(read_all(e2, idx, n, limits[l][0], limits[l][1], &a, &rc, &widest), n);
        assert_int_equal(rc, BW_RP_END);
        assert_int_equal(widest, l == 0 ? 4 : l == 1 ? 5 : 1);
        assert_int_equal(a.records_read, b.records_read);
        assert_int_equal(a.record_bytes_read, b.record_bytes_read);
    }

    bw__ds_put(e);
    bw__ds_cache_free(c);
    files_checked(take_span, "s", 1);
}

/* Gathers (bw__rp_next_gather) serve what bw__rp_next serves, counted alike: the small samples
 * due, one file's at a time, leaving neighbours in the file that make `below` bytes to spans;
 * and check the files as spans do. */
static void test_gathers(void **state)
{
    (void)state;
    write_pair("g");
    bw__ds_cache *c = bw__ds_cache_new(root);
    char *srcs[] = {"g*.npy"};
    Batchwire__V1__Dataset d = spec("npy", srcs, 1);
    bw__wds *e = opened(c, &d);

    /* neighbours, gaps, a file boundary, repeats, backwards, then a long run */
    uint64_t idx[128] = {0,  2,  4,  5,   6,   7, 8, 20, 50,  52, 53,
                         54, 98, 99, 100, 101, 3, 4, 4,  199, 0};
    size_t n = 21;
    for (uint64_t i = 150; i < 200; i++)
        idx[n++] = i;
    bw__data_stats a, b;
    memset(&b, 0, sizeof(b));
    int rc;
    size_t widest;
    bw__wds *e2 = NULL;
    assert_int_equal(bw__ds_get(c, &d, &e2, err, sizeof(err)), BW_OK);
    assert_int_equal(read_all(e2, idx, n, 0, 0, &b, &rc, &widest), n);
    /* {gather, below}, and what must come of it: the widest gather, how many, the widest span.
     * Below 4 rows: [0 2] (4 5 6 7 8 make a streak: a span) [20 50 52 53 54 98 99] (100: another
     * file) [100 101] [3 4 4] [199] [0], then 150-199 a span. */
    struct {
        size_t gather;
        uint64_t below;
        size_t widest_gather, gathers, widest;
    } cases[] = {{64, 4 * ROW, 7, 6, 50},
                 {2, 4 * ROW, 2, 10, 50},
                 {64, ROW, 0, 0, 50},
                 {64, 1 << 20, 50, 6, 0}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(*cases); k++) {
        memset(&a, 0, sizeof(a));
        reading how = {cases[k].gather, cases[k].below, 1000, 1 << 20, 0, 0, 0};
        assert_int_equal(bw__ds_get(c, &d, &e2, err, sizeof(err)), BW_OK);
        assert_int_equal(read_with(e2, idx, n, &how, &a, &rc), n);
        assert_int_equal(rc, BW_RP_END);
        assert_int_equal(how.widest_gather, cases[k].widest_gather);
        assert_int_equal(how.gathers, cases[k].gathers);
        assert_int_equal(how.widest, cases[k].widest);
        assert_int_equal(a.records_read, b.records_read);
        assert_int_equal(a.record_bytes_read, b.record_bytes_read);
    }

    bw__ds_put(e);
    bw__ds_cache_free(c);
    files_checked(take_gather, "g", 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_samples_chunked), cmocka_unit_test(test_stream_records),
        cmocka_unit_test(test_corrupt_midway),  cmocka_unit_test(test_cache_budgets),
        cmocka_unit_test(test_spans),           cmocka_unit_test(test_gathers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
