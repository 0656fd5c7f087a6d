/* The worker's side of membership: register, then heartbeat at the coordinator's interval;
 * register again when the coordinator forgets us; retry with capped backoff when it is away. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/util.h"
#include "common/version.h"
#include "worker.h"

/* Sleeps up to ms unless stopping; returns true when stopping. */
static bool nap(bw_worker *w, uint64_t ms)
{
    struct timespec until = bw__mono_deadline(ms);
    pthread_mutex_lock(&w->mu);
    while (!w->stopping && pthread_cond_timedwait(&w->cv, &w->mu, &until) == 0)
        ;
    bool stopping = w->stopping;
    pthread_mutex_unlock(&w->mu);
    return stopping;
}

/* takeover: replace a live worker that holds our id elsewhere (server/membership.c). */
static int do_register(bw_worker *w, bool takeover, uint32_t *interval_ms, char *err, size_t errlen)
{
    size_t nformats;
    const char *const *formats = bw__format_names(&nformats);
    Batchwire__V1__WorkerCapabilities caps = BATCHWIRE__V1__WORKER_CAPABILITIES__INIT;
    caps.n_formats = nformats;
    caps.formats = (char **)formats;
    caps.max_message_bytes = (uint32_t)w->cfg->common.max_message_bytes;
    caps.version = (char *)bw_version();
    caps.commit = (char *)bw__build_commit();
    caps.auth_enabled = bw__auth_enabled(w->auth);
    Batchwire__V1__RegisterWorkerRequest req = BATCHWIRE__V1__REGISTER_WORKER_REQUEST__INIT;
    req.id = w->id;
    req.address = w->advertise;
    req.data_address = w->data_advertise;
    req.capabilities = &caps;
    req.incarnation = w->incarnation;
    req.takeover = takeover;
    bw_arena arena;
    bw__arena_init(&arena, 1 << 20);
    ProtobufCMessage *resp = NULL;
    int rc = bw__rpc_call(w->coord, BW_METHOD(BW_M_REGISTER_WORKER), &req.base, &arena, &resp,
                          (int)w->cfg->rpc_timeout_ms, err, errlen);
    if (rc == BW_OK) {
        const Batchwire__V1__RegisterWorkerResponse *r = (const void *)resp;
        if (r->heartbeat_interval_ms > 0)
            *interval_ms = r->heartbeat_interval_ms;
    }
    bw__arena_reset(&arena);
    return rc;
}

/* Fetches the placement table when the coordinator's version differs from ours (or a
 * request showed ours is stale). Failures are retried at the next heartbeat. */
static void refresh_placement(bw_worker *w, uint64_t version)
{
    pthread_mutex_lock(&w->placement.mu);
    bool need = version != w->placement.version || w->placement.stale;
    pthread_mutex_unlock(&w->placement.mu);
    if (!need || version == 0)
        return;
    Batchwire__V1__PlacementRequest req = BATCHWIRE__V1__PLACEMENT_REQUEST__INIT;
    bw_arena arena;
    bw__arena_init(&arena, 16 << 20);
    ProtobufCMessage *resp = NULL;
    char err[512];
    int rc = bw__rpc_call(w->coord, BW_METHOD(BW_M_PLACEMENT_GET), &req.base, &arena, &resp,
                          (int)w->cfg->rpc_timeout_ms, err, sizeof(err));
    if (rc == BW_OK) {
        const Batchwire__V1__PlacementTable *t = (const void *)resp;
        const char **ids = bw__arena_alloc(&arena, (t->n_workers + 1) * sizeof(char *));
        if (ids) {
            for (size_t i = 0; i < t->n_workers; i++)
                ids[i] = t->workers[i]->id;
            if (bw__pview_set(&w->placement, t->version, ids, t->n_workers) == BW_OK)
                BW_INFO("worker=%s placement version %llu: %zu live workers", w->id,
                        (unsigned long long)t->version, t->n_workers);
            else
                BW_WARN("worker=%s placement version %llu: out of memory (will retry)", w->id,
                        (unsigned long long)t->version);
        }
    } else {
        BW_WARN("worker=%s cannot fetch the placement table (will retry) placement_version=%llu "
                "err=%s",
                w->id, (unsigned long long)version, err);
    }
    bw__arena_reset(&arena);
}

static int do_heartbeat(bw_worker *w, bool *known, uint32_t *interval_ms, char *err, size_t errlen)
{
    Batchwire__V1__HeartbeatRequest req = BATCHWIRE__V1__HEARTBEAT_REQUEST__INIT;
    req.id = w->id;
    req.incarnation = w->incarnation;
    /* The served totals (counted once, by the read path) for the coordinator's rates. */
    req.served_samples = atomic_load(&w->stats.records_read);
    req.served_bytes = atomic_load(&w->stats.record_bytes_read);
    bw_arena arena;
    bw__arena_init(&arena, 1 << 20);
    ProtobufCMessage *resp = NULL;
    int rc = bw__rpc_call(w->coord, BW_METHOD(BW_M_HEARTBEAT), &req.base, &arena, &resp,
                          (int)w->cfg->rpc_timeout_ms, err, errlen);
    if (rc == BW_OK) {
        const Batchwire__V1__HeartbeatResponse *r = (const void *)resp;
        *known = r->known;
        if (r->heartbeat_interval_ms > 0)
            *interval_ms = r->heartbeat_interval_ms;
        if (r->known)
            refresh_placement(w, r->placement_version);
        /* Leases that ended: their grants are refused from now on (storage-side fencing,
         * docs/security.md "Read grants"); one that fails for memory comes again next time. */
        for (size_t i = 0; w->grants && i < r->n_revoked; i++)
            if (r->revoked[i]->job)
                bw__grant_revoke(w->grants, r->revoked[i]->job, r->revoked[i]->rank,
                                 r->revoked[i]->lease_tag, r->revoked[i]->until_ms);
    }
    bw__arena_reset(&arena);
    return rc;
}

/* Whether two error sentences differ in more than their numbers ("last heartbeat 361 ms ago"
 * and "... 1362 ms ago" are the same news). */
static bool news(const char *a, const char *b)
{
    for (;;) {
        bool da = *a >= '0' && *a <= '9', db = *b >= '0' && *b <= '9';
        if (da && db) {
            while (*a >= '0' && *a <= '9')
                a++;
            while (*b >= '0' && *b <= '9')
                b++;
            continue;
        }
        if (*a != *b)
            return true;
        if (!*a)
            return false;
        a++;
        b++;
    }
}

static void *membership_thread(void *arg)
{
    bw_worker *w = arg;
    bool registered = false, ever_registered = false;
    uint32_t interval = 1000;
    uint64_t backoff = 100;
    char err[1024], last_err[1024] = "";
    uint64_t last_err_ms = 0;
    for (;;) {
        int rc;
        if (!registered) {
            /* --takeover is for this process's start; registering again after the
             * coordinator forgot us never evicts a worker that registered meanwhile. */
            rc = do_register(w, w->cfg->takeover && !ever_registered, &interval, err, sizeof(err));
            if (rc == BW_OK) {
                registered = ever_registered = true;
                backoff = 100;
                last_err[0] = '\0';
                BW_INFO("worker=%s registered with coordinator %s as %s (heartbeat every %u ms)",
                        w->id, w->cfg->coordinator, w->advertise, interval);
            }
        } else {
            bool known = true;
            rc = do_heartbeat(w, &known, &interval, err, sizeof(err));
            if (rc == BW_OK && !known) { /* registers again at once, not an interval later */
                BW_WARN("worker=%s the coordinator does not know this worker (it restarted?); "
                        "registering again",
                        w->id);
                registered = false;
                continue;
            }
            if (rc == BW_OK)
                last_err[0] = '\0';
        }
        if (rc == BW_ALREADY_EXISTS) { /* refused, or our id was taken over: never fight */
            if (ever_registered)
                BW_ERROR("worker=%s stopping err=%s", w->id, err);
            else
                BW_ERROR("worker=%s cannot start err=%s", w->id, err);
            atomic_store(&w->fatal, 1);
            break;
        }
        if (rc != BW_OK) {
            /* Say it once, then again only when it changes (not just its numbers) or every
             * 10 s. */
            uint64_t now = bw__mono_ms();
            if (news(err, last_err) || now - last_err_ms > 10000) {
                BW_WARN("worker=%s %s failed (will retry) err=%s", w->id,
                        registered ? "heartbeat" : "registration", err);
                snprintf(last_err, sizeof(last_err), "%s", err);
                last_err_ms = now;
            }
            /* Wait by driving the channel's reconnection: a restarted or moved coordinator is
             * tried as soon as a connection to it is made (docs/operating.md, "Networks"). A
             * coordinator that answered with an error leaves the channel connected: then wait
             * the whole pause, or this loop would spin. */
            uint64_t pause = registered ? interval : backoff, w0 = bw__mono_ms();
            bool up = bw__rpc_channel_wait(w->coord, (int)pause);
            if (nap(w, up && bw__mono_ms() - w0 < 2 ? pause : 0))
                break;
            if (!registered)
                backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
            continue;
        }
        if (nap(w, interval))
            break;
    }
    return NULL;
}

int bw__worker_connect(bw_worker *w, char *err, size_t errlen)
{
    bw_rpc_channel_opts co;
    memset(&co, 0, sizeof(co));
    co.target = w->cfg->coordinator;
    co.tls.ca = w->cfg->tls_ca;
    co.tls.cert = w->cfg->common.tls_cert;
    co.tls.key = w->cfg->common.tls_key;
    co.tls.server_name = w->cfg->tls_server_name;
    co.tls.token = w->token;
    co.max_receive_bytes = (int)w->cfg->common.max_message_bytes;
    /* A daemon's: a coordinator back on a new IP is found a second after the stale address's
     * attempt began (rpc/client.h). */
    co.connect_ms = BW_RPC_DAEMON_CONNECT_MS;
    return bw__rpc_channel_open(&co, &w->coord, err, errlen);
}

int bw__worker_membership_start(bw_worker *w, char *err, size_t errlen)
{
    pthread_mutex_init(&w->mu, NULL);
    bw__cond_init_mono(&w->cv);
    if (pthread_create(&w->hb_thread, NULL, membership_thread, w) != 0) {
        snprintf(err, errlen, "cannot start the heartbeat thread");
        bw__rpc_channel_close(w->coord);
        w->coord = NULL;
        return BW_INTERNAL;
    }
    w->hb_started = true;
    return BW_OK;
}

void bw__worker_membership_stop(bw_worker *w)
{
    if (!w->coord)
        return;
    if (!w->hb_started) {
        bw__rpc_channel_close(w->coord);
        w->coord = NULL;
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->hb_thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    bw__rpc_channel_close(w->coord);
    w->coord = NULL;
}
