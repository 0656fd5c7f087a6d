/* The coordinator's table of storage workers (membership.h): registration (which principal
 * may hold which id, and how many; docs/security.md, "Worker ids"), heartbeats, liveness,
 * forgetting long-dead workers, and the placement version. */
#include "membership.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/rate.h"
#include "common/text.h"
#include "common/util.h"

enum { ID_MAX = BW_NAME_MAX + 1, ADDR_MAX = 256, FORMATS_MAX = 32 };

typedef struct worker {
    char id[ID_MAX];
    char owner[BW_PRINCIPAL_NAME_MAX]; /* the principal that registered the id ("": open) */
    char address[ADDR_MAX];
    char data_address[ADDR_MAX]; /* empty: no bulk data channel */
    uint64_t incarnation;
    uint64_t last_heartbeat_ms; /* monotonic */
    /* Another process asking for this id while it is held (check_takeover): its incarnation
     * and when it first asked (monotonic). */
    uint64_t contender, contender_ms;
    uint64_t registered_unix_ms;
    uint32_t restarts;
    bool alive;
    char version[32];
    char commit[64];
    bool auth_enabled; /* it authenticates its callers (docs/security.md) */
    bw__rate served;   /* samples, bytes (heartbeats; core/common/rate.h) */
    uint32_t max_message_bytes;
    size_t nformats;
    char formats[FORMATS_MAX][16];
} worker;

struct bw_membership {
    pthread_mutex_t mu;
    worker *workers;
    size_t n, cap;
    bw_membership_opts opts;
    bw_log_limit refusals; /* refused registrations and heartbeats: one line a second */
    uint32_t heartbeat_ms, dead_after;
    /* Placement version: bumped whenever the set of live workers (or an address) changes.
     * Starts at the wall clock in ms so versions keep growing across coordinator restarts. */
    uint64_t version;
};

bw_membership *bw__membership_new(const bw_membership_opts *opts)
{
    bw_membership *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->opts = *opts;
    m->heartbeat_ms = opts->heartbeat_ms;
    m->dead_after = opts->dead_after;
    m->version = bw__unix_ms();
    return m;
}

void bw__membership_free(bw_membership *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m->workers);
    free(m);
}

uint32_t bw__membership_heartbeat_ms(const bw_membership *m)
{
    return m->heartbeat_ms;
}

uint32_t bw__membership_dead_after(const bw_membership *m)
{
    return m->dead_after;
}

static int sweep_locked(bw_membership *m);

static worker *find(bw_membership *m, const char *id)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->workers[i].id, id) == 0)
            return &m->workers[i];
    return NULL;
}

/* Worker ids appear in logs, tables and placement hashes: the rule for names. */
static int check_id(const char *id, char *err, size_t errlen)
{
    return bw__check_name("worker id", id, ID_MAX - 1, err, errlen);
}

/* Under m->mu: whether `who` may act as worker `w` (docs/security.md, "Workers"): the id is
 * bound to the principal that registered it. */
static int check_worker_owner(const worker *w, const bw_principal *who, char *err, size_t errlen)
{
    if (bw__auth_owns(who, w->owner))
        return BW_OK;
    snprintf(err, errlen,
             "worker id '%s' is registered by another principal; '%s' may not act as it "
             "(each worker principal registers its own ids)",
             w->id, who->name);
    return BW_PERMISSION_DENIED;
}

static uint64_t dead_ms(const bw_membership *m)
{
    return (uint64_t)m->heartbeat_ms * m->dead_after;
}

/* A refused registration or heartbeat, logged at most once a second (a hostile principal may
 * send thousands). */
static void log_refusal(bw_membership *m, const char *what, const char *id, const char *address,
                        const char *peer, const bw_principal *who, int rc, const char *err)
{
    uint64_t quiet;
    if (bw__log_limit_allow(&m->refusals, &quiet))
        BW_WARN("worker=%s address=%s peer=%s principal=%s %s refused code=%s "
                "not_logged_before=%llu err=%s",
                id, address, peer, who->name[0] ? who->name : "-", what, bw_err_name(rc),
                (unsigned long long)quiet, err);
}

/* Under m->mu: whether one more id fits in the table (docs/security.md, "Worker ids"): every
 * id counts, live or dead, until it is forgotten. Worker principals also have a quota of
 * their own; admins and the anonymous principal of an open service only the total. */
static int check_caps(const bw_membership *m, const bw_principal *who, const char *id, char *err,
                      size_t errlen)
{
    const uint64_t forget_s = m->opts.forget_ms / 1000;
    if (m->opts.max_workers && m->n >= m->opts.max_workers) {
        snprintf(err, errlen,
                 "worker id '%s': the coordinator holds %zu worker ids, its limit "
                 "(--max-workers %u); dead workers count until they are forgotten "
                 "(--dead-worker-ttl %llu s after they die)",
                 id, m->n, m->opts.max_workers, (unsigned long long)forget_s);
        return BW_TOO_BIG;
    }
    if (who->role != BW_ROLE_WORKER || !m->opts.max_per_principal)
        return BW_OK;
    size_t owned = 0;
    for (size_t i = 0; i < m->n; i++)
        owned += strcmp(m->workers[i].owner, who->name) == 0;
    if (owned >= m->opts.max_per_principal) {
        snprintf(err, errlen,
                 "worker id '%s': worker principal '%s' has registered %zu worker ids, its quota "
                 "(--max-workers-per-principal %u); dead workers count until they are forgotten "
                 "(--dead-worker-ttl %llu s after they die)",
                 id, who->name, owned, m->opts.max_per_principal, (unsigned long long)forget_s);
        return BW_TOO_BIG;
    }
    return BW_OK;
}

/* Under m->mu: whether registration `req` may take id w->id from the process that holds it
 * (another incarnation; docs/operating.md, "Worker ids"). The id is free once its holder is
 * dead; a process registering at the holder's own address is that worker restarted in place
 * (one process per address: core/rpc/server.c binds without SO_REUSEPORT), and --takeover
 * replaces a live holder. Otherwise the newcomer is told to wait (BW_UNAVAILABLE; it retries)
 * until the holder either heartbeats after the newcomer first asked -- it is alive: refused
 * with BW_ALREADY_EXISTS, and the newcomer stops -- or is declared dead, when the id is free.
 * So a crashed worker restarted at another address gets its id back without --takeover, and a
 * second live worker never evicts the first. */
static int check_takeover(const bw_membership *m, worker *w,
                          const Batchwire__V1__RegisterWorkerRequest *req, char *err, size_t errlen)
{
    uint64_t now = bw__mono_ms(), since = now - w->last_heartbeat_ms;
    bool live = w->alive && since <= dead_ms(m);
    if (!live || req->takeover || strcmp(w->address, req->address) == 0)
        return BW_OK;
    if (w->contender != req->incarnation) {
        w->contender = req->incarnation;
        w->contender_ms = now;
        BW_INFO("worker=%s address=%s asks for the id held by the worker at %s (last heartbeat "
                "%llu ms ago): refused if that one heartbeats again, given the id if it is "
                "declared dead",
                w->id, req->address, w->address, (unsigned long long)since);
    }
    if (w->last_heartbeat_ms > w->contender_ms) {
        snprintf(err, errlen,
                 "worker id '%s' is held by a live worker at %s (it heartbeated %llu ms ago, "
                 "after this worker at %s asked for the id): give this worker another --id "
                 "(without --id each worker gets HOST:PORT, unique per host and port), stop the "
                 "worker at %s first, or pass --takeover to replace it",
                 w->id, w->address, (unsigned long long)since, req->address, w->address);
        return BW_ALREADY_EXISTS;
    }
    snprintf(err, errlen,
             "worker id '%s' is held by the worker at %s (last heartbeat %llu ms ago): waiting "
             "for its next heartbeat -- if it is alive this worker is refused, if it is declared "
             "dead (%llu ms without one) this worker takes the id",
             w->id, w->address, (unsigned long long)since, (unsigned long long)dead_ms(m));
    return BW_UNAVAILABLE;
}

int bw__membership_register(bw_membership *m, const bw_principal *who,
                            const Batchwire__V1__RegisterWorkerRequest *req, const char *peer,
                            char *err, size_t errlen)
{
    int rc = check_id(req->id, err, errlen);
    if (rc != BW_OK)
        return rc;
    size_t alen = strlen(req->address);
    if (alen == 0 || alen >= ADDR_MAX) {
        snprintf(err, errlen, "worker %s: address must be 1 to %d characters (got %zu)", req->id,
                 ADDR_MAX - 1, alen);
        return BW_INVALID_ARGUMENT;
    }
    const char *daddr = req->data_address ? req->data_address : "";
    if (strlen(daddr) >= ADDR_MAX || (daddr[0] && !strrchr(daddr, ':'))) {
        snprintf(err, errlen,
                 "worker %s: data_address must be empty or HOST:PORT of at most %d "
                 "characters (got %zu characters)",
                 req->id, ADDR_MAX - 1, strlen(daddr));
        return BW_INVALID_ARGUMENT;
    }
    const Batchwire__V1__WorkerCapabilities *caps = req->capabilities;
    if (caps && caps->n_formats > FORMATS_MAX) {
        snprintf(err, errlen, "worker %s: %zu formats is more than the limit of %d", req->id,
                 caps->n_formats, FORMATS_MAX);
        return BW_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&m->mu);
    sweep_locked(m); /* forgets long-dead workers before the caps count them */
    worker *w = find(m, req->id);
    bool is_new = w == NULL;
    bool was_alive = w && w->alive && bw__mono_ms() - w->last_heartbeat_ms <= dead_ms(m);
    bool restarted = w && w->incarnation != req->incarnation;
    char held_at[ADDR_MAX] = "";
    if ((w && (rc = check_worker_owner(w, who, err, errlen)) != BW_OK) ||
        (rc = bw__auth_worker_id(m->opts.auth, who, req->id, err, errlen)) != BW_OK ||
        (!w && (rc = check_caps(m, who, req->id, err, errlen)) != BW_OK) ||
        (restarted && (rc = check_takeover(m, w, req, err, errlen)) != BW_OK)) {
        pthread_mutex_unlock(&m->mu);
        if (rc != BW_UNAVAILABLE)
            log_refusal(m, "registration", req->id, req->address, peer, who, rc, err);
        return rc; /* nothing changed: the live worker keeps its id and keeps serving */
    }
    if (restarted && was_alive)
        snprintf(held_at, sizeof(held_at), "%s", w->address);
    if (is_new) {
        if (m->n == m->cap) {
            size_t cap = m->cap ? m->cap * 2 : 16;
            worker *nw = realloc(m->workers, cap * sizeof(*nw));
            if (!nw) {
                pthread_mutex_unlock(&m->mu);
                snprintf(err, errlen, "worker %s: out of memory adding it to %zu workers: retry",
                         req->id, m->n);
                return BW_NOMEM;
            }
            m->workers = nw;
            m->cap = cap;
        }
        w = &m->workers[m->n++];
        memset(w, 0, sizeof(*w));
        snprintf(w->id, sizeof(w->id), "%s", req->id);
        snprintf(w->owner, sizeof(w->owner), "%s", who->name);
        w->registered_unix_ms = bw__unix_ms();
    }
    if (is_new || restarted || !was_alive || strcmp(w->address, req->address) != 0 ||
        strcmp(w->data_address, daddr) != 0)
        m->version++;
    if (restarted)
        w->restarts++;
    w->incarnation = req->incarnation;
    w->contender = w->contender_ms = 0;
    snprintf(w->address, sizeof(w->address), "%s", req->address);
    snprintf(w->data_address, sizeof(w->data_address), "%s", daddr);
    w->last_heartbeat_ms = bw__mono_ms();
    w->alive = true;
    w->nformats = 0;
    w->max_message_bytes = caps ? caps->max_message_bytes : 0;
    snprintf(w->version, sizeof(w->version), "%s", caps && caps->version ? caps->version : "");
    snprintf(w->commit, sizeof(w->commit), "%s", caps && caps->commit ? caps->commit : "");
    w->auth_enabled = caps && caps->auth_enabled;
    if (restarted)
        memset(&w->served, 0, sizeof(w->served)); /* the new process counts from 0 */
    for (size_t i = 0; caps && i < caps->n_formats; i++)
        snprintf(w->formats[w->nformats++], sizeof(w->formats[0]), "%s", caps->formats[i]);
    pthread_mutex_unlock(&m->mu);

    if (is_new)
        BW_INFO("worker=%s address=%s peer=%s registered", req->id, req->address, peer);
    else if (restarted && was_alive && strcmp(held_at, req->address) != 0)
        BW_WARN("worker=%s address=%s peer=%s took the id over from the live worker at %s "
                "(--takeover); that one stops at its next heartbeat",
                req->id, req->address, peer, held_at);
    else if (restarted)
        BW_INFO("worker=%s address=%s peer=%s registered again (new process%s)", req->id,
                req->address, peer,
                was_alive ? " at the same address; the previous one had not been marked dead yet"
                          : "; alive again");
    else if (!was_alive)
        BW_INFO("worker=%s address=%s re-registered; alive again", req->id, req->address);
    return BW_OK;
}

int bw__membership_heartbeat(bw_membership *m, const bw_principal *who, const char *id,
                             uint64_t incarnation, bool *known, char *err, size_t errlen)
{
    int rc = BW_OK;
    *known = false;
    pthread_mutex_lock(&m->mu);
    worker *w = find(m, id);
    /* The binding is checked again: one narrowed on SIGHUP stops the worker's heartbeats, and
     * it is marked dead. */
    if (w && ((rc = check_worker_owner(w, who, err, errlen)) != BW_OK ||
              (rc = bw__auth_worker_id(m->opts.auth, who, id, err, errlen)) != BW_OK)) {
        log_refusal(m, "heartbeat", id, w->address, "-", who, rc, err);
    } else if (w && w->incarnation != incarnation) {
        snprintf(err, errlen,
                 "worker id '%s' is now held by another process at %s (it registered with "
                 "--takeover, or after this worker was declared dead); two workers must not "
                 "share an id",
                 id, w->address);
        rc = BW_ALREADY_EXISTS;
    } else if (w) {
        bool was_alive = w->alive;
        w->last_heartbeat_ms = bw__mono_ms();
        w->alive = true;
        *known = true;
        if (!was_alive)
            m->version++;
        if (!was_alive)
            BW_INFO("worker=%s address=%s heartbeat after being marked dead; alive again", id,
                    w->address);
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void bw__membership_served(bw_membership *m, const char *id, uint64_t incarnation, uint64_t samples,
                           uint64_t bytes)
{
    const uint64_t totals[BW_RATE_COUNTERS] = {samples, bytes, 0};
    pthread_mutex_lock(&m->mu);
    worker *w = find(m, id);
    if (w && w->incarnation == incarnation)
        bw__rate_report(&w->served, bw__mono_ms(), totals);
    pthread_mutex_unlock(&m->mu);
}

/* Marks workers past the heartbeat deadline dead (a new placement version) and removes those
 * dead for forget_ms; m->mu held. Run before every snapshot too, so that the worker table, the
 * placement and its version never disagree with the clock (a worker is never reported dead yet
 * still placed). */
static int sweep_locked(bw_membership *m)
{
    int changed = 0;
    uint64_t now = bw__mono_ms();
    for (size_t i = 0; i < m->n;) {
        worker *w = &m->workers[i];
        uint64_t since = now - w->last_heartbeat_ms;
        /* Removed: it left the placement when it died, so the version stays; its id counts no
         * more against the caps, and any principal its binding allows may register it. */
        if (!w->alive && m->opts.forget_ms && since > dead_ms(m) + m->opts.forget_ms) {
            BW_INFO("worker=%s address=%s forgotten: dead for more than --dead-worker-ttl "
                    "(%llu s)",
                    w->id, w->address, (unsigned long long)(m->opts.forget_ms / 1000));
            *w = m->workers[--m->n];
            continue;
        }
        i++;
        if (w->alive && since > dead_ms(m)) {
            w->alive = false;
            changed++;
            m->version++;
            BW_WARN("worker=%s address=%s marked dead: no heartbeat for %llu ms (%u missed at "
                    "%u ms)",
                    w->id, w->address, (unsigned long long)since, m->dead_after, m->heartbeat_ms);
        }
    }
    return changed;
}

void bw__membership_counts(bw_membership *m, size_t *alive, size_t *dead)
{
    pthread_mutex_lock(&m->mu);
    *alive = *dead = 0;
    for (size_t i = 0; i < m->n; i++)
        (*(m->workers[i].alive ? alive : dead))++;
    pthread_mutex_unlock(&m->mu);
}

int bw__membership_sweep(bw_membership *m)
{
    pthread_mutex_lock(&m->mu);
    int changed = sweep_locked(m);
    pthread_mutex_unlock(&m->mu);
    return changed;
}

static int by_id(const void *a, const void *b)
{
    const Batchwire__V1__WorkerInfo *const *x = a, *const *y = b;
    return strcmp((*x)->id, (*y)->id);
}

int bw__membership_list(bw_membership *m, bw_arena *arena, Batchwire__V1__ListWorkersResponse *resp)
{
    uint64_t now = bw__mono_ms();
    pthread_mutex_lock(&m->mu);
    sweep_locked(m);
    size_t n = m->n;
    Batchwire__V1__WorkerInfo **list = bw__arena_alloc(arena, (n ? n : 1) * sizeof(*list));
    Batchwire__V1__WorkerInfo *infos = bw__arena_alloc(arena, (n ? n : 1) * sizeof(*infos));
    Batchwire__V1__WorkerCapabilities *caps = bw__arena_alloc(arena, (n ? n : 1) * sizeof(*caps));
    if (!list || !infos || !caps) {
        pthread_mutex_unlock(&m->mu);
        return BW_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const worker *w = &m->workers[i];
        Batchwire__V1__WorkerInfo *wi = &infos[i];
        batchwire__v1__worker_info__init(wi);
        batchwire__v1__worker_capabilities__init(&caps[i]);
        wi->id = bw__arena_strdup(arena, w->id);
        wi->address = bw__arena_strdup(arena, w->address);
        wi->data_address = bw__arena_strdup(arena, w->data_address);
        uint64_t since = now - w->last_heartbeat_ms;
        /* Report what a sweep would decide now, so the table never lags the clock. */
        bool alive = w->alive && since <= dead_ms(m);
        wi->state = alive ? BATCHWIRE__V1__WORKER_STATE__WORKER_STATE_ALIVE
                          : BATCHWIRE__V1__WORKER_STATE__WORKER_STATE_DEAD;
        wi->ms_since_heartbeat = since;
        wi->incarnation = w->incarnation;
        wi->registered_unix_ms = w->registered_unix_ms;
        wi->restarts = w->restarts;
        caps[i].version = bw__arena_strdup(arena, w->version);
        caps[i].commit = bw__arena_strdup(arena, w->commit);
        caps[i].auth_enabled = w->auth_enabled;
        wi->served_samples = w->served.total[0];
        wi->served_bytes = w->served.total[1];
        wi->samples_per_s = alive ? w->served.per_s[0] : 0;
        wi->bytes_per_s = alive ? w->served.per_s[1] : 0;
        caps[i].max_message_bytes = w->max_message_bytes;
        caps[i].n_formats = w->nformats;
        caps[i].formats = bw__arena_alloc(arena, (w->nformats ? w->nformats : 1) * sizeof(char *));
        if (!wi->id || !wi->address || !wi->data_address || !caps[i].version || !caps[i].commit ||
            !caps[i].formats) {
            pthread_mutex_unlock(&m->mu);
            return BW_NOMEM;
        }
        for (size_t f = 0; f < w->nformats; f++)
            caps[i].formats[f] = bw__arena_strdup(arena, w->formats[f]);
        wi->capabilities = &caps[i];
        list[i] = wi;
    }
    pthread_mutex_unlock(&m->mu);
    qsort(list, n, sizeof(*list), by_id);
    resp->n_workers = n;
    resp->workers = list;
    resp->heartbeat_interval_ms = m->heartbeat_ms;
    resp->missed_heartbeats_dead = m->dead_after;
    return BW_OK;
}

uint64_t bw__membership_version(bw_membership *m)
{
    pthread_mutex_lock(&m->mu);
    sweep_locked(m);
    uint64_t v = m->version;
    pthread_mutex_unlock(&m->mu);
    return v;
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int bw__membership_live(bw_membership *m, bw_arena *arena, uint64_t *version, char ***ids,
                        char ***addresses, char ***data_addresses, size_t *n)
{
    pthread_mutex_lock(&m->mu);
    sweep_locked(m);
    size_t live = 0;
    for (size_t i = 0; i < m->n; i++)
        live += m->workers[i].alive;
    /* "id\0address\0data_address" triples, sorted by id */
    char **pairs = bw__arena_alloc(arena, (live ? live : 1) * sizeof(char *));
    *ids = bw__arena_alloc(arena, (live ? live : 1) * sizeof(char *));
    *addresses = bw__arena_alloc(arena, (live ? live : 1) * sizeof(char *));
    *data_addresses = bw__arena_alloc(arena, (live ? live : 1) * sizeof(char *));
    if (!pairs || !*ids || !*addresses || !*data_addresses) {
        pthread_mutex_unlock(&m->mu);
        return BW_NOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < m->n; i++) {
        const worker *w = &m->workers[i];
        if (!w->alive)
            continue;
        size_t il = strlen(w->id), al = strlen(w->address), dl = strlen(w->data_address);
        char *p = bw__arena_alloc(arena, il + al + dl + 3);
        if (!p) {
            pthread_mutex_unlock(&m->mu);
            return BW_NOMEM;
        }
        memcpy(p, w->id, il + 1);
        memcpy(p + il + 1, w->address, al + 1);
        memcpy(p + il + al + 2, w->data_address, dl + 1);
        pairs[k++] = p;
    }
    *version = m->version;
    pthread_mutex_unlock(&m->mu);
    qsort(pairs, k, sizeof(char *), by_str);
    for (size_t i = 0; i < k; i++) {
        (*ids)[i] = pairs[i];
        (*addresses)[i] = pairs[i] + strlen(pairs[i]) + 1;
        (*data_addresses)[i] = (*addresses)[i] + strlen((*addresses)[i]) + 1;
    }
    *n = k;
    return BW_OK;
}
