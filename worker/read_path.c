/* The read path (read_path.h): every check of a read request once, then its records one at a
 * time. */
#include "read_path.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "formats/field_table.h"
#include "placement/placement.h"
#include "sample_transform.h"
#include "worker.h"

/* Where a read (or, in a read of several datasets, each dataset) stands with its file checks
 * and its counting: a part keeps its own while another is current (use_part). */
typedef struct rp_progress {
    size_t checked_src;                  /* the source last checked, */
    uint64_t unchecked, unchecked_bytes; /* and the records (and bytes) read from it since */
    uint64_t unmetered, unmetered_bytes; /* served, not yet added to `served` */
} rp_progress;

/* A read's dataset and where the read stands in it; a read of several datasets has one a
 * dataset, in `part`, the current one in `now`. */
typedef struct rp_part {
    bw__wds *e;
    bw__dataset *d;
    const Batchwire__V1__Dataset *spec; /* bw__rp_open: the request's (borrowed) */
    bw__wm_served served;               /* bw__rp_meter */
    /* ReadSamples: a bit per source a record was served from, checked again at the end */
    uint8_t *touched;
    /* Kept by a part while another is current: a change of part does not start its file
     * checks over (an fstat) nor flush the counters (atomic adds) -- a worker's fstats for a
     * two-source mixture fell from 2849 to 2390 in two epochs (docs/performance.md, "Mixture
     * jobs, seventh pass") */
    rp_progress at;
} rp_part;

struct bw__rp {
    rp_part now;
    bw__data_stats *stats;
    uint64_t unstated, unstated_bytes; /* read, not yet added to `stats` */
    bool stream, locate_only, at_end;
    bool field_table; /* tar samples start with their field table (field_table.h) */
    /* ReadSamples with a transform (else NULL): run on the pool a window at a time */
    bw__stf *tf;
    bw__tfpool *pool; /* NULL: on the reading thread */
    bw__exec *exec;   /* charges the window's results; NULL: not charged */
    bw__wm *metrics;
    struct {
        size_t cap, n, at; /* samples it holds (at most cap), the next to yield */
        uint64_t charge;
        bw__rp_rec *recs;
        size_t *srcs;
        int *rcs;
        char (*errs)[BW_STF_ERR_MAX];
    } win;
    /* ReadSamples */
    const uint64_t *indices;
    size_t n, pos; /* pos: the next to read (a transform reads a window ahead of count) */
    /* ReadStream */
    uint32_t src;
    uint64_t off, first_record, max_records;
    uint64_t count;
    /* ReadSamples of several datasets (ReadSamplesRequest.datasets): each one's, index i read
     * from part[of[i]], part[cur] being `now` (and brought up to date when another becomes
     * current). nparts 0: one dataset, `now` alone. */
    rp_part *part;
    size_t nparts, cur;
    const uint8_t *of; /* the request's index_datasets_bytes, or of_copy */
    uint8_t *of_copy;  /* its index_datasets (varints), as bytes */
};

/* A file's identity is checked with the first record read from it, then once CHECK_EVERY
 * records and CHECK_BYTES bytes have been read from it since the last check, with any record
 * that failed, and at the end of the read (end()), which is what guarantees that a read ending
 * well served no changed byte: the checks between only make a change fail the read sooner
 * (docs/formats.md, "Files that change under a worker"). One fstat per record cost about a
 * sixth of the data channel's throughput at 4 KiB records, and one every 64 records about 6 %
 * of a worker's CPU at 256 bytes (docs/performance.md, "Per-sample cost, tenth pass"). */
enum { CHECK_EVERY = 64, CHECK_BYTES = 256 << 10 };

/* Whether a check of source src is due now that k more records of `bytes` in all were read
 * from it (counted here): a record that failed (`failed`), the first records of another
 * source, or CHECK_EVERY records and CHECK_BYTES bytes since the last check. A due check
 * restarts the counts. */
static bool check_due(rp_progress *at, size_t src, uint64_t k, uint64_t bytes, bool failed)
{
    at->unchecked += k;
    at->unchecked_bytes += bytes;
    if (!failed && src == at->checked_src &&
        (at->unchecked < CHECK_EVERY || at->unchecked_bytes < CHECK_BYTES))
        return false;
    at->checked_src = src;
    at->unchecked = at->unchecked_bytes = 0;
    return true;
}

/* How many samples ahead of the one read a ReadSamples read prefetches: a few samples' work
 * covers a miss to memory (docs/performance.md, "Per-sample cost, fifth pass"). */
enum { PREFETCH_AHEAD = BW_RP_PREFETCH_AHEAD };

/* Served records are added to the shared metrics and the worker's totals every METER_EVERY
 * records and when the read closes: one atomic add per record and counter, contended by every
 * read of the dataset, would cost more than the counting is worth at small records. */
enum { METER_EVERY = 64 };

/* What part p served and has not counted yet, counted under its dataset. */
static void meter_part(rp_part *p)
{
    if (p->at.unmetered) {
        bw__counter_add(p->served.samples, p->at.unmetered);
        bw__counter_add(p->served.bytes, p->at.unmetered_bytes);
    }
    p->at.unmetered = p->at.unmetered_bytes = 0;
}

static void meter(bw__rp *rp)
{
    meter_part(&rp->now);
    if (rp->unstated && rp->stats) { /* the worker's totals (heartbeats, GetStats) */
        atomic_fetch_add(&rp->stats->records_read, rp->unstated);
        atomic_fetch_add(&rp->stats->record_bytes_read, rp->unstated_bytes);
    }
    rp->unstated = rp->unstated_bytes = 0;
}

/* Drops the window's records not yet yielded and gives its charge back. */
static void window_drop(bw__rp *rp)
{
    for (size_t k = rp->win.at; k < rp->win.n; k++)
        bw__record_release(&rp->win.recs[k].rec);
    rp->win.at = rp->win.n = 0;
    if (rp->win.charge)
        bw__exec_release(rp->exec, rp->win.charge);
    rp->win.charge = 0;
}

static bw__rp *rp_new(bw__wds *e, bw__data_stats *stats)
{
    bw__rp *rp = calloc(1, sizeof(*rp));
    if (!rp) {
        bw__ds_put(e);
        return NULL;
    }
    rp->now.e = e;
    rp->now.d = bw__ds_dataset(e);
    rp->stats = stats;
    rp->now.at.checked_src = SIZE_MAX;
    return rp;
}

bw__rp *bw__rp_samples(bw__wds *e, const uint64_t *indices, size_t n, bw__data_stats *stats)
{
    bw__rp *rp = rp_new(e, stats);
    if (rp) {
        rp->indices = indices;
        rp->n = n;
        rp->now.touched = calloc(rp->now.d->nsources / 8 + 1, 1);
        if (!rp->now.touched) {
            bw__rp_close(rp);
            return NULL;
        }
    }
    return rp;
}

bw__rp *bw__rp_records(bw__wds *e, uint32_t src, uint64_t offset, uint64_t first_record,
                       uint64_t max_records, bw__data_stats *stats)
{
    bw__rp *rp = rp_new(e, stats);
    if (rp) {
        rp->stream = true;
        rp->src = src;
        rp->off = offset;
        rp->first_record = first_record;
        rp->max_records = max_records;
    }
    return rp;
}

void bw__rp_meter(bw__rp *rp, bw__wm *m, bw__wm_transport t)
{
    for (size_t k = 0; k < rp->nparts; k++)
        rp->part[k].served = bw__wm_served_for(m, t, rp->part[k].spec);
    rp->now.served = rp->nparts ? rp->part[rp->cur].served : bw__wm_served_for(m, t, rp->now.spec);
}

/* A read of several datasets (its parts set up, `now` being part[cur]) moves on to part k: the
 * part before keeps what it has served and not yet counted, and where its file checks stand,
 * until it is current again (or the read closes); k's take up where they were. */
static void use_part(bw__rp *rp, size_t k)
{
    rp->part[rp->cur] = rp->now;
    rp->cur = k;
    rp->now = rp->part[k];
}

void bw__rp_close(bw__rp *rp)
{
    if (!rp)
        return;
    for (size_t k = 0; k < rp->nparts; k++) /* the other parts' served, not yet counted */
        if (k != rp->cur)
            meter_part(&rp->part[k]);
    meter(rp);
    if (rp->tf)
        window_drop(rp);
    if (rp->nparts) { /* the current part's fields are its own */
        for (size_t k = 0; k < rp->nparts; k++) {
            bw__ds_put(rp->part[k].e);
            free(rp->part[k].touched);
        }
        rp->now.e = NULL;
        rp->now.touched = NULL;
    }
    free(rp->part);
    free(rp->of_copy);
    bw__ds_put(rp->now.e);
    free(rp->now.touched);
    free(rp->tf);
    free(rp->win.recs);
    free(rp->win.srcs);
    free(rp->win.rcs);
    free(rp->win.errs);
    free(rp);
}

bool bw__rp_is_stream(const bw__rp *rp)
{
    return rp->stream;
}

bool bw__rp_locate_only(const bw__rp *rp)
{
    return rp->locate_only;
}

uint64_t bw__rp_count(const bw__rp *rp)
{
    return rp->count;
}

uint64_t bw__rp_end_offset(const bw__rp *rp)
{
    return rp->stream ? rp->off : 0;
}

uint64_t bw__rp_first_key(const bw__rp *rp)
{
    return rp->stream ? rp->first_record : rp->n ? rp->indices[0] : 0;
}

/* A file changed: the read fails with the check's sentence, and the dataset is compared with
 * its files at the next request. */
static int changed(bw__rp *rp, const char *why, char *err, size_t errlen)
{
    bw__ds_stale(rp->now.e);
    snprintf(err, errlen, "%s: %s", rp->stream ? "ReadStream" : "ReadSamples", why);
    return BW_FAILED_PRECONDITION;
}

/* Every file a record was served from, once more before the read ends: the transports copy a
 * record's bytes out of the mapping after bw__rp_next returned it (both have sent every
 * earlier record by the time they ask for the next one), so a change made in between is
 * caught here and the request fails instead of ending well (docs/formats.md, "Files that
 * change under a worker"). */
static int end(bw__rp *rp, char *err, size_t errlen)
{
    char why[1024];
    if (rp->stream)
        return rp->count && bw__dataset_check(rp->now.d, rp->src, why, sizeof(why)) != BW_OK
                   ? changed(rp, why, err, errlen)
                   : BW_RP_END;
    for (size_t k = 0; k < (rp->nparts ? rp->nparts : 1); k++) {
        if (rp->nparts)
            use_part(rp, k);
        for (size_t i = 0; i < rp->now.d->nsources; i++)
            if ((rp->now.touched[i / 8] >> (i % 8) & 1) &&
                bw__dataset_check(rp->now.d, i, why, sizeof(why)) != BW_OK)
                return changed(rp, why, err, errlen);
    }
    return BW_RP_END;
}

int bw__rp_recheck(bw__rp *rp, char *err, size_t errlen)
{
    int rc = end(rp, err, errlen);
    return rc == BW_RP_END ? BW_OK : rc;
}

/* The next record as the dataset holds it: ReadSamples, the sample at rp->pos (then pos moves
 * on); ReadStream, the record at rp->off. *src is its source. Not yet counted as served. */
/* Sample `at` of a ReadSamples read, prefetched (bw__dataset_prefetch) when there is one. */
static void prefetch(const bw__rp *rp, size_t at)
{
    if (at < rp->n)
        bw__dataset_prefetch(rp->nparts ? rp->part[rp->of[at]].d : rp->now.d, rp->indices[at]);
}

static int read_raw(bw__rp *rp, bw__rp_rec *out, size_t *srcp, char *err, size_t errlen)
{
    char why[1024];
    int rc;
    size_t src;
    if (!rp->stream) {
        if (rp->pos >= rp->n)
            return end(rp, err, errlen);
        /* The sample PREFETCH_AHEAD places on is asked for now, so that its bytes are near by
         * the time it is copied or sent: in a shuffled order each sample is a miss to memory
         * (and to the TLB), which the copy otherwise waits for alone. */
        for (size_t a = rp->pos ? PREFETCH_AHEAD : 0; a <= PREFETCH_AHEAD; a++)
            prefetch(rp, rp->pos + a);
        if (rp->nparts && rp->of[rp->pos] != rp->cur)
            use_part(rp, rp->of[rp->pos]);
        out->key = rp->indices[rp->pos];
        out->offset = out->next_offset = 0;
        rc = bw__dataset_get(rp->now.d, out->key, &out->rec, why, sizeof(why));
        src = rc == BW_OUT_OF_RANGE ? 0 : bw__dataset_source_of(rp->now.d, out->key);
    } else {
        if (rp->at_end || rp->locate_only || (rp->max_records && rp->count >= rp->max_records))
            return end(rp, err, errlen);
        out->key = rp->first_record + rp->count;
        out->offset = rp->off;
        rc = bw__dataset_next(rp->now.d, rp->src, rp->off, &out->rec, &out->next_offset, why,
                              sizeof(why));
        src = rp->src;
    }
    /* The file's identity after its record was read and before any byte of it is handed to
     * the transport: a record read while the file changed (or whose read failed because it
     * changed) is refused. */
    if (check_due(&rp->now.at, src, 1, rc == BW_OK ? out->rec.size : 0, rc != BW_OK)) {
        if (bw__dataset_check(rp->now.d, src, why, sizeof(why)) != BW_OK) {
            if (rc == BW_OK)
                bw__record_release(&out->rec);
            return changed(rp, why, err, errlen);
        }
    }
    if (rc == BW_FMT_END) {
        rp->at_end = true;
        return end(rp, err, errlen);
    }
    if (rc != BW_OK) {
        /* The reader's sentence names the file and the offset. */
        snprintf(err, errlen, "%s: %s", rp->stream ? "ReadStream" : "ReadSamples", why);
        return rc;
    }
    if (rp->stream)
        rp->off = out->next_offset;
    else {
        rp->now.touched[src / 8] |= (uint8_t)(1u << (src % 8));
        rp->pos++;
    }
    rp->unstated++;
    rp->unstated_bytes += out->rec.size;
    *srcp = src;
    return BW_OK;
}

/* The read's next k samples of `size` bytes, from source src of the current dataset, are served
 * together (a span or a gather): the samples from place `ahead` (the read's first call: from
 * its first) to PREFETCH_AHEAD places past them prefetched, as bw__rp_next prefetches each
 * (read_raw) -- a caller that prefetches some of its own as it copies them starts later -- the
 * file's identity checked before their bytes go to a transport, as read_raw checks it, and
 * counted as read_raw and serve count each. BW_OK, or the changed-file error (nothing taken). */
static int take(bw__rp *rp, size_t src, size_t k, uint64_t size, size_t ahead, char *err,
                size_t errlen)
{
    for (size_t a = rp->pos ? ahead : 0; a < rp->pos + k + PREFETCH_AHEAD; a++)
        prefetch(rp, a);
    rp_progress *at = &rp->now.at;
    if (check_due(at, src, k, k * size, false)) {
        char why[1024];
        if (bw__dataset_check(rp->now.d, src, why, sizeof(why)) != BW_OK)
            return changed(rp, why, err, errlen);
    }
    rp->now.touched[src / 8] |= (uint8_t)(1u << (src % 8));
    rp->pos += k;
    rp->count += k;
    rp->unstated += k;
    rp->unstated_bytes += k * size;
    at->unmetered += k;
    at->unmetered_bytes += k * size;
    if (at->unmetered >= METER_EVERY)
        meter(rp);
    return BW_OK;
}

/* Where the read's next sample lies in mapped file memory, for a span or a gather (NULL where
 * it may be neither: a stream, a transform, field tables, the read's end, fields, a format
 * that does not locate its samples, an index out of range, an empty sample); *src and *size:
 * its source (the current dataset's, made current) and size. */
static const uint8_t *next_located(bw__rp *rp, size_t max, size_t *src, size_t *size)
{
    if (rp->stream || rp->tf || rp->field_table || rp->pos >= rp->n || !max)
        return NULL;
    if (rp->nparts && rp->of[rp->pos] != rp->cur)
        use_part(rp, rp->of[rp->pos]);
    const bw__dataset *d = rp->now.d;
    uint64_t first = rp->indices[rp->pos];
    if (d->nfields || !d->ops->locate || first >= d->length)
        return NULL;
    *src = bw__dataset_source_of(d, first);
    const bw__source *s = d->sources[*src];
    uint64_t rel = first - d->first[*src];
    const uint8_t *p = rel < s->count ? s->ops->locate(s, rel, size) : NULL;
    return p && *size ? p : NULL;
}

int bw__rp_next_span(bw__rp *rp, size_t max, uint64_t max_bytes, bw__rp_span *out, char *err,
                     size_t errlen)
{
    out->n = 0;
    size_t src, size;
    const uint8_t *p = next_located(rp, max, &src, &size);
    if (!p)
        return BW_OK;
    const bw__dataset *d = rp->now.d;
    const bw__source *s = d->sources[src];
    uint64_t first = rp->indices[rp->pos], rel = first - d->first[src];
    /* the samples that follow in the request: the next indices of this file (and of this
     * dataset, in a read of several), each where the one before it ends */
    size_t cap = max_bytes / size < max ? (size_t)(max_bytes / size) : max;
    cap = cap ? cap : 1;
    if (cap > rp->n - rp->pos)
        cap = rp->n - rp->pos;
    if (cap > s->count - rel)
        cap = (size_t)(s->count - rel);
    size_t k = 1, len;
    const uint64_t *ix = rp->indices + rp->pos;
    /* back to back (npy, npz): each index's place follows from the first's, unlocated */
    bool stride = s->ops->back_to_back;
    while (k < cap && ix[k] == first + k && (!rp->nparts || rp->of[rp->pos + k] == rp->cur) &&
           (stride || (s->ops->locate(s, rel + k, &len) == p + k * size && len == size)))
        k++;
    /* The first PREFETCH_AHEAD were prefetched with what came before them; a longer span is
     * one piece read in order, so only the samples after it are (a prefetch a sample of the
     * span's own would cost more than it hides). */
    size_t ahead = k > PREFETCH_AHEAD ? rp->pos + k : rp->pos + PREFETCH_AHEAD;
    int rc = take(rp, src, k, size, ahead, err, errlen);
    if (rc != BW_OK)
        return rc;
    *out = (bw__rp_span){first, k, size, p};
    return BW_OK;
}

int bw__rp_next_gather(bw__rp *rp, size_t max, uint64_t max_bytes, uint64_t below,
                       const uint8_t **p, bw__rp_gather *out, char *err, size_t errlen)
{
    out->n = 0;
    size_t src, size;
    if (!(p[0] = next_located(rp, max, &src, &size)) || size >= below)
        return BW_OK;
    const bw__dataset *d = rp->now.d;
    const bw__source *s = d->sources[src];
    uint64_t first = rp->indices[rp->pos], lo = d->first[src], hi = lo + s->count;
    size_t cap = max_bytes / size < max ? (size_t)(max_bytes / size) : max;
    cap = cap ? cap : 1;
    if (cap > rp->n - rp->pos)
        cap = rp->n - rp->pos;
    /* samples of this file (and dataset) in request order, up to cap -- and, to see whether the
     * last ones begin a streak of neighbours in the file that make `below` bytes, up to L - 1
     * past it: a streak is left to a span, so the gather ends before its first sample */
    size_t streak_min = (size_t)((below + size - 1) / size), streak = 1, k = 1, len;
    size_t look = rp->n - rp->pos - cap < streak_min - 1 ? rp->n - rp->pos : cap + streak_min - 1;
    const uint8_t *prev = p[0];
    for (; k < look; k++) {
        uint64_t i = rp->indices[rp->pos + k];
        const uint8_t *q;
        if (i < lo || i >= hi || (rp->nparts && rp->of[rp->pos + k] != rp->cur) ||
            !(q = s->ops->locate(s, i - lo, &len)) || len != size)
            break;
        streak = q == prev + size ? streak + 1 : 1;
        if (streak == streak_min)
            break;
        prev = q;
        if (k < cap)
            p[k] = q;
    }
    if (streak == streak_min)
        k -= streak_min - 1; /* up to the streak's first sample */
    if (k > cap)
        k = cap;
    if (k == 0) /* the streak begins with the next sample */
        return BW_OK;
    /* the caller asks for p[i + BW_RP_PREFETCH_AHEAD] as it copies p[i]: this, only for the
     * next call's first ones -- spread over the copies, not all at once */
    int rc = take(rp, src, k, size, rp->pos + k, err, errlen);
    if (rc != BW_OK)
        return rc;
    *out = (bw__rp_gather){first, k, size};
    return BW_OK;
}

/* A record read (and transformed) is served: counted, its field table in front. */
static int serve(bw__rp *rp, bw__rp_rec *out, char *err, size_t errlen)
{
    char why[1024];
    int rc;
    rp->count++;
    if (rp->field_table && (rc = bw__field_table_prepend(&out->rec, why, sizeof(why))) != BW_OK) {
        snprintf(err, errlen, "%s: %s", rp->stream ? "ReadStream" : "ReadSamples", why);
        bw__record_release(&out->rec);
        return rc;
    }
    rp->now.at.unmetered_bytes += out->rec.size;
    if (++rp->now.at.unmetered >= METER_EVERY)
        meter(rp);
    return BW_OK;
}

/* The next window of a transformed read: up to BW_STF_WINDOW samples read, then transformed
 * on the pool at once, their results charged against the in-flight budget until the window
 * after it (docs/transforms.md, "On the workers"). */
static int window_fill(bw__rp *rp, char *err, size_t errlen)
{
    window_drop(rp);
    if (rp->pos >= rp->n)
        return end(rp, err, errlen);
    size_t want = rp->n - rp->pos;
    if (want > rp->win.cap)
        want = rp->win.cap;
    if (rp->exec) {
        char why[256];
        uint32_t hint = 0;
        uint64_t charge = (uint64_t)want * rp->tf->shape.bytes;
        int rc = bw__exec_admit(rp->exec, charge, &hint, why, sizeof(why));
        if (rc != BW_OK) {
            snprintf(err, errlen, "ReadSamples: transform results of %zu samples: %s", want, why);
            return rc;
        }
        rp->win.charge = charge;
    }
    size_t k = 0;
    int rc = BW_OK;
    for (; k < want; k++)
        if ((rc = read_raw(rp, &rp->win.recs[k], &rp->win.srcs[k], err, errlen)) != BW_OK)
            break;
    if (k == 0) { /* the read's end or its error, at once */
        window_drop(rp);
        return rc;
    }
    /* A read that failed after k samples fails again when the window is used up: the
     * samples before it are served first, as without a transform. */
    rp->win.n = k;
    bw__stf_run_window(rp->tf, rp->pool, rp->now.d, rp->field_table, rp->win.recs, rp->win.srcs,
                       rp->win.rcs, rp->win.errs, k, rp->metrics);
    return BW_OK;
}

int bw__rp_next(bw__rp *rp, bw__rp_rec *out, char *err, size_t errlen)
{
    size_t src;
    int rc;
    if (!rp->tf) {
        if ((rc = read_raw(rp, out, &src, err, errlen)) != BW_OK)
            return rc;
        return serve(rp, out, err, errlen);
    }
    if (rp->win.at == rp->win.n && (rc = window_fill(rp, err, errlen)) != BW_OK)
        return rc;
    size_t k = rp->win.at;
    if (rp->win.rcs[k] != BW_OK) {
        /* The sample is named (source and index): the request fails, never sends an empty
         * result (docs/transforms.md, "On the workers"). Calling again reads it again. */
        rc = rp->win.rcs[k];
        snprintf(err, errlen, "ReadSamples: dataset %s %s: %s", rp->now.spec->format,
                 bw__ds_spec_first(rp->now.spec), rp->win.errs[k]);
        window_drop(rp);
        rp->pos = rp->count;
        return rc;
    }
    *out = rp->win.recs[k];
    rp->win.at++;
    return serve(rp, out, err, errlen);
}

/* ---- the checks ---- */

/* bw__rp_open_dataset with the request's deadline for directory walks (0: none); `part` of
 * `nparts` (nparts 0: the request's one dataset) is added to `method` in messages, and only
 * there: formatting it for every dataset of every request cost more than the lookup. */
static int open_part(bw_worker *w, const char *peer, const char *method, size_t part, size_t nparts,
                     const Batchwire__V1__Dataset *spec, const char *fingerprint, bool index,
                     uint64_t deadline_ms, bw__wds **out, char *err, size_t errlen)
{
    char why[1024];
    bw__wds *e = NULL;
    int rc = bw__ds_get_until(w->datasets, spec, deadline_ms, &e, why, sizeof(why));
    if (rc == BW_OK && index)
        rc = bw__ds_index(e, why, sizeof(why));
    if (rc == BW_OK && fingerprint && fingerprint[0] &&
        strcmp(fingerprint, bw__ds_dataset(e)->fingerprint) != 0) {
        const char *what = bw__ds_changed(e);
        snprintf(why, sizeof(why),
                 "dataset fingerprint is %s, the request expects %s: the files changed since the "
                 "job described them%s%s",
                 bw__ds_dataset(e)->fingerprint, fingerprint, what[0] ? ": " : "", what);
        rc = BW_MISMATCH;
    }
    if (rc != BW_OK) {
        bw__ds_put(e);
        char named[96];
        if (nparts) {
            snprintf(named, sizeof(named), "%s (dataset %zu of %zu)", method, part, nparts);
            method = named;
        }
        BW_DEBUG("request refused worker=%s method=%s peer=%s code=%s err=%s", w->id, method, peer,
                 bw_err_name(rc), why);
        snprintf(err, errlen, "%s: dataset %s %s%s: %s", method,
                 spec && spec->format ? spec->format : "?", bw__ds_spec_first(spec),
                 spec && spec->n_sources > 1 ? ",..." : "", why);
        return rc;
    }
    *out = e;
    return BW_OK;
}

static int open_dataset(bw_worker *w, const char *peer, const char *method,
                        const Batchwire__V1__Dataset *spec, const char *fingerprint, bool index,
                        uint64_t deadline_ms, bw__wds **out, char *err, size_t errlen)
{
    return open_part(w, peer, method, 0, 0, spec, fingerprint, index, deadline_ms, out, err,
                     errlen);
}

int bw__rp_open_dataset(bw_worker *w, const char *peer, const char *method,
                        const Batchwire__V1__Dataset *spec, const char *fingerprint, bool index,
                        bw__wds **out, char *err, size_t errlen)
{
    return open_dataset(w, peer, method, spec, fingerprint, index, 0, out, err, errlen);
}

int bw__rp_open_dataset_until(bw_worker *w, const char *peer, const char *method,
                              const Batchwire__V1__Dataset *spec, const char *fingerprint,
                              bool index, uint64_t deadline_ms, bw__wds **out, char *err,
                              size_t errlen)
{
    return open_dataset(w, peer, method, spec, fingerprint, index, deadline_ms, out, err, errlen);
}

/* Routing by source: the shard of the source holding dataset index `index` (indexed). */
static uint32_t source_shard(const bw__dataset *d, uint64_t index, const Batchwire__V1__Routing *rt)
{
    size_t lo = bw__dataset_source_of(d, index);
    return bw__placement_stream_shard((uint32_t)lo, d->sources[lo]->path,
                                      rt->num_shards ? rt->num_shards : 1,
                                      (bw_shard_mode)rt->shard_mode);
}

/* Ownership of shards[0..n) under the worker's placement; a sentence prefixed by method. */
static int check_owner(bw_worker *w, const char *method, const Batchwire__V1__Routing *rt,
                       const uint32_t *shards, size_t n, char *err, size_t errlen)
{
    char why[512];
    int rc = bw__pview_check(&w->placement, w->id, rt, shards, n, why, sizeof(why));
    if (rc != BW_OK)
        snprintf(err, errlen, "%s: %s", method, why);
    return rc;
}

/* *out = rp when every check passed (rc BW_OK); otherwise the read is closed. Returns rc. */
static int checked(bw__rp *rp, int rc, bw__rp **out)
{
    if (rc == BW_OK)
        *out = rp;
    else
        bw__rp_close(rp);
    return rc;
}

static int no_memory(const char *method, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: out of memory", method);
    return BW_NOMEM;
}

static int open_multi(bw_worker *w, const char *peer, const Batchwire__V1__ReadSamplesRequest *r,
                      const uint64_t *idx, size_t n, uint64_t deadline_ms, bw__rp **out, char *err,
                      size_t errlen);

/* ReadSamples: ownership of every index's shard under rt -- its block's (Routing.block_samples),
 * or, by source, that of the source of its own dataset holding it. */
static int check_indices_owner(bw_worker *w, const bw__rp *rp, const Batchwire__V1__Routing *rt,
                               char *err, size_t errlen)
{
    if (!rt || !rt->placement_version)
        return BW_OK;
    uint32_t *shards = malloc((rp->n ? rp->n : 1) * sizeof(*shards));
    if (!shards)
        return no_memory("ReadSamples", err, errlen);
    uint32_t ns = rt->num_shards ? rt->num_shards : 1;
    for (size_t i = 0; i < rp->n; i++)
        shards[i] = rt->by_source ? source_shard(rp->nparts ? rp->part[rp->of[i]].d : rp->now.d,
                                                 rp->indices[i], rt)
                                  : bw__placement_shard(rp->indices[i], rt->block_samples, ns,
                                                        (bw_shard_mode)rt->shard_mode);
    int rc = check_owner(w, "ReadSamples", rt, shards, rp->n, err, errlen);
    free(shards);
    return rc;
}

static int open_samples(bw_worker *w, const char *peer, const Batchwire__V1__ReadSamplesRequest *r,
                        uint64_t deadline_ms, bw__rp **out, char *err, size_t errlen)
{
    /* The indices come as varints (`indices`) or fixed-width (`indices_fixed`), not both
     * (docs/data-channel.md, "Fixed-width indices"). */
    if (r->n_indices && r->n_indices_fixed) {
        snprintf(err, errlen,
                 "ReadSamples: the request carries both `indices` (%zu) and `indices_fixed` "
                 "(%zu): its indices go in one of them",
                 r->n_indices, r->n_indices_fixed);
        return BW_INVALID_ARGUMENT;
    }
    const uint64_t *idx = r->n_indices_fixed ? r->indices_fixed : r->indices;
    size_t n = r->n_indices_fixed ? r->n_indices_fixed : r->n_indices;
    if (n > BW_DATA_MAX_INDICES) {
        snprintf(err, errlen, "ReadSamples: %zu indices is more than the limit of %d", n,
                 BW_DATA_MAX_INDICES);
        return BW_TOO_BIG;
    }
    if (r->n_datasets || r->n_index_datasets || r->index_datasets_bytes.len)
        return open_multi(w, peer, r, idx, n, deadline_ms, out, err, errlen);
    bw__wds *e = NULL;
    int rc = open_dataset(w, peer, "ReadSamples", r->dataset, r->fingerprint, true, deadline_ms, &e,
                          err, errlen);
    if (rc != BW_OK)
        return rc;
    bw__rp *rp = bw__rp_samples(e, idx, n, &w->stats);
    if (!rp)
        return no_memory("ReadSamples", err, errlen);
    rp->now.spec = r->dataset;
    rp->field_table = r->field_table;
    if (r->transform && r->transform->spec && r->transform->spec[0]) {
        char why[768];
        size_t cap = bw__stf_window(w->tfpool, n);
        rp->win.cap = cap;
        rp->win.recs = malloc(cap * sizeof(*rp->win.recs));
        rp->win.srcs = malloc(cap * sizeof(*rp->win.srcs));
        rp->win.rcs = malloc(cap * sizeof(*rp->win.rcs));
        rp->win.errs = malloc(cap * sizeof(*rp->win.errs));
        if (!(rp->tf = malloc(sizeof(*rp->tf))) || !rp->win.recs || !rp->win.srcs || !rp->win.rcs ||
            !rp->win.errs) {
            bw__rp_close(rp);
            return no_memory("ReadSamples", err, errlen);
        }
        rp->pool = w->tfpool;
        rp->exec = w->exec;
        rp->metrics = w->metrics;
        if ((rc = bw__stf_parse(r->transform, &rp->now.d->layout, rp->tf, why, sizeof(why))) !=
            BW_OK)
            snprintf(err, errlen, "ReadSamples: %s", why);
        const Batchwire__V1__ReadGrant *g = w->grants ? r->grant : NULL; /* verified */
        bw__stf_principal(rp->tf, g ? g->claims.data : NULL, g ? g->claims.len : 0, peer);
    }
    const bw__dataset *d = rp->now.d;
    uint64_t most = 0;
    for (size_t i = 0; i < n; i++)
        most = idx[i] > most ? idx[i] : most;
    for (size_t i = 0; most >= d->length && i < n && rc == BW_OK; i++)
        if (idx[i] >= d->length) {
            snprintf(err, errlen,
                     "ReadSamples: dataset %s %s: index %llu requested (position %zu) but the "
                     "dataset has %llu samples",
                     r->dataset->format, bw__ds_spec_first(r->dataset), (unsigned long long)idx[i],
                     i, (unsigned long long)d->length);
            rc = BW_OUT_OF_RANGE;
        }
    if (rc == BW_OK)
        rc = check_indices_owner(w, rp, r->routing, err, errlen);
    return checked(rp, rc, out);
}

/* The n-th of a request's datasets, named as messages name one: "npy a.npy" (",..." when it has
 * more sources). */
static void part_name(const Batchwire__V1__Dataset *spec, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s %s%s", spec && spec->format ? spec->format : "?",
             bw__ds_spec_first(spec), spec && spec->n_sources > 1 ? ",..." : "");
}

/* A ReadSamples request of several datasets (docs/data-channel.md, "Several datasets in one
 * request"): the same checks as of one dataset, for each of them, and each index against the
 * dataset it names. Messages name the dataset by its position in the request and its name. */
static int open_multi(bw_worker *w, const char *peer, const Batchwire__V1__ReadSamplesRequest *r,
                      const uint64_t *idx, size_t n, uint64_t deadline_ms, bw__rp **out, char *err,
                      size_t errlen)
{
    size_t nd = r->n_datasets;
    if (r->dataset || (r->fingerprint && r->fingerprint[0])) {
        snprintf(err, errlen,
                 "ReadSamples: the request names %zu datasets and also `dataset` or "
                 "`fingerprint`: a request reads one dataset or several, not both",
                 nd);
        return BW_INVALID_ARGUMENT;
    }
    if (nd > BW_DATA_MAX_DATASETS) {
        snprintf(err, errlen, "ReadSamples: %zu datasets is more than the limit of %d", nd,
                 BW_DATA_MAX_DATASETS);
        return BW_TOO_BIG;
    }
    /* Each index's dataset: varints (`index_datasets`) or a byte each
     * (`index_datasets_bytes`), not both. */
    const uint8_t *of8 = r->index_datasets_bytes.len ? r->index_datasets_bytes.data : NULL;
    const char *ofname = of8 ? "index_datasets_bytes" : "index_datasets";
    size_t nof = of8 ? r->index_datasets_bytes.len : r->n_index_datasets;
    if (of8 && r->n_index_datasets) {
        snprintf(err, errlen,
                 "ReadSamples: the request carries both `index_datasets` (%zu) and "
                 "`index_datasets_bytes` (%zu): each index's dataset goes in one of them",
                 r->n_index_datasets, r->index_datasets_bytes.len);
        return BW_INVALID_ARGUMENT;
    }
    if (nof != n) {
        snprintf(err, errlen, "ReadSamples: %zu indices but %zu %s: each index names its dataset",
                 n, nof, ofname);
        return BW_INVALID_ARGUMENT;
    }
    if (r->transform && r->transform->spec && r->transform->spec[0]) {
        snprintf(err, errlen,
                 "ReadSamples: a request of several datasets carries no transform (transforms "
                 "are refused on mixture jobs; docs/semantics.md, \"Mixture jobs\")");
        return BW_INVALID_ARGUMENT;
    }
    for (size_t k = 0; k < nd; k++)
        if (!r->datasets[k]->dataset) {
            snprintf(err, errlen, "ReadSamples: dataset %zu of %zu in the request has no dataset",
                     k, nd);
            return BW_INVALID_ARGUMENT;
        }
    uint32_t most = 0; /* a loop without exits: the position is looked for only if needed */
    for (size_t i = 0; of8 && i < n; i++)
        most = of8[i] > most ? of8[i] : most;
    for (size_t i = 0; !of8 && i < n; i++)
        most = r->index_datasets[i] > most ? r->index_datasets[i] : most;
    for (size_t i = 0; most >= nd && i < n; i++) {
        uint32_t j = of8 ? of8[i] : r->index_datasets[i];
        if (j >= nd) {
            snprintf(err, errlen,
                     "ReadSamples: index %llu (position %zu) names dataset %u but the request has "
                     "%zu datasets",
                     (unsigned long long)idx[i], i, j, nd);
            return BW_INVALID_ARGUMENT;
        }
    }
    bw__rp *rp = calloc(1, sizeof(*rp));
    struct rp_part *part = calloc(nd ? nd : 1, sizeof(*part));
    /* varints: copied as bytes (each below nd <= 256), the one form the read goes by */
    uint8_t *copy = of8 ? NULL : malloc(n ? n : 1);
    if (!rp || !part || (!of8 && !copy)) {
        free(rp);
        free(part);
        free(copy);
        return no_memory("ReadSamples", err, errlen);
    }
    for (size_t i = 0; copy && i < n; i++)
        copy[i] = (uint8_t)r->index_datasets[i];
    rp->part = part;
    rp->stats = &w->stats;
    rp->now.at.checked_src = SIZE_MAX;
    rp->indices = idx;
    rp->n = n;
    rp->of = of8 ? of8 : copy;
    rp->of_copy = copy;
    rp->field_table = r->field_table;
    int rc = BW_OK;
    for (size_t k = 0; k < nd && rc == BW_OK; k++) {
        const Batchwire__V1__DatasetRef *ref = r->datasets[k];
        rc = open_part(w, peer, "ReadSamples", k, nd, ref->dataset, ref->fingerprint, true,
                       deadline_ms, &part[k].e, err, errlen);
        if (rc != BW_OK)
            break;
        rp->nparts = k + 1; /* part k is the read's: closed with it */
        part[k].d = bw__ds_dataset(part[k].e);
        part[k].spec = ref->dataset;
        part[k].at.checked_src = SIZE_MAX;
        if (!(part[k].touched = calloc(part[k].d->nsources / 8 + 1, 1)))
            rc = no_memory("ReadSamples", err, errlen);
    }
    if (rc != BW_OK) {
        bw__rp_close(rp);
        return rc;
    }
    if (nd) /* part 0 current */
        rp->now = part[0];
    uint64_t length[BW_DATA_MAX_DATASETS];
    for (size_t k = 0; k < nd; k++)
        length[k] = part[k].d->length;
    bool out_of_range = false;
    for (size_t i = 0; i < n; i++)
        out_of_range |= idx[i] >= length[rp->of[i]];
    for (size_t i = 0; out_of_range && i < n && rc == BW_OK; i++) {
        const struct rp_part *pt = &part[rp->of[i]];
        if (idx[i] >= pt->d->length) {
            char name[320];
            part_name(pt->spec, name, sizeof(name));
            snprintf(err, errlen,
                     "ReadSamples: dataset %u of %zu (%s): index %llu requested (position %zu) "
                     "but the dataset has %llu samples",
                     rp->of[i], nd, name, (unsigned long long)idx[i], i,
                     (unsigned long long)pt->d->length);
            rc = BW_OUT_OF_RANGE;
        }
    }
    if (rc == BW_OK)
        rc = check_indices_owner(w, rp, r->routing, err, errlen);
    return checked(rp, rc, out);
}

static int open_stream(bw_worker *w, const char *peer, const Batchwire__V1__ReadStreamRequest *r,
                       uint64_t deadline_ms, bw__rp **out, char *err, size_t errlen)
{
    bw__wds *e = NULL;
    int rc = open_dataset(w, peer, "ReadStream", r->dataset, r->fingerprint, false, deadline_ms, &e,
                          err, errlen);
    if (rc != BW_OK)
        return rc;
    bw__rp *rp =
        bw__rp_records(e, r->source, r->offset, r->first_record, r->max_records, &w->stats);
    if (!rp)
        return no_memory("ReadStream", err, errlen);
    rp->now.spec = r->dataset;
    bw__dataset *d = rp->now.d;
    const Batchwire__V1__Routing *rt = r->routing;
    rp->locate_only = r->locate_only;
    rp->field_table = r->field_table;
    if (!d->ops->next) {
        snprintf(err, errlen, "ReadStream: format %s is not a stream: use ReadSamples",
                 d->ops->name);
        rc = BW_UNIMPLEMENTED;
    } else if (r->source >= d->nsources) {
        snprintf(err, errlen, "ReadStream: source %u requested but dataset %s %s has %zu sources",
                 r->source, r->dataset->format, bw__ds_spec_first(r->dataset), d->nsources);
        rc = BW_OUT_OF_RANGE;
    } else if (rt && rt->placement_version) {
        uint32_t shard = bw__placement_stream_shard(r->source, d->sources[r->source]->path,
                                                    rt->num_shards ? rt->num_shards : 1,
                                                    (bw_shard_mode)rt->shard_mode);
        rc = check_owner(w, "ReadStream", rt, &shard, 1, err, errlen);
    }
    if (rc == BW_OK && (r->seek_record || r->locate_only)) {
        /* The offset comes from the source's index: no record before it is read. */
        char why[1024];
        rc = bw__dataset_locate(d, r->source, r->first_record, &rp->off, why, sizeof(why));
        if (rc != BW_OK)
            snprintf(err, errlen, "ReadStream: dataset %s %s: %s", r->dataset->format,
                     bw__ds_spec_first(r->dataset), why);
        else
            atomic_fetch_add(&w->stats.records_located, 1);
    }
    return checked(rp, rc, out);
}

int bw__rp_open_until(bw_worker *w, const char *peer, const ProtobufCMessage *req,
                      uint64_t deadline_ms, bw__rp **out, char *err, size_t errlen)
{
    *out = NULL;
    if (req->descriptor == &batchwire__v1__read_stream_request__descriptor)
        return open_stream(w, peer, (const void *)req, deadline_ms, out, err, errlen);
    BW_INVARIANT(req->descriptor == &batchwire__v1__read_samples_request__descriptor,
                 "a read is opened for a ReadSamplesRequest or a ReadStreamRequest");
    return open_samples(w, peer, (const void *)req, deadline_ms, out, err, errlen);
}

int bw__rp_open(bw_worker *w, const char *peer, const ProtobufCMessage *req, bw__rp **out,
                char *err, size_t errlen)
{
    return bw__rp_open_until(w, peer, req, 0, out, err, errlen);
}
