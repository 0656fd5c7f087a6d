/* Shared by every reader: mappings, the format registry, error sentences, sources over
 * memory (tests and fuzzers). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/progress.h"
#include "formats/formats.h"

/* ---- the SIGBUS guard (formats.h, bw__mapping_map) ----
 * A fixed table of the live mappings, read by the signal handler without locks. A slot holds
 * its mapping's range itself (the handler never reads a bw__mapping that may be being freed):
 * it is claimed by a compare-and-swap of `base` from 0, starting from a moving hint, and its
 * `len` is set after; release clears `len`, then `base`, before the munmap. A mapping whose
 * range holds a faulting address is alive: the faulting reader holds a reference to it. */

enum { GUARD_SLOTS = 1 << 16 };

static struct {
    atomic_uintptr_t base;
    atomic_size_t len;
    _Atomic(bw__mapping *) m;
} guard[GUARD_SLOTS];
static atomic_uint guard_hint;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static bool guard_ok;
static long page_size;

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    uintptr_t a = (uintptr_t)si->si_addr;
    if (si->si_code == BUS_ADRERR)
        for (size_t i = 0; i < GUARD_SLOTS; i++) {
            uintptr_t base = atomic_load(&guard[i].base);
            size_t len = atomic_load(&guard[i].len);
            if (!base || a < base || a - base >= len)
                continue;
            void *page = (void *)(a & ~(uintptr_t)(page_size - 1));
            /* mmap is a plain system call on Linux: safe here though POSIX does not list it.
             * (An anonymous mapping takes fd -1; MAP_FIXED over our own range: nothing to
             * free.) */
            // cppcheck-suppress leakReturnValNotUsed
            if (mmap(page, (size_t)page_size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                     -1, 0) != MAP_FAILED) {
                atomic_store(&atomic_load(&guard[i].m)->faulted, true);
                return; /* the faulting read is retried and now reads zeros */
            }
            break;
        }
    /* Not ours (or no page could be mapped): the default action, as without the guard. */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void guard_install(void)
{
    page_size = sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    guard_ok = page_size > 0 && sigaction(SIGBUS, &sa, NULL) == 0;
}

/* The slot now holding m's range, or -1 when the table is full. */
static int guard_add(bw__mapping *m)
{
    pthread_once(&guard_once, guard_install);
    if (!guard_ok)
        return -1;
    unsigned start = atomic_fetch_add(&guard_hint, 1);
    for (unsigned k = 0; k < GUARD_SLOTS; k++) {
        unsigned i = (start + k) % GUARD_SLOTS;
        uintptr_t none = 0;
        if (atomic_compare_exchange_strong(&guard[i].base, &none, (uintptr_t)m->base)) {
            atomic_store(&guard[i].m, m);
            atomic_store(&guard[i].len, m->len);
            atomic_store(&guard_hint, i + 1);
            return (int)i;
        }
    }
    return -1;
}

static void guard_remove(const bw__mapping *m)
{
    atomic_store(&guard[m->slot].len, 0);
    atomic_store(&guard[m->slot].m, NULL);
    atomic_store(&guard[m->slot].base, 0);
}

/* The file's bytes read into memory: for when no mapping can be guarded. */
static bw__mapping *read_whole(int fd, size_t len)
{
    uint8_t *buf = malloc(len);
    size_t got = 0;
    while (buf && got < len) {
        ssize_t k = pread(fd, buf + got, len - got, (off_t)got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            free(buf);
            errno = k == 0 ? ENODATA : errno;
            return NULL;
        }
        got += (size_t)k;
    }
    return buf ? bw__mapping_wrap(buf, len) : NULL;
}

bw__mapping *bw__mapping_map(int fd, size_t len)
{
    bw__mapping *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    atomic_init(&m->refs, 1);
    atomic_init(&m->faulted, false);
    m->len = len;
    m->slot = -1;
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
    m->slot = guard_add(m);
    if (m->slot < 0) {
        munmap(p, len);
        free(m);
        return read_whole(fd, len);
    }
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
    atomic_init(&m->faulted, false);
    m->slot = -1;
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
    if (m->mapped) {
        guard_remove(m);
        munmap((void *)m->base, m->len);
    } else
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

int bw__budget_take(bw__budget *b, uint64_t n, uint64_t own, char *err, size_t errlen)
{
    if (!b || !n)
        return BW_OK;
    for (int tries = 0; tries < 2; tries++) {
        uint_fast64_t used = atomic_load(&b->used);
        while (!b->limit || used + n <= b->limit)
            if (atomic_compare_exchange_weak(&b->used, &used, used + n))
                return BW_OK;
        if (tries == 0 && b->reclaim)
            b->reclaim(b->ctx, b, n);
    }
    if (own + n > b->limit) {
        snprintf(err, errlen,
                 "the dataset alone needs more %s than the worker's budget of %llu (%s): "
                 "split it or raise the limit",
                 b->what, (unsigned long long)b->limit, b->flag);
        return BW_TOO_BIG;
    }
    snprintf(err, errlen,
             "the worker's %s are at its budget of %llu (%s), held by datasets in use: "
             "try again later",
             b->what, (unsigned long long)b->limit, b->flag);
    return BW_BUSY;
}

void bw__budget_give(bw__budget *b, uint64_t n)
{
    if (b && n)
        atomic_fetch_sub(&b->used, n);
}

int bw__source_charge(bw__source *s, uint64_t n, char *err, size_t errlen)
{
    char why[400];
    int rc = bw__budget_take(s->memory, n, s->memory_own ? *s->memory_own : s->memory_held, why,
                             sizeof(why));
    if (rc != BW_OK) {
        snprintf(err, errlen, "%s: %s", s->path, why);
        return rc;
    }
    if (s->memory) {
        s->memory_held += n;
        if (s->memory_own)
            *s->memory_own += n;
    }
    return BW_OK;
}

int bw__starts_push(bw__source *s, bw__starts *b, uint64_t off, char *err, size_t errlen)
{
    if (b->n == b->cap) {
        uint64_t cap = b->cap ? b->cap * 2 : 256;
        int rc = bw__source_charge(s, (cap - b->cap) * sizeof(*b->at), err, errlen);
        if (rc != BW_OK)
            return rc;
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

void bw__source_progress(bw__source *s, uint64_t off)
{
    if (s->progress)
        bw__progress_update(s->progress, s->progress_base + off);
}

void bw__record_release(bw__record *r)
{
    if (r->owner_is_own)
        bw__mapping_unref(r->owner);
    r->owner = NULL;
    r->owner_is_own = false;
}

static const bw__format_ops *const formats[] = {
    &bw__fmt_npy,  &bw__fmt_tfrecord, &bw__fmt_files, &bw__fmt_jsonl,
    &bw__fmt_text, &bw__fmt_tar,      &bw__fmt_npz,
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
    static const char *const names[] = {"npy", "tfrecord", "files", "jsonl", "text", "tar", "npz"};
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
    s->fd = -1;
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
    if (s->fd >= 0)
        close(s->fd);
    if (s->file_held)
        bw__budget_give(s->files, 1);
    bw__budget_give(s->memory, s->memory_held);
    if (s->memory_own)
        *s->memory_own -= s->memory_held;
    free(s);
}

static int64_t ts_ns(struct timespec t)
{
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The pages of m past a file's new size `size` read as zeros from now on: a send from them
 * still in flight (the kernel copying from the mapping, which fails with EFAULT past the end
 * of the file, and would cost gRPC its whole connection) reads zeros instead, and the read it
 * belongs to is refused at its end (worker/read_path.c). */
static void zero_tail(bw__mapping *m, uint64_t size)
{
    pthread_once(&guard_once, guard_install);
    if (!m || !m->mapped || page_size <= 0)
        return;
    uint64_t from = (size + (uint64_t)page_size - 1) / (uint64_t)page_size * (uint64_t)page_size;
    if (from >= m->len)
        return;
    /* Should this fail, the tail stays the file's and on_sigbus zeroes it page by page. */
    // cppcheck-suppress leakReturnValNotUsed
    (void)mmap((void *)(m->base + from), m->len - from, PROT_READ,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    atomic_store(&m->faulted, true);
}

int bw__source_check(const bw__source *s, char *err, size_t errlen)
{
    if (s->fd < 0)
        return BW_OK;
    struct stat st;
    const char *what = NULL;
    char buf[160];
    if (fstat(s->fd, &st) != 0) {
        snprintf(buf, sizeof(buf), "fstat: %s", strerror(errno));
        what = buf;
    } else if ((uint64_t)st.st_size != s->size) {
        if ((uint64_t)st.st_size < s->size)
            zero_tail(s->map, (uint64_t)st.st_size);
        snprintf(buf, sizeof(buf), "its size is now %llu bytes, it was %llu",
                 (unsigned long long)st.st_size, (unsigned long long)s->size);
        what = buf;
    } else if (st.st_nlink == 0)
        what = "it was deleted or replaced";
    else if (ts_ns(st.st_mtim) != s->mtime_ns || ts_ns(st.st_ctim) != s->ctime_ns)
        what = "it was written to";
    else if (s->map && atomic_load(&s->map->faulted))
        what = "it was truncated while being read";
    if (!what)
        return BW_OK;
    snprintf(err, errlen,
             "%s changed on disk since the dataset was opened (%s): none of its bytes are served "
             "under the old fingerprint; later requests see the new file",
             s->path, what);
    return BW_FAILED_PRECONDITION;
}
