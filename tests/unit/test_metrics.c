/* The metrics registry and its text exposition (core/metrics/metrics.h): HELP and TYPE lines,
 * label values escaped (backslash, quote, line feed; bytes that are not UTF-8 replaced),
 * histogram buckets cumulative with +Inf, _sum and _count, numbers written so that they read
 * back exactly, collectors' samples under their family, the bound on series per family,
 * exact totals under concurrent updates, NULL handles, and the HTTP endpoint (libmicrohttpd)
 * answering GET /metrics, 404 and 405 over a real socket. Every rendered text also goes
 * through `promtool check metrics` when Debian's prometheus package is installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "metrics/metrics.h"
#include "rpc/dchan.h"

static char *render(bw_metrics *m)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(bw__metrics_render(m, &text, &len), BW_OK);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    return text;
}

/* promtool's verdict on a scrape, when it is installed: its lint must find nothing. */
static void promtool_accepts(const char *text)
{
    if (access("/usr/bin/promtool", X_OK) != 0) {
        print_message("promtool not installed (Debian package prometheus): lint skipped\n");
        return;
    }
    char path[] = "/tmp/bw-test-metrics-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "/usr/bin/promtool check metrics < %s 2>&1", path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[4096] = "";
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    unlink(path);
    if (st != 0 || n != 0)
        fail_msg("promtool check metrics (exit %d):\n%s\non:\n%s", st, out, text);
}

static const bw_metric_def REQUESTS = {"test_requests_total",
                                       "Requests served,\nby path \\ method",
                                       BW_COUNTER,
                                       {"path", "method"},
                                       NULL,
                                       0,
                                       0};

static void test_counter_labels_escaped(void **state)
{
    (void)state;
    bw_metrics *m = bw__metrics_new();
    bw_metric *f = bw__metrics_add(m, &REQUESTS);
    bw_series *a = bw__metric_series(f, (const char *[]){"/a\"b\\c\nd", "GET"});
    bw_series *b = bw__metric_series(f, (const char *[]){"caf\xc3\xa9 \xff!", "PUT"});
    assert_ptr_equal(a, bw__metric_series(f, (const char *[]){"/a\"b\\c\nd", "GET"}));
    assert_ptr_not_equal(a, b);
    bw__counter_add(a, 3);
    bw__counter_add(a, 4);
    bw__counter_add(b, 18446744073709551615ull);
    char *text = render(m);
    assert_string_equal(text, "# HELP test_requests_total Requests served,\\nby path \\\\ method\n"
                              "# TYPE test_requests_total counter\n"
                              "test_requests_total{path=\"/a\\\"b\\\\c\\nd\",method=\"GET\"} 7\n"
                              "test_requests_total{path=\"caf\xc3\xa9 \xef\xbf\xbd!\","
                              "method=\"PUT\"} 18446744073709551615\n");
    promtool_accepts(text);
    free(text);
    bw__metrics_free(m);
}

static const double BOUNDS[] = {0.005, 0.1, 1, 2.5};
static const bw_metric_def LATENCY = {"test_latency_seconds",
                                      "Latency",
                                      BW_HISTOGRAM,
                                      {"op"},
                                      BOUNDS,
                                      sizeof(BOUNDS) / sizeof(BOUNDS[0]),
                                      0};
static const bw_metric_def PLAIN = {
    "test_plain_seconds", "No labels", BW_HISTOGRAM, {NULL}, BOUNDS, 2, 0};

static void test_histogram_cumulative(void **state)
{
    (void)state;
    bw_metrics *m = bw__metrics_new();
    bw_series *s = bw__metric_series(bw__metrics_add(m, &LATENCY), (const char *[]){"read"});
    bw_series *p = bw__metric_series(bw__metrics_add(m, &PLAIN), NULL);
    const double obs[] = {0.00390625, 0.00390625, 0.0625, 0.5, 0.5, 2, 7, NAN};
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++)
        bw__histogram_observe(s, obs[i]); /* NaN is not counted */
    bw__histogram_observe(p, 0.25);
    char *text = render(m);
    assert_string_equal(text, "# HELP test_latency_seconds Latency\n"
                              "# TYPE test_latency_seconds histogram\n"
                              "test_latency_seconds_bucket{op=\"read\",le=\"0.005\"} 2\n"
                              "test_latency_seconds_bucket{op=\"read\",le=\"0.1\"} 3\n"
                              "test_latency_seconds_bucket{op=\"read\",le=\"1\"} 5\n"
                              "test_latency_seconds_bucket{op=\"read\",le=\"2.5\"} 6\n"
                              "test_latency_seconds_bucket{op=\"read\",le=\"+Inf\"} 7\n"
                              "test_latency_seconds_sum{op=\"read\"} 10.0703125\n"
                              "test_latency_seconds_count{op=\"read\"} 7\n"
                              "# HELP test_plain_seconds No labels\n"
                              "# TYPE test_plain_seconds histogram\n"
                              "test_plain_seconds_bucket{le=\"0.005\"} 0\n"
                              "test_plain_seconds_bucket{le=\"0.1\"} 0\n"
                              "test_plain_seconds_bucket{le=\"+Inf\"} 1\n"
                              "test_plain_seconds_sum 0.25\n"
                              "test_plain_seconds_count 1\n");
    promtool_accepts(text);
    free(text);
    bw__metrics_free(m);
}

static const bw_metric_def LEVEL = {"test_level", "A gauge", BW_GAUGE, {NULL}, NULL, 0, 0};
static const bw_metric_def TEMPS = {
    "test_temperature_celsius", "Gauges", BW_GAUGE, {"where"}, NULL, 0, 0};

static void test_gauge_numbers(void **state)
{
    (void)state;
    bw_metrics *m = bw__metrics_new();
    bw_series *level = bw__metric_series(bw__metrics_add(m, &LEVEL), NULL);
    bw__gauge_add(level, 2);
    bw__gauge_add(level, -0.5);
    bw_metric *t = bw__metrics_add(m, &TEMPS);
    const double v[] = {0.1, 1e-05, 123456789012, -3, INFINITY, -INFINITY, NAN};
    const char *w[] = {"a", "b", "c", "d", "e", "f", "g"};
    for (int i = 0; i < 7; i++)
        bw__gauge_set(bw__metric_series(t, (const char *[]){w[i]}), v[i]);
    char *text = render(m);
    assert_string_equal(text, "# HELP test_level A gauge\n"
                              "# TYPE test_level gauge\n"
                              "test_level 1.5\n"
                              "# HELP test_temperature_celsius Gauges\n"
                              "# TYPE test_temperature_celsius gauge\n"
                              "test_temperature_celsius{where=\"a\"} 0.1\n"
                              "test_temperature_celsius{where=\"b\"} 1e-05\n"
                              "test_temperature_celsius{where=\"c\"} 123456789012\n"
                              "test_temperature_celsius{where=\"d\"} -3\n"
                              "test_temperature_celsius{where=\"e\"} +Inf\n"
                              "test_temperature_celsius{where=\"f\"} -Inf\n"
                              "test_temperature_celsius{where=\"g\"} NaN\n");
    promtool_accepts(text);
    free(text);
    bw__metrics_free(m);
}

static const bw_metric_def JOBS = {"test_jobs", "Jobs by state", BW_GAUGE, {"state"}, NULL, 0, 0};
static const bw_metric_def DONE = {"test_done_total", "Done", BW_COUNTER, {NULL}, NULL, 0, 0};

typedef struct two {
    bw_metric *jobs, *done;
} two;

static void collect(void *user, bw_metrics_sink *sink)
{
    two *t = user;
    bw__metrics_emit(sink, t->done, NULL, 12);
    bw__metrics_emit(sink, t->jobs, (const char *[]){"running"}, 3);
    bw__metrics_emit(sink, t->jobs, (const char *[]){"wait\"ing"}, 1);
}

static void test_collectors(void **state)
{
    (void)state;
    bw_metrics *m = bw__metrics_new();
    two t = {bw__metrics_add(m, &JOBS), bw__metrics_add_collected(m, &DONE)};
    bw__gauge_set(bw__metric_series(t.jobs, (const char *[]){"queued"}), 2);
    assert_int_equal(bw__metrics_add_collector(m, collect, &t, NULL), BW_OK);
    for (int round = 0; round < 2; round++) { /* a second scrape emits afresh */
        char *text = render(m);
        assert_string_equal(text, "# HELP test_jobs Jobs by state\n"
                                  "# TYPE test_jobs gauge\n"
                                  "test_jobs{state=\"queued\"} 2\n"
                                  "test_jobs{state=\"running\"} 3\n"
                                  "test_jobs{state=\"wait\\\"ing\"} 1\n"
                                  "# HELP test_done_total Done\n"
                                  "# TYPE test_done_total counter\n"
                                  "test_done_total 12\n");
        promtool_accepts(text);
        free(text);
    }
    bw__metrics_free(m);
}

static const bw_metric_def SMALL = {"test_small_total", "Capped", BW_COUNTER, {"k"}, NULL, 0, 2};

static void test_series_bound(void **state)
{
    (void)state;
    bw_metrics *m = bw__metrics_new();
    bw_metric *f = bw__metrics_add(m, &SMALL);
    bw__counter_add(bw__metric_series(f, (const char *[]){"a"}), 1);
    bw__counter_add(bw__metric_series(f, (const char *[]){"b"}), 1);
    bw_series *c = bw__metric_series(f, (const char *[]){"c"});
    bw__counter_add(c, 1);
    assert_ptr_equal(c, bw__metric_series(f, (const char *[]){"d"}));
    bw__counter_add(bw__metric_series(f, (const char *[]){"d"}), 1);
    bw__counter_add(bw__metric_series(f, (const char *[]){"a"}), 1);
    char *text = render(m);
    assert_string_equal(text, "# HELP test_small_total Capped\n"
                              "# TYPE test_small_total counter\n"
                              "test_small_total{k=\"a\"} 2\n"
                              "test_small_total{k=\"b\"} 1\n"
                              "test_small_total{k=\"" BW_METRIC_OVERFLOW "\"} 2\n");
    free(text);
    bw__metrics_free(m);
}

enum { THREADS = 4, ADDS = 100000 };

typedef struct hammer {
    bw_metric *count, *lat;
} hammer;

static void *hammer_thread(void *arg)
{
    hammer *h = arg;
    for (int i = 0; i < ADDS; i++) {
        /* every thread looks the series up itself: creation races too */
        bw__counter_add(bw__metric_series(h->count, (const char *[]){"x", "y"}), 2);
        bw__histogram_observe(bw__metric_series(h->lat, (const char *[]){"z"}), 0.5);
    }
    return NULL;
}

static void test_concurrent_exact(void **state)
{
    (void)state;
    bw_metrics *m = bw__metrics_new();
    hammer h = {bw__metrics_add(m, &REQUESTS), bw__metrics_add(m, &LATENCY)};
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, hammer_thread, &h), 0);
    for (int i = 0; i < 20; i++) /* scrapes meanwhile */
        free(render(m));
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    char *text = render(m);
    char want[256];
    snprintf(want, sizeof(want), "test_requests_total{path=\"x\",method=\"y\"} %d\n",
             2 * THREADS * ADDS);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof(want), "test_latency_seconds_count{op=\"z\"} %d\n", THREADS * ADDS);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof(want), "test_latency_seconds_sum{op=\"z\"} %d\n", THREADS * ADDS / 2);
    assert_non_null(strstr(text, want));
    free(text);
    bw__metrics_free(m);
}

static void test_null_is_off(void **state)
{
    (void)state;
    assert_null(bw__metrics_add(NULL, &REQUESTS));
    assert_null(bw__metric_series(NULL, NULL));
    bw__counter_add(NULL, 1);
    bw__gauge_set(NULL, 1);
    bw__gauge_add(NULL, 1);
    bw__histogram_observe(NULL, 1);
    assert_int_equal(bw__metrics_add_collector(NULL, collect, NULL, NULL), BW_OK);
    assert_int_equal(bw__metrics_add_process(NULL), BW_OK);
    bw__metrics_emit(NULL, NULL, NULL, 1);
    bw__metrics_free(NULL);
    bw__metrics_http_stop(NULL);
    bw_metrics *m = (bw_metrics *)1;
    char err[256];
    assert_int_equal(bw__metrics_daemon_new(NULL, &m, err, sizeof(err)), BW_OK);
    assert_null(m);
}

static void test_process_families(void **state)
{
    (void)state;
    bw_metrics *m = NULL;
    char err[256];
    assert_int_equal(bw__metrics_daemon_new("127.0.0.1:0", &m, err, sizeof(err)), BW_OK);
    char *text = render(m);
    unsigned long long fds = 0;
    const char *p = strstr(text, "\nprocess_open_fds ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "\nprocess_open_fds %llu", &fds), 1);
    assert_true(fds >= 3);
    assert_non_null(strstr(text, "\nprocess_resident_memory_bytes "));
    assert_non_null(strstr(text, "\nprocess_cpu_seconds_total "));
    p = strstr(text, "\nprocess_start_time_seconds ");
    assert_non_null(p);
    double start = 0;
    assert_int_equal(sscanf(p, "\nprocess_start_time_seconds %lf", &start), 1);
    assert_true(start > 1.6e9 && start <= (double)time(NULL) + 1);
    promtool_accepts(text);
    free(text);
    bw__metrics_free(m);
}

/* One HTTP/1.0 request over a real socket; the whole answer. */
static char *http(const char *addr, const char *request)
{
    int fd = -1;
    char err[256];
    assert_int_equal(bw__sock_connect(addr, 5000, &fd, err, sizeof(err)), BW_OK);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK); /* read to the end below */
    assert_int_equal(write(fd, request, strlen(request)), (ssize_t)strlen(request));
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    ssize_t n;
    while ((n = read(fd, out + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    out[len] = '\0';
    close(fd);
    return out;
}

static void test_http_endpoint(void **state)
{
    (void)state;
    bw_metrics *m = bw__metrics_new();
    bw__counter_add(bw__metric_series(bw__metrics_add(m, &REQUESTS), (const char *[]){"/", "x"}),
                    5);
    bw_metrics_http *h = NULL;
    char url[300], err[512];
    bw_metrics_http_opts o = {.listen = "127.0.0.1:0"};
    assert_int_equal(bw__metrics_http_start(m, &o, &h, url, sizeof(url), err, sizeof(err)), BW_OK);
    assert_int_equal(strncmp(url, "http://127.0.0.1:", 17), 0);
    assert_true(strtol(url + 17, NULL, 10) > 0);
    char bound[300];
    snprintf(bound, sizeof(bound), "%.*s", (int)(strlen(url) - 7 - strlen("/metrics")), url + 7);

    char *r = http(bound, "GET /metrics HTTP/1.0\r\n\r\n");
    assert_int_equal(strncmp(r, "HTTP/1.0 200", 12) == 0 || strncmp(r, "HTTP/1.1 200", 12) == 0, 1);
    assert_non_null(strstr(r, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    char *body = strstr(r, "\r\n\r\n");
    assert_non_null(body);
    char *text = render(m);
    assert_string_equal(body + 4, text);
    free(text);
    free(r);

    r = http(bound, "GET /other HTTP/1.0\r\n\r\n");
    assert_non_null(strstr(r, " 404 "));
    free(r);
    r = http(bound, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
    assert_non_null(strstr(r, " 405 "));
    assert_non_null(strstr(r, "Allow: GET, HEAD\r\n"));
    free(r);

    /* The same port again: a clear error naming the setting. */
    bw_metrics_http *h2 = NULL;
    char bound2[300];
    o.listen = bound;
    assert_int_not_equal(
        bw__metrics_http_start(m, &o, &h2, bound2, sizeof(bound2), err, sizeof(err)), BW_OK);
    assert_null(h2);
    assert_non_null(strstr(err, "--metrics-listen"));
    o.listen = "no-port";
    assert_int_not_equal(
        bw__metrics_http_start(m, &o, &h2, bound2, sizeof(bound2), err, sizeof(err)), BW_OK);
    assert_non_null(strstr(err, "--metrics-listen no-port"));
    bw__metrics_http_stop(h);

    /* --metrics-auth: 401 without the token or with another, the metrics with it. */
    char tmpl[] = "/tmp/bw-metrics-auth-XXXXXX";
    int fd = mkstemp(tmpl);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "s3cret-token-0123456789\n", 24), 24);
    close(fd);
    o.listen = "127.0.0.1:0";
    o.auth_file = "/nonexistent/metrics.token";
    assert_int_not_equal(bw__metrics_http_start(m, &o, &h, url, sizeof(url), err, sizeof(err)),
                         BW_OK);
    assert_non_null(strstr(err, "--metrics-auth"));
    o.auth_file = tmpl;
    assert_int_equal(bw__metrics_http_start(m, &o, &h, url, sizeof(url), err, sizeof(err)), BW_OK);
    snprintf(bound, sizeof(bound), "%.*s", (int)(strlen(url) - 7 - strlen("/metrics")), url + 7);
    r = http(bound, "GET /metrics HTTP/1.0\r\n\r\n");
    assert_non_null(strstr(r, " 401 "));
    assert_non_null(strstr(r, "WWW-Authenticate: Bearer"));
    assert_null(strstr(r, "test_requests_total"));
    free(r);
    r = http(bound,
             "GET /metrics HTTP/1.0\r\nAuthorization: Bearer s3cret-token-0123456788\r\n\r\n");
    assert_non_null(strstr(r, " 401 "));
    free(r);
    r = http(bound,
             "GET /metrics HTTP/1.0\r\nAuthorization: bearer s3cret-token-0123456789\r\n\r\n");
    assert_non_null(strstr(r, " 200 "));
    free(r);
    bw__metrics_http_stop(h);
    unlink(tmpl);
    bw__metrics_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_labels_escaped),
        cmocka_unit_test(test_histogram_cumulative),
        cmocka_unit_test(test_gauge_numbers),
        cmocka_unit_test(test_collectors),
        cmocka_unit_test(test_series_bound),
        cmocka_unit_test(test_concurrent_exact),
        cmocka_unit_test(test_null_is_off),
        cmocka_unit_test(test_process_families),
        cmocka_unit_test(test_http_endpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
