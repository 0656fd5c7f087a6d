/*
 * Placement: which storage shard a sample belongs to, and which live worker serves a shard.
 * sample -> block of neighbouring samples (index / block; block 1: the sample itself) -> shard
 * by modulo or a hash of the block's number (streams: of the source's position or path);
 * shard -> worker by rendezvous (highest random weight) hashing over the live workers'
 * ids, so losing a worker moves only that worker's shards and adding one takes about 1/n of
 * every other's. Pure functions: no I/O, no globals, and nothing about sample order.
 */
#ifndef BW_PLACEMENT_PLACEMENT_H
#define BW_PLACEMENT_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

typedef enum bw_shard_mode {
    BW_SHARD_MODULO = 0, /* shard = (index / block) % num_shards */
    BW_SHARD_HASH = 1,   /* shard = mix64(index / block) % num_shards */
} bw_shard_mode;

/* The splitmix64 finalizer: a bijection on 64-bit words with good avalanche. */
uint64_t bw__placement_mix64(uint64_t x);

/* 64-bit FNV-1a of len bytes. */
uint64_t bw__placement_hash_bytes(const void *p, size_t len);

/* The shard of map-style sample `index`: that of its block of `block` neighbouring samples
 * (0 or 1: of the sample alone; num_shards >= 1). */
uint32_t bw__placement_shard(uint64_t index, uint32_t block, uint32_t num_shards,
                             bw_shard_mode mode);

enum {
    /* The most bytes of neighbouring samples the loader places together (bw__placement_block) */
    BW_PLACEMENT_BLOCK_BYTES = 64 << 10,
};

/* The loader's block for a dataset of `length` samples and `total_bytes` bytes routed over
 * num_shards shards: the largest power of two of samples whose mean size (total_bytes /
 * length, rounded down) in all makes at most BW_PLACEMENT_BLOCK_BYTES and that still gives
 * every shard a block (block * num_shards <= length); 1 when none is larger (docs/formats.md,
 * "Shards and placement"). */
uint32_t bw__placement_block(uint64_t length, uint64_t total_bytes, uint32_t num_shards);

/* The shard of stream source number `position` named `path` (hash mode hashes the path, so a
 * source keeps its shard when others are added). */
uint32_t bw__placement_stream_shard(uint32_t position, const char *path, uint32_t num_shards,
                                    bw_shard_mode mode);

/* Rendezvous weight of (worker, shard). */
uint64_t bw__placement_score(const char *worker_id, uint32_t shard);

/* The index in ids[0..n) of the owner of `shard`: the highest score, ties to the smaller id.
 * n must be >= 1. */
size_t bw__placement_owner(const char *const *ids, size_t n, uint32_t shard);

#endif
