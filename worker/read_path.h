/*
 * The worker's one read path, whatever the transport: bw__rp_open runs every check of a
 * ReadSamplesRequest or ReadStreamRequest once and returns a read; bw__rp_next yields its
 * records one at a time, with their bytes in mapped file memory. The gRPC encoder
 * (sample_stream.c) and the data channel (data_channel.c) both consume it; Data.Stats is
 * counted here and nowhere else.
 *
 * A read is used by one thread at a time; different reads may run at once.
 */
#ifndef BW_WORKER_READ_PATH_H
#define BW_WORKER_READ_PATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

#include "data.h"
#include "metrics.h"

typedef struct bw__rp bw__rp;

/* One record of a read. `rec`'s parts point into mapped file memory (release it with
 * bw__record_release). */
typedef struct bw__rp_rec {
    uint64_t key;    /* ReadSamples: the dataset index; ReadStream: record number in its source */
    uint64_t offset; /* ReadStream: the record's byte offset in its source */
    uint64_t next_offset; /* ReadStream: where the record after it starts */
    bw__record rec;
} bw__rp_rec;

enum { BW_RP_END = 1 };

/*
 * Opens a read for `req`, a ReadSamplesRequest or a ReadStreamRequest (its descriptor says
 * which; borrowed: it must outlive the read). Runs every check once, in this order:
 *   ReadSamples: index count; dataset opened, indexed and its fingerprint; every index in
 *                range; ownership of every index's shard (bw__pview_check);
 *   ReadSamples of several datasets (`datasets`; docs/data-channel.md, "Several datasets in
 *                one request"): index count; the request's form (no `dataset`, one dataset
 *                number per index and in range, no transform, at most 256); each dataset as
 *                above; every index in range of its dataset; ownership, as above;
 *   ReadStream:  dataset opened and its fingerprint; the format is a stream; the source in
 *                range; ownership of the source's shard; the offset of first_record when
 *                seek_record or locate_only (counted as located).
 * BW_OK with *out (close with bw__rp_close), or the error code with a sentence that names the
 * method, the dataset and the reason ("ReadSamples: dataset npy a.npy: index 70 requested
 * (position 1) but the dataset has 61 samples"). `peer` is for debug lines. Opening may read
 * whole files (indexing): never call it on a completion-queue thread.
 */
int bw__rp_open(bw_worker *w, const char *peer, const ProtobufCMessage *req, bw__rp **out,
                char *err, size_t errlen);
/* The same, with the request's deadline (bw__mono_ms clock; 0: none): directory walks while
 * opening its dataset stop there, or at --open-timeout-ms, whichever is sooner (BW_TIMEOUT). */
int bw__rp_open_until(bw_worker *w, const char *peer, const ProtobufCMessage *req,
                      uint64_t deadline_ms, bw__rp **out, char *err, size_t errlen);

/* The first checks of every request: the dataset opened (and indexed when `index`) and its
 * fingerprint equal to `fingerprint` when that is set. BW_OK with *out (put with bw__ds_put),
 * or the code with "METHOD: dataset FORMAT SOURCE: reason" in err. Describe uses it alone. */
int bw__rp_open_dataset(bw_worker *w, const char *peer, const char *method,
                        const Batchwire__V1__Dataset *spec, const char *fingerprint, bool index,
                        bw__wds **out, char *err, size_t errlen);
/* The same with the request's deadline for directory walks (as bw__rp_open_until). */
int bw__rp_open_dataset_until(bw_worker *w, const char *peer, const char *method,
                              const Batchwire__V1__Dataset *spec, const char *fingerprint,
                              bool index, uint64_t deadline_ms, bw__wds **out, char *err,
                              size_t errlen);

/* Reads without checks over an open dataset (taken over: put when the read is closed), for
 * bw__rp_open and tests. `indices` are borrowed. Counts into stats (may be NULL). NULL when out
 * of memory (e is put). */
bw__rp *bw__rp_samples(bw__wds *e, const uint64_t *indices, size_t n, bw__data_stats *stats);
bw__rp *bw__rp_records(bw__wds *e, uint32_t src, uint64_t offset, uint64_t first_record,
                       uint64_t max_records, bw__data_stats *stats);

/* The next record into *out: BW_OK; BW_RP_END when the read is complete; or an error with a
 * sentence naming the method, the dataset, the file and the offset (the records before it were
 * good; calling again tries the same record again). */
int bw__rp_next(bw__rp *rp, bw__rp_rec *out, char *err, size_t errlen);

/* A run of a ReadSamples read's next samples (bw__rp_next_span): n samples of `size` bytes, the
 * dataset's indices first, first + 1, ..., lying back to back from p in mapped file memory
 * that the open read holds. */
typedef struct bw__rp_span {
    uint64_t first;
    size_t n;
    uint64_t size;
    const uint8_t *p;
} bw__rp_span;

/* The read's next samples as one span, when they are consecutive indices of one file whose
 * format locates its samples (npy, npz arrays) and the read has no transform: up to `max`
 * samples and `max_bytes` bytes (at least one sample), each served, checked and counted as
 * bw__rp_next serves it -- the same file checks (the first record of a file, then every 64
 * records and 256 KiB: read_path.c, CHECK_EVERY), prefetching and counters, in one call
 * instead of one a sample. BW_OK with out->n == 0 where the next sample is not such (another
 * format, a transform, the read's end, an index out of range): take it with bw__rp_next, which
 * also ends the read. Otherwise the changed-file error, as bw__rp_next gives it. */
int bw__rp_next_span(bw__rp *rp, size_t max, uint64_t max_bytes, bw__rp_span *out, char *err,
                     size_t errlen);

/* The read's next samples gathered (bw__rp_next_gather): n samples of `size` bytes, the
 * dataset's indices first, ... in request order, samples p[0 .. n) in mapped file memory that
 * the open read holds -- wherever each lies in the file. */
/* How many samples ahead of the one read a ReadSamples read prefetches: a few samples' work
 * covers a miss to memory (docs/performance.md, "Per-sample cost, fifth pass"). */
enum { BW_RP_PREFETCH_AHEAD = 8 };

typedef struct bw__rp_gather {
    uint64_t first;
    size_t n;
    uint64_t size;
} bw__rp_gather;

/* The read's next samples smaller than `below` bytes, of one size and one file whose format
 * locates its samples (npy, npz arrays), the read without a transform: up to `max` samples and
 * `max_bytes` bytes (at least one sample), their places in p[0 .. n) -- served, checked and
 * counted as bw__rp_next_span serves a span, for samples that are not neighbours in the file
 * (a shuffled order, or one worker's share of a plan order: runs of about two with two
 * workers). It stops before samples that follow one another in the file for `below` bytes or
 * more (bw__rp_next_span sends those as one piece): BW_OK with out->n == 0 when they begin
 * with the next sample, as where the next sample is not such (larger, another format, the
 * read's end). Otherwise the changed-file error, as bw__rp_next gives it. */
int bw__rp_next_gather(bw__rp *rp, size_t max, uint64_t max_bytes, uint64_t below,
                       const uint8_t **p, bw__rp_gather *out, char *err, size_t errlen);

/* After BW_RP_END: checks every file the read served from once more (BW_OK, or the
 * changed-file error). For a transport that sends records' bytes from the mapping after it
 * has seen the end: it sends them, then asks this, then ends the request. */
int bw__rp_recheck(bw__rp *rp, char *err, size_t errlen);

/* Counts what the read serves from now on (samples and bytes, by dataset) as served over
 * transport t. Transports call it once, after bw__rp_open; m NULL: not counted. */
void bw__rp_meter(bw__rp *rp, bw__wm *m, bw__wm_transport t);

/* Whether it reads a stream (ReadStream), and whether it only locates (locate_only: no
 * records; bw__rp_end_offset is first_record's offset). */
bool bw__rp_is_stream(const bw__rp *rp);
bool bw__rp_locate_only(const bw__rp *rp);

/* Records yielded so far. */
uint64_t bw__rp_count(const bw__rp *rp);

/* ReadStream: the byte offset where the record after the last one yielded starts (the
 * starting offset before any); 0 for ReadSamples. */
uint64_t bw__rp_end_offset(const bw__rp *rp);

/* The key of the first record (ReadStream: first_record). */
uint64_t bw__rp_first_key(const bw__rp *rp);

/* Closes the read and puts its dataset. NULL is a no-op. */
void bw__rp_close(bw__rp *rp);

#endif
