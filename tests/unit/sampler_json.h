/*
 * A tiny JSON reader for the sampler's test vectors (JSON Lines). Header-only, test use
 * only: integers are kept as 64-bit two's complement (seeds reach 2**64-1 and go negative),
 * strings are not unescaped beyond \" and \\ (the vectors need no more).
 */
#ifndef BW_TESTS_SAMPLER_JSON_H
#define BW_TESTS_SAMPLER_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SJ_NULL, SJ_BOOL, SJ_INT, SJ_STR, SJ_ARR, SJ_OBJ };

typedef struct sj {
    int type;
    bool b;
    uint64_t u; /* SJ_INT: value as two's complement */
    bool neg;
    char *s; /* SJ_STR */
    size_t n;
    struct sj *items; /* SJ_ARR, SJ_OBJ (values) */
    char **keys;      /* SJ_OBJ */
} sj;

static inline void sj_free_in(sj *v)
{
    if (v->type == SJ_ARR || v->type == SJ_OBJ) {
        for (size_t i = 0; i < v->n; i++) {
            sj_free_in(&v->items[i]);
            if (v->keys)
                free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
    }
    if (v->type == SJ_STR)
        free(v->s);
}

static inline void sj_ws(const char **p)
{
    while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r')
        (*p)++;
}

static inline char *sj_str(const char **p)
{
    const char *q = ++*p;
    size_t cap = 16, len = 0;
    char *out = malloc(cap);
    if (!out)
        abort(); /* a test helper: out of memory ends the test */
    while (*q && *q != '"') {
        char c = *q++;
        if (c == '\\' && *q)
            c = *q++;
        if (len + 2 > cap) {
            char *more = realloc(out, cap *= 2);
            if (!more)
                abort();
            out = more;
        }
        out[len++] = c;
    }
    out[len] = 0;
    *p = *q ? q + 1 : q;
    return out;
}

static inline bool sj_val(const char **p, sj *v)
{
    memset(v, 0, sizeof(*v));
    sj_ws(p);
    const char *q = *p;
    if (*q == '{' || *q == '[') {
        bool obj = *q == '{';
        char close = obj ? '}' : ']';
        size_t cap = 0;
        v->type = obj ? SJ_OBJ : SJ_ARR;
        q++;
        sj_ws(&q);
        if (*q == close) {
            *p = q + 1;
            return true;
        }
        for (;;) {
            if (v->n == cap) {
                cap = cap ? 2 * cap : 8;
                v->items = realloc(v->items, cap * sizeof(sj));
                if (obj)
                    v->keys = realloc(v->keys, cap * sizeof(char *));
            }
            sj_ws(&q);
            if (obj) {
                if (*q != '"')
                    return false;
                v->keys[v->n] = sj_str(&q);
                sj_ws(&q);
                if (*q++ != ':')
                    return false;
            }
            if (!sj_val(&q, &v->items[v->n]))
                return false;
            v->n++;
            sj_ws(&q);
            if (*q == ',') {
                q++;
                continue;
            }
            if (*q != close)
                return false;
            *p = q + 1;
            return true;
        }
    }
    if (*q == '"') {
        v->type = SJ_STR;
        v->s = sj_str(&q);
        *p = q;
        return true;
    }
    if (!strncmp(q, "true", 4) || !strncmp(q, "false", 5)) {
        v->type = SJ_BOOL;
        v->b = *q == 't';
        *p = q + (v->b ? 4 : 5);
        return true;
    }
    if (!strncmp(q, "null", 4)) {
        v->type = SJ_NULL;
        *p = q + 4;
        return true;
    }
    if (*q == '-' || (*q >= '0' && *q <= '9')) {
        v->type = SJ_INT;
        v->neg = *q == '-';
        if (v->neg)
            q++;
        uint64_t x = 0;
        while (*q >= '0' && *q <= '9')
            x = x * 10 + (uint64_t)(*q++ - '0');
        v->u = v->neg ? (uint64_t)0 - x : x;
        *p = q;
        return true;
    }
    return false;
}

/* Parses one JSON text; returns NULL on malformed input. Free with sj_free. */
static inline sj *sj_parse(const char *text)
{
    sj *v = malloc(sizeof(*v));
    const char *p = text;
    if (!sj_val(&p, v)) {
        sj_free_in(v);
        free(v);
        return NULL;
    }
    return v;
}

static inline void sj_free(sj *v)
{
    if (v) {
        sj_free_in(v);
        free(v);
    }
}

/* Member `key` of an object, or NULL. */
static inline const sj *sj_get(const sj *o, const char *key)
{
    if (!o || o->type != SJ_OBJ)
        return NULL;
    for (size_t i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key))
            return &o->items[i];
    return NULL;
}

static inline uint64_t sj_u64(const sj *o, const char *key)
{
    const sj *v = sj_get(o, key);
    return (v && v->type == SJ_INT) ? v->u : 0;
}

static inline bool sj_bool(const sj *o, const char *key)
{
    const sj *v = sj_get(o, key);
    return v && v->type == SJ_BOOL && v->b;
}

static inline const char *sj_string(const sj *o, const char *key)
{
    const sj *v = sj_get(o, key);
    return (v && v->type == SJ_STR) ? v->s : NULL;
}

/* Reads a whole file (NUL-terminated); NULL if it cannot be read. */
static inline char *sj_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    size_t got = fread(buf, 1, (size_t)sz, f);
    fclose(f);
    buf[got] = 0;
    if (len)
        *len = got;
    return buf;
}

/* Calls fn(record, user) for each line of a JSON Lines file; returns the record count, or
 * -1 if the file cannot be read or a line does not parse. */
static inline long sj_each_line(const char *path, void (*fn)(const sj *, void *), void *user)
{
    char *buf = sj_slurp(path, NULL);
    if (!buf)
        return -1;
    long count = 0;
    char *line = buf;
    while (*line) {
        char *end = strchr(line, '\n');
        if (end)
            *end = 0;
        if (*line) {
            sj *rec = sj_parse(line);
            if (!rec) {
                free(buf);
                return -1;
            }
            fn(rec, user);
            sj_free(rec);
            count++;
        }
        if (!end)
            break;
        line = end + 1;
    }
    free(buf);
    return count;
}

#endif
