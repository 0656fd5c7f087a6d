/* Open datasets, keyed by format and source list, shared by concurrent requests. An entry is
 * re-checked against its files (bw__dataset_changed: device, inode, size, mtime, ctime) at
 * most once a second, and at the next request after a read found one of its files changed
 * (bw__ds_stale), and reopened when one changed; the
 * least recently used entries beyond CACHE_MAX are dropped (requests using them keep them
 * alive until they finish).
 *
 * No file is opened, indexed or stat'ed under the cache's lock: the first request for a
 * dataset puts an OPENING entry in the cache and opens it unlocked; later requests for the same
 * dataset wait on the condition for it (and share its result, good or bad), and requests for
 * other datasets never wait behind it. A failed open is not cached: the next request tries
 * again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "data.h"
#include "metrics.h"

enum { CACHE_MAX = 64, RECHECK_MS = 1000 };

typedef enum { OPENING, READY, FAILED } wds_state;

struct bw__wds {
    atomic_long refs; /* the cache's (while in it) and each user's */
    bw__dataset *d;
    char *key;
    size_t keylen;
    uint64_t checked_ms, used_ms;
    wds_state state;
    bool checking;           /* a request is comparing it with its files, unlocked */
    atomic_bool stale;       /* a read found a file changed: compare at the next request */
    atomic_bool index_timed; /* bw__ds_index: the first call is timed */
    bw__wm *metrics;         /* the cache's */
    int rc;                  /* FAILED: the open's error, for the requests that waited for it */
    char err[1024];
    char changed[512]; /* reopened because a source changed: which and how ("" otherwise) */
};

struct bw__ds_cache {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* an entry left OPENING */
    char *root;
    bw__wds **e;
    size_t n, cap;
    bw__wm *metrics; /* opening and indexing are timed here; NULL: not */
};

bw__ds_cache *bw__ds_cache_new(const char *root)
{
    bw__ds_cache *c = calloc(1, sizeof(*c));
    if (c && !(c->root = strdup(root))) {
        free(c);
        c = NULL;
    }
    if (!c)
        return NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

void bw__ds_cache_set_metrics(bw__ds_cache *c, bw__wm *m)
{
    c->metrics = m;
}

void bw__ds_cache_counts(bw__ds_cache *c, size_t *datasets, size_t *files)
{
    *datasets = *files = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i]->state == READY) {
            (*datasets)++;
            *files += bw__dataset_nfiles(c->e[i]->d);
        }
    pthread_mutex_unlock(&c->mu);
}

int bw__ds_index(bw__wds *e, char *err, size_t errlen)
{
    /* The first caller times the indexing: it does it, or waits for the request that does. */
    bool first = e->metrics && !atomic_exchange(&e->index_timed, true);
    uint64_t t0 = first ? bw__mono_ns() : 0;
    int rc = bw__dataset_index(e->d, err, errlen);
    if (first && rc == BW_OK)
        bw__wm_indexed(e->metrics, e->d->ops->name, t0);
    return rc;
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
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->root);
    free(c);
}

void bw__ds_stale(bw__wds *e)
{
    atomic_store(&e->stale, true);
}

bw__dataset *bw__ds_dataset(bw__wds *e)
{
    return e->d;
}

const char *bw__ds_changed(const bw__wds *e)
{
    return e->changed;
}

/* Appends the strings v[0..n) with their NULs to k (at *off; k NULL: only counts). */
static void key_add(char *k, size_t *off, char *const *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(v[i]) + 1;
        if (k)
            memcpy(k + *off, v[i], l);
        *off += l;
    }
}

/* format NUL source NUL source NUL ..., then for each field (named arrays) "\x01" NUL name NUL
 * format NUL its sources (names and paths hold no control character: checked at creation);
 * NULL when out of memory. */
static char *make_key(const Batchwire__V1__Dataset *spec, size_t *len)
{
    static char *const mark[] = {"\x01"};
    char *k = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        key_add(k, &off, &spec->format, 1);
        key_add(k, &off, spec->sources, spec->n_sources);
        for (size_t f = 0; f < spec->n_fields; f++) {
            const Batchwire__V1__DatasetField *df = spec->fields[f];
            key_add(k, &off, mark, 1);
            key_add(k, &off, &df->name, 1);
            key_add(k, &off, &df->format, 1);
            key_add(k, &off, df->sources, df->n_sources);
        }
        if (pass == 0 && !(k = malloc(off)))
            return NULL;
        *len = off;
    }
    return k;
}

/* Opens the dataset spec describes: plain, or named arrays (format "fields"). */
static int open_spec(const char *root, const Batchwire__V1__Dataset *spec, bw__dataset **d,
                     char *err, size_t errlen)
{
    bool fields = strcmp(spec->format, "fields") == 0;
    if (fields && spec->n_sources) {
        snprintf(err, errlen,
                 "a dataset of format fields lists no sources of its own (each "
                 "field lists its files)");
        return BW_INVALID_ARGUMENT;
    }
    if (!fields) {
        if (spec->n_fields) {
            snprintf(err, errlen, "the dataset lists fields but its format is '%.32s', not fields",
                     spec->format);
            return BW_INVALID_ARGUMENT;
        }
        return bw__dataset_open(root, spec->format, (const char *const *)spec->sources,
                                spec->n_sources, d, err, errlen);
    }
    if (spec->n_fields == 0 || spec->n_fields > BW_FMT_MAX_FIELDS) {
        snprintf(err, errlen, "a dataset of named arrays has 1 to %d fields (got %zu)",
                 BW_FMT_MAX_FIELDS, spec->n_fields);
        return BW_INVALID_ARGUMENT;
    }
    bw__field_spec f[BW_FMT_MAX_FIELDS];
    size_t total = 0; /* every field's sources together, bounded as one list's */
    for (size_t i = 0; i < spec->n_fields; i++) {
        const Batchwire__V1__DatasetField *df = spec->fields[i];
        total += df->n_sources;
        if (total > BW_DATASET_MAX_SOURCES) {
            snprintf(err, errlen, "the fields list more than %d sources together",
                     BW_DATASET_MAX_SOURCES);
            return BW_TOO_BIG;
        }
        f[i] =
            (bw__field_spec){df->name, df->format, (const char *const *)df->sources, df->n_sources};
    }
    return bw__dataset_open_fields(root, f, spec->n_fields, d, err, errlen);
}

static bw__wds *find(bw__ds_cache *c, const char *key, size_t keylen)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i]->keylen == keylen && memcmp(c->e[i]->key, key, keylen) == 0)
            return c->e[i];
    return NULL;
}

/* Takes e out of the cache (when it is still there) and drops the cache's reference. */
static void drop(bw__ds_cache *c, bw__wds *e)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i] == e) {
            c->e[i] = c->e[--c->n];
            bw__ds_put(e);
            return;
        }
}

/* Drops least recently used READY entries while the cache holds more than CACHE_MAX. */
static void trim(bw__ds_cache *c)
{
    while (c->n > CACHE_MAX) {
        bw__wds *lru = NULL;
        for (size_t i = 0; i < c->n; i++)
            if (c->e[i]->state == READY && (!lru || c->e[i]->used_ms < lru->used_ms))
                lru = c->e[i];
        if (!lru)
            return; /* every entry is being opened: they are dropped later */
        drop(c, lru);
    }
}

/* A new OPENING entry in the cache, referenced by the cache and the caller (c->mu held); NULL
 * when out of memory. Takes over key. */
static bw__wds *add_opening(bw__ds_cache *c, char *key, size_t keylen)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : CACHE_MAX;
        bw__wds **ne = realloc(c->e, cap * sizeof(*ne));
        if (!ne)
            return NULL;
        c->e = ne;
        c->cap = cap;
    }
    bw__wds *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    atomic_init(&e->refs, 2);
    e->key = key;
    e->keylen = keylen;
    e->state = OPENING;
    c->e[c->n++] = e;
    return e;
}

bool bw__ds_ready(bw__ds_cache *c, const Batchwire__V1__Dataset *spec)
{
    if (!spec || !spec->format || spec->n_sources > BW_DATASET_MAX_SOURCES)
        return false;
    size_t keylen = 0;
    char *key = make_key(spec, &keylen);
    if (!key)
        return false;
    uint64_t now = bw__mono_ms();
    pthread_mutex_lock(&c->mu);
    const bw__wds *e = find(c, key, keylen);
    bool ready = e && e->state == READY &&
                 (e->checking || (!atomic_load(&e->stale) && now <= e->checked_ms + RECHECK_MS));
    pthread_mutex_unlock(&c->mu);
    free(key);
    return ready;
}

int bw__ds_get(bw__ds_cache *c, const Batchwire__V1__Dataset *spec, bw__wds **out, char *err,
               size_t errlen)
{
    *out = NULL;
    if (!spec || !spec->format || !spec->format[0]) {
        snprintf(err, errlen, "the request names no dataset format");
        return BW_INVALID_ARGUMENT;
    }
    if (spec->n_sources > BW_DATASET_MAX_SOURCES) {
        snprintf(err, errlen, "%zu sources is more than the limit of %d", spec->n_sources,
                 BW_DATASET_MAX_SOURCES);
        return BW_TOO_BIG;
    }
    size_t keylen = 0;
    char *key = make_key(spec, &keylen);
    if (!key) {
        snprintf(err, errlen, "out of memory for the dataset's name");
        return BW_NOMEM;
    }
    uint64_t now = bw__mono_ms();
    pthread_mutex_lock(&c->mu);
    bw__wds *e;
    char changed_why[512] = "";
    while ((e = find(c, key, keylen)) != NULL) {
        atomic_fetch_add(&e->refs, 1);
        while (e->state == OPENING)
            pthread_cond_wait(&c->cv, &c->mu);
        if (e->state == FAILED) {
            int rc = e->rc;
            snprintf(err, errlen, "%s", e->err);
            pthread_mutex_unlock(&c->mu);
            bw__ds_put(e);
            free(key);
            return rc;
        }
        if (e->checking || (!atomic_load(&e->stale) && now <= e->checked_ms + RECHECK_MS))
            break;
        e->checking = true;
        atomic_store(&e->stale, false);
        e->checked_ms = now;
        pthread_mutex_unlock(&c->mu);
        bool changed = bw__dataset_changed(e->d, changed_why, sizeof(changed_why));
        pthread_mutex_lock(&c->mu);
        e->checking = false;
        if (!changed)
            break;
        BW_INFO("a source changed on disk; reopening the dataset dataset=%s:%s err=%s",
                spec->format, bw__ds_spec_first(spec), changed_why);
        drop(c, e);
        /* Our reference (taken above) outlives the cache's, which drop gave back: the
         * analyzer does not follow the count. */
        // NOLINTNEXTLINE(clang-analyzer-unix.Malloc)
        bw__ds_put(e); /* requests still using it keep it until they finish */
    }
    if (e) {
        e->used_ms = now;
        pthread_mutex_unlock(&c->mu);
        free(key);
        *out = e;
        return BW_OK;
    }
    e = add_opening(c, key, keylen);
    if (!e) {
        pthread_mutex_unlock(&c->mu);
        free(key);
        snprintf(err, errlen, "out of memory for the dataset cache");
        return BW_NOMEM;
    }
    e->metrics = c->metrics;
    snprintf(e->changed, sizeof(e->changed), "%s", changed_why);
    pthread_mutex_unlock(&c->mu);

    bw__dataset *d = NULL;
    uint64_t t0 = bw__mono_ns();
    int rc = open_spec(c->root, spec, &d, err, errlen);
    if (rc == BW_OK)
        bw__wm_opened(c->metrics, d->ops->name, t0);

    pthread_mutex_lock(&c->mu);
    e->d = d;
    e->checked_ms = e->used_ms = now;
    e->state = rc == BW_OK ? READY : FAILED;
    if (rc != BW_OK) {
        e->rc = rc;
        snprintf(e->err, sizeof(e->err), "%s", err);
        drop(c, e);
    }
    trim(c);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (rc != BW_OK) {
        bw__ds_put(e);
        return rc;
    }
    *out = e;
    return BW_OK;
}
