/*
 * Prometheus metrics for the daemons (docs/operating.md, "Metrics"): a registry of metric
 * families -- counters, gauges and histograms with fixed buckets, each with up to
 * BW_METRIC_MAX_LABELS label names -- rendered in the Prometheus text exposition format
 * (version 0.0.4) and served over HTTP by bw__metrics_http_start (libmicrohttpd).
 *
 * A family is fed in one of two ways:
 *   - series: bw__metric_series returns the series of one set of label values, created on
 *     first use and kept as long as the registry. Updating a series takes no lock (atomics),
 *     so a hot path looks its series up once and then only adds to it.
 *   - collectors: functions called at each scrape that emit samples from state the daemon
 *     keeps anyway (worker tables, jobs, budgets), so such series exist exactly as long as
 *     what they describe and nothing is counted twice.
 *
 * Every function accepts NULL for the registry, a family or a series and then does nothing:
 * a daemon with metrics off passes NULL around and pays one branch per hook.
 *
 * Thread safety: every function may be called from any thread at any time, except
 * bw__metrics_free (nothing may use the registry during or after it).
 */
#ifndef BW_METRICS_METRICS_H
#define BW_METRICS_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct bw_metrics bw_metrics;
typedef struct bw_metric bw_metric; /* a family: one name, type, help and label names */
typedef struct bw_series bw_series; /* one set of label values of a family */
typedef struct bw_metrics_sink bw_metrics_sink;

typedef enum bw_metric_type { BW_COUNTER, BW_GAUGE, BW_HISTOGRAM } bw_metric_type;

enum {
    BW_METRIC_MAX_LABELS = 4,
    BW_METRIC_MAX_BUCKETS = 32,
    BW_METRIC_MAX_SERIES = 1000, /* series per family unless the definition says otherwise */
};

/* The label value every label of a family's overflow series has: once a family holds
 * max_series series, new label sets are counted there (and a warning is logged once). */
#define BW_METRIC_OVERFLOW "overflow"

typedef struct bw_metric_def {
    const char *name; /* e.g. "batchwire_worker_bytes_served_total": [a-zA-Z_:][a-zA-Z0-9_:]* */
    const char *help; /* one line for people */
    bw_metric_type type;
    const char *labels[BW_METRIC_MAX_LABELS + 1]; /* label names, NULL after the last */
    const double *buckets; /* histograms: upper bounds, increasing; +Inf is implied */
    size_t nbuckets;
    size_t max_series; /* 0: BW_METRIC_MAX_SERIES */
} bw_metric_def;

/* A counter or gauge definition with the label names given (NULL for none) and the default
 * series bound: BW_METRIC_DEF("x_total", BW_COUNTER, "What it counts", "a", "b"). */
#define BW_METRIC_DEF(name, type, help, ...)                                                       \
    {                                                                                              \
        name, help, type, {__VA_ARGS__}, NULL, 0, 0                                                \
    }

/* A new, empty registry; NULL when out of memory. */
bw_metrics *bw__metrics_new(void);

/* Frees the registry, its families and series. NULL is a no-op. */
void bw__metrics_free(bw_metrics *m);

/* Adds a family. `def` is borrowed and must outlive the registry (a static definition). A
 * name or label name that breaks Prometheus's rules, a name used twice or a histogram
 * without buckets is a bug in the caller (BW_INVARIANT). A family without labels has its one
 * series from the start (so a counter shows 0 before its first event). NULL when out of
 * memory or when m is NULL. */
bw_metric *bw__metrics_add(bw_metrics *m, const bw_metric_def *def);

/* The same for a counter or gauge family fed only by collectors (bw__metrics_emit): it has
 * no series of its own, and bw__metric_series on it is a bug. */
bw_metric *bw__metrics_add_collected(bw_metrics *m, const bw_metric_def *def);

/* The series of `values` (one string per label name, borrowed; NULL for a family without
 * labels), created on first use; the overflow series once the family is full. The pointer
 * stays valid as long as the registry. NULL when f is NULL or out of memory. */
bw_series *bw__metric_series(bw_metric *f, const char *const *values);

/* Counters: adds n. */
void bw__counter_add(bw_series *s, uint64_t n);

/* Gauges: sets, or adds (a negative delta subtracts). */
void bw__gauge_set(bw_series *s, double v);
void bw__gauge_add(bw_series *s, double delta);

/* Histograms: one observation (e.g. seconds). */
void bw__histogram_observe(bw_series *s, double v);

/* Called at each scrape, on the HTTP server's thread, to emit samples with bw__metrics_emit.
 * It may take the daemon's own locks; it must not call bw__metrics_render. */
typedef void (*bw_metrics_collect_fn)(void *user, bw_metrics_sink *sink);

/* Adds a collector, called at each scrape in the order added; `release` (may be NULL) is
 * called with `user` when the registry is freed. BW_OK, or BW_NOMEM (then user stays the
 * caller's); BW_OK without doing anything when m is NULL. */
int bw__metrics_add_collector(bw_metrics *m, bw_metrics_collect_fn fn, void *user,
                              void (*release)(void *user));

/* From a collector: one sample of counter or gauge family f with `values` (as for
 * bw__metric_series). The collectors of one scrape must not emit one label set twice. */
void bw__metrics_emit(bw_metrics_sink *sink, bw_metric *f, const char *const *values, double v);

/* The registry in the text exposition format: every family in the order added, with its
 * HELP and TYPE lines, its series, then what the collectors emitted for it. BW_OK with a
 * malloc'ed text (free it) of *len bytes, or BW_NOMEM. */
int bw__metrics_render(bw_metrics *m, char **text, size_t *len);

/* The standard process_* families of Prometheus's client libraries (CPU seconds, resident
 * memory, open and maximum file descriptors, start time), read from /proc at each scrape.
 * BW_OK or BW_NOMEM. */
int bw__metrics_add_process(bw_metrics *m);

/* Seconds from t0_ns (bw__mono_ns) until now: for latencies. */
double bw__metrics_since(uint64_t t0_ns);

/* ---- http.c: the /metrics endpoint ---- */

/* For a daemon: *out is a new registry with the process families when `listen`
 * (--metrics-listen) is set, NULL (metrics off) when it is not. BW_OK, or BW_NOMEM with a
 * sentence in err. */
int bw__metrics_daemon_new(const char *listen, bw_metrics **out, char *err, size_t errlen);

typedef struct bw_metrics_http bw_metrics_http;

/* Who may scrape (docs/operating.md, "Metrics"; docs/security.md, "Metrics"). */
typedef struct bw_metrics_http_opts {
    const char *listen; /* --metrics-listen HOST:PORT; port 0 picks a free one */
    /* --metrics-auth: a file whose first line is the bearer token a scrape must send
     * ("Authorization: Bearer TOKEN"; 401 otherwise). NULL: no token asked. */
    const char *auth_file;
    /* The daemon's --tls-cert and --tls-key: HTTPS with them (NULL: plain HTTP); with
     * --tls-client-ca also, a scrape must present a client certificate it signed. */
    const char *tls_cert, *tls_key, *tls_client_ca;
} bw_metrics_http_opts;

/*
 * Serves `GET /metrics` (and HEAD) from m as `o` says with libmicrohttpd, on a thread of its
 * own; other paths get 404, other methods 405, a scrape without the token or certificate
 * asked for 401 (and nothing of the metrics). The endpoint's URL goes to `url`
 * ("http://ADDR/metrics" or https), for the daemon to log after its first line. BW_OK with
 * *out, or an error with a sentence naming the flag at fault in err.
 */
int bw__metrics_http_start(bw_metrics *m, const bw_metrics_http_opts *o, bw_metrics_http **out,
                           char *url, size_t urllen, char *err, size_t errlen);

/* Stops serving (waits for a scrape in progress) and frees the server. NULL is a no-op. */
void bw__metrics_http_stop(bw_metrics_http *h);

#endif
