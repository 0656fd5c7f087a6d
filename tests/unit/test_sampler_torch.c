/*
 * PyTorch parity of the sampler core: the CPU generator, randperm (both algorithms) and
 * torch mode (DistributedSampler + DataLoader), against vectors generated from Debian's
 * python3-torch by tests/golden/gen_torch_vectors.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "sampler/feistel.h"
#include "sampler/randperm.h"
#include "sampler/torch_rng.h"
#include "sampler_testutil.h"

static uint64_t fnv1a64(const uint64_t *v, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++)
        for (int k = 0; k < 8; k++) {
            h ^= (v[i] >> (8 * k)) & 0xff;
            h *= 0x100000001b3ull;
        }
    return h;
}

static void test_mt19937_reference(void **state)
{
    (void)state;
    /* std::mt19937 with the default seed 5489: the 10000th output is 4123659995. */
    bw__torch_rng g;
    bw__torch_rng_seed(&g, 5489);
    assert_int_equal(bw__torch_rng_random(&g), 3499211612u);
    for (int i = 1; i < 9999; i++)
        bw__torch_rng_random(&g);
    assert_int_equal(bw__torch_rng_random(&g), 4123659995u);
    /* Only the low 32 bits of the seed count. */
    bw__torch_rng a, b;
    bw__torch_rng_seed(&a, 7);
    bw__torch_rng_seed(&b, 7 + (5ull << 32));
    assert_int_equal(bw__torch_rng_random64(&a), bw__torch_rng_random64(&b));
}

static void test_randperm_algo_threshold(void **state)
{
    (void)state;
    assert_int_equal(bw__randperm_algo_for(0), BW__RANDPERM_SWAP);
    assert_int_equal(bw__randperm_algo_for(214748363), BW__RANDPERM_SWAP);
    assert_int_equal(bw__randperm_algo_for(214748364), BW__RANDPERM_INSIDE_OUT);
    assert_int_equal(bw__randperm_algo_for(UINT64_MAX), BW__RANDPERM_INSIDE_OUT);
}

typedef struct perm_ctx {
    bw__randperm_algo algo;
    long checked;
} perm_ctx;

static void check_perm_record(const sj *rec, void *user)
{
    perm_ctx *ctx = user;
    uint64_t n = sj_u64(rec, "n"), seed = sj_u64(rec, "seed");
    uint64_t *p64 = malloc((n ? n : 1) * sizeof(uint64_t));
    uint32_t *p32 = malloc((n ? n : 1) * sizeof(uint32_t));
    bw__randperm_u64(p64, n, seed, ctx->algo);
    bw__randperm_u32(p32, n, seed, ctx->algo);
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(p32[i], p64[i]);
    const sj *perm = sj_get(rec, "perm");
    if (perm) {
        assert_int_equal(perm->n, n);
        for (uint64_t i = 0; i < n; i++)
            if (p64[i] != perm->items[i].u)
                fail_msg("randperm n=%" PRIu64 " seed=%" PRIu64 " algo=%d: r[%" PRIu64 "]=%" PRIu64
                         " want %" PRIu64,
                         n, seed, ctx->algo, i, p64[i], perm->items[i].u);
    } else {
        const sj *prefix = sj_get(rec, "prefix");
        for (size_t i = 0; i < prefix->n; i++)
            assert_int_equal(p64[i], prefix->items[i].u);
        if (fnv1a64(p64, n) != sj_u64(rec, "fnv1a64"))
            fail_msg("randperm n=%" PRIu64 " seed=%" PRIu64 ": digest differs", n, seed);
    }
    free(p64);
    free(p32);
    ctx->checked++;
}

static void test_randperm_vs_torch(void **state)
{
    (void)state;
    perm_ctx ctx = {BW__RANDPERM_AUTO, 0};
    long n = sj_each_line(BW_TEST_DATA_DIR "/torch/randperm.jsonl", check_perm_record, &ctx);
    assert_true(n > 200);
    assert_int_equal(ctx.checked, n);
}

static void test_randperm_inside_out(void **state)
{
    (void)state;
    perm_ctx ctx = {BW__RANDPERM_INSIDE_OUT, 0};
    long n =
        sj_each_line(BW_TEST_DATA_DIR "/torch/randperm_large_algo.jsonl", check_perm_record, &ctx);
    assert_true(n > 100);
    assert_int_equal(ctx.checked, n);
}

static void check_distributed_record(const sj *rec, void *user)
{
    long *checked = user;
    bw__sampler_cfg cfg;
    bw__sampler_cfg_init(&cfg);
    cfg.mode = BW__MODE_TORCH;
    cfg.num_samples = sj_u64(rec, "n");
    cfg.world_size = sj_u64(rec, "world_size");
    cfg.batch_size = sj_u64(rec, "batch_size");
    cfg.sampler_drop_last = sj_bool(rec, "sampler_drop_last");
    cfg.drop_last = sj_bool(rec, "drop_last");
    cfg.shuffle = sj_bool(rec, "shuffle");
    cfg.seed = sj_u64(rec, "seed");
    cfg.epoch = sj_u64(rec, "epoch");
    bw__sampler *s;
    char err[256];
    assert_int_equal(bw__sampler_new(&s, &cfg, err, sizeof(err)), BW_OK);
    assert_true(bw__sampler_equal_batches(s));
    const sj *per_rank = sj_get(rec, "per_rank");
    assert_int_equal(per_rank->n, cfg.world_size);
    for (uint64_t r = 0; r < cfg.world_size; r++) {
        const sj *pr = &per_rank->items[r];
        assert_true(st_rank_matches(s, r, 0, sj_get(pr, "batches")));
        assert_int_equal(bw__sampler_reference_len(&cfg, r), sj_u64(pr, "len"));
    }
    bw__sampler_free(s);
    (*checked)++;
}

static void test_distributed_vs_torch(void **state)
{
    (void)state;
    long checked = 0;
    long n = sj_each_line(BW_TEST_DATA_DIR "/torch/distributed.jsonl", check_distributed_record,
                          &checked);
    assert_true(n > 1000);
    assert_int_equal(checked, n);
}

static void test_feistel_bijection(void **state)
{
    (void)state;
    uint64_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 100, 1000, 4097, 65536, 100003};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        uint64_t n = sizes[k];
        uint8_t *seen = calloc(n, 1);
        for (uint64_t key = 0; key < 3; key++) {
            bw__feistel f;
            bw__feistel_init(&f, n, key * 0x9e3779b97f4a7c15ull);
            memset(seen, 0, n);
            uint64_t fixed = 0;
            for (uint64_t i = 0; i < n; i++) {
                uint64_t x = bw__feistel_at(&f, i);
                assert_true(x < n);
                assert_false(seen[x]);
                seen[x] = 1;
                fixed += x == i;
            }
            if (n >= 100)
                assert_true(fixed < n / 10); /* it shuffles */
        }
        free(seen);
    }
    /* Huge n: values stay in range and distinct on a sample (no O(n) memory needed). */
    bw__feistel f;
    bw__feistel_init(&f, 5000000000000ull, 42);
    uint64_t prev = UINT64_MAX;
    for (uint64_t i = 0; i < 1000; i++) {
        uint64_t x = bw__feistel_at(&f, i * 4999999999ull);
        assert_true(x < 5000000000000ull);
        assert_true(x != prev);
        prev = x;
    }
}

static void test_feistel_not_torch(void **state)
{
    (void)state;
    /* feistel is documented as a different order from randperm for the same seed. */
    bw__sampler_cfg cfg;
    bw__sampler_cfg_init(&cfg);
    cfg.num_samples = 1000;
    cfg.batch_size = 1000;
    cfg.shuffle = true;
    cfg.seed = 3;
    bw__sampler *a, *b;
    assert_int_equal(bw__sampler_new(&a, &cfg, NULL, 0), BW_OK);
    cfg.shuffle_algo = BW__SHUFFLE_FEISTEL;
    assert_int_equal(bw__sampler_new(&b, &cfg, NULL, 0), BW_OK);
    uint64_t ia[1000], ib[1000];
    bw__batch ba = {ia, NULL, 0, 0}, bb = {ib, NULL, 0, 0};
    assert_int_equal(bw__sampler_batch(a, 0, 0, &ba), BW_OK);
    assert_int_equal(bw__sampler_batch(b, 0, 0, &bb), BW_OK);
    assert_int_equal(ba.count, 1000);
    assert_int_equal(bb.count, 1000);
    assert_memory_not_equal(ia, ib, sizeof(ia));
    assert_true(bw__sampler_memory(b) < 4096);
    bw__sampler_free(a);
    bw__sampler_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mt19937_reference),    cmocka_unit_test(test_randperm_algo_threshold),
        cmocka_unit_test(test_randperm_vs_torch),    cmocka_unit_test(test_randperm_inside_out),
        cmocka_unit_test(test_distributed_vs_torch), cmocka_unit_test(test_feistel_bijection),
        cmocka_unit_test(test_feistel_not_torch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
