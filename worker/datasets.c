/* Open datasets, keyed by format and canonical file set, shared by concurrent requests. An
 * entry is keyed by its files as resolved below the data root (bw__dataset_resolve: globs
 * expanded, "." and symbolic links resolved), so "nl.txt", "./nl.txt", "nl.tx?" and
 * "nl.t?t" are one entry; the spellings requests used are kept as its aliases, so a request
 * spelled as an earlier one finds it without touching the file system. An entry is re-checked
 * against its files (bw__dataset_changed: device, inode, size, mtime, ctime) at most once a
 * second, and at the next request after a read found one of its files changed (bw__ds_stale),
 * and reopened when one changed; the least recently used entries beyond CACHE_MAX are dropped
 * (requests using them keep them alive until they finish).
 *
 * Budgets (docs/operating.md, "Worker budgets"): every open file counts against
 * --max-open-files and every source's memory and record index (8 bytes a line) against
 * --dataset-memory-bytes, as they are taken; a take that does not fit first drops idle cached
 * datasets (no request using them), least recently used first, then fails: BW_TOO_BIG when
 * the dataset alone is over the budget, BW_BUSY when datasets in use hold it. The sources a
 * dataset lists after glob expansion are bounded by --max-sources.
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

enum { CACHE_MAX = 64, RECHECK_MS = 1000, ALIAS_MAX = 8 /* spellings kept per entry */ };

typedef enum { OPENING, READY, FAILED } wds_state;

struct bw__wds {
    atomic_long refs; /* the cache's (while in it) and each user's */
    bw__dataset *d;
    struct bw__ds_cache *cache;
    char *key; /* the canonical key (canon_key) */
    size_t keylen;
    char *alias[ALIAS_MAX]; /* request spellings (make_key) that name it */
    size_t aliaslen[ALIAS_MAX];
    unsigned nalias, next_alias;
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
    bw__ds_limits lim;
    bw__budget files, memory;
};

static void reclaim_idle(void *ctx, bw__budget *b, uint64_t want);

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
    c->files = (bw__budget){
        .what = "open files", .flag = "--max-open-files", .reclaim = reclaim_idle, .ctx = c};
    c->memory = (bw__budget){.what = "bytes of dataset memory (sources and record indexes, "
                                     "8 bytes a line)",
                             .flag = "--dataset-memory-bytes",
                             .reclaim = reclaim_idle,
                             .ctx = c};
    atomic_init(&c->files.used, 0);
    atomic_init(&c->memory.used, 0);
    return c;
}

void bw__ds_cache_set_limits(bw__ds_cache *c, const bw__ds_limits *lim)
{
    c->lim = *lim;
    c->files.limit = lim->max_open_files;
    c->memory.limit = lim->memory_bytes;
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

static void drop(bw__ds_cache *c, bw__wds *e);

int bw__ds_index(bw__wds *e, char *err, size_t errlen)
{
    /* The first caller times the indexing: it does it, or waits for the request that does. */
    bool first = e->metrics && !atomic_exchange(&e->index_timed, true);
    uint64_t t0 = first ? bw__mono_ns() : 0;
    int rc = bw__dataset_index(e->d, err, errlen);
    if (first && rc == BW_OK)
        bw__wm_indexed(e->metrics, e->d->ops->name, t0);
    if ((rc == BW_BUSY || rc == BW_TOO_BIG || rc == BW_NOMEM) && e->cache) {
        /* An index refused by a budget is kept by the dataset: the entry leaves the cache so
         * that the next request opens and indexes it again (its memory goes with the last
         * request using it). */
        pthread_mutex_lock(&e->cache->mu);
        drop(e->cache, e);
        pthread_mutex_unlock(&e->cache->mu);
    }
    return rc;
}

void bw__ds_put(bw__wds *e)
{
    if (!e || atomic_fetch_sub(&e->refs, 1) != 1)
        return;
    bw__dataset_free(e->d);
    free(e->key);
    for (unsigned i = 0; i < e->nalias; i++)
        free(e->alias[i]);
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

/* A request's dataset resolved below the root: each part's canonical paths (what it is opened
 * with) and its canonical key. Part 0 is a plain dataset's sources; for named arrays, part k
 * is field k's. */
typedef struct resolved {
    size_t nparts;
    bw__paths canon[BW_FMT_MAX_FIELDS];
    char *key;
    size_t keylen;
} resolved;

static void resolved_free(resolved *r)
{
    for (size_t i = 0; i < r->nparts; i++)
        bw__paths_free(&r->canon[i]);
    free(r->key);
    memset(r, 0, sizeof(*r));
}

/* Appends bytes to a growing key; false when out of memory. */
static bool key_put(char **k, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n > *cap) {
        size_t nc = (*cap ? *cap * 2 : 256);
        while (nc < *len + n)
            nc *= 2;
        char *nk = realloc(*k, nc);
        if (!nk)
            return false;
        *k = nk;
        *cap = nc;
    }
    memcpy(*k + *len, p, n);
    *len += n;
    return true;
}

static bool key_str(char **k, size_t *len, size_t *cap, const char *str)
{
    return key_put(k, len, cap, str, strlen(str) + 1);
}

/* Checks the spec's shape (plain or named arrays) before any file is touched. */
static int check_spec(const Batchwire__V1__Dataset *spec, char *err, size_t errlen)
{
    bool fields = strcmp(spec->format, "fields") == 0;
    if (fields && spec->n_sources) {
        snprintf(err, errlen,
                 "a dataset of format fields lists no sources of its own (each "
                 "field lists its files)");
        return BW_INVALID_ARGUMENT;
    }
    if (!fields && spec->n_fields) {
        snprintf(err, errlen, "the dataset lists fields but its format is '%.32s', not fields",
                 spec->format);
        return BW_INVALID_ARGUMENT;
    }
    if (fields && (spec->n_fields == 0 || spec->n_fields > BW_FMT_MAX_FIELDS)) {
        snprintf(err, errlen, "a dataset of named arrays has 1 to %d fields (got %zu)",
                 BW_FMT_MAX_FIELDS, spec->n_fields);
        return BW_INVALID_ARGUMENT;
    }
    size_t total = 0; /* every field's sources together, bounded as one list's */
    for (size_t i = 0; i < spec->n_fields; i++)
        total += spec->fields[i]->n_sources;
    if (total > BW_DATASET_MAX_SOURCES) {
        snprintf(err, errlen, "the fields list more than %d sources together",
                 BW_DATASET_MAX_SOURCES);
        return BW_TOO_BIG;
    }
    return BW_OK;
}

static bw__open_opts open_opts(bw__ds_cache *c, uint64_t deadline_ms)
{
    return (bw__open_opts){.deadline_ms = deadline_ms,
                           .max_sources = c->lim.max_sources,
                           .max_sources_flag = "--max-sources",
                           .files = &c->files,
                           .memory = &c->memory};
}

/* Expands spec's patterns below the root (bw__dataset_resolve) into r, with the canonical key:
 * format NUL path NUL ..., then for each field "\x01" NUL name NUL format NUL its paths, the
 * paths canonical (names and paths hold no control character: checked at creation). */
static int resolve(bw__ds_cache *c, const Batchwire__V1__Dataset *spec, uint64_t deadline_ms,
                   resolved *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    int rc = check_spec(spec, err, errlen);
    if (rc != BW_OK)
        return rc;
    bw__open_opts o = open_opts(c, deadline_ms);
    size_t len = 0, cap = 0;
    bool ok = key_str(&r->key, &len, &cap, spec->format);
    bool fields = spec->n_fields > 0;
    r->nparts = fields ? spec->n_fields : 1;
    for (size_t k = 0; k < r->nparts && rc == BW_OK; k++) {
        const Batchwire__V1__DatasetField *df = fields ? spec->fields[k] : NULL;
        char *const *pat = df ? df->sources : spec->sources;
        size_t npat = df ? df->n_sources : spec->n_sources;
        if (df)
            ok = ok && key_str(&r->key, &len, &cap, "\x01") &&
                 key_str(&r->key, &len, &cap, df->name) && key_str(&r->key, &len, &cap, df->format);
        char why[768];
        bw__paths spelled;
        if (npat == 0) {
            snprintf(why, sizeof(why), "the dataset lists no sources");
            rc = BW_INVALID_ARGUMENT;
        } else {
            rc = bw__dataset_resolve(c->root, (const char *const *)pat, npat, &o, &spelled,
                                     &r->canon[k], why, sizeof(why));
        }
        if (rc != BW_OK) { /* as bw__dataset_open_fields says it: naming the field */
            snprintf(err, errlen, "%s%s%s%s", df ? "field '" : "", df ? df->name : "",
                     df ? "': " : "", why);
            break;
        }
        for (size_t i = 0; rc == BW_OK && i < r->canon[k].n; i++)
            ok = ok && key_str(&r->key, &len, &cap, r->canon[k].v[i]);
        bw__paths_free(&spelled);
    }
    if (rc == BW_OK && !ok) {
        snprintf(err, errlen, "out of memory for the dataset's name");
        rc = BW_NOMEM;
    }
    r->keylen = len;
    if (rc != BW_OK)
        resolved_free(r);
    return rc;
}

/* Opens the dataset spec describes, with the paths resolve expanded: plain, or named arrays
 * (format "fields"). */
static int open_resolved(bw__ds_cache *c, const Batchwire__V1__Dataset *spec, const resolved *r,
                         uint64_t deadline_ms, bw__dataset **d, char *err, size_t errlen)
{
    bw__open_opts o = open_opts(c, deadline_ms);
    o.literal = true;
    if (spec->n_fields == 0)
        return bw__dataset_open_opts(c->root, spec->format, (const char *const *)r->canon[0].v,
                                     r->canon[0].n, &o, d, err, errlen);
    bw__field_spec f[BW_FMT_MAX_FIELDS];
    for (size_t i = 0; i < spec->n_fields; i++) {
        const Batchwire__V1__DatasetField *df = spec->fields[i];
        f[i] = (bw__field_spec){df->name, df->format, (const char *const *)r->canon[i].v,
                                r->canon[i].n};
    }
    return bw__dataset_open_fields_opts(c->root, f, spec->n_fields, &o, d, err, errlen);
}

/* The entry a request spelled so before, or whose canonical key is key. */
static bw__wds *find(bw__ds_cache *c, const char *key, size_t keylen)
{
    for (size_t i = 0; i < c->n; i++) {
        const bw__wds *e = c->e[i];
        if (e->keylen == keylen && memcmp(e->key, key, keylen) == 0)
            return c->e[i];
        for (unsigned a = 0; a < e->nalias; a++)
            if (e->aliaslen[a] == keylen && memcmp(e->alias[a], key, keylen) == 0)
                return c->e[i];
    }
    return NULL;
}

/* Remembers that requests spelled `key` mean e (a copy; the oldest spelling goes when
 * ALIAS_MAX are kept; out of memory: not remembered). c->mu held. */
static void add_alias(bw__wds *e, const char *key, size_t keylen)
{
    if ((e->keylen == keylen && memcmp(e->key, key, keylen) == 0))
        return;
    for (unsigned a = 0; a < e->nalias; a++)
        if (e->aliaslen[a] == keylen && memcmp(e->alias[a], key, keylen) == 0)
            return;
    char *k = malloc(keylen);
    if (!k)
        return;
    memcpy(k, key, keylen);
    unsigned slot;
    if (e->nalias < ALIAS_MAX) {
        slot = e->nalias++;
    } else {
        slot = e->next_alias++ % ALIAS_MAX;
        free(e->alias[slot]);
    }
    e->alias[slot] = k;
    e->aliaslen[slot] = keylen;
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

/* The least recently used entry no request uses (c->mu held), or NULL. */
static bw__wds *idle_lru(bw__ds_cache *c)
{
    bw__wds *lru = NULL;
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i]->state == READY && atomic_load(&c->e[i]->refs) == 1 &&
            (!lru || c->e[i]->used_ms < lru->used_ms))
            lru = c->e[i];
    return lru;
}

/* A budget is short (bw__budget's reclaim): idle datasets are dropped, least recently used
 * first, until `want` more fits. Each is taken out under the lock and freed outside it. */
static void reclaim_idle(void *ctx, bw__budget *b, uint64_t want)
{
    bw__ds_cache *c = ctx;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        bw__wds *e = idle_lru(c);
        for (size_t i = 0; e && i < c->n; i++)
            if (c->e[i] == e)
                c->e[i] = c->e[--c->n];
        pthread_mutex_unlock(&c->mu);
        if (!e)
            return;
        BW_DEBUG("dropped an idle dataset to make room budget=%s dataset=%s:%s", b->flag,
                 e->d->ops->name, e->d->nsources ? e->d->sources[0]->path : "");
        bw__ds_put(e); /* the cache's reference, the last: its files and memory are given back */
        if (!b->limit || atomic_load(&b->used) + want <= b->limit)
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
    e->cache = c;
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
    return bw__ds_get_until(c, spec, 0, out, err, errlen);
}

int bw__ds_get_until(bw__ds_cache *c, const Batchwire__V1__Dataset *spec, uint64_t deadline_ms,
                     bw__wds **out, char *err, size_t errlen)
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
    uint64_t now = bw__mono_ms();
    if (c->lim.open_timeout_ms && (!deadline_ms || deadline_ms > now + c->lim.open_timeout_ms))
        deadline_ms = now + c->lim.open_timeout_ms;
    size_t keylen = 0;
    char *key = make_key(spec, &keylen); /* as the request spells it */
    if (!key) {
        snprintf(err, errlen, "out of memory for the dataset's name");
        return BW_NOMEM;
    }
    resolved r; /* once the spelling was not found: the canonical key and the paths */
    memset(&r, 0, sizeof(r));
    pthread_mutex_lock(&c->mu);
    bw__wds *e;
    char changed_why[512] = "";
    for (;;) {
        e = find(c, key, keylen);
        if (!e && r.key && (e = find(c, r.key, r.keylen)) != NULL)
            add_alias(e, key, keylen); /* another spelling of a dataset already open */
        if (!e && !r.key) {
            /* A spelling not seen: expand it (directory walks, outside the lock). */
            pthread_mutex_unlock(&c->mu);
            int rc = resolve(c, spec, deadline_ms, &r, err, errlen);
            if (rc != BW_OK) {
                free(key);
                return rc;
            }
            pthread_mutex_lock(&c->mu);
            continue;
        }
        if (!e)
            break;
        atomic_fetch_add(&e->refs, 1);
        while (e->state == OPENING)
            pthread_cond_wait(&c->cv, &c->mu);
        if (e->state == FAILED) {
            int rc = e->rc;
            snprintf(err, errlen, "%s", e->err);
            pthread_mutex_unlock(&c->mu);
            bw__ds_put(e);
            free(key);
            resolved_free(&r);
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
        e = NULL;
        /* expanded again: a glob may match other files now */
        resolved_free(&r);
    }
    if (e) {
        e->used_ms = now;
        pthread_mutex_unlock(&c->mu);
        free(key);
        resolved_free(&r);
        *out = e;
        return BW_OK;
    }
    e = add_opening(c, r.key, r.keylen);
    if (!e) {
        pthread_mutex_unlock(&c->mu);
        free(key);
        resolved_free(&r);
        snprintf(err, errlen, "out of memory for the dataset cache");
        return BW_NOMEM;
    }
    r.key = NULL; /* the entry's now */
    add_alias(e, key, keylen);
    free(key);
    e->metrics = c->metrics;
    snprintf(e->changed, sizeof(e->changed), "%s", changed_why);
    pthread_mutex_unlock(&c->mu);

    bw__dataset *d = NULL;
    uint64_t t0 = bw__mono_ns();
    int rc = open_resolved(c, spec, &r, deadline_ms, &d, err, errlen);
    resolved_free(&r);
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
