/* Placement (placement.h): sample to shard, and shard to live worker by rendezvous hashing.
 * Pure functions. */
#include "placement/placement.h"

#include <string.h>

uint64_t bw__placement_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t bw__placement_hash_bytes(const void *p, size_t len)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint32_t bw__placement_shard(uint64_t index, uint32_t block, uint32_t num_shards,
                             bw_shard_mode mode)
{
    if (num_shards <= 1)
        return 0;
    /* the loader's blocks are powers of two: a shift, not a division */
    if (block > 1)
        index = (block & (block - 1)) ? index / block : index >> __builtin_ctz(block);
    uint64_t k = mode == BW_SHARD_HASH ? bw__placement_mix64(index) : index;
    /* a mask for a power of two (256, the loader's: no division, about a tenth of a
     * nanosecond instead of several, once a sample on each side) */
    return (uint32_t)((num_shards & (num_shards - 1)) ? k % num_shards : k & (num_shards - 1));
}

uint32_t bw__placement_block(uint64_t length, uint64_t total_bytes, uint32_t num_shards)
{
    if (length == 0)
        return 1;
    /* the mean size (a file's header, spread over its samples, rounds away) */
    uint64_t mean = total_bytes / length;
    uint64_t shards = num_shards ? num_shards : 1;
    uint32_t b = 1;
    while (b < (1u << 30) && (uint64_t)b * 2 * (mean ? mean : 1) <= BW_PLACEMENT_BLOCK_BYTES &&
           (uint64_t)b * 2 * shards <= length)
        b *= 2;
    return b;
}

uint32_t bw__placement_stream_shard(uint32_t position, const char *path, uint32_t num_shards,
                                    bw_shard_mode mode)
{
    if (num_shards <= 1)
        return 0;
    if (mode == BW_SHARD_HASH)
        return (uint32_t)(bw__placement_mix64(bw__placement_hash_bytes(path, strlen(path))) %
                          num_shards);
    return position % num_shards;
}

uint64_t bw__placement_score(const char *worker_id, uint32_t shard)
{
    uint64_t h = bw__placement_hash_bytes(worker_id, strlen(worker_id));
    return bw__placement_mix64(h ^ bw__placement_mix64((uint64_t)shard + 0x9e3779b97f4a7c15ull));
}

size_t bw__placement_owner(const char *const *ids, size_t n, uint32_t shard)
{
    size_t best = 0;
    uint64_t best_score = bw__placement_score(ids[0], shard);
    for (size_t i = 1; i < n; i++) {
        uint64_t sc = bw__placement_score(ids[i], shard);
        if (sc > best_score || (sc == best_score && strcmp(ids[i], ids[best]) < 0)) {
            best = i;
            best_score = sc;
        }
    }
    return best;
}
