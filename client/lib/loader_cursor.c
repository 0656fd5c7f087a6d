/* The loader's cursors and commits (loader.h): the cursor of the position handed out last
 * (never one merely prefetched), as bytes or text, decoded and checked when given back,
 * committed with the coordinator; the rank's lease as text; every rank's committed cursor of a
 * job (bw_job_checkpoint). The pipeline that moves the position is loader.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/interrupt.h"
#include "cursor/cursor.h"
#include "loader_state.h"

/* Decodes a cursor (binary, or text when it starts with the text prefix). */
int bw__loader_decode_cursor(bw_loader *l, const uint8_t *data, size_t len, bw_arena *a,
                             Batchwire__V1__Cursor **c)
{
    char why[512];
    if (bw__cursor_decode(data, len, a, c, why, sizeof(why)) != BW_OK)
        return bw__loader_fail(l, BW_CORRUPT, "cursor refused: %s", why);
    return BW_OK;
}

/* Checks a decoded cursor against this job and rank. */
int bw__loader_check_cursor(bw_loader *l, const Batchwire__V1__Cursor *c)
{
    const Batchwire__V1__JobSummary *job = l->session.summary;
    if (strcmp(c->job, job->name) != 0 || c->job_fingerprint != l->job_fingerprint)
        return bw__loader_fail(l, BW_MISMATCH,
                               "cursor refused: it belongs to job '%s' (fingerprint %016" PRIx64
                               "), not to job '%s' (fingerprint %016" PRIx64 ")",
                               c->job, c->job_fingerprint, job->name, l->job_fingerprint);
    if (c->rank != l->rank && c->world_size == l->world)
        return bw__loader_fail(l, BW_MISMATCH,
                               "cursor refused: it is rank %u's, and this loader is rank %u",
                               c->rank, l->rank);
    return BW_OK;
}

int bw_job_checkpoint(const bw_loader_options *o, char *buf, size_t buflen, char *err,
                      size_t errlen)
{
    bw_loader_options full;
    if (bw__loader_options_read(o, &full, err, errlen) != BW_OK)
        return BW_INVALID_ARGUMENT;
    o = &full;
    if (!o->coordinator || !*o->coordinator || !o->job || !*o->job) {
        snprintf(err, errlen, "job checkpoint: the coordinator and the job are required");
        return BW_INVALID_ARGUMENT;
    }
    bw__session s;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCBinaryData *c = NULL;
    size_t n = 0, used = 0;
    int rc = bw__session_open(&s, o, NULL, 0, 1, NULL, err, errlen);
    if (rc == BW_OK)
        rc = bw__session_committed(&s, o->job, &a, &c, &n, err, errlen);
    for (size_t i = 0; rc == BW_OK && i < n; i++) {
        size_t w =
            used < buflen ? bw__cursor_to_text(c[i].data, c[i].len, buf + used, buflen - used) : 0;
        if (w == 0 || used + w + 2 > buflen) {
            snprintf(err, errlen,
                     "job checkpoint: %zu bytes of buffer are not enough for %zu "
                     "cursors",
                     buflen, n);
            rc = BW_TOO_BIG;
            break;
        }
        used += w;
        buf[used++] = '\n';
        buf[used] = '\0';
    }
    bw__arena_reset(&a);
    bw__session_close(&s);
    return rc;
}

/* The cursor after the last batch handed out into *out (malloc'ed); an error with l->err set
 * when a stream offset cannot be found or memory runs out. */
static int current_cursor(bw_loader *l, uint8_t **cur, size_t *len)
{
    Batchwire__V1__Cursor c = BATCHWIRE__V1__CURSOR__INIT;
    pthread_mutex_lock(&l->mu);
    c.version = BW_CURSOR_VERSION;
    c.job = l->session.summary->name;
    c.job_fingerprint = l->job_fingerprint;
    c.rank = l->rank;
    c.world_size = l->world;
    c.epoch = l->epoch;
    c.step = l->after;
    const bw__plan *plan = l->plan; /* replaced only by bw_loader_next_epoch (loader.h) */
    pthread_mutex_unlock(&l->mu);
    uint8_t *out = NULL;
    char why[BW_LOADER_ERRLEN];
    int rc = l->stream ? bw__stream_cursor_fill(&l->fctx, l->stream, plan, l->rank, c.step, &c, why,
                                                sizeof(why))
             : l->mixstream ? bw__mixstream_cursor_fill(&l->fctx, l->mixstream, plan, l->rank,
                                                        c.step, &c, why, sizeof(why))
                            : BW_OK;
    if (rc == BW_OK && !(out = bw__cursor_encode(&c, len)))
        rc = bw__loader_fail(l, BW_NOMEM, "out of memory for the cursor");
    else if (rc != BW_OK)
        bw__loader_fail(l, rc, "the cursor's stream offsets: %s", why);
    free(c.source_offsets);
    free(c.source_records);
    *cur = out;
    return rc;
}

int bw_loader_cursor(bw_loader *l, void *buf, size_t *len)
{
    size_t n;
    uint8_t *c = NULL;
    int rc = current_cursor(l, &c, &n);
    if (rc != BW_OK)
        return rc;
    if (n > *len)
        rc = bw__loader_fail(l, BW_TOO_BIG, "the cursor needs %zu bytes; the buffer has %zu", n,
                             *len);
    else
        memcpy(buf, c, n);
    *len = n;
    free(c);
    return rc;
}

int bw_loader_cursor_text(bw_loader *l, char *buf, size_t buflen)
{
    size_t n;
    uint8_t *c = NULL;
    int rc = current_cursor(l, &c, &n);
    if (rc != BW_OK)
        return rc;
    size_t w = bw__cursor_to_text(c, n, buf, buflen);
    free(c);
    if (w == 0)
        return bw__loader_fail(l, BW_TOO_BIG,
                               "the cursor's text needs %zu bytes; the buffer has %zu",
                               bw__cursor_text_len(n) + 1, buflen);
    return BW_OK;
}

int bw_loader_commit(bw_loader *l)
{
    if (bw__interrupted())
        return bw__loader_interrupted(l, "bw_loader_commit");
    if (!l->claimed)
        return bw__loader_fail(
            l, BW_FAILED_PRECONDITION,
            "share %u of rank %u does not hold the rank: commit from the process "
            "that does (share 0), or save the cursor in your checkpoint",
            l->share_index, l->rank);
    size_t n;
    uint8_t *c = NULL;
    int rc = current_cursor(l, &c, &n);
    if (rc != BW_OK)
        return rc;
    rc = bw__session_commit(&l->session, c, n, l->err, sizeof(l->err));
    free(c);
    return rc;
}

int bw_loader_lease(bw_loader *l, char *buf, size_t buflen)
{
    return bw__session_lease_text(&l->session, buf, buflen, l->err, sizeof(l->err));
}

int bw_loader_lease_state(bw_loader *l, uint64_t *proven_until_ms, int *lost)
{
    /* Atomics only (any thread): nothing is written into l->err, which the loader's own
     * thread owns. confirms is set once at open. */
    if (!l->session.confirms)
        return BW_FAILED_PRECONDITION;
    *proven_until_ms = bw__session_proven_until(&l->session);
    *lost = atomic_load(&l->session.lease_lost) ? 1 : 0;
    return BW_OK;
}
