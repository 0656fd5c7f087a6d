/*
 * A read's transform on the worker (docs/transforms.md, "On the workers"): the job's pipeline
 * run on each sample of a ReadSamples request, its result replacing the sample's bytes (or,
 * with a field, the bytes of that tar member or jsonl key's value: docs/transforms.md, "JSON
 * Lines fields"), keyed by (seed, epoch, source, index).
 */
#ifndef BW_WORKER_SAMPLE_TRANSFORM_H
#define BW_WORKER_SAMPLE_TRANSFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data.pb-c.h"
#include "formats/dataset.h"
#include "jobs/job_check.h"
#include "metrics.h"
#include "read_path.h"
#include "transform_pool.h"
#include "transform/transform.h"

/* A request's transform, parsed once. A plain value: any number of threads may read it. */
typedef struct bw__stf {
    bw__tf_spec spec;
    bw__tf_shape shape;
    char field[BW_JOB_FIELD_MAX]; /* tar member ("jpg"), jsonl key; "": the whole sample */
    uint64_t seed, epoch;
    /* the principal the pool serves the read's windows for (transform_pool.h); "": anonymous.
     * Set by the read path after bw__stf_parse (bw__stf_principal). */
    char who[BW_TFPOOL_WHO_MAX];
} bw__stf;

/* Parses t (from a request) into *out, for samples of layout *in (what token ops read).
 * BW_OK, or BW_INVALID_ARGUMENT with a sentence (the spec's parser's, the token ops' refusal
 * of the dataset's samples, or a field name too long). */
int bw__stf_parse(const Batchwire__V1__Transform *t, const bw__layout *in, bw__stf *out, char *err,
                  size_t errlen);

/* Runs the transform on record *r, sample `index` of source `src` of d. On success r is
 * released and replaced by one part holding the result (owned by the record: released with
 * it) -- or, with a field and `members` (a read with field tables), by its members with that
 * member's bytes replaced by the result (a jsonl line: its keys become members, each value's
 * JSON text, the field's the result). A jsonl field's value is a base64 string of an image, or
 * an array of integers for token ops (int64). On failure r is unchanged and err says which
 * sample ("source 2 'imgs' sample 17: op 1: decode: corrupt JPEG ...", "source 0 'a.jsonl'
 * sample 3 field 'image': not base64: ...") and why; the code is the transform's (BW_CORRUPT
 * for a corrupt image or value, BW_TOO_BIG for a row longer than the pad), BW_NOT_FOUND for a
 * missing member or key. Uses a
 * scratch of the calling thread's own (bw__stf_thread_scratch). Thread-safe. */
int bw__stf_apply(const bw__stf *t, const bw__dataset *d, size_t src, uint64_t index, bool members,
                  bw__record *r, char *err, size_t errlen);

/* Sets t->who from the read's verified grant claims (`claims`, a packed GrantClaims; NULL or
 * empty: none): "job:NAME"; else from the peer's address without its port ("peer:HOST";
 * docs/transforms.md, "Fairness"). */
void bw__stf_principal(bw__stf *t, const uint8_t *claims, size_t claims_len, const char *peer);

/* The room a window's sample has for its error sentence. */
enum { BW_STF_ERR_MAX = 1024 };

/* The samples a transformed read takes at once (its window) when it has n to read: twice the
 * pool's threads (so that every thread has work while another read's window finishes), at
 * most 64, at most n, at least 1. */
size_t bw__stf_window(const bw__tfpool *pool, size_t n);

/* Runs bw__stf_apply on recs[0..n) (source srcs[i], index recs[i].key) on the pool (NULL: on
 * this thread), each sample's code in rcs[i] and its error in errs[i]; returns when all are
 * done. Counts each sample's time and failures into m (NULL: not counted). */
void bw__stf_run_window(const bw__stf *t, bw__tfpool *pool, const bw__dataset *d, bool members,
                        bw__rp_rec *recs, const size_t *srcs, int *rcs,
                        char (*errs)[BW_STF_ERR_MAX], size_t n, bw__wm *m);

/* The calling thread's scratch (created on first use, freed when the thread exits); NULL when
 * out of memory. max_pixels as bw__tf_scratch_new; fixed by the first call in the process. */
bw__tf_scratch *bw__stf_thread_scratch(void);

/* The pixel limit of every thread's scratch (--transform-max-pixels; 0: the default). Call
 * before any transform runs. */
void bw__stf_set_max_pixels(uint64_t max_pixels);

#endif
