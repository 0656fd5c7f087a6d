/*
 * The one fetch loop (fetch.h). Each round: take the placement, route every pending item
 * (route.c), group each worker's items into requests (the kind decides which items may share
 * one), start every request at once over the worker's transport, then receive all of them --
 * polling the transports that have a descriptor, so no worker waits behind another, then
 * reading the blocking ones -- each sample straight into its place. After the round each
 * request's outcome decides what follows: a failed worker becomes a suspect and its items go
 * to the next owner, a placement refusal refreshes the table, a busy worker is asked again
 * after its hint, a data channel that cannot be used sends that worker's requests over gRPC,
 * and an error in the data itself ends the fetch. So the trainer sees neither loss,
 * duplication nor reordering.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/interrupt.h"
#include "common/log.h"
#include "common/util.h"
#include "fetch.h"
#include "batch_int.h"
#include "placement/placement.h"

/* Errors after which another worker or a fresher placement may succeed. */
static bool retryable(int rc)
{
    return rc == BW_UNAVAILABLE || rc == BW_TIMEOUT || rc == BW_WRONG_OWNER || rc == BW_CANCELLED ||
           rc == BW_ABORTED || rc == BW_PROTOCOL || rc == BW_INTERNAL || rc == BW_BUSY;
}

void bw__fetch_items_free(bw__fetch_item *items, size_t n)
{
    for (size_t i = 0; items && i < n; i++)
        if (items[i].buf) { /* most samples have none: they landed in the batch */
            free(items[i].buf);
            items[i].buf = NULL;
        }
}

/* Makes `id` a suspect (route.h); false when it already was one, when the list is full or out
 * of memory (it is then simply not routed around: the fetch's deadline still bounds it). */
static bool suspect(bw__suspects *s, const char *id)
{
    if (s->n == BW_MAX_SUSPECTS || bw__suspects_has(s, id))
        return false;
    char *copy = strdup(id);
    if (!copy)
        return false;
    s->ids[s->n++] = copy;
    return true;
}

static void suspects_clear(bw__suspects *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->ids[i]);
    s->n = 0;
}

void bw__fetch_avoid_init(bw__fetch_avoid *a)
{
    memset(a, 0, sizeof(*a));
    pthread_mutex_init(&a->mu, NULL);
}

/* The entry of worker `id` (a->n if none); a->mu held. */
static size_t avoid_find(const bw__fetch_avoid *a, const char *id)
{
    size_t i = 0;
    while (i < a->n && strcmp(a->e[i].id, id) != 0)
        i++;
    return i;
}

static void avoid_drop(bw__fetch_avoid *a, size_t i)
{
    free(a->e[i].id);
    free(a->e[i].address);
    a->e[i] = a->e[--a->n];
}

void bw__fetch_avoid_destroy(bw__fetch_avoid *a)
{
    while (a->n)
        avoid_drop(a, a->n - 1);
    pthread_mutex_destroy(&a->mu);
}

/* A fetch begins: the workers still avoided are its first suspects. */
static void avoid_seed(bw__fetch_avoid *a, bw__suspects *s)
{
    if (!a)
        return;
    uint64_t now = bw__mono_ms();
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->n; i++)
        if (a->e[i].until > now)
            suspect(s, a->e[i].id);
    pthread_mutex_unlock(&a->mu);
}

/* After routing by placement p: a worker p lists at another address than the one that failed
 * is another process -- the next fetches do not avoid it. */
static void avoid_moved(bw__fetch_avoid *a, const bw__placement *p)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    for (size_t i = a->n; i-- > 0;)
        for (size_t w = 0; w < p->nworkers; w++)
            if (strcmp(p->workers[w].id, a->e[i].id) == 0) {
                if (strcmp(p->workers[w].address, a->e[i].address) != 0)
                    avoid_drop(a, i);
                break;
            }
    pthread_mutex_unlock(&a->mu);
}

/* Worker w failed a request (fetch.h, bw__fetch_avoid). */
static void avoid_strike(bw__fetch_avoid *a, const bw__worker_ref *w, uint64_t attempt)
{
    if (!a)
        return;
    uint64_t now = bw__mono_ms();
    pthread_mutex_lock(&a->mu);
    size_t i = avoid_find(a, w->id);
    if (i < a->n && strcmp(a->e[i].address, w->address) != 0) { /* another process */
        avoid_drop(a, i);
        i = a->n;
    }
    if (i == a->n && a->n == BW_FETCH_AVOID_MAX) { /* forget the one avoided the shortest */
        size_t k = 0;
        for (size_t j = 1; j < a->n; j++)
            if (a->e[j].until < a->e[k].until)
                k = j;
        avoid_drop(a, k);
        i = a->n;
    }
    if (i == a->n) {
        char *id = strdup(w->id), *address = strdup(w->address);
        if (!id || !address) { /* out of memory: not remembered, as before this table */
            free(id);
            free(address);
            pthread_mutex_unlock(&a->mu);
            return;
        }
        a->e[i].id = id;
        a->e[i].address = address;
        a->e[i].until = 0;
        a->e[i].strikes = 0;
        a->n++;
    }
    /* Failures of requests started before the worker was avoided are one failure. */
    if (a->e[i].until <= now) {
        unsigned k = a->e[i].strikes < 16 ? a->e[i].strikes : 16;
        uint64_t ms = attempt << k;
        a->e[i].until = now + (ms < BW_FETCH_AVOID_MAX_MS ? ms : BW_FETCH_AVOID_MAX_MS);
        a->e[i].strikes++;
    }
    pthread_mutex_unlock(&a->mu);
}

/* Worker `id` answered a request in full: no longer avoided. */
static void avoid_forget(bw__fetch_avoid *a, const char *id)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    size_t i = avoid_find(a, id);
    if (i < a->n)
        avoid_drop(a, i);
    pthread_mutex_unlock(&a->mu);
}

/* One request of a round: its items, in order, and where the next sample goes. */
typedef struct fetch_req {
    size_t worker;
    bool checked;
    bw__fetch_item **items;
    size_t n, k;          /* items; items complete */
    size_t nsamples;      /* items that expect bytes (probes do not) */
    bw__fetch_dest *dest; /* see bw__fetch_items */
    bw__fetch_stats *stats;
    const char *wid; /* the worker's id (borrowed from the placement) */
    uint64_t heard;  /* when it last sent something (at the latest: receive) */
    uint64_t read;   /* when it was last read */
    const bw__transport *t;
    bw__xfer *x;
    bool ended;
    bw__xres res;
    /* received, added to `stats` once the request ends (judge): atomic adds per sample, on
     * counters every prefetch thread shares, were a tenth of the client's time at 256-byte
     * samples (docs/performance.md, "Client") */
    uint64_t got_bytes, got_samples;
} fetch_req;

/* Where the fixed-size sample at position `first` goes (fetch.h, bw__fetch_dest). */
static uint8_t *fixed_at(const bw__fetch_dest *d, size_t first)
{
    if (d->bases)
        return d->bases[first / d->stride] + (first % d->stride) * d->sample_bytes;
    return (d->base ? d->base : d->b->data) + first * d->sample_bytes;
}

/* The sink: checks each sample against the item due and gives its place. Every allocation a
 * worker's bytes ask for is bounded by the item's max_size. */
static int place(void *arg, uint64_t key, uint64_t size, uint64_t chunk_off, uint64_t len,
                 uint8_t **dest, char *err, size_t errlen)
{
    fetch_req *r = arg;
    bw__fetch_dest *d = r->dest;
    bool fixed = d && d->sample_bytes;
    bw__fetch_item *x = r->k < r->nsamples ? r->items[r->k] : NULL;
    if (!x || key != x->key || chunk_off != x->got || chunk_off > size || len > size - chunk_off ||
        size > x->max_size || (fixed && size != r->dest->sample_bytes) ||
        (x->started && size != x->size)) {
        snprintf(err, errlen,
                 "worker sent sample %" PRIu64 " (%" PRIu64 " bytes at %" PRIu64 " of %" PRIu64
                 ") where sample %" PRIu64 " at %" PRIu64 " (at most %" PRIu64 " bytes) was due",
                 key, len, chunk_off, size, x ? x->key : 0, x ? x->got : 0, x ? x->max_size : 0);
        return BW_PROTOCOL;
    }
    if (!x->started) {
        /* In place when it is the next sample of the batch and fits (an item that failed
         * after taking its place takes it again when its size is the same). */
        if (x->direct && size != x->size)
            x->direct = false; /* bw__fetch_pack moves what follows */
        if (!fixed && !x->direct && d && x->first == d->pos && size > 0 &&
            d->off + size <= d->b->cap) {
            x->direct = true;
            x->off = d->off;
            d->pos++;
            d->off += (size_t)size;
        }
        if (!fixed && !x->direct && size > 0 && !(x->buf = malloc((size_t)size))) {
            snprintf(err, errlen, "out of memory for a sample of %" PRIu64 " bytes", size);
            return BW_NOMEM;
        }
        x->size = size;
        x->started = true;
    }
    *dest = NULL; /* an empty chunk has no place (and no arithmetic on a NULL buffer) */
    /* An item is direct only with a dest (above). */
    // NOLINTBEGIN(clang-analyzer-core.NullDereference)
    if (len)
        *dest = (fixed       ? fixed_at(d, x->first)
                 : x->direct ? d->b->data + x->off
                             : x->buf) +
                chunk_off;
    // NOLINTEND(clang-analyzer-core.NullDereference)
    return BW_OK;
}

/* The bytes of the chunk last placed have landed: the sample counts once all of it has (so
 * a request cut inside a sample loses that sample, which starts over). */
static void arrived(void *arg, uint64_t len)
{
    fetch_req *r = arg;
    bw__fetch_item *x = r->items[r->k]; /* place() found it due */
    x->got += len;
    r->got_bytes += len;
    if (x->started && x->got == x->size) {
        x->done = true;
        r->k++;
        r->got_samples++;
    }
}

/* The sink's peek (transport.h): only fixed-size samples have a place known in advance, the
 * one place() gives them. */
static bool peek(void *arg, size_t ahead, uint64_t *key, uint64_t *size, uint8_t **dest)
{
    const fetch_req *r = arg;
    const bw__fetch_dest *d = r->dest;
    size_t k = r->k + ahead;
    if (!d || !d->sample_bytes || k >= r->nsamples)
        return false;
    const bw__fetch_item *x = r->items[k];
    if (x->got || x->max_size < d->sample_bytes)
        return false;
    *key = x->key;
    *size = d->sample_bytes;
    *dest = fixed_at(d, x->first);
    return true;
}

/* The sink's span (transport.h): the samples due from r->k + ahead whose places follow one
 * another -- in plan order, neighbours in the batch that one worker holds -- checked as place()
 * checks each (the key due, the batch's sample size, not begun, within its bound). */
static size_t span(void *arg, size_t ahead, const uint64_t *keys, size_t n, uint64_t size,
                   uint8_t **dest)
{
    const fetch_req *r = arg;
    const bw__fetch_dest *d = r->dest;
    size_t k0 = r->k + ahead, m = 0;
    if (!d || !d->sample_bytes || size != d->sample_bytes || k0 >= r->nsamples)
        return 0;
    if (n > r->nsamples - k0)
        n = r->nsamples - k0;
    /* back to back: the next positions of one batch (fixed_at) */
    size_t f0 = r->items[k0]->first;
    size_t end = d->bases ? (f0 / d->stride + 1) * d->stride : SIZE_MAX;
    for (; m < n; m++) {
        const bw__fetch_item *x = r->items[k0 + m];
        if (x->key != keys[m] || x->got || x->max_size < size || x->first != f0 + m ||
            x->first >= end)
            break;
    }
    if (m)
        *dest = fixed_at(d, f0);
    return m;
}

/* The sink's landed (transport.h): the k samples span gave count, as place() and arrived()
 * would count each. */
static void landed(void *arg, size_t k, uint64_t size)
{
    fetch_req *r = arg;
    for (size_t i = 0; i < k; i++) {
        bw__fetch_item *x = r->items[r->k + i];
        x->size = size;
        x->started = true;
        x->got = size;
        x->done = true;
    }
    r->k += k;
    r->got_samples += k;
    r->got_bytes += k * size;
}

/* The item a failed request was receiving starts over. */
static void drop_partial(fetch_req *r)
{
    if (r->k >= r->nsamples)
        return;
    bw__fetch_item *x = r->items[r->k];
    if (x->done)
        return;
    free(x->buf);
    x->buf = NULL;
    x->got = 0;
    x->started = false; /* a direct item keeps its place and size for its next try */
}

/* Whether any of worker w's items may share a request, whatever kind->joins says: a mixture's
 * samples of several sources, to a worker whose preferred transport takes requests of several
 * datasets (docs/data-channel.md, "Several datasets in one request"; samples_fetch.c). */
static bool joins_all(const bw__fetch_ctx *ctx, const bw__fetch_kind *kind, const bw__placement *p,
                      size_t w)
{
    const bw__transport *t = &ctx->preferred;
    return ctx->mixture && kind->req_kind == BW_DCHAN_KIND_READ_SAMPLES && t->ops &&
           t->ops->speaks && t->ops->speaks(t->state, &p->workers[w], BW_DCHAN_FEATURE_DATASETS);
}

/* Splits routed pending items into requests: the items of one route, in item order, while
 * the kind lets them join and up to BW_FETCH_MAX_PER_REQUEST. count[] has nroutes + 1
 * entries. Returns the number of requests. */
static size_t make_requests(const bw__fetch_ctx *ctx, const bw__fetch_kind *kind,
                            const bw__placement *p, bw__fetch_item *items, size_t n,
                            const size_t *route, size_t nroutes, size_t *count,
                            bw__fetch_item **slots, fetch_req *reqs)
{
    memset(count, 0, (nroutes + 1) * sizeof(*count));
    for (size_t u = 0; u < n; u++)
        if (!items[u].done)
            count[route[u] + 1]++;
    for (size_t ro = 0; ro < nroutes; ro++)
        count[ro + 1] += count[ro];
    for (size_t u = 0; u < n; u++) /* count[ro]: the next free slot of route ro */
        if (!items[u].done)
            slots[count[route[u]]++] = &items[u];
    size_t m = 0, used = 0;
    fetch_req *cur = NULL;
    for (size_t ro = 0; ro < nroutes; ro++, cur = NULL) {
        bool all = used < count[ro] && (!kind->joins || joins_all(ctx, kind, p, ro / 2));
        for (; used < count[ro]; used++) {
            /* slots[0, count[nroutes - 1]) were all set by the loop above */
            // NOLINTNEXTLINE(clang-analyzer-core.uninitialized.Assign)
            bw__fetch_item *it = slots[used];
            if (!cur || cur->n == BW_FETCH_MAX_PER_REQUEST ||
                (!all && !kind->joins(cur->items[cur->n - 1], it))) {
                cur = &reqs[m++];
                memset(cur, 0, sizeof(*cur));
                cur->worker = ro / 2;
                cur->checked = ro % 2 == 0;
                cur->items = slots + used;
            }
            cur->items[cur->n++] = it;
            cur->nsamples += !it->probe;
        }
    }
    return m;
}

/* One attempt's time (fetch.h). */
static uint64_t attempt_ms(const bw__fetch_ctx *ctx)
{
    if (ctx->attempt_ms > 0)
        return (uint64_t)ctx->attempt_ms;
    uint64_t a = (uint64_t)(ctx->timeout_ms > 0 ? ctx->timeout_ms : 0) / 3;
    return a < 1000 ? 1000 : a;
}

/* Starts request r on the worker's transport (the data channel where usable, else gRPC),
 * with one attempt's time at most, and never past the fetch's deadline. */
static void start(const bw__fetch_ctx *ctx, const bw__fetch_kind *kind, const bw__placement *p,
                  fetch_req *r, uint64_t deadline)
{
    uint64_t now = bw__mono_ms(), once = attempt_ms(ctx);
    int left = now < deadline ? (int)(deadline - now < once ? deadline - now : once) : 1;
    r->wid = p->workers[r->worker].id;
    const bw__worker_ref *wr = &p->workers[r->worker];
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *msg = NULL;
    int rc = kind->message(kind->kctx, r->items, r->n, p, r->checked, &a, &msg);
    if (rc != BW_OK) {
        snprintf(r->res.err, sizeof(r->res.err), "out of memory for a request of %zu samples",
                 r->n);
        r->res.rc = rc;
        r->ended = true;
        bw__arena_reset(&a);
        return;
    }
    if (ctx->stats)
        atomic_fetch_add(&ctx->stats->requests, 1);
    bw__read_req rq = {kind->req_kind, msg};
    const bw__transport *ts[2] = {&ctx->preferred, &ctx->fallback};
    for (size_t i = 0; i < 2; i++) {
        const bw__transport *t = ts[i];
        if (!t->ops || !t->ops->usable(t->state, wr))
            continue;
        memset(&r->res, 0, sizeof(r->res));
        r->t = t;
        if (t->ops->start(t->state, wr, &rq, left, &r->x, &r->res) == BW_OK || !r->res.fallback)
            break;
        r->t = NULL;
    }
    if (!r->x) {
        r->ended = true;
        if (r->res.rc == BW_OK) {
            r->res.rc = BW_UNAVAILABLE;
            snprintf(r->res.err, sizeof(r->res.err), "worker %s: no transport reaches it", wr->id);
        }
    }
    bw__arena_reset(&a); /* both transports have sent or copied the message */
}

/* Telling dest's owner of completed samples (fetch.h, bw__fetch_dest.progress): from
 * `after` on, after each read that completed some, and at `after` itself when some completed
 * before it (`owed`). */
typedef struct progress {
    const bw__fetch_dest *dest;
    uint64_t after;
    bool owed;
} progress;

static void progressed(progress *pg, bool completed, uint64_t now)
{
    pg->owed |= completed;
    if (pg->owed && now >= pg->after) {
        pg->owed = false;
        pg->dest->progress(pg->dest->progress_arg);
    }
}

/* Receives every started request to its end, serving whichever has data (pf and who hold n
 * entries), telling the owner of completed samples when it asked (pg: NULL when it did not).
 * A request silent for `attempt` ms ends with BW_TIMEOUT: its worker is treated as failed,
 * and a retry elsewhere still fits in the batch's deadline. */
static void receive(fetch_req *reqs, size_t n, progress *pg, uint64_t deadline, uint64_t attempt,
                    struct pollfd *pf, size_t *who)
{
    uint64_t start = bw__mono_ms();
    /* A transport may keep its descriptor quiet until many bytes are in (transport.h,
     * `received`): a request quiet for a quarter of an attempt is read all the same, and bytes
     * found then count as sent when it was last read -- so a worker sending slowly stays alive
     * and one gone quiet is given up one attempt after its last byte, as without the mark. */
    uint64_t probe = attempt / 4 ? attempt / 4 : 1;
    for (size_t i = 0; i < n; i++)
        reqs[i].heard = reqs[i].read = start;
    for (;;) {
        size_t m = 0;
        uint64_t now = bw__mono_ms(), wake = deadline;
        for (size_t i = 0; i < n; i++) {
            fetch_req *r = &reqs[i];
            if (r->ended || r->t->ops->fd(r->x) < 0)
                continue;
            if (now >= r->heard + attempt || now >= deadline) {
                r->ended = true;
                r->res.rc = BW_TIMEOUT;
                snprintf(r->res.err, sizeof(r->res.err), "worker %s sent nothing for %llu ms",
                         r->wid, (unsigned long long)(now - r->heard));
                continue;
            }
            uint64_t until =
                r->heard + attempt < r->read + probe ? r->heard + attempt : r->read + probe;
            wake = until < wake ? until : wake;
            pf[m] = (struct pollfd){r->t->ops->fd(r->x), POLLIN, 0};
            who[m++] = i;
        }
        if (m == 0)
            break;
        if (pg && pg->owed && pg->after < wake)
            wake = pg->after;
        int ready = bw__poll(pf, m, (int)(wake > now ? wake - now : 0));
        if (bw__interrupted())
            break; /* the requests not ended end below, interrupted */
        if (ready < 0 && errno != EINTR)
            break;
        now = bw__mono_ms();
        bool completed = false;
        for (size_t j = 0; j < m; j++) {
            fetch_req *r = &reqs[who[j]];
            bool woke = ready > 0 && pf[j].revents;
            if (!woke && now < r->read + probe)
                continue;
            bw__sink sink = {place, arrived, r, peek, span, landed};
            uint64_t before = r->res.received;
            size_t k = r->k;
            r->ended = r->t->ops->recv(r->x, &sink, &r->res);
            completed |= r->k != k;
            if (woke)
                r->heard = now;
            else if (r->ended || r->res.received != before)
                r->heard = r->read; /* they may have come right after that read */
            r->read = now;
        }
        if (pg)
            progressed(pg, completed, now);
    }
    bool completed = false;
    for (size_t i = 0; i < n; i++) {
        fetch_req *r = &reqs[i];
        if (r->ended)
            continue;
        if (bw__interrupted()) {
            r->ended = true;
            r->res.rc = BW_INTERRUPTED;
            snprintf(r->res.err, sizeof(r->res.err), "worker %s: %s", r->wid,
                     bw_strerror(BW_INTERRUPTED));
        } else if (r->t->ops->fd(r->x) < 0) { /* blocking transports: read to the end now */
            bw__sink sink = {place, arrived, r, peek, span, landed};
            size_t k = r->k;
            r->ended = r->t->ops->recv(r->x, &sink, &r->res);
            completed |= r->k != k;
        } else {
            r->ended = true;
            r->res.rc = BW_TIMEOUT;
            snprintf(r->res.err, sizeof(r->res.err), "no answer before the deadline");
        }
    }
    if (pg)
        progressed(pg, completed, bw__mono_ms());
}

/* What the outcome of a request means for the rest of the fetch. */
typedef struct verdict {
    int fatal;        /* an error no other worker will mend (the data itself is bad) */
    bool refresh;     /* ask for a fresh placement */
    bool no_wait;     /* retry at once (a transport changed) */
    uint32_t wait_ms; /* a busy worker's hint */
    char err[BW_XFER_ERRLEN];
    char fatal_err[BW_XFER_ERRLEN]; /* the message of `fatal` (e.g. the changed file's name) */
} verdict;

static void judge(const bw__fetch_ctx *ctx, const bw__placement *p, fetch_req *r,
                  bw__suspects *suspects, verdict *v)
{
    const char *wid = p->workers[r->worker].id;
    int rc = r->res.rc;
    if (r->stats) {
        atomic_fetch_add(&r->stats->bytes_received, r->got_bytes);
        atomic_fetch_add(&r->stats->samples_received, r->got_samples);
    }
    if (rc == BW_OK && r->k != r->nsamples) {
        rc = BW_PROTOCOL;
        snprintf(r->res.err, sizeof(r->res.err),
                 "worker %s ended a request after %zu of %zu samples", wid, r->k, r->nsamples);
    }
    if (rc == BW_OK) {
        for (size_t i = r->nsamples; i < r->n; i++)
            r->items[i]->done = true; /* probes */
        avoid_forget(ctx->avoid, wid);
        return;
    }
    drop_partial(r);
    snprintf(v->err, sizeof(v->err), "%s", r->res.err);
    if (r->stats && (rc == BW_BUSY || r->res.fallback || retryable(rc)))
        atomic_fetch_add(&r->stats->retries, 1);
    if (r->res.fallback) {
        v->no_wait = true;
        return;
    }
    if (rc == BW_BUSY) {
        if (r->stats)
            atomic_fetch_add(&r->stats->busy, 1);
        if (r->res.retry_after_ms > v->wait_ms)
            v->wait_ms = r->res.retry_after_ms;
        if (!v->wait_ms)
            v->wait_ms = 50;
        return;
    }
    if (!retryable(rc)) {
        if (!v->fatal) {
            v->fatal = rc;
            snprintf(v->fatal_err, sizeof(v->fatal_err), "%s", r->res.err);
        }
        return;
    }
    v->refresh = true;
    if (rc != BW_WRONG_OWNER)
        avoid_strike(ctx->avoid, &p->workers[r->worker], attempt_ms(ctx));
    if (rc != BW_WRONG_OWNER && suspect(suspects, wid)) {
        if (r->stats)
            atomic_fetch_add(&r->stats->failovers, 1);
        BW_INFO("worker=%s failed while serving a batch; reading its samples elsewhere err=%s", wid,
                r->res.err);
    }
}

int bw__fetch_items(const bw__fetch_ctx *ctx, const bw__fetch_kind *kind, bw__fetch_item *items,
                    size_t n, bw__fetch_dest *dest, char *err, size_t errlen)
{
    bw__suspects suspects = {{NULL}, 0};
    bool refresh = false;
    uint64_t start_ms = bw__mono_ms(), deadline = start_ms + (uint64_t)ctx->timeout_ms;
    uint64_t backoff = 20;
    char last[BW_XFER_ERRLEN] = "";
    uint32_t *shards = malloc((n ? n : 1) * sizeof(*shards));
    size_t *route = malloc((n ? n : 1) * sizeof(*route));
    bw__fetch_item **slots = malloc((n ? n : 1) * sizeof(*slots));
    fetch_req *reqs = malloc((n ? n : 1) * sizeof(*reqs));
    struct pollfd *pf = malloc((n ? n : 1) * sizeof(*pf));
    size_t *who = malloc((n ? n : 1) * sizeof(*who)), *count = NULL;
    int rc = shards && route && slots && reqs && pf && who ? BW_OK : BW_NOMEM;
    if (rc != BW_OK)
        snprintf(err, errlen, "out of memory for a fetch of %zu samples", n);
    size_t remaining = 0;
    for (size_t u = 0; u < n; u++)
        remaining += !items[u].done;
    progress pg = {dest, start_ms + BW_FETCH_PROGRESS_AFTER_MS, false};
    avoid_seed(ctx->avoid, &suspects);
    while (rc == BW_OK && remaining > 0) {
        if (bw__interrupted()) {
            rc = BW_INTERRUPTED;
            snprintf(err, errlen, "%zu of %zu samples not fetched yet: %s", remaining, n,
                     bw_strerror(rc));
            break;
        }
        bw__placement *p = ctx->placement(ctx->placement_arg, refresh, last, sizeof(last));
        refresh = false;
        verdict v = {0};
        if (!p || p->nworkers == 0) {
            if (!last[0] || p)
                snprintf(last, sizeof(last), "no storage worker is alive");
            bw__placement_put(p); /* an empty table routes nothing */
            v.refresh = true;
        } else {
            size_t m = 0;
            for (size_t u = 0; u < n; u++)
                if (!items[u].done)
                    shards[m++] = kind->shard ? kind->shard(kind->kctx, &items[u], p->num_shards)
                                              : bw__placement_shard(items[u].key, ctx->block,
                                                                    p->num_shards, BW_SHARD_MODULO);
            /* route[] by pending item, then spread over all items for make_requests */
            int rrc = bw__route_items(p, shards, m, &suspects, route);
            avoid_moved(ctx->avoid, p);
            static const char every[] = "every storage worker failed: ";
            if (rrc == BW_UNAVAILABLE && strncmp(last, every, sizeof(every) - 1) != 0) {
                char why[BW_XFER_ERRLEN];
                snprintf(why, sizeof(why), "%s", last[0] ? last : "no worker left");
                snprintf(last, sizeof(last), "%s%.900s", every, why);
            }
            /* Every worker failed: more likely this trainer's network than all of them at
             * once. Forget the suspects and, after the backoff, try them all again -- a
             * healed partition then costs one backoff, not the batch's whole time. */
            if (rrc == BW_UNAVAILABLE)
                suspects_clear(&suspects);
            if (rrc == BW_NOMEM)
                snprintf(last, sizeof(last), "out of memory routing %zu samples", m);
            size_t *c = rrc == BW_OK ? realloc(count, (p->nworkers * 2 + 1) * sizeof(*c)) : NULL;
            if (rrc == BW_OK && !c) {
                rrc = BW_NOMEM;
                snprintf(last, sizeof(last), "out of memory routing %zu samples", m);
            }
            if (c)
                count = c;
            if (rrc == BW_OK) {
                for (size_t u = n, j = m; u-- > 0;)
                    route[u] = items[u].done ? SIZE_MAX : route[--j];
                size_t nreqs = make_requests(ctx, kind, p, items, n, route, p->nworkers * 2, count,
                                             slots, reqs);
                for (size_t i = 0; i < nreqs; i++) {
                    reqs[i].dest = dest;
                    reqs[i].stats = ctx->stats;
                    start(ctx, kind, p, &reqs[i], deadline);
                }
                receive(reqs, nreqs, dest && dest->progress ? &pg : NULL, deadline, attempt_ms(ctx),
                        pf, who);
                for (size_t i = 0; i < nreqs; i++) {
                    fetch_req *r = &reqs[i];
                    if (r->t)
                        r->t->ops->finish(r->x);
                    r->x = NULL;
                    if (kind->finished)
                        kind->finished(kind->kctx, r->items, r->k, &r->res);
                    judge(ctx, p, r, &suspects, &v);
                }
                if (v.err[0])
                    snprintf(last, sizeof(last), "%s", v.err);
            } else {
                v.refresh = true;
            }
            bw__placement_put(p); /* the round's requests have ended */
        }
        if (v.fatal) {
            rc = v.fatal;
            snprintf(err, errlen, "%s", v.fatal_err);
            break;
        }
        size_t before = remaining;
        remaining = 0;
        for (size_t u = 0; u < n; u++)
            remaining += !items[u].done;
        if (remaining == 0)
            break;
        uint64_t now = bw__mono_ms();
        if (now >= deadline) {
            rc = BW_UNAVAILABLE;
            snprintf(err, errlen, "%zu of %zu samples could not be fetched in %d ms: %.900s",
                     remaining, n, ctx->timeout_ms, last);
            break;
        }
        refresh |= v.refresh;
        uint64_t pause = v.wait_ms;
        if (remaining == before && !v.no_wait && !pause) {
            pause = backoff;
            backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
            refresh = true;
        }
        if (pause > deadline - now)
            pause = deadline - now;
        if (pause)
            bw__sleep_ms(pause); /* an interrupt ends it: the loop's next turn says so */
    }
    suspects_clear(&suspects);
    free(shards);
    free(route);
    free(slots);
    free(reqs);
    free(pf);
    free(who);
    free(count);
    return rc;
}

int bw__fetch_pack(bw_batch *b, bw__fetch_item *items, const size_t *uid,
                   const bw__fetch_dest *dest)
{
    uint64_t fixed = dest ? dest->sample_bytes : 0;
    if (fixed) { /* every sample has that size (place and span take no other), at its place */
        size_t sz = (size_t)fixed;
        int rc = bw__batch_reserve(b, b->count * sz);
        if (rc != BW_OK)
            return rc;
        for (size_t i = 0; i < b->count; i++) {
            size_t f = items[uid ? uid[i] : i].first;
            b->offsets[i] = i * sz;
            b->sizes[i] = sz;
            if (f != i) /* a sample repeated (padding): it was fetched once, to its first place */
                memcpy(b->data + i * sz, b->data + f * sz, sz);
        }
        b->nbytes = b->count * sz;
        return BW_OK;
    }
    size_t total = 0;
    for (size_t i = 0; i < b->count; i++)
        total += (size_t)items[uid ? uid[i] : i].size;
    /* Samples placed in the batch buffer stay where they are while they form its prefix in
     * batch order; one whose size changed on a retry breaks it: what followed it moves out
     * first (rare: a worker answered a retry with another size). */
    size_t off = 0, i = 0;
    for (; i < b->count; i++) {
        bw__fetch_item *x = &items[uid ? uid[i] : i];
        if (!x->direct || x->first != i || x->off != off)
            break;
        off += (size_t)x->size;
    }
    for (size_t j = i; j < b->count; j++) {
        bw__fetch_item *x = &items[uid ? uid[j] : j];
        if (!x->direct || x->first != j)
            continue;
        x->direct = false;
        if (x->size && !(x->buf = malloc((size_t)x->size)))
            return BW_NOMEM;
        if (x->size)
            memcpy(x->buf, b->data + x->off, (size_t)x->size);
    }
    int rc = bw__batch_reserve(b, total);
    if (rc != BW_OK)
        return rc;
    off = 0;
    for (i = 0; i < b->count; i++) {
        const bw__fetch_item *x = &items[uid ? uid[i] : i];
        b->offsets[i] = off;
        b->sizes[i] = (size_t)x->size;
        if (x->size) { /* empty samples have no bytes (and maybe no buffer) */
            const uint8_t *from = x->first != i ? b->data + b->offsets[x->first]
                                  : x->direct   ? b->data + x->off
                                                : x->buf;
            if (from != b->data + off)
                memcpy(b->data + off, from, (size_t)x->size);
        }
        off += (size_t)x->size;
    }
    b->nbytes = total;
    return BW_OK;
}
