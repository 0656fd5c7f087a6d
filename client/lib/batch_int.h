/* A batch as the loader fills it: its memory and the holds on it (batch.c), named arrays
 * (arrays.c) and the fields of tar and JSON Lines samples (fields.c). Nothing here is part of
 * the public API. */
#ifndef BW_CLIENT_BATCH_INT_H
#define BW_CLIENT_BATCH_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batchwire/loader.h"
#include "data.pb-c.h"
#include "loader_limits.h"

struct bw_batch {
    uint64_t epoch, step;
    size_t count, real;
    uint64_t *indices;
    uint8_t *padding;
    uint32_t *sources; /* a mixture job's: each sample's source (bw_batch_sources) */
    bool mixture;
    uint64_t *passes; /* a mixture with stream sources: each sample's pass (bw_batch_passes) */
    bool has_passes;
    size_t *offsets, *sizes; /* per sample, into data */
    uint8_t *data;           /* host copy (pinned when delivering to a GPU) */
    size_t nbytes, cap;
    bool pinned;
    bw_hold *hold;              /* the hold on data taken since the batch was filled, or NULL */
    struct bw__gpu_stream *gpu; /* device delivery: the slot's stream, or NULL */
    int device;
    void *dev;
    size_t dev_cap;
    const char *dtype; /* npy: borrowed from the job summary */
    size_t ndim;
    uint64_t shape[BW_LOADER_MAX_NDIM];
    int rc; /* fetch result */
    char err[BW_LOADER_ERRLEN];
    /* Named arrays (bw_batch_array): one tensor per field in data, one after the other; the
     * samples arrive whole (row i of every field) in `scratch` and are split by field there
     * (bw__batch_unpack_arrays). */
    size_t narrays;
    struct bw__array *arrays;
    uint8_t *scratch;
    size_t scratch_cap;
    /* bw_batch_fields (fields.c), with bw_loader_options.fields: sample i's fields are
     * fields[field_first[i] .. field_first[i + 1]); names point into field_names. */
    bool has_fields;
    bw_field *fields;
    size_t *field_first;
    size_t nfields, capfields;
    char *field_names;
    size_t names_len, names_cap;
};

/* Sizes the per-sample arrays for up to max_count samples; with data_bytes > 0 and
 * `pinned`, allocates that much page-locked data memory up front. */
int bw__batch_init(bw_batch *b, size_t max_count, size_t data_bytes, bool pinned);
/* Frees b; a hold still viewing its bytes keeps them (they outlive the loader). */
void bw__batch_free(bw_batch *b);
/* The loader fills b again: a hold still viewing its bytes takes its buffer, and b continues
 * with a spare buffer of its kind (one a released hold gave back), else a new one as large
 * (none when out of memory: the fetch then allocates). */
void bw__batch_reuse(bw_batch *b);
/* Makes room for nbytes of data (keeps the buffer when it is large enough). */
int bw__batch_reserve(bw_batch *b, size_t nbytes);

/* ---- holds: batch bytes kept past the loader's next batch (bw_loader_hold) ---- */

typedef struct bw__holds bw__holds;

/* The holds of one loader (a reference for the loader); BW_NOMEM. */
int bw__holds_new(bw__holds **out);
/* The loader is closing: drops its reference; buffers released later are freed. */
void bw__holds_close(bw__holds *p);
/* A reference to the hold on b's bytes (b->hold, created when NULL); BW_NOMEM. */
int bw__hold_take(bw__holds *p, bw_batch *b, bw_hold **out);

/* ---- arrays.c: batches of named arrays (bw_batch_array) ---- */

/* One field of a batch of named arrays: name and dtype borrowed from the job's description. */
typedef struct bw__array {
    const char *name, *dtype;
    size_t ndim; /* with the batch's count first */
    uint64_t shape[BW_LOADER_MAX_NDIM];
    uint64_t row_bytes; /* one sample's bytes of this field */
    size_t offset;      /* in data */
} bw__array;

/* Checks that the job's fields can be batches here (every layout fixed, few enough dims). */
int bw__arrays_check(const Batchwire__V1__DatasetInfo *info, char *err, size_t errlen);
/* Lays out b's arrays for its count samples (after planning): shapes and offsets. BW_NOMEM. */
int bw__batch_plan_arrays(bw_batch *b, const Batchwire__V1__DatasetInfo *info);
/* After a fetch into b->scratch (sample `from[i]` whole at scratch + from[i] * sample_bytes
 * for position i): each field's rows to its tensor in b->data. BW_NOMEM. */
int bw__batch_unpack_arrays(bw_batch *b, const size_t *from, uint64_t sample_bytes);

/* ---- fields.c: the fields of tar and JSON Lines samples (bw_batch_fields) ---- */

enum bw__fields_kind { BW_FIELDS_NONE, BW_FIELDS_TABLE, BW_FIELDS_JSON };

/* The fields kind of a dataset format when `wanted`: tar samples come with field tables,
 * JSON Lines samples are scanned; BW_INVALID_ARGUMENT for a format without fields. */
int bw__fields_kind_of(const char *format, bool wanted, enum bw__fields_kind *kind, char *err,
                       size_t errlen);
/* After a fetch: records every sample's fields -- for tables, strips each sample's table
 * from the batch's bytes. BW_CORRUPT (with b->err) for a malformed table or a JSON Lines
 * sample that is not an object. */
int bw__batch_split_fields(bw_batch *b, enum bw__fields_kind kind);
/* Frees the field arrays. */
void bw__batch_fields_free(bw_batch *b);

#endif
