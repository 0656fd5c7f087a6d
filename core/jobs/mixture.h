/*
 * Weighted mixtures of datasets (docs/semantics.md, "Mixtures"): one epoch of E samples drawn
 * from up to 256 sources, source j holding n_j samples and weighing w_j.
 *
 * Two layers:
 *   bw__mixture      the epoch's global order, a pure function of (sizes, weights, E, seed,
 *                    epoch, which sources are streams, the policy): position p (0 <= p < P,
 *                    P = E or, under the stop policy, where a stream runs dry) -> (source,
 *                    index within the source, pass).
 *                    O(sources) memory, O(log sources) time per position, nothing of size E
 *                    or n_j is ever built, so position 10^9 costs what position 0 costs.
 *   bw__mix_sampler  that order sharded over the ranks by the job's mode exactly as a dataset
 *                    of E samples in that order would be (the sampler core over positions
 *                    0..E-1 without a shuffle, with the job's world-size history, so padding,
 *                    drops, resume and elastic resizes are the single-dataset rules): rank r,
 *                    step s -> (source, index) pairs.
 *
 * Pure: no I/O, no threads, no globals, nothing printed. Both objects are immutable once made;
 * any number of threads may call the const functions concurrently.
 *
 * Errors: functions that can fail return BW_OK or a negative bw_err code (BW_INVALID_ARGUMENT
 * for a refused input, BW_NOMEM) and write a sentence naming the cause into err (err may be
 * NULL when errlen is 0); on error *out is NULL.
 */
#ifndef BW_JOBS_MIXTURE_H
#define BW_JOBS_MIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jobs.pb-c.h"
#include "sampler/sampler.h"

#define BW__MIX_MAX_SOURCES 256
#define BW__MIX_MAX_SAMPLES (1ull << 62) /* n_j and E; the sampler core's dataset limit */
/* Weights are read as decimal text in units of 10^-9 and are at most 10^9. */
#define BW__MIX_WEIGHT_UNIT 1000000000ull
#define BW__MIX_MAX_WEIGHT (1000000000ull * BW__MIX_WEIGHT_UNIT)

/*
 * Parses a weight: a decimal number written with digits and at most one point ("0.7", "70",
 * ".25", "3."), at most 9 digits after the point, positive and at most 10^9. *units receives
 * its value times 10^9, exactly (an integer from 1 to 10^18). On error returns
 * BW_INVALID_ARGUMENT with a sentence quoting the text; *units is unchanged.
 */
int bw__mix_weight_parse(const char *text, uint64_t *units, char *err, size_t errlen);

/* A weight in units of 10^-9 as the decimal a user writes: 300000000 -> "0.3", 7 * 10^9 ->
 * "7", 1 -> "0.000000001" (no trailing zeros after the point; bw__mix_weight_parse reads it
 * back to the same units). */
void bw__mix_weight_format(uint64_t units, char *out, size_t outlen);

/* What a stream source does when it runs dry (docs/semantics.md, "Streams in a mixture"). */
typedef enum bw__mix_policy {
    BW__MIX_CYCLE = 0, /* start it again from its first record; epochs continue each stream */
    BW__MIX_STOP = 1,  /* end the epoch there; every epoch reads each stream from its start */
} bw__mix_policy;

/* A mixture's sources. Borrowed by the functions below for the duration of the call. */
typedef struct bw__mix_spec {
    const uint64_t *sizes;   /* n_j: samples (a stream: records) in source j, 1 .. 2^62 */
    const uint64_t *weights; /* w_j in units of 10^-9 (bw__mix_weight_parse), 1 .. 10^18 */
    size_t nsources;         /* 1 .. BW__MIX_MAX_SOURCES */
    uint64_t samples;        /* E, the epoch's size, 1 .. 2^62; 0: the sum of the sizes */
    const bool *streams;     /* streams[j]: source j is a stream, read in its own order;
                                NULL: no source is */
    bw__mix_policy policy;   /* for the stream sources; BW__MIX_STOP needs one */
} bw__mix_spec;

typedef struct bw__mixture bw__mixture;

/*
 * The order of `epoch` for `spec` and `seed`: checks the spec (also that (epoch + 1) * E stays
 * below 2^64, which keeps every source's stream position in 64 bits; and that BW__MIX_STOP
 * comes with a stream source) and computes the per-source counts c_j (largest remainder) and
 * the epoch's end P. O(sources x log sources). Returns BW_OK with a new mixture in
 * *out (free with bw__mixture_free), or BW_INVALID_ARGUMENT / BW_NOMEM with a sentence.
 */
int bw__mixture_new(bw__mixture **out, const bw__mix_spec *spec, uint64_t seed, uint64_t epoch,
                    char *err, size_t errlen);

/* Accepts NULL. */
void bw__mixture_free(bw__mixture *m);

/* E, the number of sources, the epoch, and source j's size n_j and count c_j (j < sources). */
uint64_t bw__mixture_samples(const bw__mixture *m);
/* P, the positions the epoch has: E, or under BW__MIX_STOP the first position whose source is
 * a stream with no record left (its k = n_j), if one comes before E. 1 <= P <= E. */
uint64_t bw__mixture_end(const bw__mixture *m);
/* Whether source j is a stream. */
bool bw__mixture_is_stream(const bw__mixture *m, size_t source);
size_t bw__mixture_nsources(const bw__mixture *m);
uint64_t bw__mixture_epoch(const bw__mixture *m);
uint64_t bw__mixture_size(const bw__mixture *m, size_t source);
uint64_t bw__mixture_count(const bw__mixture *m, size_t source);

/* Position pos (< E) of the global order: its source and k, its rank among that source's
 * c_j samples of the epoch (0 .. c_j - 1). O(log sources). */
void bw__mixture_locate(const bw__mixture *m, uint64_t pos, uint32_t *source, uint64_t *k);

/* The inverse of bw__mixture_locate: the position of source j's k-th sample (k < c_j).
 * O(log sources). */
uint64_t bw__mixture_position(const bw__mixture *m, uint32_t source, uint64_t k);

/* How many of source j's samples lie at positions [0, pos) (pos <= E). O(log sources). */
uint64_t bw__mixture_consumed(const bw__mixture *m, uint32_t source, uint64_t pos);

/* The stream position of source j's k-th sample of the epoch (k < c_j): epoch * c_j + k, but
 * k for a stream under BW__MIX_STOP (every epoch reads it from its start); the pass it is in
 * (stream position / n_j) and the sample index it reads: the keyed permutation of its pass
 * at stream position mod n_j, or for a stream that record itself. O(1). */
uint64_t bw__mixture_stream_position(const bw__mixture *m, uint32_t source, uint64_t k);
uint64_t bw__mixture_pass(const bw__mixture *m, uint32_t source, uint64_t k);
uint64_t bw__mixture_index(const bw__mixture *m, uint32_t source, uint64_t k);

/* bw__mixture_locate then bw__mixture_index (and bw__mixture_pass into *pass unless pass is
 * NULL): the sample at position pos (< E). */
void bw__mixture_at(const bw__mixture *m, uint64_t pos, uint32_t *source, uint64_t *index,
                    uint64_t *pass);

/* bw__mixture_at for n positions at once, with the same results: sources[i], indices[i] and
 * (passes not NULL) passes[i] of position pos[i] (< E). pos may be indices (then each index
 * replaces its position). Cheaper per position than bw__mixture_at: the items go down the
 * tree together, each node merging a run of nearby positions at once (or walking its merge
 * forward between them), and the samples of one (source, pass) share one permutation key
 * schedule (bw__feistel_at_run). Allocates nothing; uses about 48 KiB of stack. */
void bw__mixture_at_many(const bw__mixture *m, const uint64_t *pos, size_t n, uint32_t *sources,
                         uint64_t *indices, uint64_t *passes);

/* Where source j's stream stands after the positions [0, pos) (pos <= P), as a cursor records
 * it: *pass and the record (sample) number within that pass the source reads next,
 * stream position (epoch * c_j, or 0 for a stream under BW__MIX_STOP) + consumed, split by
 * n_j; a stream under BW__MIX_STOP that gave all n_j records answers pass 0, record n_j.
 * O(log sources). */
uint64_t bw__mixture_next_record(const bw__mixture *m, uint32_t source, uint64_t pos,
                                 uint64_t *pass);

/*
 * The keyed bijection of [0, n) (n >= 1) that orders pass `pass` of source j's stream, at
 * position i < n. Exposed for tests; bw__mixture_index uses it.
 */
uint64_t bw__mix_permute(uint64_t seed, uint32_t source, uint64_t pass, uint64_t n, uint64_t i);

typedef struct bw__mix_sampler bw__mix_sampler;

/*
 * The mixture of `epoch` (its P positions) sharded as `cfg` says (mode torch, accelerate or
 * iterable, batch_size,
 * drop_last, sampler_drop_last, split_batches, even_batches, dispatch_batches,
 * shard_single_process; seed also seeds the mixture). cfg->num_samples, world_size and epoch
 * are ignored: E, the history and `epoch` decide them; history[0..nhistory) is the job's
 * world-size history as bw__plan_new takes it (elastic resizes inside the epoch apply).
 * Refused: cfg->shuffle (a mixture orders its sources itself), besides everything the
 * sampler core and bw__mixture_new refuse.
 * Returns BW_OK with a new sampler (free with bw__mix_sampler_free), or BW_INVALID_ARGUMENT /
 * BW_NOMEM with a sentence.
 */
int bw__mix_sampler_new(bw__mix_sampler **out, const bw__mix_spec *spec, const bw__sampler_cfg *cfg,
                        const Batchwire__V1__WorldSegment *const *history, size_t nhistory,
                        uint64_t epoch, char *err, size_t errlen);

/* Accepts NULL. */
void bw__mix_sampler_free(bw__mix_sampler *s);

/* The order (borrowed; lives as long as the sampler) and the sampler over its positions
 * (borrowed: world size, first step, end steps, equal batches, positions consumed). */
const bw__mixture *bw__mix_sampler_mixture(const bw__mix_sampler *s);
const bw__sampler *bw__mix_sampler_positions(const bw__mix_sampler *s);

/*
 * Batch `step` of `rank`: out->indices receive each sample's index within its source,
 * sources[] (as many slots as out->indices: bw__sampler_max_batch) its source, passes[] (may
 * be NULL; as many slots) its pass, out->padding (may be NULL) the padding flags, out->count
 * and out->real as bw__sampler_batch. O(batch x log sources), whatever the step. Returns
 * what bw__sampler_batch returns.
 */
int bw__mix_sampler_batch(const bw__mix_sampler *s, uint64_t rank, uint64_t step, bw__batch *out,
                          uint32_t *sources, uint64_t *passes);

#endif
