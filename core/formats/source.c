/* Shared by every reader: mappings, the format registry, error sentences, sources over
 * memory (tests and fuzzers). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "formats/formats.h"

bw__mapping *bw__mapping_map(int fd, size_t len)
{
    bw__mapping *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    atomic_init(&m->refs, 1);
    m->len = len;
    if (len == 0)
        return m; /* base NULL: nothing to read */
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        free(m);
        errno = e;
        return NULL;
    }
    m->base = p;
    m->mapped = true;
    return m;
}

bw__mapping *bw__mapping_wrap(void *mem, size_t len)
{
    bw__mapping *m = calloc(1, sizeof(*m));
    if (!m) {
        free(mem);
        return NULL;
    }
    atomic_init(&m->refs, 1);
    m->base = mem;
    m->len = len;
    return m;
}

bw__mapping *bw__mapping_ref(bw__mapping *m)
{
    if (m)
        atomic_fetch_add(&m->refs, 1);
    return m;
}

void bw__mapping_unref(bw__mapping *m)
{
    if (!m || atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    if (m->mapped)
        munmap((void *)m->base, m->len);
    else
        free((void *)m->base);
    free(m);
}

int bw__starts_open(bw__source *s, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    s->state = calloc(1, sizeof(bw__starts));
    return s->state ? BW_OK : BW_NOMEM;
}

int bw__starts_push(bw__starts *b, uint64_t off)
{
    if (b->n == b->cap) {
        uint64_t cap = b->cap ? b->cap * 2 : 256;
        uint64_t *at = realloc(b->at, cap * sizeof(*at));
        if (!at)
            return BW_NOMEM;
        b->at = at;
        b->cap = cap;
    }
    b->at[b->n++] = off;
    return BW_OK;
}

void bw__starts_install(bw__source *s, bw__starts *b)
{
    bw__starts *st = s->state;
    free(st->at);
    *st = *b;
    s->count = b->n;
    s->indexed = true;
}

uint64_t bw__starts_offset(const bw__source *s, uint64_t i)
{
    const bw__starts *st = s->state;
    return i < st->n ? st->at[i] : s->size;
}

void bw__starts_close(bw__source *s)
{
    bw__starts *st = s->state;
    if (st)
        free(st->at);
    free(st);
    s->state = NULL;
}

void bw__record_release(bw__record *r)
{
    if (r->owner_is_own)
        bw__mapping_unref(r->owner);
    r->owner = NULL;
    r->owner_is_own = false;
}

static const bw__format_ops *const formats[] = {
    &bw__fmt_npy, &bw__fmt_tfrecord, &bw__fmt_files, &bw__fmt_jsonl, &bw__fmt_text, &bw__fmt_tar,
};
enum { NFORMATS = sizeof(formats) / sizeof(formats[0]) };

const bw__format_ops *bw__format_find(const char *name)
{
    for (size_t i = 0; i < NFORMATS; i++)
        if (strcmp(formats[i]->name, name) == 0)
            return formats[i];
    return NULL;
}

const char *const *bw__format_names(size_t *n)
{
    static const char *const names[] = {"npy", "tfrecord", "files", "jsonl", "text", "tar"};
    _Static_assert(sizeof(names) / sizeof(names[0]) == NFORMATS, "one name per format");
    *n = NFORMATS;
    return names;
}

int bw__fmt_fail(const bw__source *s, int rc, uint64_t off, char *err, size_t errlen,
                 const char *fmt, ...)
{
    if (!err || errlen == 0)
        return rc;
    int n = snprintf(err, errlen, "%s: offset %llu: ", s->path, (unsigned long long)off);
    if (n < 0 || (size_t)n >= errlen)
        return rc;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return rc;
}

int bw__source_from_memory(const bw__format_ops *ops, const char *name, const void *data,
                           size_t len, bw__source **out, char *err, size_t errlen)
{
    bw__source *s = calloc(1, sizeof(*s));
    void *copy = malloc(len ? len : 1);
    if (!s || !copy) {
        free(s);
        free(copy);
        snprintf(err, errlen, "out of memory");
        return BW_NOMEM;
    }
    if (len)
        memcpy(copy, data, len);
    s->ops = ops;
    snprintf(s->path, sizeof(s->path), "%s", name);
    s->map = bw__mapping_wrap(copy, len);
    if (!s->map) {
        free(s);
        return BW_NOMEM;
    }
    s->size = len;
    int rc = ops->open(s, err, errlen);
    if (rc != BW_OK) {
        bw__source_free(s);
        return rc;
    }
    *out = s;
    return BW_OK;
}

void bw__source_free(bw__source *s)
{
    if (!s)
        return;
    if (s->ops && s->ops->close)
        s->ops->close(s);
    bw__mapping_unref(s->map);
    free(s);
}
