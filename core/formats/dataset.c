#include "formats/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "common/text.h"
#include <unistd.h>

#include <openssl/evp.h>

#include "common/log.h"
#include "common/progress.h"

static int64_t mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

static int64_t ctime_ns(const struct stat *st)
{
    return (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

static bool inside(const char *root, const char *path)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/')
        return true;
    return strncmp(path, root, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

/* Refuses names that are not text (docs/security.md, "Input limits"), absolute paths and ".."
 * components before touching the file system. */
static int check_pattern(const char *p, char *err, size_t errlen)
{
    if (!*p) {
        snprintf(err, errlen, "empty source path");
        return BW_INVALID_ARGUMENT;
    }
    char why[160];
    if (bw__check_text("a source path", p, BW_NAME_MAX, why, sizeof(why)) != BW_OK) {
        snprintf(err, errlen, "source '%.64s': %s", p, why);
        return BW_INVALID_ARGUMENT;
    }
    if (p[0] == '/') {
        snprintf(err, errlen, "source '%s': must be relative to the data root", p);
        return BW_PERMISSION_DENIED;
    }
    for (const char *c = p; *c;) {
        const char *slash = strchr(c, '/');
        size_t len = slash ? (size_t)(slash - c) : strlen(c);
        if (len == 2 && c[0] == '.' && c[1] == '.') {
            snprintf(err, errlen, "source '%s': '..' would leave the data root", p);
            return BW_PERMISSION_DENIED;
        }
        c += len + (slash ? 1 : 0);
    }
    return BW_OK;
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every open source keeps its file open (bw__source_check), so a worker serving many files
 * needs many descriptors: the soft limit is raised to the hard one, once. */
static pthread_once_t nofile_once = PTHREAD_ONCE_INIT;

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Opens one resolved path as a source. `rel` is what people see. */
static int open_source(const char *root, const bw__format_ops *ops, const char *rel,
                       bw__source **out, char *err, size_t errlen)
{
    char full[PATH_MAX + 64], real[PATH_MAX];
    snprintf(full, sizeof(full), "%s/%s", root, rel);
    if (!realpath(full, real)) {
        snprintf(err, errlen, "source '%s': %s", rel, strerror(errno));
        return errno == ENOENT ? BW_NOT_FOUND : BW_IO;
    }
    if (!inside(root, real)) {
        snprintf(err, errlen, "source '%s' resolves to %s, outside the data root", rel, real);
        return BW_PERMISSION_DENIED;
    }
    pthread_once(&nofile_once, raise_nofile);
    bw__source *s = calloc(1, sizeof(*s));
    if (!s)
        return BW_NOMEM;
    s->ops = ops;
    s->fd = -1;
    s->root = root;
    snprintf(s->path, sizeof(s->path), "%s", rel);
    snprintf(s->abspath, sizeof(s->abspath), "%s", real);
    struct stat st;
    int rc = BW_OK;
    if (ops->is_dir) {
        if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "source '%s': format files needs a directory", rel);
            rc = BW_INVALID_ARGUMENT;
        }
    } else {
        int fd = open(real, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            snprintf(err, errlen, "source '%s': %s", rel, strerror(errno));
            rc = errno == EACCES ? BW_PERMISSION_DENIED : BW_IO;
        } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "source '%s': not a regular file", rel);
            rc = BW_INVALID_ARGUMENT;
        } else if (!(s->map = bw__mapping_map(fd, (size_t)st.st_size))) {
            snprintf(err, errlen, "source '%s': mmap: %s", rel, strerror(errno));
            rc = BW_IO;
        } else {
            s->size = (uint64_t)st.st_size;
            s->mtime_ns = mtime_ns(&st);
            s->ctime_ns = ctime_ns(&st);
            s->dev = (uint64_t)st.st_dev;
            s->ino = (uint64_t)st.st_ino;
            s->fd = fd; /* kept: bw__source_check compares the open file with what was read */
            fd = -1;
            char dir[PATH_MAX];
            snprintf(dir, sizeof(dir), "%s", real);
            char *slash = strrchr(dir, '/');
            if (slash && slash != dir)
                *slash = '\0';
            s->sidecar_writable = access(dir, W_OK) == 0;
        }
        if (fd >= 0)
            close(fd);
    }
    if (rc == BW_OK)
        rc = ops->open(s, err, errlen);
    if (rc != BW_OK) {
        bw__source_free(s);
        return rc;
    }
    *out = s;
    return BW_OK;
}

/* Expands one pattern into relative paths (sorted bytewise when it is a glob). */
static int expand(const char *root, const char *pat, char ***paths, size_t *n, char *err,
                  size_t errlen)
{
    *paths = NULL;
    *n = 0;
    if (!strpbrk(pat, "*?[")) {
        *paths = malloc(sizeof(char *));
        if (!*paths || !((*paths)[0] = strdup(pat))) {
            free(*paths);
            return BW_NOMEM;
        }
        *n = 1;
        return BW_OK;
    }
    char full[PATH_MAX + 64];
    snprintf(full, sizeof(full), "%s/%s", root, pat);
    glob_t g;
    memset(&g, 0, sizeof(g));
    int grc = glob(full, GLOB_NOSORT, NULL, &g);
    if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        snprintf(err, errlen, "source '%s' matches nothing below the data root", pat);
        return BW_NOT_FOUND;
    }
    if (grc != 0) {
        globfree(&g);
        snprintf(err, errlen, "source '%s': cannot expand the pattern", pat);
        return BW_IO;
    }
    size_t rootlen = strlen(root);
    char **out = calloc(g.gl_pathc, sizeof(char *));
    if (!out) {
        globfree(&g);
        return BW_NOMEM;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        out[i] = strdup(g.gl_pathv[i] + rootlen + 1);
        if (!out[i]) {
            for (size_t j = 0; j < i; j++)
                free(out[j]);
            free(out);
            globfree(&g);
            return BW_NOMEM;
        }
    }
    *n = g.gl_pathc;
    globfree(&g);
    qsort(out, *n, sizeof(char *), by_str);
    *paths = out;
    return BW_OK;
}

static int layouts_agree(bw__dataset *d, char *err, size_t errlen)
{
    if (d->nsources == 0)
        return BW_OK;
    d->layout = d->sources[0]->layout;
    for (size_t i = 1; i < d->nsources; i++) {
        const bw__layout *a = &d->layout, *b = &d->sources[i]->layout;
        bool same = strcmp(a->dtype, b->dtype) == 0 && a->ndim == b->ndim &&
                    memcmp(a->shape, b->shape, sizeof(a->shape[0]) * (size_t)a->ndim) == 0;
        if (!same && a->dtype[0]) {
            snprintf(err, errlen,
                     "source '%s' has dtype '%s' and %d sample dims, source '%s' has '%s' and %d: "
                     "every file of a dataset must share the sample layout",
                     d->sources[0]->path, a->dtype, a->ndim, d->sources[i]->path, b->dtype,
                     b->ndim);
            return BW_MISMATCH;
        }
        if (a->sample_bytes != b->sample_bytes)
            d->layout.sample_bytes = 0;
    }
    return BW_OK;
}

static int fingerprint(bw__dataset *d, char *err, size_t errlen)
{
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    if (!h) {
        snprintf(err, errlen, "out of memory computing the dataset's fingerprint");
        return BW_NOMEM;
    }
    EVP_DigestInit_ex(h, EVP_sha256(), NULL);
    EVP_DigestUpdate(h, d->ops->name, strlen(d->ops->name) + 1);
    for (size_t i = 0; i < d->nsources; i++) {
        const bw__source *s = d->sources[i];
        EVP_DigestUpdate(h, s->path, strlen(s->path) + 1);
        EVP_DigestUpdate(h, &s->size, sizeof(s->size));
        EVP_DigestUpdate(h, &s->mtime_ns, sizeof(s->mtime_ns));
        if (s->map && s->map->len)
            EVP_DigestUpdate(h, s->map->base, s->map->len < 4096 ? s->map->len : 4096);
        if (s->has_digest)
            EVP_DigestUpdate(h, s->digest, sizeof(s->digest));
    }
    unsigned char md[32];
    unsigned mdlen = 0;
    EVP_DigestFinal_ex(h, md, &mdlen);
    EVP_MD_CTX_free(h);
    for (int i = 0; i < 16; i++)
        snprintf(d->fingerprint + 2 * i, 3, "%02x", md[i]);
    return BW_OK;
}

int bw__dataset_open(const char *root, const char *format, const char *const *patterns,
                     size_t npatterns, bw__dataset **out, char *err, size_t errlen)
{
    const bw__format_ops *ops = bw__format_find(format);
    if (!ops) {
        size_t n;
        const char *const *names = bw__format_names(&n);
        char list[128] = "";
        for (size_t i = 0, off = 0; i < n && off < sizeof(list); i++)
            off +=
                (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", i ? ", " : "", names[i]);
        snprintf(err, errlen, "unknown dataset format '%s' (known: %s)", format, list);
        return BW_INVALID_ARGUMENT;
    }
    if (npatterns == 0) {
        snprintf(err, errlen, "the dataset lists no sources");
        return BW_INVALID_ARGUMENT;
    }
    bw__dataset *d = calloc(1, sizeof(*d));
    if (!d) {
        snprintf(err, errlen, "out of memory opening a %s dataset", format);
        return BW_NOMEM;
    }
    d->ops = ops;
    pthread_mutex_init(&d->mu, NULL);
    int rc = BW_OK;
    size_t cap = 0;
    char what[256];
    snprintf(what, sizeof(what), "opening dataset=%s:%.150s patterns=%zu", format, patterns[0],
             npatterns);
    bw__progress prog;
    bw__progress_begin(&prog, what, false, 0); /* sources opened; how many is not known */
    for (size_t p = 0; p < npatterns && rc == BW_OK; p++) {
        rc = check_pattern(patterns[p], err, errlen);
        char **paths = NULL;
        size_t n = 0;
        if (rc == BW_OK)
            rc = expand(root, patterns[p], &paths, &n, err, errlen);
        for (size_t i = 0; i < n; i++) {
            if (rc == BW_OK && d->nsources == BW_DATASET_MAX_SOURCES) {
                snprintf(err, errlen, "more than %d sources", BW_DATASET_MAX_SOURCES);
                rc = BW_TOO_BIG;
            }
            if (rc == BW_OK && d->nsources == cap) {
                cap = cap ? cap * 2 : 8;
                bw__source **ns = realloc(d->sources, cap * sizeof(*ns));
                if (!ns) {
                    snprintf(err, errlen, "out of memory for %zu sources", cap);
                    rc = BW_NOMEM;
                } else
                    d->sources = ns;
            }
            bw__source *s = NULL;
            if (rc == BW_OK)
                rc = open_source(root, ops, paths[i], &s, err, errlen);
            if (rc == BW_OK) {
                d->sources[d->nsources++] = s;
                d->total_bytes += s->size;
                bw__progress_set(&prog, d->nsources);
            }
            free(paths[i]);
        }
        free(paths);
    }
    bw__progress_end(&prog, rc == BW_OK);
    if (rc == BW_OK)
        rc = layouts_agree(d, err, errlen);
    if (rc == BW_OK)
        rc = fingerprint(d, err, errlen);
    if (rc != BW_OK) {
        bw__dataset_free(d);
        return rc;
    }
    *out = d;
    return BW_OK;
}

/* "dataset=FORMAT:FIRST_SOURCE sources=N" for progress lines. */
static void describe(const bw__dataset *d, const char *verb, char *out, size_t len)
{
    snprintf(out, len, "%s dataset=%s:%.150s sources=%zu", verb, d->ops->name,
             d->nsources ? d->sources[0]->path : "", d->nsources);
}

/* Indexes s, reporting into p from byte `base` of the work. */
static int index_source(bw__source *s, bw__progress *p, uint64_t base, char *err, size_t errlen)
{
    s->progress = p;
    s->progress_base = base;
    int rc = s->ops->index(s, err, errlen);
    s->progress = NULL;
    bw__progress_set(p, base + s->size);
    return rc;
}

int bw__dataset_index(bw__dataset *d, char *err, size_t errlen)
{
    pthread_mutex_lock(&d->mu);
    if (!d->indexed) {
        int rc = BW_OK;
        d->first = calloc(d->nsources ? d->nsources : 1, sizeof(*d->first));
        if (!d->first)
            rc = BW_NOMEM;
        uint64_t total = 0, scanned = 0;
        char what[256];
        describe(d, "indexing", what, sizeof(what));
        bw__progress p;
        bw__progress_begin(&p, what, true, d->total_bytes);
        for (size_t i = 0; i < d->nsources && rc == BW_OK; i++) {
            bw__source *s = d->sources[i];
            if (!s->indexed)
                rc = index_source(s, &p, scanned, d->index_err, sizeof(d->index_err));
            scanned += s->size;
            d->first[i] = total;
            total += s->count;
        }
        bw__progress_end(&p, rc == BW_OK);
        d->length = total;
        d->index_rc = rc;
        d->indexed = true;
    }
    int rc = d->index_rc;
    if (rc != BW_OK)
        snprintf(err, errlen, "%s", d->index_err[0] ? d->index_err : bw_strerror(rc));
    pthread_mutex_unlock(&d->mu);
    return rc;
}

size_t bw__dataset_source_of(const bw__dataset *d, uint64_t index)
{
    size_t lo = 0, hi = d->nsources; /* the last source whose first <= index */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->first[mid] <= index)
            lo = mid;
        else
            hi = mid;
    }
    while (lo + 1 < d->nsources && d->first[lo + 1] <= index) /* skip empty sources */
        lo++;
    return lo;
}

int bw__dataset_get(bw__dataset *d, uint64_t index, bw__record *r, char *err, size_t errlen)
{
    if (index >= d->length) {
        snprintf(err, errlen, "index %llu requested but the dataset has %llu samples",
                 (unsigned long long)index, (unsigned long long)d->length);
        return BW_OUT_OF_RANGE;
    }
    size_t lo = bw__dataset_source_of(d, index);
    bw__source *s = d->sources[lo];
    return s->ops->get(s, index - d->first[lo], r, err, errlen);
}

int bw__dataset_next(bw__dataset *d, uint32_t src, uint64_t off, bw__record *r, uint64_t *next,
                     char *err, size_t errlen)
{
    if (!d->ops->next) {
        snprintf(err, errlen, "format %s is not a stream: read it by index", d->ops->name);
        return BW_UNIMPLEMENTED;
    }
    if (src >= d->nsources) {
        snprintf(err, errlen, "source %u requested but the dataset has %zu", src, d->nsources);
        return BW_OUT_OF_RANGE;
    }
    bw__source *s = d->sources[src];
    return s->ops->next(s, off, r, next, err, errlen);
}

bool bw__dataset_changed(const bw__dataset *d, char *why, size_t whylen)
{
    char none[8];
    if (!why) {
        why = none;
        whylen = sizeof(none);
    }
    for (size_t i = 0; i < d->nsources; i++) {
        const bw__source *s = d->sources[i];
        struct stat st;
        if (stat(s->abspath, &st) != 0) {
            snprintf(why, whylen, "source %s is gone (%s)", s->path, strerror(errno));
            return true;
        }
        if (s->ops->is_dir)
            continue;
        if ((uint64_t)st.st_dev != s->dev || (uint64_t)st.st_ino != s->ino) {
            snprintf(why, whylen, "source %s was replaced by another file", s->path);
            return true;
        }
        if ((uint64_t)st.st_size != s->size) {
            snprintf(why, whylen, "source %s changed size from %llu to %llu bytes", s->path,
                     (unsigned long long)s->size, (unsigned long long)st.st_size);
            return true;
        }
        if (mtime_ns(&st) != s->mtime_ns || ctime_ns(&st) != s->ctime_ns) {
            snprintf(why, whylen, "source %s was modified (mtime or ctime changed)", s->path);
            return true;
        }
        if (s->map && atomic_load(&s->map->faulted)) {
            snprintf(why, whylen, "a read of source %s faulted (the file shrank)", s->path);
            return true;
        }
    }
    return false;
}

int bw__dataset_check(const bw__dataset *d, size_t src, char *err, size_t errlen)
{
    return src < d->nsources ? bw__source_check(d->sources[src], err, errlen) : BW_OK;
}

void bw__dataset_free(bw__dataset *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->nsources; i++)
        bw__source_free(d->sources[i]);
    free(d->sources);
    free(d->first);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

int bw__dataset_locate(bw__dataset *d, uint32_t src, uint64_t rec, uint64_t *off, char *err,
                       size_t errlen)
{
    if (!d->ops->offset) {
        snprintf(err, errlen, "format %s is not a stream: read it by index", d->ops->name);
        return BW_UNIMPLEMENTED;
    }
    if (src >= d->nsources) {
        snprintf(err, errlen, "source %u requested but the dataset has %zu", src, d->nsources);
        return BW_OUT_OF_RANGE;
    }
    bw__source *s = d->sources[src];
    int rc = BW_OK;
    pthread_mutex_lock(&d->mu);
    if (!s->indexed) {
        char what[256];
        describe(d, "indexing", what, sizeof(what));
        snprintf(what + strlen(what), sizeof(what) - strlen(what), " source=%.100s", s->path);
        bw__progress p;
        bw__progress_begin(&p, what, true, s->size);
        rc = index_source(s, &p, 0, err, errlen);
        bw__progress_end(&p, rc == BW_OK);
    }
    pthread_mutex_unlock(&d->mu);
    if (rc != BW_OK)
        return rc;
    if (rec > s->count) {
        snprintf(err, errlen, "%s: record %llu requested but the source has %llu", s->path,
                 (unsigned long long)rec, (unsigned long long)s->count);
        return BW_OUT_OF_RANGE;
    }
    *off = s->ops->offset(s, rec);
    return BW_OK;
}
