/*
 * Accelerate parity of the sampler core: every record of the shared golden vectors
 * (tests/data/golden/, copied from ../shared/golden/) — BatchSamplerShard sequential and
 * seedable, SkipBatchSampler (resume by skipping) and IterableDatasetShard — batches, order,
 * lengths and errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "sampler/randperm.h"
#include "sampler_testutil.h"

#ifndef BW_SHARED_GOLDEN_DIR
#define BW_SHARED_GOLDEN_DIR BW_TEST_DATA_DIR "/golden"
#endif

typedef struct counts {
    long ok, errors;
} counts;

static void cfg_from_record(const sj *rec, bw__sampler_cfg *cfg)
{
    bw__sampler_cfg_init(cfg);
    const char *type = sj_string(rec, "type");
    cfg->mode = !strcmp(type, "iterable_dataset_shard") ? BW__MODE_ITERABLE : BW__MODE_ACCELERATE;
    cfg->num_samples = sj_u64(rec, "n");
    cfg->world_size = sj_u64(rec, "num_processes");
    cfg->batch_size = sj_u64(rec, "batch_size");
    cfg->drop_last = sj_bool(rec, "drop_last");
    cfg->split_batches = sj_bool(rec, "split_batches");
    if (cfg->mode == BW__MODE_ACCELERATE) {
        cfg->even_batches = sj_bool(rec, "even_batches");
        const char *sampler = sj_string(rec, "sampler");
        cfg->shuffle = sampler && !strcmp(sampler, "seedable");
        cfg->seed = sj_u64(rec, "seed");
        cfg->epoch = sj_u64(rec, "epoch");
        const char *inner = sj_string(rec, "inner");
        if (inner && !strcmp(inner, "batch_sampler")) {
            /* SkipBatchSampler over the plain BatchSampler: one rank, no padding. */
            assert_int_equal(cfg->world_size, 1);
            cfg->split_batches = false;
            cfg->even_batches = false;
        }
    }
}

/* A record the reference refused must be refused, with a message naming the same
 * parameter. */
static void expect_refused(const bw__sampler_cfg *cfg, const char *ref_msg)
{
    char err[256] = "", desc[256];
    st_describe(cfg, desc, sizeof(desc));
    if (bw__sampler_cfg_check(cfg, err, sizeof(err)) != BW_INVALID_ARGUMENT)
        fail_msg("%s: accepted, but the reference raised: %s", desc, ref_msg);
    if (strstr(ref_msg, "split_batches"))
        assert_non_null(strstr(err, "split_batches"));
    if (strstr(ref_msg, "num_samples"))
        assert_non_null(strstr(err, "num_samples"));
    if (strstr(ref_msg, "batch_size"))
        assert_non_null(strstr(err, "batch_size"));
}

static void check_shard_record(const sj *rec, void *user)
{
    counts *c = user;
    bw__sampler_cfg cfg;
    cfg_from_record(rec, &cfg);
    const sj *error = sj_get(rec, "error");
    if (error) {
        expect_refused(&cfg, sj_string(error, "message"));
        c->errors++;
        return;
    }
    char err[256] = "";
    bw__sampler *s;
    int rc = bw__sampler_new(&s, &cfg, err, sizeof(err));
    if (rc != BW_OK)
        fail_msg("refused a record the reference accepts: %s", err);

    uint64_t n = cfg.num_samples, B = cfg.batch_size;
    uint64_t base_len = cfg.drop_last ? n / B : n / B + (n % B != 0);
    bool skip_rec = sj_get(rec, "skip") != NULL;
    uint64_t skip = sj_u64(rec, "skip");
    if (!skip_rec)
        assert_int_equal(sj_u64(rec, "total_length"), base_len);

    const sj *order = sj_get(rec, "base_order");
    if (order) {
        uint64_t *p = malloc((n ? n : 1) * sizeof(uint64_t));
        bw__randperm_u64(p, n, cfg.seed + cfg.epoch, BW__RANDPERM_AUTO);
        assert_int_equal(order->n, n);
        for (uint64_t i = 0; i < n; i++)
            assert_int_equal(p[i], order->items[i].u);
        free(p);
    }

    const sj *per_rank = sj_get(rec, "per_rank");
    assert_int_equal(per_rank->n, cfg.world_size);
    bool equal = true;
    for (uint64_t r = 0; r < cfg.world_size; r++) {
        const sj *pr = &per_rank->items[r];
        assert_true(st_rank_matches(s, r, skip, sj_get(pr, "batches")));
        int64_t want_len = (int64_t)sj_u64(pr, "len");
        int64_t len = (int64_t)bw__sampler_reference_len(&cfg, r) - (int64_t)skip;
        if (len != want_len)
            fail_msg("len rank %" PRIu64 ": %" PRId64 " want %" PRId64, r, len, want_len);
        if (skip_rec) /* SkipBatchSampler.total_length is len() of the shard it wraps */
            assert_int_equal(sj_u64(pr, "total_length"), bw__sampler_reference_len(&cfg, r));
        equal = equal && bw__sampler_end_step(s, r) == bw__sampler_end_step(s, 0);
    }
    /* The metadata flag reports exactly when the reference's ranks differ. */
    assert_int_equal(bw__sampler_equal_batches(s), equal);
    if (cfg.even_batches || cfg.drop_last)
        assert_true(equal);
    bw__sampler_free(s);
    c->ok++;
}

static void check_iterable_record(const sj *rec, void *user)
{
    counts *c = user;
    bw__sampler_cfg cfg;
    cfg_from_record(rec, &cfg);
    const sj *error = sj_get(rec, "error");
    if (error) {
        expect_refused(&cfg, sj_string(error, "message"));
        c->errors++;
        return;
    }
    const sj *per_rank = sj_get(rec, "per_rank");
    assert_int_equal(per_rank->n, cfg.world_size);
    for (uint64_t r = 0; r < cfg.world_size; r++)
        assert_int_equal(bw__sampler_reference_len(&cfg, r), sj_u64(&per_rank->items[r], "len"));
    const sj *loader_error = sj_get(&per_rank->items[0], "loader_error");
    if (loader_error) {
        /* Per-rank batch size 0: the reference yields nothing and its DataLoader raises;
         * batchwire refuses the configuration up front. */
        for (uint64_t r = 0; r < cfg.world_size; r++)
            assert_int_equal(sj_get(&per_rank->items[r], "elements")->n, 0);
        expect_refused(&cfg, "split_batches batch_size");
        c->errors++;
        return;
    }
    char err[256] = "";
    bw__sampler *s;
    if (bw__sampler_new(&s, &cfg, err, sizeof(err)) != BW_OK)
        fail_msg("refused a record the reference accepts: %s", err);
    assert_true(bw__sampler_equal_batches(s));
    for (uint64_t r = 0; r < cfg.world_size; r++) {
        const sj *pr = &per_rank->items[r];
        const sj *batches = sj_get(pr, "loader_batches");
        assert_true(st_rank_matches(s, r, 0, batches));
        /* The shard's elements are the loader's batches, concatenated. */
        const sj *elements = sj_get(pr, "elements");
        size_t k = 0;
        for (size_t i = 0; i < batches->n; i++)
            for (size_t j = 0; j < batches->items[i].n; j++, k++)
                assert_int_equal(batches->items[i].items[j].u, elements->items[k].u);
        assert_int_equal(k, elements->n);
    }
    bw__sampler_free(s);
    c->ok++;
}

static void run_file(const char *name, void (*fn)(const sj *, void *), long min_ok, long min_err)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", BW_SHARED_GOLDEN_DIR, name);
    counts c = {0, 0};
    long n = sj_each_line(path, fn, &c);
    if (n < 0)
        fail_msg("cannot read %s", path);
    print_message("%s: %ld records, %ld matched, %ld refused as the reference does\n", name, n,
                  c.ok, c.errors);
    assert_int_equal(c.ok + c.errors, n);
    assert_true(c.ok >= min_ok);
    assert_true(c.errors >= min_err);
}

static void test_batch_sampler_shard(void **state)
{
    (void)state;
    run_file("batch_sampler_shard.public.jsonl", check_shard_record, 300, 100);
}

static void test_batch_sampler_shard_seedable(void **state)
{
    (void)state;
    run_file("batch_sampler_shard_seedable.public.jsonl", check_shard_record, 1000, 500);
}

static void test_skip_batch_sampler(void **state)
{
    (void)state;
    run_file("skip_batch_sampler.public.jsonl", check_shard_record, 300, 100);
}

static void test_skip_batch_sampler_seedable(void **state)
{
    (void)state;
    run_file("skip_batch_sampler_seedable.public.jsonl", check_shard_record, 600, 300);
}

static void test_iterable_dataset_shard(void **state)
{
    (void)state;
    run_file("iterable_dataset_shard.public.jsonl", check_iterable_record, 150, 40);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_sampler_shard),
        cmocka_unit_test(test_batch_sampler_shard_seedable),
        cmocka_unit_test(test_skip_batch_sampler),
        cmocka_unit_test(test_skip_batch_sampler_seedable),
        cmocka_unit_test(test_iterable_dataset_shard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
