/* A bump allocator released all at once: one per RPC, so protobuf-c unpacks into it and a
 * handler's response lives in it until the call completes. */
#ifndef BW_COMMON_ARENA_H
#define BW_COMMON_ARENA_H

#include <stddef.h>
#include <protobuf-c/protobuf-c.h>

typedef struct bw_arena_chunk bw_arena_chunk;

typedef struct bw_arena {
    bw_arena_chunk *head;
    size_t used;           /* bytes handed out, all chunks */
    size_t limit;          /* hard cap on `used`; 0: none */
    ProtobufCAllocator pb; /* protobuf-c allocator backed by this arena */
} bw_arena;

/* Prepares an empty arena whose total allocations may not exceed `limit` bytes (0: no cap). */
void bw__arena_init(bw_arena *a, size_t limit);

/* 16-byte aligned memory valid until bw__arena_reset; NULL when out of memory or over limit. */
void *bw__arena_alloc(bw_arena *a, size_t size);

/* A copy of `s` in the arena, or NULL. */
char *bw__arena_strdup(bw_arena *a, const char *s);

/* Frees everything; the arena can be used again. */
void bw__arena_reset(bw_arena *a);

#endif
