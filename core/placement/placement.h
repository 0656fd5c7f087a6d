/*
 * Placement: which storage shard a sample belongs to, and which live worker serves a shard.
 * sample -> shard by modulo or a hash of the index (streams: of the source's position or
 * path); shard -> worker by rendezvous (highest random weight) hashing over the live workers'
 * ids, so losing a worker moves only that worker's shards and adding one takes about 1/n of
 * every other's. Pure functions: no I/O, no globals, and nothing about sample order.
 */
#ifndef BW_PLACEMENT_PLACEMENT_H
#define BW_PLACEMENT_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

typedef enum bw_shard_mode {
    BW_SHARD_MODULO = 0, /* shard = index % num_shards */
    BW_SHARD_HASH = 1,   /* shard = mix64(index) % num_shards */
} bw_shard_mode;

/* The splitmix64 finalizer: a bijection on 64-bit words with good avalanche. */
uint64_t bw__placement_mix64(uint64_t x);

/* 64-bit FNV-1a of len bytes. */
uint64_t bw__placement_hash_bytes(const void *p, size_t len);

/* The shard of map-style sample `index` (num_shards >= 1). */
uint32_t bw__placement_shard(uint64_t index, uint32_t num_shards, bw_shard_mode mode);

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
