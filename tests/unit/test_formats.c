/* Dataset readers over memory: npy headers (versions, shapes, refusals), TFRecord (CRC-32C
 * vectors, index, sidecar validation), lines, tar (checksums, pax, grouping), and datasets on
 * disk (globs, escapes, the generator's content, named arrays from .npy files and .npz;
 * FIFOs, links out of the root, canonical paths, bounded sources, walk deadlines, budgets). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_dir.h"
#include "common/crc32c.h"
#include "formats/dataset.h"
#include "formats/synth.h"
#include "formats/tfrecord.h"

static char err[1024];

static bw__source *mem(const bw__format_ops *ops, const void *p, size_t len, int want_rc)
{
    bw__source *s = NULL;
    int rc = bw__source_from_memory(ops, "mem", p, len, &s, err, sizeof(err));
    if (rc != want_rc)
        fail_msg("open: rc %d (%s), wanted %d", rc, err, want_rc);
    if (rc == BW_OK && ops->index(s, err, sizeof(err)) != BW_OK)
        fail_msg("index: %s", err);
    return s;
}

/* ---- npy ---- */

static size_t npy(uint8_t *out, int major, const char *dict, size_t data_len)
{
    size_t dl = strlen(dict), hs = major == 1 ? 10 : 12;
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (uint8_t)major;
    out[7] = 0;
    out[8] = (uint8_t)dl;
    out[9] = (uint8_t)(dl >> 8);
    if (major > 1)
        out[10] = out[11] = 0;
    memcpy(out + hs, dict, dl);
    for (size_t i = 0; i < data_len; i++)
        out[hs + dl + i] = (uint8_t)i;
    return hs + dl + data_len;
}

static void test_npy(void **state)
{
    (void)state;
    uint8_t buf[4096];
    size_t n = npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }\n", 24);
    bw__source *s = mem(&bw__fmt_npy, buf, n, BW_OK);
    assert_int_equal(s->count, 3);
    assert_string_equal(s->layout.dtype, "<f4");
    assert_int_equal(s->layout.ndim, 1);
    assert_int_equal(s->layout.shape[0], 2);
    bw__record r;
    assert_int_equal(s->ops->get(s, 2, &r, err, sizeof(err)), BW_OK);
    assert_int_equal(r.size, 8);
    assert_int_equal(r.parts[0].p[0], 16);
    for (uint64_t i = 0; i < 3; i++) { /* locate (for prefetching) names get's bytes */
        size_t len = 0;
        const uint8_t *p = s->ops->locate(s, i, &len);
        assert_int_equal(s->ops->get(s, i, &r, err, sizeof(err)), BW_OK);
        assert_ptr_equal(p, r.parts[0].p);
        assert_int_equal(len, r.size);
    }
    assert_int_equal(s->ops->get(s, 3, &r, err, sizeof(err)), BW_OUT_OF_RANGE);
    bw__source_free(s);

    /* version 2 and 3, "shape" first, Python 2 longs, 1-D */
    n = npy(buf, 2, "{\"shape\": (4L,), \"fortran_order\": True, \"descr\": \"|u1\"}", 4);
    s = mem(&bw__fmt_npy, buf, n, BW_OK);
    assert_int_equal(s->count, 4);
    assert_int_equal(s->layout.ndim, 0);
    bw__source_free(s);
    n = npy(buf, 3, "{'descr': '<U2', 'fortran_order': False, 'shape': (2,)}", 16);
    s = mem(&bw__fmt_npy, buf, n, BW_OK);
    assert_int_equal(s->layout.sample_bytes, 8);
    bw__source_free(s);

    struct {
        const char *dict;
        size_t data;
        int rc;
        const char *needle;
    } bad[] = {
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, BW_UNIMPLEMENTED,
         "Fortran"},
        {"{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,), }", 8, BW_CORRUPT,
         "structured"},
        {"{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16, BW_UNIMPLEMENTED,
         "object"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, BW_UNIMPLEMENTED, "0-d"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8, BW_CORRUPT, "truncated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 8, BW_CORRUPT,
         "unexpected bytes"},
        {"{'descr': '<f3', 'fortran_order': False, 'shape': (1,), }", 3, BW_UNIMPLEMENTED,
         "item size"},
        {"{'descr': '<f4', 'shape': (1,), }", 4, BW_CORRUPT, "lacks"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4, BW_CORRUPT,
         "repeated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551615, 2), }", 4,
         BW_CORRUPT, "truncated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 99999999999999999999), }", 4,
         BW_CORRUPT, "shape"},
        {"['descr']", 4, BW_CORRUPT, "dict"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        n = npy(buf, 1, bad[i].dict, bad[i].data);
        mem(&bw__fmt_npy, buf, n, bad[i].rc);
        if (!strstr(err, bad[i].needle) || !strstr(err, "mem: offset "))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i].needle);
    }
    mem(&bw__fmt_npy, "\x93NUMPY\x01", 7, BW_CORRUPT);
}

/* ---- tfrecord ---- */

static size_t tfr_put(uint8_t *out, const void *data, uint64_t len)
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(len >> (8 * i));
    uint32_t c = bw__crc32c_mask(bw__crc32c(0, out, 8));
    memcpy(out + 8, &c, 4);
    memcpy(out + 12, data, len);
    c = bw__crc32c_mask(bw__crc32c(0, data, len));
    memcpy(out + 12 + len, &c, 4);
    return 16 + len;
}

static void test_tfrecord(void **state)
{
    (void)state;
    uint8_t buf[4096];
    size_t n = 0, offs[5];
    const char *recs[] = {"alpha", "", "gamma-gamma", "d", "epsilon!"};
    for (int i = 0; i < 5; i++) {
        offs[i] = n;
        n += tfr_put(buf + n, recs[i], strlen(recs[i]));
    }
    bw__source *s = mem(&bw__fmt_tfrecord, buf, n, BW_OK);
    assert_int_equal(s->count, 5);
    bw__record r;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(s->ops->get(s, (uint64_t)i, &r, err, sizeof(err)), BW_OK);
        assert_int_equal(r.size, strlen(recs[i]));
        assert_memory_equal(r.parts[0].p, recs[i], r.size);
    }
    uint64_t next;
    assert_int_equal(s->ops->next(s, offs[2], &r, &next, err, sizeof(err)), BW_OK);
    assert_int_equal(next, offs[3]);
    assert_int_equal(s->ops->next(s, n, &r, &next, err, sizeof(err)), BW_FMT_END);
    assert_int_equal(s->ops->next(s, 3, &r, &next, err, sizeof(err)), BW_CORRUPT);
    assert_non_null(strstr(err, "length CRC mismatch"));

    /* a sidecar: valid, then each kind of damage */
    uint8_t side[256];
    memcpy(side, "BWTFIDX1", 8);
    uint64_t hdr[3] = {n, 0, 5};
    memcpy(side + 8, hdr, sizeof(hdr));
    for (int i = 0; i < 5; i++) {
        uint64_t o = offs[i];
        memcpy(side + 32 + 8 * i, &o, 8);
    }
    size_t slen = 32 + 40 + 4;
    uint32_t c = bw__crc32c(0, side, slen - 4);
    memcpy(side + slen - 4, &c, 4);
    char why[256];
    if (bw__tfrecord_index_parse(s, side, slen, why, sizeof(why)) != BW_OK)
        fail_msg("sidecar refused: %s", why);
    side[40] ^= 1;
    assert_int_equal(bw__tfrecord_index_parse(s, side, slen, why, sizeof(why)), BW_CORRUPT);
    assert_non_null(strstr(why, "CRC"));
    side[40] ^= 1;
    uint64_t wrong = offs[1] - 1;
    memcpy(side + 40, &wrong, 8);
    c = bw__crc32c(0, side, slen - 4);
    memcpy(side + slen - 4, &c, 4);
    assert_int_equal(bw__tfrecord_index_parse(s, side, slen, why, sizeof(why)), BW_OK);
    /* a plausible but wrong offset passes the sidecar check, but never serves wrong bytes */
    assert_int_not_equal(s->ops->get(s, 1, &r, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__tfrecord_index_parse(s, side, slen - 8, why, sizeof(why)), BW_CORRUPT);
    bw__source_free(s);

    buf[offs[2] + 13] ^= 0x20;
    s = mem(&bw__fmt_tfrecord, buf, n, BW_OK);
    assert_int_equal(s->ops->get(s, 2, &r, err, sizeof(err)), BW_CORRUPT);
    assert_non_null(strstr(err, "data CRC mismatch"));
    char want[64];
    snprintf(want, sizeof(want), "offset %zu:", offs[2]);
    assert_non_null(strstr(err, want));
    bw__source_free(s);
    bw__source *t = NULL;
    assert_int_equal(
        bw__source_from_memory(&bw__fmt_tfrecord, "cut", buf, n - 3, &t, err, sizeof(err)), BW_OK);
    assert_int_equal(t->ops->index(t, err, sizeof(err)), BW_CORRUPT);
    assert_non_null(strstr(err, "truncated record"));
    bw__source_free(t);
}

/* ---- lines ---- */

static void test_lines(void **state)
{
    (void)state;
    const char *text = "{\"a\":1}\n\n  \n{\"b\":2}\r\n{\"c\":3}";
    bw__source *s = mem(&bw__fmt_jsonl, text, strlen(text), BW_OK);
    assert_int_equal(s->count, 3);
    bw__record r;
    assert_int_equal(s->ops->get(s, 1, &r, err, sizeof(err)), BW_OK);
    assert_int_equal(r.size, 8);
    uint64_t next;
    assert_int_equal(s->ops->next(s, 8, &r, &next, err, sizeof(err)), BW_OK); /* skips blanks */
    assert_memory_equal(r.parts[0].p, "{\"b\":2}", 7);
    assert_int_equal(s->ops->next(s, 2, &r, &next, err, sizeof(err)), BW_INVALID_ARGUMENT);
    bw__source_free(s);
    s = mem(&bw__fmt_text, text, strlen(text), BW_OK);
    assert_int_equal(s->count, 5);
    bw__source_free(s);
    s = mem(&bw__fmt_text, "", 0, BW_OK);
    assert_int_equal(s->count, 0);
    bw__source_free(s);
}

/* ---- tar ---- */

static size_t tar_put(uint8_t *out, const char *name, char type, const void *data, size_t len)
{
    memset(out, 0, 512);
    snprintf((char *)out, 100, "%s", name);
    snprintf((char *)out + 124, 12, "%011o", (unsigned)len);
    out[156] = (uint8_t)type;
    memcpy(out + 257, "ustar", 6);
    memset(out + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += out[i];
    snprintf((char *)out + 148, 8, "%06o", sum);
    memcpy(out + 512, data, len);
    size_t padded = (len + 511) / 512 * 512;
    memset(out + 512 + len, 0, padded - len);
    return 512 + padded;
}

static void test_tar(void **state)
{
    (void)state;
    static uint8_t buf[16384];
    size_t n = 0;
    n += tar_put(buf + n, "d", '5', "", 0);
    n += tar_put(buf + n, "d/a.jpg", '0', "JPEG", 4);
    n += tar_put(buf + n, "d/a.cls", '0', "7", 1);
    n += tar_put(buf + n, "d/README", '0', "x", 1);
    char pax[64];
    int pl = snprintf(pax, sizeof(pax), "27 path=d/bbbbbbbbbbbb.txt\n");
    assert_int_equal(pl, 27);
    n += tar_put(buf + n, "PaxHeader", 'x', pax, (size_t)pl);
    n += tar_put(buf + n, "ignored", '0', "hello", 5);
    size_t end = n;
    memset(buf + n, 0, 1024);
    n += 1024;
    bw__source *s = mem(&bw__fmt_tar, buf, n, BW_OK);
    assert_int_equal(s->count, 2);
    bw__record r;
    assert_int_equal(s->ops->get(s, 0, &r, err, sizeof(err)), BW_OK);
    assert_int_equal(r.nparts, 2);
    assert_string_equal(r.text + r.key, "d/a");
    assert_string_equal(r.text + r.names[0], "jpg");
    assert_string_equal(r.text + r.names[1], "cls");
    assert_int_equal(r.size, 5);
    assert_int_equal(s->ops->get(s, 1, &r, err, sizeof(err)), BW_OK);
    assert_string_equal(r.text + r.key, "d/bbbbbbbbbbbb");
    assert_string_equal(r.text + r.names[0], "txt");
    assert_memory_equal(r.parts[0].p, "hello", 5);
    uint64_t next;
    assert_int_equal(s->ops->next(s, 0, &r, &next, err, sizeof(err)), BW_OK);
    assert_int_equal(s->ops->next(s, next, &r, &next, err, sizeof(err)), BW_OK);
    assert_int_equal(next, end);
    assert_int_equal(s->ops->next(s, next, &r, &next, err, sizeof(err)), BW_FMT_END);
    bw__source_free(s);

    buf[512 + 3] ^= 1; /* name byte of the second header */
    bw__source *t = NULL;
    assert_int_equal(bw__source_from_memory(&bw__fmt_tar, "t", buf, n, &t, err, sizeof(err)),
                     BW_OK);
    assert_int_equal(t->ops->index(t, err, sizeof(err)), BW_CORRUPT);
    assert_non_null(strstr(err, "t: offset 512: tar header checksum mismatch"));
    bw__source_free(t);
    buf[512 + 3] ^= 1;
    /* duplicate field */
    n = 0;
    n += tar_put(buf + n, "k.x", '0', "1", 1);
    n += tar_put(buf + n, "k.x", '0', "2", 1);
    assert_int_equal(bw__source_from_memory(&bw__fmt_tar, "t", buf, n, &t, err, sizeof(err)),
                     BW_OK);
    assert_int_equal(t->ops->index(t, err, sizeof(err)), BW_CORRUPT);
    assert_non_null(strstr(err, "twice"));
    bw__source_free(t);
}

/* ---- datasets on disk ---- */

static char root[512];

static void write_file(const char *rel, const void *p, size_t len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, len, f), len);
    fclose(f);
}

static void test_dataset(void **state)
{
    (void)state;
    assert_int_equal(bw_test_dir_make(root, sizeof(root), "formats"), 0);
    char sub[600];
    snprintf(sub, sizeof(sub), "%s/d", root);
    mkdir(sub, 0755);
    /* three tfrecord files of generator content: 2, 0 and 3 records */
    uint64_t idx = 0;
    for (int f = 0; f < 3; f++) {
        uint8_t buf[8192] = {0}; /* f == 1 writes none of it */
        size_t n = 0;
        for (int k = 0; k < (f == 0 ? 2 : f == 1 ? 0 : 3); k++, idx++) {
            uint8_t data[1000];
            size_t len = (size_t)bw__synth_len(idx, 10, 900);
            bw__synth_fill(idx, data, len);
            n += tfr_put(buf + n, data, len);
        }
        char name[32];
        snprintf(name, sizeof(name), "d/p%d.tfrecord", f);
        write_file(name, buf, n);
    }
    const char *pat[] = {"d/*.tfrecord"};
    bw__dataset *d = NULL;
    assert_int_equal(bw__dataset_open(root, "tfrecord", pat, 1, &d, err, sizeof(err)), BW_OK);
    assert_int_equal(d->nsources, 3);
    assert_int_equal(strlen(d->fingerprint), 32);
    assert_int_equal(bw__dataset_index(d, err, sizeof(err)), BW_OK);
    assert_int_equal(d->length, 5);
    for (uint64_t i = 0; i < 5; i++) {
        bw__record r;
        assert_int_equal(bw__dataset_get(d, i, &r, err, sizeof(err)), BW_OK);
        uint8_t want[1000];
        bw__synth_fill(i, want, (size_t)r.size);
        assert_int_equal(r.size, bw__synth_len(i, 10, 900));
        assert_memory_equal(r.parts[0].p, want, r.size);
    }
    bw__record r;
    assert_int_equal(bw__dataset_get(d, 5, &r, err, sizeof(err)), BW_OUT_OF_RANGE);
    assert_false(bw__dataset_changed(d, NULL, 0));
    char fp[33];
    memcpy(fp, d->fingerprint, sizeof(fp));
    bw__dataset_free(d);
    /* an appended byte changes the fingerprint */
    char path[1024];
    snprintf(path, sizeof(path), "%s/d/p1.tfrecord", root);
    FILE *f = fopen(path, "ab");
    fputc(0, f);
    fclose(f);
    assert_int_equal(bw__dataset_open(root, "tfrecord", pat, 1, &d, err, sizeof(err)), BW_OK);
    assert_string_not_equal(fp, d->fingerprint);
    assert_int_equal(bw__dataset_index(d, err, sizeof(err)), BW_CORRUPT);
    assert_non_null(strstr(err, "d/p1.tfrecord: offset 0: truncated record header"));
    /* the failure is kept */
    assert_int_equal(bw__dataset_index(d, err, sizeof(err)), BW_CORRUPT);
    bw__dataset_free(d);

    const char *bad[][1] = {{"../x"}, {"/etc/passwd"}, {"d/../../x"}, {""}, {"none*"}};
    int want_rc[] = {BW_PERMISSION_DENIED, BW_PERMISSION_DENIED, BW_PERMISSION_DENIED,
                     BW_INVALID_ARGUMENT, BW_NOT_FOUND};
    for (int i = 0; i < 5; i++)
        assert_int_equal(bw__dataset_open(root, "tfrecord", bad[i], 1, &d, err, sizeof(err)),
                         want_rc[i]);
    char link[1024];
    snprintf(link, sizeof(link), "%s/escape", root);
    assert_int_equal(symlink("/etc", link), 0);
    const char *esc[] = {"escape/hostname"};
    assert_int_equal(bw__dataset_open(root, "text", esc, 1, &d, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "outside the data root"));
    const char *dir[] = {"d"};
    assert_int_equal(bw__dataset_open(root, "files", dir, 1, &d, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__dataset_index(d, err, sizeof(err)), BW_OK);
    assert_int_equal(d->length, 3 + 3); /* three files and their index sidecars */
    assert_int_equal(bw__dataset_get(d, 0, &r, err, sizeof(err)), BW_OK);
    assert_true(r.owner_is_own);
    bw__record_release(&r);
    bw__dataset_free(d);
    assert_int_equal(bw__dataset_open(root, "avro", dir, 1, &d, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_int_equal(bw_test_dir_remove(root), 0);
}

/* ---- named arrays (fields, npz) ---- */

/* A .npy of `rows` rows of `descr` with per-row shape `shape` ("" or "2,"), row r filled with
 * bytes seed + r, into root/rel; returns its size. */
static size_t write_npy(const char *rel, const char *descr, const char *shape, size_t rows,
                        size_t row_bytes, uint8_t seed, uint8_t *out)
{
    char dict[160];
    snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': False, 'shape': (%zu,%s), }",
             descr, rows, shape);
    size_t n = npy(out, 1, dict, rows * row_bytes);
    for (size_t r = 0; r < rows; r++)
        memset(out + n - rows * row_bytes + r * row_bytes, seed + (int)r, row_bytes);
    if (rel)
        write_file(rel, out, n);
    return n;
}

static void put16(uint8_t *p, unsigned v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    put16(p, v & 0xffff);
    put16(p + 2, v >> 16);
}

/* A zip of members names[i] = data[i] (lens[i] bytes), stored (method 0) or with `method`
 * announced (the bytes are stored as they are either way); returns its size. */
static size_t zip(uint8_t *out, const char *const *names, const uint8_t *const *data,
                  const size_t *lens, size_t n, unsigned method)
{
    size_t o = 0, at[8];
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(names[i]);
        at[i] = o;
        memset(out + o, 0, 30);
        put32(out + o, 0x04034b50);
        put16(out + o + 8, method);
        put32(out + o + 18, (uint32_t)lens[i]);
        put32(out + o + 22, (uint32_t)lens[i]);
        put16(out + o + 26, (unsigned)nl);
        memcpy(out + o + 30, names[i], nl);
        memcpy(out + o + 30 + nl, data[i], lens[i]);
        o += 30 + nl + lens[i];
    }
    size_t cd = o;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(names[i]);
        memset(out + o, 0, 46);
        put32(out + o, 0x02014b50);
        put16(out + o + 10, method);
        put32(out + o + 20, (uint32_t)lens[i]);
        put32(out + o + 24, (uint32_t)lens[i]);
        put16(out + o + 28, (unsigned)nl);
        put32(out + o + 42, (uint32_t)at[i]);
        memcpy(out + o + 46, names[i], nl);
        o += 46 + nl;
    }
    memset(out + o, 0, 22);
    put32(out + o, 0x06054b50);
    put16(out + o + 8, (unsigned)n);
    put16(out + o + 10, (unsigned)n);
    put32(out + o + 12, (uint32_t)(o - cd));
    put32(out + o + 16, (uint32_t)cd);
    return o + 22;
}

/* d's sample i is x's row i (8 bytes of 3 + i % 3 ... as written) then y's. */
static void check_sample(bw__dataset *d, uint64_t i, uint8_t xv, uint8_t yv)
{
    bw__record r;
    assert_int_equal(bw__dataset_get(d, i, &r, err, sizeof(err)), BW_OK);
    assert_int_equal(r.nparts, 2);
    assert_int_equal(r.size, 8 + 8);
    assert_true(r.per_part_owner);
    assert_non_null(bw__record_owner(&r, 0));
    assert_non_null(bw__record_owner(&r, 1));
    for (int k = 0; k < 8; k++) {
        assert_int_equal(r.parts[0].p[k], xv);
        assert_int_equal(r.parts[1].p[k], yv);
    }
    bw__record_release(&r);
}

static int open_fields(const char *xname, const char *const *xp, size_t nx, const char *yname,
                       const char *yfmt, const char *const *yp, size_t ny, bw__dataset **d)
{
    bw__field_spec f[2] = {{xname, "npy", xp, nx}, {yname, yfmt, yp, ny}};
    return bw__dataset_open_fields(root, f, 2, d, err, sizeof(err));
}

static void test_fields(void **state)
{
    (void)state;
    assert_int_equal(bw_test_dir_make(root, sizeof(root), "fields"), 0);
    char sub[600];
    for (size_t i = 0; i < 3; i++) {
        snprintf(sub, sizeof(sub), "%s/%s", root, (const char *[]){"x", "y", "z"}[i]);
        mkdir(sub, 0755);
    }
    uint8_t buf[4096];
    /* x: float32 pairs, rows 3 + 2; y: int64, rows 3 + 2 (the same split); z: rows 2 + 3 */
    write_npy("x/a.npy", "<f4", " 2", 3, 8, 10, buf);
    write_npy("x/b.npy", "<f4", " 2", 2, 8, 13, buf);
    write_npy("y/a.npy", "<i8", "", 3, 8, 50, buf);
    write_npy("y/b.npy", "<i8", "", 2, 8, 53, buf);
    write_npy("z/a.npy", "<i8", "", 2, 8, 50, buf);
    write_npy("z/b.npy", "<i8", "", 3, 8, 52, buf);
    write_npy("y4.npy", "<i8", "", 4, 8, 50, buf);
    const char *xp[] = {"x/*.npy"}, *yp[] = {"y/a.npy", "y/b.npy"}, *zp[] = {"z/*.npy"};
    const char *y4[] = {"y4.npy"}, *none[] = {"y/none.npy"};
    bw__dataset *d = NULL;
    assert_int_equal(open_fields("x", xp, 1, "y", "npy", yp, 2, &d), BW_OK);
    assert_int_equal(d->nfields, 2);
    assert_string_equal(d->field_names[1], "y");
    assert_int_equal(d->length, 5);
    assert_int_equal(d->nsources, 2);
    assert_int_equal(d->layout.sample_bytes, 16);
    assert_int_equal(bw__dataset_nfiles(d), 4);
    assert_int_equal(bw__dataset_index(d, err, sizeof(err)), BW_OK);
    for (uint64_t i = 0; i < 5; i++)
        check_sample(d, i, (uint8_t)(10 + i), (uint8_t)(50 + i));
    bw__record r;
    assert_int_equal(bw__dataset_get(d, 5, &r, err, sizeof(err)), BW_OUT_OF_RANGE);
    assert_int_equal(bw__dataset_check(d, 1, err, sizeof(err)), BW_OK);
    assert_false(bw__dataset_changed(d, NULL, 0));
    char fp[33];
    memcpy(fp, d->fingerprint, sizeof(fp));
    bw__dataset_free(d);
    /* the names are part of the fingerprint */
    assert_int_equal(open_fields("x", xp, 1, "label", "npy", yp, 2, &d), BW_OK);
    assert_string_not_equal(fp, d->fingerprint);
    bw__dataset_free(d);

    /* refusals name the field */
    struct {
        const char *xname, *yname, *yfmt;
        const char *const *yp;
        size_t ny;
        int rc;
        const char *words;
    } bad[] = {
        {"x", "y", "npy", zp, 1, BW_MISMATCH, "field 'y': file z/a.npy holds 2 rows"},
        {"x", "y", "npy", y4, 1, BW_MISMATCH, "field 'y' has 4 samples"},
        {"x", "y", "npy", none, 1, BW_NOT_FOUND, "field 'y': source 'y/none.npy'"},
        {"x", "y", "tar", yp, 2, BW_INVALID_ARGUMENT, "field 'y': format 'tar'"},
        {"x", "x", "npy", yp, 2, BW_INVALID_ARGUMENT, "field 'x' is named twice"},
        {"x", "my y", "npy", yp, 2, BW_INVALID_ARGUMENT, "is a space"},
        {"x", "y=1", "npy", yp, 2, BW_INVALID_ARGUMENT, "separates fields"},
        {"x", "", "npy", yp, 2, BW_INVALID_ARGUMENT, "field name"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        d = NULL;
        int rc =
            open_fields(bad[i].xname, xp, 1, bad[i].yname, bad[i].yfmt, bad[i].yp, bad[i].ny, &d);
        if (rc != bad[i].rc || !strstr(err, bad[i].words))
            fail_msg("case %zu: rc %d, err '%s'", i, rc, err);
        assert_null(d);
    }
    /* the same length over another number of files */
    write_npy("y5.npy", "<i8", "", 5, 8, 50, buf);
    const char *one[] = {"y5.npy"};
    assert_int_equal(open_fields("x", xp, 1, "y", "npy", one, 1, &d), BW_MISMATCH);
    assert_non_null(strstr(err, "field 'y' is split over 1 file(s) and field 'x' over 2"));
    assert_int_equal(bw__dataset_open_fields(root, NULL, 0, &d, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);

    /* npz: stored members become fields, in the archive's order */
    uint8_t xn[512], yn[512], z[2048];
    size_t xl = write_npy(NULL, "<f4", " 2", 4, 8, 20, xn);
    size_t yl = write_npy(NULL, "<i8", "", 4, 8, 60, yn);
    const char *names[] = {"x.npy", "y.npy"};
    const uint8_t *data[] = {xn, yn};
    size_t lens[] = {xl, yl};
    size_t zl = zip(z, names, data, lens, 2, 0);
    write_file("a.npz", z, zl);
    const char *ap[] = {"a.npz"};
    assert_int_equal(bw__dataset_open(root, "npz", ap, 1, &d, err, sizeof(err)), BW_OK);
    assert_int_equal(d->nfields, 2);
    assert_string_equal(d->field_names[0], "x");
    assert_int_equal(d->length, 4);
    assert_string_equal(d->ops->name, "npz");
    for (uint64_t i = 0; i < 4; i++)
        check_sample(d, i, (uint8_t)(20 + i), (uint8_t)(60 + i));
    for (uint64_t i = 0; i < 6; i++) /* every field's bytes; past the end, nothing */
        bw__dataset_prefetch(d, i);
    bw__dataset_free(d);
    /* a compressed member is refused saying how to write an uncompressed archive */
    zl = zip(z, names, data, lens, 2, 8);
    write_file("c.npz", z, zl);
    const char *cp[] = {"c.npz"};
    assert_int_equal(bw__dataset_open(root, "npz", cp, 1, &d, err, sizeof(err)), BW_UNIMPLEMENTED);
    assert_non_null(strstr(err, "compressed"));
    assert_non_null(strstr(err, "np.savez (not np.savez_compressed)"));
    /* archives of a dataset must hold the same arrays; garbage is not an archive */
    write_file("b.npz", z, zip(z, names, data, lens, 1, 0));
    const char *ab[] = {"a.npz", "b.npz"};
    assert_int_equal(bw__dataset_open(root, "npz", ab, 2, &d, err, sizeof(err)), BW_MISMATCH);
    assert_non_null(strstr(err, "same arrays"));
    write_file("g.npz", "not a zip at all, just some bytes", 33);
    const char *gp[] = {"g.npz"};
    assert_int_equal(bw__dataset_open(root, "npz", gp, 1, &d, err, sizeof(err)), BW_CORRUPT);
    assert_int_equal(bw_test_dir_remove(root), 0);
}

/* ---- hostile paths and budgets (docs/formats.md, "A dataset"; docs/operating.md, "Worker
 * budgets") ---- */

static void mkdir_in(const char *rel)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    assert_int_equal(mkdir(p, 0755), 0);
}

static void test_hostile(void **state)
{
    (void)state;
    char made[512];
    assert_int_equal(bw_test_dir_make(made, sizeof(made), "hostile"), 0);
    assert_non_null(realpath(made, root));
    bw__dataset *d = NULL;
    /* a FIFO is refused at once, by name or through a glob (opening it blocking would hang) */
    char p[1024];
    snprintf(p, sizeof(p), "%s/fifo.txt", root);
    assert_int_equal(mkfifo(p, 0600), 0);
    const char *fifo[][1] = {{"fifo.txt"}, {"fif?.txt"}};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(bw__dataset_open(root, "text", fifo[i], 1, &d, err, sizeof(err)),
                         BW_INVALID_ARGUMENT);
        assert_non_null(strstr(err, "not a regular file"));
    }
    /* links out of the root: refused before any directory outside is read, naming nothing
     * outside, and a missing file behind one is refused the same way */
    snprintf(p, sizeof(p), "%s/up", root);
    assert_int_equal(symlink("/", p), 0);
    const char *out[][1] = {{"up/*"}, {"up/etc/*"}, {"up/etc/hostname"}, {"up/no-such-xyz"}};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(bw__dataset_open(root, "text", out[i], 1, &d, err, sizeof(err)),
                         BW_PERMISSION_DENIED);
        assert_non_null(strstr(err, "outside the data root"));
        assert_null(strstr(err, " /etc")); /* the path as given ('up/etc/...'), never resolved */
        assert_null(strstr(err, "'/etc"));
    }
    /* one canonical name, fingerprint and source path however the path is spelled */
    mkdir_in("c");
    write_file("c/x.txt", "a\nb\n", 4);
    snprintf(p, sizeof(p), "%s/alias", root);
    assert_int_equal(symlink("c", p), 0);
    const char *spell[][1] = {{"c/x.txt"}, {"./c/x.txt"}, {"c//x.t?t"}, {"alias/x.txt"}};
    char fp[33] = "";
    for (int i = 0; i < 4; i++) {
        assert_int_equal(bw__dataset_open(root, "text", spell[i], 1, &d, err, sizeof(err)), BW_OK);
        assert_string_equal(d->sources[0]->path, "c/x.txt");
        if (i)
            assert_string_equal(d->fingerprint, fp);
        memcpy(fp, d->fingerprint, sizeof(fp));
        bw__dataset_free(d);
    }
    /* bounded sources, and a walk past its deadline */
    mkdir_in("wide");
    for (int i = 0; i < 600; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "wide/f%03d.txt", i);
        write_file(rel, "x\n", 2);
    }
    const char *wide[] = {"wide/*.txt"};
    bw__open_opts o = {.max_sources = 100, .max_sources_flag = "--max-sources"};
    assert_int_equal(bw__dataset_open_opts(root, "text", wide, 1, &o, &d, err, sizeof(err)),
                     BW_TOO_BIG);
    assert_non_null(strstr(err, "--max-sources"));
    o = (bw__open_opts){.deadline_ms = 1};
    bw__paths sp, cn;
    assert_int_equal(bw__dataset_resolve(root, wide, 1, &o, &sp, &cn, err, sizeof(err)),
                     BW_TIMEOUT);
    assert_non_null(strstr(err, "deadline"));
    /* the open-files budget: a dataset over it alone is BW_TOO_BIG, one that others' files
     * keep out is BW_BUSY; what is taken is given back when a dataset is freed */
    bw__budget files = {.limit = 3, .what = "open files", .flag = "--max-open-files"};
    atomic_init(&files.used, 0);
    o = (bw__open_opts){.files = &files};
    const char *four[] = {"c/x.txt", "c/x.txt", "c/x.txt", "c/x.txt"};
    assert_int_equal(bw__dataset_open_opts(root, "text", four, 4, &o, &d, err, sizeof(err)),
                     BW_TOO_BIG);
    assert_non_null(strstr(err, "--max-open-files"));
    assert_int_equal(atomic_load(&files.used), 0);
    bw__dataset *d2 = NULL;
    assert_int_equal(bw__dataset_open_opts(root, "text", four, 2, &o, &d, err, sizeof(err)), BW_OK);
    assert_int_equal(atomic_load(&files.used), 2);
    assert_int_equal(bw__dataset_open_opts(root, "text", four, 2, &o, &d2, err, sizeof(err)),
                     BW_BUSY);
    bw__dataset_free(d);
    assert_int_equal(atomic_load(&files.used), 0);
    /* the memory budget: a line index (8 bytes a line) over it is refused while it grows */
    char lines[4096];
    memset(lines, '\n', sizeof(lines));
    write_file("nl.txt", lines, sizeof(lines));
    bw__budget mem = {.limit = sizeof(bw__source) + 8192, .what = "bytes", .flag = "--mem"};
    atomic_init(&mem.used, 0);
    o = (bw__open_opts){.memory = &mem};
    const char *nl[] = {"nl.txt"};
    assert_int_equal(bw__dataset_open_opts(root, "text", nl, 1, &o, &d, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__dataset_index(d, err, sizeof(err)), BW_TOO_BIG);
    assert_non_null(strstr(err, "--mem"));
    bw__dataset_free(d);
    assert_int_equal(atomic_load(&mem.used), 0);
    mem.limit = sizeof(bw__source) + 4096 * 8;
    assert_int_equal(bw__dataset_open_opts(root, "text", nl, 1, &o, &d, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__dataset_index(d, err, sizeof(err)), BW_OK);
    assert_int_equal(d->length, 4096);
    bw__dataset_free(d);
    assert_int_equal(bw_test_dir_remove(root), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npy),     cmocka_unit_test(test_tfrecord),
        cmocka_unit_test(test_lines),   cmocka_unit_test(test_tar),
        cmocka_unit_test(test_dataset), cmocka_unit_test(test_fields),
        cmocka_unit_test(test_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
