/* The /metrics endpoint (metrics.h) on libmicrohttpd: its own polling thread, a bounded number
 * of connections, each scrape rendered from the registry. The listening socket is made by
 * bw__sock_listen, like the data channel's, so addresses mean the same on every port. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <microhttpd.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "metrics/metrics.h"
#include "rpc/dchan.h"

enum {
    MAX_CONNECTIONS = 32, /* scrapers are few; more are refused by the library */
    IDLE_TIMEOUT_S = 10,  /* a connection that sends nothing for this long is closed */
};

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct bw_metrics_http {
    struct MHD_Daemon *d;
    bw_metrics *m;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *text,
                             size_t len, enum MHD_ResponseMemoryMode mode, const char *type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)text, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free((void *)text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **req)
{
    (void)version;
    (void)upload;
    (void)req;
    bw_metrics_http *h = cls;
    static const char not_found[] = "not found: the metrics are at /metrics\n";
    static const char not_allowed[] = "only GET and HEAD are served\n";
    static const char no_memory[] = "out of memory rendering the metrics\n";
    if (*upload_len) /* a body nobody asked for: drop it, answer when it is over */
        return *upload_len = 0, MHD_YES;
    if (strcmp(url, "/metrics") != 0)
        return reply(c, MHD_HTTP_NOT_FOUND, not_found, sizeof(not_found) - 1,
                     MHD_RESPMEM_PERSISTENT, "text/plain; charset=utf-8");
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, not_allowed, sizeof(not_allowed) - 1,
                     MHD_RESPMEM_PERSISTENT, "text/plain; charset=utf-8");
    char *text = NULL;
    size_t len = 0;
    if (bw__metrics_render(h->m, &text, &len) != BW_OK)
        return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, no_memory, sizeof(no_memory) - 1,
                     MHD_RESPMEM_PERSISTENT, "text/plain; charset=utf-8");
    return reply(c, MHD_HTTP_OK, text ? text : "", len,
                 text ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT, CONTENT_TYPE);
}

/* The library's own complaints (a client that misbehaves, a failed accept) as our warnings.
 * fmt is libmicrohttpd's printf format (the attribute tells clang's -Wformat-nonliteral). */
__attribute__((format(printf, 2, 0))) static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    BW_WARN("metrics http: %s", line);
}

int bw__metrics_daemon_new(const char *listen, bw_metrics **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!listen)
        return BW_OK;
    bw_metrics *m = bw__metrics_new();
    if (!m || bw__metrics_add_process(m) != BW_OK) {
        bw__metrics_free(m);
        snprintf(err, errlen, "--metrics-listen %s: out of memory for the metrics", listen);
        return BW_NOMEM;
    }
    *out = m;
    return BW_OK;
}

int bw__metrics_http_start(bw_metrics *m, const char *listen, bw_metrics_http **out, char *bound,
                           size_t boundlen, char *err, size_t errlen)
{
    *out = NULL;
    char host[256], port[16], why[512];
    if (bw__sock_split(listen, host, sizeof(host), port, sizeof(port)) != BW_OK) {
        snprintf(err, errlen, "--metrics-listen %s: expected HOST:PORT", listen);
        return BW_INVALID_ARGUMENT;
    }
    bw_metrics_http *h = calloc(1, sizeof(*h));
    if (!h) {
        snprintf(err, errlen, "--metrics-listen %s: out of memory", listen);
        return BW_NOMEM;
    }
    h->m = m;
    int fd = -1, bound_port = 0;
    int rc = bw__sock_listen(listen, &fd, &bound_port, why, sizeof(why));
    if (rc != BW_OK) {
        snprintf(err, errlen, "--metrics-listen: %s", why);
        free(h);
        return rc;
    }
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG, 0,
                            NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                            NULL, /* first, or the library logs to stderr */
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned int)MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned int)IDLE_TIMEOUT_S, MHD_OPTION_END);
    if (!h->d) {
        if (fcntl(fd, F_GETFD) != -1) /* the library may have closed it already */
            close(fd);
        snprintf(err, errlen, "--metrics-listen %s: the HTTP server (libmicrohttpd) did not start",
                 listen);
        free(h);
        return BW_INTERNAL;
    }
    /* bw__sock_split keeps an IPv6 host's brackets off; put them back for a URL. */
    bool v6 = strchr(host, ':') != NULL;
    snprintf(bound, boundlen, "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", bound_port);
    *out = h;
    return BW_OK;
}

void bw__metrics_http_stop(bw_metrics_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d); /* joins its thread and closes the listening socket */
    free(h);
}
