/* The loader's state (struct bw_loader), shared by its two halves: loader.c, the pipeline that
 * fetches ahead and hands batches out in plan order, and loader_cursor.c, cursors and commits
 * of the position handed out. Nothing here is part of the public API. */
#ifndef BW_CLIENT_LOADER_STATE_H
#define BW_CLIENT_LOADER_STATE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "batch_int.h"
#include "batchwire/loader.h"
#include "common/arena.h"
#include "fetch.h"
#include "jobs.pb-c.h"
#include "jobs/plan.h"
#include "loader_limits.h"
#include "options_int.h"
#include "samples_fetch.h"
#include "session.h"
#include "mix_stream.h"
#include "stream_fetch.h"

enum slot_state { SLOT_FREE, SLOT_FETCHING, SLOT_READY, SLOT_HELD };

/* A batch's order planned ahead of the fetch threads (loader.c, plan_thread): the step's
 * indices, padding, sources and passes as bw__plan_mix_batch gave them, with its verdict. */
typedef struct bw__ahead {
    uint64_t step;
    unsigned gen; /* l->generation it was planned in */
    bool done;    /* planned, and not taken yet */
    int rc;
    size_t count, real;
    uint64_t *indices;
    uint8_t *padding;
    uint32_t *sources;
    uint64_t *passes;
} bw__ahead;

struct bw_loader {
    bw__session session;
    bw__job_request jr;
    bw__fetch_ctx fctx;
    bw__fetch_stats fstats; /* what the fetch loop counts (bw_loader_get_stats) */
    bw__fetch_avoid favoid; /* workers the fetch loop found failed lately */
    bool data_channel;      /* fetch over the workers' data channels where they offer one */
    uint32_t rank;
    uint64_t job_fingerprint;
    uint64_t num_samples;
    bw__stream_ctx *stream;   /* iterable jobs: the stream's sources and offsets; else NULL */
    bw__mixstream *mixstream; /* a mixture with stream sources: theirs; else NULL */
    /* A job with a transform (tf_has): the layout of every sample's result; on whole samples
     * (tf_whole: no transform_field, or no fields) it replaces the dataset's
     * (docs/transforms.md, "On the workers") */
    bool tf_has, tf_whole;
    Batchwire__V1__SampleLayout tf_layout;
    uint64_t tf_dims[3];
    char tf_descr[16];

    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* fetch threads: a slot freed, new steps, stopping */
    pthread_cond_t ready_cv; /* a fetch ended (its slot READY or discarded) */
    bw__plan *plan;          /* the current epoch's; replaced only while no fetch runs */
    uint32_t world;          /* world size at next_deliver */
    uint64_t epoch, end_step;
    uint64_t epochs; /* bw_loader_options.epochs: 0 unknown */
    uint64_t next_fetch, next_deliver;
    /* A share of the rank (bw_loader_options.share_index/share_count): steps first + index,
     * + stride, ...; slot of step s: (s / stride) % nslots. Else index 0, stride 1. */
    uint32_t share_index, stride;
    bool claimed;                /* this loader holds the rank's lease (not a share other than 0) */
    enum bw__fields_kind fields; /* bw_batch_fields: how samples' fields are found */
    uint64_t after;  /* the cursor's step: one past the batch handed out last, or the start */
    bool handed_out; /* a batch was handed out since the last position() */
    /* Before the batch handed out last (bw_loader_unnext puts them back). */
    uint64_t after_before;
    bool handed_out_before;
    size_t nslots;
    /* Batches a fetch thread reads together, at most (loader.c, fetch_thread): small
     * batches of fixed-size samples share their requests; else 1. */
    size_t group;
    bw_batch *slots;
    enum slot_state *state;
    size_t held;      /* slot handed out last, or nslots */
    bw__holds *holds; /* bw_loader_hold's, shared with the holds themselves */
    unsigned generation;
    /* A move is waiting in quiesce() for the work on the old position to end: the fetch
     * threads and the planner start nothing new until it is done (and wake_all) */
    bool quiescing;
    size_t nthreads;
    pthread_t *threads;
    bool stopping;
    /* Mixtures: a thread plans the order of the next nahead steps ahead of the fetch threads,
     * which take it instead of computing it on their batch's way (loader.c, plan_thread). */
    bool plan_ahead; /* bw__loader_plan_ahead: start the planner where it applies */
    bw__ahead *ahead;
    size_t nahead;
    bool has_planner, planning, planner_waits;
    uint64_t planner_slept_at; /* next_fetch when the planner last began to wait */
    pthread_cond_t plan_cv;    /* the planner: steps were taken, the position moved, stopping */
    pthread_t planner;
    struct bw__gpu_stream *copy_stream; /* bw_loader_to_device's */
    int copy_device;
    char err[BW_LOADER_ERRLEN];
};

/* Sets the loader's error sentence (bw_loader_errmsg) and returns rc. */
static inline int bw__loader_fail(bw_loader *l, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline int bw__loader_fail(bw_loader *l, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->err, sizeof(l->err), fmt, ap);
    va_end(ap);
    return rc;
}

/* BW_INTERRUPTED with its sentence (bw_interrupt, batchwire.h), saying what was interrupted. */
static inline int bw__loader_interrupted(bw_loader *l, const char *what)
{
    return bw__loader_fail(l, BW_INTERRUPTED, "%s: %s", what, bw_strerror(BW_INTERRUPTED));
}

/* ---- loader_cursor.c ---- */

/* Decodes a cursor (binary, or text when it starts with the text prefix) into arena a:
 * BW_CORRUPT with l->err saying why. */
int bw__loader_decode_cursor(bw_loader *l, const uint8_t *data, size_t len, bw_arena *a,
                             Batchwire__V1__Cursor **c);
/* Checks a decoded cursor against this job and rank: BW_MISMATCH with l->err. */
int bw__loader_check_cursor(bw_loader *l, const Batchwire__V1__Cursor *c);

#endif
