/*
 * The planner (core/jobs/plan): over a grid of torch, accelerate and iterable configurations,
 * with and without an elastic resize, its step counts and batches equal the sampler core's
 * (what the coordinator and the client computed before there was one planner); pre-sharded
 * streams follow the per-source rule (the longest source's batches, or the shortest's with
 * drop_last, padded by cycling the rank's own source); stream positions and per-source record
 * counts are those cursors carry; counts-only plans give the same counts; and what a plan
 * refuses, it refuses with a sentence.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "jobs/plan.h"

typedef struct history {
    Batchwire__V1__WorldSegment seg[3];
    const Batchwire__V1__WorldSegment *ptr[3];
    size_t n;
} history;

/* A history whose epoch `epoch` starts at world r0 and, when r1 > 0, continues at r1 from
 * step k (step 0 too: a second segment at the epoch's step 0 is a resize there). */
static void make_history(history *h, uint64_t epoch, uint32_t r0, uint64_t k, uint32_t r1)
{
    memset(h, 0, sizeof(*h));
    for (int i = 0; i < 3; i++) {
        batchwire__v1__world_segment__init(&h->seg[i]);
        h->ptr[i] = &h->seg[i];
    }
    h->seg[0].world_size = r0; /* the job's creation, epoch 0 */
    h->n = 1;
    if (epoch > 0) { /* an epoch that starts at r0 after earlier ones did too */
        h->seg[1].epoch = epoch;
        h->seg[1].world_size = r0;
        h->n = 2;
    }
    if (r1 > 0) {
        h->seg[h->n].epoch = epoch;
        h->seg[h->n].start_step = k;
        h->seg[h->n].world_size = r1;
        h->n++;
    }
}

/* A spec over `h` with the sampler settings `c` and, for streams, `nsources` sources. */
static bw__plan_spec make_spec(const bw__sampler_cfg *c, const history *h, const uint64_t *records,
                               size_t nsources)
{
    bw__plan_spec spec;
    memset(&spec, 0, sizeof(spec));
    spec.sampler = *c;
    spec.records = records;
    spec.nsources = nsources;
    spec.history = h->ptr;
    spec.nhistory = h->n;
    return spec;
}

static uint64_t rs = 7;
static uint64_t rnd_below(uint64_t n)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (rs >> 33) % n;
}

static void describe(const bw__sampler_cfg *c, const history *h, char *buf, size_t len)
{
    int o =
        snprintf(buf, len,
                 "mode=%s n=%" PRIu64 " B=%" PRIu64 " shuffle=%d seed=%" PRIu64
                 " drop_last=%d sampler_drop_last=%d split=%d even=%d history=",
                 bw__sampler_mode_name(c->mode), c->num_samples, c->batch_size, c->shuffle, c->seed,
                 c->drop_last, c->sampler_drop_last, c->split_batches, c->even_batches);
    for (size_t i = 0; i < h->n && o > 0 && (size_t)o < len; i++)
        o += snprintf(buf + o, len - (size_t)o, "(%" PRIu64 ",%" PRIu64 ",%u)", h->seg[i].epoch,
                      h->seg[i].start_step, h->seg[i].world_size);
}

/* The sampler core as the coordinator and the loader drove it: the epoch's world, then the
 * resize. NULL when the core refuses. */
static bw__sampler *core_sampler(const bw__sampler_cfg *base, uint64_t epoch, uint32_t r0,
                                 uint64_t k, uint32_t r1)
{
    bw__sampler_cfg c = *base;
    c.world_size = r0;
    c.epoch = epoch;
    bw__sampler *s = NULL;
    if (bw__sampler_new(&s, &c, NULL, 0) != BW_OK)
        return NULL;
    if (r1 > 0 && bw__sampler_resize(s, k, r1, NULL, 0) != BW_OK) {
        bw__sampler_free(s);
        return NULL;
    }
    return s;
}

/* Every count and every batch of the plan equals the core's. */
static void check_against_core(const bw__plan *p, const bw__sampler *s, const char *desc)
{
    uint64_t world = bw__sampler_world_size(s);
    if (bw__plan_world_size(p) != world || bw__plan_first_step(p) != bw__sampler_first_step(s) ||
        bw__plan_max_batch(p) != bw__sampler_max_batch(s) ||
        bw__plan_equal_batches(p) != bw__sampler_equal_batches(s))
        fail_msg("%s: world, first step, max batch or equal_batches differ", desc);
    size_t cap = bw__sampler_max_batch(s);
    uint64_t *ia = calloc(cap, sizeof(*ia)), *ib = calloc(cap, sizeof(*ib));
    uint8_t *pa = calloc(cap, 1), *pb = calloc(cap, 1);
    assert_true(ia && ib && pa && pb);
    for (uint64_t r = 0; r <= world; r++) { /* one past the world: no steps */
        uint64_t end = bw__sampler_end_step(s, r);
        if (bw__plan_end_step(p, r) != end)
            fail_msg("%s: rank %" PRIu64 " end_step %" PRIu64 ", the core says %" PRIu64, desc, r,
                     bw__plan_end_step(p, r), end);
        for (uint64_t st = 0; st <= end; st++) {
            bw__batch a = {ia, pa, 0, 0}, b = {ib, pb, 0, 0};
            int ra = bw__plan_batch(p, r, st, &a), rb = bw__sampler_batch(s, r, st, &b);
            if (ra != rb || a.count != b.count || a.real != b.real ||
                memcmp(ia, ib, a.count * sizeof(*ia)) != 0 || memcmp(pa, pb, a.count) != 0)
                fail_msg("%s: rank %" PRIu64 " step %" PRIu64 " differs from the core", desc, r,
                         st);
        }
    }
    free(ia);
    free(ib);
    free(pa);
    free(pb);
}

/* Random torch, accelerate and (one-source) iterable configurations with random histories:
 * the plan is the core, step for step; a counts-only plan has the same counts; the protobuf
 * constructor agrees with the plain one. */
static void test_grid_matches_core(void **state)
{
    (void)state;
    int checked = 0, resized = 0;
    for (int iter = 0; iter < 3000; iter++) {
        bw__sampler_cfg c;
        bw__sampler_cfg_init(&c);
        c.mode = (bw__sampler_mode)rnd_below(3);
        c.num_samples = rnd_below(90);
        c.batch_size = 1 + rnd_below(7);
        c.shuffle = c.mode != BW__MODE_ITERABLE && rnd_below(2);
        c.seed = rnd_below(1000);
        c.drop_last = rnd_below(3) == 0;
        c.sampler_drop_last = c.mode == BW__MODE_TORCH && rnd_below(3) == 0;
        c.split_batches = c.mode != BW__MODE_TORCH && rnd_below(3) == 0;
        c.even_batches = c.mode != BW__MODE_ACCELERATE || rnd_below(3) != 0;
        if (c.shuffle && rnd_below(3) == 0)
            c.shuffle_algo = BW__SHUFFLE_FEISTEL;
        uint64_t epoch = rnd_below(3);
        uint32_t r0 = 1 + (uint32_t)rnd_below(5), r1 = 0;
        if (c.split_batches)
            c.batch_size = r0 * (1 + rnd_below(3));
        bw__sampler *s = core_sampler(&c, epoch, r0, 0, 0);
        if (!s)
            continue;
        uint64_t k = 0;
        if (rnd_below(2) == 0) { /* an elastic resize somewhere the core accepts */
            k = rnd_below(bw__sampler_end_step(s, r0 - 1) + 1);
            r1 = c.split_batches ? r0 : 1 + (uint32_t)rnd_below(5);
            bw__sampler_free(s);
            s = core_sampler(&c, epoch, r0, k, r1);
            if (!s)
                continue;
            resized++;
        }
        history h;
        make_history(&h, epoch, r0, k, r1);
        char desc[512];
        describe(&c, &h, desc, sizeof(desc));
        uint64_t records = c.num_samples;
        bw__plan_spec spec = make_spec(&c, &h, &records, 1);
        bw__plan *p = NULL, *q = NULL;
        char err[512];
        if (bw__plan_new(&spec, epoch, false, &p, err, sizeof(err)) != BW_OK)
            fail_msg("%s: %s", desc, err);
        check_against_core(p, s, desc);
        assert_int_equal(bw__plan_epoch(p), epoch);
        assert_int_equal(bw__plan_step_positions(p),
                         bw__sampler_max_batch(s) * bw__sampler_world_size(s));

        if (bw__plan_new(&spec, epoch, true, &q, err, sizeof(err)) != BW_OK)
            fail_msg("%s: counts only: %s", desc, err);
        uint64_t idx[64];
        bw__batch b = {idx, NULL, 0, 0};
        assert_int_equal(bw__plan_batch(q, 0, bw__plan_first_step(q), &b), BW_FAILED_PRECONDITION);
        assert_int_equal(b.count, 0);
        for (uint64_t r = 0; r < bw__plan_world_size(p); r++)
            assert_int_equal(bw__plan_end_step(q, r), bw__plan_end_step(p, r));
        assert_int_equal(bw__plan_equal_batches(q), bw__plan_equal_batches(p));
        bw__plan_free(q);

        /* The same job through its protobuf configuration. */
        Batchwire__V1__SamplerConfig sc = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
        sc.mode = c.mode == BW__MODE_TORCH ? BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH
                  : c.mode == BW__MODE_ACCELERATE
                      ? BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ACCELERATE
                      : BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ITERABLE;
        sc.batch_size = c.batch_size;
        sc.shuffle = c.shuffle;
        sc.seed = (int64_t)c.seed;
        sc.shuffle_algo = c.shuffle_algo == BW__SHUFFLE_FEISTEL
                              ? BATCHWIRE__V1__SHUFFLE_ALGO__SHUFFLE_ALGO_FEISTEL
                              : BATCHWIRE__V1__SHUFFLE_ALGO__SHUFFLE_ALGO_TORCH;
        sc.drop_last = c.drop_last;
        sc.sampler_drop_last = c.sampler_drop_last;
        sc.split_batches = c.split_batches;
        sc.uneven_batches = !c.even_batches;
        Batchwire__V1__Dataset ds = BATCHWIRE__V1__DATASET__INIT;
        Batchwire__V1__JobConfig jc = BATCHWIRE__V1__JOB_CONFIG__INIT;
        jc.sampler = &sc;
        jc.dataset = &ds;
        Batchwire__V1__SourceInfo src = BATCHWIRE__V1__SOURCE_INFO__INIT;
        Batchwire__V1__SourceInfo *srcs[1] = {&src};
        src.records = c.num_samples;
        Batchwire__V1__DatasetInfo info = BATCHWIRE__V1__DATASET_INFO__INIT;
        info.format = c.mode == BW__MODE_ITERABLE ? "jsonl" : "npy";
        info.length = c.num_samples;
        info.sources = srcs;
        info.n_sources = 1;
        if (bw__plan_new_for_job(&jc, &info, h.ptr, h.n, epoch, false, &q, err, sizeof(err)) !=
            BW_OK)
            fail_msg("%s: for_job: %s", desc, err);
        check_against_core(q, s, desc);
        bw__plan_free(q);
        bw__plan_free(p);
        bw__sampler_free(s);
        checked++;
    }
    assert_true(checked > 2000);
    assert_true(resized > 500);
}

/* The pre-sharded rule, written out: every rank has the longest source's batch count (the
 * shortest's with drop_last); record j of a rank's step is its source's record j, or past the
 * source's end a padding duplicate cycling from its start; indices are positions in the
 * stream of all sources. */
static void test_pre_sharded(void **state)
{
    (void)state;
    int checked = 0;
    for (int iter = 0; iter < 400; iter++) {
        uint32_t world = 1 + (uint32_t)rnd_below(5);
        uint64_t counts[5], start[6] = {0};
        for (uint32_t r = 0; r < world; r++) {
            counts[r] = 1 + rnd_below(20);
            start[r + 1] = start[r] + counts[r];
        }
        bw__sampler_cfg c;
        bw__sampler_cfg_init(&c);
        c.mode = BW__MODE_ITERABLE;
        c.split_batches = rnd_below(3) == 0;
        c.batch_size = c.split_batches ? world * (1 + rnd_below(3)) : 1 + rnd_below(6);
        c.drop_last = rnd_below(2);
        uint64_t b = c.split_batches ? c.batch_size / world : c.batch_size;
        uint64_t want = c.drop_last ? UINT64_MAX : 0;
        for (uint32_t r = 0; r < world; r++) {
            uint64_t n = c.drop_last ? counts[r] / b : (counts[r] + b - 1) / b;
            want = c.drop_last ? (n < want ? n : want) : (n > want ? n : want);
        }
        history h;
        uint64_t epoch = rnd_below(3);
        make_history(&h, epoch, world, 0, 0);
        bw__plan_spec spec = make_spec(&c, &h, counts, world);
        spec.pre_sharded = true;
        bw__plan *p = NULL;
        char err[512];
        if (bw__plan_new(&spec, epoch, false, &p, err, sizeof(err)) != BW_OK)
            fail_msg("world %u: %s", world, err);
        assert_true(bw__plan_pre_sharded(p));
        assert_true(bw__plan_equal_batches(p));
        assert_int_equal(bw__plan_max_batch(p), b);
        uint64_t idx[64];
        uint8_t pad[64];
        for (uint32_t r = 0; r < world; r++) {
            assert_int_equal(bw__plan_end_step(p, r), want);
            for (uint64_t st = 0; st < want; st++) {
                bw__batch out = {idx, pad, 0, 0};
                assert_int_equal(bw__plan_batch(p, r, st, &out), BW_OK);
                assert_int_equal(out.count, b);
                size_t real = 0;
                for (uint64_t i = 0; i < b; i++) {
                    uint64_t j = st * b + i;
                    bool is_pad = j >= counts[r];
                    uint64_t rec = is_pad ? (j - counts[r]) % counts[r] : j;
                    assert_int_equal(idx[i], start[r] + rec);
                    assert_int_equal(pad[i], is_pad);
                    real += !is_pad;
                }
                assert_int_equal(out.real, real);
                /* The rank's cursor after st + 1 steps: its own source only. */
                uint64_t done = (st + 1) * b < counts[r] ? (st + 1) * b : counts[r];
                assert_int_equal(bw__plan_source_records(p, r, r, st + 1), done);
                assert_int_equal(bw__plan_source_records(p, r, (r + 1) % world, st + 1),
                                 world == 1 ? done : 0);
                assert_int_equal(bw__plan_stream_position(p, r, st + 1), start[r] + done);
            }
            bw__batch out = {idx, pad, 0, 0};
            assert_int_equal(bw__plan_batch(p, r, want, &out), BW_END_OF_EPOCH);
            assert_int_equal(bw__plan_stream_position(p, r, 0), start[r]);
        }
        bw__batch out = {idx, pad, 0, 0};
        assert_int_equal(bw__plan_batch(p, world, 0, &out), BW_INVALID_ARGUMENT);
        assert_int_equal(bw__plan_end_step(p, world), 0);
        bw__plan_free(p);
        checked++;
    }
    assert_int_equal(checked, 400);
}

/* A plain multi-source stream: positions come from the sampler (the source order does not
 * change them); the cursor's position is min(N, step * G) and each source's records consumed
 * are those before that position in the epoch's source order. */
static void test_plain_stream_positions(void **state)
{
    (void)state;
    const uint64_t counts[] = {5, 0, 9, 4, 7};
    uint64_t n = 25;
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        for (uint64_t epoch = 0; epoch < 3; epoch++) {
            bw__sampler_cfg c;
            bw__sampler_cfg_init(&c);
            c.mode = BW__MODE_ITERABLE;
            c.batch_size = 3;
            c.seed = 42;
            history h;
            make_history(&h, epoch, 2, 0, 0);
            bw__plan_spec spec = make_spec(&c, &h, counts, 5);
            spec.shuffle_sources = shuffle;
            bw__plan *p;
            char err[256];
            assert_int_equal(bw__plan_new(&spec, epoch, false, &p, err, sizeof(err)), BW_OK);
            assert_int_equal(bw__plan_config(p)->num_samples, n);
            const bw__stream_order *o = bw__plan_stream_order(p);
            assert_non_null(o);
            assert_int_equal(o->total, n);
            uint64_t g = bw__plan_step_positions(p);
            assert_int_equal(g, 6);
            assert_int_equal(bw__plan_end_step(p, 0), 5); /* ceil(25 / 6) */
            assert_int_equal(bw__plan_end_step(p, 1), 5);
            uint64_t idx[8];
            uint8_t pad[8];
            bw__batch b = {idx, pad, 0, 0};
            assert_int_equal(bw__plan_batch(p, 1, 4, &b), BW_OK);
            /* step 4 of rank 1: positions 27..29 of a 25-long stream: padding from its start */
            assert_int_equal(idx[0], 2);
            assert_int_equal(b.real, 0);
            for (uint64_t step = 0; step <= 6; step++) {
                uint64_t pos = step * g < n ? step * g : n;
                for (uint64_t r = 0; r < 2; r++) {
                    assert_int_equal(bw__plan_stream_position(p, r, step), pos);
                    for (uint32_t src = 0; src < 5; src++)
                        assert_int_equal(bw__plan_source_records(p, r, src, step),
                                         bw__stream_order_consumed(o, src, pos));
                }
            }
            bw__plan_free(p);
        }
    }
}

/* History: a second segment at an epoch's step 0 is a resize there, as the coordinator
 * checked it; an epoch after a resize starts at the last world size. */
static void test_history(void **state)
{
    (void)state;
    bw__sampler_cfg c;
    bw__sampler_cfg_init(&c);
    c.mode = BW__MODE_ACCELERATE;
    c.num_samples = 4;
    c.batch_size = 2;
    c.drop_last = true;
    history h;
    make_history(&h, 0, 3, 0, 1); /* world 3 has no step at all: the epoch is over at step 0 */
    bw__plan_spec spec = make_spec(&c, &h, NULL, 0);
    bw__plan *p;
    char err[256];
    assert_int_equal(bw__plan_new(&spec, 0, false, &p, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__plan_world_size(p), 1);
    assert_int_equal(bw__plan_end_step(p, 0), 0);
    bw__plan_free(p);
    /* The next epoch runs at world 1 from its start. */
    assert_int_equal(bw__plan_new(&spec, 1, false, &p, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__plan_world_size(p), 1);
    assert_int_equal(bw__plan_first_step(p), 0);
    assert_int_equal(bw__plan_end_step(p, 0), 2);
    bw__plan_free(p);
    /* A resize past what every rank ran is refused, naming the step. */
    c.num_samples = 20;
    c.drop_last = false;
    spec.sampler = c;
    make_history(&h, 0, 2, 9, 3);
    spec.history = h.ptr;
    spec.nhistory = h.n;
    assert_int_equal(bw__plan_new(&spec, 0, false, &p, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_null(p);
    assert_non_null(strstr(err, "resume_from_step 9"));
    spec.nhistory = 0;
    assert_int_equal(bw__plan_new(&spec, 0, false, &p, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "history"));
}

/* Counts-only plans do not need the order: a feistel job's counts too. */
static void test_counts_only_feistel(void **state)
{
    (void)state;
    bw__sampler_cfg c;
    bw__sampler_cfg_init(&c);
    c.mode = BW__MODE_TORCH;
    c.num_samples = 1000;
    c.batch_size = 10;
    c.shuffle = true;
    c.shuffle_algo = BW__SHUFFLE_FEISTEL;
    history h;
    make_history(&h, 0, 4, 0, 0);
    bw__plan_spec spec = make_spec(&c, &h, NULL, 0);
    bw__plan *p;
    char err[256];
    assert_int_equal(bw__plan_new(&spec, 0, true, &p, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__plan_end_step(p, 3), 25);
    assert_int_equal(bw__plan_config(p)->shuffle_algo, BW__SHUFFLE_TORCH);
    bw__plan_free(p);
    /* The configuration is still checked as given. */
    spec.sampler.shuffle = false;
    assert_int_equal(bw__plan_new(&spec, 0, true, &p, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "feistel needs shuffle"));
}

static void expect_refused(const bw__plan_spec *spec, const char *needle)
{
    bw__plan *p = (bw__plan *)1;
    char err[512] = "";
    assert_int_equal(bw__plan_new(spec, 0, false, &p, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_null(p);
    if (!strstr(err, needle))
        fail_msg("'%s' lacks '%s'", err, needle);
}

static void test_refusals(void **state)
{
    (void)state;
    uint64_t counts[] = {4, 0, 6};
    history h;
    make_history(&h, 0, 3, 0, 0);
    bw__sampler_cfg c;
    bw__sampler_cfg_init(&c);
    c.mode = BW__MODE_ITERABLE;
    c.batch_size = 2;
    bw__plan_spec spec = make_spec(&c, &h, counts, 3);
    spec.pre_sharded = true;
    expect_refused(&spec, "source 1 (rank 1's) has no records");
    counts[1] = 1;
    spec.shuffle_sources = true;
    expect_refused(&spec, "cannot be reordered");
    spec.shuffle_sources = false;
    spec.nsources = 2;
    expect_refused(&spec, "its 2 sources do not match world size 3");
    spec.nsources = 3;
    spec.sampler.mode = BW__MODE_TORCH;
    expect_refused(&spec, "double sharding");
    spec.sampler.mode = BW__MODE_ITERABLE;
    /* A pre-sharded epoch keeps its world size. */
    make_history(&h, 0, 3, 1, 3);
    spec.nhistory = h.n;
    expect_refused(&spec, "cannot change its world size inside an epoch");
    make_history(&h, 0, 3, 1, 2);
    expect_refused(&spec, "do not match world size 2");
    spec.pre_sharded = false;
    spec.nsources = 0;
    expect_refused(&spec, "a stream needs 1 to");

    /* The protobuf constructor refuses what job creation refuses. */
    Batchwire__V1__SamplerConfig sc = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    sc.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ITERABLE;
    sc.batch_size = 2;
    Batchwire__V1__Dataset ds = BATCHWIRE__V1__DATASET__INIT;
    Batchwire__V1__JobConfig jc = BATCHWIRE__V1__JOB_CONFIG__INIT;
    jc.sampler = &sc;
    jc.dataset = &ds;
    Batchwire__V1__DatasetInfo info = BATCHWIRE__V1__DATASET_INFO__INIT;
    info.format = "npy";
    info.length = 10;
    make_history(&h, 0, 3, 0, 0);
    bw__plan *p = NULL;
    char err[512];
    assert_int_equal(bw__plan_new_for_job(&jc, &info, h.ptr, h.n, 0, true, &p, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "iterable mode reads streams"));
    sc.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ACCELERATE;
    sc.split_batches = true;
    assert_int_equal(bw__plan_new_for_job(&jc, &info, h.ptr, h.n, 0, true, &p, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "not a multiple of world_size 3"));
    assert_int_equal(bw__plan_new_for_job(&jc, NULL, h.ptr, h.n, 0, true, &p, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "dataset description"));
    assert_null(p);
    bw__plan_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_matches_core),      cmocka_unit_test(test_pre_sharded),
        cmocka_unit_test(test_plain_stream_positions), cmocka_unit_test(test_history),
        cmocka_unit_test(test_counts_only_feistel),    cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
