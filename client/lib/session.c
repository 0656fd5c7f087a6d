/* The loader's side of the coordinator, and only that: create or join the job, hold the
 * rank's lease with heartbeats (and the read grant each answer renews), fetch placement,
 * commit cursors. Connections to workers are the transports' (transport.h); the bearer token
 * goes to the coordinator only, and the transports take the grant from here
 * (docs/security.md, "Read grants"). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "auth/auth.h"
#include "auth/grant.h"
#include "common/errors.h"
#include "common/interrupt.h"
#include "common/log.h"
#include "common/util.h"
#include "cursor/cursor.h"
#include "session.h"

enum {
    LEAVE_TIMEOUT_MS = 2000,
    /* LeaveJob while interrupted (bw_loader_close after bw_interrupt): best effort, brief. */
    LEAVE_INTERRUPTED_MS = 200,
    COORD_WARN_EVERY_MS = 10000, /* while a call to the coordinator is retried */
    /* ... and when one try has had no answer for this long: 1.5 s, so that the first WARN
     * line about a silent coordinator comes within 2 s of the start (docs/client.md). */
    COORD_SILENT_WARN_MS = 1500,
};

static int fetch_placement(bw__session *s, bw__placement **out, char *err, size_t errlen)
{
    Batchwire__V1__PlacementRequest req = BATCHWIRE__V1__PLACEMENT_REQUEST__INIT;
    req.num_shards = BW_LOADER_NUM_SHARDS;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp = NULL;
    int rc = bw__rpc_call(s->coord, BW_METHOD(BW_M_PLACEMENT_GET), &req.base, &a, &resp,
                          s->timeout_ms, err, errlen);
    if (rc == BW_OK) {
        const Batchwire__V1__PlacementTable *t = (const void *)resp;
        if (t->n_owners != BW_LOADER_NUM_SHARDS && t->n_workers > 0) {
            snprintf(err, errlen, "placement table lists %zu owners for %u shards", t->n_owners,
                     BW_LOADER_NUM_SHARDS);
            rc = BW_PROTOCOL;
        } else {
            bw__placement *p = calloc(1, sizeof(*p));
            bool ok = p &&
                      (p->workers = calloc(t->n_workers ? t->n_workers : 1, sizeof(*p->workers))) &&
                      (p->owners = calloc(BW_LOADER_NUM_SHARDS, sizeof(*p->owners)));
            if (p) {
                atomic_init(&p->refs, 1);
                p->version = t->version;
                p->num_shards = BW_LOADER_NUM_SHARDS;
            }
            for (size_t i = 0; ok && i < t->n_workers; i++, p->nworkers++) {
                p->workers[i].id = strdup(t->workers[i]->id);
                p->workers[i].address = strdup(t->workers[i]->address);
                p->workers[i].data_address =
                    strdup(t->workers[i]->data_address ? t->workers[i]->data_address : "");
                ok = p->workers[i].id && p->workers[i].address && p->workers[i].data_address;
            }
            if (!ok) {
                snprintf(err, errlen, "out of memory for a placement table of %zu workers",
                         t->n_workers);
                if (p && !p->workers)
                    free(p);
                else
                    bw__placement_put(p);
                bw__arena_reset(&a);
                return BW_NOMEM;
            }
            for (size_t i = 0; i < t->n_owners; i++) {
                if (t->owners[i] >= t->n_workers) {
                    snprintf(err, errlen, "placement table: owner %u of shard %zu is not a worker",
                             t->owners[i], i);
                    bw__placement_put(p);
                    bw__arena_reset(&a);
                    return BW_PROTOCOL;
                }
                p->owners[i] = t->owners[i];
            }
            *out = p;
        }
    }
    bw__arena_reset(&a);
    return rc;
}

bw__placement *bw__session_placement(bw__session *s, bool refresh, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->mu);
    bw__placement *cur = s->placement;
    bool stale = refresh || !cur || atomic_load(&s->seen_version) > cur->version;
    pthread_mutex_unlock(&s->mu);
    if (stale) {
        bw__placement *fresh = NULL;
        if (fetch_placement(s, &fresh, err, errlen) == BW_OK) {
            pthread_mutex_lock(&s->mu);
            if (!s->placement || fresh->version >= s->placement->version) {
                bw__placement_put(s->placement);
                s->placement = fresh;
                BW_DEBUG("job=%s rank=%u placement version %llu: %zu workers", s->job, s->rank,
                         (unsigned long long)fresh->version, fresh->nworkers);
            } else {
                bw__placement_put(fresh);
            }
            pthread_mutex_unlock(&s->mu);
        }
    }
    pthread_mutex_lock(&s->mu);
    cur = s->placement;
    if (cur)
        atomic_fetch_add(&cur->refs, 1);
    pthread_mutex_unlock(&s->mu);
    return cur;
}

/* Coordinator answers worth asking again after a pause: it is unreachable or restarting
 * (BW_UNAVAILABLE; BW_CANCELLED from a coordinator shutting down with the call in flight; a
 * call's deadline). Anything else -- BW_LEASE_LOST above all -- is the answer. */
static bool transient(int rc)
{
    return rc == BW_UNAVAILABLE || rc == BW_TIMEOUT || rc == BW_CANCELLED;
}

/* A call to the coordinator being retried: what its WARN lines say. */
typedef struct coord_try {
    bw__session *s;
    const bw_rpc_method *m;
    const char *target;
    uint64_t t0, limit, warned; /* warned: when the last WARN line went out (0: none yet) */
    unsigned tries;
} coord_try;

/* The coordinator does not answer: a WARN line, unless one went out less than
 * COORD_WARN_EVERY_MS ago. `why`: the last error, or that the try under way has no answer. */
static void coord_warn(coord_try *c, const char *why)
{
    uint64_t now = bw__mono_ms(), spent = now - c->t0;
    if (c->warned && now - c->warned < COORD_WARN_EVERY_MS)
        return;
    c->warned = now;
    uint64_t left = c->limit > spent ? c->limit - spent : 0;
    BW_WARN("job=%s rank=%u the coordinator at %s does not answer; retrying for %.1f s more "
            "address=%s tries=%u left_ms=%llu err=%s",
            c->s->job, c->s->rank, c->target, (double)left / 1000.0, c->target, c->tries,
            (unsigned long long)left, why);
}

/* A try without an answer for COORD_SILENT_WARN_MS (a coordinator that accepted the
 * connection and is silent, a partition dropping packets): say so before its deadline. */
static void coord_waiting(void *arg, uint64_t waited_ms)
{
    coord_try *c = arg;
    if (waited_ms < COORD_SILENT_WARN_MS || c->limit == 0)
        return;
    char why[256];
    snprintf(why, sizeof(why), "%s to %s: no answer yet after %.1f s (deadline %d ms)", c->m->name,
             c->target, (double)waited_ms / 1000.0, c->s->timeout_ms);
    coord_warn(c, why);
}

/* ---- the session stream (docs/architecture.md, "The session stream") ----
 *
 * A commit or a heartbeat costs the coordinator a message on an open stream instead of a
 * unary call of its own (docs/performance.md, "Coordinator"). Each request on it is the
 * unary call it carries -- same request, same answer, same error codes and sentences -- so
 * the callers below cannot tell the two apart: the stream is a cheaper transport, not a
 * second protocol. */

/* One request on the session stream: BW_OK or the coordinator's error for it (as the unary
 * call would give), a failure of the stream (then closed: the next request reopens it), or
 * BW_UNIMPLEMENTED from a coordinator without Jobs.Session. Under stream_mu. */
static int stream_call(bw__session *s, const bw_rpc_method *m, const ProtobufCMessage *req,
                       bw_arena *a, ProtobufCMessage **resp, bw_rpc_waiting_fn waiting, void *arg,
                       char *err, size_t errlen)
{
    *resp = NULL;
    int rc = BW_OK;
    bool via_cchan = s->cchan.address && !atomic_load(&s->no_cchan);
    if (via_cchan && !bw__cchan_client_connected(&s->cchan)) {
        rc = bw__cchan_client_connect(&s->cchan, s->timeout_ms, err, errlen);
        if (rc == BW_INTERRUPTED)
            return rc;
        if (rc != BW_OK) {
            /* Closed by a firewall, or refused: the stream serves the same requests. */
            atomic_store(&s->no_cchan, true);
            BW_INFO("job=%s rank=%u the coordinator's commit channel at %s cannot be used; "
                    "commits and heartbeats go on the Jobs.Session stream err=%s",
                    s->job, s->rank, s->cchan.address, err);
            via_cchan = false;
            rc = BW_OK;
        }
    }
    if (!via_cchan && !s->stream)
        rc = bw__rpc_bidi_open(s->coord, BW_METHOD(BW_M_JOBS_SESSION), &s->stream, err, errlen);
    if (rc != BW_OK)
        return rc;
    Batchwire__V1__SessionRequest sreq = BATCHWIRE__V1__SESSION_REQUEST__INIT;
    sreq.id = ++s->stream_next_id;
    bool commit = m == BW_METHOD(BW_M_JOBS_COMMIT_CURSOR);
    if (commit) {
        sreq.op_case = BATCHWIRE__V1__SESSION_REQUEST__OP_COMMIT;
        sreq.commit = (Batchwire__V1__CommitCursorRequest *)req;
    } else {
        sreq.op_case = BATCHWIRE__V1__SESSION_REQUEST__OP_HEARTBEAT;
        sreq.heartbeat = (Batchwire__V1__LeaseHeartbeatRequest *)req;
    }
    ProtobufCMessage *out = NULL;
    const char *target = bw__rpc_channel_target(s->coord);
    if (via_cchan) {
        Batchwire__V1__SessionResponse *sr = NULL;
        char why[BW_LOADER_ERRLEN];
        rc = bw__cchan_client_call(&s->cchan, &sreq, a, &sr, s->timeout_ms, why, sizeof(why));
        if (rc == BW_OK && !sr) { /* not reached (the call's contract); for the analyzer */
            snprintf(why, sizeof(why), "no answer");
            rc = BW_PROTOCOL;
        }
        out = sr ? &sr->base : NULL;
        if (rc != BW_OK) /* the connection is closed: the next try connects again */
            snprintf(err, errlen, "%s to %s: %s", m->name, s->cchan.address, why);
    } else
        rc = bw__rpc_bidi_call(s->stream, m, &sreq.base, a, &out, s->timeout_ms, waiting, arg, err,
                               errlen);
    const Batchwire__V1__SessionResponse *r = (const void *)out;
    if (rc == BW_OK && r->id != sreq.id) {
        snprintf(err, errlen, "%s to %s: the session answered request %llu with %llu", m->name,
                 target, (unsigned long long)sreq.id, (unsigned long long)r->id);
        rc = BW_PROTOCOL;
    } else if (rc == BW_OK && r->error_code && r->error_code[0]) {
        /* The request's own error: worded as the unary call's (call_error, core/rpc). */
        int code = bw__err_from_name(r->error_code);
        rc = code > 0 || code == BW_OK ? BW_PROTOCOL : code;
        snprintf(err, errlen, "%s to %s: %s: %s", m->name, target,
                 bw__grpc_status_name(bw__err_to_grpc(rc)),
                 r->error_message && r->error_message[0] ? r->error_message : bw_strerror(rc));
        return rc; /* the stream stays open */
    } else if (rc == BW_OK) {
        *resp = commit ? &r->commit->base : &r->heartbeat->base;
        if (!*resp ||
            r->result_case != (commit ? BATCHWIRE__V1__SESSION_RESPONSE__RESULT_COMMIT
                                      : BATCHWIRE__V1__SESSION_RESPONSE__RESULT_HEARTBEAT)) {
            *resp = NULL;
            snprintf(err, errlen, "%s to %s: the session stream's answer carries no %s", m->name,
                     target, m->response->name);
            rc = BW_PROTOCOL;
        }
    }
    if (rc != BW_OK && !via_cchan) {
        bw__rpc_bidi_close(s->stream);
        s->stream = NULL;
    }
    return rc;
}

/* One try of a commit or a heartbeat: on the session stream when it is free, else (or with a
 * coordinator that has no stream) as a unary call. */
static int coord_once(bw__session *s, const bw_rpc_method *m, const ProtobufCMessage *req,
                      bw_arena *a, ProtobufCMessage **resp, bw_rpc_waiting_fn waiting, void *arg,
                      char *err, size_t errlen)
{
    bool streamed =
        m == BW_METHOD(BW_M_JOBS_COMMIT_CURSOR) || m == BW_METHOD(BW_M_JOBS_LEASE_HEARTBEAT);
    if (streamed && !atomic_load(&s->no_stream) && pthread_mutex_trylock(&s->stream_mu) == 0) {
        int rc = stream_call(s, m, req, a, resp, waiting, arg, err, errlen);
        if (rc == BW_UNIMPLEMENTED) {
            atomic_store(&s->no_stream, true);
            BW_DEBUG("job=%s rank=%u the coordinator has no Jobs.Session: unary calls from now "
                     "on err=%s",
                     s->job, s->rank, err);
        }
        pthread_mutex_unlock(&s->stream_mu);
        if (rc != BW_UNIMPLEMENTED)
            return rc;
    }
    return bw__rpc_call_watched(s->coord, m, req, a, resp, s->timeout_ms, waiting, arg, err,
                                errlen);
}

/* A call to the coordinator, tried again with jittered exponential backoff (50 ms doubling
 * to 1 s, each pause drawn from its upper half) while the answer says the coordinator is
 * unreachable or restarting (transient()), until s->retry_ms has passed. While it retries it
 * says so: a WARN line at the first failure (or once a try has had no answer for
 * COORD_SILENT_WARN_MS) naming the address, the error and the time left, then one every
 * COORD_WARN_EVERY_MS. A host name that does not resolve fails at once until
 * the coordinator has answered this session (then it is an outage: a Kubernetes headless
 * Service's name disappears while its pod restarts). An interrupt (bw_interrupt) ends the
 * call and the pauses within a slice. Every call in the loop is safe to repeat: GetOrCreateJob
 * and JoinJob by the same holder are idempotent, a cursor committed twice is the same
 * cursor. docs/client.md, "Retries and silence". */
static int coord_call(bw__session *s, const bw_rpc_method *m, const ProtobufCMessage *req,
                      bw_arena *a, ProtobufCMessage **resp, char *err, size_t errlen)
{
    coord_try c = {s,
                   m,
                   bw__rpc_channel_target(s->coord),
                   bw__mono_ms(),
                   (uint64_t)(s->retry_ms > 0 ? s->retry_ms : 0),
                   0,
                   0};
    uint64_t backoff = 50;
    unsigned seed = (unsigned)(c.t0 ^ (uint64_t)getpid() ^ s->rank);
    for (c.tries = 1;; c.tries++) {
        int rc = coord_once(s, m, req, a, resp, coord_waiting, &c, err, errlen);
        if (!transient(rc) && rc != BW_INTERRUPTED)
            atomic_store(&s->reached, true); /* an answer */
        if (transient(rc) && !atomic_load(&s->reached) && bw__rpc_unknown_host(err)) {
            size_t n = strlen(err);
            snprintf(err + n, errlen > n ? errlen - n : 0,
                     " (the host name of the coordinator address %s does not resolve: check the "
                     "address; not retried)",
                     c.target);
            return rc;
        }
        uint64_t pause = backoff / 2 + (uint64_t)rand_r(&seed) % (backoff / 2 + 1);
        uint64_t now = bw__mono_ms();
        if (!transient(rc) || now - c.t0 + pause > c.limit) {
            if (rc != BW_OK && c.tries > 1) {
                size_t n = strlen(err);
                snprintf(err + n, errlen > n ? errlen - n : 0, " (after %u tries in %llu ms)",
                         c.tries, (unsigned long long)(now - c.t0));
            }
            return rc;
        }
        coord_warn(&c, err);
        /* Returns early once reconnected; a coordinator that answers UNAVAILABLE itself (its
         * disk is full, it is shutting down) leaves the channel connected: then wait the whole
         * pause, or this loop would spin. */
        uint64_t w0 = bw__mono_ms();
        if (bw__rpc_channel_wait(s->coord, (int)pause) && bw__mono_ms() - w0 < 2)
            bw__sleep_ms(pause);
        if (bw__interrupted()) {
            char last[BW_LOADER_ERRLEN];
            snprintf(last, sizeof(last), "%s", err);
            snprintf(err, errlen,
                     "%s to %s: %s while retrying (the coordinator did not answer for %llu ms: "
                     "%.700s)",
                     m->name, c.target, bw_strerror(BW_INTERRUPTED),
                     (unsigned long long)(bw__mono_ms() - c.t0), last);
            return BW_INTERRUPTED;
        }
        backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
    }
}

/* The lease was refused (another process holds the rank now): from here on the session hands
 * out and commits nothing, and the heartbeat thread stops. Whichever thread heard it first
 * says so; every wait for the lease wakes. */
static void fence(bw__session *s, const char *why)
{
    pthread_mutex_lock(&s->mu);
    if (!atomic_load(&s->lease_lost)) {
        BW_ERROR("job=%s rank=%u lost its lease err=%s", s->job, s->rank, why);
        snprintf(s->lost_err, sizeof(s->lost_err), "%s", why);
        atomic_store(&s->lease_lost, true);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* The coordinator renewed the lease on a request sent at `sent` (monotonic ms): it is ours
 * until at least sent + lease_ms by the coordinator's clock. lease_ms 0: unchanged. */
static void vouch(bw__session *s, uint64_t sent, uint32_t lease_ms)
{
    if (lease_ms)
        atomic_store(&s->lease_ms, lease_ms);
    uint64_t v = atomic_load(&s->vouched_ms);
    while (sent > v && !atomic_compare_exchange_weak(&s->vouched_ms, &v, sent))
        ;
}

/* ---- the read grant (docs/security.md, "Read grants") ---- */

enum {
    PROOF_CACHE_MAX = 4096
}; /* workers whose proofs a grant keeps; more are computed each time */

typedef struct proof_slot {
    char *id; /* NULL: empty */
    uint8_t proof[BW_GRANT_PROOF_BYTES];
} proof_slot;

struct bw__grant {
    size_t claims_len;
    uint8_t claims[BW_GRANT_CLAIMS_MAX];
    uint8_t secret[BW_GRANT_SECRET_BYTES];
    /* Each worker's proof, computed once per grant: open addressing by worker id, at most
     * half full; cap is 0 or a power of two. */
    size_t nproofs, cap;
    proof_slot *proofs;
};

/* Frees g, wiping its secret and proofs first. NULL is a no-op. */
static void grant_free(bw__grant *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->cap; i++)
        free(g->proofs[i].id);
    if (g->proofs)
        OPENSSL_cleanse(g->proofs, g->cap * sizeof(*g->proofs));
    free(g->proofs);
    OPENSSL_cleanse(g, sizeof(*g));
    free(g);
}

static size_t id_hash(const char *id)
{
    uint64_t h = 14695981039346656037ULL; /* FNV-1a */
    for (; *id; id++)
        h = (h ^ (uint8_t)*id) * 1099511628211ULL;
    return (size_t)h;
}

/* The slot holding id's proof, or the empty slot where it belongs; g->cap > 0. */
static proof_slot *proof_slot_of(bw__grant *g, const char *id)
{
    size_t i = id_hash(id) & (g->cap - 1);
    while (g->proofs[i].id && strcmp(g->proofs[i].id, id) != 0)
        i = (i + 1) & (g->cap - 1);
    return &g->proofs[i];
}

/* Doubles the proof table (16 slots at first). False when it is at its largest or memory is
 * short: the proof is then computed for each request, which is slower but as correct. */
static bool proofs_grow(bw__grant *g)
{
    size_t cap = g->cap ? g->cap * 2 : 16, ocap = g->cap;
    proof_slot *old = g->proofs,
               *fresh = cap <= 2 * PROOF_CACHE_MAX ? calloc(cap, sizeof(*fresh)) : NULL;
    if (!fresh)
        return false;
    g->proofs = fresh;
    g->cap = cap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].id)
            *proof_slot_of(g, old[i].id) = old[i];
    if (old)
        OPENSSL_cleanse(old, ocap * sizeof(*old));
    free(old);
    return true;
}

bool bw__session_grant(bw__session *s, const char *worker_id, bw__grant_copy *out)
{
    pthread_mutex_lock(&s->mu);
    bw__grant *g = s->grant;
    if (!g) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    out->claims_len = g->claims_len;
    memcpy(out->claims, g->claims, g->claims_len);
    proof_slot *slot = g->cap ? proof_slot_of(g, worker_id) : NULL;
    if (slot && slot->id) {
        memcpy(out->proof, slot->proof, sizeof(out->proof));
    } else {
        bw__grant_proof(g->secret, worker_id, out->proof);
        if ((g->nproofs + 1) * 2 <= g->cap || proofs_grow(g)) {
            slot = proof_slot_of(g, worker_id);
            if ((slot->id = strdup(worker_id)) != NULL) {
                memcpy(slot->proof, out->proof, sizeof(slot->proof));
                g->nproofs++;
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    return true;
}

static bool grant_src_get(void *ctx, const char *worker_id, bw__grant_copy *out)
{
    return bw__session_grant(ctx, worker_id, out);
}

int bw__session_set_grant(bw__session *s, const char *what, ProtobufCBinaryData *claims,
                          ProtobufCBinaryData *secret, char *err, size_t errlen)
{
    if (claims->len == 0 && secret->len == 0)
        return BW_OK;
    bw__grant *g = NULL;
    int rc = BW_OK;
    if (claims->len == 0 || claims->len > BW_GRANT_CLAIMS_MAX ||
        secret->len != BW_GRANT_SECRET_BYTES) {
        snprintf(err, errlen,
                 "%s: the coordinator's read grant is malformed (claims of %zu bytes, expected 1 "
                 "to %d; a secret of %zu bytes, expected %d)",
                 what, claims->len, BW_GRANT_CLAIMS_MAX, secret->len, BW_GRANT_SECRET_BYTES);
        rc = BW_PROTOCOL;
    } else if (!(g = calloc(1, sizeof(*g)))) {
        snprintf(err, errlen, "%s: out of memory for the lease's read grant", what);
        rc = BW_NOMEM;
    } else {
        g->claims_len = claims->len;
        memcpy(g->claims, claims->data, claims->len);
        memcpy(g->secret, secret->data, sizeof(g->secret));
        pthread_mutex_lock(&s->mu);
        bw__grant *old = s->grant;
        s->grant = g;
        s->granted_ms = bw__mono_ms();
        pthread_mutex_unlock(&s->mu);
        grant_free(old);
    }
    if (secret->len)
        OPENSSL_cleanse(secret->data, secret->len);
    return rc;
}

/* One lease heartbeat (with this rank's live counters when this session claimed the rank; a
 * share only confirms the lease). On BW_OK the lease is vouched for from when the request was
 * sent, and the placement version it announces is noted; on BW_LEASE_LOST the session is
 * fenced. `retry`: through coord_call (then vouched from before the first try). Any thread. */
static int heartbeat_once(bw__session *s, bool retry, char *err, size_t errlen)
{
    Batchwire__V1__LeaseHeartbeatRequest req = BATCHWIRE__V1__LEASE_HEARTBEAT_REQUEST__INIT;
    req.job = s->job;
    req.rank = s->rank;
    req.lease_id = s->lease_id;
    req.lease_id_hi = s->lease_id_hi;
    Batchwire__V1__RankLive live = BATCHWIRE__V1__RANK_LIVE__INIT;
    live.epoch = atomic_load(&s->live.epoch);
    live.step = atomic_load(&s->live.step);
    live.epoch_steps = atomic_load(&s->live.epoch_steps);
    live.batches = atomic_load(&s->live.batches);
    live.samples = atomic_load(&s->live.samples);
    live.bytes = atomic_load(&s->live.bytes);
    live.wait_ms = atomic_load(&s->live.wait_ns) / 1000000;
    req.live = s->claimed ? &live : NULL;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp = NULL;
    uint64_t sent = bw__mono_ms();
    int rc = retry ? coord_call(s, BW_METHOD(BW_M_JOBS_LEASE_HEARTBEAT), &req.base, &a, &resp, err,
                                errlen)
                   : coord_once(s, BW_METHOD(BW_M_JOBS_LEASE_HEARTBEAT), &req.base, &a, &resp, NULL,
                                NULL, err, errlen);
    Batchwire__V1__LeaseHeartbeatResponse *r = (void *)resp;
    if (rc == BW_OK)
        rc = bw__session_set_grant(s, "LeaseHeartbeat", &r->grant_claims, &r->grant_secret, err,
                                   errlen);
    if (rc == BW_OK) {
        uint64_t seen = atomic_load(&s->seen_version);
        while (r->placement_version > seen &&
               !atomic_compare_exchange_weak(&s->seen_version, &seen, r->placement_version))
            ;
        vouch(s, sent, r->lease_ms);
    }
    bw__arena_reset(&a);
    if (rc == BW_LEASE_LOST)
        fence(s, err);
    return rc;
}

/* Renews the lease every heartbeat interval after the newest renewal's sending, so that it is
 * confirmed at once when that moment has passed unnoticed (the process was paused); after a
 * failure, again after a backoff (50 ms doubling to the interval) instead. Each heartbeat's
 * outcome is announced on cv for bw__session_lease_gate. Ends when the session closes or the
 * lease is lost. */
static void *lease_thread(void *arg)
{
    bw__session *s = arg;
    char err[BW_LOADER_ERRLEN];
    uint64_t backoff = 0, failed_at = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping && !atomic_load(&s->lease_lost)) {
        uint64_t due =
            backoff ? failed_at + backoff : atomic_load(&s->vouched_ms) + s->heartbeat_ms;
        /* A commit renews the lease but not the read grant (its answer carries none): with a
         * grant, a heartbeat is also due an interval after the grant came, however often the
         * trainer commits, or the workers refuse its reads once the grant ends
         * (docs/security.md, "Read grants"). */
        if (!backoff && s->grant && s->granted_ms + s->heartbeat_ms < due)
            due = s->granted_ms + s->heartbeat_ms;
        uint64_t now = bw__mono_ms();
        if (now < due) {
            struct timespec until = bw__mono_deadline((int)(due - now));
            pthread_cond_timedwait(&s->cv, &s->mu, &until);
            continue;
        }
        s->hb_begun++;
        pthread_mutex_unlock(&s->mu);
        int rc = heartbeat_once(s, false, err, sizeof(err));
        pthread_mutex_lock(&s->mu);
        s->hb_rc = rc;
        s->hb_ended++;
        if (rc == BW_OK) {
            backoff = 0;
            s->hb_err[0] = '\0';
        } else if (rc != BW_LEASE_LOST) {
            /* Keep going: prefetched batches carry the trainer while the lease is fresh. */
            if (strcmp(err, s->hb_err) != 0 && rc != BW_INTERRUPTED)
                BW_WARN("job=%s rank=%u lease heartbeat failed (will retry) err=%s", s->job,
                        s->rank, err);
            snprintf(s->hb_err, sizeof(s->hb_err), "%s", err);
            failed_at = bw__mono_ms();
            /* At most a second apart (or the heartbeat interval, if shorter): after a heal
             * the lease is confirmed again within about a second (docs/operating.md,
             * "Networks"), not a heartbeat interval later. */
            uint64_t cap = s->heartbeat_ms < 1000 ? s->heartbeat_ms : 1000;
            backoff = backoff ? backoff * 2 : 50;
            if (backoff > cap)
                backoff = cap;
        }
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Whether process `pid` of this host has exited: no such process, or one that has exited and
 * is not reaped yet (a zombie, state Z or X in /proc/PID/stat -- an orphan stays one until
 * init reaps it, which takes seconds on some hosts). A process that cannot be probed counts
 * as alive. */
static bool pid_exited(uint32_t pid)
{
    if (kill((pid_t)pid, 0) != 0)
        return errno == ESRCH;
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT; /* reaped since */
    size_t n = fread(line, 1, sizeof(line) - 1, f);
    fclose(f);
    line[n] = '\0';
    /* "PID (COMM) STATE ...": COMM may hold spaces and parentheses; the last ')' ends it. */
    const char *p = strrchr(line, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* The pid of the process on this host that holds `rank` of `job` and has exited, or 0: a
 * restarted trainer may then reclaim the rank at once (JoinJobRequest.reclaim_pid). A holder
 * that is alive, on another host, or whose pid cannot be probed is not reclaimed: the
 * refusal (a real duplicate, e.g. LOCAL_RANK for RANK) stands. */
static uint32_t exited_holder(bw__session *s, const char *job, const char *host)
{
    Batchwire__V1__GetJobRequest req = BATCHWIRE__V1__GET_JOB_REQUEST__INIT;
    req.name = (char *)job;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp = NULL;
    char err[BW_LOADER_ERRLEN];
    uint32_t pid = 0;
    if (bw__rpc_call(s->coord, BW_METHOD(BW_M_JOBS_GET), &req.base, &a, &resp, s->timeout_ms, err,
                     sizeof(err)) == BW_OK) {
        const Batchwire__V1__GetJobResponse *r = (const void *)resp;
        for (size_t i = 0; i < r->n_ranks; i++) {
            const Batchwire__V1__RankProgress *p = r->ranks[i];
            if (p->rank != s->rank || !p->holder || !p->holder->host ||
                strcmp(p->holder->host, host) != 0 || p->holder->pid == 0 ||
                p->holder->pid == s->holder_pid)
                continue;
            if (pid_exited(p->holder->pid))
                pid = p->holder->pid;
        }
    }
    bw__arena_reset(&a);
    return pid;
}

int bw__session_committed(bw__session *s, const char *job, bw_arena *a, ProtobufCBinaryData **out,
                          size_t *n, char *err, size_t errlen)
{
    Batchwire__V1__GetJobRequest req = BATCHWIRE__V1__GET_JOB_REQUEST__INIT;
    req.name = (char *)job;
    ProtobufCMessage *resp = NULL;
    int rc = coord_call(s, BW_METHOD(BW_M_JOBS_GET), &req.base, a, &resp, err, errlen);
    if (rc != BW_OK)
        return rc;
    const Batchwire__V1__GetJobResponse *r = (const void *)resp;
    uint32_t world = r->job ? r->job->world_size : 0;
    ProtobufCBinaryData *c = world ? bw__arena_alloc(a, world * sizeof(*c)) : NULL;
    if (!c || r->n_ranks != world) {
        snprintf(err, errlen, "GetJob of job '%s': %s", job,
                 world ? "out of memory or ranks missing from the answer"
                       : "the answer lacks the job");
        return world && !c ? BW_NOMEM : BW_PROTOCOL;
    }
    for (uint32_t i = 0; i < world; i++) {
        const Batchwire__V1__RankProgress *p = r->ranks[i];
        if (p->rank != i || !p->committed || p->cursor.len == 0) {
            snprintf(err, errlen,
                     "rank %u of job '%s' (world size %u) has %s: a job-level checkpoint needs "
                     "every rank's cursor, committed at the same step (bw_loader_commit on "
                     "every rank), or give the cursors yourself",
                     i, job, world,
                     p->rank != i ? "no entry in the answer" : "committed no cursor");
            return BW_FAILED_PRECONDITION;
        }
        c[i] = p->cursor;
    }
    *out = c;
    *n = world;
    return BW_OK;
}

/* Before joining, an elastic resume (docs/semantics.md, "Elastic resume"): the job continues
 * at this loader's world size from one consistent set of cursors -- the caller's, or every
 * rank's committed cursor. ResumeElastic records the resize once; every rank of the new world
 * sends the same request. Cursors of the job's current world size resize nothing: this rank
 * then starts at its own cursor (*start, in s->job_arena), whatever JoinJob says. */
static int resume_elastic(bw__session *s, const char *job, uint32_t world, const bw__join *how,
                          ProtobufCBinaryData *start, char *err, size_t errlen)
{
    bw_arena *a = &s->job_arena;
    ProtobufCBinaryData *bins = NULL;
    size_t n = how->ncursors;
    int rc = BW_OK;
    if (n == 0) {
        rc = bw__session_committed(s, job, a, &bins, &n, err, errlen);
    } else if (!(bins = bw__arena_alloc(a, n * sizeof(*bins)))) {
        rc = BW_NOMEM;
    }
    Batchwire__V1__Cursor **cur = rc == BW_OK ? bw__arena_alloc(a, n * sizeof(*cur)) : NULL;
    if (rc == BW_OK && !cur)
        rc = BW_NOMEM;
    for (size_t i = 0; rc == BW_OK && i < n; i++) {
        const uint8_t *data = how->ncursors ? how->cursors[i] : bins[i].data;
        size_t len = how->ncursors ? how->lens[i] : bins[i].len;
        char why[256];
        if (!data) {
            snprintf(err, errlen, "elastic resume: cursor %zu is missing", i);
            return BW_INVALID_ARGUMENT;
        }
        if (len == 0)
            len = strlen((const char *)data);
        if (bw__cursor_decode(data, len, a, &cur[i], why, sizeof(why)) != BW_OK) {
            snprintf(err, errlen, "elastic resume: cursor %zu refused: %s", i, why);
            return BW_CORRUPT;
        }
        if (how->ncursors) { /* the request carries binary cursors */
            uint8_t *bin = bw__cursor_encode(cur[i], &bins[i].len);
            bins[i].data = bin ? bw__arena_alloc(a, bins[i].len) : NULL;
            if (bins[i].data)
                memcpy(bins[i].data, bin, bins[i].len);
            free(bin);
            if (!bins[i].data)
                rc = BW_NOMEM;
        }
    }
    if (rc == BW_NOMEM)
        snprintf(err, errlen, "out of memory for the cursors of an elastic resume");
    if (rc != BW_OK)
        return rc;
    if (cur[0]->world_size == world) {
        for (size_t i = 0; i < n; i++)
            if (cur[i]->rank == s->rank && cur[i]->world_size == world)
                *start = bins[i];
        return BW_OK;
    }
    Batchwire__V1__ResumeElasticRequest req = BATCHWIRE__V1__RESUME_ELASTIC_REQUEST__INIT;
    req.job = (char *)job;
    req.world_size = world;
    req.cursors = bins;
    req.n_cursors = n;
    ProtobufCMessage *resp = NULL;
    rc = coord_call(s, BW_METHOD(BW_M_JOBS_RESUME_ELASTIC), &req.base, a, &resp, err, errlen);
    if (rc == BW_OK)
        BW_INFO("job=%s rank=%u elastic resume from %zu cursors of world size %u to %u (%s)", job,
                s->rank, n, cur[0]->world_size, world,
                ((const Batchwire__V1__ResumeElasticResponse *)resp)->resumed ? "recorded"
                                                                              : "recorded before");
    return rc;
}

enum { LEASE_TEXT_LEN = 5 + 32 }; /* "bwl1:" and the 128-bit lease id in hex, high half first */

/* The lease id in bw_loader_lease's text, refused unless it is exactly that. The text is a
 * secret: no part of it goes into the message. */
static int parse_lease(const char *text, uint64_t *lo, uint64_t *hi, char *err, size_t errlen)
{
    size_t n = strnlen(text, LEASE_TEXT_LEN + 1);
    bool ok = n == LEASE_TEXT_LEN && memcmp(text, "bwl1:", 5) == 0;
    uint64_t v[2] = {0, 0};
    for (size_t i = 0; ok && i < 32; i++) {
        char c = text[5 + i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        ok = d >= 0;
        v[i / 16] = v[i / 16] << 4 | (uint64_t)(d & 15);
    }
    if (!ok || (v[0] == 0 && v[1] == 0)) {
        snprintf(err, errlen,
                 "lease: not a lease as bw_loader_lease writes it (\"bwl1:\" and 32 lowercase hex "
                 "digits, not all zero); the text given has %s%zu characters%s",
                 n > LEASE_TEXT_LEN ? "more than " : "", n > LEASE_TEXT_LEN ? LEASE_TEXT_LEN : n,
                 n >= 5 && memcmp(text, "bwl1:", 5) != 0 ? " and another prefix" : "");
        return BW_INVALID_ARGUMENT;
    }
    *hi = v[0];
    *lo = v[1];
    return BW_OK;
}

/* BW_LEASE_LOST with the coordinator's sentence in err once the lease was taken over, else
 * BW_OK. Does not wait. */
static int lease_check(bw__session *s, char *err, size_t errlen)
{
    if (!atomic_load(&s->lease_lost))
        return BW_OK;
    pthread_mutex_lock(&s->mu);
    snprintf(err, errlen, "rank %u of job %s: %s", s->rank, s->job, s->lost_err);
    pthread_mutex_unlock(&s->mu);
    return BW_LEASE_LOST;
}

int bw__session_lease_text(bw__session *s, char *buf, size_t buflen, char *err, size_t errlen)
{
    if (!s->claimed) {
        snprintf(err, errlen,
                 "this loader holds no lease: only the loader that claimed rank %u (share 0) "
                 "has one",
                 s->rank);
        return BW_FAILED_PRECONDITION;
    }
    int rc = lease_check(s, err, errlen);
    if (rc != BW_OK)
        return rc;
    if (buflen < LEASE_TEXT_LEN + 1) {
        snprintf(err, errlen, "the lease's text needs %d bytes; the buffer has %zu",
                 LEASE_TEXT_LEN + 1, buflen);
        return BW_TOO_BIG;
    }
    snprintf(buf, buflen, "bwl1:%016" PRIx64 "%016" PRIx64, s->lease_id_hi, s->lease_id);
    return BW_OK;
}

static int start_heartbeats(bw__session *s, char *err, size_t errlen)
{
    if (pthread_create(&s->hb_thread, NULL, lease_thread, s) != 0) {
        snprintf(err, errlen, "cannot start the lease heartbeat thread");
        return BW_INTERNAL;
    }
    s->hb_started = true;
    return BW_OK;
}

/* The commit channel the coordinator announced: on the host this session reached it at, with
 * the coordinator's TLS settings and token (docs/operating.md, "Commit channel"). */
static void commit_channel(bw__session *s, const bw_loader_options *o, uint32_t port)
{
    char host[256], p[16], addr[300];
    if (bw__sock_split(o->coordinator, host, sizeof(host), p, sizeof(p)) != BW_OK)
        return; /* a target gRPC understands but not HOST:PORT: the stream, then */
    snprintf(addr, sizeof(addr), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
    snprintf(s->cchan_host, sizeof(s->cchan_host), "%s",
             o->tls_server_name ? o->tls_server_name : host);
    char err[512];
    pthread_mutex_lock(&s->stream_mu);
    if (bw__cchan_client_init(&s->cchan, addr, &s->chopts.rpc.tls, s->cchan_host, s->token, err,
                              sizeof(err)) != BW_OK)
        BW_INFO("job=%s rank=%u the coordinator's commit channel at %s cannot be used; commits "
                "and heartbeats go on the Jobs.Session stream err=%s",
                s->job, s->rank, addr, err);
    pthread_mutex_unlock(&s->stream_mu);
}

int bw__session_open(bw__session *s, const bw_loader_options *o, const bw__job_request *jr,
                     uint32_t rank, uint32_t world, const bw__join *how, char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    bw__interrupt_enable(); /* this process's waits notice bw_interrupt from now on */
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->stream_mu, NULL);
    bw__cond_init_mono(&s->cv);
    bw__arena_init(&s->job_arena, 0);
    s->rank = rank;
    s->world = world;
    s->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    s->retry_ms = o->retry_ms;
    s->holder_pid = o->holder_pid ? o->holder_pid : (uint32_t)getpid();
    s->job = strdup(jr ? jr->name : o->job);
    if (jr && o->lease) {
        if (!how || how->claim) {
            snprintf(err, errlen,
                     "lease: given to share 0 of rank %u, which claims the rank itself; the "
                     "lease is for the other shares (share_index 1 .. share_count - 1)",
                     rank);
            return BW_INVALID_ARGUMENT;
        }
        int lrc = parse_lease(o->lease, &s->lease_id, &s->lease_id_hi, err, errlen);
        if (lrc != BW_OK)
            return lrc;
    }
    /* Copies: the caller's strings are borrowed for bw_loader_open only, and the loader
     * creates its transports from these settings after this (transport.h). Workers are
     * verified by their own names (no server-name override). */
    s->chopts.rpc.tls.ca = o->tls_ca ? strdup(o->tls_ca) : NULL;
    s->chopts.rpc.tls.cert = o->tls_cert ? strdup(o->tls_cert) : NULL;
    s->chopts.rpc.tls.key = o->tls_key ? strdup(o->tls_key) : NULL;
    /* A copy that failed must not leave TLS off (or a job unnamed) while the token is sent:
     * docs/architecture.md, "Failure": an error, never a silent downgrade. */
    if (!s->job || (o->tls_ca && !s->chopts.rpc.tls.ca) ||
        (o->tls_cert && !s->chopts.rpc.tls.cert) || (o->tls_key && !s->chopts.rpc.tls.key)) {
        snprintf(err, errlen, "out of memory copying the loader's job name and TLS settings");
        return BW_NOMEM;
    }
    s->chopts.rpc.max_receive_bytes = 64 << 20;
    const char *token_file = o->token_file ? o->token_file : getenv("BATCHWIRE_TOKEN_FILE");
    if (token_file && *token_file) {
        int trc = bw__auth_read_token_file(token_file, &s->token, err, errlen);
        if (trc != BW_OK)
            return trc;
    }
    /* The token goes to the coordinator only; workers get the lease's grant (chopts.grant). */
    s->chopts.grant = (bw__grant_src){grant_src_get, s};
    bw_rpc_channel_opts co = s->chopts.rpc;
    co.tls.token = s->token;
    co.target = o->coordinator;
    co.tls.server_name = o->tls_server_name;
    int rc = bw__rpc_channel_open(&co, &s->coord, err, errlen);
    if (rc != BW_OK)
        return rc;
    if (!jr)
        return BW_OK; /* the coordinator alone (bw_job_checkpoint) */

    Batchwire__V1__GetOrCreateJobRequest creq = BATCHWIRE__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
    creq.name = jr->name;
    creq.config = (Batchwire__V1__JobConfig *)&jr->config;
    creq.world_size = world;
    ProtobufCMessage *resp = NULL;
    rc = coord_call(s, BW_METHOD(BW_M_JOBS_GET_OR_CREATE), &creq.base, &s->job_arena, &resp, err,
                    errlen);
    if (rc != BW_OK)
        return rc;
    ProtobufCBinaryData start = {0, NULL};
    if (how && how->elastic && (rc = resume_elastic(s, jr->name, world, how, &start, err, errlen)))
        return rc;
    if (how && !how->claim) {
        /* A share of the rank read by another process of the trainer: no lease of its own
         * (share 0 holds it), so no heartbeat, and it starts where it is told. */
        const Batchwire__V1__GetOrCreateJobResponse *cr = (const void *)resp;
        if (!cr->job || !cr->job->dataset || !cr->job->config || !cr->job->config->sampler ||
            cr->job->n_history == 0) {
            snprintf(err, errlen, "GetOrCreateJob to %s: the response lacks the job's description",
                     o->coordinator);
            return BW_PROTOCOL;
        }
        s->summary = cr->job;
        if (how->describe)
            return BW_OK;
        bw__placement *p = bw__session_placement(s, true, err, errlen);
        bw__placement_put(p);
        if (!p)
            return bw__interrupted() ? BW_INTERRUPTED : BW_UNAVAILABLE;
        if (!o->lease)
            return BW_OK;
        /* Given the rank's lease: confirm it now (a lease already lost is refused here), then
         * keep confirming it like share 0, without live counters. */
        s->confirms = true;
        char why[BW_LOADER_ERRLEN];
        rc = heartbeat_once(s, true, why, sizeof(why));
        if (rc != BW_OK) {
            snprintf(err, errlen, "lease: share %u of rank %u could not confirm it: %s",
                     o->share_index, rank, why);
            return rc;
        }
        uint32_t lease = atomic_load(&s->lease_ms);
        s->heartbeat_ms = lease / 3 ? lease / 3 : 1; /* the coordinator's rule (JoinJob) */
        return start_heartbeats(s, err, errlen);
    }

    char host[256];
    bw__hostname(host, sizeof(host));
    Batchwire__V1__Holder holder = BATCHWIRE__V1__HOLDER__INIT;
    holder.host = host;
    holder.pid = s->holder_pid;
    Batchwire__V1__JoinJobRequest jreq = BATCHWIRE__V1__JOIN_JOB_REQUEST__INIT;
    jreq.job = jr->name;
    jreq.rank = rank;
    jreq.world_size = world;
    jreq.holder = &holder;
    uint64_t sent = bw__mono_ms(); /* the lease is vouched for from no later than this */
    rc = coord_call(s, BW_METHOD(BW_M_JOBS_JOIN), &jreq.base, &s->job_arena, &resp, err, errlen);
    /* Held by a process of this host that has exited: a restart, which takes its rank back
     * at once instead of waiting for the old lease to expire. */
    if (rc == BW_ALREADY_EXISTS && (jreq.reclaim_pid = exited_holder(s, jr->name, host)) != 0) {
        BW_INFO("job=%s rank=%u its holder on this host has exited; reclaiming the rank "
                "exited_pid=%u",
                jr->name, rank, jreq.reclaim_pid);
        sent = bw__mono_ms();
        rc =
            coord_call(s, BW_METHOD(BW_M_JOBS_JOIN), &jreq.base, &s->job_arena, &resp, err, errlen);
    }
    if (rc != BW_OK)
        return rc;
    Batchwire__V1__JoinJobResponse *jresp = (void *)resp;
    if (!jresp->job || !jresp->job->dataset || !jresp->job->config ||
        !jresp->job->config->sampler || jresp->job->n_history == 0) {
        snprintf(err, errlen, "JoinJob to %s: the response lacks the job's description",
                 o->coordinator);
        return BW_PROTOCOL;
    }
    s->summary = jresp->job;
    s->resume_cursor = start.len ? start : jresp->cursor;
    s->lease_id = jresp->lease_id;
    s->lease_id_hi = jresp->lease_id_hi;
    s->heartbeat_ms = jresp->heartbeat_ms ? jresp->heartbeat_ms : 1000;
    s->claimed = s->confirms = true;
    if (jresp->commit_port && !s->cchan.address)
        commit_channel(s, o, jresp->commit_port);
    vouch(s, sent, jresp->lease_ms);
    atomic_store(&s->seen_version, jresp->placement_version);
    /* After the lease is ours: a grant refused here fails the open, and closing the session
     * then gives the rank back (LeaveJob) instead of leaving it held until the lease ends. */
    if ((rc = bw__session_set_grant(s, "JoinJob", &jresp->grant_claims, &jresp->grant_secret, err,
                                    errlen)) != BW_OK)
        return rc;

    bw__placement *p = bw__session_placement(s, true, err, errlen);
    if (!p)
        return bw__interrupted() ? BW_INTERRUPTED : BW_UNAVAILABLE;
    bw__placement_put(p);
    return start_heartbeats(s, err, errlen);
}

uint64_t bw__session_proven_until(bw__session *s)
{
    if (atomic_load(&s->lease_lost))
        return 0;
    uint32_t lease = atomic_load(&s->lease_ms);
    /* The margin covers the two clocks' rates (the coordinator's lease ends lease_ms after it
     * handled the renewal, by its own clock) and the moments between this check and the
     * hand-out. A coordinator that states no lease length leaves nothing to check. */
    if (!s->confirms || lease == 0)
        return UINT64_MAX;
    return atomic_load(&s->vouched_ms) + lease - lease / 10;
}

bool bw__session_lease_fresh(bw__session *s)
{
    return bw__mono_ms() < bw__session_proven_until(s);
}

/* The waiting gate (bw__session_lease_gate). */
static int lease_wait(bw__session *s, char *err, size_t errlen)
{
    if (bw__session_lease_fresh(s))
        return BW_OK;
    int rc = lease_check(s, err, errlen);
    if (rc != BW_OK)
        return rc;
    uint64_t t0 = bw__mono_ms(), retry = (uint64_t)(s->retry_ms > 0 ? s->retry_ms : 0);
    pthread_mutex_lock(&s->mu);
    uint64_t begun = s->hb_begun; /* one that began before this call does not count */
    BW_DEBUG("job=%s rank=%u the coordinator has not vouched for the lease for %llu ms: handing "
             "out nothing until it confirms it",
             s->job, s->rank, (unsigned long long)(t0 - atomic_load(&s->vouched_ms)));
    for (;;) {
        if (atomic_load(&s->lease_lost)) {
            rc = BW_LEASE_LOST;
            break;
        }
        if (bw__session_lease_fresh(s))
            break;
        if (atomic_load(&s->cancelled)) {
            snprintf(err, errlen, "rank %u of job %s: the loader is closing", s->rank, s->job);
            rc = BW_CANCELLED;
            break;
        }
        if (bw__interrupted()) {
            snprintf(err, errlen,
                     "rank %u of job %s: %s while waiting for the coordinator to "
                     "confirm the lease",
                     s->rank, s->job, bw_strerror(BW_INTERRUPTED));
            rc = BW_INTERRUPTED;
            break;
        }
        uint64_t now = bw__mono_ms();
        /* An attempt that began during this wait failed: with an answer that is not worth
         * waiting out (the job is gone, the token refused), or past retry_ms. */
        if (s->hb_ended > begun && s->hb_rc != BW_OK &&
            (!transient(s->hb_rc) || now - t0 >= retry)) {
            rc = transient(s->hb_rc) ? BW_UNAVAILABLE : s->hb_rc;
            snprintf(err, errlen,
                     "rank %u of job %s: the coordinator has not vouched for this loader's "
                     "lease for %llu ms (the lease is %u ms: this process was paused or cut "
                     "off), and confirming it failed for %llu ms; nothing is handed out until "
                     "it is confirmed (call again to keep trying): %.600s",
                     s->rank, s->job, (unsigned long long)(now - atomic_load(&s->vouched_ms)),
                     (unsigned)atomic_load(&s->lease_ms), (unsigned long long)(now - t0),
                     s->hb_err);
            break;
        }
        struct timespec until = bw__mono_deadline(100);
        pthread_cond_timedwait(&s->cv, &s->mu, &until);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == BW_LEASE_LOST)
        return lease_check(s, err, errlen);
    return rc;
}

int bw__session_lease_gate(bw__session *s, bool wait, char *err, size_t errlen)
{
    return wait ? lease_wait(s, err, errlen) : lease_check(s, err, errlen);
}

void bw__session_cancel(bw__session *s)
{
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->cancelled, true);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int bw__session_commit(bw__session *s, const uint8_t *cursor, size_t len, char *err, size_t errlen)
{
    int rc = lease_check(s, err, errlen);
    if (rc != BW_OK)
        return rc;
    Batchwire__V1__CommitCursorRequest req = BATCHWIRE__V1__COMMIT_CURSOR_REQUEST__INIT;
    req.job = s->job;
    req.rank = s->rank;
    req.lease_id = s->lease_id;
    req.lease_id_hi = s->lease_id_hi;
    req.cursor.data = (uint8_t *)cursor;
    req.cursor.len = len;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp = NULL;
    uint64_t sent = bw__mono_ms();
    rc = coord_call(s, BW_METHOD(BW_M_JOBS_COMMIT_CURSOR), &req.base, &a, &resp, err, errlen);
    bw__arena_reset(&a);
    if (rc == BW_OK) /* the coordinator renews the lease on a commit too */
        vouch(s, sent, 0);
    if (rc == BW_LEASE_LOST) {
        fence(s, err);
        return lease_check(s, err, errlen);
    }
    return rc;
}

/* Gives the rank up so that the next process may claim it at once instead of after
 * --lease-ms. Best effort: if the coordinator cannot be reached (or predates LeaveJob) the
 * lease simply expires. */
static void leave_job(bw__session *s)
{
    Batchwire__V1__LeaveJobRequest req = BATCHWIRE__V1__LEAVE_JOB_REQUEST__INIT;
    req.job = s->job;
    req.rank = s->rank;
    req.lease_id = s->lease_id;
    req.lease_id_hi = s->lease_id_hi;
    req.finished = s->finished;
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCMessage *resp = NULL;
    char err[BW_LOADER_ERRLEN];
    int timeout = s->timeout_ms < LEAVE_TIMEOUT_MS ? s->timeout_ms : LEAVE_TIMEOUT_MS;
    int rc = bw__rpc_call(s->coord, BW_METHOD(BW_M_JOBS_LEAVE), &req.base, &a, &resp, timeout, err,
                          sizeof(err));
    if (rc == BW_INTERRUPTED) /* closing after an interrupt: one brief try all the same */
        rc = bw__rpc_call_uninterrupted(s->coord, BW_METHOD(BW_M_JOBS_LEAVE), &req.base, &a, &resp,
                                        LEAVE_INTERRUPTED_MS, err, sizeof(err));
    if (rc == BW_OK)
        BW_DEBUG("job=%s rank=%u left the job (lease %s)", s->job, s->rank,
                 ((const Batchwire__V1__LeaveJobResponse *)resp)->released ? "released"
                                                                           : "already gone");
    else if (rc == BW_UNIMPLEMENTED)
        BW_DEBUG("job=%s rank=%u the coordinator has no LeaveJob; the lease expires on its own",
                 s->job, s->rank);
    else
        BW_WARN("job=%s rank=%u could not leave the job (the rank stays claimed until its lease "
                "expires) err=%s",
                s->job, s->rank, err);
    bw__arena_reset(&a);
}

void bw__session_close(bw__session *s)
{
    if (s->hb_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->hb_thread, NULL);
    }
    /* After the heartbeat thread: no heartbeat may renew the lease once it is released. A
     * share leaves nothing (the rank is share 0's), nor does a loader whose lease is lost. */
    if (s->coord && s->claimed && !atomic_load(&s->lease_lost))
        leave_job(s);
    bw__rpc_bidi_close(s->stream); /* no thread uses it any more */
    bw__cchan_client_free(&s->cchan);
    bw__placement_put(s->placement);
    grant_free(s->grant);
    bw__rpc_channel_close(s->coord);
    bw__arena_reset(&s->job_arena);
    free((void *)s->chopts.rpc.tls.ca);
    free((void *)s->chopts.rpc.tls.cert);
    free((void *)s->chopts.rpc.tls.key);
    free(s->token);
    free(s->job);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->stream_mu);
    pthread_cond_destroy(&s->cv);
    memset(s, 0, sizeof(*s));
}
