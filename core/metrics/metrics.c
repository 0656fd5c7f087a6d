/* The metrics registry and the text exposition format (metrics.h).
 *
 * Series values are atomics, so updating one takes no lock; a family's mutex guards only its
 * list of series (looked up and extended), and the registry's mutex its lists of families and
 * collectors and one scrape at a time. Lock order: registry, then whatever a collector takes,
 * then a family's. */
#include "metrics/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/text.h"
#include "common/util.h"

struct bw_series {
    const bw_metric *f;
    char **values;             /* copies, one per label */
    char *labels;              /* rendered: a="x",b="y" (escaped); "" without labels */
    _Atomic uint64_t v;        /* counter: the count; gauge: a double's bits */
    _Atomic uint64_t sum;      /* histogram: a double's bits */
    _Atomic uint64_t *buckets; /* histogram: observations per bucket, not cumulative; the
                                  last one is above every bound */
};

struct bw_metric {
    const bw_metric_def *def;
    size_t nlabels, index, max_series;
    bool collected; /* fed by collectors only */
    pthread_mutex_t mu;
    bw_series **series;
    size_t n, cap;
    bw_series *overflow;
};

typedef struct collector {
    bw_metrics_collect_fn fn;
    void *user;
    void (*release)(void *user);
} collector;

struct bw_metrics {
    pthread_mutex_t mu;
    bw_metric **families;
    size_t nfamilies, fcap;
    collector *collectors;
    size_t ncollectors, ccap;
};

/* What the collectors of one scrape emitted, per family. */
struct bw_metrics_sink {
    FILE **out; /* per family index, opened on first use */
    char **text;
    size_t *len;
    size_t n;
    bool failed;
};

/* ---- text ---- */

static bool name_ok(const char *s, bool metric)
{
    if (!s || !*s)
        return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool alpha =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (metric && c == ':');
        if (!alpha && !(p > s && c >= '0' && c <= '9'))
            return false;
    }
    return metric || strncmp(s, "__", 2) != 0;
}

/* A label value: backslash, double quote and line feed escaped; bytes that are not UTF-8
 * become U+FFFD (the format is UTF-8 and values may come from peers). */
static void put_value_text(FILE *o, const char *s)
{
    size_t n = strlen(s), bad = 0;
    while (n) {
        size_t good = bw__utf8_valid(s, n, &bad) ? n : bad;
        for (size_t i = 0; i < good; i++) {
            char c = s[i];
            if (c == '\\' || c == '"')
                fputc('\\', o), fputc(c, o);
            else if (c == '\n')
                fputs("\\n", o);
            else
                fputc(c, o);
        }
        if (good == n)
            break;
        fputs("\xef\xbf\xbd", o);
        s += good + 1;
        n -= good + 1;
    }
}

/* HELP text: backslash and line feed escaped. */
static void put_help(FILE *o, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", o);
        else if (*s == '\n')
            fputs("\\n", o);
        else
            fputc(*s, o);
    }
}

/* The shortest decimal that reads back as v; +Inf, -Inf and NaN as Prometheus writes them.
 * Returns buf (at least 32 bytes) or a constant. */
static const char *fmt_double(double v, char *buf, size_t len)
{
    if (isnan(v))
        return "NaN";
    if (isinf(v))
        return v > 0 ? "+Inf" : "-Inf";
    if (v == trunc(v) && fabs(v) < 1e15) { /* counts and bytes: digits, not 2e+04 */
        snprintf(buf, len, "%.0f", v);
        return buf;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

static void put_double(FILE *o, double v)
{
    char buf[40];
    fputs(fmt_double(v, buf, sizeof(buf)), o);
}

/* a="x",b="y" for the family's label names and `values`. */
static void put_labels(FILE *o, const bw_metric *f, const char *const *values)
{
    for (size_t i = 0; i < f->nlabels; i++) {
        fprintf(o, "%s%s=\"", i ? "," : "", f->def->labels[i]);
        put_value_text(o, values[i]);
        fputc('"', o);
    }
}

/* NAME{LABELS} or NAME when there are none; `extra` is appended inside the braces. */
static void put_name(FILE *o, const char *name, const char *suffix, const char *labels,
                     const char *extra)
{
    fprintf(o, "%s%s", name, suffix);
    if (labels[0] || extra) {
        fprintf(o, "{%s%s%s", labels, labels[0] && extra ? "," : "", extra ? extra : "");
        fputc('}', o);
    }
}

/* ---- values ---- */

static double bits_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof(d));
    return d;
}

static uint64_t double_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof(b));
    return b;
}

static void add_double(_Atomic uint64_t *a, double delta)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, double_bits(bits_double(old) + delta),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void bw__counter_add(bw_series *s, uint64_t n)
{
    if (s)
        atomic_fetch_add_explicit(&s->v, n, memory_order_relaxed);
}

void bw__gauge_set(bw_series *s, double v)
{
    if (s)
        atomic_store_explicit(&s->v, double_bits(v), memory_order_relaxed);
}

void bw__gauge_add(bw_series *s, double delta)
{
    if (s)
        add_double(&s->v, delta);
}

void bw__histogram_observe(bw_series *s, double v)
{
    if (!s || !s->buckets || isnan(v))
        return;
    const bw_metric_def *d = s->f->def;
    size_t i = 0;
    while (i < d->nbuckets && v > d->buckets[i])
        i++;
    atomic_fetch_add_explicit(&s->buckets[i], 1, memory_order_relaxed);
    add_double(&s->sum, v);
}

double bw__metrics_since(uint64_t t0_ns)
{
    uint64_t now = bw__mono_ns();
    return now > t0_ns ? (double)(now - t0_ns) * 1e-9 : 0.0;
}

/* ---- families and series ---- */

bw_metrics *bw__metrics_new(void)
{
    bw_metrics *m = calloc(1, sizeof(*m));
    if (m)
        pthread_mutex_init(&m->mu, NULL);
    return m;
}

static void series_free(bw_series *s)
{
    if (!s)
        return;
    for (size_t i = 0; s->values && i < s->f->nlabels; i++)
        free(s->values[i]);
    free(s->values);
    free(s->labels);
    free((void *)s->buckets);
    free(s);
}

void bw__metrics_free(bw_metrics *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nfamilies; i++) {
        bw_metric *f = m->families[i];
        for (size_t k = 0; k < f->n; k++)
            series_free(f->series[k]);
        series_free(f->overflow);
        free(f->series);
        pthread_mutex_destroy(&f->mu);
        free(f);
    }
    free(m->families);
    for (size_t i = 0; i < m->ncollectors; i++)
        if (m->collectors[i].release)
            m->collectors[i].release(m->collectors[i].user);
    free(m->collectors);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* A series of f with `values` copied; NULL when out of memory. */
static bw_series *series_new(const bw_metric *f, const char *const *values)
{
    bw_series *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->f = f;
    s->values = calloc(f->nlabels + 1, sizeof(*s->values));
    bool ok = s->values != NULL;
    for (size_t i = 0; ok && i < f->nlabels; i++)
        ok = (s->values[i] = strdup(values[i])) != NULL;
    if (ok && f->def->type == BW_HISTOGRAM)
        ok = (s->buckets = calloc(f->def->nbuckets + 1, sizeof(*s->buckets))) != NULL;
    size_t len = 0;
    FILE *o = ok ? open_memstream(&s->labels, &len) : NULL;
    if (o) {
        put_labels(o, f, (const char *const *)s->values);
        ok = fclose(o) == 0;
    }
    if (!ok || !o) {
        series_free(s);
        return NULL;
    }
    return s;
}

static bw_metric *add(bw_metrics *m, const bw_metric_def *def, bool collected)
{
    if (!m)
        return NULL;
    BW_INVARIANT(name_ok(def->name, true), "a metric name follows Prometheus's rules");
    BW_INVARIANT(def->help && def->help[0], "a metric has help text");
    BW_INVARIANT(def->type != BW_HISTOGRAM ||
                     (def->buckets && def->nbuckets > 0 && def->nbuckets <= BW_METRIC_MAX_BUCKETS),
                 "a histogram has buckets");
    for (size_t i = 1; def->type == BW_HISTOGRAM && i < def->nbuckets; i++)
        BW_INVARIANT(def->buckets[i - 1] < def->buckets[i], "histogram bounds increase");
    size_t nl = 0;
    while (nl < BW_METRIC_MAX_LABELS && def->labels[nl]) {
        BW_INVARIANT(name_ok(def->labels[nl], false), "a label name follows Prometheus's rules");
        BW_INVARIANT(def->type != BW_HISTOGRAM || strcmp(def->labels[nl], "le") != 0,
                     "a histogram has no label called le");
        nl++;
    }
    bw_metric *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    f->def = def;
    f->nlabels = nl;
    f->collected = collected;
    f->max_series = def->max_series ? def->max_series : BW_METRIC_MAX_SERIES;
    pthread_mutex_init(&f->mu, NULL);
    pthread_mutex_lock(&m->mu);
    bool ok = true;
    for (size_t i = 0; i < m->nfamilies; i++)
        BW_INVARIANT(strcmp(m->families[i]->def->name, def->name) != 0,
                     "a metric name is registered once");
    if (m->nfamilies == m->fcap) {
        size_t cap = m->fcap ? m->fcap * 2 : 32;
        bw_metric **nf = realloc(m->families, cap * sizeof(*nf));
        if (nf) {
            m->families = nf;
            m->fcap = cap;
        } else {
            ok = false;
        }
    }
    if (ok) {
        f->index = m->nfamilies;
        m->families[m->nfamilies++] = f;
    }
    pthread_mutex_unlock(&m->mu);
    if (!ok) {
        pthread_mutex_destroy(&f->mu);
        free(f);
        return NULL;
    }
    if (nl == 0 && !collected)
        bw__metric_series(f, NULL); /* shown from the start; out of memory: at first use */
    return f;
}

bw_metric *bw__metrics_add(bw_metrics *m, const bw_metric_def *def)
{
    return add(m, def, false);
}

bw_metric *bw__metrics_add_collected(bw_metrics *m, const bw_metric_def *def)
{
    BW_INVARIANT(def->type != BW_HISTOGRAM, "a collected family is a counter or a gauge");
    return add(m, def, true);
}

static bool same_values(const bw_metric *f, const bw_series *s, const char *const *values)
{
    for (size_t i = 0; i < f->nlabels; i++)
        if (strcmp(s->values[i], values[i]) != 0)
            return false;
    return true;
}

bw_series *bw__metric_series(bw_metric *f, const char *const *values)
{
    if (!f)
        return NULL;
    BW_INVARIANT(!f->collected, "a collected family has no series of its own");
    pthread_mutex_lock(&f->mu);
    bw_series *s = NULL;
    for (size_t i = 0; i < f->n && !s; i++)
        if (same_values(f, f->series[i], values))
            s = f->series[i];
    if (!s && f->n >= f->max_series) {
        if (!f->overflow) {
            const char *ov[BW_METRIC_MAX_LABELS];
            for (size_t i = 0; i < f->nlabels; i++)
                ov[i] = BW_METRIC_OVERFLOW;
            f->overflow = series_new(f, ov);
            BW_WARN("metrics: %s has %zu series, its limit: further label sets are counted with "
                    "every label \"" BW_METRIC_OVERFLOW "\"",
                    f->def->name, f->n);
        }
        s = f->overflow;
    }
    if (!s && f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        bw_series **ns = realloc(f->series, cap * sizeof(*ns));
        if (ns) {
            f->series = ns;
            f->cap = cap;
        }
    }
    if (!s && f->n < f->cap && (s = series_new(f, values)) != NULL)
        f->series[f->n++] = s;
    pthread_mutex_unlock(&f->mu);
    return s;
}

/* ---- collectors ---- */

int bw__metrics_add_collector(bw_metrics *m, bw_metrics_collect_fn fn, void *user,
                              void (*release)(void *user))
{
    if (!m)
        return BW_OK;
    int rc = BW_OK;
    pthread_mutex_lock(&m->mu);
    if (m->ncollectors == m->ccap) {
        size_t cap = m->ccap ? m->ccap * 2 : 8;
        collector *nc = realloc(m->collectors, cap * sizeof(*nc));
        if (nc) {
            m->collectors = nc;
            m->ccap = cap;
        }
    }
    if (m->ncollectors < m->ccap)
        m->collectors[m->ncollectors++] = (collector){fn, user, release};
    else
        rc = BW_NOMEM;
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void bw__metrics_emit(bw_metrics_sink *sink, bw_metric *f, const char *const *values, double v)
{
    if (!sink || !f || sink->failed)
        return;
    BW_INVARIANT(f->def->type != BW_HISTOGRAM && f->index < sink->n,
                 "a collector emits counters and gauges of its registry");
    FILE **o = &sink->out[f->index];
    if (!*o && !(*o = open_memstream(&sink->text[f->index], &sink->len[f->index]))) {
        sink->failed = true;
        return;
    }
    fputs(f->def->name, *o);
    if (f->nlabels) {
        fputc('{', *o);
        put_labels(*o, f, values);
        fputc('}', *o);
    }
    fputc(' ', *o);
    put_double(*o, v);
    fputc('\n', *o);
}

/* ---- exposition ---- */

static const char *type_name(bw_metric_type t)
{
    return t == BW_COUNTER ? "counter" : t == BW_GAUGE ? "gauge" : "histogram";
}

static void put_series(FILE *o, const bw_metric *f, const bw_series *s)
{
    const bw_metric_def *d = f->def;
    if (d->type == BW_COUNTER) {
        put_name(o, d->name, "", s->labels, NULL);
        fprintf(o, " %llu\n", (unsigned long long)atomic_load(&s->v));
        return;
    }
    if (d->type == BW_GAUGE) {
        put_name(o, d->name, "", s->labels, NULL);
        fputc(' ', o);
        put_double(o, bits_double(atomic_load(&s->v)));
        fputc('\n', o);
        return;
    }
    /* Buckets are read once, so that they, +Inf and _count agree (the sum may lag). */
    uint64_t cum = 0;
    char le[64];
    for (size_t i = 0; i <= d->nbuckets; i++) {
        cum += atomic_load(&s->buckets[i]);
        char num[40];
        snprintf(le, sizeof(le), "le=\"%s\"",
                 i < d->nbuckets ? fmt_double(d->buckets[i], num, sizeof(num)) : "+Inf");
        put_name(o, d->name, "_bucket", s->labels, le);
        fprintf(o, " %llu\n", (unsigned long long)cum);
    }
    put_name(o, d->name, "_sum", s->labels, NULL);
    fputc(' ', o);
    put_double(o, bits_double(atomic_load(&s->sum)));
    fputc('\n', o);
    put_name(o, d->name, "_count", s->labels, NULL);
    fprintf(o, " %llu\n", (unsigned long long)cum);
}

static void put_family(FILE *o, bw_metric *f, bw_metrics_sink *sink)
{
    fprintf(o, "# HELP %s ", f->def->name);
    put_help(o, f->def->help);
    fprintf(o, "\n# TYPE %s %s\n", f->def->name, type_name(f->def->type));
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->n; i++)
        put_series(o, f, f->series[i]);
    if (f->overflow)
        put_series(o, f, f->overflow);
    pthread_mutex_unlock(&f->mu);
    FILE **e = &sink->out[f->index];
    if (*e) {
        if (fclose(*e) != 0)
            sink->failed = true;
        *e = NULL;
        fwrite(sink->text[f->index], 1, sink->len[f->index], o);
    }
}

static void sink_free(bw_metrics_sink *sink)
{
    for (size_t i = 0; i < sink->n; i++) {
        if (sink->out && sink->out[i])
            fclose(sink->out[i]);
        if (sink->text)
            free(sink->text[i]);
    }
    free(sink->out);
    free(sink->text);
    free(sink->len);
}

int bw__metrics_render(bw_metrics *m, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    if (!m)
        return BW_OK;
    pthread_mutex_lock(&m->mu);
    bw_metrics_sink sink = {calloc(m->nfamilies + 1, sizeof(FILE *)),
                            calloc(m->nfamilies + 1, sizeof(char *)),
                            calloc(m->nfamilies + 1, sizeof(size_t)), m->nfamilies, false};
    char *buf = NULL;
    size_t blen = 0;
    FILE *o = sink.out && sink.text && sink.len ? open_memstream(&buf, &blen) : NULL;
    if (o) {
        for (size_t i = 0; i < m->ncollectors; i++)
            m->collectors[i].fn(m->collectors[i].user, &sink);
        for (size_t i = 0; i < m->nfamilies; i++)
            put_family(o, m->families[i], &sink);
    }
    pthread_mutex_unlock(&m->mu);
    bool ok = o && fclose(o) == 0 && !sink.failed;
    sink_free(&sink);
    if (!ok) {
        free(buf);
        return BW_NOMEM;
    }
    *text = buf;
    *len = blen;
    return BW_OK;
}
