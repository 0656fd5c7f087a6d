/* The daemons' side of read grants (grant.h, docs/security.md "Read grants"): the --grant-key
 * file, minting at the coordinator, revoked leases, verification at the workers (with a cache
 * of verified grants) and the coordinator's proof for its calls to workers. Daemon-only
 * (bwdaemon); the lease holder's proof is grant_proof.c. */
#include "auth/grant.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "auth/auth.h"
#include "batchwire/batchwire.h"
#include "common/config.h"
#include "common/text.h"

enum {
    KEY_MIN = 32,  /* bytes */
    KEY_MAX = 256, /* bytes */
    CACHE_SLOTS = 4096,
    PACK_STACK = 4096,        /* a request's dataset is packed on the stack up to this */
    DATASET_KEEP = 64 << 10,  /* a verified grant keeps its packed dataset up to this size */
    DATASETS_KEPT = 16 << 20, /* and all of them together up to this */
    REVOKED_BUCKETS = 1024,
    CACHE_LOCKS = 64, /* reads of different grants rarely wait for each other */
};

typedef struct key {
    char id[BW_GRANT_KEY_ID_MAX + 1];
    uint8_t k[KEY_MAX];
    size_t len;
} key;

typedef struct keyring {
    key *keys; /* the first signs */
    size_t n;
} keyring;

/* A verified (claims, proof) pair. Valid while keys_epoch is the ring's; checked against the
 * revocations again when they changed since (rev_epoch). */
typedef struct cached {
    bool used;
    uint64_t keys_epoch, rev_epoch;
    uint8_t proof[BW_GRANT_PROOF_BYTES];
    uint8_t *claims; /* copy */
    size_t claims_len;
    char *job;
    uint32_t rank;
    uint64_t lease_tag, expires_ms;
    uint8_t dataset[BW_GRANT_HASH_BYTES]; /* the hash the request's dataset matched */
    bool sources;    /* a mixture's grant: other datasets than this one may verify too */
    uint8_t *packed; /* the dataset it was verified with, packed (NULL: too large to keep) */
    size_t packed_len;
} cached;

typedef struct revoked {
    struct revoked *next;
    char *job;
    uint32_t rank;
    uint64_t lease_tag, until_ms;
} revoked;

struct bw_grants {
    char *path;
    pthread_rwlock_t lock; /* the keys */
    keyring ring;
    uint64_t keys_epoch;
    pthread_mutex_t rev_mu;
    revoked *rev[REVOKED_BUCKETS];
    size_t nrev;
    uint64_t rev_epoch;                    /* grows when a revocation is added */
    pthread_mutex_t cache_mu[CACHE_LOCKS]; /* slot i is under cache_mu[i % CACHE_LOCKS] */
    cached *cache; /* CACHE_SLOTS, by the proof's first bytes (random: an HMAC) */
    size_t kept;   /* bytes of packed datasets the cache keeps (DATASETS_KEPT at most) */
};

/* ---- the key file ---- */

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static bool key_id_ok(const char *s, size_t len)
{
    if (len < 1 || len > BW_GRANT_KEY_ID_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '.' && s[i] != '-')
            return false;
    return true;
}

static int parse_key(char *line, const char *path, int lineno, key *k, char *err, size_t errlen)
{
    char *save = NULL;
    char *id = strtok_r(line, " \t", &save);
    char *hex = strtok_r(NULL, " \t", &save);
    char *extra = strtok_r(NULL, " \t", &save);
    if (!id || !hex || extra) {
        snprintf(err, errlen,
                 "--grant-key %s line %d: expected two fields KEYID HEX (e.g. k1 and the "
                 "output of openssl rand -hex 32)",
                 path, lineno);
        return BW_INVALID_ARGUMENT;
    }
    if (!key_id_ok(id, strlen(id))) {
        snprintf(err, errlen,
                 "--grant-key %s line %d: the key id must be 1 to %d of A-Z a-z 0-9 _ . -", path,
                 lineno, BW_GRANT_KEY_ID_MAX);
        return BW_INVALID_ARGUMENT;
    }
    size_t hl = strlen(hex);
    if (hl < 2 * KEY_MIN || hl > 2 * KEY_MAX || hl % 2) {
        snprintf(err, errlen,
                 "--grant-key %s line %d: key '%s' is %zu characters long; it needs an even "
                 "number from %d to %d of hex digits (openssl rand -hex 32)",
                 path, lineno, id, hl, 2 * KEY_MIN, 2 * KEY_MAX);
        return BW_INVALID_ARGUMENT;
    }
    memset(k, 0, sizeof(*k));
    for (size_t i = 0; i < hl / 2; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            snprintf(err, errlen,
                     "--grant-key %s line %d: key '%s' holds a character that is not hex", path,
                     lineno, id);
            return BW_INVALID_ARGUMENT;
        }
        k->k[i] = (uint8_t)(hi << 4 | lo);
    }
    k->len = hl / 2;
    snprintf(k->id, sizeof(k->id), "%s", id);
    return BW_OK;
}

static void ring_free(keyring *r)
{
    if (r->keys)
        OPENSSL_cleanse(r->keys, r->n * sizeof(*r->keys));
    free(r->keys);
    memset(r, 0, sizeof(*r));
}

static int load(const char *path, keyring *out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(err, errlen, "--grant-key %s: %s", path, strerror(errno));
        return BW_IO;
    }
    bw__auth_warn_file_mode(fileno(f), "--grant-key", path, true);
    keyring r = {NULL, 0};
    size_t cap = 0;
    int rc = BW_OK, lineno = 0;
    char line[1024], *p = NULL;
    while (rc == BW_OK &&
           (rc = bw__config_line(f, line, sizeof(line), path, &lineno, &p, err, errlen)) == BW_OK) {
        if (r.n == cap) {
            cap = cap ? 2 * cap : 4;
            key *nk = realloc(r.keys, cap * sizeof(*nk));
            if (!nk) {
                snprintf(err, errlen, "--grant-key %s: out of memory", path);
                rc = BW_NOMEM;
                break;
            }
            r.keys = nk;
        }
        rc = parse_key(p, path, lineno, &r.keys[r.n], err, errlen);
        for (size_t i = 0; rc == BW_OK && i < r.n; i++)
            if (strcmp(r.keys[i].id, r.keys[r.n].id) == 0) {
                snprintf(err, errlen, "--grant-key %s line %d: key id '%s' is listed twice", path,
                         lineno, r.keys[i].id);
                rc = BW_INVALID_ARGUMENT;
            }
        if (rc == BW_OK)
            r.n++;
    }
    OPENSSL_cleanse(line, sizeof(line));
    rc = rc == 1 ? BW_OK : rc; /* the end of the file */
    if (rc == BW_OK && ferror(f)) {
        snprintf(err, errlen, "--grant-key %s: read error", path);
        rc = BW_IO;
    }
    fclose(f);
    if (rc == BW_OK && r.n == 0) {
        snprintf(err, errlen,
                 "--grant-key %s holds no key (lines KEYID HEX; make one with: printf 'k1 %%s\\n' "
                 "\"$(openssl rand -hex 32)\" > FILE)",
                 path);
        rc = BW_INVALID_ARGUMENT;
    }
    if (rc != BW_OK) {
        r.n = cap; /* cleanse everything allocated */
        ring_free(&r);
        return rc;
    }
    *out = r;
    return BW_OK;
}

int bw__grants_open(const char *path, bw_grants **out, char *err, size_t errlen)
{
    *out = NULL;
    bw_grants *g = calloc(1, sizeof(*g));
    if (g)
        g->cache = calloc(CACHE_SLOTS, sizeof(*g->cache));
    if (g)
        g->path = strdup(path);
    if (!g || !g->cache || !g->path) {
        if (g) {
            free(g->cache);
            free(g->path);
        }
        free(g);
        snprintf(err, errlen, "--grant-key %s: out of memory", path);
        return BW_NOMEM;
    }
    pthread_rwlock_init(&g->lock, NULL);
    pthread_mutex_init(&g->rev_mu, NULL);
    for (size_t i = 0; i < CACHE_LOCKS; i++)
        pthread_mutex_init(&g->cache_mu[i], NULL);
    int rc = load(path, &g->ring, err, errlen);
    if (rc != BW_OK) {
        bw__grants_free(g);
        return rc;
    }
    *out = g;
    return BW_OK;
}

static void cached_clear(bw_grants *g, cached *c)
{
    __atomic_sub_fetch(&g->kept, c->packed_len, __ATOMIC_RELAXED);
    free(c->claims);
    free(c->job);
    free(c->packed);
    memset(c, 0, sizeof(*c));
}

void bw__grants_free(bw_grants *g)
{
    if (!g)
        return;
    ring_free(&g->ring);
    for (size_t b = 0; b < REVOKED_BUCKETS; b++)
        for (revoked *r = g->rev[b], *next; r; r = next) {
            next = r->next;
            free(r->job);
            free(r);
        }
    if (g->cache)
        for (size_t i = 0; i < CACHE_SLOTS; i++)
            cached_clear(g, &g->cache[i]);
    free(g->cache);
    pthread_rwlock_destroy(&g->lock);
    pthread_mutex_destroy(&g->rev_mu);
    for (size_t i = 0; i < CACHE_LOCKS; i++)
        pthread_mutex_destroy(&g->cache_mu[i]);
    free(g->path);
    free(g);
}

int bw__grants_reload(bw_grants *g, size_t *count, char *err, size_t errlen)
{
    keyring r;
    int rc = load(g->path, &r, err, errlen);
    if (rc != BW_OK)
        return rc;
    pthread_rwlock_wrlock(&g->lock);
    keyring old = g->ring;
    g->ring = r;
    __atomic_add_fetch(&g->keys_epoch, 1, __ATOMIC_RELEASE);
    pthread_rwlock_unlock(&g->lock);
    ring_free(&old);
    *count = r.n;
    return BW_OK;
}

const char *bw__grants_path(const bw_grants *g)
{
    return g->path;
}

/* ---- hashes ---- */

/* HMAC-SHA256(k, label || msg) into out. */
static void hmac(const key *k, const char *label, size_t label_len, const uint8_t *msg, size_t len,
                 uint8_t out[32])
{
    uint8_t buf[BW_GRANT_CLAIMS_MAX + 64];
    uint8_t *p = label_len + len <= sizeof(buf) ? buf : malloc(label_len + len);
    unsigned int ol = 32;
    if (p) {
        memcpy(p, label, label_len);
        if (len)
            memcpy(p + label_len, msg, len);
    }
    if (!p || !HMAC(EVP_sha256(), k->k, (int)k->len, p, label_len + len, out, &ol))
        /* OpenSSL failed (out of memory): a MAC of all ones verifies nothing real, and the
         * grant it would sign is refused by every worker */
        memset(out, 0xff, 32);
    if (p != buf)
        free(p);
}

uint64_t bw__grant_lease_tag(uint64_t lease_lo, uint64_t lease_hi)
{
    static const char label[] = "bw-lease-tag";
    uint8_t msg[sizeof(label) - 1 + 16];
    memcpy(msg, label, sizeof(label) - 1);
    for (int i = 0; i < 8; i++) {
        msg[sizeof(label) - 1 + i] = (uint8_t)(lease_lo >> (8 * i));
        msg[sizeof(label) - 1 + 8 + i] = (uint8_t)(lease_hi >> (8 * i));
    }
    uint8_t d[32];
    unsigned int dl = 0;
    if (!EVP_Digest(msg, sizeof(msg), d, &dl, EVP_sha256(), NULL))
        return lease_lo ^ lease_hi; /* OpenSSL out of memory: still names this lease alone */
    uint64_t tag = 0;
    for (int i = 0; i < 8; i++)
        tag = tag << 8 | d[i];
    return tag;
}

/* Packs `ds` into buf when it fits (*len set, returns buf), else into a new allocation that
 * the caller frees (returns it), NULL when out of memory. */
static uint8_t *pack_dataset(const Batchwire__V1__Dataset *ds, uint8_t *buf, size_t buflen,
                             size_t *len)
{
    *len = batchwire__v1__dataset__get_packed_size(ds);
    uint8_t *p = *len <= buflen ? buf : malloc(*len ? *len : 1);
    if (p)
        batchwire__v1__dataset__pack(ds, p);
    return p;
}

static int sha256(const uint8_t *p, size_t n, uint8_t out[BW_GRANT_HASH_BYTES])
{
    unsigned int dl = 0;
    return EVP_Digest(p, n, out, &dl, EVP_sha256(), NULL) ? BW_OK : BW_NOMEM;
}

int bw__grant_dataset_hash(const Batchwire__V1__Dataset *dataset, uint8_t out[BW_GRANT_HASH_BYTES])
{
    uint8_t buf[1024];
    size_t len = 0;
    /* NULL (a job of synthetic samples) hashes as the empty message: no request matches it */
    uint8_t *p = dataset ? pack_dataset(dataset, buf, sizeof(buf), &len) : buf;
    int rc = p ? sha256(p, len, out) : BW_NOMEM;
    if (p != buf)
        free(p);
    return rc;
}

/* ---- minting ---- */

static const char GRANT_LABEL[] = "bw-grant-v1";

int bw__grant_mint(bw_grants *g, const bw_grant_claims *c, bw_arena *arena,
                   ProtobufCBinaryData *claims, ProtobufCBinaryData *secret)
{
    memset(claims, 0, sizeof(*claims));
    memset(secret, 0, sizeof(*secret));
    pthread_rwlock_rdlock(&g->lock);
    const key *k = &g->ring.keys[0];
    Batchwire__V1__GrantClaims m = BATCHWIRE__V1__GRANT_CLAIMS__INIT;
    m.key_id = (char *)k->id;
    m.job = (char *)c->job;
    m.rank = c->rank;
    m.dataset.data = (uint8_t *)c->dataset;
    m.dataset.len = BW_GRANT_HASH_BYTES;
    ProtobufCBinaryData *src =
        c->nsources ? bw__arena_alloc(arena, c->nsources * sizeof(*src)) : NULL;
    if (c->nsources && !src) {
        pthread_rwlock_unlock(&g->lock);
        return BW_NOMEM;
    }
    for (size_t j = 0; j < c->nsources; j++) {
        src[j].data = (uint8_t *)c->sources[j];
        src[j].len = BW_GRANT_HASH_BYTES;
    }
    m.sources = src;
    m.n_sources = c->nsources;
    m.lease_tag = c->lease_tag;
    m.lease_generation = c->lease_generation;
    m.expires_ms = c->expires_ms;
    size_t len = batchwire__v1__grant_claims__get_packed_size(&m);
    claims->data = bw__arena_alloc(arena, len);
    secret->data = bw__arena_alloc(arena, BW_GRANT_SECRET_BYTES);
    int rc = claims->data && secret->data ? BW_OK : BW_NOMEM;
    if (rc == BW_OK) {
        claims->len = batchwire__v1__grant_claims__pack(&m, claims->data);
        hmac(k, GRANT_LABEL, sizeof(GRANT_LABEL) - 1, claims->data, claims->len, secret->data);
        secret->len = BW_GRANT_SECRET_BYTES;
    }
    pthread_rwlock_unlock(&g->lock);
    return rc;
}

/* ---- revocations ---- */

static size_t rev_bucket(uint64_t tag)
{
    return (size_t)(tag % REVOKED_BUCKETS);
}

/* Under rev_mu: the revocation of (job, rank, tag), or NULL. */
static revoked *rev_find(bw_grants *g, const char *job, uint32_t rank, uint64_t tag)
{
    for (revoked *r = g->rev[rev_bucket(tag)]; r; r = r->next)
        if (r->lease_tag == tag && r->rank == rank && strcmp(r->job, job) == 0)
            return r;
    return NULL;
}

/* Under rev_mu: forgets the revocations that ended before now_ms. */
static void rev_prune(bw_grants *g, uint64_t now_ms)
{
    for (size_t b = 0; b < REVOKED_BUCKETS; b++)
        for (revoked **pp = &g->rev[b]; *pp;) {
            revoked *r = *pp;
            if (r->until_ms < now_ms) {
                *pp = r->next;
                free(r->job);
                free(r);
                g->nrev--;
            } else {
                pp = &r->next;
            }
        }
}

int bw__grant_revoke(bw_grants *g, const char *job, uint32_t rank, uint64_t lease_tag,
                     uint64_t until_ms)
{
    pthread_mutex_lock(&g->rev_mu);
    revoked *r = rev_find(g, job, rank, lease_tag);
    int rc = BW_OK;
    if (r) {
        r->until_ms = r->until_ms > until_ms ? r->until_ms : until_ms;
    } else if ((r = calloc(1, sizeof(*r))) && (r->job = strdup(job))) {
        r->rank = rank;
        r->lease_tag = lease_tag;
        r->until_ms = until_ms;
        r->next = g->rev[rev_bucket(lease_tag)];
        g->rev[rev_bucket(lease_tag)] = r;
        g->nrev++;
        __atomic_add_fetch(&g->rev_epoch, 1, __ATOMIC_RELEASE);
    } else {
        free(r);
        rc = BW_NOMEM;
    }
    pthread_mutex_unlock(&g->rev_mu);
    return rc;
}

int bw__grant_revoked(bw_grants *g, uint64_t now_ms, bw_arena *arena,
                      Batchwire__V1__RevokedLease ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&g->rev_mu);
    rev_prune(g, now_ms);
    int rc = BW_OK;
    Batchwire__V1__RevokedLease **v = g->nrev ? bw__arena_alloc(arena, g->nrev * sizeof(*v)) : NULL;
    if (g->nrev && !v)
        rc = BW_NOMEM;
    size_t k = 0;
    for (size_t b = 0; v && b < REVOKED_BUCKETS; b++) /* v NULL: none (or no memory) */
        for (revoked *r = g->rev[b]; rc == BW_OK && r; r = r->next) {
            Batchwire__V1__RevokedLease *x = bw__arena_alloc(arena, sizeof(*x));
            char *job = bw__arena_alloc(arena, strlen(r->job) + 1);
            if (!x || !job) {
                rc = BW_NOMEM;
                break;
            }
            batchwire__v1__revoked_lease__init(x);
            memcpy(job, r->job, strlen(r->job) + 1);
            x->job = job;
            x->rank = r->rank;
            x->lease_tag = r->lease_tag;
            x->until_ms = r->until_ms;
            v[k++] = x;
        }
    pthread_mutex_unlock(&g->rev_mu);
    if (rc == BW_OK) {
        *out = v;
        *n = k;
    }
    return rc;
}

static bool is_revoked(bw_grants *g, const char *job, uint32_t rank, uint64_t tag, uint64_t now_ms)
{
    pthread_mutex_lock(&g->rev_mu);
    const revoked *r = rev_find(g, job, rank, tag);
    bool yes = r && r->until_ms >= now_ms;
    pthread_mutex_unlock(&g->rev_mu);
    return yes;
}

/* ---- verification ---- */

/* The key called id under g->lock, or NULL. */
static const key *key_by_id(const bw_grants *g, const char *id)
{
    for (size_t i = 0; i < g->ring.n; i++)
        if (strcmp(g->ring.keys[i].id, id) == 0)
            return &g->ring.keys[i];
    return NULL;
}

/* The proof's first bytes, mixed with the request's packed dataset (FNV-1a): a mixture's grant
 * (one proof) is cached once per source it reads, instead of the sources taking turns in one
 * slot. */
static size_t slot_of(const uint8_t proof[BW_GRANT_PROOF_BYTES], const uint8_t *packed,
                      size_t packed_len)
{
    uint64_t h = 0, f = 14695981039346656037ull;
    for (int i = 0; i < 8; i++)
        h = h << 8 | proof[i];
    for (size_t i = 0; i < packed_len; i++)
        f = (f ^ packed[i]) * 1099511628211ull;
    return (size_t)((h ^ f) % CACHE_SLOTS);
}

/* The job name for a refusal: printable and short, else a placeholder (it came from the
 * request). */
static const char *shown(const char *job)
{
    for (const char *p = job; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            return "(unprintable)";
    return strlen(job) <= 128 ? job : "(too long)";
}

/* Whether packed (the request's dataset) hashes to want. Outside every lock. */
static int dataset_hashes_to(const uint8_t *packed, size_t packed_len,
                             const uint8_t want[BW_GRANT_HASH_BYTES], bool *ok)
{
    uint8_t h[BW_GRANT_HASH_BYTES];
    int rc = sha256(packed, packed_len, h);
    *ok = rc == BW_OK && CRYPTO_memcmp(h, want, sizeof(h)) == 0;
    return rc;
}

/* What the cache knows of a verified (claims, proof) pair. */
typedef struct hit {
    char job[BW_JOB_NAME_MAX + 1];
    uint32_t rank;
    uint64_t lease_tag, expires_ms, rev_epoch;
    uint8_t dataset[BW_GRANT_HASH_BYTES];
    bool sources;      /* a mixture's grant (cached.sources) */
    bool same_dataset; /* the request's packed dataset is the one it was verified with */
} hit;

static bool cache_get(bw_grants *g, const ProtobufCBinaryData *claims, const uint8_t *proof,
                      uint64_t keys_epoch, const uint8_t *packed, size_t packed_len, hit *h)
{
    bool found = false;
    size_t slot = slot_of(proof, packed, packed_len);
    pthread_mutex_lock(&g->cache_mu[slot % CACHE_LOCKS]);
    cached *c = &g->cache[slot];
    if (c->used && c->keys_epoch == keys_epoch && c->claims_len == claims->len &&
        memcmp(c->proof, proof, BW_GRANT_PROOF_BYTES) == 0 &&
        memcmp(c->claims, claims->data, claims->len) == 0 && strlen(c->job) < sizeof(h->job)) {
        found = true;
        memcpy(h->job, c->job, strlen(c->job) + 1);
        h->rank = c->rank;
        h->lease_tag = c->lease_tag;
        h->expires_ms = c->expires_ms;
        h->rev_epoch = c->rev_epoch;
        memcpy(h->dataset, c->dataset, sizeof(h->dataset));
        h->sources = c->sources;
        h->same_dataset =
            c->packed && c->packed_len == packed_len && memcmp(c->packed, packed, packed_len) == 0;
    }
    pthread_mutex_unlock(&g->cache_mu[slot % CACHE_LOCKS]);
    return found;
}

static void cache_put(bw_grants *g, const ProtobufCBinaryData *claims, const uint8_t *proof,
                      uint64_t keys_epoch, uint64_t rev_epoch, const Batchwire__V1__GrantClaims *m,
                      const uint8_t matched[BW_GRANT_HASH_BYTES], const uint8_t *packed,
                      size_t packed_len)
{
    uint8_t *cc = malloc(claims->len ? claims->len : 1);
    char *job = strdup(m->job);
    /* The dataset is kept so that a repeat compares it instead of hashing it again. */
    uint8_t *pk = packed_len <= DATASET_KEEP ? malloc(packed_len ? packed_len : 1) : NULL;
    if (!cc || !job) {
        free(cc);
        free(job);
        free(pk);
        return; /* not cached: verified again next time */
    }
    memcpy(cc, claims->data, claims->len);
    if (pk)
        memcpy(pk, packed, packed_len);
    size_t slot = slot_of(proof, packed, packed_len);
    pthread_mutex_lock(&g->cache_mu[slot % CACHE_LOCKS]);
    cached *c = &g->cache[slot];
    cached_clear(g, c);
    if (pk && __atomic_load_n(&g->kept, __ATOMIC_RELAXED) + packed_len > DATASETS_KEPT) {
        free(pk);
        pk = NULL;
    }
    c->used = true;
    c->keys_epoch = keys_epoch;
    c->rev_epoch = rev_epoch;
    memcpy(c->proof, proof, BW_GRANT_PROOF_BYTES);
    c->claims = cc;
    c->claims_len = claims->len;
    c->job = job;
    c->rank = m->rank;
    c->lease_tag = m->lease_tag;
    c->expires_ms = m->expires_ms;
    memcpy(c->dataset, matched, BW_GRANT_HASH_BYTES);
    c->sources = m->n_sources > 0;
    c->packed = pk;
    c->packed_len = pk ? packed_len : 0;
    __atomic_add_fetch(&g->kept, c->packed_len, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g->cache_mu[slot % CACHE_LOCKS]);
}

/* The checks that hold for a cached grant too: expiry and revocation. */
static int check_live(bw_grants *g, const char *job, uint32_t rank, uint64_t tag,
                      uint64_t expires_ms, uint64_t now_ms, char *err, size_t errlen)
{
    if (expires_ms + BW_GRANT_SKEW_MS < now_ms) {
        snprintf(err, errlen,
                 "the read grant of job '%s' rank %u expired %" PRIu64
                 " ms ago (a lease holder renews it with each lease heartbeat)",
                 shown(job), rank, now_ms - expires_ms);
        return BW_PERMISSION_DENIED;
    }
    if (is_revoked(g, job, rank, tag, now_ms)) {
        snprintf(err, errlen,
                 "the read grant of job '%s' rank %u belongs to a fenced lease (the rank was "
                 "taken over or released; this holder must stop)",
                 shown(job), rank);
        return BW_PERMISSION_DENIED;
    }
    return BW_OK;
}

static int wrong_dataset(const char *job, uint32_t rank, char *err, size_t errlen)
{
    snprintf(err, errlen,
             "the read grant of job '%s' rank %u is for that job's dataset (a mixture's: its "
             "sources), not this request's",
             shown(job), rank);
    return BW_PERMISSION_DENIED;
}

/* The whole check of a grant not in the cache; caches it when it holds. */
static int verify_full(bw_grants *g, const char *worker_id, const Batchwire__V1__ReadGrant *grant,
                       const uint8_t *packed, size_t plen, uint64_t keys_epoch, uint64_t now_ms,
                       char *err, size_t errlen)
{
    int rc = BW_OK;
    uint64_t rev_epoch = __atomic_load_n(&g->rev_epoch, __ATOMIC_ACQUIRE);
    Batchwire__V1__GrantClaims *m =
        batchwire__v1__grant_claims__unpack(NULL, grant->claims.len, grant->claims.data);
    bool hashes_ok = m && m->dataset.len == BW_GRANT_HASH_BYTES;
    for (size_t j = 0; hashes_ok && j < m->n_sources; j++)
        hashes_ok = m->sources[j].len == BW_GRANT_HASH_BYTES;
    if (!m || !m->job || !m->key_id || !hashes_ok) {
        snprintf(err, errlen, "the read grant's claims are not a GrantClaims message");
        rc = BW_PERMISSION_DENIED;
    }
    pthread_rwlock_rdlock(&g->lock);
    const key *k = rc == BW_OK ? key_by_id(g, m->key_id) : NULL;
    if (rc == BW_OK && !k) {
        bool printable = key_id_ok(m->key_id, strlen(m->key_id));
        snprintf(err, errlen,
                 "the read grant is signed with %s%s%s, which is not in this worker's "
                 "--grant-key (a coordinator with another key, or a key rotated out)",
                 printable ? "key '" : "an unknown key", printable ? m->key_id : "",
                 printable ? "'" : "");
        rc = BW_PERMISSION_DENIED;
    }
    if (rc == BW_OK)
        rc = check_live(g, m->job, m->rank, m->lease_tag, m->expires_ms, now_ms, err, errlen);
    if (rc == BW_OK) {
        uint8_t secret[BW_GRANT_SECRET_BYTES], proof[BW_GRANT_PROOF_BYTES];
        hmac(k, GRANT_LABEL, sizeof(GRANT_LABEL) - 1, grant->claims.data, grant->claims.len,
             secret);
        bw__grant_proof(secret, worker_id, proof);
        if (CRYPTO_memcmp(proof, grant->proof.data, BW_GRANT_PROOF_BYTES) != 0) {
            snprintf(err, errlen,
                     "the read grant's proof for job '%s' rank %u does not verify at worker "
                     "'%s' (made for another worker, or the claims were changed)",
                     shown(m->job), m->rank, worker_id);
            rc = BW_PERMISSION_DENIED;
        }
        OPENSSL_cleanse(secret, sizeof(secret));
    }
    pthread_rwlock_unlock(&g->lock);
    /* The request's dataset: the job's, or (a mixture's grant) one of its sources'. */
    uint8_t h[BW_GRANT_HASH_BYTES];
    const uint8_t *matched = NULL;
    if (rc == BW_OK && (rc = sha256(packed, plen, h)) == BW_OK) {
        if (CRYPTO_memcmp(h, m->dataset.data, sizeof(h)) == 0)
            matched = m->dataset.data;
        for (size_t j = 0; !matched && j < m->n_sources; j++)
            if (CRYPTO_memcmp(h, m->sources[j].data, sizeof(h)) == 0)
                matched = m->sources[j].data;
        if (!matched)
            rc = wrong_dataset(m->job, m->rank, err, errlen);
    }
    if (rc == BW_OK)
        cache_put(g, &grant->claims, grant->proof.data, keys_epoch, rev_epoch, m, matched, packed,
                  plen);
    if (m)
        batchwire__v1__grant_claims__free_unpacked(m, NULL);
    return rc;
}

int bw__grant_verify(bw_grants *g, const char *worker_id, const Batchwire__V1__ReadGrant *grant,
                     const Batchwire__V1__Dataset *dataset, uint64_t now_ms, char *err,
                     size_t errlen)
{
    if (!grant || !grant->claims.len) {
        snprintf(err, errlen,
                 "no read grant: with authentication on, a worker serves reads only to the holder "
                 "of a rank's lease, with the grant the coordinator gave it (docs/security.md, "
                 "\"Read grants\")");
        return BW_PERMISSION_DENIED;
    }
    if (grant->proof.len != BW_GRANT_PROOF_BYTES || grant->claims.len > BW_GRANT_CLAIMS_MAX ||
        !dataset) {
        snprintf(err, errlen,
                 "the read grant is malformed (claims of %zu bytes, at most %d; proof of %zu "
                 "bytes, %d expected)%s",
                 grant->claims.len, BW_GRANT_CLAIMS_MAX, grant->proof.len, BW_GRANT_PROOF_BYTES,
                 dataset ? "" : ", or the request names no dataset");
        return BW_PERMISSION_DENIED;
    }
    uint8_t buf[PACK_STACK];
    size_t plen = 0;
    uint8_t *packed = pack_dataset(dataset, buf, sizeof(buf), &plen);
    if (!packed) {
        snprintf(err, errlen, "out of memory checking the read grant");
        return BW_NOMEM;
    }
    uint64_t keys_epoch = __atomic_load_n(&g->keys_epoch, __ATOMIC_ACQUIRE);
    hit h;
    int rc;
    if (cache_get(g, &grant->claims, grant->proof.data, keys_epoch, packed, plen, &h)) {
        /* Verified before: what can change is the time, the revocations and the dataset. */
        rc = h.expires_ms + BW_GRANT_SKEW_MS < now_ms ||
                     h.rev_epoch != __atomic_load_n(&g->rev_epoch, __ATOMIC_ACQUIRE)
                 ? check_live(g, h.job, h.rank, h.lease_tag, h.expires_ms, now_ms, err, errlen)
                 : BW_OK;
        bool ok = h.same_dataset;
        if (rc == BW_OK && !ok && (rc = dataset_hashes_to(packed, plen, h.dataset, &ok)) == BW_OK &&
            !ok)
            /* a mixture's grant may name this dataset among its other sources */
            rc = h.sources ? verify_full(g, worker_id, grant, packed, plen, keys_epoch, now_ms, err,
                                         errlen)
                           : wrong_dataset(h.job, h.rank, err, errlen);
    } else {
        rc = verify_full(g, worker_id, grant, packed, plen, keys_epoch, now_ms, err, errlen);
    }
    if (packed != buf)
        free(packed);
    return rc;
}

/* ---- the coordinator's proof ---- */

static const char COORD_LABEL[] = "bw-coord-v1"; /* and its NUL */

static void coord_mac(const key *k, const char *worker_id, const char *expires, uint8_t out[32])
{
    /* label NUL id NUL expires: no two (id, expires) give the same bytes */
    size_t il = strlen(worker_id), el = strlen(expires);
    uint8_t *msg = malloc(il + 1 + el);
    if (!msg) {
        memset(out, 0xff, 32);
        return;
    }
    memcpy(msg, worker_id, il);
    msg[il] = 0;
    memcpy(msg + il + 1, expires, el);
    hmac(k, COORD_LABEL, sizeof(COORD_LABEL), msg, il + 1 + el, out);
    free(msg);
}

void bw__grant_coord_proof(bw_grants *g, const char *worker_id, uint64_t now_ms,
                           char out[BW_GRANT_COORD_PROOF_MAX])
{
    char expires[24];
    snprintf(expires, sizeof(expires), "%" PRIu64, now_ms + BW_GRANT_COORD_PROOF_MS);
    uint8_t mac[32];
    pthread_rwlock_rdlock(&g->lock);
    const key *k = &g->ring.keys[0];
    coord_mac(k, worker_id, expires, mac);
    int n = snprintf(out, BW_GRANT_COORD_PROOF_MAX, "%s.%s.", k->id, expires);
    pthread_rwlock_unlock(&g->lock);
    for (int i = 0; i < 32 && n > 0 && (size_t)n + 2 < BW_GRANT_COORD_PROOF_MAX; i++, n += 2)
        snprintf(out + n, 3, "%02x", mac[i]);
}

int bw__grant_coord_verify(bw_grants *g, const char *worker_id, const char *value, uint64_t now_ms,
                           char *err, size_t errlen)
{
    const char *dot1 = strchr(value, '.');
    const char *dot2 = dot1 ? strchr(dot1 + 1, '.') : NULL;
    char id[BW_GRANT_KEY_ID_MAX + 1], expires[24];
    size_t il = dot1 ? (size_t)(dot1 - value) : 0;
    size_t el = dot2 ? (size_t)(dot2 - dot1 - 1) : 0;
    uint8_t mac[32];
    bool ok =
        dot2 && key_id_ok(value, il) && el >= 1 && el < sizeof(expires) && strlen(dot2 + 1) == 64;
    for (size_t i = 0; ok && i < el; i++)
        ok = isdigit((unsigned char)dot1[1 + i]) != 0;
    for (int i = 0; ok && i < 32; i++) {
        int hi = hexval(dot2[1 + 2 * i]), lo = hexval(dot2[2 + 2 * i]);
        ok = hi >= 0 && lo >= 0;
        mac[i] = ok ? (uint8_t)(hi << 4 | lo) : 0;
    }
    if (!ok) {
        snprintf(err, errlen,
                 "the coordinator proof (%s) is malformed: expected KEYID.EXPIRES_MS.HEX",
                 BW_GRANT_COORD_HEADER);
        return BW_PERMISSION_DENIED;
    }
    memcpy(id, value, il);
    id[il] = 0;
    memcpy(expires, dot1 + 1, el);
    expires[el] = 0;
    uint64_t exp = strtoull(expires, NULL, 10);
    if (exp + BW_GRANT_SKEW_MS < now_ms ||
        exp > now_ms + BW_GRANT_COORD_PROOF_MS + BW_GRANT_SKEW_MS) {
        snprintf(err, errlen,
                 "the coordinator proof has expired or is dated too far ahead (expires %" PRIu64
                 ", now %" PRIu64 ")",
                 exp, now_ms);
        return BW_PERMISSION_DENIED;
    }
    int rc = BW_OK;
    pthread_rwlock_rdlock(&g->lock);
    const key *k = key_by_id(g, id);
    if (!k) {
        snprintf(err, errlen,
                 "the coordinator proof is signed with key '%s', which is not in this worker's "
                 "--grant-key",
                 id);
        rc = BW_PERMISSION_DENIED;
    } else {
        uint8_t want[32];
        coord_mac(k, worker_id, expires, want);
        if (CRYPTO_memcmp(want, mac, 32) != 0) {
            snprintf(err, errlen,
                     "the coordinator proof does not verify at worker '%s' (made for another "
                     "worker, or with another key)",
                     worker_id);
            rc = BW_PERMISSION_DENIED;
        }
    }
    pthread_rwlock_unlock(&g->lock);
    return rc;
}
