/* The per-RPC bump allocator (arena.h): blocks that grow and are released all at once. */
#include "common/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct bw_arena_chunk {
    bw_arena_chunk *next;
    size_t size, off;
    _Alignas(16) unsigned char data[];
};

enum { CHUNK_MIN = 4096 - sizeof(bw_arena_chunk) };

static void *pb_alloc(void *ud, size_t size)
{
    return bw__arena_alloc(ud, size);
}

static void pb_free(void *ud, void *p)
{
    (void)ud;
    (void)p; /* released with the arena */
}

void bw__arena_init(bw_arena *a, size_t limit)
{
    a->head = NULL;
    a->used = 0;
    a->limit = limit;
    a->pb.alloc = pb_alloc;
    a->pb.free = pb_free;
    a->pb.allocator_data = a;
}

void *bw__arena_alloc(bw_arena *a, size_t size)
{
    size_t need = (size + 15) & ~(size_t)15;
    if (need < size || (a->limit && (need > a->limit || a->used > a->limit - need)))
        return NULL;
    bw_arena_chunk *c = a->head;
    if (!c || c->size - c->off < need) {
        size_t csize = need > CHUNK_MIN ? need : CHUNK_MIN;
        if (c && csize < c->size * 2 && c->size * 2 <= (1u << 20))
            csize = c->size * 2;
        c = malloc(sizeof(*c) + csize);
        if (!c)
            return NULL;
        c->size = csize;
        c->off = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->off;
    c->off += need;
    a->used += need;
    return p;
}

char *bw__arena_strdup(bw_arena *a, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = bw__arena_alloc(a, n);
    if (p)
        memcpy(p, s, n);
    return p;
}

void bw__arena_reset(bw_arena *a)
{
    bw_arena_chunk *c = a->head;
    while (c) {
        bw_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}
