/*
 * Mixtures (core/jobs/mixture): the largest-remainder counts (sum, the defining inequality,
 * ties), the window bound of docs/semantics.md on random mixtures of up to 256 sources, no
 * sample twice within a pass of a source's stream over consecutive epochs, the keyed
 * permutation a bijection, position -> (source, k) against the order built here by sorting
 * every node's keys, and the sharded sampler at step 10^9 of an epoch of 10^10 against an
 * independent computation (the mode's position arithmetic and a bisection over each node);
 * position <-> (source, k) both ways; stream sources under cycle and stop (records, passes,
 * the epoch's end found by scanning every position, where each stream stands after any
 * prefix, the sampler over the P positions in every mode); a batch's positions at once
 * (bw__mixture_at_many) equal to one at a time; the weight parser and every refusal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "jobs/mixture.h"

typedef unsigned __int128 u128;

/* A small deterministic generator for the random cases (not the code under test's hash). */
static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(uint64_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state % n;
}

static bw__mixture *make(const uint64_t *sizes, const uint64_t *weights, size_t n, uint64_t E,
                         uint64_t seed, uint64_t epoch)
{
    bw__mix_spec spec = {sizes, weights, n, E, NULL, BW__MIX_CYCLE};
    bw__mixture *m = NULL;
    char err[256];
    int rc = bw__mixture_new(&m, &spec, seed, epoch, err, sizeof(err));
    if (rc != BW_OK)
        fail_msg("bw__mixture_new: %s", err);
    return m;
}

static void test_weight_parse(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint64_t units;
    } good[] = {{"0.7", 700000000ull},    {"70", 70000000000ull},
                {".25", 250000000ull},    {"3.", 3000000000ull},
                {"0.000000001", 1},       {"1000000000", 1000000000000000000ull},
                {"007.50", 7500000000ull}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        uint64_t u = 0;
        assert_int_equal(bw__mix_weight_parse(good[i].text, &u, NULL, 0), BW_OK);
        assert_true(u == good[i].units);
        /* Shown as a user writes it, and read back to the same units. */
        char text[32];
        uint64_t back = 0;
        bw__mix_weight_format(u, text, sizeof(text));
        assert_int_equal(bw__mix_weight_parse(text, &back, NULL, 0), BW_OK);
        assert_true(back == u);
    }
    static const struct {
        uint64_t units;
        const char *text;
    } shown[] = {{700000000ull, "0.7"},  {70000000000ull, "70"},
                 {1, "0.000000001"},     {1000000000000000000ull, "1000000000"},
                 {7500000000ull, "7.5"}, {250000000ull, "0.25"}};
    for (size_t i = 0; i < sizeof(shown) / sizeof(shown[0]); i++) {
        char text[32];
        bw__mix_weight_format(shown[i].units, text, sizeof(text));
        assert_string_equal(text, shown[i].text);
    }
    static const char *const bad[] = {"",     ".",     "0",  "0.0", "-1",           "+1",
                                      "1e-3", "1.2.3", " 1", "1 ",  "0.0000000001", "1000000000.1",
                                      "abc",  "nan",   "inf"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t u = 42;
        char err[256] = "";
        assert_int_equal(bw__mix_weight_parse(bad[i], &u, err, sizeof(err)), BW_INVALID_ARGUMENT);
        assert_true(u == 42);
        char quoted[64];
        snprintf(quoted, sizeof(quoted), "'%s'", bad[i]);
        assert_non_null(strstr(err, quoted));
    }
}

/* Largest remainder, checked by its definition: each c_j is floor(q_j) or floor(q_j) + 1, they
 * sum to E, and every source that got one more has a larger remainder than every source that
 * did not, or the same remainder and a lower index. */
static void check_counts(const uint64_t *w, size_t n, uint64_t E)
{
    uint64_t sizes[BW__MIX_MAX_SOURCES];
    for (size_t j = 0; j < n; j++)
        sizes[j] = 1;
    bw__mixture *m = make(sizes, w, n, E, 0, 0);
    u128 T = 0;
    for (size_t j = 0; j < n; j++)
        T += w[j];
    uint64_t sum = 0;
    for (size_t j = 0; j < n; j++) {
        uint64_t c = bw__mixture_count(m, j), fl = (uint64_t)((u128)E * w[j] / T);
        assert_true(c == fl || c == fl + 1);
        sum += c;
        for (size_t i = 0; i < n; i++) {
            uint64_t ci = bw__mixture_count(m, i), fli = (uint64_t)((u128)E * w[i] / T);
            if (c == fl + 1 && ci == fli) {
                u128 rj = (u128)E * w[j] % T, ri = (u128)E * w[i] % T;
                assert_true(rj > ri || (rj == ri && j < i));
            }
        }
    }
    assert_true(sum == E);
    bw__mixture_free(m);
}

static void test_counts(void **state)
{
    (void)state;
    const uint64_t ones[] = {1, 1, 1, 1};
    const uint64_t sizes[] = {10, 10, 10, 10};
    /* docs/semantics.md's examples, and ties going to the lower index */
    bw__mixture *m = make(sizes, ones, 3, 10, 0, 0);
    assert_int_equal(bw__mixture_count(m, 0), 4);
    assert_int_equal(bw__mixture_count(m, 1), 3);
    assert_int_equal(bw__mixture_count(m, 2), 3);
    bw__mixture_free(m);
    m = make(sizes, ones, 4, 2, 0, 0);
    assert_int_equal(bw__mixture_count(m, 0), 1);
    assert_int_equal(bw__mixture_count(m, 1), 1);
    assert_int_equal(bw__mixture_count(m, 2), 0);
    assert_int_equal(bw__mixture_count(m, 3), 0);
    bw__mixture_free(m);
    const uint64_t w712[] = {700000000, 200000000, 100000000};
    m = make(sizes, w712, 3, 7, 0, 0);
    assert_int_equal(bw__mixture_count(m, 0), 5);
    assert_int_equal(bw__mixture_count(m, 1), 1);
    assert_int_equal(bw__mixture_count(m, 2), 1);
    assert_true(bw__mixture_samples(m) == 7);
    bw__mixture_free(m);
    /* E defaults to the sum of the sizes */
    const uint64_t sz[] = {5, 7};
    m = make(sz, ones, 2, 0, 0, 0);
    assert_true(bw__mixture_samples(m) == 12);
    assert_int_equal(bw__mixture_count(m, 0), 6);
    bw__mixture_free(m);
    /* random mixtures, with many equal weights so that ties happen */
    uint64_t w[BW__MIX_MAX_SOURCES];
    for (int trial = 0; trial < 400; trial++) {
        size_t n = 1 + (size_t)rnd(trial % 10 == 0 ? BW__MIX_MAX_SOURCES : 7);
        for (size_t j = 0; j < n; j++)
            w[j] = trial % 3 == 0 ? 1 + rnd(3) : 1 + rnd(BW__MIX_MAX_WEIGHT);
        uint64_t E = trial % 4 == 0 ? 1 + rnd(20) : 1 + rnd(trial % 5 ? 100000 : 1ull << 62);
        check_counts(w, n, E);
    }
}

/* The order built by sorting, as docs/semantics.md defines it: at each node the merge of the
 * children's sequences by key (2^32 k + jitter) x (other side's count), left first on ties.
 * The jitter is the doc's H(2, seed, epoch, lo, hi, side, k) >> 32, recomputed here. */
static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t doc_jitter(uint64_t seed, uint64_t epoch, uint64_t lo, uint64_t hi, uint64_t side,
                           uint64_t k)
{
    const uint64_t w[] = {2, seed, epoch, lo, hi, side, k};
    uint64_t h = 0;
    for (int i = 0; i < 7; i++)
        h = mix64(h ^ w[i]);
    return h >> 32;
}

typedef struct elem {
    uint32_t source;
    uint64_t k;
} elem;

typedef struct keyed {
    u128 key;
    int side;
    uint64_t k;
} keyed;

static int by_key(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    if (x->side != y->side)
        return x->side - y->side;
    return x->k < y->k ? -1 : (x->k > y->k);
}

/* Fills out[0 .. sum of c over [lo, hi)) with the node's sequence (small E only). */
static uint64_t sorted_node(const uint64_t *c, uint64_t lo, uint64_t hi, uint64_t seed,
                            uint64_t epoch, elem *out)
{
    if (hi - lo == 1) {
        for (uint64_t k = 0; k < c[lo]; k++)
            out[k] = (elem){(uint32_t)lo, k};
        return c[lo];
    }
    uint64_t mid = lo + (hi - lo) / 2;
    elem *left = malloc(4096 * sizeof(*left)), *right = malloc(4096 * sizeof(*right));
    keyed *all = malloc(4096 * sizeof(*all));
    assert_non_null(left);
    assert_non_null(right);
    assert_non_null(all);
    uint64_t A = sorted_node(c, lo, mid, seed, epoch, left);
    uint64_t B = sorted_node(c, mid, hi, seed, epoch, right);
    for (uint64_t k = 0; k < A; k++)
        all[k] = (keyed){(((u128)k << 32) + doc_jitter(seed, epoch, lo, hi, 0, k)) * B, 0, k};
    for (uint64_t k = 0; k < B; k++)
        all[A + k] = (keyed){(((u128)k << 32) + doc_jitter(seed, epoch, lo, hi, 1, k)) * A, 1, k};
    qsort(all, A + B, sizeof(*all), by_key);
    for (uint64_t i = 0; i < A + B; i++)
        out[i] = all[i].side == 0 ? left[all[i].k] : right[all[i].k];
    free(left);
    free(right);
    free(all);
    return A + B;
}

static void test_locate_equals_sort(void **state)
{
    (void)state;
    uint64_t sizes[40], w[40], c[40];
    elem *order = malloc(4096 * sizeof(*order));
    assert_non_null(order);
    for (int trial = 0; trial < 200; trial++) {
        size_t n = 1 + (size_t)rnd(trial < 100 ? 6 : 40);
        for (size_t j = 0; j < n; j++) {
            sizes[j] = 1 + rnd(50);
            w[j] = trial % 7 == 0 ? 1 : 1 + rnd(5000000000ull);
        }
        uint64_t E = 1 + rnd(3000), seed = rnd(UINT64_MAX), epoch = rnd(5);
        bw__mixture *m = make(sizes, w, n, E, seed, epoch);
        for (size_t j = 0; j < n; j++)
            c[j] = bw__mixture_count(m, j);
        assert_true(sorted_node(c, 0, n, seed, epoch, order) == E);
        uint64_t seen[40] = {0};
        for (uint64_t p = 0; p < E; p++) {
            uint32_t src;
            uint64_t k;
            bw__mixture_locate(m, p, &src, &k);
            if (src != order[p].source || k != order[p].k)
                fail_msg("trial %d, position %llu: (%u, %llu), sorting gives (%u, %llu)", trial,
                         (unsigned long long)p, src, (unsigned long long)k, order[p].source,
                         (unsigned long long)order[p].k);
            for (size_t j = 0; j < n; j++)
                assert_true(bw__mixture_consumed(m, (uint32_t)j, p) == seen[j]);
            seen[src]++;
        }
        for (size_t j = 0; j < n; j++)
            assert_true(bw__mixture_consumed(m, (uint32_t)j, E) == c[j]);
        bw__mixture_free(m);
    }
    free(order);
}

/* docs/semantics.md: every window of L positions holds source j within 2 x depth_j of
 * L c_j / E (strictly), hence within 2 % of a window of 1,000. */
static void check_windows(const bw__mixture *m, uint64_t L)
{
    size_t n = bw__mixture_nsources(m);
    uint64_t E = bw__mixture_samples(m);
    uint32_t *src = malloc(E * sizeof(*src));
    uint64_t *run = calloc(n, sizeof(*run));
    assert_non_null(src);
    assert_non_null(run);
    for (uint64_t p = 0; p < E; p++) {
        uint64_t k;
        bw__mixture_locate(m, p, &src[p], &k);
    }
    unsigned depth = 0;
    while ((1ull << depth) < n)
        depth++;
    for (uint64_t p = 0; p < L; p++)
        run[src[p]]++;
    for (uint64_t start = 0; start + L <= E; start++) {
        if (start) {
            run[src[start - 1]]--;
            run[src[start + L - 1]]++;
        }
        for (size_t j = 0; j < n; j++) {
            double dev = (double)run[j] - (double)L * (double)bw__mixture_count(m, j) / (double)E;
            if (dev < 0)
                dev = -dev;
            if (dev >= 2.0 * depth || (L == 1000 && dev > 20))
                fail_msg("%zu sources, E %llu: the window of %llu at %llu holds source %zu %llu "
                         "times, %.2f from its share",
                         n, (unsigned long long)E, (unsigned long long)L, (unsigned long long)start,
                         j, (unsigned long long)run[j], dev);
        }
    }
    free(src);
    free(run);
}

static void test_window_bound(void **state)
{
    (void)state;
    uint64_t sizes[BW__MIX_MAX_SOURCES], w[BW__MIX_MAX_SOURCES];
    for (int trial = 0; trial < 24; trial++) {
        size_t n = trial < 8 ? 2 + (size_t)rnd(3) : trial < 20 ? 2 + (size_t)rnd(30) : 256;
        for (size_t j = 0; j < n; j++) {
            sizes[j] = 1 + rnd(100000);
            /* skewed weights: a few heavy sources among light ones */
            w[j] = rnd(4) == 0 ? 1 + rnd(1000000000000ull) : 1 + rnd(1000000000ull);
        }
        uint64_t E = 2000 + rnd(8000);
        bw__mixture *m = make(sizes, w, n, E, rnd(UINT64_MAX), rnd(100));
        check_windows(m, 1000);
        check_windows(m, 1 + rnd(200));
        bw__mixture_free(m);
    }
}

static void test_permutation_bijection(void **state)
{
    (void)state;
    uint8_t *hit = malloc(5000);
    assert_non_null(hit);
    for (uint64_t n = 1; n <= 5000; n += (n < 300 ? 1 : 397)) {
        for (int key = 0; key < 3; key++) {
            memset(hit, 0, n);
            uint64_t seed = key == 2 ? UINT64_MAX : (uint64_t)key * 977, fixed = 0;
            for (uint64_t i = 0; i < n; i++) {
                uint64_t v = bw__mix_permute(seed, (uint32_t)key, n, n, i);
                assert_true(v < n);
                assert_int_equal(hit[v], 0);
                hit[v] = 1;
                fixed += v == i;
            }
            if (n >= 100) /* a shuffle, not the identity */
                assert_true(fixed < n / 10);
        }
    }
    /* different passes and sources are different permutations */
    uint64_t same_pass = 0, same_source = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        same_pass += bw__mix_permute(1, 0, 0, 1000, i) == bw__mix_permute(1, 0, 1, 1000, i);
        same_source += bw__mix_permute(1, 0, 0, 1000, i) == bw__mix_permute(1, 1, 0, 1000, i);
    }
    assert_true(same_pass < 50 && same_source < 50);
    free(hit);
}

/* Source j's samples over consecutive epochs read its stream: each pass of n_j stream
 * positions shows every sample once; down-sampled epochs continue where the last stopped. */
static void test_no_repeat_within_pass(void **state)
{
    (void)state;
    const uint64_t sizes[] = {97, 1000, 13};
    const uint64_t w[] = {300000000, 500000000, 200000000};
    const uint64_t E = 160; /* counts 48, 80, 32: source 2 up-sampled, 1 down-sampled */
    uint64_t *stream[3];
    uint64_t len[3] = {0, 0, 0};
    for (int j = 0; j < 3; j++) {
        stream[j] = malloc(20 * E * sizeof(uint64_t));
        assert_non_null(stream[j]);
    }
    for (uint64_t epoch = 0; epoch < 20; epoch++) {
        bw__mixture *m = make(sizes, w, 3, E, 4242, epoch);
        for (uint64_t p = 0; p < E; p++) {
            uint32_t j;
            uint64_t k, index;
            bw__mixture_locate(m, p, &j, &k);
            assert_true(bw__mixture_stream_position(m, j, k) == len[j]);
            bw__mixture_at(m, p, &j, &index, NULL);
            stream[j][len[j]++] = index;
        }
        bw__mixture_free(m);
    }
    uint8_t seen[1000];
    for (int j = 0; j < 3; j++) {
        const uint64_t want[] = {48, 80, 32};
        assert_true(len[j] == 20 * want[j]);
        for (uint64_t start = 0; start < len[j]; start += sizes[j]) {
            memset(seen, 0, sizeof(seen));
            for (uint64_t t = start; t < len[j] && t < start + sizes[j]; t++) {
                assert_true(stream[j][t] < sizes[j]);
                assert_int_equal(seen[stream[j][t]], 0);
                seen[stream[j][t]] = 1;
            }
        }
        free(stream[j]);
    }
}

/* An independent position -> (source, k): at each node, the left elements among the first p
 * found by bisection over k on "left k is at k + (right keys below its key)", the right keys
 * below counted by a second bisection over m, all with the doc's keys compared exactly
 * (split as (2^32 k + u) B < (2^32 m + v) A without overflow by comparing k B / A first). */
static int right_below_left(uint64_t k, uint64_t u, uint64_t m, uint64_t v, uint64_t A, uint64_t B)
{
    /* (2^32 m + v) A < (2^32 k + u) B  <=>  2^32 (m A - k B) < u B - v A */
    u128 ma = (u128)m * A, kb = (u128)k * B, ub = (u128)u * B, va = (u128)v * A;
    if (ma >= kb) {
        u128 d = ma - kb; /* need 2^32 d < u B - v A */
        if (ub <= va)
            return 0;
        u128 rhs = ub - va;
        return d < ((rhs - 1) >> 32) + 1 && (d << 32) < rhs;
    }
    u128 d = kb - ma; /* need v A - u B < 2^32 d */
    if (va <= ub)
        return 1;
    return va - ub < (d > ((u128)1 << 90) ? (u128)1 << 122 : d << 32);
}

static void bisect_locate(const bw__mixture *m, uint64_t seed, uint64_t epoch, uint64_t p,
                          uint32_t *source, uint64_t *kout)
{
    uint64_t lo = 0, hi = bw__mixture_nsources(m);
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2, A = 0, B = 0;
        for (uint64_t j = lo; j < mid; j++)
            A += bw__mixture_count(m, j);
        for (uint64_t j = mid; j < hi; j++)
            B += bw__mixture_count(m, j);
        /* left_pos(k) = k + #{m : right m below left k} */
        uint64_t klo = 0, khi = A; /* first k whose left_pos >= p */
        uint64_t at = UINT64_MAX;
        while (klo < khi) {
            uint64_t k = klo + (khi - klo) / 2, u = doc_jitter(seed, epoch, lo, hi, 0, k);
            uint64_t mlo = 0, mhi = B; /* first right not below */
            while (mlo < mhi) {
                uint64_t mm = mlo + (mhi - mlo) / 2;
                if (right_below_left(k, u, mm, doc_jitter(seed, epoch, lo, hi, 1, mm), A, B))
                    mlo = mm + 1;
                else
                    mhi = mm;
            }
            uint64_t pos = k + mlo;
            if (pos >= p) {
                khi = k;
                if (pos == p)
                    at = k;
            } else {
                klo = k + 1;
            }
        }
        if (at != UINT64_MAX && at == klo) {
            hi = mid;
            p = klo;
        } else {
            lo = mid;
            p -= klo;
        }
    }
    *source = (uint32_t)lo;
    *kout = p;
}

static void test_resume_far(void **state)
{
    (void)state;
    const uint64_t sizes[] = {3000000000ull, 7000000000ull, 1000000, 123457, 5};
    const uint64_t w[] = {550000000, 300000000, 100000000, 49000000, 1000000};
    const uint64_t E = 10000000000ull, seed = 2024, epoch = 3, step = 1000000000ull;
    bw__mix_spec spec = {sizes, w, 5, E, NULL, BW__MIX_CYCLE};
    const bw__sampler_mode modes[] = {BW__MODE_TORCH, BW__MODE_ACCELERATE};
    for (int mi = 0; mi < 2; mi++) {
        Batchwire__V1__WorldSegment seg = BATCHWIRE__V1__WORLD_SEGMENT__INIT;
        const Batchwire__V1__WorldSegment *hist[] = {&seg};
        seg.world_size = 2;
        bw__sampler_cfg cfg;
        bw__sampler_cfg_init(&cfg);
        cfg.mode = modes[mi];
        cfg.batch_size = 4;
        cfg.seed = seed;
        bw__mix_sampler *s;
        char err[256];
        assert_int_equal(bw__mix_sampler_new(&s, &spec, &cfg, hist, 1, epoch, err, sizeof(err)),
                         BW_OK);
        uint64_t idx[4];
        uint8_t pad[4];
        uint32_t src[4];
        bw__batch b = {idx, pad, 0, 0};
        for (uint64_t rank = 0; rank < 2; rank++) {
            assert_int_equal(bw__mix_sampler_batch(s, rank, step, &b, src, NULL), BW_OK);
            assert_int_equal(b.count, 4);
            const bw__mixture *m = bw__mix_sampler_mixture(s);
            for (uint64_t i = 0; i < 4; i++) {
                /* torch: DistributedSampler's stride; accelerate: batch step*R + rank */
                uint64_t pos = mi == 0 ? (step * 4 + i) * 2 + rank : (step * 2 + rank) * 4 + i;
                uint32_t j;
                uint64_t k;
                bisect_locate(m, seed, epoch, pos, &j, &k);
                assert_int_equal(src[i], j);
                assert_true(idx[i] == bw__mixture_index(m, j, k));
                assert_true(bw__mixture_stream_position(m, j, k) ==
                            epoch * bw__mixture_count(m, j) + k);
                assert_true(bw__mixture_consumed(m, j, pos) == k);
            }
        }
        /* asking for step 0 first changes nothing: the answer is a pure function */
        uint64_t again[4];
        uint32_t src2[4];
        bw__batch b2 = {again, NULL, 0, 0};
        assert_int_equal(bw__mix_sampler_batch(s, 0, 0, &b2, src2, NULL), BW_OK);
        assert_int_equal(bw__mix_sampler_batch(s, 1, step, &b2, src2, NULL), BW_OK);
        assert_memory_equal(again, idx, sizeof(idx));
        assert_memory_equal(src2, src, sizeof(src));
        bw__mix_sampler_free(s);
    }
}

/* position(locate(p)) = p for every p, on random mixtures, and at random p of E = 10^10. */
static void test_position_inverse(void **state)
{
    (void)state;
    uint64_t sizes[40], w[40];
    for (int trial = 0; trial < 60; trial++) {
        size_t n = 1 + rnd(trial < 50 ? 9 : 40);
        for (size_t j = 0; j < n; j++) {
            sizes[j] = 1 + rnd(500);
            w[j] = 1 + rnd(trial % 3 ? 1000 : 3);
        }
        uint64_t E = 1 + rnd(2500);
        bw__mixture *m = make(sizes, w, n, E, rnd(1000), rnd(4));
        for (uint64_t p = 0; p < E; p++) {
            uint32_t j;
            uint64_t k;
            bw__mixture_locate(m, p, &j, &k);
            if (bw__mixture_position(m, j, k) != p)
                fail_msg("trial %d: position %llu -> (%u, %llu) -> %llu", trial,
                         (unsigned long long)p, j, (unsigned long long)k,
                         (unsigned long long)bw__mixture_position(m, j, k));
        }
        bw__mixture_free(m);
    }
    const uint64_t big[] = {3000000000ull, 7000000000ull, 1000000, 123457, 5};
    const uint64_t bw[] = {550000000, 300000000, 100000000, 49000000, 1000000};
    bw__mixture *m = make(big, bw, 5, 10000000000ull, 2024, 3);
    for (int i = 0; i < 20000; i++) {
        uint64_t p = rnd(10000000000ull);
        uint32_t j;
        uint64_t k;
        bw__mixture_locate(m, p, &j, &k);
        assert_true(bw__mixture_position(m, j, k) == p);
    }
    bw__mixture_free(m);
}

/* bw__mixture_at_many against bw__mixture_at, position by position: random batches of up to
 * 300 positions (past a chunk of 256 going down the tree together), over mixtures of 1 to 256
 * sources (a tree of up to eight levels), tiny sources up-sampled so that one batch crosses
 * several passes of one source, stream sources under both policies, consecutive, strided and
 * scattered positions and strides that wrap around to the epoch's start, passes asked or not,
 * and the positions given in the index array itself; epochs small, of 10^10 and up to 2^60
 * (merge_span's keys of one 128-bit number and of 160 bits). at_many permutes a run of one
 * (source, pass) eight at a time where the processor has AVX-512 (bw__feistel_at_run), at one at a
 * time, so on such a machine the two ways of encrypting are compared too. */
static void test_at_many_equals_at(void **state)
{
    (void)state;
    enum { MAXN = 300 };
    uint64_t sizes[256], w[256], pos[MAXN], idx[MAXN], pass[MAXN];
    uint32_t src[MAXN];
    bool streams[256];
    for (int trial = 0; trial < 400; trial++) {
        size_t n = trial % 4 == 0 ? 1 + rnd(256) : 1 + rnd(6);
        bool any = false;
        for (size_t j = 0; j < n; j++) {
            sizes[j] = 1 + rnd(trial % 3 == 0 ? 5 : trial % 3 == 1 ? 300 : 1000000);
            w[j] = 1 + rnd(1000);
            streams[j] = trial % 5 == 0 && rnd(2);
            any |= streams[j];
        }
        /* Small epochs, 10^10 (element numbers past 2^32) and up to 2^60 (keys past 2^128),
         * each with scattered and with consecutive or strided positions. */
        uint64_t E = 1 + rnd(trial % 4 < 2 ? 5000 : trial % 8 >= 6 ? 1ull << 60 : 10000000000ull);
        bw__mix_spec spec = {sizes, w,       n,
                             E,     streams, any && trial % 2 ? BW__MIX_STOP : BW__MIX_CYCLE};
        bw__mixture *m = NULL;
        char err[256];
        if (bw__mixture_new(&m, &spec, rnd(1 << 20), rnd(5), err, sizeof(err)) != BW_OK)
            fail_msg("trial %d: bw__mixture_new: %s", trial, err);
        uint64_t P = bw__mixture_end(m);
        size_t count = 1 + rnd(MAXN);
        /* Two batches in three ordered, of every size of mixture and epoch; half of those
         * consecutive (accelerate mode, world size 1: the tree is walked a merged span at a
         * time, descend_run, unless they wrap around), the others strided. */
        bool ordered = rnd(3) != 0;
        uint64_t start = rnd(P), stride = rnd(2) ? 1 : 1 + rnd(4);
        for (size_t i = 0; i < count; i++)
            pos[i] = ordered ? (start + i * stride) % P : rnd(P);
        bool with_pass = trial % 3 != 0, in_place = trial % 2 == 0;
        if (in_place)
            memcpy(idx, pos, count * sizeof(*pos));
        bw__mixture_at_many(m, in_place ? idx : pos, count, src, idx, with_pass ? pass : NULL);
        for (size_t i = 0; i < count; i++) {
            uint32_t j;
            uint64_t index, ps;
            bw__mixture_at(m, pos[i], &j, &index, &ps);
            if (src[i] != j || idx[i] != index || (with_pass && pass[i] != ps))
                fail_msg("trial %d (%zu sources), position %llu (item %zu): at_many gives "
                         "(%u, %llu, pass %llu), at gives (%u, %llu, pass %llu)",
                         trial, n, (unsigned long long)pos[i], i, src[i],
                         (unsigned long long)idx[i], (unsigned long long)(with_pass ? pass[i] : ps),
                         j, (unsigned long long)index, (unsigned long long)ps);
        }
        bw__mixture_free(m);
    }
}

/* Stream sources, both policies, against the rules of docs/semantics.md ("Streams in a
 * mixture") applied here position by position. */
static void test_streams(void **state)
{
    (void)state;
    uint64_t sizes[8], w[8];
    bool streams[8];
    int stopped = 0, ran_to_E = 0;
    for (int trial = 0; trial < 300; trial++) {
        size_t n = 1 + rnd(6);
        bool any = false;
        for (size_t j = 0; j < n; j++) {
            sizes[j] = 1 + rnd(trial % 2 ? 40 : 400);
            w[j] = 1 + rnd(10);
            streams[j] = rnd(3) != 0;
            any |= streams[j];
        }
        if (!any)
            streams[rnd(n)] = true;
        uint64_t E = 1 + rnd(600), seed = rnd(1000), epoch = rnd(5);
        bw__mix_policy policy = trial % 2 ? BW__MIX_STOP : BW__MIX_CYCLE;
        bw__mix_spec spec = {sizes, w, n, E, streams, policy};
        bw__mix_spec plain = {sizes, w, n, E, NULL, BW__MIX_CYCLE};
        bw__mixture *m, *ref;
        char err[256];
        assert_int_equal(bw__mixture_new(&m, &spec, seed, epoch, err, sizeof(err)), BW_OK);
        assert_int_equal(bw__mixture_new(&ref, &plain, seed, epoch, err, sizeof(err)), BW_OK);
        /* the end: the first position whose source is a stream with k >= n_j, under stop */
        uint64_t end = E;
        for (uint64_t p = 0; p < E && policy == BW__MIX_STOP && end == E; p++) {
            uint32_t j;
            uint64_t k;
            bw__mixture_locate(m, p, &j, &k);
            if (streams[j] && k >= sizes[j])
                end = p;
        }
        assert_true(bw__mixture_end(m) == end);
        stopped += end < E;
        ran_to_E += policy == BW__MIX_STOP && end == E;
        uint64_t given[8] = {0};
        for (uint64_t p = 0; p < end; p++) {
            uint32_t j, jr;
            uint64_t k, index, pass, iref;
            bw__mixture_locate(m, p, &j, &k);
            bw__mixture_at(m, p, &j, &index, &pass);
            bw__mixture_at(ref, p, &jr, &iref, NULL);
            assert_int_equal(j, jr); /* the interleave does not depend on kinds or policy */
            assert_true(k == given[j]);
            if (!streams[j]) {
                assert_true(index == iref); /* map-style: its own rule */
            } else if (policy == BW__MIX_CYCLE) {
                uint64_t t = epoch * bw__mixture_count(m, j) + k;
                assert_true(index == t % sizes[j] && pass == t / sizes[j]);
            } else {
                assert_true(index == k && pass == 0 && k < sizes[j]);
            }
            given[j]++;
            /* where each stream stands after [0, p + 1) */
            if (p % 7 == 0 || p + 1 == end) {
                for (size_t i = 0; i < n; i++) {
                    uint64_t ps, rec = bw__mixture_next_record(m, (uint32_t)i, p + 1, &ps);
                    uint64_t t =
                        (streams[i] && policy == BW__MIX_STOP ? 0
                                                              : epoch * bw__mixture_count(m, i)) +
                        given[i];
                    if (streams[i] && policy == BW__MIX_STOP)
                        assert_true(ps == 0 && rec == given[i] && rec <= sizes[i]);
                    else
                        assert_true(ps == t / sizes[i] && rec == t % sizes[i]);
                }
            }
        }
        bw__mixture_free(ref);

        /* sharded: the P positions as a dataset of P samples, in every mode */
        Batchwire__V1__WorldSegment seg = BATCHWIRE__V1__WORLD_SEGMENT__INIT;
        const Batchwire__V1__WorldSegment *hist[] = {&seg};
        seg.world_size = (uint32_t)(1 + rnd(4));
        seg.epoch = epoch;
        bw__sampler_cfg cfg;
        bw__sampler_cfg_init(&cfg);
        cfg.mode = (bw__sampler_mode)(trial % 3 == 0   ? BW__MODE_TORCH
                                      : trial % 3 == 1 ? BW__MODE_ACCELERATE
                                                       : BW__MODE_ITERABLE);
        cfg.batch_size = 1 + rnd(5);
        cfg.seed = seed;
        bw__mix_sampler *s;
        assert_int_equal(bw__mix_sampler_new(&s, &spec, &cfg, hist, 1, epoch, err, sizeof(err)),
                         BW_OK);
        const bw__sampler *ps = bw__mix_sampler_positions(s);
        uint64_t idx[64], passes[64], real = 0, seen[8] = {0};
        uint8_t pad[64];
        uint32_t src[64];
        assert_true(bw__sampler_max_batch(ps) <= 64);
        for (uint64_t r = 0; r < seg.world_size; r++)
            for (uint64_t st = 0; st < bw__sampler_end_step(ps, r); st++) {
                bw__batch b = {idx, pad, 0, 0};
                assert_int_equal(bw__mix_sampler_batch(s, r, st, &b, src, passes), BW_OK);
                for (size_t i = 0; i < b.count; i++) {
                    seen[src[i]] += !pad[i];
                    assert_true(idx[i] < sizes[src[i]]);
                }
                real += b.real;
            }
        /* nothing dropped in these configurations: every position once, plus padding */
        assert_true(real == end);
        for (size_t j = 0; j < n; j++)
            assert_true(seen[j] == given[j]);
        bw__mix_sampler_free(s);
        bw__mixture_free(m);
    }
    /* both kinds of stop epochs occurred */
    assert_true(stopped > 20 && ran_to_E > 5);
}

static void test_refusals(void **state)
{
    (void)state;
    char err[256];
    bw__mixture *m = (bw__mixture *)&m;
    uint64_t sizes[BW__MIX_MAX_SOURCES + 1], w[BW__MIX_MAX_SOURCES + 1];
    for (size_t j = 0; j <= BW__MIX_MAX_SOURCES; j++)
        sizes[j] = w[j] = 1;
    static const struct {
        size_t n;
        uint64_t size0, weight0, E, epoch;
        const char *needle;
    } cases[] = {
        {0, 1, 1, 0, 0, "1 to 256 sources, not 0"},
        {257, 1, 1, 0, 0, "1 to 256 sources, not 257"},
        {2, 0, 1, 0, 0, "source 0 has 0 samples"},
        {2, (1ull << 62) + 1, 1, 5, 0, "source 0 has 4611686018427387905 samples"},
        {2, 1, 0, 0, 0, "source 0 has weight 0"},
        {2, 1, BW__MIX_MAX_WEIGHT + 1, 0, 0, "weights are positive and at most"},
        {2, 1, 1, (1ull << 62) + 1, 0, "epoch size 4611686018427387905 is above 2^62"},
        {2, 1ull << 62, 1, 0, 0, "sum to 4611686018427387905, above 2^62"},
        {2, 1, 1, 10000000000ull, 1844674407ull, "epoch 1844674407 is too large"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sizes[0] = cases[i].size0;
        w[0] = cases[i].weight0;
        bw__mix_spec spec = {sizes, w, cases[i].n, cases[i].E, NULL, BW__MIX_CYCLE};
        assert_int_equal(bw__mixture_new(&m, &spec, 0, cases[i].epoch, err, sizeof(err)),
                         BW_INVALID_ARGUMENT);
        assert_null(m);
        if (!strstr(err, cases[i].needle))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].needle);
    }
    /* the last epoch that fits is accepted */
    sizes[0] = 1;
    w[0] = 1;
    bw__mix_spec ok = {sizes, w, 2, 10000000000ull, NULL, BW__MIX_CYCLE};
    assert_int_equal(bw__mixture_new(&m, &ok, 0, 1844674406ull, err, sizeof(err)), BW_OK);
    uint32_t j;
    uint64_t index;
    bw__mixture_at(m, 9999999999ull, &j, &index, NULL);
    assert_true(index < 1);
    bw__mixture_free(m);
    bw__mixture_free(NULL);

    Batchwire__V1__WorldSegment seg = BATCHWIRE__V1__WORLD_SEGMENT__INIT;
    const Batchwire__V1__WorldSegment *hist[] = {&seg};
    seg.world_size = 2;
    bw__sampler_cfg cfg;
    bw__sampler_cfg_init(&cfg);
    bw__mix_sampler *s = (bw__mix_sampler *)&s;
    bw__mix_spec spec = {sizes, w, 2, 10, NULL, BW__MIX_CYCLE};
    bool streams[2] = {false, false};
    spec.streams = streams;
    spec.policy = BW__MIX_STOP; /* no stream: stop means nothing */
    assert_int_equal(bw__mixture_new(&m, &spec, 0, 0, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_null(m);
    assert_non_null(strstr(err, "policy stop applies to stream sources"));
    spec.policy = (bw__mix_policy)7;
    streams[1] = true;
    assert_int_equal(bw__mixture_new(&m, &spec, 0, 0, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "policy 7 is not cycle"));
    spec.policy = BW__MIX_STOP;
    assert_int_equal(bw__mixture_new(&m, &spec, 0, 0, err, sizeof(err)), BW_OK);
    bw__mixture_free(m);
    spec.streams = NULL;
    spec.policy = BW__MIX_CYCLE;
    cfg.mode = BW__MODE_ITERABLE; /* accepted: IterableDatasetShard over the positions */
    assert_int_equal(bw__mix_sampler_new(&s, &spec, &cfg, hist, 1, 0, err, sizeof(err)), BW_OK);
    bw__mix_sampler_free(s);
    cfg.mode = BW__MODE_TORCH;
    cfg.shuffle = true;
    assert_int_equal(bw__mix_sampler_new(&s, &spec, &cfg, hist, 1, 0, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "shuffle"));
    cfg.shuffle = false;
    cfg.mode = BW__MODE_ACCELERATE;
    cfg.split_batches = true;
    cfg.batch_size = 3; /* not a multiple of the world size: the sampler core's rule */
    assert_int_equal(bw__mix_sampler_new(&s, &spec, &cfg, hist, 1, 0, err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "split_batches"));
    bw__mix_sampler_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weight_parse),
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_locate_equals_sort),
        cmocka_unit_test(test_window_bound),
        cmocka_unit_test(test_permutation_bijection),
        cmocka_unit_test(test_no_repeat_within_pass),
        cmocka_unit_test(test_resume_far),
        cmocka_unit_test(test_position_inverse),
        cmocka_unit_test(test_streams),
        cmocka_unit_test(test_at_many_equals_at),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
