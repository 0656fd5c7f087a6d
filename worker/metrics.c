/* The worker's metric families (metrics.h). Every name and label is listed with its meaning
 * in docs/operating.md, "Metrics": change both together. */
#include "metrics.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "batchwire/batchwire.h"
#include "common/util.h"
#include "data.h"
#include "request.h"

static const char *const TRANSPORT[BW_WM_TRANSPORTS] = {"grpc", "data_channel"};

static const double LATENCY_S[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                   0.25,   0.5,   1,      2.5,   5,    10,    30};
static const double OPEN_S[] = {0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300};

#define N(a) (sizeof(a) / sizeof((a)[0]))

static const bw_metric_def SAMPLES = {
    "batchwire_worker_samples_served_total",
    "Samples (map-style) and stream records the worker served, by dataset and transport",
    BW_COUNTER,
    {"dataset", "transport"},
    NULL,
    0,
    512};
static const bw_metric_def BYTES = {
    "batchwire_worker_bytes_served_total",
    "Bytes of the samples and records the worker served (payload, without framing), by "
    "dataset and transport",
    BW_COUNTER,
    {"dataset", "transport"},
    NULL,
    0,
    512};
static const bw_metric_def LATENCY = {
    "batchwire_worker_request_duration_seconds",
    "Time from a ReadSamples or ReadStream request's arrival until its last byte and status "
    "were handed to the transport, by transport and method",
    BW_HISTOGRAM,
    {"transport", "method"},
    LATENCY_S,
    N(LATENCY_S),
    0};
static const bw_metric_def IN_FLIGHT = BW_METRIC_DEF(
    "batchwire_worker_requests_in_flight", BW_GAUGE,
    "ReadSamples and ReadStream requests being served now (admitted or waiting), by transport",
    "transport");
static const bw_metric_def ERRORS = BW_METRIC_DEF(
    "batchwire_worker_request_errors_total", BW_COUNTER,
    "ReadSamples and ReadStream requests that ended with an error, by transport and batchwire "
    "error code (BW_BUSY: over the in-flight budget; BW_CANCELLED: the client went away)",
    "transport", "code");
static const bw_metric_def IN_FLIGHT_BYTES = BW_METRIC_DEF(
    "batchwire_worker_in_flight_bytes", BW_GAUGE,
    "Bytes the requests in progress hold against the in-flight budget (--inflight-bytes)", NULL);
static const bw_metric_def BUDGET_BYTES =
    BW_METRIC_DEF("batchwire_worker_in_flight_budget_bytes", BW_GAUGE,
                  "The in-flight budget (--inflight-bytes)", NULL);
static const bw_metric_def DATASETS =
    BW_METRIC_DEF("batchwire_worker_open_datasets", BW_GAUGE,
                  "Datasets open in the worker's dataset cache", NULL);
static const bw_metric_def FILES =
    BW_METRIC_DEF("batchwire_worker_open_files", BW_GAUGE,
                  "Files of the datasets open in the cache, each held open and mapped", NULL);
static const bw_metric_def CONNECTIONS =
    BW_METRIC_DEF("batchwire_worker_data_channel_connections", BW_GAUGE,
                  "Data-channel connections open now", NULL);
static const bw_metric_def OPENED = {
    "batchwire_worker_dataset_open_duration_seconds",
    "Time to open a dataset (read its headers, map its files), by format; again when a file "
    "changed and it is reopened",
    BW_HISTOGRAM,
    {"format"},
    OPEN_S,
    N(OPEN_S),
    64};
static const bw_metric_def INDEXED = {
    "batchwire_worker_dataset_index_duration_seconds",
    "Time to index an opened dataset (find every record: files read whole for tfrecord, "
    "jsonl, text and tar), by format",
    BW_HISTOGRAM,
    {"format"},
    OPEN_S,
    N(OPEN_S),
    64};

static const double TRANSFORM_S[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                     0.01,   0.025,   0.05,   0.1,   0.25,   1};
static const bw_metric_def TRANSFORM = {
    "batchwire_worker_transform_duration_seconds",
    "Time to run a job's transform on one sample (decode and ops, on a --transform-threads "
    "thread)",
    BW_HISTOGRAM,
    {NULL},
    TRANSFORM_S,
    N(TRANSFORM_S),
    0};
static const bw_metric_def TRANSFORM_FAILURES = BW_METRIC_DEF(
    "batchwire_worker_transform_failures_total", BW_COUNTER,
    "Samples a transform failed on (each fails its request), by batchwire error code "
    "(BW_CORRUPT: a corrupt image; BW_NOT_FOUND: a tar sample without the member; BW_TOO_BIG: "
    "over the pixel limit)",
    "code");

struct bw__wm {
    bw__wm_state_fn state;
    void *user;
    bw_metric *samples, *bytes, *errors, *opened, *indexed;
    bw_metric *in_flight_bytes, *budget, *datasets, *files, *connections;
    bw_series *latency[BW_WM_TRANSPORTS][2]; /* by method: ReadSamples, ReadStream */
    bw_series *in_flight[BW_WM_TRANSPORTS];
    bw_series *transform;
    bw_metric *transform_failures;
};

static void collect(void *user, bw_metrics_sink *sink)
{
    bw__wm *m = user;
    bw__wm_state st = {0, 0, 0, 0, 0};
    m->state(m->user, &st);
    bw__metrics_emit(sink, m->in_flight_bytes, NULL, (double)st.in_flight_bytes);
    bw__metrics_emit(sink, m->budget, NULL, (double)st.budget_bytes);
    bw__metrics_emit(sink, m->datasets, NULL, (double)st.datasets);
    bw__metrics_emit(sink, m->files, NULL, (double)st.files);
    bw__metrics_emit(sink, m->connections, NULL, (double)st.connections);
}

bw__wm *bw__wm_new(bw_metrics *reg, bw__wm_state_fn state, void *user, int *rc)
{
    *rc = BW_OK;
    if (!reg)
        return NULL;
    bw__wm *m = calloc(1, sizeof(*m));
    if (!m) {
        *rc = BW_NOMEM;
        return NULL;
    }
    m->state = state;
    m->user = user;
    bw_metric *latency = bw__metrics_add(reg, &LATENCY);
    bw_metric *in_flight = bw__metrics_add(reg, &IN_FLIGHT);
    m->samples = bw__metrics_add(reg, &SAMPLES);
    m->bytes = bw__metrics_add(reg, &BYTES);
    m->errors = bw__metrics_add(reg, &ERRORS);
    m->in_flight_bytes = bw__metrics_add_collected(reg, &IN_FLIGHT_BYTES);
    m->budget = bw__metrics_add_collected(reg, &BUDGET_BYTES);
    m->datasets = bw__metrics_add_collected(reg, &DATASETS);
    m->files = bw__metrics_add_collected(reg, &FILES);
    m->connections = bw__metrics_add_collected(reg, &CONNECTIONS);
    m->opened = bw__metrics_add(reg, &OPENED);
    m->indexed = bw__metrics_add(reg, &INDEXED);
    bw_metric *transform = bw__metrics_add(reg, &TRANSFORM);
    m->transform = transform ? bw__metric_series(transform, NULL) : NULL;
    m->transform_failures = bw__metrics_add(reg, &TRANSFORM_FAILURES);
    bool ok = m->transform && m->transform_failures && latency && in_flight && m->samples &&
              m->bytes && m->errors && m->in_flight_bytes && m->budget && m->datasets && m->files &&
              m->connections && m->opened && m->indexed;
    for (int t = 0; ok && t < BW_WM_TRANSPORTS; t++) {
        const char *a[] = {TRANSPORT[t], "ReadSamples"}, *b[] = {TRANSPORT[t], "ReadStream"};
        m->latency[t][0] = bw__metric_series(latency, a);
        m->latency[t][1] = bw__metric_series(latency, b);
        m->in_flight[t] = bw__metric_series(in_flight, a);
        ok = m->latency[t][0] && m->latency[t][1] && m->in_flight[t];
    }
    if (!ok || bw__metrics_add_collector(reg, collect, m, NULL) != BW_OK) {
        free(m); /* the families stay in the registry, unused */
        *rc = BW_NOMEM;
        return NULL;
    }
    return m;
}

void bw__wm_free(bw__wm *m)
{
    free(m);
}

uint64_t bw__wm_begin(bw__wm *m, bw__wm_transport t)
{
    if (!m)
        return 0;
    bw__gauge_add(m->in_flight[t], 1);
    return bw__mono_ns();
}

void bw__wm_end(bw__wm *m, bw__wm_transport t, uint32_t kind, uint64_t t0, int rc)
{
    if (!m)
        return;
    bw__gauge_add(m->in_flight[t], -1);
    bw__histogram_observe(m->latency[t][kind == BW_REQ_STREAM], bw__metrics_since(t0));
    if (rc != BW_OK) {
        const char *v[] = {TRANSPORT[t], bw_err_name(rc)};
        bw__counter_add(bw__metric_series(m->errors, v), 1);
    }
}

bw__wm_served bw__wm_served_for(bw__wm *m, bw__wm_transport t, const Batchwire__V1__Dataset *spec)
{
    bw__wm_served s = {NULL, NULL};
    if (!m || !spec || !spec->format)
        return s;
    /* FORMAT:FIRST_SOURCE, ",..." when there are more: as requests name it in messages. */
    char name[512];
    snprintf(name, sizeof(name), "%s:%s%s", spec->format, bw__ds_spec_first(spec),
             spec->n_sources > 1 || spec->n_fields > 1 ? ",..." : "");
    const char *v[] = {name, TRANSPORT[t]};
    s.samples = bw__metric_series(m->samples, v);
    s.bytes = bw__metric_series(m->bytes, v);
    return s;
}

void bw__wm_opened(bw__wm *m, const char *format, uint64_t t0)
{
    if (m)
        bw__histogram_observe(bw__metric_series(m->opened, (const char *[]){format}),
                              bw__metrics_since(t0));
}

void bw__wm_indexed(bw__wm *m, const char *format, uint64_t t0)
{
    if (m)
        bw__histogram_observe(bw__metric_series(m->indexed, (const char *[]){format}),
                              bw__metrics_since(t0));
}

void bw__wm_transformed(bw__wm *m, uint64_t t0, int rc)
{
    if (!m)
        return;
    bw__histogram_observe(m->transform, bw__metrics_since(t0));
    if (rc != BW_OK)
        bw__counter_add(bw__metric_series(m->transform_failures, (const char *[]){bw_err_name(rc)}),
                        1);
}
