/* Datasets (dataset.h): sources below a data root opened, fingerprinted and indexed as one
 * list of samples, and datasets of named arrays (fields, npz) assembled from one-array
 * datasets. */
#include "formats/dataset.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
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
#include "common/util.h"

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

/* The part of `real` (a resolved path inside root) below root: "" for the root itself. */
static const char *below_root(const char *root, const char *real)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/')
        return real + 1;
    return real[n] == '/' ? real + n + 1 : real + n;
}

/* Resolves root/rel: BW_OK with its resolved path in real (inside root); BW_PERMISSION_DENIED
 * when it leads outside the root -- also when it does not exist but the deepest part of it that
 * does leads outside, so that nothing outside can be probed; BW_NOT_FOUND or BW_IO otherwise.
 * A sentence naming only `rel` in err. */
static int resolve_in(const char *root, const char *rel, char real[PATH_MAX], char *err,
                      size_t errlen)
{
    char full[PATH_MAX + 64];
    snprintf(full, sizeof(full), "%s/%s", root, rel);
    int rc = BW_OK;
    if (!realpath(full, real)) {
        int e = errno;
        rc = e == ENOENT || e == ENOTDIR ? BW_NOT_FOUND : BW_IO;
        char *slash;
        size_t rootlen = strlen(root);
        while ((slash = strrchr(full, '/')) != NULL && (size_t)(slash - full) > rootlen) {
            *slash = '\0';
            if (realpath(full, real)) {
                if (!inside(root, real))
                    rc = BW_PERMISSION_DENIED;
                break;
            }
        }
        if (rc != BW_PERMISSION_DENIED) {
            snprintf(err, errlen, "source '%s': %s", rel, strerror(e));
            return rc;
        }
    } else if (!inside(root, real))
        rc = BW_PERMISSION_DENIED;
    if (rc == BW_PERMISSION_DENIED)
        snprintf(err, errlen,
                 "source '%s' leads outside the data root (through a symbolic link): refused", rel);
    return rc;
}

/* Opens one path (no pattern) as a source of d. `rel` is what people see. A file is opened
 * with O_NONBLOCK and refused unless fstat says it is a regular file: a FIFO or a device
 * below the root never blocks the opening thread. */
static int open_source(const char *root, const bw__format_ops *ops, const char *member,
                       const char *rel, const bw__open_opts *o, bw__dataset *d, bw__source **out,
                       char *err, size_t errlen)
{
    char real[PATH_MAX];
    int rc = resolve_in(root, rel, real, err, errlen);
    if (rc != BW_OK)
        return rc;
    pthread_once(&nofile_once, raise_nofile);
    bw__source *s = calloc(1, sizeof(*s));
    if (!s)
        return BW_NOMEM;
    s->ops = ops;
    s->fd = -1;
    s->root = root;
    s->deadline_ms = o->deadline_ms;
    snprintf(s->path, sizeof(s->path), "%s", rel);
    snprintf(s->member, sizeof(s->member), "%s", member);
    snprintf(s->abspath, sizeof(s->abspath), "%s", real);
    if (o->memory) {
        s->memory = o->memory;
        s->memory_own = &d->memory_held;
        rc = bw__source_charge(s, sizeof(*s), err, errlen);
    }
    if (rc == BW_OK && !ops->is_dir && o->files) {
        char why[400];
        rc = bw__budget_take(o->files, 1, d->nsources, why, sizeof(why));
        if (rc == BW_OK) {
            s->files = o->files;
            s->file_held = true;
        } else
            snprintf(err, errlen, "source '%s': %s", rel, why);
    }
    struct stat st;
    if (rc != BW_OK) {
        /* refused by a budget: the sentence is in err */
    } else if (ops->is_dir) {
        if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "source '%s': format files needs a directory", rel);
            rc = BW_INVALID_ARGUMENT;
        }
    } else {
        int fd = open(real, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        if (fd < 0) {
            snprintf(err, errlen, "source '%s': %s", rel, strerror(errno));
            rc = errno == EACCES ? BW_PERMISSION_DENIED : BW_IO;
        } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            snprintf(err, errlen,
                     "source '%s': not a regular file (a directory, FIFO, socket or device is "
                     "never read)",
                     rel);
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

/* ---- expanding patterns (bw__dataset_resolve) ---- */

void bw__paths_free(bw__paths *p)
{
    for (size_t i = 0; p && i < p->n; i++)
        free(p->v[i]);
    if (p)
        free(p->v);
    if (p)
        memset(p, 0, sizeof(*p));
}

/* Appends a copy of a + ("/" when both are set) + b[0..blen). BW_OK or BW_NOMEM. */
static int paths_add(bw__paths *p, const char *a, const char *b, size_t blen)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        char **nv = realloc(p->v, cap * sizeof(*nv));
        if (!nv)
            return BW_NOMEM;
        p->v = nv;
        p->cap = cap;
    }
    size_t alen = strlen(a);
    char *s = malloc(alen + blen + 2);
    if (!s)
        return BW_NOMEM;
    memcpy(s, a, alen);
    size_t off = alen;
    if (alen && blen)
        s[off++] = '/';
    memcpy(s + off, b, blen);
    s[off + blen] = '\0';
    p->v[p->n++] = s;
    return BW_OK;
}

static bool is_glob(const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] == '*' || p[i] == '?' || p[i] == '[')
            return true;
    return false;
}

enum { WALK_CHECK_EVERY = 256 }; /* directory entries between reads of the clock */

/* The entries of directory root/dir (resolved inside the root first) that match comp, as
 * dir/NAME into next; only directories unless `last`. Counts entries read into *seen. */
static int match_dir(const char *root, const char *pat, const char *dir, const char *comp,
                     bool last, const bw__open_opts *o, size_t max, uint64_t *seen, bw__paths *next,
                     char *err, size_t errlen)
{
    char real[PATH_MAX], why[512];
    int rc = resolve_in(root, dir[0] ? dir : ".", real, why, sizeof(why));
    if (rc == BW_PERMISSION_DENIED) {
        snprintf(err, errlen,
                 "source '%s': '%s' leads outside the data root (through a symbolic link): "
                 "globs are never expanded outside it",
                 pat, dir);
        return rc;
    }
    if (rc != BW_OK)
        return BW_OK; /* missing: matches nothing, as glob(3) */
    DIR *dp = opendir(real);
    if (!dp)
        return BW_OK;
    struct dirent *de;
    while (rc == BW_OK && (de = readdir(dp)) != NULL) {
        if (o->deadline_ms && ++*seen % WALK_CHECK_EVERY == 0 && bw__mono_ms() > o->deadline_ms) {
            snprintf(err, errlen,
                     "source '%s': the request's deadline passed while expanding it (%llu "
                     "directory entries read)",
                     pat, (unsigned long long)*seen);
            rc = BW_TIMEOUT;
            break;
        }
        const char *name = de->d_name;
        if (name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2])))
            continue;
        if (fnmatch(comp, name, FNM_PERIOD) != 0)
            continue;
        if (!last) {
            struct stat st;
            if (fstatat(dirfd(dp), name, &st, 0) != 0 || !S_ISDIR(st.st_mode))
                continue;
        }
        if (last && next->n >= max) {
            snprintf(err, errlen, "source '%s' matches more than %zu files (%s)", pat, max,
                     o->max_sources_flag ? o->max_sources_flag : "the limit of sources");
            rc = BW_TOO_BIG;
            break;
        }
        if (paths_add(next, dir, name, strlen(name)) != BW_OK) {
            snprintf(err, errlen, "source '%s': out of memory for its paths", pat);
            rc = BW_NOMEM;
        }
    }
    closedir(dp);
    return rc;
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Expands one checked pattern into paths relative to the root (sorted bytewise when it is a
 * glob), at most max. Component by component: a literal one is appended, a glob one matched
 * against the entries of each directory found so far -- each resolved inside the root before
 * it is read. */
static int expand(const char *root, const char *pat, const bw__open_opts *o, size_t max,
                  bw__paths *out, char *err, size_t errlen)
{
    size_t patlen = strlen(pat);
    if (o->literal || !is_glob(pat, patlen)) {
        if (paths_add(out, "", pat, patlen) != BW_OK) {
            snprintf(err, errlen, "source '%s': out of memory", pat);
            return BW_NOMEM;
        }
        return BW_OK;
    }
    bw__paths cur = {NULL, 0, 0}, next = {NULL, 0, 0};
    int rc = paths_add(&cur, "", "", 0);
    uint64_t seen = 0;
    for (const char *c = pat; rc == BW_OK && *c;) {
        const char *slash = strchr(c, '/');
        size_t len = slash ? (size_t)(slash - c) : strlen(c);
        const char *after = c + len + (slash ? 1 : 0);
        bool last = !*after;
        if (len == 0 || (len == 1 && c[0] == '.')) {
            c = after; /* "a//b", "./a": the same directory */
            continue;
        }
        if (!is_glob(c, len)) {
            for (size_t i = 0; i < cur.n && rc == BW_OK; i++)
                rc = paths_add(&next, cur.v[i], c, len);
        } else {
            char comp[NAME_MAX + 1];
            snprintf(comp, sizeof(comp), "%.*s", (int)len, c);
            for (size_t i = 0; i < cur.n && rc == BW_OK; i++)
                rc = match_dir(root, pat, cur.v[i], comp, last, o, max, &seen, &next, err, errlen);
        }
        if (rc == BW_NOMEM)
            snprintf(err, errlen, "source '%s': out of memory for its paths", pat);
        bw__paths_free(&cur);
        cur = next;
        memset(&next, 0, sizeof(next));
        c = after;
    }
    if (rc == BW_OK && cur.n == 0) {
        snprintf(err, errlen, "source '%s' matches nothing below the data root", pat);
        rc = BW_NOT_FOUND;
    }
    if (rc != BW_OK) {
        bw__paths_free(&cur);
        return rc;
    }
    qsort(cur.v, cur.n, sizeof(char *), by_str);
    for (size_t i = 0; i < cur.n && rc == BW_OK; i++) {
        rc = paths_add(out, "", cur.v[i], strlen(cur.v[i]));
        if (rc != BW_OK)
            snprintf(err, errlen, "source '%s': out of memory for its paths", pat);
    }
    bw__paths_free(&cur);
    return rc;
}

static size_t max_sources(const bw__open_opts *o)
{
    return o->max_sources && o->max_sources < BW_DATASET_MAX_SOURCES ? o->max_sources
                                                                     : BW_DATASET_MAX_SOURCES;
}

static int too_many(const bw__open_opts *o, size_t n, char *err, size_t errlen)
{
    snprintf(err, errlen,
             "the dataset lists more than %zu sources once its globs are expanded%s%s%s",
             max_sources(o), o->max_sources_flag ? " (" : "",
             o->max_sources_flag ? o->max_sources_flag : "", o->max_sources_flag ? ")" : "");
    (void)n;
    return BW_TOO_BIG;
}

int bw__dataset_resolve(const char *root, const char *const *patterns, size_t npatterns,
                        const bw__open_opts *opts, bw__paths *spelled, bw__paths *canon, char *err,
                        size_t errlen)
{
    static const bw__open_opts none;
    const bw__open_opts *o = opts ? opts : &none;
    size_t max = max_sources(o);
    memset(spelled, 0, sizeof(*spelled));
    memset(canon, 0, sizeof(*canon));
    int rc = BW_OK;
    for (size_t p = 0; p < npatterns && rc == BW_OK; p++) {
        rc = check_pattern(patterns[p], err, errlen);
        if (rc == BW_OK)
            rc = expand(root, patterns[p], o, max - spelled->n, spelled, err, errlen);
        if (rc == BW_OK && spelled->n > max)
            rc = too_many(o, spelled->n, err, errlen);
    }
    for (size_t i = 0; i < spelled->n && rc == BW_OK; i++) {
        char real[PATH_MAX];
        int r = resolve_in(root, spelled->v[i], real, err, errlen);
        if (r == BW_PERMISSION_DENIED)
            rc = r;
        else if (r == BW_OK) {
            const char *rel = below_root(root, real);
            rc = paths_add(canon, "", rel[0] ? rel : ".", rel[0] ? strlen(rel) : 1);
        } else
            rc = paths_add(canon, "", spelled->v[i], strlen(spelled->v[i]));
        if (rc == BW_NOMEM)
            snprintf(err, errlen, "out of memory for %zu source paths", spelled->n);
    }
    if (rc != BW_OK) {
        bw__paths_free(spelled);
        bw__paths_free(canon);
    }
    return rc;
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
    for (size_t k = 0; k < d->nfields; k++) { /* named arrays: each field's name and digest */
        EVP_DigestUpdate(h, d->field_names[k], strlen(d->field_names[k]) + 1);
        EVP_DigestUpdate(h, d->fields[k]->fingerprint, strlen(d->fields[k]->fingerprint) + 1);
    }
    for (size_t i = 0; i < d->nsources && !d->nfields; i++) {
        const bw__source *s = d->sources[i];
        /* the canonical path (open_plain): one fingerprint however the path is spelled */
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

static int open_npz(const char *root, const char *const *patterns, size_t npatterns,
                    const bw__open_opts *o, bw__dataset **out, char *err, size_t errlen);

/* Opens ops over patterns (npz: the array `member` of each archive; "" otherwise). */
static int open_plain(const char *root, const bw__format_ops *ops, const char *member,
                      const char *const *patterns, size_t npatterns, const bw__open_opts *o,
                      bw__dataset **out, char *err, size_t errlen)
{
    const char *format = ops->name;
    if (npatterns == 0) {
        snprintf(err, errlen, "the dataset lists no sources");
        return BW_INVALID_ARGUMENT;
    }
    /* Sources are opened by their canonical paths, which name them in messages, in the
     * fingerprint and for placement by path: the same on every worker however a job spells
     * them. */
    bw__paths spelled = {NULL, 0, 0}, paths = {NULL, 0, 0};
    int rc = bw__dataset_resolve(root, patterns, npatterns, o, &spelled, &paths, err, errlen);
    bw__paths_free(&spelled);
    if (rc != BW_OK)
        return rc;
    bw__dataset *d = calloc(1, sizeof(*d));
    bw__source **sources = calloc(paths.n ? paths.n : 1, sizeof(*sources));
    if (!d || !sources) {
        free(d);
        free(sources);
        bw__paths_free(&paths);
        snprintf(err, errlen, "out of memory opening a %s dataset of %zu sources", format, paths.n);
        return BW_NOMEM;
    }
    d->ops = ops;
    d->sources = sources;
    pthread_mutex_init(&d->mu, NULL);
    char what[256];
    snprintf(what, sizeof(what), "opening dataset=%s:%.150s patterns=%zu", format, patterns[0],
             npatterns);
    bw__progress prog;
    bw__progress_begin(&prog, what, true, paths.n);
    for (size_t i = 0; i < paths.n && rc == BW_OK; i++) {
        if (o->deadline_ms && bw__mono_ms() > o->deadline_ms) {
            snprintf(err, errlen, "the request's deadline passed after opening %zu of %zu sources",
                     i, paths.n);
            rc = BW_TIMEOUT;
            break;
        }
        bw__source *s = NULL;
        rc = open_source(root, ops, member, paths.v[i], o, d, &s, err, errlen);
        if (rc == BW_OK) {
            d->sources[d->nsources++] = s;
            d->total_bytes += s->size;
            bw__progress_set(&prog, d->nsources);
        }
    }
    bw__paths_free(&paths);
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

int bw__dataset_open_opts(const char *root, const char *format, const char *const *patterns,
                          size_t npatterns, const bw__open_opts *opts, bw__dataset **out, char *err,
                          size_t errlen)
{
    static const bw__open_opts none;
    const bw__open_opts *o = opts ? opts : &none;
    const bw__format_ops *ops = bw__format_find(format);
    if (!ops) {
        size_t n;
        const char *const *names = bw__format_names(&n);
        char list[128] = "";
        for (size_t i = 0, off = 0; i < n && off < sizeof(list); i++)
            off +=
                (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", i ? ", " : "", names[i]);
        snprintf(err, errlen, "unknown dataset format '%s' (known: %s, or named arrays)", format,
                 list);
        return BW_INVALID_ARGUMENT;
    }
    if (ops == &bw__fmt_npz)
        return open_npz(root, patterns, npatterns, o, out, err, errlen);
    return open_plain(root, ops, "", patterns, npatterns, o, out, err, errlen);
}

int bw__dataset_open(const char *root, const char *format, const char *const *patterns,
                     size_t npatterns, bw__dataset **out, char *err, size_t errlen)
{
    return bw__dataset_open_opts(root, format, patterns, npatterns, NULL, out, err, errlen);
}

/* ---- named arrays ---- */

/* A dataset of named arrays is no reader of its own: its samples are assembled here. */
static const bw__format_ops fields_ops = {.name = "fields"};

/* Prefixes err (which holds a sentence) with "field 'NAME': ". */
static int field_fail(const char *name, int rc, char *err, size_t errlen)
{
    char why[768];
    snprintf(why, sizeof(why), "%s", err);
    snprintf(err, errlen, "field '%s': %s", name, why);
    return rc;
}

/* Makes d (ops and nothing else set) the dataset of the opened one-array datasets f[0..n)
 * (taken over, freed on failure with d) named names[0..n) (copied). */
static int assemble(bw__dataset *d, bw__dataset **f, const char *const *names, size_t n, char *err,
                    size_t errlen)
{
    d->fields = calloc(n, sizeof(*d->fields));
    d->field_names = calloc(n, sizeof(*d->field_names));
    if (!d->fields || !d->field_names) {
        for (size_t k = 0; k < n; k++)
            bw__dataset_free(f[k]);
        snprintf(err, errlen, "out of memory opening %zu fields", n);
        return BW_NOMEM;
    }
    d->nfields = n;
    int rc = BW_OK;
    for (size_t k = 0; k < n; k++) {
        d->fields[k] = f[k];
        if (!(d->field_names[k] = strdup(names[k])) && rc == BW_OK) {
            snprintf(err, errlen, "out of memory opening %zu fields", n);
            rc = BW_NOMEM;
        }
    }
    const bw__dataset *a = f[0];
    for (size_t k = 0; k < n && rc == BW_OK; k++) {
        const bw__dataset *b = f[k];
        if ((rc = bw__dataset_index(f[k], err, errlen)) != BW_OK)
            return field_fail(names[k], rc, err, errlen);
        if (b->layout.sample_bytes == 0) {
            snprintf(err, errlen,
                     "field '%s': its rows (dtype '%s', %d sample dims) hold no bytes or differ "
                     "in size between its files",
                     names[k], b->layout.dtype, b->layout.ndim);
            return BW_INVALID_ARGUMENT;
        }
        if (k == 0)
            continue;
        if (b->length != a->length) {
            snprintf(err, errlen,
                     "field '%s' has %llu samples (rows) and field '%s' has %llu: every field "
                     "of a dataset must have the same length",
                     names[k], (unsigned long long)b->length, names[0],
                     (unsigned long long)a->length);
            return BW_MISMATCH;
        }
        if (b->nsources != a->nsources) {
            snprintf(err, errlen,
                     "field '%s' is split over %zu file(s) and field '%s' over %zu: every field "
                     "must be split over its files the same way (file k of each holding the "
                     "same rows)",
                     names[k], b->nsources, names[0], a->nsources);
            return BW_MISMATCH;
        }
        for (size_t i = 0; i < b->nsources; i++)
            if (b->sources[i]->count != a->sources[i]->count) {
                snprintf(err, errlen,
                         "field '%s': file %s holds %llu rows where field '%s''s file %s holds "
                         "%llu: every field must be split over its files the same way",
                         names[k], b->sources[i]->path, (unsigned long long)b->sources[i]->count,
                         names[0], a->sources[i]->path, (unsigned long long)a->sources[i]->count);
                return BW_MISMATCH;
            }
    }
    if (rc != BW_OK)
        return rc;
    d->nsources = a->nsources;
    d->sources = a->sources;
    d->first = a->first;
    d->length = a->length;
    d->indexed = true;
    d->total_bytes = 0;
    for (size_t k = 0; k < n; k++) {
        d->layout.sample_bytes += f[k]->layout.sample_bytes;
        /* npz: every field is in the same archives */
        d->total_bytes += d->ops == &bw__fmt_npz && k ? 0 : f[k]->total_bytes;
    }
    return fingerprint(d, err, errlen);
}

static bw__dataset *new_fields(const bw__format_ops *ops, char *err, size_t errlen)
{
    bw__dataset *d = calloc(1, sizeof(*d));
    if (!d) {
        snprintf(err, errlen, "out of memory opening a dataset of fields");
        return NULL;
    }
    d->ops = ops;
    pthread_mutex_init(&d->mu, NULL);
    return d;
}

int bw__dataset_open_fields(const char *root, const bw__field_spec *fields, size_t n,
                            bw__dataset **out, char *err, size_t errlen)
{
    return bw__dataset_open_fields_opts(root, fields, n, NULL, out, err, errlen);
}

int bw__dataset_open_fields_opts(const char *root, const bw__field_spec *fields, size_t n,
                                 const bw__open_opts *opts, bw__dataset **out, char *err,
                                 size_t errlen)
{
    static const bw__open_opts none;
    const bw__open_opts *o = opts ? opts : &none;
    if (n == 0 || n > BW_FMT_MAX_FIELDS) {
        snprintf(err, errlen, "a dataset of named arrays has 1 to %d fields (got %zu)",
                 BW_FMT_MAX_FIELDS, n);
        return BW_INVALID_ARGUMENT;
    }
    for (size_t k = 0; k < n; k++) {
        int rc = bw__check_field_name(fields[k].name, err, errlen);
        if (rc != BW_OK)
            return rc;
        for (size_t j = 0; j < k; j++)
            if (strcmp(fields[j].name, fields[k].name) == 0) {
                snprintf(err, errlen, "field '%s' is named twice", fields[k].name);
                return BW_INVALID_ARGUMENT;
            }
        if (!fields[k].format || strcmp(fields[k].format, "npy") != 0) {
            snprintf(err, errlen,
                     "field '%s': format '%.32s' cannot be a field: fields are .npy arrays "
                     "(npy:PATH[,PATH...]); an .npz archive is a dataset of fields by itself "
                     "(npz:PATH)",
                     fields[k].name, fields[k].format ? fields[k].format : "");
            return BW_INVALID_ARGUMENT;
        }
    }
    bw__dataset **f = calloc(n, sizeof(*f));
    const char **names = calloc(n, sizeof(*names));
    bw__dataset *d = f && names ? new_fields(&fields_ops, err, errlen) : NULL;
    int rc = d ? BW_OK : BW_NOMEM;
    if (rc == BW_NOMEM && (!f || !names))
        snprintf(err, errlen, "out of memory opening %zu fields", n);
    for (size_t k = 0; k < n && rc == BW_OK; k++) {
        names[k] = fields[k].name;
        rc = open_plain(root, &bw__fmt_npy, "", fields[k].patterns, fields[k].npatterns, o, &f[k],
                        err, errlen);
        if (rc != BW_OK) {
            field_fail(fields[k].name, rc, err, errlen);
            while (k-- > 0)
                bw__dataset_free(f[k]);
        }
    }
    if (rc == BW_OK)
        rc = assemble(d, f, names, n, err, errlen);
    free(f);
    free(names);
    if (rc != BW_OK) {
        bw__dataset_free(d);
        return rc;
    }
    *out = d;
    return BW_OK;
}

/* npz: every array of the archives is a field, in the first archive's order; every archive
 * must hold the same arrays. */
static int open_npz(const char *root, const char *const *patterns, size_t npatterns,
                    const bw__open_opts *o, bw__dataset **out, char *err, size_t errlen)
{
    bw__dataset *list = NULL; /* the archives, opened to list their members */
    int rc = open_plain(root, &bw__fmt_npz, "", patterns, npatterns, o, &list, err, errlen);
    if (rc != BW_OK)
        return rc;
    char first[4096], other[4096];
    size_t n = 0, m = 0;
    rc = bw__npz_members(list->sources[0], first, sizeof(first), &n, err, errlen);
    if (rc == BW_OK && n == 0) {
        snprintf(err, errlen, "archive %s holds no .npy arrays", list->sources[0]->path);
        rc = BW_INVALID_ARGUMENT;
    }
    for (size_t i = 1; i < list->nsources && rc == BW_OK; i++) {
        size_t len0 = 0, len1 = 0;
        rc = bw__npz_members(list->sources[i], other, sizeof(other), &m, err, errlen);
        for (size_t k = 0; k < n; k++)
            len0 += strlen(first + len0) + 1;
        for (size_t k = 0; k < m; k++)
            len1 += strlen(other + len1) + 1;
        if (rc == BW_OK && (m != n || len0 != len1 || memcmp(first, other, len0) != 0)) {
            snprintf(err, errlen,
                     "archive %s holds %zu arrays and %s holds %zu, or other names or another "
                     "order: every archive of a dataset must hold the same arrays",
                     list->sources[i]->path, m, list->sources[0]->path, n);
            rc = BW_MISMATCH;
        }
    }
    /* the archives' paths (globs expanded), for each field */
    const char **paths = rc == BW_OK ? calloc(list->nsources, sizeof(*paths)) : NULL;
    if (rc == BW_OK && !paths) {
        snprintf(err, errlen, "out of memory opening %zu archives", list->nsources);
        rc = BW_NOMEM;
    }
    for (size_t i = 0; paths && i < list->nsources; i++)
        paths[i] = list->sources[i]->path;
    bw__dataset *f[BW_FMT_MAX_FIELDS];
    const char *names[BW_FMT_MAX_FIELDS];
    bw__dataset *d = rc == BW_OK ? new_fields(&bw__fmt_npz, err, errlen) : NULL;
    if (rc == BW_OK && !d)
        rc = BW_NOMEM;
    size_t opened = 0;
    for (size_t k = 0, off = 0; k < n && rc == BW_OK; k++) {
        names[k] = first + off;
        off += strlen(first + off) + 1;
        char member[BW_FIELD_NAME_MAX + 8];
        if ((rc = bw__check_field_name(names[k], err, errlen)) != BW_OK) {
            field_fail(names[k], rc, err, errlen);
            break;
        }
        snprintf(member, sizeof(member), "%s.npy", names[k]);
        bw__open_opts lo = *o; /* the archives' paths, expanded once above */
        lo.literal = true;
        rc = open_plain(root, &bw__fmt_npz, member, paths, list->nsources, &lo, &f[k], err, errlen);
        if (rc != BW_OK)
            field_fail(names[k], rc, err, errlen);
        else
            opened++;
    }
    if (rc == BW_OK)
        rc = assemble(d, f, names, n, err, errlen);
    else
        for (size_t k = 0; k < opened; k++)
            bw__dataset_free(f[k]);
    free(paths);
    bw__dataset_free(list);
    if (rc != BW_OK) {
        bw__dataset_free(d);
        return rc;
    }
    *out = d;
    return BW_OK;
}

/* A sample of named arrays: row `index` of every field, one part each. */
static int get_fields(bw__dataset *d, uint64_t index, bw__record *r, char *err, size_t errlen)
{
    bw__record_init(r);
    r->per_part_owner = true;
    for (size_t k = 0; k < d->nfields; k++) {
        bw__record one;
        int rc = bw__dataset_get(d->fields[k], index, &one, err, errlen);
        if (rc != BW_OK)
            return field_fail(d->field_names[k], rc, err, errlen);
        r->parts[k] = one.parts[0]; /* npy records are one part and own nothing */
        r->owners[k] = one.owner;
        r->size += one.size;
    }
    r->nparts = d->nfields;
    r->owner = r->owners[0];
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

size_t bw__dataset_nfiles(const bw__dataset *d)
{
    size_t n = d->nfields ? 0 : d->nsources;
    for (size_t k = 0; k < d->nfields; k++)
        n += d->fields[k]->nsources;
    return n;
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

void bw__dataset_prefetch(const bw__dataset *d, uint64_t index)
{
    if (index >= d->length)
        return;
    for (size_t k = 0; k < d->nfields; k++)
        bw__dataset_prefetch(d->fields[k], index);
    if (d->nfields || !d->ops->locate)
        return;
    size_t lo = bw__dataset_source_of(d, index), len;
    const bw__source *s = d->sources[lo];
    const uint8_t *p = s->ops->locate(s, index - d->first[lo], &len);
    if (p)
        bw__prefetch_bytes(p, len);
}

void bw__prefetch_bytes(const uint8_t *p, size_t len)
{
    if (len >= BW_PREFETCH_BELOW)
        return;
    /* a line at a time (64 bytes on the processors this runs on), into L2 and further: the
     * copy comes a few samples later */
    for (size_t off = 0; off < len; off += 64)
        __builtin_prefetch(p + off, 0, 2);
    if (len)
        __builtin_prefetch(p + len - 1, 0, 2);
}

int bw__dataset_get(bw__dataset *d, uint64_t index, bw__record *r, char *err, size_t errlen)
{
    if (index >= d->length) {
        snprintf(err, errlen, "index %llu requested but the dataset has %llu samples",
                 (unsigned long long)index, (unsigned long long)d->length);
        return BW_OUT_OF_RANGE;
    }
    if (d->nfields)
        return get_fields(d, index, r, err, errlen);
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
    for (size_t k = 0; k < d->nfields; k++)
        if (bw__dataset_changed(d->fields[k], why, whylen))
            return true;
    for (size_t i = 0; i < d->nsources && !d->nfields; i++) {
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
    for (size_t k = 0; k < d->nfields; k++) {
        int rc = bw__dataset_check(d->fields[k], src, err, errlen);
        if (rc != BW_OK)
            return rc;
    }
    if (d->nfields)
        return BW_OK;
    return src < d->nsources ? bw__source_check(d->sources[src], err, errlen) : BW_OK;
}

void bw__dataset_free(bw__dataset *d)
{
    if (!d)
        return;
    if (d->nfields) { /* sources and first are field 0's */
        d->nsources = 0;
        d->sources = NULL;
        d->first = NULL;
    }
    for (size_t k = 0; k < d->nfields; k++) {
        bw__dataset_free(d->fields[k]);
        free(d->field_names[k]);
    }
    free(d->fields);
    free(d->field_names);
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
