/* Placement: sample -> shard and shard -> worker (rendezvous hashing). Pinned values keep the
 * functions stable for clients written in other languages; properties check that losing a
 * worker moves only its shards, adding one takes shards only for itself, and load is even. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "placement/placement.h"

enum { SHARDS = 4096 };

static void test_pinned(void **state)
{
    (void)state;
    /* splitmix64's finalizer and FNV-1a as published */
    assert_true(bw__placement_mix64(0) == 0);
    assert_true(bw__placement_mix64(1) == 0x5692161d100b05e5ull);
    assert_true(bw__placement_hash_bytes("", 0) == 0xcbf29ce484222325ull);
    assert_true(bw__placement_hash_bytes("a", 1) == 0xaf63dc4c8601ec8cull);
    assert_int_equal(bw__placement_shard(37, 1, 16, BW_SHARD_MODULO), 5);
    assert_int_equal(bw__placement_shard(37, 0, 16, BW_SHARD_MODULO), 5);
    assert_int_equal(bw__placement_shard(37, 1, 1, BW_SHARD_HASH), 0);
    assert_int_equal(bw__placement_shard(1, 1, 16, BW_SHARD_HASH), 0x5692161d100b05e5ull % 16);
    /* blocks: 37 / 4 = 9; 37 / 3 = 12 (any block, not only the loader's powers of two) */
    assert_int_equal(bw__placement_shard(37, 4, 16, BW_SHARD_MODULO), 9);
    assert_int_equal(bw__placement_shard(37, 3, 16, BW_SHARD_MODULO), 12);
    assert_int_equal(bw__placement_shard(7, 8, 16, BW_SHARD_HASH), 0);
    assert_int_equal(bw__placement_shard(9, 8, 16, BW_SHARD_HASH), 0x5692161d100b05e5ull % 16);
    assert_int_equal(bw__placement_stream_shard(5, "x", 4, BW_SHARD_MODULO), 1);
    const char *ids[] = {"w1", "w2", "w3"};
    char owners[17] = "";
    for (uint32_t s = 0; s < 16; s++)
        owners[s] = (char)('1' + bw__placement_owner(ids, 3, s));
    /* Pinned: changing the score function reshuffles every deployed cluster's shards. */
    assert_string_equal(owners, "2331332122331131");
}

static void owners_of(const char *const *ids, size_t n, size_t *out)
{
    for (uint32_t s = 0; s < SHARDS; s++)
        out[s] = bw__placement_owner(ids, n, s);
}

static void test_remove_moves_only_its_shards(void **state)
{
    (void)state;
    char names[8][16];
    const char *ids[8];
    for (int i = 0; i < 8; i++) {
        snprintf(names[i], sizeof(names[i]), "worker-%d", i);
        ids[i] = names[i];
    }
    static size_t before[SHARDS], after[SHARDS];
    owners_of(ids, 8, before);
    size_t count[8] = {0};
    for (int s = 0; s < SHARDS; s++)
        count[before[s]]++;
    for (int i = 0; i < 8; i++) /* 512 expected each */
        assert_true(count[i] > 400 && count[i] < 624);
    /* remove worker-3 */
    const char *rest[7];
    for (int i = 0, k = 0; i < 8; i++)
        if (i != 3)
            rest[k++] = ids[i];
    owners_of(rest, 7, after);
    for (int s = 0; s < SHARDS; s++) {
        const char *b = ids[before[s]], *a = rest[after[s]];
        if (before[s] != 3)
            assert_string_equal(a, b);
    }
    /* add worker-8: shards move only to it */
    const char *more[9];
    memcpy(more, ids, sizeof(ids));
    more[8] = "worker-8";
    static size_t grown[SHARDS];
    owners_of(more, 9, grown);
    int moved = 0;
    for (int s = 0; s < SHARDS; s++)
        if (grown[s] != before[s]) {
            assert_int_equal(grown[s], 8);
            moved++;
        }
    assert_true(moved > SHARDS / 9 / 2 && moved < SHARDS / 9 * 2);
}

static void test_order_independent(void **state)
{
    (void)state;
    const char *a[] = {"a", "b", "c", "d"}, *b[] = {"d", "b", "a", "c"};
    for (uint32_t s = 0; s < 256; s++)
        assert_string_equal(a[bw__placement_owner(a, 4, s)], b[bw__placement_owner(b, 4, s)]);
}

static void test_hash_spreads_consecutive(void **state)
{
    (void)state;
    int count[16] = {0};
    for (uint64_t i = 0; i < 16000; i++)
        count[bw__placement_shard(i, 1, 16, BW_SHARD_HASH)]++;
    for (int s = 0; s < 16; s++)
        assert_true(count[s] > 850 && count[s] < 1150);
}

/* A block of neighbouring samples lands on one shard; the next block on the next shard. */
static void test_blocks(void **state)
{
    (void)state;
    for (uint64_t i = 0; i < 4096; i++) {
        assert_int_equal(bw__placement_shard(i, 64, 256, BW_SHARD_MODULO), (i / 64) % 256);
        assert_int_equal(bw__placement_shard(i, 64, 256, BW_SHARD_HASH),
                         bw__placement_shard(i / 64, 1, 256, BW_SHARD_HASH));
    }
    uint64_t big = (1ull << 40) + 12345;
    assert_int_equal(bw__placement_shard(big, 1u << 31, 7, BW_SHARD_MODULO), (big >> 31) % 7);
    assert_int_equal(bw__placement_shard(big, 1000, 7, BW_SHARD_MODULO), (big / 1000) % 7);
}

/* The loader's block: the largest power of two of mean-sized samples within 64 KiB that still
 * leaves a block for every shard; 1 when samples are large or the dataset small. */
static void test_loader_block(void **state)
{
    (void)state;
    /* 2^18 samples of 256 B (64 MiB): 256 of them make 64 KiB */
    assert_int_equal(bw__placement_block(1u << 18, 64ull << 20, 256), 256);
    /* a header's bytes spread over the samples round away; a mean of 257 B takes 128 */
    assert_int_equal(bw__placement_block(1u << 18, (64ull << 20) + 128, 256), 256);
    assert_int_equal(bw__placement_block(1u << 18, 257ull << 18, 256), 128);
    assert_int_equal(bw__placement_block(65536, 256ull << 20, 256), 16);     /* 4 KiB */
    assert_int_equal(bw__placement_block(8192, 512ull << 20, 256), 1);       /* 64 KiB */
    assert_int_equal(bw__placement_block(512, 512ull << 20, 256), 1);        /* 1 MiB */
    assert_int_equal(bw__placement_block(1003, 1003 * 200, 256), 2);         /* small: 1003 / 256 */
    assert_int_equal(bw__placement_block(255, 255, 256), 1);                 /* fewer than shards */
    assert_int_equal(bw__placement_block(0, 0, 256), 1);                     /* empty */
    assert_int_equal(bw__placement_block(1ull << 40, 0, 256), 65536);        /* empty samples */
    assert_int_equal(bw__placement_block(1ull << 20, 1ull << 20, 1), 65536); /* one shard */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned),
        cmocka_unit_test(test_remove_moves_only_its_shards),
        cmocka_unit_test(test_order_independent),
        cmocka_unit_test(test_hash_spreads_consecutive),
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_loader_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
