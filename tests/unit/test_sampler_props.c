/*
 * Property tests of the sampler core over thousands of random configurations:
 *   - with nothing dropped, the ranks' real samples over an epoch are each index once;
 *   - padding is flagged, counted in `real`, and of the expected amount;
 *   - equal batch counts hold (or are flagged) as documented;
 *   - resuming at step K (cursor) equals dropping the first K batches;
 *   - elastic resume (random R0, K0, R1, several resizes) delivers each index exactly once;
 *   - invalid configurations are refused with a message naming the parameter.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "sampler_testutil.h"

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rnd_in(uint64_t lo, uint64_t hi) /* inclusive */
{
    return lo + rnd() % (hi - lo + 1);
}

/* A random configuration that passes bw__sampler_cfg_check. */
static void random_cfg(bw__sampler_cfg *c, uint64_t max_n)
{
    for (;;) {
        bw__sampler_cfg_init(c);
        c->mode = (bw__sampler_mode)rnd_in(0, 2);
        c->num_samples = rnd_in(0, 4) == 0 ? rnd_in(0, 3) : rnd_in(0, max_n);
        c->world_size = rnd_in(1, 9);
        c->batch_size = rnd_in(1, 12);
        c->drop_last = rnd_in(0, 3) == 0;
        if (c->mode != BW__MODE_ITERABLE) {
            c->shuffle = rnd_in(0, 1);
            c->seed = rnd();
            c->epoch = rnd_in(0, 5);
            if (c->shuffle && rnd_in(0, 3) == 0)
                c->shuffle_algo = BW__SHUFFLE_FEISTEL;
        }
        if (c->mode == BW__MODE_TORCH)
            c->sampler_drop_last = rnd_in(0, 3) == 0;
        else
            c->split_batches = rnd_in(0, 2) == 0;
        if (c->mode == BW__MODE_ACCELERATE) {
            c->even_batches = rnd_in(0, 2) != 0;
            c->dispatch_batches = c->even_batches && rnd_in(0, 3) == 0;
            c->shard_single_process = rnd_in(0, 1);
        }
        if (c->split_batches)
            c->batch_size = c->world_size * rnd_in(1, 4);
        if (bw__sampler_cfg_check(c, NULL, 0) == BW_OK)
            return;
    }
}

static bool drops_nothing(const bw__sampler_cfg *c)
{
    return !c->drop_last && !c->sampler_drop_last;
}

typedef struct tally {
    uint32_t *seen; /* real deliveries per index */
    uint64_t real, padding, batches;
} tally;

/* Adds batch `step` of `rank` to t, checking the batch's own invariants. */
static int take(const bw__sampler *s, uint64_t rank, uint64_t step, tally *t, bw__batch *b)
{
    const bw__sampler_cfg *c = bw__sampler_config(s);
    int rc = bw__sampler_batch(s, rank, step, b);
    if (rc != BW_OK)
        return rc;
    size_t real = 0;
    assert_true(b->count >= 1 || c->dispatch_batches); /* a dispatcher's slice may be empty */
    assert_true(b->count <= bw__sampler_max_batch(s));
    for (size_t j = 0; j < b->count; j++) {
        assert_true(b->indices[j] < c->num_samples);
        if (!b->padding[j]) {
            real++;
            t->seen[b->indices[j]]++;
        }
    }
    assert_int_equal(real, b->real);
    t->real += real;
    t->padding += b->count - real;
    t->batches++;
    return BW_OK;
}

static void test_epoch_coverage(void **state)
{
    (void)state;
    rng_state = 1;
    uint64_t *idx = malloc(64 * sizeof(uint64_t));
    uint8_t *pad = malloc(64);
    bw__batch b = {idx, pad, 0, 0};
    char desc[256];
    for (int iter = 0; iter < 4000; iter++) {
        bw__sampler_cfg c;
        random_cfg(&c, 300);
        st_describe(&c, desc, sizeof(desc));
        bw__sampler *s;
        assert_int_equal(bw__sampler_new(&s, &c, NULL, 0), BW_OK);
        assert_true(bw__sampler_max_batch(s) <= 64);
        tally t = {calloc(c.num_samples + 1, sizeof(uint32_t)), 0, 0, 0};
        uint64_t steps0 = bw__sampler_end_step(s, 0);
        bool equal = true;
        for (uint64_t r = 0; r < c.world_size; r++) {
            uint64_t end = bw__sampler_end_step(s, r);
            equal = equal && end == steps0;
            for (uint64_t st = 0; st < end; st++)
                assert_int_equal(take(s, r, st, &t, &b), BW_OK);
            assert_int_equal(bw__sampler_batch(s, r, end, &b), BW_END_OF_EPOCH);
        }
        assert_int_equal(bw__sampler_batch(s, c.world_size, 0, &b), BW_INVALID_ARGUMENT);
        /* Real samples are never repeated; with nothing dropped, each appears once. */
        for (uint64_t i = 0; i < c.num_samples; i++) {
            if (t.seen[i] > 1 || (drops_nothing(&c) && t.seen[i] != 1))
                fail_msg("%s: index %" PRIu64 " delivered %u times", desc, i, t.seen[i]);
        }
        /* Equal batch counts unless accelerate's uneven tail, which is flagged. */
        assert_int_equal(bw__sampler_equal_batches(s), equal);
        if (!equal)
            assert_true(c.mode == BW__MODE_ACCELERATE && !c.even_batches && !c.drop_last);
        /* Padding: exactly what completes the last step. */
        uint64_t want_pad = 0;
        if (c.mode == BW__MODE_TORCH && !c.sampler_drop_last) {
            uint64_t per_rank = c.num_samples / c.world_size + (c.num_samples % c.world_size != 0);
            uint64_t kept = c.drop_last ? per_rank / c.batch_size * c.batch_size : per_rank;
            uint64_t total = kept * c.world_size;
            /* the padded tail positions [n, per_rank * R) of the padded list, if kept */
            for (uint64_t v = c.num_samples; v < per_rank * c.world_size; v++)
                want_pad += v / c.world_size < kept;
            (void)total;
        } else if (c.dispatch_batches && !c.drop_last) {
            /* the leftover m samples in world slices of ceil(m / R), then up to min(R, n)
             * positions from the epoch's start */
            uint64_t g = c.split_batches ? c.batch_size : c.batch_size * c.world_size;
            uint64_t m = c.num_samples % g, R = c.world_size;
            if (m % R) {
                uint64_t room = R * (m / R + 1), ext = m + (c.num_samples < R ? c.num_samples : R);
                want_pad = (room < ext ? room : ext) - m;
            }
        } else if (c.mode != BW__MODE_TORCH && !c.drop_last && c.even_batches &&
                   !(c.mode == BW__MODE_ACCELERATE && c.world_size == 1 &&
                     !c.shard_single_process)) {
            uint64_t g = c.split_batches ? c.batch_size : c.batch_size * c.world_size;
            want_pad = steps0 * g - c.num_samples;
        }
        if (t.padding != want_pad)
            fail_msg("%s: %" PRIu64 " padding samples, want %" PRIu64, desc, t.padding, want_pad);
        free(t.seen);
        bw__sampler_free(s);
    }
    free(idx);
    free(pad);
}

static void test_skip_equals_drop_first(void **state)
{
    (void)state;
    rng_state = 2;
    uint64_t ia[64], ib[64];
    uint8_t pa[64], pb[64];
    bw__batch a = {ia, pa, 0, 0}, b = {ib, pb, 0, 0};
    for (int iter = 0; iter < 2000; iter++) {
        bw__sampler_cfg c;
        random_cfg(&c, 200);
        bw__sampler *s1, *s2;
        assert_int_equal(bw__sampler_new(&s1, &c, NULL, 0), BW_OK);
        assert_int_equal(bw__sampler_new(&s2, &c, NULL, 0), BW_OK);
        uint64_t r = rnd_in(0, c.world_size - 1), end = bw__sampler_end_step(s1, r);
        uint64_t k = rnd_in(0, end + 2);
        /* Replay: iterate from 0 and throw away the first k batches. */
        bw__sampler_cursor replay = {c.epoch, 0}, resume = {c.epoch, k};
        for (uint64_t i = 0; i < k && i < end; i++)
            assert_int_equal(bw__sampler_next(s1, r, &replay, &a), BW_OK);
        if (k > end)
            replay.step = k;
        for (;;) {
            int rc1 = bw__sampler_next(s1, r, &replay, &a);
            int rc2 = bw__sampler_next(s2, r, &resume, &b);
            assert_int_equal(rc1, rc2);
            if (rc1 != BW_OK)
                break;
            assert_int_equal(a.count, b.count);
            assert_int_equal(a.real, b.real);
            assert_memory_equal(ia, ib, a.count * sizeof(uint64_t));
            assert_memory_equal(pa, pb, a.count);
        }
        assert_int_equal(resume.step, k > end ? k : end);
        bw__sampler_cursor wrong = {c.epoch + 1, 0};
        assert_int_equal(bw__sampler_next(s2, r, &wrong, &b), BW_MISMATCH);
        bw__sampler_free(s1);
        bw__sampler_free(s2);
    }
}

static uint64_t random_world(const bw__sampler_cfg *c)
{
    for (;;) {
        uint64_t w = rnd_in(1, 9);
        if (!c->split_batches || c->batch_size % w == 0)
            return w;
    }
}

static void test_elastic_resume(void **state)
{
    (void)state;
    rng_state = 3;
    uint64_t idx[64];
    uint8_t pad[64];
    bw__batch b = {idx, pad, 0, 0};
    char desc[256], err[256];
    for (int iter = 0; iter < 3000; iter++) {
        bw__sampler_cfg c;
        random_cfg(&c, 300);
        st_describe(&c, desc, sizeof(desc));
        bw__sampler *s;
        assert_int_equal(bw__sampler_new(&s, &c, NULL, 0), BW_OK);
        /* The epoch runs some steps at each of several world sizes. */
        uint64_t firsts[8], worlds[8];
        size_t nseg = 1;
        firsts[0] = 0;
        worlds[0] = c.world_size;
        size_t resizes = rnd_in(1, 4);
        for (size_t i = 0; i < resizes; i++) {
            uint64_t first = bw__sampler_first_step(s);
            uint64_t w = bw__sampler_world_size(s);
            uint64_t lo = bw__sampler_end_step(s, w - 1), hi = bw__sampler_end_step(s, 0);
            uint64_t at = rnd_in(0, 5) == 0 ? hi : rnd_in(first, lo);
            uint64_t nw = random_world(&c);
            if (bw__sampler_resize(s, at, nw, err, sizeof(err)) != BW_OK)
                fail_msg("%s: resize at %" PRIu64 " to %" PRIu64 ": %s", desc, at, nw, err);
            if (at == firsts[nseg - 1]) {
                worlds[nseg - 1] = nw;
            } else {
                firsts[nseg] = at;
                worlds[nseg] = nw;
                nseg++;
            }
            assert_int_equal(bw__sampler_world_size(s), nw);
            assert_int_equal(bw__sampler_first_step(s), at);
        }
        /* Refusals leave the sampler unchanged. */
        uint64_t w = bw__sampler_world_size(s);
        assert_int_equal(
            bw__sampler_resize(s, bw__sampler_first_step(s) ? 0 : UINT64_MAX, 1, err, sizeof(err)),
            BW_INVALID_ARGUMENT);
        assert_non_null(strstr(err, "resume_from_step"));
        assert_int_equal(bw__sampler_world_size(s), w);

        tally t = {calloc(c.num_samples + 1, sizeof(uint32_t)), 0, 0, 0};
        for (size_t i = 0; i < nseg; i++) {
            uint64_t stop = i + 1 < nseg ? firsts[i + 1] : UINT64_MAX;
            for (uint64_t r = 0; r < worlds[i]; r++)
                for (uint64_t st = firsts[i]; st < stop; st++)
                    if (take(s, r, st, &t, &b) != BW_OK)
                        break;
            /* A rank beyond this segment's world size has no batches in it. */
            assert_int_equal(bw__sampler_batch(s, worlds[i], firsts[i], &b), BW_INVALID_ARGUMENT);
        }
        for (uint64_t i = 0; i < c.num_samples; i++)
            if (t.seen[i] > 1 || (drops_nothing(&c) && t.seen[i] != 1))
                fail_msg("%s, %zu segments: index %" PRIu64 " delivered %u times", desc, nseg, i,
                         t.seen[i]);
        free(t.seen);
        bw__sampler_free(s);
    }
}

static void test_set_epoch(void **state)
{
    (void)state;
    bw__sampler_cfg c;
    bw__sampler_cfg_init(&c);
    c.num_samples = 50;
    c.world_size = 2;
    c.batch_size = 4;
    c.shuffle = true;
    c.seed = 9;
    bw__sampler *s, *t;
    assert_int_equal(bw__sampler_new(&s, &c, NULL, 0), BW_OK);
    assert_int_equal(bw__sampler_resize(s, 2, 3, NULL, 0), BW_OK);
    assert_int_equal(bw__sampler_set_epoch(s, 4, NULL, 0), BW_OK);
    assert_int_equal(bw__sampler_world_size(s), 2); /* resizes are per epoch */
    c.epoch = 4;
    assert_int_equal(bw__sampler_new(&t, &c, NULL, 0), BW_OK);
    uint64_t ia[4], ib[4];
    bw__batch a = {ia, NULL, 0, 0}, b = {ib, NULL, 0, 0};
    for (uint64_t st = 0; st < bw__sampler_end_step(s, 0); st++) {
        assert_int_equal(bw__sampler_batch(s, 1, st, &a), BW_OK);
        assert_int_equal(bw__sampler_batch(t, 1, st, &b), BW_OK);
        assert_memory_equal(ia, ib, a.count * sizeof(uint64_t));
    }
    bw__sampler_free(s);
    bw__sampler_free(t);
    bw__sampler_free(NULL);
}

static void test_refusals_name_the_parameter(void **state)
{
    (void)state;
    char err[256];
    bw__sampler_cfg c;
#define REFUSE(setup, word)                                                                        \
    do {                                                                                           \
        bw__sampler_cfg_init(&c);                                                                  \
        c.num_samples = 10;                                                                        \
        c.world_size = 2;                                                                          \
        c.batch_size = 4;                                                                          \
        setup;                                                                                     \
        err[0] = 0;                                                                                \
        assert_int_equal(bw__sampler_cfg_check(&c, err, sizeof(err)), BW_INVALID_ARGUMENT);        \
        if (!strstr(err, word))                                                                    \
            fail_msg("message \"%s\" does not name %s", err, word);                                \
        bw__sampler *s = (bw__sampler *)&c;                                                        \
        assert_int_equal(bw__sampler_new(&s, &c, err, sizeof(err)), BW_INVALID_ARGUMENT);          \
        assert_null(s);                                                                            \
    } while (0)
    REFUSE(c.world_size = 0, "world_size");
    REFUSE(c.batch_size = 0, "batch_size");
    REFUSE((c.mode = BW__MODE_ACCELERATE, c.split_batches = true, c.batch_size = 5),
           "split_batches: batch_size 5 is not a multiple of world_size 2");
    REFUSE((c.mode = BW__MODE_ITERABLE, c.split_batches = true, c.batch_size = 1), "batch_size");
    REFUSE(c.split_batches = true, "split_batches");
    REFUSE(c.even_batches = false, "even_batches");
    REFUSE((c.mode = BW__MODE_ITERABLE, c.even_batches = false), "even_batches");
    REFUSE((c.mode = BW__MODE_ACCELERATE, c.sampler_drop_last = true), "sampler_drop_last");
    REFUSE((c.mode = BW__MODE_ITERABLE, c.shuffle = true), "shuffle");
    REFUSE((c.mode = BW__MODE_ACCELERATE, c.shuffle = true, c.num_samples = 0), "num_samples");
    REFUSE(c.shuffle_algo = BW__SHUFFLE_FEISTEL, "feistel");
    REFUSE(c.num_samples = UINT64_MAX, "num_samples");
    REFUSE(c.dispatch_batches = true, "dispatch_batches");
    REFUSE((c.mode = BW__MODE_ACCELERATE, c.dispatch_batches = true, c.even_batches = false),
           "even_batches");
    /* Elastic: split_batches needs the new world size to divide the batch too. */
    bw__sampler_cfg_init(&c);
    c.mode = BW__MODE_ACCELERATE;
    c.num_samples = 100;
    c.world_size = 2;
    c.batch_size = 4;
    c.split_batches = true;
    bw__sampler *s;
    assert_int_equal(bw__sampler_new(&s, &c, NULL, 0), BW_OK);
    assert_int_equal(bw__sampler_resize(s, 3, 3, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "world_size 3"));
    assert_int_equal(bw__sampler_resize(s, 3, 0, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_int_equal(bw__sampler_resize(s, 26, 4, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "resume_from_step 26"));
    assert_int_equal(bw__sampler_resize(s, 25, 4, err, sizeof(err)), BW_OK); /* epoch end */
    assert_int_equal(bw__sampler_end_step(s, 0), 25);
    bw__sampler_free(s);
    assert_int_equal(bw__sampler_mode_parse("accelerate"), BW__MODE_ACCELERATE);
    assert_int_equal(bw__sampler_mode_parse("tf"), -1);
    assert_int_equal(bw__shuffle_algo_parse("feistel"), BW__SHUFFLE_FEISTEL);
    assert_int_equal(bw__shuffle_algo_parse(NULL), -1);
}

static void test_examples(void **state)
{
    (void)state;
    /* DESIGN §3.2: with one rank accelerate still pads: [0,1,2] [3,4,5] [6,0,1]. */
    bw__sampler_cfg c;
    bw__sampler_cfg_init(&c);
    c.mode = BW__MODE_ACCELERATE;
    c.num_samples = 7;
    c.batch_size = 3;
    bw__sampler *s;
    assert_int_equal(bw__sampler_new(&s, &c, NULL, 0), BW_OK);
    uint64_t idx[3];
    uint8_t pad[3];
    bw__batch b = {idx, pad, 0, 0};
    assert_int_equal(bw__sampler_batch(s, 0, 2, &b), BW_OK);
    assert_int_equal(b.count, 3);
    assert_int_equal(b.real, 1);
    assert_int_equal(idx[0], 6);
    assert_int_equal(idx[1], 0);
    assert_int_equal(idx[2], 1);
    assert_int_equal(pad[0], 0);
    assert_int_equal(pad[1], 1);
    assert_int_equal(pad[2], 1);
    bw__sampler_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_epoch_coverage),
        cmocka_unit_test(test_skip_equals_drop_first),
        cmocka_unit_test(test_elastic_resume),
        cmocka_unit_test(test_set_epoch),
        cmocka_unit_test(test_refusals_name_the_parameter),
        cmocka_unit_test(test_examples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
