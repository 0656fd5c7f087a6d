/*
 * A dataset: one format over a list of sources (files, globs, or directories for "files")
 * below a data root. Map-style indices run over the sources in order: source k holds indices
 * [first[k], first[k] + count[k]). Opening resolves every path and refuses any that resolves
 * outside the root ("..", symlinks, absolute paths); it parses headers and computes the
 * fingerprint, but builds no record index (bw__dataset_index does, once).
 *
 * A dataset of named arrays (docs/formats.md, "Named arrays"; bw__dataset_open_fields, and
 * format npz) is a list of fields, each a one-array dataset of its own, all of the same length
 * and split over their files the same way: sample i is row i of every field, its record one
 * part per field in field order. Its sources and index are field 0's (borrowed); a check of
 * source k checks file k of every field.
 *
 * Thread-safety: open and free are single-threaded; bw__dataset_index may be called from any
 * thread (the first caller builds, others wait); get/next are thread-safe once indexed.
 */
#ifndef BW_FORMATS_DATASET_H
#define BW_FORMATS_DATASET_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/formats.h"

enum { BW_DATASET_MAX_SOURCES = 65536 };

typedef struct bw__dataset {
    const bw__format_ops *ops;
    size_t nsources;
    bw__source **sources;
    uint64_t *first; /* per source, once indexed */
    uint64_t length; /* once indexed */
    uint64_t total_bytes;
    bw__layout layout; /* shared by every source (sample_bytes 0 when they differ) */
    char fingerprint[33];
    pthread_mutex_t mu;
    bool indexed;
    int index_rc; /* the first index attempt's result, repeated to later callers */
    char index_err[512];
    uint64_t memory_held; /* charged to the dataset memory budget by its sources */
    /* named arrays: the fields and their names; sources and first are field 0's */
    size_t nfields;
    struct bw__dataset **fields;
    char **field_names;
} bw__dataset;

/* One named array of a dataset of fields: a format (npy) over patterns, as bw__dataset_open. */
typedef struct bw__field_spec {
    const char *name;
    const char *format;
    const char *const *patterns;
    size_t npatterns;
} bw__field_spec;

/* What an open may spend (docs/operating.md, "Worker budgets"); all zero: no limits. */
typedef struct bw__open_opts {
    uint64_t deadline_ms; /* bw__mono_ms clock: directory walks stop (BW_TIMEOUT); 0: none */
    size_t max_sources;   /* after expanding globs (0: BW_DATASET_MAX_SOURCES) */
    const char *max_sources_flag; /* the setting that sets it, for messages (NULL: none) */
    bw__budget *files;            /* one per open file; NULL: not counted */
    bw__budget *memory;           /* sources' size and record indexes; NULL: not counted */
    bool literal;                 /* the patterns are paths bw__dataset_resolve expanded */
} bw__open_opts;

/* A list of paths relative to the data root. */
typedef struct bw__paths {
    char **v;
    size_t n, cap;
} bw__paths;
void bw__paths_free(bw__paths *p);

/* Expands `patterns` below `root` without opening any file: globs are matched directory by
 * directory (fnmatch, a leading '.' matched only explicitly, each glob's matches sorted
 * bytewise) and no directory that resolves outside the root is ever read. `spelled` gets the
 * paths as the patterns name them, `canon` each one's canonical form (symbolic links and "."
 * resolved, relative to the root; the path as spelled when it does not exist). Refuses, never
 * naming anything outside the root: a pattern that leads outside it (BW_PERMISSION_DENIED),
 * more than opts->max_sources paths (BW_TOO_BIG naming the flag), a walk past
 * opts->deadline_ms (BW_TIMEOUT), a glob that matches nothing (BW_NOT_FOUND). */
int bw__dataset_resolve(const char *root, const char *const *patterns, size_t npatterns,
                        const bw__open_opts *opts, bw__paths *spelled, bw__paths *canon, char *err,
                        size_t errlen);

/* Opens `format` over `patterns` below `root` (a resolved directory). On failure returns a
 * code with a sentence naming the source and the reason; nothing is left open. Every file is
 * opened with O_NONBLOCK and anything but a regular file refused (a FIFO never blocks). */
int bw__dataset_open(const char *root, const char *format, const char *const *patterns,
                     size_t npatterns, bw__dataset **out, char *err, size_t errlen);
/* The same within opts (NULL: no limits). */
int bw__dataset_open_opts(const char *root, const char *format, const char *const *patterns,
                          size_t npatterns, const bw__open_opts *opts, bw__dataset **out, char *err,
                          size_t errlen);

/* Opens a dataset of the named arrays fields[0..n) (1 to BW_FMT_MAX_FIELDS, names checked by
 * bw__check_field_name and unique, format npy) and indexes it. Refuses, naming the field, a
 * field that cannot be opened, whose rows are empty, whose length differs from field 0's, or
 * that is split over its files otherwise than field 0 (another number of files, or file k
 * holding another number of rows). */
int bw__dataset_open_fields(const char *root, const bw__field_spec *fields, size_t n,
                            bw__dataset **out, char *err, size_t errlen);
/* The same within opts (NULL: no limits); max_sources bounds each field's files. */
int bw__dataset_open_fields_opts(const char *root, const bw__field_spec *fields, size_t n,
                                 const bw__open_opts *opts, bw__dataset **out, char *err,
                                 size_t errlen);

/* The files d reads: its sources, or every field's (npz: each archive once per field). */
size_t bw__dataset_nfiles(const bw__dataset *d);

/* Builds every source's record index (idempotent; the result, good or bad, is kept). */
int bw__dataset_index(bw__dataset *d, char *err, size_t errlen);

/* Sample `index` (needs the index). BW_OUT_OF_RANGE past the end, BW_CORRUPT etc. from the
 * reader. Release the record with bw__record_release. */
int bw__dataset_get(bw__dataset *d, uint64_t index, bw__record *r, char *err, size_t errlen);

/* The source holding dataset index `index` (< length; the dataset indexed). */
size_t bw__dataset_source_of(const bw__dataset *d, uint64_t index);
/* Asks the processor to bring sample `index`'s bytes (each field's) towards its caches, for a
 * read that will copy or send them soon: reads of small samples wait on memory a sample at a
 * time otherwise. Only samples under BW_PREFETCH_BELOW bytes: from a page up the copy streams
 * through whole pages, which the processor's own prefetcher follows, and asking as well cost
 * the workers 6-9 % more CPU at 4 and 64 KiB, against 11 % less at 1 KiB (docs/performance.md,
 * "Per-sample cost, tenth pass"). Touches nothing, fails never; does nothing for an index out
 * of range or a format without a `locate` op. */
enum { BW_PREFETCH_BELOW = 4096 };
void bw__dataset_prefetch(const bw__dataset *d, uint64_t index);
/* The same for len bytes at p that a reader already located. */
void bw__prefetch_bytes(const uint8_t *p, size_t len);

/* Stream access: the record at byte offset `off` of source `src`. BW_FMT_END at its end;
 * BW_UNIMPLEMENTED for formats that are not streams. */
int bw__dataset_next(bw__dataset *d, uint32_t src, uint64_t off, bw__record *r, uint64_t *next,
                     char *err, size_t errlen);

/* Stream access: the byte offset of record rec (<= the source's count; its size at the count)
 * of source src, from the source's offset index, built first if needed (for that source
 * alone: tfrecord loads its .bwidx sidecar, other formats scan the file once). No record is
 * read. BW_OUT_OF_RANGE past the count; BW_UNIMPLEMENTED when the format is not a stream. */
int bw__dataset_locate(bw__dataset *d, uint32_t src, uint64_t rec, uint64_t *off, char *err,
                       size_t errlen);

/* True when a source's path now names another file or a changed one (device, inode, size,
 * mtime or ctime differ from what was opened, or it is gone), or a read of it faulted. `why`
 * (may be NULL) then names the first such source and what changed. */
bool bw__dataset_changed(const bw__dataset *d, char *why, size_t whylen);

/* Whether source src is still the file opened (bw__source_check): BW_OK, or
 * BW_FAILED_PRECONDITION with a sentence naming the file. Thread-safe; one fstat. */
int bw__dataset_check(const bw__dataset *d, size_t src, char *err, size_t errlen);

/* NULL is a no-op. Records still referenced through their mapping stay valid. */
void bw__dataset_free(bw__dataset *d);

#endif
