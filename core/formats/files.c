/* A directory of one file per sample: the directory's regular files, sorted by name (bytes,
 * strcmp order); sample i is the whole content of the i-th. Sub-directories and other entries
 * are ignored; symlinks are followed only when they resolve inside the data root (one that
 * leads out refuses the dataset without naming where it leads). The directory's walk stops at
 * the request's deadline (s->deadline_ms). Small files are read with pread, large ones
 * mapped; a file is opened with O_NONBLOCK so that a FIFO put in its place never blocks. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common/util.h"
#include "formats/formats.h"

enum { PREAD_MAX = 256 * 1024, DEADLINE_EVERY = 256 /* entries between clock reads */ };

typedef struct entry {
    char *name;   /* in the directory */
    char *target; /* symlinks: the resolved path inside the data root; else NULL */
    uint64_t size;
} entry;

typedef struct dirx {
    entry *e;
    uint64_t n;
} dirx;

static int by_name(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

static bool inside(const char *root, const char *path)
{
    size_t n = strlen(root);
    return strncmp(path, root, n) == 0 && (path[n] == '/' || (n == 1 && root[0] == '/'));
}

static void free_entries(dirx *d)
{
    for (uint64_t i = 0; i < d->n; i++) {
        free(d->e[i].name);
        free(d->e[i].target);
    }
    free(d->e);
    d->e = NULL;
    d->n = 0;
}

static int files_open(bw__source *s, char *err, size_t errlen)
{
    dirx *d = calloc(1, sizeof(*d));
    if (!d)
        return BW_NOMEM;
    s->state = d;
    DIR *dir = opendir(s->abspath);
    if (!dir)
        return bw__fmt_fail(s, errno == ENOENT ? BW_NOT_FOUND : BW_IO, 0, err, errlen,
                            "cannot open directory: %s", strerror(errno));
    uint64_t cap = 0;
    int rc = BW_OK;
    struct dirent *de;
    uint64_t seen = 0;
    while (rc == BW_OK && (de = readdir(dir)) != NULL) {
        if (s->deadline_ms && ++seen % DEADLINE_EVERY == 0 && bw__mono_ms() > s->deadline_ms) {
            rc = bw__fmt_fail(s, BW_TIMEOUT, 0, err, errlen,
                              "the request's deadline passed while listing the directory (%llu "
                              "entries read)",
                              (unsigned long long)seen);
            break;
        }
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
            continue;
        struct stat st;
        if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* vanished */
        char *name = strdup(de->d_name), *target = NULL;
        if (!name) {
            rc = BW_NOMEM;
            break;
        }
        if (S_ISLNK(st.st_mode)) {
            char full[PATH_MAX + 256], real[PATH_MAX];
            snprintf(full, sizeof(full), "%s/%s", s->abspath, de->d_name);
            if (!realpath(full, real) || stat(real, &st) != 0 || !S_ISREG(st.st_mode)) {
                free(name);
                continue;
            }
            if (s->root && !inside(s->root, real)) {
                rc = bw__fmt_fail(s, BW_PERMISSION_DENIED, 0, err, errlen,
                                  "entry '%s' is a symbolic link leading outside the data root",
                                  de->d_name);
                free(name);
                break;
            }
            if (!(target = strdup(real))) {
                free(name);
                rc = BW_NOMEM;
                break;
            }
        } else if (!S_ISREG(st.st_mode)) {
            free(name);
            continue;
        }
        if (d->n == cap) {
            cap = cap ? cap * 2 : 256;
            entry *ne = realloc(d->e, cap * sizeof(*ne));
            if (!ne) {
                free(name);
                free(target);
                rc = BW_NOMEM;
                break;
            }
            d->e = ne;
        }
        d->e[d->n].name = name;
        d->e[d->n].target = target;
        d->e[d->n].size = (uint64_t)st.st_size;
        d->n++;
        s->size += (uint64_t)st.st_size;
        int64_t mt = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        if (mt > s->mtime_ns)
            s->mtime_ns = mt;
    }
    closedir(dir);
    /* the listing is the source's index: charged to the worker's dataset memory */
    uint64_t bytes = cap * sizeof(*d->e);
    for (uint64_t i = 0; rc == BW_OK && i < d->n; i++)
        bytes += strlen(d->e[i].name) + 1 + (d->e[i].target ? strlen(d->e[i].target) + 1 : 0);
    if (rc == BW_OK)
        rc = bw__source_charge(s, bytes, err, errlen);
    if (rc != BW_OK)
        return rc;
    qsort(d->e, d->n, sizeof(*d->e), by_name);
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    if (!h)
        return BW_NOMEM;
    EVP_DigestInit_ex(h, EVP_sha256(), NULL);
    uint64_t common = d->n ? d->e[0].size : 0;
    for (uint64_t i = 0; i < d->n; i++) {
        EVP_DigestUpdate(h, d->e[i].name, strlen(d->e[i].name) + 1);
        EVP_DigestUpdate(h, &d->e[i].size, sizeof(d->e[i].size));
        if (d->e[i].size != common)
            common = 0;
    }
    EVP_DigestUpdate(h, &s->mtime_ns, sizeof(s->mtime_ns));
    unsigned dlen = 0;
    EVP_DigestFinal_ex(h, s->digest, &dlen);
    EVP_MD_CTX_free(h);
    s->has_digest = true;
    s->layout.sample_bytes = common;
    return BW_OK;
}

static int files_index(bw__source *s, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    s->count = ((dirx *)s->state)->n;
    s->indexed = true;
    return BW_OK;
}

static int files_get(bw__source *s, uint64_t i, bw__record *r, char *err, size_t errlen)
{
    bw__record_init(r);
    const dirx *d = s->state;
    if (i >= d->n)
        return bw__fmt_fail(s, BW_OUT_OF_RANGE, 0, err, errlen,
                            "file %llu requested but the directory has %llu", (unsigned long long)i,
                            (unsigned long long)d->n);
    const char *name = d->e[i].name;
    char path[PATH_MAX + 256];
    if (d->e[i].target)
        snprintf(path, sizeof(path), "%s", d->e[i].target);
    else
        snprintf(path, sizeof(path), "%s/%s", s->abspath, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return bw__fmt_fail(s, errno == ENOENT ? BW_NOT_FOUND : BW_IO, 0, err, errlen,
                            "file '%s': %s", name, strerror(errno));
    struct stat st;
    bw__mapping *m = NULL;
    int rc = BW_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = bw__fmt_fail(s, BW_IO, 0, err, errlen, "file '%s' is no longer a regular file", name);
    } else if (st.st_size <= PREAD_MAX) {
        size_t len = (size_t)st.st_size, got = 0;
        uint8_t *buf = malloc(len ? len : 1);
        while (buf && got < len) {
            ssize_t k = pread(fd, buf + got, len - got, (off_t)got);
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        if (!buf)
            rc = bw__fmt_fail(s, BW_NOMEM, 0, err, errlen, "file '%s': out of memory for %zu bytes",
                              name, len);
        else if (got != len) {
            free(buf);
            rc = bw__fmt_fail(s, BW_IO, got, err, errlen, "file '%s': short read", name);
        } else if (!(m = bw__mapping_wrap(buf, len)))
            rc = bw__fmt_fail(s, BW_NOMEM, 0, err, errlen, "file '%s': out of memory", name);
    } else if (!(m = bw__mapping_map(fd, (size_t)st.st_size))) {
        rc = bw__fmt_fail(s, BW_IO, 0, err, errlen, "file '%s': mmap: %s", name, strerror(errno));
    }
    close(fd);
    /* m is set on every path that left rc BW_OK; `!m` says so to the analyzer, which cannot
     * see that bw__fmt_fail (another file's, variadic) returns its rc. */
    if (rc != BW_OK || !m)
        return rc != BW_OK ? rc : BW_INTERNAL;
    bw__record_own(r, m);
    return BW_OK;
}

static void files_close(bw__source *s)
{
    dirx *d = s->state;
    if (d)
        free_entries(d);
    free(d);
    s->state = NULL;
}

const bw__format_ops bw__fmt_files = {
    .name = "files",
    .is_dir = true,
    .open = files_open,
    .index = files_index,
    .get = files_get,
    .next = NULL,
    .close = files_close,
};
