/* The loader: a pipeline of fetch threads that fills a ring of batch slots ahead of the
 * trainer, while bw_loader_next hands batches out strictly in plan order; moving the position
 * (seek, epochs); opening and closing. The cursor always describes the last batch handed out,
 * never one merely prefetched: cursors and commits are loader_cursor.c's. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/interrupt.h"
#include "common/log.h"
#include "common/util.h"
#include "formats/field_table.h"
#include "placement/placement.h"
#include "gpu.h"
#include "loader_state.h"
#include "transport.h"

/* Small batches read together (fetch_thread, group_size): at most this many, of at most this
 * many bytes in all, and only while this many groups can be in flight. */
enum {
    BW_LOADER_GROUP_MAX = 32,
    BW_LOADER_GROUP_BYTES = 2 << 20,
    BW_LOADER_GROUPS_IN_FLIGHT = 4,
    /* batches in flight where they are not grouped (auto_depth): 4, or for fixed-size batches
     * as many as hold BW_LOADER_INFLIGHT_BYTES, and never fewer than BW_LOADER_DEPTH_MIN */
    BW_LOADER_DEPTH_DEFAULT = 4,
    BW_LOADER_DEPTH_MIN = 2,
    BW_LOADER_INFLIGHT_BYTES = 8 << 20
};

/* The order of `step` under `plan` (iterable jobs: positions in the epoch's stream) into the
 * arrays of o, with its count; BW_OK or the planner's verdict. */
static int order_batch(const bw_loader *l, const bw__plan *plan, uint64_t step, bw__ahead *o)
{
    bw__batch out = {o->indices, o->padding, 0, 0};
    int rc =
        bw__plan_mix_batch(plan, l->rank, step, &out, o->sources, l->mixstream ? o->passes : NULL);
    o->count = out.count;
    o->real = out.real;
    return rc;
}

/* The step's batch into b: its order -- already in b when `ordered` (a planned one taken,
 * with its verdict) -- and what follows from it; BW_OK or the planner's verdict. */
static int plan_batch(bw_loader *l, uint64_t step, bw_batch *b, const int *ordered)
{
    bw__ahead o = {.indices = b->indices,
                   .padding = b->padding,
                   .sources = b->sources,
                   .passes = b->passes,
                   .count = b->count,
                   .real = b->real};
    int rc = ordered ? *ordered : order_batch(l, l->plan, step, &o);
    if (rc != BW_OK)
        return rc;
    b->epoch = l->epoch;
    b->step = step;
    b->count = o.count;
    b->real = o.real;
    b->mixture = bw__plan_mixture(l->plan) != NULL;
    b->has_passes = l->mixstream != NULL;
    const Batchwire__V1__SampleLayout *lay =
        l->tf_whole ? &l->tf_layout : l->session.summary->dataset->layout;
    b->ndim = 0;
    if (lay && lay->dtype && *lay->dtype && lay->n_shape + 1 <= BW_LOADER_MAX_NDIM) {
        b->dtype = lay->dtype;
        b->ndim = 1 + lay->n_shape;
        b->shape[0] = o.count;
        for (size_t i = 0; i < lay->n_shape; i++)
            b->shape[i + 1] = lay->shape[i];
    }
    return bw__batch_plan_arrays(b, l->session.summary->dataset);
}

/* Fills a slot with its planned batch, in the order a reader follows it: the slot's memory
 * (batch.c: a hold still viewing its last batch keeps those bytes), the read -- by index
 * (map-style) or as runs of stream records (iterable) -- through the fetch loop, the samples'
 * fields, and the copy to the slot's device. BW_OK, or an error with b->err. */
/* Before a slot's read: no read starts while the lease may have lapsed (docs/client.md,
 * "Fencing"), and none once it is lost; then the slot's memory. */
static int fill_start(bw_loader *l, bw_batch *b)
{
    int rc = bw__session_lease_gate(&l->session, true, b->err, sizeof(b->err));
    if (rc == BW_OK)
        bw__batch_reuse(b);
    return b->rc = rc;
}

/* After a slot's read ended with rc: the samples' fields and the copy to the slot's device. */
static int fill_finish(bw_loader *l, bw_batch *b, int rc)
{
    if (rc == BW_OK)
        rc = bw__batch_split_fields(b, l->fields);
    if (rc == BW_OK && b->gpu)
        rc = bw__gpu_upload(b->gpu, b->data, b->nbytes, &b->dev, &b->dev_cap, b->err,
                            sizeof(b->err));
    return b->rc = rc;
}

static int fill(bw_loader *l, bw_batch *b)
{
    int rc = fill_start(l, b);
    if (rc != BW_OK)
        return rc;
    rc = l->stream      ? bw__stream_fetch_batch(&l->fctx, l->stream, l->plan, b)
         : l->mixstream ? bw__mixstream_fetch_batch(&l->fctx, l->mixstream, b)
                        : bw__fetch_batch(&l->fctx, b);
    return fill_finish(l, b, rc);
}

/* A fetch thread's batch. A fill cut short by an interrupt (bw_interrupt) is made again once
 * the interrupt is cleared -- the batch is still wanted, and the trainer's bw_loader_next
 * returned BW_INTERRUPTED meanwhile -- unless the loader closes or moves elsewhere first. */
static int fetch_slot(bw_loader *l, bw_batch *b, unsigned gen)
{
    for (;;) {
        int rc = fill(l, b);
        if (rc != BW_INTERRUPTED)
            return rc;
        pthread_mutex_lock(&l->mu);
        while (bw__interrupted() && !l->stopping && gen == l->generation)
            bw__cond_wait_slice(&l->work_cv, &l->mu);
        bool again = !l->stopping && gen == l->generation;
        pthread_mutex_unlock(&l->mu);
        if (!again)
            return rc;
    }
}

/* A fetch thread's steps: their slots (FETCHING), and which of them were handed to the
 * trainer's side (READY) before the rest of their group was read. */
typedef struct fetch_run {
    bw_loader *l;
    unsigned gen;
    size_t nb;
    bw_batch *bs[BW_LOADER_GROUP_MAX];
    size_t slots[BW_LOADER_GROUP_MAX];
    bool handed[BW_LOADER_GROUP_MAX];
} fetch_run;

/* Step j of run f is read (its slot's rc says how): READY for bw_loader_next, or FREE when
 * the loader moved meanwhile; with l->mu held. */
static void slot_done(fetch_run *f, size_t j)
{
    bw_loader *l = f->l;
    l->state[f->slots[j]] = f->gen == l->generation ? SLOT_READY : SLOT_FREE;
    f->handed[j] = true;
}

/* bw__fetch_batches' batch b, complete before the rest of its group: finished (fill_finish)
 * and made READY at once, so that a slow rest does not hold it back (samples_fetch.h). */
static void batch_done(void *arg, bw_batch *b)
{
    fetch_run *f = arg;
    bw_loader *l = f->l;
    fill_finish(l, b, b->rc);
    pthread_mutex_lock(&l->mu);
    for (size_t j = 0; j < f->nb; j++)
        if (f->bs[j] == b)
            slot_done(f, j);
    pthread_cond_broadcast(&l->ready_cv);
    if (f->gen != l->generation)
        pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
}

/* Fills planned batches bs[0..nb) (nb <= l->group) of run f together: fill()'s steps, with
 * their samples in one fetch, each worker asked once for its samples of all of them -- each
 * batch handed over as soon as its samples are in (batch_done) -- (samples_fetch.h). A
 * batch whose read was interrupted is filled again on its own (fetch_slot). */
static void fill_group(fetch_run *f, bw_batch **bs, size_t nb)
{
    bw_loader *l = f->l;
    if (nb == 1) {
        bs[0]->rc = fetch_slot(l, bs[0], f->gen);
        return;
    }
    for (size_t j = 0; j < nb; j++) {
        if (fill_start(l, bs[j]) != BW_OK) { /* the lease may have lapsed: one at a time */
            for (size_t i = 0; i < nb; i++)
                bs[i]->rc = fetch_slot(l, bs[i], f->gen);
            return;
        }
    }
    bw__fetch_batches(&l->fctx, bs, nb, batch_done, f);
    for (size_t j = 0; j < nb; j++) {
        bool handed = false;
        for (size_t i = 0; i < f->nb; i++)
            handed |= f->bs[i] == bs[j] && f->handed[i];
        if (!handed)
            bs[j]->rc = bs[j]->rc == BW_INTERRUPTED ? fetch_slot(l, bs[j], f->gen)
                                                    : fill_finish(l, bs[j], bs[j]->rc);
    }
}

/* How many steps a fetch thread may take now (l->mu held): the next one when its slot is
 * free; with groups (l->group > 1), a whole group of free slots or none -- the steps left
 * when fewer remain -- so that the threads do not split what they could read together. */
static size_t free_ahead(const bw_loader *l)
{
    size_t k = 0;
    for (uint64_t s = l->next_fetch; k < l->group && s < l->end_step; s += l->stride, k++)
        if (l->state[(size_t)(s / l->stride % l->nslots)] != SLOT_FREE)
            return l->group > 1 ? 0 : k;
    return k;
}

/* Planning ahead. A mixture's order is computed position by position (docs/semantics.md,
 * "Mixtures"): ~10 us for a batch of 256, which a fetch thread would spend before its requests
 * go out, on every batch's way. So a thread of its own plans the next nahead steps from
 * next_fetch into a ring (step s in entry (s / stride) % nahead) while the fetch threads wait
 * for their answers, and a fetch thread that takes a step swaps the planned arrays into its
 * slot instead (take_planned). Nobody waits for the planner: a step it has not planned yet is
 * planned by its fetch thread as before, so the batches are the same either way
 * (docs/performance.md, "Planning ahead"). */

/* The ring entry of step s when it holds s, planned at the current position; else NULL. */
static bw__ahead *planned(bw_loader *l, uint64_t s)
{
    bw__ahead *e = &l->ahead[(size_t)(s / l->stride % l->nahead)];
    return e->done && e->step == s && e->gen == l->generation ? e : NULL;
}

/* With l->mu held, for a fetch thread that took step s for b: swaps the step's planned
 * order into b and says its verdict in *rc; false when it was not planned (the fetch thread
 * plans it). Wakes the planner once half its lead is used up. */
static bool take_planned(bw_loader *l, uint64_t s, bw_batch *b, int *rc)
{
    if (!l->has_planner)
        return false;
    bw__ahead *e = planned(l, s);
    if (l->planner_waits && (!e || l->next_fetch - l->planner_slept_at >=
                                       (uint64_t)(l->nahead / 2 ? l->nahead / 2 : 1) * l->stride))
        pthread_cond_signal(&l->plan_cv);
    if (!e)
        return false;
#define SWAP(f)                                                                                    \
    do {                                                                                           \
        __typeof__(b->f) t_ = b->f;                                                                \
        b->f = e->f;                                                                               \
        e->f = t_;                                                                                 \
    } while (0)
    SWAP(indices);
    SWAP(padding);
    SWAP(sources);
    SWAP(passes);
#undef SWAP
    b->count = e->count;
    b->real = e->real;
    *rc = e->rc;
    e->done = false;
    return true;
}

/* The planner: plans the first step of [next_fetch, next_fetch + nahead * stride) not yet
 * planned, one at a time, and waits when all are (or the epoch ends there). It reads l->plan
 * outside the lock, so quiesce() waits for it as for a fetch. */
static void *plan_thread(void *arg)
{
    bw_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->stopping) {
        uint64_t s = l->next_fetch, k = 0;
        while (k < l->nahead && s < l->end_step && planned(l, s)) {
            s += l->stride;
            k++;
        }
        if (l->quiescing || k == l->nahead || s >= l->end_step) {
            l->planner_waits = true;
            l->planner_slept_at = l->next_fetch;
            pthread_cond_wait(&l->plan_cv, &l->mu);
            l->planner_waits = false;
            continue;
        }
        bw__ahead *e = &l->ahead[(size_t)(s / l->stride % l->nahead)];
        unsigned gen = l->generation;
        const bw__plan *plan = l->plan;
        e->done = false;
        l->planning = true;
        pthread_mutex_unlock(&l->mu);
        int rc = order_batch(l, plan, s, e);
        pthread_mutex_lock(&l->mu);
        l->planning = false;
        if (gen == l->generation) {
            e->step = s;
            e->gen = gen;
            e->rc = rc;
            e->done = true;
        } else
            pthread_cond_broadcast(&l->ready_cv); /* a quiesce() may wait for this */
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Everybody who waits for work: the fetch threads and the planner (a new position, stopping). */
static void wake_all(bw_loader *l)
{
    pthread_cond_broadcast(&l->work_cv);
    pthread_cond_broadcast(&l->plan_cv);
}

/* A fetch thread takes the next step whose slot is free, and -- for small batches (l->group)
 * -- the steps after it whose slots are free too, up to l->group: one fetch for them all
 * costs each worker one request instead of one per batch (docs/performance.md, "Per-sample
 * cost, third pass"). Each slot is READY once its batch is. */
static void *fetch_thread(void *arg)
{
    bw_loader *l = arg;
    fetch_run f = {.l = l};
    bw_batch **bs = f.bs;
    size_t *slots = f.slots;
    pthread_mutex_lock(&l->mu);
    while (!l->stopping) {
        if (l->quiescing || free_ahead(l) == 0) {
            pthread_cond_wait(&l->work_cv, &l->mu);
            continue;
        }
        uint64_t steps[BW_LOADER_GROUP_MAX];
        bool ordered[BW_LOADER_GROUP_MAX];
        int verdict[BW_LOADER_GROUP_MAX];
        size_t nb = 0, slot;
        while (nb < l->group && l->next_fetch < l->end_step &&
               l->state[slot = (size_t)(l->next_fetch / l->stride % l->nslots)] == SLOT_FREE) {
            steps[nb] = l->next_fetch;
            slots[nb] = slot;
            bs[nb++] = &l->slots[slot];
            l->next_fetch += l->stride;
            l->state[slot] = SLOT_FETCHING;
            ordered[nb - 1] = take_planned(l, steps[nb - 1], bs[nb - 1], &verdict[nb - 1]);
        }
        unsigned gen = f.gen = l->generation;
        f.nb = nb;
        memset(f.handed, 0, sizeof(f.handed));
        pthread_mutex_unlock(&l->mu);
        size_t planned = 0;
        bw_batch *todo[BW_LOADER_GROUP_MAX];
        for (size_t j = 0; j < nb; j++) {
            bw_batch *b = bs[j];
            int rc = plan_batch(l, steps[j], b, ordered[j] ? &verdict[j] : NULL);
            if (rc != BW_OK) {
                snprintf(b->err, sizeof(b->err), "step %" PRIu64 " of rank %u: no such batch (%s)",
                         steps[j], l->rank, bw_strerror(rc));
                b->rc = rc;
            } else
                todo[planned++] = b;
        }
        if (planned)
            fill_group(&f, todo, planned);
        pthread_mutex_lock(&l->mu);
        for (size_t j = 0; j < nb; j++)
            if (!f.handed[j]) /* a slot handed over may be another step's by now */
                slot_done(&f, j);
        pthread_cond_broadcast(&l->ready_cv);
        if (gen != l->generation) /* discarded: its slots are free for the new position */
            pthread_cond_broadcast(&l->work_cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* The plan of `epoch` of `job` (its world segments: docs/semantics.md, "Elastic resume"):
 * BW_MISMATCH when `rank` is not part of the job's world in that epoch. The one place the
 * loader and bw_loader_rank_steps get an epoch's plan from. */
static int rank_plan(const Batchwire__V1__JobSummary *job, uint32_t rank, uint64_t epoch,
                     bw__plan **out, char *err, size_t errlen)
{
    bw__plan *p = NULL;
    int rc = bw__plan_new_for_job(job->config, job->dataset,
                                  (const Batchwire__V1__WorldSegment *const *)job->history,
                                  job->n_history, epoch, false, &p, err, errlen);
    if (rc != BW_OK)
        return rc;
    uint64_t world = bw__plan_world_size(p);
    if (rank >= world) {
        snprintf(err, errlen,
                 "rank %u is not part of job %s at epoch %" PRIu64 " (world size %" PRIu64
                 " there)",
                 rank, job->name, epoch, world);
        bw__plan_free(p);
        return BW_MISMATCH;
    }
    *out = p;
    return BW_OK;
}

/* position()'s step for "the first step of the epoch for this world" (0 unless the epoch was
 * resized). */
#define EPOCH_START UINT64_MAX

/* Points the pipeline at (epoch, step); call with no fetch running (or before they start). On
 * error nothing has changed. */
static int position(bw_loader *l, uint64_t epoch, uint64_t step)
{
    const Batchwire__V1__JobSummary *job = l->session.summary;
    bw__plan *p = l->plan;
    if (!p || epoch != l->epoch) {
        int rc = rank_plan(job, l->rank, epoch, &p, l->err, sizeof(l->err));
        if (rc != BW_OK)
            return rc;
    }
    uint64_t first = bw__plan_first_step(p), end = bw__plan_end_step(p, l->rank);
    uint32_t world = (uint32_t)bw__plan_world_size(p);
    if (step == EPOCH_START)
        step = first;
    int rc = BW_OK;
    if (step < first)
        rc =
            bw__loader_fail(l, BW_MISMATCH,
                            "step %" PRIu64 " of epoch %" PRIu64 " ran at another world size; this "
                            "rank's world of %u starts at step %" PRIu64 " (use the cursor of the "
                            "elastic resume)",
                            step, epoch, world, first);
    else if (step > end)
        rc = bw__loader_fail(l, BW_OUT_OF_RANGE,
                             "step %" PRIu64 " is past the end of epoch %" PRIu64 " (%" PRIu64
                             " steps for rank %u)",
                             step, epoch, end, l->rank);
    if (rc != BW_OK) {
        if (p != l->plan)
            bw__plan_free(p);
        return rc;
    }
    if (p != l->plan) {
        bw__plan_free(l->plan);
        l->plan = p;
        l->epoch = epoch;
    }
    l->world = world;
    l->end_step = end;
    l->next_fetch = l->next_deliver = step + l->share_index;
    l->after = step;
    l->handed_out = false;
    atomic_store(&l->session.live.epoch, epoch);
    atomic_store(&l->session.live.step, step);
    atomic_store(&l->session.live.epoch_steps, l->end_step);
    for (size_t i = 0; i < l->nslots; i++) /* a hold on a slot's batch keeps it (batch.c) */
        l->state[i] = SLOT_FREE;
    l->held = l->nslots;
    l->generation++;
    return BW_OK;
}

/* After quiesce() for a move that failed: the loader stays where it was, the fetches it
 * discarded made again (the batch the trainer holds stays valid). */
static void stay(bw_loader *l)
{
    for (size_t i = 0; i < l->nslots; i++)
        if (l->state[i] != SLOT_HELD)
            l->state[i] = SLOT_FREE;
    l->next_fetch = l->next_deliver;
}

static uint64_t largest_source(Batchwire__V1__SourceInfo *const *s, size_t n)
{
    uint64_t max = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i]->size_bytes > max)
            max = s[i]->size_bytes;
    return max;
}

/* The largest sample a worker may announce, from the dataset's description: the fixed size
 * when samples have one; else the largest source (a sample lies within one source: a line, a
 * record, a tar member set whose field table is smaller than the tar headers), per field for
 * a dataset of named arrays; never more than the whole dataset. A worker announcing more is
 * refused before anything is allocated for it (docs/security.md, "Worker certificates"). */
static uint64_t largest_sample(const Batchwire__V1__DatasetInfo *d)
{
    if (d->layout && d->layout->sample_bytes)
        return d->layout->sample_bytes;
    uint64_t max = 0;
    if (d->n_fields) {
        for (size_t f = 0; f < d->n_fields; f++) {
            const Batchwire__V1__FieldInfo *fi = d->fields[f];
            uint64_t m = fi->layout && fi->layout->sample_bytes
                             ? fi->layout->sample_bytes
                             : largest_source(fi->sources, fi->n_sources);
            max = m > UINT64_MAX - max ? UINT64_MAX : max + m;
        }
    } else {
        max = largest_source(d->sources, d->n_sources);
    }
    /* A mixture: its largest source's (a sample comes from one of them). */
    for (size_t j = 0; j < d->n_mix_sources; j++) {
        uint64_t m = largest_sample(d->mix_sources[j]);
        max = m > max ? m : max;
    }
    return max && max < d->total_bytes ? max : d->total_bytes;
}

/* The job's transform (its config, as the coordinator holds it): what every request carries,
 * and for a transform of whole samples the fixed size, dtype and shape of every sample's
 * result, which replace the dataset's (docs/transforms.md, "On the workers"). */
static int use_transform(bw_loader *l, const Batchwire__V1__JobSummary *job, char *err,
                         size_t errlen)
{
    const char *text = job->config->transform;
    if (!text || !text[0])
        return BW_OK;
    char why[512];
    bw__tf_spec spec;
    bw__tf_shape shape;
    const Batchwire__V1__SampleLayout *in = job->dataset ? job->dataset->layout : NULL;
    const char *field = job->config->transform_field;
    bool json_tokens = field && field[0]; /* token ops with a field: a jsonl key's arrays */
    if (bw__tf_parse(text, &spec, why, sizeof(why)) != BW_OK ||
        (!bw__tf_is_tokens(&spec) ? bw__tf_output_shape(&spec, &shape, why, sizeof(why))
         : json_tokens
             ? bw__tf_tokens_json_shape(&spec, &shape, why, sizeof(why))
             : bw__tf_tokens_shape(&spec, in ? in->dtype : NULL, in ? in->shape : NULL,
                                   in ? in->n_shape : 0, &shape, why, sizeof(why))) != BW_OK) {
        snprintf(err, errlen, "job '%s' has transform '%s', which this library refuses: %s",
                 job->name, text, why);
        return BW_INVALID_ARGUMENT;
    }
    l->fctx.transform = text;
    l->fctx.transform_field = job->config->transform_field;
    l->fctx.seed = (uint64_t)job->config->sampler->seed;
    l->tf_has = true;
    batchwire__v1__sample_layout__init(&l->tf_layout);
    memcpy(l->tf_descr, shape.descr, sizeof(l->tf_descr));
    l->tf_layout.dtype = l->tf_descr;
    for (int i = 0; i < shape.ndim; i++)
        l->tf_dims[i] = (uint64_t)shape.dims[i];
    l->tf_layout.n_shape = (size_t)shape.ndim;
    l->tf_layout.shape = l->tf_dims;
    l->tf_layout.sample_bytes = shape.bytes;
    if (l->fctx.transform_field && l->fctx.transform_field[0] && l->fctx.field_table) {
        /* Read with fields: the other members pass through, the result replaces one (a
         * jsonl line's values come with a field table instead of the line's syntax). */
        uint64_t m = l->fctx.max_sample_bytes, more = shape.bytes + 8 + 12 * BW_FMT_MAX_FIELDS;
        l->fctx.max_sample_bytes = m > UINT64_MAX - more ? UINT64_MAX : m + more;
        return BW_OK;
    }
    l->tf_whole = true;
    l->fctx.sample_bytes = l->fctx.max_sample_bytes = shape.bytes;
    return BW_OK;
}

static bw__placement *session_placement(void *arg, bool refresh, char *err, size_t errlen)
{
    return bw__session_placement(arg, refresh, err, errlen);
}

/* Whether batches of `per` bytes are of fixed-size samples of map-style sources (of one
 * dataset, or of a mixture of map-style sources), whose bytes are known before they are read:
 * such batches are grouped, and counted in flight, by their bytes. */
static bool fixed_batches(const bw_loader *l, size_t per)
{
    return !l->stream && !l->mixstream && l->fctx.sample_bytes && per;
}

/* The most batches of `per` bytes a group may hold: fixed_batches while a group stays under
 * BW_LOADER_GROUP_BYTES and BW_LOADER_GROUP_MAX batches; else 1. */
static size_t largest_group(const bw_loader *l, size_t per)
{
    if (!fixed_batches(l, per))
        return 1;
    size_t g = BW_LOADER_GROUP_BYTES / per;
    g = g < BW_LOADER_GROUP_MAX ? g : BW_LOADER_GROUP_MAX;
    return g ? g : 1;
}

/* How many batches of `per` bytes a fetch thread reads together (fetch_thread): the largest
 * group, as long as the in-flight slots still make BW_LOADER_GROUPS_IN_FLIGHT groups. Groups
 * cut the CPU a byte costs (fewer requests and wake-ups) but also the requests in flight: on a
 * machine with cores to spare the rate follows those, and two groups of two at prefetch 4 read
 * 256-byte samples at 0.64x the rate of four single batches (docs/performance.md, "Per-sample
 * cost, third pass"). So an explicit prefetch of 4 reads batch by batch, and a deeper prefetch
 * (8 and more, and the default for small batches: auto_depth) groups while keeping four
 * requests in flight. */
static size_t group_size(const bw_loader *l, size_t per)
{
    size_t g = largest_group(l, per), inflight = (l->nslots - 1) / BW_LOADER_GROUPS_IN_FLIGHT;
    g = g < inflight ? g : inflight;
    return g ? g : 1;
}

/* prefetch_batches 0 (the default): as many batches in flight as make BW_LOADER_GROUPS_IN_FLIGHT
 * groups of the largest size (largest_group) -- 128 batches of 64 KiB, 32 of 256 KiB, 8 of
 * 1 MiB; where batches of fixed-size samples are not grouped (more than 1 MiB), as many as hold
 * 8 MiB, from 2 to 4 -- 4 of 2 MiB, 3 of 3 MiB, 2 of 4 MiB and more; and 4 for samples of
 * varying size and streams. At 256-byte samples a prefetch of 32 read 2.1x as fast as 4 for
 * half the CPU a byte, and groups of 32 batches (2 MiB) 1.3x as fast as groups of 8 once
 * placement by blocks made a request's samples cheap ("Per-sample cost, twelfth pass"); at
 * 1 MiB samples a deeper prefetch only costs more (docs/performance.md, "Per-sample
 * cost, sixth pass"), and batches of 4 and 16 MiB read 3-5 % faster two at a time than four,
 * for less CPU and half the memory, while two such batches in flight still cover a network's
 * round trip (4 MiB take 0.34 ms at 100 Gb/s; "Per-sample cost, tenth pass"). */
static size_t auto_depth(const bw_loader *l, size_t per)
{
    size_t g = largest_group(l, per);
    if (g > 1)
        return g * BW_LOADER_GROUPS_IN_FLIGHT;
    if (!fixed_batches(l, per))
        return BW_LOADER_DEPTH_DEFAULT;
    size_t d = (BW_LOADER_INFLIGHT_BYTES + per - 1) / per;
    return d < BW_LOADER_DEPTH_MIN       ? BW_LOADER_DEPTH_MIN
           : d > BW_LOADER_DEPTH_DEFAULT ? BW_LOADER_DEPTH_DEFAULT
                                         : d;
}

/* The planner's ring (l->nahead entries of max_batch samples each) and thread, for a job whose
 * order is computed position by position (a mixture), where l->plan_ahead allows it (cores to
 * spare, or BATCHWIRE_PLAN_AHEAD=on); BW_OK, or BW_NOMEM. Without the thread
 * (pthread_create failed) the fetch threads plan every step themselves. */
static int start_planner(bw_loader *l, size_t max_batch)
{
    if (!l->plan_ahead || !bw__plan_mixture(l->plan))
        return BW_OK;
    size_t n = max_batch ? max_batch : 1;
    if (!(l->ahead = calloc(l->nslots, sizeof(*l->ahead))))
        return BW_NOMEM;
    l->nahead = l->nslots;
    for (size_t i = 0; i < l->nahead; i++) {
        bw__ahead *e = &l->ahead[i];
        e->indices = malloc(n * sizeof(*e->indices));
        e->padding = malloc(n * sizeof(*e->padding));
        e->sources = malloc(n * sizeof(*e->sources));
        e->passes = malloc(n * sizeof(*e->passes));
        if (!e->indices || !e->padding || !e->sources || !e->passes)
            return BW_NOMEM;
    }
    l->has_planner = pthread_create(&l->planner, NULL, plan_thread, l) == 0;
    return BW_OK;
}

static void free_ahead_ring(bw_loader *l)
{
    for (size_t i = 0; l->ahead && i < l->nahead; i++) {
        free(l->ahead[i].indices);
        free(l->ahead[i].padding);
        free(l->ahead[i].sources);
        free(l->ahead[i].passes);
    }
    free(l->ahead);
}

static int start(const bw_loader_options *o, const void *cursor, size_t cursor_len,
                 const bw__join *how, bw_loader **out, char *err, size_t errlen)
{
    *out = NULL;
    bw_loader_options full; /* the caller's struct read by its size (loader.h) */
    if (bw__loader_options_read(o, &full, err, errlen) != BW_OK)
        return BW_INVALID_ARGUMENT;
    o = &full;
    bw__tune_malloc();
    bw_loader *l = calloc(1, sizeof(*l));
    if (!l) {
        snprintf(err, errlen, "out of memory for a loader (%zu bytes)", sizeof(*l));
        return BW_NOMEM;
    }
    pthread_mutex_init(&l->mu, NULL);
    bw__fetch_avoid_init(&l->favoid);
    bw__cond_init_mono(&l->work_cv); /* waited on a slice at a time (common/interrupt.h) */
    bw__cond_init_mono(&l->ready_cv);
    pthread_cond_init(&l->plan_cv, NULL);
    int64_t rank, world;
    bw_arena ca;
    bw__arena_init(&ca, 0);
    Batchwire__V1__Cursor *given = NULL;
    int rc = bw__loader_parse_options(o, &l->jr, &rank, &world, err, errlen);
    if (rc == BW_OK)
        rc = bw__loader_transport(o, &l->data_channel, err, errlen);
    uint64_t compress = 0; /* asked of each data-channel connection (docs/data-channel.md) */
    if (rc == BW_OK)
        rc = bw__loader_compress(o, &compress, err, errlen);
    if (rc == BW_OK)
        rc = bw__loader_plan_ahead(&l->plan_ahead, err, errlen);
    if (rc == BW_OK)
        rc = bw__fields_kind_of(l->jr.format, o->fields != 0, &l->fields, err, errlen);
    if (rc == BW_OK && l->fields == BW_FIELDS_JSON && l->jr.transform_field)
        l->fields = BW_FIELDS_TABLE; /* the worker sends a transformed line's keys in a table */
    /* A malformed cursor or an unusable device is refused before anything is claimed. */
    if (rc == BW_OK && o->device >= 0 &&
        (rc = bw__gpu_check(o->device, l->err, sizeof(l->err))) != BW_OK)
        snprintf(err, errlen, "device cuda:%d: %s", o->device, l->err);
    if (rc == BW_OK && cursor) {
        size_t n = cursor_len == 0 ? strlen(cursor) : cursor_len;
        if ((rc = bw__loader_decode_cursor(l, cursor, n, &ca, &given)) != BW_OK)
            snprintf(err, errlen, "%s", l->err);
    }
    bw__join join = how ? *how : (bw__join){.claim = true};
    l->share_index = o->share_count > 1 ? o->share_index : 0;
    l->stride = o->share_count > 1 ? o->share_count : 1;
    join.claim = l->claimed = l->share_index == 0;
    if (rc == BW_OK)
        rc = bw__session_open(&l->session, o, &l->jr, (uint32_t)rank, (uint32_t)world, &join, err,
                              errlen);
    if (rc != BW_OK) {
        bw__arena_reset(&ca);
        bw_loader_close(l);
        return rc;
    }
    const Batchwire__V1__JobSummary *job = l->session.summary;
    l->rank = (uint32_t)rank;
    l->world = (uint32_t)world;
    l->job_fingerprint = job->fingerprint;
    l->num_samples = job->dataset->length;
    l->session.chopts.compress = compress;
    /* The transports, from the session's settings for workers: the data channel where the
     * loader allows it (its TLS context reads the PEM files now), gRPC always. */
    if ((rc = bw__arrays_check(job->dataset, err, errlen)) != BW_OK ||
        (job->config->sampler->mode == BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ITERABLE &&
         !job->config->mixture && (rc = bw__stream_open(&l->stream, job, err, errlen)) != BW_OK) ||
        (rc = bw__mixstream_open(&l->mixstream, job, err, errlen)) != BW_OK ||
        (l->data_channel && (rc = bw__transport_open(&bw__transport_dchan_ops, &l->session.chopts,
                                                     &l->fctx.preferred, err, errlen)) != BW_OK) ||
        (rc = bw__transport_open(&bw__transport_grpc_ops, &l->session.chopts, &l->fctx.fallback,
                                 err, errlen)) != BW_OK) {
        bw__arena_reset(&ca);
        bw_loader_close(l);
        return rc;
    }
    l->fctx.placement = session_placement;
    l->fctx.placement_arg = &l->session;
    l->fctx.stats = &l->fstats;
    l->fctx.avoid = &l->favoid;
    l->fctx.dataset = job->config->dataset;
    l->fctx.fingerprint = job->dataset->fingerprint;
    if (job->config->mixture && job->dataset->n_mix_sources != job->config->mixture->n_sources) {
        rc = bw__loader_fail(l, BW_PROTOCOL,
                             "job '%s' is a mixture of %zu sources but the coordinator "
                             "described %zu",
                             job->name, job->config->mixture->n_sources,
                             job->dataset->n_mix_sources);
        snprintf(err, errlen, "%s", l->err);
        bw__arena_reset(&ca);
        bw_loader_close(l);
        return rc;
    }
    l->fctx.mixture = job->config->mixture;
    l->fctx.mix_infos = job->dataset->mix_sources;
    l->fctx.sample_bytes = job->dataset->layout ? job->dataset->layout->sample_bytes : 0;
    l->fctx.max_sample_bytes = largest_sample(job->dataset);
    /* Neighbouring samples are placed together (docs/formats.md, "Shards and placement"); a
     * mixture's sources share one placement, sample by sample. */
    l->fctx.block = job->config->mixture
                        ? 1
                        : bw__placement_block(job->dataset->length, job->dataset->total_bytes,
                                              BW_LOADER_NUM_SHARDS);
    l->fctx.max_message_bytes = 4u << 20;
    l->fctx.timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    l->fctx.field_table = l->fields == BW_FIELDS_TABLE;
    if ((rc = use_transform(l, job, err, errlen)) != BW_OK) {
        bw__arena_reset(&ca);
        bw_loader_close(l);
        return rc;
    }

    /* Start where the caller's cursor says, else at the position the options give, else
     * where the coordinator says this rank resumes (its committed cursor, an elastic resume
     * point, or the beginning). */
    uint64_t epoch = 0, step = 0;
    if (!given && o->start_epoch >= 0) {
        epoch = (uint64_t)o->start_epoch;
        step = o->start_step;
    } else if (!given && l->session.resume_cursor.len)
        rc = bw__loader_decode_cursor(l, l->session.resume_cursor.data,
                                      l->session.resume_cursor.len, &ca, &given);
    if (rc == BW_OK && given && (rc = bw__loader_check_cursor(l, given)) == BW_OK) {
        epoch = given->epoch;
        step = given->step;
    }
    if (rc == BW_OK)
        rc = position(l, epoch, step);
    /* A stream resumes where the cursor's offsets say: a seek, not a replay. */
    if (rc == BW_OK && given && l->stream)
        rc = bw__stream_cursor_check(l->stream, l->plan, given, l->rank, l->err, sizeof(l->err));
    if (rc == BW_OK && given && l->mixstream)
        rc = bw__mixstream_cursor_check(l->mixstream, l->plan, given, l->rank, l->err,
                                        sizeof(l->err));
    bw__arena_reset(&ca);
    size_t max_batch = rc == BW_OK ? bw__plan_max_batch(l->plan) : 0;
    if (rc == BW_OK) {
        size_t per = max_batch * (size_t)(l->fctx.sample_bytes ? l->fctx.sample_bytes : 1);
        l->epochs = o->epochs;
        size_t depth = o->prefetch_batches ? o->prefetch_batches : auto_depth(l, per);
        if (per && o->max_buffer_bytes && depth * per > o->max_buffer_bytes)
            depth = o->max_buffer_bytes / per;
        /* One slot is held by the trainer; the rest are in flight. */
        l->nslots = (depth < 1 ? 1 : depth) + 1;
        l->slots = calloc(l->nslots, sizeof(*l->slots));
        l->state = calloc(l->nslots, sizeof(*l->state));
        if (!l->slots || !l->state || bw__holds_new(&l->holds) != BW_OK)
            rc = bw__loader_fail(l, BW_NOMEM, "out of memory for %zu batch slots", l->nslots);
        /* Device delivery: pinned host buffers and a stream per slot, so a slot's copy to
         * the GPU overlaps the other slots' network receives. */
        bool gpu = o->device >= 0;
        size_t fixed = (size_t)l->fctx.sample_bytes * max_batch;
        for (size_t i = 0; rc == BW_OK && i < l->nslots; i++) {
            if ((rc = bw__batch_init(&l->slots[i], max_batch, fixed, gpu)) != BW_OK)
                bw__loader_fail(l, rc, "out of memory for batch slot %zu of %zu (%zu samples)",
                                i + 1, l->nslots, max_batch);
            if (rc == BW_OK && gpu) {
                rc = bw__gpu_stream_new(o->device, &l->slots[i].gpu, l->err, sizeof(l->err));
                l->slots[i].device = o->device;
            }
        }
        l->held = l->nslots;
        l->group = group_size(l, per);
    }
    if (rc != BW_OK) {
        snprintf(err, errlen, "%s", l->err);
        bw_loader_close(l);
        return rc;
    }
    /* nthreads counts the threads started: bw_loader_close joins exactly those. */
    size_t want = (l->nslots - 1) / l->group; /* each has a group in flight */
    if (!(l->threads = calloc(want, sizeof(*l->threads)))) {
        snprintf(err, errlen, "out of memory for %zu fetch threads", want);
        bw_loader_close(l);
        return BW_NOMEM;
    }
    while (l->nthreads < want &&
           pthread_create(&l->threads[l->nthreads], NULL, fetch_thread, l) == 0)
        l->nthreads++;
    if (l->nthreads == 0) {
        snprintf(err, errlen, "cannot start fetch threads");
        bw_loader_close(l);
        return BW_INTERNAL;
    }
    if (start_planner(l, max_batch) != BW_OK) {
        snprintf(err, errlen, "out of memory for %zu planned batches of %zu samples", l->nslots,
                 max_batch);
        bw_loader_close(l);
        return BW_NOMEM;
    }
    BW_INFO("job=%s rank=%u world_size=%u joined samples=%" PRIu64 " epoch=%" PRIu64
            " step=%" PRIu64 " prefetch=%zu group=%zu fetch_threads=%zu",
            job->name, l->rank, l->world, l->num_samples, epoch, step, l->nslots - 1, l->group,
            l->nthreads);
    *out = l;
    return BW_OK;
}

int bw_loader_open(const bw_loader_options *o, bw_loader **out, char *err, size_t errlen)
{
    return start(o, NULL, 0, NULL, out, err, errlen);
}

int bw_loader_open_elastic(const bw_loader_options *o, const void *const *cursors,
                           const size_t *lens, size_t n, bw_loader **out, char *err, size_t errlen)
{
    if (n && (!cursors || !lens)) {
        *out = NULL;
        snprintf(err, errlen, "elastic resume: %zu cursors announced, none given", n);
        return BW_INVALID_ARGUMENT;
    }
    bw__join how = {
        .claim = true, .elastic = true, .cursors = cursors, .lens = lens, .ncursors = n};
    return start(o, NULL, 0, &how, out, err, errlen);
}

int bw_loader_open_at(const bw_loader_options *o, const void *cursor, size_t len, bw_loader **out,
                      char *err, size_t errlen)
{
    if (!cursor) {
        snprintf(err, errlen, "cursor: none given");
        return BW_INVALID_ARGUMENT;
    }
    return start(o, cursor, len, NULL, out, err, errlen);
}

/* The time the trainer waited in bw_loader_next since t0 (bw__mono_ns), into the counters. */
static void waited(bw_loader *l, uint64_t t0)
{
    atomic_fetch_add(&l->session.live.wait_ns, bw__mono_ns() - t0);
}

int bw_loader_next(bw_loader *l, const bw_batch **out)
{
    *out = NULL;
    if (bw__interrupted())
        return bw__loader_interrupted(l, "bw_loader_next");
    uint64_t t0 = bw__mono_ns();
    int lost = bw__session_lease_gate(&l->session, false, l->err, sizeof(l->err));
    if (lost != BW_OK)
        return lost; /* not even a batch already fetched: the rank is another process's */
    pthread_mutex_lock(&l->mu);
    if (l->held < l->nslots) { /* its batch stays valid for a hold on it (batch.c) */
        l->state[l->held] = SLOT_FREE;
        l->held = l->nslots;
        /* One fetch can start -- with groups, once a whole group's slots are free: a thread
         * woken for each slot went back to sleep 31 times in 32 at groups of 32. */
        if (free_ahead(l) > 0)
            pthread_cond_signal(&l->work_cv);
    }
    if (l->next_deliver >= l->end_step) {
        if (l->epochs && l->epoch + 1 >= l->epochs)
            l->session.finished = true; /* said when the loader closes (LeaveJob) */
        pthread_mutex_unlock(&l->mu);
        bw__loader_fail(l, BW_END_OF_EPOCH, "epoch %" PRIu64 " is over after %" PRIu64 " steps",
                        l->epoch, l->end_step);
        return BW_END_OF_EPOCH;
    }
    size_t slot = (size_t)(l->next_deliver / l->stride % l->nslots);
    /* Polled: a lease lost meanwhile ends the wait at once, whatever the fetch is doing. */
    while (l->state[slot] != SLOT_READY && !atomic_load(&l->session.lease_lost) &&
           !bw__interrupted())
        bw__cond_wait_slice(&l->ready_cv, &l->mu);
    if (l->state[slot] != SLOT_READY) { /* the batch stays for a call that repeats this one */
        pthread_mutex_unlock(&l->mu);
        waited(l, t0);
        int rc = bw__session_lease_gate(&l->session, false, l->err, sizeof(l->err));
        return rc != BW_OK ? rc : bw__loader_interrupted(l, "waiting for a batch");
    }
    bw_batch *b = &l->slots[slot];
    if (b->rc != BW_OK) {
        /* Try once more now (placement may have changed); keep the step on failure so the
         * caller can call again. */
        l->state[slot] = SLOT_FETCHING;
        char first[sizeof(b->err)];
        snprintf(first, sizeof(first), "%s", b->err);
        pthread_mutex_unlock(&l->mu);
        int rc = fill(l, b);
        pthread_mutex_lock(&l->mu);
        l->state[slot] = SLOT_READY;
        if (rc != BW_OK) {
            /* Both failures: the first may name what the second cannot (a file that changed,
             * then the dataset's new fingerprint). */
            if (strcmp(first, b->err) != 0)
                snprintf(l->err, sizeof(l->err), "%.600s (before that: %.380s)", b->err, first);
            else
                snprintf(l->err, sizeof(l->err), "%s", b->err);
            pthread_mutex_unlock(&l->mu);
            waited(l, t0);
            return rc;
        }
    }
    /* The hand-out itself: the lease must be proven now, after every wait above. */
    if (!bw__session_lease_fresh(&l->session)) {
        pthread_mutex_unlock(&l->mu);
        int rc = bw__session_lease_gate(&l->session, true, l->err, sizeof(l->err));
        pthread_mutex_lock(&l->mu);
        if (rc != BW_OK) { /* the batch stays in its slot for a call that may repeat this */
            pthread_mutex_unlock(&l->mu);
            waited(l, t0);
            return rc;
        }
    }
    l->state[slot] = SLOT_HELD;
    l->held = slot;
    l->after_before = l->after;
    l->handed_out_before = l->handed_out;
    l->handed_out = true;
    l->next_deliver += l->stride;
    l->after = b->step + 1;
    atomic_store(&l->session.live.step, l->next_deliver);
    pthread_mutex_unlock(&l->mu);
    waited(l, t0);
    atomic_fetch_add(&l->session.live.batches, 1);
    atomic_fetch_add(&l->session.live.samples, b->count);
    atomic_fetch_add(&l->session.live.bytes, b->nbytes);
    *out = b;
    return BW_OK;
}

int bw_loader_unnext(bw_loader *l)
{
    pthread_mutex_lock(&l->mu);
    if (l->held >= l->nslots) {
        pthread_mutex_unlock(&l->mu);
        return bw__loader_fail(
            l, BW_FAILED_PRECONDITION,
            "bw_loader_unnext: no batch to give back (the loader has moved on since "
            "bw_loader_next handed it out)");
    }
    /* The slot keeps its batch (and a hold on it, if any) for the next bw_loader_next. */
    const bw_batch *b = &l->slots[l->held];
    l->state[l->held] = SLOT_READY;
    l->held = l->nslots;
    l->next_deliver -= l->stride;
    l->after = l->after_before;
    l->handed_out = l->handed_out_before;
    atomic_store(&l->session.live.step, l->next_deliver);
    pthread_mutex_unlock(&l->mu);
    atomic_fetch_sub(&l->session.live.batches, 1);
    atomic_fetch_sub(&l->session.live.samples, b->count);
    atomic_fetch_sub(&l->session.live.bytes, b->nbytes);
    return BW_OK;
}

int bw_loader_hold(bw_loader *l, const bw_batch *b, bw_hold **out)
{
    *out = NULL;
    pthread_mutex_lock(&l->mu);
    int rc = BW_FAILED_PRECONDITION;
    if (l->held < l->nslots && b == &l->slots[l->held]) {
        if ((rc = bw__hold_take(l->holds, &l->slots[l->held], out)) != BW_OK)
            bw__loader_fail(l, rc, "bw_loader_hold: out of memory for a hold on the batch");
    } else
        bw__loader_fail(l, rc,
                        "only the batch bw_loader_next returned last can be held (the loader has "
                        "moved on)");
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int bw_loader_get_stats(const bw_loader *l, bw_loader_stats *out, size_t size)
{
    if (!l || !out)
        return BW_INVALID_ARGUMENT;
    bw_loader_stats st;
    memset(&st, 0, sizeof(st));
    /* Counters only: reading them changes nothing (the casts drop const for atomic_load). */
    bw__live *live = (bw__live *)&l->session.live;
    bw__fetch_stats *f = (bw__fetch_stats *)&l->fstats;
    st.batches = atomic_load(&live->batches);
    st.samples = atomic_load(&live->samples);
    st.bytes = atomic_load(&live->bytes);
    st.wait_ns = atomic_load(&live->wait_ns);
    st.samples_received = atomic_load(&f->samples_received);
    st.bytes_received = atomic_load(&f->bytes_received);
    st.requests = atomic_load(&f->requests);
    st.retries = atomic_load(&f->retries);
    st.failovers = atomic_load(&f->failovers);
    st.busy = atomic_load(&f->busy);
    /* A caller built against an older (shorter) struct gets the fields it knows; a newer
     * (longer) one reads 0 in the fields this library does not have. */
    memcpy(out, &st, size < sizeof(st) ? size : sizeof(st));
    if (size > sizeof(st))
        memset((char *)out + sizeof(st), 0, size - sizeof(st));
    return BW_OK;
}

/* Discards the fetches in progress (for a position being left) and waits until none runs,
 * nor the planner (both read l->plan); with l->mu held. While it waits nothing new starts
 * (l->quiescing): work started then would carry the new generation but read the old position
 * -- a planner that did so kept an order of the old position for a step of the new one, and
 * ending with the generation unchanged, woke nobody: this wait hung. The caller moves, then
 * wakes everybody (wake_all). */
static void quiesce(bw_loader *l)
{
    l->generation++;
    l->quiescing = true;
    for (;;) {
        bool busy = l->planning;
        for (size_t i = 0; i < l->nslots; i++)
            busy |= l->state[i] == SLOT_FETCHING;
        if (!busy)
            break;
        pthread_cond_wait(&l->ready_cv, &l->mu);
    }
    l->quiescing = false;
}

int bw_loader_seek(bw_loader *l, const void *cursor, size_t len)
{
    if (bw__interrupted())
        return bw__loader_interrupted(l, "bw_loader_seek");
    if (!cursor)
        return bw__loader_fail(l, BW_INVALID_ARGUMENT, "cursor: none given");
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__Cursor *c = NULL;
    int rc = bw__loader_decode_cursor(l, cursor, len ? len : strlen(cursor), &a, &c);
    if (rc == BW_OK)
        rc = bw__loader_check_cursor(l, c);
    if (rc == BW_OK) {
        pthread_mutex_lock(&l->mu);
        quiesce(l);
        uint64_t epoch = l->epoch, step = l->after;
        rc = position(l, c->epoch, c->step);
        if (rc == BW_OK && l->stream)
            rc = bw__stream_cursor_check(l->stream, l->plan, c, l->rank, l->err, sizeof(l->err));
        if (rc == BW_OK && l->mixstream)
            rc = bw__mixstream_cursor_check(l->mixstream, l->plan, c, l->rank, l->err,
                                            sizeof(l->err));
        if (rc != BW_OK) { /* back where it was, keeping the sentence */
            char why[BW_LOADER_ERRLEN];
            snprintf(why, sizeof(why), "%s", l->err);
            position(l, epoch, step);
            bw__loader_fail(l, rc, "%s", why);
        }
        wake_all(l);
        pthread_mutex_unlock(&l->mu);
    }
    bw__arena_reset(&a);
    return rc;
}

uint64_t bw_loader_epoch_steps(bw_loader *l)
{
    pthread_mutex_lock(&l->mu);
    uint64_t end = l->end_step;
    pthread_mutex_unlock(&l->mu);
    return end;
}

/* Moves to the start of `epoch` (EPOCH_START: its first step for this world), discarding
 * what was fetched for the old position; on error the loader stays where it was. */
static int move_to_epoch(bw_loader *l, uint64_t epoch, const char *what)
{
    if (bw__interrupted())
        return bw__loader_interrupted(l, what);
    pthread_mutex_lock(&l->mu);
    quiesce(l); /* fetches in progress are for the old position */
    int rc = position(l, epoch, EPOCH_START);
    if (rc != BW_OK)
        stay(l);
    wake_all(l);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int bw_loader_next_epoch(bw_loader *l)
{
    return move_to_epoch(l, l->epoch + 1, "bw_loader_next_epoch");
}

int bw_loader_set_epoch(bw_loader *l, uint64_t epoch)
{
    pthread_mutex_lock(&l->mu);
    bool here = epoch == l->epoch && !l->handed_out; /* open, seek or a move put it here */
    pthread_mutex_unlock(&l->mu);
    return here ? BW_OK : move_to_epoch(l, epoch, "bw_loader_set_epoch");
}

uint64_t bw_loader_epoch(bw_loader *l)
{
    pthread_mutex_lock(&l->mu);
    uint64_t e = l->epoch;
    pthread_mutex_unlock(&l->mu);
    return e;
}

int bw_loader_rank_steps(const bw_loader_options *o, uint64_t epoch, uint64_t *steps, char *err,
                         size_t errlen)
{
    *steps = 0;
    if (bw__interrupted()) {
        snprintf(err, errlen, "bw_loader_rank_steps: %s", bw_strerror(BW_INTERRUPTED));
        return BW_INTERRUPTED;
    }
    bw_loader_options full;
    if (bw__loader_options_read(o, &full, err, errlen) != BW_OK)
        return BW_INVALID_ARGUMENT;
    o = &full;
    bw__job_request jr;
    memset(&jr, 0, sizeof(jr));
    int64_t rank, world;
    int rc = bw__loader_parse_options(o, &jr, &rank, &world, err, errlen);
    if (rc != BW_OK) {
        bw__job_request_free(&jr);
        return rc;
    }
    /* The job as bw_loader_open would create or find it, without joining. */
    bw__session s;
    bw__join how = {.claim = false, .describe = true};
    rc = bw__session_open(&s, o, &jr, (uint32_t)rank, (uint32_t)world, &how, err, errlen);
    bw__plan *p = NULL;
    if (rc == BW_OK)
        rc = rank_plan(s.summary, (uint32_t)rank, epoch, &p, err, errlen);
    if (rc == BW_OK && bw__plan_world_size(p) != (uint64_t)world) {
        snprintf(err, errlen,
                 "world size %" PRId64 " does not match job '%s' at epoch %" PRIu64
                 " (it runs at world size %" PRIu64 " there)",
                 world, jr.name, epoch, bw__plan_world_size(p));
        rc = BW_MISMATCH;
    }
    if (rc == BW_OK)
        *steps = bw__plan_end_step(p, (uint32_t)rank);
    bw__plan_free(p);
    bw__session_close(&s);
    bw__job_request_free(&jr);
    return rc;
}

int bw_loader_to_device(bw_loader *l, const bw_batch *b, int device, void *dst, size_t cap)
{
    if (cap < b->nbytes)
        return bw__loader_fail(
            l, BW_TOO_BIG, "the device buffer holds %zu bytes; the batch has %zu", cap, b->nbytes);
    if (!l->copy_stream || l->copy_device != device) {
        bw__gpu_stream_free(l->copy_stream);
        l->copy_stream = NULL;
        int rc = bw__gpu_stream_new(device, &l->copy_stream, l->err, sizeof(l->err));
        if (rc != BW_OK)
            return rc;
        l->copy_device = device;
    }
    return bw__gpu_copy(l->copy_stream, dst, b->data, b->nbytes, l->err, sizeof(l->err));
}

const char *bw_loader_errmsg(const bw_loader *l)
{
    return l ? l->err : "";
}

int64_t bw_loader_rank(const bw_loader *l)
{
    return l->rank;
}

int64_t bw_loader_world_size(const bw_loader *l)
{
    return l->world;
}

int bw_loader_transform_layout(const bw_loader *l, const char **dtype, uint64_t *shape, size_t cap,
                               size_t *ndim)
{
    if (!l->tf_has)
        return BW_FAILED_PRECONDITION;
    *dtype = l->tf_descr;
    for (size_t i = 0; i < l->tf_layout.n_shape && i < cap; i++)
        shape[i] = l->tf_dims[i];
    *ndim = l->tf_layout.n_shape;
    return BW_OK;
}

uint64_t bw_loader_num_samples(const bw_loader *l)
{
    return l->stream ? 0 : l->num_samples; /* a stream has no length (loader.h) */
}

void bw_loader_close(bw_loader *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->stopping = true;
    wake_all(l);
    pthread_cond_broadcast(&l->ready_cv);
    pthread_mutex_unlock(&l->mu);
    if (l->nthreads) /* fetch threads waiting for the lease's confirmation */
        bw__session_cancel(&l->session);
    for (size_t i = 0; i < l->nthreads; i++)
        pthread_join(l->threads[i], NULL);
    if (l->has_planner)
        pthread_join(l->planner, NULL);
    free(l->threads);
    free_ahead_ring(l);
    for (size_t i = 0; l->slots && i < l->nslots; i++)
        bw__batch_free(&l->slots[i]); /* held bytes outlive the loader */
    bw__holds_close(l->holds);
    free(l->slots);
    free(l->state);
    bw__plan_free(l->plan);
    bw__stream_free(l->stream);
    bw__mixstream_free(l->mixstream);
    bw__gpu_stream_free(l->copy_stream);
    bw__transport_close(&l->fctx.preferred); /* no fetch runs: the threads have ended */
    bw__transport_close(&l->fctx.fallback);
    bw__session_close(&l->session);
    bw__job_request_free(&l->jr);
    pthread_mutex_destroy(&l->mu);
    bw__fetch_avoid_destroy(&l->favoid);
    pthread_cond_destroy(&l->work_cv);
    pthread_cond_destroy(&l->ready_cv);
    pthread_cond_destroy(&l->plan_cv);
    free(l);
}
