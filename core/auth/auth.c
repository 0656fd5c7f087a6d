/* Principals, their credentials as the daemons check them, and the authorization table
 * (docs/security.md). Daemon-only (bwdaemon); a caller reads its own token with
 * token_file.c. */
#include "auth/auth.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "batchwire/batchwire.h"
#include "common/config.h"
#include "common/log.h"
#include "common/text.h"

enum { HASH_LEN = 32, MIN_TOKEN_LEN = 16, PATTERN_MAX = 1024 };

typedef struct entry {
    bw_role role;
    char name[BW_PRINCIPAL_NAME_MAX];
    bool has_token;
    unsigned char hash[HASH_LEN]; /* SHA-256 of the token */
    char *ids; /* a worker's ids= patterns, comma-separated (NULL: only the id NAME) */
} entry;

struct bw_auth {
    char *path;
    pthread_rwlock_t lock;
    entry *entries;
    size_t n;
};

/*
 * The authorization table: which roles may call each method. Health checks answer anyone;
 * object-level rules (a worker's own id, a job's owner) are checked by the handlers with
 * bw__auth_owns. docs/security.md has the same table for people.
 */
#define W BW_ROLE_WORKER
#define T BW_ROLE_TRAINER
#define A BW_ROLE_ADMIN
#define C BW_ROLE_COORDINATOR
static const unsigned allowed[BW_M__COUNT] = {
    [BW_M_HEALTH_CHECK] = W | T | A | C, /* and callers without credentials */
    [BW_M_COORDINATOR_INFO] = W | T | A,
    [BW_M_REGISTER_WORKER] = W | A,
    [BW_M_HEARTBEAT] = W | A,
    [BW_M_LIST_WORKERS] = T | A,
    [BW_M_WORKER_INFO] = W | T | A | C,
    /* The coordinator describes a job's dataset, proven by its grant key (role coordinator);
     * nobody else needs to list a worker's files. */
    [BW_M_DATA_DESCRIBE] = A | C,
    [BW_M_DATA_READ_SAMPLES] = T | A,
    [BW_M_DATA_READ_STREAM] = T | A,
    [BW_M_DATA_STATS] = T | A,
    [BW_M_PLACEMENT_GET] = W | T | A,
    [BW_M_JOBS_GET_OR_CREATE] = T | A,
    [BW_M_JOBS_JOIN] = T | A,
    [BW_M_JOBS_LEASE_HEARTBEAT] = T | A,
    [BW_M_JOBS_COMMIT_CURSOR] = T | A,
    [BW_M_JOBS_GET] = T | A,
    [BW_M_JOBS_LIST] = T | A,
    [BW_M_JOBS_RESUME_ELASTIC] = T | A,
    [BW_M_JOBS_LEAVE] = T | A,
    [BW_M_JOBS_DELETE] = T | A,
    /* The stream itself; each message on it is authorized again as the unary call it carries
     * (CommitCursor, LeaseHeartbeat: server/jobs_service.c). */
    [BW_M_JOBS_SESSION] = T | A,
};
#undef W
#undef T
#undef A
#undef C

bool bw__auth_allowed(bw_role role, bw_method_id method)
{
    if (role == BW_ROLE_OPEN)
        return true;
    if ((unsigned)method >= BW_M__COUNT)
        return false;
    if (role == BW_ROLE_NONE)
        return (allowed[method] & BW_ROLE_NONE) != 0 || method == BW_M_HEALTH_CHECK;
    return (allowed[method] & role) != 0;
}

const char *bw__role_name(bw_role role)
{
    switch (role) {
    case BW_ROLE_WORKER:
        return "worker";
    case BW_ROLE_TRAINER:
        return "trainer";
    case BW_ROLE_ADMIN:
        return "admin";
    case BW_ROLE_OPEN:
        return "open";
    case BW_ROLE_COORDINATOR:
        return "coordinator";
    default:
        return "none";
    }
}

static void sha256(const void *p, size_t n, unsigned char out[HASH_LEN])
{
    unsigned int len = HASH_LEN;
    if (!EVP_Digest(p, n, out, &len, EVP_sha256(), NULL))
        memset(out, 0, HASH_LEN); /* matches no real token's hash in practice; logged below */
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void free_entries(entry *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i].ids);
    free(v);
}

/* TOKEN (the token, sha256:HEX or -) into e->has_token and e->hash. */
static int parse_token(const char *token, const char *path, int lineno, entry *e, char *err,
                       size_t errlen)
{
    if (strcmp(token, "-") == 0)
        return BW_OK;
    e->has_token = true;
    if (strncmp(token, "sha256:", 7) == 0) {
        const char *hex = token + 7;
        if (strlen(hex) != 2 * HASH_LEN) {
            snprintf(err, errlen, "%s line %d: sha256: needs 64 hex digits (got %zu)", path, lineno,
                     strlen(hex));
            return BW_INVALID_ARGUMENT;
        }
        for (int i = 0; i < HASH_LEN; i++) {
            int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                snprintf(err, errlen, "%s line %d: sha256: holds a character that is not hex", path,
                         lineno);
                return BW_INVALID_ARGUMENT;
            }
            e->hash[i] = (unsigned char)(hi << 4 | lo);
        }
        return BW_OK;
    }
    if (strlen(token) < MIN_TOKEN_LEN) {
        snprintf(err, errlen,
                 "%s line %d: the token of '%s' has %zu characters; at least %d are required "
                 "(e.g. openssl rand -hex 32)",
                 path, lineno, e->name, strlen(token), MIN_TOKEN_LEN);
        return BW_INVALID_ARGUMENT;
    }
    sha256(token, strlen(token), e->hash);
    return BW_OK;
}

/* The fourth column of a worker line, "ids=PATTERN[,PATTERN...]", into e->ids. */
static int parse_ids(const char *col, const char *path, int lineno, entry *e, char *err,
                     size_t errlen)
{
    if (strncmp(col, "ids=", 4) != 0 || e->role != BW_ROLE_WORKER) {
        snprintf(err, errlen,
                 "%s line %d: unexpected fourth field '%.64s' (only a worker line takes one: "
                 "ids=PATTERN[,PATTERN...], the worker ids the principal may register)",
                 path, lineno, col);
        return BW_INVALID_ARGUMENT;
    }
    const char *list = col + 4;
    for (const char *p = list, *pat = list;; p++) {
        if ((*p == ',' || !*p) && p - pat >= PATTERN_MAX) {
            snprintf(err, errlen, "%s line %d: an ids= pattern is longer than %d bytes", path,
                     lineno, PATTERN_MAX - 1);
            return BW_INVALID_ARGUMENT;
        }
        if (*p == ',')
            pat = p + 1;
        /* Every pattern non-empty: "ids=", "ids=a,,b" and "ids=a," bind nothing by mistake. */
        if ((*p == ',' || !*p) && (p == list || p[-1] == ',')) {
            snprintf(err, errlen, "%s line %d: ids= holds an empty pattern (ids=PATTERN[,...])",
                     path, lineno);
            return BW_INVALID_ARGUMENT;
        }
        if (!*p)
            break;
        if ((unsigned char)*p < 0x21 || *p == 0x7f) {
            snprintf(err, errlen, "%s line %d: ids= holds a control character", path, lineno);
            return BW_INVALID_ARGUMENT;
        }
    }
    e->ids = strdup(list);
    if (!e->ids) {
        snprintf(err, errlen, "%s: out of memory", path);
        return BW_NOMEM;
    }
    return BW_OK;
}

/* One line "ROLE NAME TOKEN [ids=...]" into *e (e->ids malloc'd on success). */
static int parse_line(char *line, const char *path, int lineno, entry *e, char *err, size_t errlen)
{
    memset(e, 0, sizeof(*e)); /* e->ids NULL on every error: load() frees it */
    char *save = NULL;
    char *role = strtok_r(line, " \t", &save);
    char *name = strtok_r(NULL, " \t", &save);
    char *token = strtok_r(NULL, " \t", &save);
    char *ids = strtok_r(NULL, " \t", &save);
    char *extra = strtok_r(NULL, " \t", &save);
    if (!role || !name || !token || extra) {
        snprintf(err, errlen,
                 "%s line %d: expected ROLE NAME TOKEN [ids=PATTERN[,PATTERN...]] (ROLE worker, "
                 "trainer or admin; TOKEN the token, sha256:HEX, or - for a certificate-only "
                 "principal; ids= on worker lines only)",
                 path, lineno);
        return BW_INVALID_ARGUMENT;
    }
    if (strcmp(role, "worker") == 0)
        e->role = BW_ROLE_WORKER;
    else if (strcmp(role, "trainer") == 0)
        e->role = BW_ROLE_TRAINER;
    else if (strcmp(role, "admin") == 0)
        e->role = BW_ROLE_ADMIN;
    else {
        snprintf(err, errlen, "%s line %d: role '%.32s' is not worker, trainer or admin", path,
                 lineno, role);
        return BW_INVALID_ARGUMENT;
    }
    char why[160];
    if (bw__check_name("name", name, BW_PRINCIPAL_NAME_MAX - 1, why, sizeof(why)) != BW_OK) {
        snprintf(err, errlen, "%s line %d: %s", path, lineno, why);
        return BW_INVALID_ARGUMENT;
    }
    snprintf(e->name, sizeof(e->name), "%s", name);
    int rc = parse_token(token, path, lineno, e, err, errlen);
    if (rc == BW_OK && ids)
        rc = parse_ids(ids, path, lineno, e, err, errlen);
    return rc;
}

/* Reads and checks the whole file into a new table. */
static int load(const char *path, entry **out, size_t *nout, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(err, errlen, "--auth-tokens %s: %s", path, strerror(errno));
        return BW_IO;
    }
    bw__auth_warn_file_mode(fileno(f), "--auth-tokens", path, true);
    entry *v = NULL;
    size_t n = 0, cap = 0;
    int rc = BW_OK;
    char line[8192], *p = NULL;
    int lineno = 0;
    while (rc == BW_OK &&
           (rc = bw__config_line(f, line, sizeof(line), path, &lineno, &p, err, errlen)) == BW_OK) {
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            entry *nv = realloc(v, cap * sizeof(*v));
            if (!nv) {
                rc = BW_NOMEM;
                snprintf(err, errlen, "%s: out of memory", path);
                break;
            }
            v = nv;
        }
        rc = parse_line(p, path, lineno, &v[n], err, errlen);
        for (size_t i = 0; rc == BW_OK && i < n; i++) {
            if (strcmp(v[i].name, v[n].name) == 0) {
                snprintf(err, errlen, "%s line %d: principal '%s' is listed twice", path, lineno,
                         v[n].name);
                rc = BW_INVALID_ARGUMENT;
            } else if (v[i].has_token && v[n].has_token &&
                       CRYPTO_memcmp(v[i].hash, v[n].hash, HASH_LEN) == 0) {
                snprintf(err, errlen, "%s line %d: '%s' has the same token as '%s'", path, lineno,
                         v[n].name, v[i].name);
                rc = BW_INVALID_ARGUMENT;
            }
        }
        if (rc == BW_OK)
            n++;
        else { /* a duplicate after a good parse holds its ids; a bad line holds NULL */
            free(v[n].ids);
            v[n].ids = NULL;
        }
    }
    rc = rc == 1 ? BW_OK : rc; /* the end of the file */
    if (rc == BW_OK && ferror(f)) {
        snprintf(err, errlen, "--auth-tokens %s: read error", path);
        rc = BW_IO;
    }
    fclose(f);
    if (rc == BW_OK && n == 0) {
        snprintf(err, errlen, "--auth-tokens %s lists no principal (lines ROLE NAME TOKEN)", path);
        rc = BW_INVALID_ARGUMENT;
    }
    if (rc != BW_OK) {
        free_entries(v, n);
        return rc;
    }
    *out = v;
    *nout = n;
    return BW_OK;
}

int bw__auth_open(const char *tokens_path, bw_auth **out, char *err, size_t errlen)
{
    bw_auth *a = calloc(1, sizeof(*a));
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return BW_NOMEM;
    }
    pthread_rwlock_init(&a->lock, NULL);
    if (tokens_path) {
        a->path = strdup(tokens_path);
        int rc = a->path ? load(tokens_path, &a->entries, &a->n, err, errlen) : BW_NOMEM;
        if (rc != BW_OK) {
            bw__auth_free(a);
            return rc;
        }
    }
    *out = a;
    return BW_OK;
}

void bw__auth_free(bw_auth *a)
{
    if (!a)
        return;
    pthread_rwlock_destroy(&a->lock);
    free_entries(a->entries, a->n);
    free(a->path);
    free(a);
}

bool bw__auth_enabled(const bw_auth *a)
{
    return a && a->path;
}

int bw__auth_reload(bw_auth *a, size_t *count, char *err, size_t errlen)
{
    if (!bw__auth_enabled(a)) {
        snprintf(err, errlen, "no --auth-tokens file to reload");
        return BW_FAILED_PRECONDITION;
    }
    entry *v;
    size_t n;
    int rc = load(a->path, &v, &n, err, errlen);
    if (rc != BW_OK)
        return rc;
    pthread_rwlock_wrlock(&a->lock);
    entry *old = a->entries;
    size_t nold = a->n;
    a->entries = v;
    a->n = n;
    pthread_rwlock_unlock(&a->lock);
    free_entries(old, nold);
    *count = n;
    return BW_OK;
}

/* The principal whose token is `token`, or NULL. Every entry is compared, so the time taken
 * does not depend on which one matches. */
static const entry *by_token(const bw_auth *a, const char *token)
{
    unsigned char h[HASH_LEN];
    sha256(token, strlen(token), h);
    const entry *found = NULL;
    for (size_t i = 0; i < a->n; i++)
        if (a->entries[i].has_token && CRYPTO_memcmp(a->entries[i].hash, h, HASH_LEN) == 0)
            found = &a->entries[i];
    return found;
}

static const entry *by_name(const bw_auth *a, const char *name)
{
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->entries[i].name, name) == 0)
            return &a->entries[i];
    return NULL;
}

int bw__auth_check(bw_auth *a, bw_method_id method, const char *token, const char *cert_name,
                   bw_principal *who, char *err, size_t errlen)
{
    memset(who, 0, sizeof(*who));
    if (!bw__auth_enabled(a)) {
        who->role = BW_ROLE_OPEN;
        return BW_OK;
    }
    pthread_rwlock_rdlock(&a->lock);
    const entry *t = token && *token ? by_token(a, token) : NULL;
    const entry *c = cert_name && *cert_name ? by_name(a, cert_name) : NULL;
    int rc = BW_OK;
    if (token && *token && !t) {
        snprintf(err, errlen, "the bearer token is not valid (not in the server's --auth-tokens)");
        rc = BW_UNAUTHENTICATED;
    } else if (t && c && t != c) {
        snprintf(err, errlen,
                 "the bearer token is principal '%s' but the client certificate is '%s'", t->name,
                 c->name);
        rc = BW_UNAUTHENTICATED;
    } else if (!t && !c) {
        if (cert_name && *cert_name)
            snprintf(err, errlen,
                     "the client certificate's common name '%.200s' is no principal of the "
                     "server's --auth-tokens, and no bearer token was sent",
                     cert_name);
        else
            snprintf(err, errlen,
                     "no credentials: send a bearer token (--token-file) or a client "
                     "certificate");
        rc = method == BW_M_HEALTH_CHECK ? BW_OK : BW_UNAUTHENTICATED;
    } else {
        const entry *e = t ? t : c;
        who->role = e->role;
        snprintf(who->name, sizeof(who->name), "%s", e->name);
    }
    pthread_rwlock_unlock(&a->lock);
    if (rc == BW_OK && !bw__auth_allowed(who->role, method)) {
        snprintf(err, errlen, "principal '%s' (role %s) may not call %s", who->name,
                 bw__role_name(who->role), bw__methods[method].name);
        rc = BW_PERMISSION_DENIED;
    }
    return rc;
}

/* Whether `id` matches one of the comma-separated fnmatch patterns of `ids`. */
static bool ids_match(const char *ids, const char *id)
{
    char pat[PATTERN_MAX]; /* parse_ids checked the length */
    for (const char *p = ids; *p;) {
        size_t len = strcspn(p, ",");
        if (len < sizeof(pat)) {
            memcpy(pat, p, len);
            pat[len] = 0;
            if (fnmatch(pat, id, 0) == 0)
                return true;
        }
        p += len + (p[len] == ',');
    }
    return false;
}

int bw__auth_worker_id(bw_auth *a, const bw_principal *who, const char *id, char *err,
                       size_t errlen)
{
    if (!bw__auth_enabled(a) || who->role == BW_ROLE_OPEN || who->role == BW_ROLE_ADMIN)
        return BW_OK;
    pthread_rwlock_rdlock(&a->lock);
    const entry *e = who->role == BW_ROLE_WORKER ? by_name(a, who->name) : NULL;
    bool ok = e && e->role == BW_ROLE_WORKER &&
              (e->ids ? ids_match(e->ids, id) : strcmp(e->name, id) == 0);
    if (!ok && e && e->ids)
        snprintf(err, errlen,
                 "worker principal '%s' may not register worker id '%.255s': its ids=%.200s do "
                 "not match it (widen ids= of principal '%s' in --auth-tokens and SIGHUP the "
                 "coordinator, or start the worker with --id matching them)",
                 who->name, id, e->ids, who->name);
    else if (!ok && e)
        snprintf(err, errlen,
                 "worker principal '%s' may not register worker id '%.255s': without ids= a "
                 "worker principal registers only the id equal to its name; add ids=PATTERN to "
                 "principal '%s' in --auth-tokens (e.g. ids=%.200s) and SIGHUP the coordinator, "
                 "or start the worker with --id %s",
                 who->name, id, who->name, id, who->name);
    else if (!ok)
        snprintf(err, errlen,
                 "principal '%s' (role %s) is no worker principal of --auth-tokens (any more) "
                 "and may not register worker id '%.255s'",
                 who->name, bw__role_name(who->role), id);
    pthread_rwlock_unlock(&a->lock);
    return ok ? BW_OK : BW_PERMISSION_DENIED;
}

bool bw__auth_owns(const bw_principal *who, const char *owner)
{
    if (who->role == BW_ROLE_OPEN || who->role == BW_ROLE_ADMIN)
        return true;
    if (!owner || !*owner)
        return true;
    return strcmp(who->name, owner) == 0;
}
