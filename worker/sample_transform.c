/* A read's transform on the worker (sample_transform.h; docs/transforms.md, "On the
 * workers"). */
#include "sample_transform.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/json.h"
#include "common/util.h"

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t scratch_key;
static uint64_t max_pixels; /* set before any transform runs (bw__stf_set_max_pixels) */

static void scratch_free(void *p)
{
    bw__tf_scratch_free(p);
}

static void make_key(void)
{
    /* pthread_key_create fails only when the process is out of keys (PTHREAD_KEYS_MAX):
     * nothing else in batchwire creates any, so this does not happen. */
    (void)pthread_key_create(&scratch_key, scratch_free);
}

void bw__stf_set_max_pixels(uint64_t n)
{
    max_pixels = n;
}

bw__tf_scratch *bw__stf_thread_scratch(void)
{
    pthread_once(&key_once, make_key);
    bw__tf_scratch *s = pthread_getspecific(scratch_key);
    if (!s && (s = bw__tf_scratch_new(max_pixels)) != NULL &&
        pthread_setspecific(scratch_key, s) != 0) {
        bw__tf_scratch_free(s);
        s = NULL;
    }
    return s;
}

int bw__stf_parse(const Batchwire__V1__Transform *t, const bw__layout *in, bw__stf *out, char *err,
                  size_t errlen)
{
    char why[512];
    memset(out, 0, sizeof(*out));
    bool field = t->field && t->field[0];
    /* Token ops with a field read a JSON Lines field's arrays as int64 (docs/transforms.md,
     * "JSON Lines fields"), without one the rows of an npy dataset. */
    if (bw__tf_parse(t->spec ? t->spec : "", &out->spec, why, sizeof(why)) != BW_OK ||
        (!bw__tf_is_tokens(&out->spec)
             ? bw__tf_output_shape(&out->spec, &out->shape, why, sizeof(why))
         : field ? bw__tf_tokens_json_shape(&out->spec, &out->shape, why, sizeof(why))
                 : bw__tf_tokens_shape(&out->spec, in->dtype, in->shape, (size_t)in->ndim,
                                       &out->shape, why, sizeof(why))) != BW_OK) {
        snprintf(err, errlen, "transform '%.200s': %s", t->spec ? t->spec : "", why);
        return BW_INVALID_ARGUMENT;
    }
    const char *f = t->field ? t->field : "";
    if (strlen(f) >= sizeof(out->field)) {
        snprintf(err, errlen, "transform field '%.80s...': longer than %zu bytes", f,
                 sizeof(out->field) - 1);
        return BW_INVALID_ARGUMENT;
    }
    snprintf(out->field, sizeof(out->field), "%s", f);
    out->seed = t->seed;
    out->epoch = t->epoch;
    return BW_OK;
}

/* The part of r the transform reads: the member named t->field, or the whole sample (its
 * parts joined into *joined when there are several; freed by the caller). */
static int input_of(const bw__stf *t, const bw__record *r, size_t *part, const uint8_t **in,
                    size_t *len, uint8_t **joined, char *why, size_t whylen)
{
    *joined = NULL;
    if (t->field[0]) {
        if (r->owner_is_own) { /* a record of a file mapped for it alone: not a tar sample */
            snprintf(why, whylen, "has no members ('%s' is for tar samples)", t->field);
            return BW_INVALID_ARGUMENT;
        }
        for (size_t i = 0; r->has_names && i < r->nparts; i++)
            if (strcmp(r->text + r->names[i], t->field) == 0) {
                *part = i;
                *in = r->parts[i].p;
                *len = r->parts[i].len;
                return BW_OK;
            }
        size_t o = 0;
        char have[256] = "";
        for (size_t i = 0; r->has_names && i < r->nparts && o < sizeof(have); i++)
            o += (size_t)snprintf(have + o, sizeof(have) - o, "%s%s", i ? ", " : "",
                                  r->text + r->names[i]);
        snprintf(why, whylen, "has no member '%s' to transform (its members: %s)", t->field,
                 have[0] ? have : "none");
        return BW_NOT_FOUND;
    }
    *part = 0;
    if (r->nparts == 1) {
        *in = r->parts[0].p;
        *len = r->parts[0].len;
        return BW_OK;
    }
    uint8_t *buf = malloc(r->size ? r->size : 1);
    if (!buf) {
        snprintf(why, whylen, "out of memory joining its %llu bytes", (unsigned long long)r->size);
        return BW_NOMEM;
    }
    size_t at = 0;
    for (size_t i = 0; i < r->nparts; i++) {
        memcpy(buf + at, r->parts[i].p, r->parts[i].len);
        at += r->parts[i].len;
    }
    *joined = buf;
    *in = buf;
    *len = at;
    return BW_OK;
}

/* A JSON Lines sample's top-level keys (bw__json_keys, the scanner bw_batch_fields uses too),
 * and where the transformed one's value lies. */
typedef struct json_keys {
    const char *want;
    size_t n;
    bool over; /* more keys than a record has parts for */
    bool found;
    size_t off, len; /* the wanted key's value (its first occurrence) */
    struct {
        const char *name;
        size_t nl, off, len;
    } k[BW_FMT_MAX_FIELDS];
} json_keys;

static int json_key(void *arg, const char *name, size_t nl, size_t off, size_t len)
{
    json_keys *j = arg;
    if (!j->found && strlen(j->want) == nl && memcmp(j->want, name, nl) == 0) {
        j->found = true;
        j->off = off;
        j->len = len;
    }
    if (j->n == BW_FMT_MAX_FIELDS) {
        j->over = true;
        return BW_OK;
    }
    j->k[j->n].name = name;
    j->k[j->n].nl = nl;
    j->k[j->n].off = off;
    j->k[j->n].len = len;
    j->n++;
    return BW_OK;
}

/* Finds t->field among the keys of JSON Lines record r into *j and runs the transform on its
 * value (docs/transforms.md, "JSON Lines fields"): an image pipeline on the bytes of a base64
 * string, a token pipeline on an array of integers. The result in out (t->shape.bytes). */
static int json_field_run(const bw__stf *t, bw__tf_scratch *s, const bw__tf_key *key,
                          const bw__record *r, json_keys *j, uint8_t *out, char *why, size_t whylen)
{
    const uint8_t *line = r->nparts ? r->parts[0].p : (const uint8_t *)"";
    size_t n = r->nparts ? r->parts[0].len : 0, at = 0;
    memset(j, 0, sizeof(*j));
    j->want = t->field;
    int rc = bw__json_keys(line, n, json_key, j, &at);
    if (rc != BW_OK) {
        snprintf(why, whylen, "the line is not a JSON object (at byte %zu of %zu)", at, n);
        return BW_CORRUPT;
    }
    if (!j->found) {
        size_t o = 0;
        char have[256] = "";
        for (size_t i = 0; i < j->n && o < sizeof(have); i++)
            o += (size_t)snprintf(have + o, sizeof(have) - o, "%s%.*s", i ? ", " : "",
                                  (int)j->k[i].nl, j->k[i].name);
        snprintf(why, whylen, "the line has no key '%s' (its keys: %s)", t->field,
                 have[0] ? have : "none");
        return BW_NOT_FOUND;
    }
    const uint8_t *v = line + j->off;
    if (bw__tf_is_tokens(&t->spec))
        return bw__tf_tokens_json_run(&t->spec, &t->shape, v, j->len, out, t->shape.bytes, why,
                                      whylen);
    uint8_t *img = malloc(bw__tf_base64_cap(j->len));
    size_t len = 0;
    if (!img) {
        snprintf(why, whylen, "out of memory decoding its %zu bytes of base64", j->len);
        return BW_NOMEM;
    }
    rc = bw__tf_json_base64(v, j->len, img, &len, why, whylen);
    bw__tf_result res;
    if (rc == BW_OK)
        rc = bw__tf_run(&t->spec, s, key, img, len, out, t->shape.bytes, &res, why, whylen);
    free(img);
    return rc;
}

/* JSON Lines record r becomes its keys as fields (for a field table, field_table.h): each
 * key's value as its JSON text, in the line's order, the transformed key's replaced by the
 * result m (which r then owns). BW_OK, or BW_TOO_BIG when the names do not fit. */
static int json_members(bw__record *r, const json_keys *j, bw__mapping *m, char *why, size_t whylen)
{
    size_t need = 1;
    for (size_t i = 0; i < j->n; i++)
        need += j->k[i].nl + 1;
    if (j->over || need > sizeof(r->text)) {
        snprintf(why, whylen,
                 "the line's keys (%s%zu, %zu bytes of names) are more than a sample's fields "
                 "may be (%d, %zu bytes)",
                 j->over ? "more than " : "", j->n, need, BW_FMT_MAX_FIELDS, sizeof(r->text));
        return BW_TOO_BIG;
    }
    const uint8_t *line = r->parts[0].p;
    bw__mapping *map = r->owner;
    r->key = 0; /* no sample key: the table's sentences name the sample by its index */
    r->text[0] = '\0';
    r->textlen = 1;
    r->size = 0;
    for (size_t i = 0; i < j->n; i++) {
        bool mine = j->k[i].off == j->off;
        r->names[i] = r->textlen;
        memcpy(r->text + r->textlen, j->k[i].name, j->k[i].nl);
        r->text[r->textlen + j->k[i].nl] = '\0';
        r->textlen += (uint32_t)j->k[i].nl + 1;
        r->parts[i].p = mine ? m->base : line + j->k[i].off;
        r->parts[i].len = mine ? m->len : j->k[i].len;
        r->owners[i] = mine ? m : map;
        r->size += r->parts[i].len;
    }
    /* The other values stay in the dataset's mapping, which the open read holds (a jsonl
     * record owns none), the result in its own (bw__record_release unrefs r->owner). */
    r->nparts = j->n;
    r->has_names = true;
    r->per_part_owner = true;
    r->owner = m;
    r->owner_is_own = true;
    return BW_OK;
}

int bw__stf_apply(const bw__stf *t, const bw__dataset *d, size_t src, uint64_t index, bool members,
                  bw__record *r, char *err, size_t errlen)
{
    char why[768];
    const uint8_t *in = NULL;
    size_t len = 0, part = 0;
    uint8_t *joined = NULL, *out = NULL;
    bw__tf_scratch *s = bw__stf_thread_scratch();
    bool jsonl = t->field[0] && d->ops == &bw__fmt_jsonl;
    json_keys *keys = jsonl ? malloc(sizeof(*keys)) : NULL;
    int rc = !s || (jsonl && !keys) ? BW_NOMEM
             : jsonl                ? BW_OK
                                    : input_of(t, r, &part, &in, &len, &joined, why, sizeof(why));
    if (!s || (jsonl && !keys))
        snprintf(why, sizeof(why), "out of memory for a transform scratch");
    if (rc == BW_OK && !(out = malloc(t->shape.bytes))) {
        snprintf(why, sizeof(why), "out of memory for its %zu-byte result", t->shape.bytes);
        rc = BW_NOMEM;
    }
    bw__tf_key key = {t->seed, t->epoch, src, index};
    bw__tf_result res;
    if (rc == BW_OK && jsonl)
        rc = json_field_run(t, s, &key, r, keys, out, why, sizeof(why));
    else if (rc == BW_OK && bw__tf_is_tokens(&t->spec))
        rc = bw__tf_tokens_run(&t->spec, &t->shape, in, len, out, t->shape.bytes, why, sizeof(why));
    else if (rc == BW_OK)
        rc = bw__tf_run(&t->spec, s, &key, in, len, out, t->shape.bytes, &res, why, sizeof(why));
    free(joined);
    bw__mapping *m = NULL;
    if (rc != BW_OK)
        free(out);
    else if (!(m = bw__mapping_wrap(out, t->shape.bytes))) { /* it freed out */
        snprintf(why, sizeof(why), "out of memory");
        rc = BW_NOMEM;
    }
    if (rc == BW_OK && jsonl && members)
        rc = json_members(r, keys, m, why, sizeof(why));
    if (rc != BW_OK) /* json_members failed: r is unchanged, m not taken */
        bw__mapping_unref(m);
    free(keys);
    if (rc != BW_OK) {
        snprintf(err, errlen, "source %zu '%s' sample %llu%s%s%s: %s", src, d->sources[src]->path,
                 (unsigned long long)index,
                 !t->field[0] ? ""
                 : jsonl      ? " field '"
                              : " member ",
                 t->field, jsonl ? "'" : "", why);
        return rc;
    }
    if (!t->field[0] || !members) {
        bw__record_release(r);
        bw__record_init(r);
        bw__record_own(r, m);
        return BW_OK;
    }
    if (jsonl)
        return BW_OK; /* json_members made its fields */
    /* One member replaced: the others stay in the dataset's mapping, which the open read
     * holds (tar records own none), the result in its own, which the record now owns
     * (bw__record_release unrefs r->owner). */
    if (!r->per_part_owner)
        for (size_t i = 0; i < r->nparts; i++)
            r->owners[i] = r->owner;
    r->per_part_owner = true;
    r->size = r->size - r->parts[part].len + m->len;
    r->parts[part].p = m->base;
    r->parts[part].len = m->len;
    r->owners[part] = m;
    r->owner = m;
    r->owner_is_own = true;
    return BW_OK;
}

void bw__stf_principal(bw__stf *t, const uint8_t *claims, size_t claims_len, const char *peer)
{
    if (claims && claims_len) {
        Batchwire__V1__GrantClaims *c =
            batchwire__v1__grant_claims__unpack(NULL, claims_len, claims);
        bool named = c && c->job && c->job[0];
        if (named)
            snprintf(t->who, sizeof(t->who), "job:%s", c->job);
        batchwire__v1__grant_claims__free_unpacked(c, NULL);
        if (named)
            return;
    }
    /* gRPC's "ipv4:10.0.0.7:41234" / "ipv6:[::1]:41234" and the data channel's
     * "10.0.0.7:41234" name one host alike: "peer:10.0.0.7". */
    const char *h = peer ? peer : "";
    if (strncmp(h, "ipv4:", 5) == 0 || strncmp(h, "ipv6:", 5) == 0)
        h += 5;
    size_t n = strlen(h);
    const char *colon = strrchr(h, ':');
    if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1))
        n = (size_t)(colon - h);
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
        h++;
        n -= 2;
    }
    snprintf(t->who, sizeof(t->who), "peer:%.*s", (int)n, h);
}

size_t bw__stf_window(const bw__tfpool *pool, size_t n)
{
    size_t w = 2 * (size_t)(bw__tfpool_threads(pool) > 0 ? bw__tfpool_threads(pool) : 1);
    if (w > 64)
        w = 64;
    if (w > n)
        w = n;
    return w ? w : 1;
}

typedef struct window_job {
    const bw__stf *t;
    const bw__dataset *d;
    bool members;
    bw__rp_rec *recs;
    const size_t *srcs;
    int *rcs;
    char (*errs)[BW_STF_ERR_MAX];
    bw__wm *m;
} window_job;

static void run_one(void *arg, size_t i)
{
    window_job *j = arg;
    uint64_t t0 = bw__mono_ns();
    j->rcs[i] = bw__stf_apply(j->t, j->d, j->srcs[i], j->recs[i].key, j->members, &j->recs[i].rec,
                              j->errs[i], BW_STF_ERR_MAX);
    bw__wm_transformed(j->m, t0, j->rcs[i]);
}

void bw__stf_run_window(const bw__stf *t, bw__tfpool *pool, const bw__dataset *d, bool members,
                        bw__rp_rec *recs, const size_t *srcs, int *rcs,
                        char (*errs)[BW_STF_ERR_MAX], size_t n, bw__wm *m)
{
    window_job j = {t, d, members, recs, srcs, rcs, errs, m};
    bw__tfpool_run(pool, t->who, run_one, &j, n);
}
