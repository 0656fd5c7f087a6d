/*
 * Dataset formats. Each format is one reader behind `struct bw__format_ops`, in its own file.
 * Readers parse memory (a file mapped read-only) and return records as spans into that memory,
 * so the worker can hand them to gRPC without copying. Every error is a code plus a sentence
 * naming the file, the byte offset and the reason ("data/a.tfrecord: offset 1040: data CRC
 * mismatch (stored 0x1234abcd, computed 0x...)").
 *
 * A source is one file (or, for "files", one directory). Map-style access goes through an
 * index of records built by ->index; stream access reads the record at a byte offset with
 * ->next and needs no index. Sources are not thread-safe while being opened or indexed; after
 * that, ->get and ->next only read and may run on many threads at once.
 */
#ifndef BW_FORMATS_FORMATS_H
#define BW_FORMATS_FORMATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batchwire/batchwire.h"

/* A read-only view of a file (mapped, or read into memory), shared by the source and by the
 * gRPC slices that reference records in it; freed when the last reference goes. */
typedef struct bw__mapping {
    atomic_long refs;
    const uint8_t *base;
    size_t len;
    bool mapped; /* munmap, else free */
    int slot;    /* mapped: its entry in the SIGBUS guard's table */
    /* Set by the SIGBUS guard when a read of the mapping touched a page the file no longer
     * has (it was truncated): that page now reads as zeros. Its bytes must not be served. */
    atomic_bool faulted;
} bw__mapping;

/* Maps the open file fd (len bytes; 0 is fine). Returns NULL with errno set on failure.
 *
 * A mapped file may shrink under the process (truncated, or rewritten by a writer that
 * truncates first); reading a page past its new end raises SIGBUS. Every mapping is
 * registered with a process-wide SIGBUS handler (installed on the first call) that maps a
 * page of zeros over the faulting page and sets the mapping's `faulted`, so the read goes on
 * and no thread dies, whichever code was reading (a reader's CRC, gRPC's or OpenSSL's copy).
 * A SIGBUS at any other address gets the default action. The bytes read from such a file are
 * wrong: callers check the file's identity (bw__source_check) before serving a record, so
 * they are never served. When the guard's table is full the file is read into memory instead
 * (pread), which needs no guard. */
bw__mapping *bw__mapping_map(int fd, size_t len);
/* Wraps malloc'd memory (takes ownership). */
bw__mapping *bw__mapping_wrap(void *mem, size_t len);
bw__mapping *bw__mapping_ref(bw__mapping *m);
void bw__mapping_unref(bw__mapping *m); /* NULL is a no-op */

typedef struct bw__span {
    const uint8_t *p;
    size_t len;
} bw__span;

enum { BW_FMT_MAX_FIELDS = 64, BW_FMT_MAX_DIMS = 32, BW_FMT_END = 1 };

/* One record: its bytes are the concatenation of parts (one part except for tar, where each
 * part is a field). `owner` keeps the memory alive (borrowed: take a reference to keep it past
 * the source's life). */
typedef struct bw__record {
    size_t nparts;
    bw__span parts[BW_FMT_MAX_FIELDS + 1]; /* + 1: a field table in front (field_table.h) */
    uint64_t size;                         /* sum of the parts' lengths */
    bw__mapping *owner;
    bool owner_is_own; /* files: owner was created for this record; release it */
    /* Named arrays (dataset.h, fields): part i lies in owners[i]'s memory (the fields' files
     * differ); otherwise every part lies in owner's. See bw__record_owner. */
    bool per_part_owner;
    bw__mapping *owners[BW_FMT_MAX_FIELDS + 1];
    /* tar: the sample key and each field's name, NUL-terminated, at these offsets of text */
    bool has_names;
    uint32_t key;
    uint32_t names[BW_FMT_MAX_FIELDS];
    uint32_t textlen;
    char text[8192];
} bw__record;

/* Every reader starts a record with this: nothing owned, no names. */
static inline void bw__record_init(bw__record *r)
{
    r->nparts = 0;
    r->size = 0;
    r->owner = NULL;
    r->owner_is_own = false;
    r->per_part_owner = false;
    r->has_names = false;
    r->key = 0;
    r->textlen = 0;
}

/* r becomes one part, the whole of m, which it owns (released with it): a file mapped or
 * read for one record, a transform's result. */
static inline void bw__record_own(bw__record *r, bw__mapping *m)
{
    r->nparts = 1;
    r->parts[0].p = m->base;
    r->parts[0].len = m->len;
    r->size = m->len;
    r->owner = m;
    r->owner_is_own = true;
}

/* The mapping that holds part i of r (keep it alive with bw__mapping_ref). */
static inline bw__mapping *bw__record_owner(const bw__record *r, size_t i)
{
    return r->per_part_owner ? r->owners[i] : r->owner;
}

/* Releases what a record owns (only "files" records own anything). */
void bw__record_release(bw__record *r);

/* The layout every sample shares, when the format knows it. */
typedef struct bw__layout {
    char dtype[32]; /* npy descr, "" when not an array */
    int ndim;       /* dims of one sample */
    uint64_t shape[BW_FMT_MAX_DIMS];
    uint64_t sample_bytes; /* 0: variable */
} bw__layout;

typedef struct bw__source bw__source;

/* A budget a worker holds its open datasets to (docs/operating.md, "Worker budgets"): open
 * files (--max-open-files) or dataset memory (--dataset-memory-bytes). Sources take from it
 * while they are opened and indexed and give back when freed. Thread-safe. */
typedef struct bw__budget {
    atomic_uint_fast64_t used;
    uint64_t limit;   /* 0: unlimited */
    const char *what; /* "open files", "bytes of dataset memory" */
    const char *flag; /* the setting that sets `limit`, for messages */
    /* Called (without any lock of the budget's) when a take does not fit: frees what nobody
     * uses (the worker's idle cached datasets) until `want` more fits or nothing is left to
     * free. NULL: nothing can be freed. */
    void (*reclaim)(void *ctx, struct bw__budget *b, uint64_t want);
    void *ctx;
} bw__budget;

/* Takes n from b (NULL or n 0: BW_OK). When it does not fit, reclaims once and tries again;
 * then BW_TOO_BIG when `own` (what the taker already holds) + n is more than the whole limit,
 * else BW_BUSY (others hold it: try again later), with a sentence naming the budget, its limit
 * and its flag. */
int bw__budget_take(bw__budget *b, uint64_t n, uint64_t own, char *err, size_t errlen);
void bw__budget_give(bw__budget *b, uint64_t n); /* NULL or 0: no-op */

/* Charges n more bytes of s's memory (its record index) to s->memory: BW_OK, or the budget's
 * error with its sentence prefixed by s's path. */
int bw__source_charge(bw__source *s, uint64_t n, char *err, size_t errlen);

typedef struct bw__format_ops {
    const char *name;
    bool is_dir; /* the source is a directory ("files") */
    /* Parses headers (cheap): fills s->layout where known. */
    int (*open)(bw__source *s, char *err, size_t errlen);
    /* Builds the record index (may read the whole file): sets s->count. */
    int (*index)(bw__source *s, char *err, size_t errlen);
    /* Record i < s->count (after index). Checks checksums where the format has them. */
    int (*get)(bw__source *s, uint64_t i, bw__record *r, char *err, size_t errlen);
    /* The record starting at byte offset `off`; *next is the offset after it. BW_FMT_END when
     * the source has no record at off (its end). NULL when the format is not a stream. */
    int (*next)(bw__source *s, uint64_t off, bw__record *r, uint64_t *next, char *err,
                size_t errlen);
    /* Streams (after index): the byte offset of record i <= s->count (the file's size for
     * i == count), read from the index without touching the records. NULL when not a stream. */
    uint64_t (*offset)(const bw__source *s, uint64_t i);
    /* Where record i < s->count lies in s's mapping (one piece of *len bytes), computed
     * without touching it: for prefetching (bw__dataset_prefetch). NULL when the format has no
     * such arithmetic. */
    const uint8_t *(*locate)(const bw__source *s, uint64_t i, size_t *len);
    /* With locate: a source's records all have one size and lie one after another in index
     * order (locate(i + k) is locate(i) + k * len), so a run of neighbouring indices is one
     * piece of the mapping without locating each (bw__rp_next_span). */
    bool back_to_back;
    void (*close)(bw__source *s);
} bw__format_ops;

struct bw__source {
    const bw__format_ops *ops;
    char path[1024];    /* as shown to people: relative to the data root */
    char abspath[4096]; /* resolved */
    char member[256];   /* npz: the archive member read ("x.npy"); "" otherwise */
    const char *root;   /* the data root (resolved), for checks on paths found inside */
    bw__mapping *map;   /* whole file; NULL for directories */
    uint64_t size;
    int64_t mtime_ns;
    bw__layout layout;
    uint64_t count; /* records, once indexed */
    bool indexed;
    bool sidecar_writable; /* tfrecord: may write its index next to the file */
    void *state;           /* the reader's */
    /* The file's identity when opened (bw__source_check compares it with the open fd). */
    int fd; /* kept open; -1 for directories and sources over memory */
    uint64_t dev, ino;
    int64_t ctime_ns;
    /* directories: a digest of every entry's name, size and mtime, for the fingerprint */
    bool has_digest;
    uint8_t digest[32];
    /* While indexing: where to report how far the scan is (bytes, counted from
     * progress_base); NULL: nowhere. */
    struct bw__progress *progress;
    uint64_t progress_base;
    /* Budgets (NULL: not counted): its descriptor against `files`, its own size and record
     * index against `memory` (*memory_own: its dataset's total, for the too-big decision);
     * given back by bw__source_free. */
    bw__budget *files, *memory;
    bool file_held;
    uint64_t memory_held;
    uint64_t *memory_own;
    uint64_t deadline_ms; /* "files": the directory's walk stops here (BW_TIMEOUT); 0: none */
};

/* Indexers: the scan of s has reached byte offset `off` (reports progress, cheaply). */
void bw__source_progress(bw__source *s, uint64_t off);

extern const bw__format_ops bw__fmt_npy;
extern const bw__format_ops bw__fmt_tfrecord;
extern const bw__format_ops bw__fmt_jsonl;
extern const bw__format_ops bw__fmt_text;
extern const bw__format_ops bw__fmt_tar;
extern const bw__format_ops bw__fmt_files;
extern const bw__format_ops bw__fmt_npz; /* one array (s->member) of an uncompressed .npz */

/* npy and npz: parse the .npy array whose bytes are [start, start + len) of s's file, and make
 * its rows s's records (index, get and close below serve both formats). */
int bw__npy_open_at(bw__source *s, uint64_t start, uint64_t len, char *err, size_t errlen);
int bw__npy_index(bw__source *s, char *err, size_t errlen);
int bw__npy_get(bw__source *s, uint64_t i, bw__record *r, char *err, size_t errlen);
const uint8_t *bw__npy_locate(const bw__source *s, uint64_t i, size_t *len);
void bw__npy_close(bw__source *s);

/* npz: the names of the archive members of s's file (an open source of any format), in the
 * archive's order, NUL-separated into names[0..cap) with *n of them. BW_UNIMPLEMENTED (saying
 * to write it with np.savez) when a member is compressed, BW_CORRUPT for a malformed
 * archive. */
int bw__npz_members(const bw__source *s, char *names, size_t cap, size_t *n, char *err,
                    size_t errlen);

/* The reader named `name`, or NULL. */
const bw__format_ops *bw__format_find(const char *name);

/* "npy,tfrecord,..." : every format's name, for capabilities and messages. */
const char *const *bw__format_names(size_t *n);

/* Tests and fuzzers: a source over memory (a copy is made) with the given name. */
int bw__source_from_memory(const bw__format_ops *ops, const char *name, const void *data,
                           size_t len, bw__source **out, char *err, size_t errlen);
/* Whether the file of s is still the one opened: its open fd still has the size, mtime and
 * ctime seen at open, a link in the file system (not deleted or replaced by a rename), and no
 * read of its mapping faulted. BW_OK, or BW_FAILED_PRECONDITION with a sentence naming the
 * file and what changed. Thread-safe (one fstat). Sources without a file pass. Call it after
 * reading a record and before serving its bytes: a record read before a change and checked
 * after it is refused, so no byte of a changed file goes out under the old fingerprint, except
 * what a writer changes between this check and the send (docs/formats.md, "Files that change
 * under a worker"). */
int bw__source_check(const bw__source *s, char *err, size_t errlen);

/* Closes the reader, drops the mapping, closes the fd and frees s. NULL is a no-op. */
void bw__source_free(bw__source *s);

/* Formats the common error prefix "PATH: offset N: " + message. Returns rc. */
/* The record start offsets of a source indexed by one scan (lines, tar): the state of such a
 * source, and the open/offset/close ops of its format. */
typedef struct bw__starts {
    uint64_t *at;
    uint64_t n, cap;
} bw__starts;

int bw__starts_open(bw__source *s, char *err, size_t errlen);
/* Appends a record start to s's scan list b, charging its growth (8 bytes a record) to
 * s->memory: BW_OK, BW_NOMEM, or the budget's error with a sentence. */
int bw__starts_push(bw__source *s, bw__starts *b, uint64_t off, char *err, size_t errlen);
/* Makes a finished scan's list the source's index (takes over b's array). */
void bw__starts_install(bw__source *s, bw__starts *b);
uint64_t bw__starts_offset(const bw__source *s, uint64_t i);
void bw__starts_close(bw__source *s);

int bw__fmt_fail(const bw__source *s, int rc, uint64_t off, char *err, size_t errlen,
                 const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#endif
