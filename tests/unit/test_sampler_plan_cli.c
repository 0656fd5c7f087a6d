/*
 * `batchwire plan` (client/cli/cmd_plan.c, linked from bwcli to run it in-process): its output
 * contract (one JSON line per batch, ranks then steps ascending, step numbered from the epoch
 * start, real and padding) agrees with the sampler core, and invalid combinations exit 2
 * with a message naming the parameter.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/cli/commands.h"
#include "sampler_testutil.h"

typedef struct plan_result {
    int status;
    char *out, *err;
} plan_result;

static char *read_all(FILE *f)
{
    fflush(f);
    long len = ftell(f);
    char *buf = malloc((size_t)len + 1);
    rewind(f);
    size_t got = fread(buf, 1, (size_t)len, f);
    buf[got] = 0;
    fclose(f);
    return buf;
}

/* Runs bw__cmd_plan with a NULL-terminated argument list, capturing stdout and stderr. */
static plan_result run_plan(const char *first, ...)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"plan";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;

    FILE *o = tmpfile(), *e = tmpfile();
    assert_non_null(o);
    assert_non_null(e);
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(1), saved_err = dup(2);
    dup2(fileno(o), 1);
    dup2(fileno(e), 2);
    plan_result r;
    r.status = bw__cmd_plan(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    fseek(o, 0, SEEK_END);
    fseek(e, 0, SEEK_END);
    r.out = read_all(o);
    r.err = read_all(e);
    return r;
}

static void free_result(plan_result *r)
{
    free(r->out);
    free(r->err);
}

static void test_design_example(void **state)
{
    (void)state;
    /* One process: prepare_data_loader's plain BatchSampler (a short last batch), or with
     * --pad-single-process BatchSamplerShard's padding. */
    plan_result r = run_plan("--mode", "accelerate", "--num-samples", "7", "--world-size", "1",
                             "--batch-size", "3", NULL);
    assert_int_equal(r.status, 0);
    assert_string_equal(
        r.out, "{\"rank\":0,\"step\":0,\"indices\":[0,1,2],\"real\":3,\"padding\":[0,0,0]}\n"
               "{\"rank\":0,\"step\":1,\"indices\":[3,4,5],\"real\":3,\"padding\":[0,0,0]}\n"
               "{\"rank\":0,\"step\":2,\"indices\":[6],\"real\":1,\"padding\":[0]}\n");
    free_result(&r);
    r = run_plan("--mode", "accelerate", "--num-samples", "7", "--world-size", "1", "--batch-size",
                 "3", "--pad-single-process", NULL);
    assert_int_equal(r.status, 0);
    assert_string_equal(
        r.out, "{\"rank\":0,\"step\":0,\"indices\":[0,1,2],\"real\":3,\"padding\":[0,0,0]}\n"
               "{\"rank\":0,\"step\":1,\"indices\":[3,4,5],\"real\":3,\"padding\":[0,0,0]}\n"
               "{\"rank\":0,\"step\":2,\"indices\":[6,0,1],\"real\":1,\"padding\":[0,1,1]}\n");
    free_result(&r);
    /* DataLoaderDispatcher: the last global batch of 2 samples sliced over 3 ranks, padded
     * from the epoch's start. */
    r = run_plan("--mode", "accelerate", "--num-samples", "10", "--world-size", "3", "--batch-size",
                 "4", "--dispatch-batches", "--rank", "2", NULL);
    assert_int_equal(r.status, 0);
    assert_string_equal(
        r.out, "{\"rank\":2,\"step\":0,\"indices\":[8,9,0,1],\"real\":2,\"padding\":[0,0,1,1]}\n");
    free_result(&r);
}

/* Compares every output line with the core's answer for the same configuration. */
static void check_against_core(const bw__sampler *s, const char *out, uint64_t skip,
                               int64_t only_rank)
{
    uint64_t world = bw__sampler_world_size(s);
    uint64_t idx[64];
    uint8_t pad[64];
    bw__batch b = {idx, pad, 0, 0};
    const char *line = out;
    uint64_t start = bw__sampler_first_step(s) > skip ? bw__sampler_first_step(s) : skip;
    for (uint64_t r = 0; r < world; r++) {
        if (only_rank >= 0 && (uint64_t)only_rank != r)
            continue;
        for (uint64_t st = start; st < bw__sampler_end_step(s, r); st++) {
            assert_int_equal(bw__sampler_batch(s, r, st, &b), BW_OK);
            const char *nl = strchr(line, '\n');
            assert_non_null(nl);
            sj *rec = sj_parse(line);
            assert_non_null(rec);
            assert_int_equal(sj_u64(rec, "rank"), r);
            assert_int_equal(sj_u64(rec, "step"), st);
            assert_int_equal(sj_u64(rec, "real"), b.real);
            const sj *ind = sj_get(rec, "indices"), *pd = sj_get(rec, "padding");
            assert_int_equal(ind->n, b.count);
            assert_int_equal(pd->n, b.count);
            for (size_t j = 0; j < b.count; j++) {
                assert_int_equal(ind->items[j].u, idx[j]);
                assert_int_equal(pd->items[j].u, pad[j]);
            }
            sj_free(rec);
            line = nl + 1;
        }
    }
    assert_string_equal(line, ""); /* nothing more */
}

static uint64_t rs = 11;
static uint64_t rnd_below(uint64_t n)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (rs >> 33) % n;
}

static void test_random_plans_match_core(void **state)
{
    (void)state;
    int checked = 0;
    for (int iter = 0; iter < 300; iter++) {
        char n[24], R[24], B[24], seed[24], epoch[24], skip[24], rank[24], R0[24], K0[24];
        const char *modes[] = {"torch", "accelerate", "iterable"};
        bw__sampler_cfg c;
        bw__sampler_cfg_init(&c);
        c.mode = (bw__sampler_mode)rnd_below(3);
        c.num_samples = rnd_below(120);
        c.world_size = 1 + rnd_below(5);
        c.batch_size = 1 + rnd_below(6);
        c.shuffle = c.mode != BW__MODE_ITERABLE && rnd_below(2);
        c.seed = rnd_below(1000) - 500; /* negative seeds too */
        c.epoch = rnd_below(3);
        c.drop_last = rnd_below(4) == 0;
        c.sampler_drop_last = c.mode == BW__MODE_TORCH && rnd_below(4) == 0;
        c.split_batches = c.mode != BW__MODE_TORCH && rnd_below(3) == 0;
        c.even_batches = c.mode != BW__MODE_ACCELERATE || rnd_below(3) != 0;
        if (c.split_batches)
            c.batch_size = c.world_size * (1 + rnd_below(3));
        if (c.shuffle && rnd_below(4) == 0)
            c.shuffle_algo = BW__SHUFFLE_FEISTEL;
        c.dispatch_batches = c.mode == BW__MODE_ACCELERATE && c.even_batches && rnd_below(3) == 0;
        c.shard_single_process = rnd_below(2);
        if (bw__sampler_cfg_check(&c, NULL, 0) != BW_OK)
            continue;
        bw__sampler *s;
        assert_int_equal(bw__sampler_new(&s, &c, NULL, 0), BW_OK);
        /* Sometimes an elastic resume from a random earlier world size. */
        uint64_t final_world = c.world_size, k0 = 0;
        bool resume = rnd_below(3) == 0;
        if (resume) {
            k0 = rnd_below(bw__sampler_end_step(s, c.world_size - 1) + 1);
            final_world = 1 + rnd_below(5);
            if (c.split_batches)
                final_world = c.world_size; /* keep B % R == 0 */
            assert_int_equal(bw__sampler_resize(s, k0, final_world, NULL, 0), BW_OK);
        }
        uint64_t sk = rnd_below(4) == 0 ? rnd_below(5) : 0;
        int64_t only = rnd_below(3) == 0 ? (int64_t)rnd_below(final_world) : -1;
        snprintf(n, sizeof(n), "%" PRIu64, c.num_samples);
        snprintf(R, sizeof(R), "%" PRIu64, final_world);
        snprintf(B, sizeof(B), "%" PRIu64, c.batch_size);
        snprintf(seed, sizeof(seed), "%" PRId64, (int64_t)c.seed);
        snprintf(epoch, sizeof(epoch), "%" PRIu64, c.epoch);
        snprintf(skip, sizeof(skip), "%" PRIu64, sk);
        snprintf(rank, sizeof(rank), "%" PRId64, only);
        snprintf(R0, sizeof(R0), "%" PRIu64, c.world_size);
        snprintf(K0, sizeof(K0), "%" PRIu64, k0);
        const char *args[40];
        int a = 0;
        args[a++] = "--mode";
        args[a++] = modes[c.mode];
        args[a++] = "--num-samples";
        args[a++] = n;
        args[a++] = "--world-size";
        args[a++] = R;
        args[a++] = "--batch-size";
        args[a++] = B;
        args[a++] = c.shuffle ? "--shuffle" : "--skip=0";
        args[a++] = "--seed";
        args[a++] = seed;
        args[a++] = "--epoch";
        args[a++] = epoch;
        args[a++] = "--shuffle-algo";
        args[a++] = c.shuffle_algo == BW__SHUFFLE_FEISTEL ? "feistel" : "torch";
        args[a++] = c.drop_last ? "--drop-last" : "--skip=0";
        args[a++] = c.sampler_drop_last ? "--sampler-drop-last" : "--skip=0";
        args[a++] = c.split_batches ? "--split-batches" : "--skip=0";
        args[a++] = c.even_batches ? "--skip=0" : "--no-even-batches";
        args[a++] = c.dispatch_batches ? "--dispatch-batches" : "--skip=0";
        args[a++] = c.shard_single_process ? "--pad-single-process" : "--skip=0";
        args[a++] = "--skip";
        args[a++] = skip;
        if (only >= 0) {
            args[a++] = "--rank";
            args[a++] = rank;
        }
        if (resume) {
            args[a++] = "--resume-from-world";
            args[a++] = R0;
            args[a++] = "--resume-from-step";
            args[a++] = K0;
        }
        while (a < 30)
            args[a++] = NULL;
        plan_result r =
            run_plan(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7],
                     args[8], args[9], args[10], args[11], args[12], args[13], args[14], args[15],
                     args[16], args[17], args[18], args[19], args[20], args[21], args[22], args[23],
                     args[24], args[25], args[26], args[27], args[28], args[29], NULL);
        if (r.status != 0)
            fail_msg("plan failed (%d): %s", r.status, r.err);
        check_against_core(s, r.out, sk, only);
        free_result(&r);
        bw__sampler_free(s);
        checked++;
    }
    assert_true(checked > 150);
}

static void expect_usage_error(plan_result r, const char *word)
{
    assert_int_equal(r.status, 2);
    assert_string_equal(r.out, "");
    if (!strstr(r.err, word))
        fail_msg("stderr \"%s\" does not name %s", r.err, word);
    free_result(&r);
}

static void test_refusals_exit_2(void **state)
{
    (void)state;
    expect_usage_error(run_plan("--mode", "accelerate", "--num-samples", "10", "--world-size", "2",
                                "--batch-size", "5", "--split-batches", NULL),
                       "split_batches: batch_size 5 is not a multiple of world_size 2");
    expect_usage_error(run_plan("--mode", "torch", "--num-samples", "10", "--world-size", "2",
                                "--batch-size", "5", "--rank", "2", NULL),
                       "--rank");
    expect_usage_error(
        run_plan("--num-samples", "10", "--world-size", "2", "--batch-size", "5", NULL), "--mode");
    expect_usage_error(run_plan("--mode", "tf", NULL), "--mode");
    expect_usage_error(run_plan("--mode", "torch", "--num-samples", "10", "--world-size", "2",
                                "--batch-size", "5", "--resume-from-world", "3", NULL),
                       "--resume-from-step");
    expect_usage_error(run_plan("--mode", "torch", "--num-samples", "10", "--world-size", "2",
                                "--batch-size", "5", "--resume-from-world", "3",
                                "--resume-from-step", "7", NULL),
                       "resume_from_step 7");
    expect_usage_error(run_plan("--mode", "torch", "--num-samples", "10", "--world-size", "2",
                                "--batch-size", "5", "--split-batches", NULL),
                       "split_batches");
    expect_usage_error(run_plan("--mode", "iterable", "--num-samples", "10", "--world-size", "2",
                                "--batch-size", "4", "--shuffle", NULL),
                       "shuffle");
    expect_usage_error(run_plan("--mode", "torch", "--num-samples", "10", "--world-size", "0",
                                "--batch-size", "4", NULL),
                       "--world-size");
    plan_result r = run_plan("--help", NULL);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "--resume-from-step"));
    free_result(&r);
}

static void test_metadata_flags_unequal(void **state)
{
    (void)state;
    plan_result r = run_plan("--mode", "accelerate", "--num-samples", "10", "--world-size", "3",
                             "--batch-size", "2", "--no-even-batches", "--metadata", NULL);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "\"end_step\":[2,2,1],\"equal_batches\":false"));
    assert_non_null(strstr(r.err, "different numbers of batches"));
    free_result(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_design_example),
        cmocka_unit_test(test_random_plans_match_core),
        cmocka_unit_test(test_refusals_exit_2),
        cmocka_unit_test(test_metadata_flags_unequal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
