/* Open datasets, keyed by format and source list, shared by concurrent requests. An entry is
 * re-checked against its files at most once a second and reopened when one changed; the
 * least recently used entries beyond CACHE_MAX are dropped (requests using them keep them
 * alive until they finish). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "data.h"

enum { CACHE_MAX = 64, RECHECK_MS = 1000 };

struct bw__wds {
    atomic_long refs;
    bw__dataset *d;
    char *key;
    size_t keylen;
    uint64_t checked_ms, used_ms;
};

struct bw__ds_cache {
    pthread_mutex_t mu;
    char *root;
    bw__wds *e[CACHE_MAX];
    size_t n;
};

bw__ds_cache *bw__ds_cache_new(const char *root)
{
    bw__ds_cache *c = calloc(1, sizeof(*c));
    if (!c || !(c->root = strdup(root)))
        abort();
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void bw__ds_put(bw__wds *e)
{
    if (!e || atomic_fetch_sub(&e->refs, 1) != 1)
        return;
    bw__dataset_free(e->d);
    free(e->key);
    free(e);
}

void bw__ds_cache_free(bw__ds_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        bw__ds_put(c->e[i]);
    pthread_mutex_destroy(&c->mu);
    free(c->root);
    free(c);
}

bw__dataset *bw__ds_dataset(bw__wds *e)
{
    return e->d;
}

/* format NUL source NUL source NUL ... */
static char *make_key(const Batchwire__V1__Dataset *spec, size_t *len)
{
    size_t n = strlen(spec->format) + 1;
    for (size_t i = 0; i < spec->n_sources; i++)
        n += strlen(spec->sources[i]) + 1;
    char *k = malloc(n);
    if (!k)
        abort();
    size_t off = 0;
    size_t l = strlen(spec->format) + 1;
    memcpy(k, spec->format, l);
    off += l;
    for (size_t i = 0; i < spec->n_sources; i++) {
        l = strlen(spec->sources[i]) + 1;
        memcpy(k + off, spec->sources[i], l);
        off += l;
    }
    *len = n;
    return k;
}

static void drop(bw__ds_cache *c, size_t i)
{
    bw__ds_put(c->e[i]);
    c->e[i] = c->e[--c->n];
}

int bw__ds_get(bw__ds_cache *c, const Batchwire__V1__Dataset *spec, bw__wds **out, char *err,
               size_t errlen)
{
    if (!spec || !spec->format || !spec->format[0]) {
        snprintf(err, errlen, "the request names no dataset format");
        return BW_INVALID_ARGUMENT;
    }
    if (spec->n_sources > BW_DATASET_MAX_SOURCES) {
        snprintf(err, errlen, "%zu sources is more than the limit of %d", spec->n_sources,
                 BW_DATASET_MAX_SOURCES);
        return BW_TOO_BIG;
    }
    size_t keylen;
    char *key = make_key(spec, &keylen);
    uint64_t now = bw__mono_ms();
    int rc = BW_OK;
    pthread_mutex_lock(&c->mu);
    bw__wds *e = NULL;
    for (size_t i = 0; i < c->n; i++) {
        if (c->e[i]->keylen == keylen && memcmp(c->e[i]->key, key, keylen) == 0) {
            e = c->e[i];
            if (now - e->checked_ms > RECHECK_MS) {
                e->checked_ms = now;
                if (bw__dataset_changed(e->d)) {
                    BW_INFO("dataset %s over %s: a source changed on disk; reopening", spec->format,
                            spec->n_sources ? spec->sources[0] : "");
                    drop(c, i);
                    e = NULL;
                }
            }
            break;
        }
    }
    if (!e) {
        bw__dataset *d = NULL;
        rc = bw__dataset_open(c->root, spec->format, (const char *const *)spec->sources,
                              spec->n_sources, &d, err, errlen);
        if (rc == BW_OK) {
            e = calloc(1, sizeof(*e));
            if (!e)
                abort();
            atomic_init(&e->refs, 1);
            e->d = d;
            e->key = key;
            key = NULL;
            e->keylen = keylen;
            e->checked_ms = now;
            if (c->n == CACHE_MAX) {
                size_t lru = 0;
                for (size_t i = 1; i < c->n; i++)
                    if (c->e[i]->used_ms < c->e[lru]->used_ms)
                        lru = i;
                drop(c, lru);
            }
            c->e[c->n++] = e;
        }
    }
    if (e) {
        e->used_ms = now;
        atomic_fetch_add(&e->refs, 1);
    }
    pthread_mutex_unlock(&c->mu);
    free(key);
    *out = e;
    return rc;
}
