/* The /metrics endpoint (metrics.h) on libmicrohttpd: its own polling thread, a bounded number
 * of connections, each scrape rendered from the registry, and who may scrape -- a bearer token
 * (--metrics-auth), HTTPS with the daemon's certificate, client certificates under its client
 * CA (docs/security.md, "Metrics"). The listening socket is made by bw__sock_listen, like the
 * data channel's, so addresses mean the same on every port. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <openssl/crypto.h>

#include "auth/auth.h"
#include "batchwire/batchwire.h"
#include "common/log.h"
#include "metrics/metrics.h"
#include "rpc/dchan.h"
#include "rpc/tls.h"

enum {
    MAX_CONNECTIONS = 32, /* scrapers are few; more are refused by the library */
    IDLE_TIMEOUT_S = 10,  /* a connection that sends nothing for this long is closed */
};

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct bw_metrics_http {
    struct MHD_Daemon *d;
    bw_metrics *m;
    char *token;           /* --metrics-auth's token; NULL: none asked */
    char *cert, *key, *ca; /* PEM, held while the server runs; NULL: plain HTTP */
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
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                "Bearer realm=\"batchwire metrics\"");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* Why this scrape may not see the metrics (they name jobs, principals and datasets), or NULL:
 * a client certificate under --tls-client-ca when one is set, and the bearer token when
 * --metrics-auth is. */
static const char *refusal(const bw_metrics_http *h, struct MHD_Connection *c)
{
    if (h->ca) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
        unsigned status = 0;
        if (!ci || !ci->tls_session ||
            gnutls_certificate_verify_peers2(ci->tls_session, &status) != GNUTLS_E_SUCCESS ||
            status != 0)
            return "a client certificate signed by the daemon's --tls-client-ca is required\n";
    }
    if (!h->token)
        return NULL;
    static const char missing[] = "metrics need \"Authorization: Bearer TOKEN\" with the token "
                                  "of the daemon's --metrics-auth file\n";
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!a || strncasecmp(a, "Bearer ", 7) != 0)
        return missing;
    a += 7;
    while (*a == ' ')
        a++;
    size_t n = strlen(a), want = strlen(h->token);
    /* Constant time in the token's bytes: a wrong guess learns nothing from the timing. */
    if (n != want || CRYPTO_memcmp(a, h->token, want) != 0)
        return "wrong bearer token for the metrics (--metrics-auth)\n";
    return NULL;
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
    const char *why = refusal(h, c);
    if (why)
        return reply(c, MHD_HTTP_UNAUTHORIZED, why, strlen(why), MHD_RESPMEM_PERSISTENT,
                     "text/plain; charset=utf-8");
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

static void http_free(bw_metrics_http *h)
{
    if (!h)
        return;
    if (h->token)
        OPENSSL_cleanse(h->token, strlen(h->token));
    free(h->token);
    free(h->cert);
    if (h->key)
        OPENSSL_cleanse(h->key, strlen(h->key));
    free(h->key);
    free(h->ca);
    free(h);
}

/* The token and PEM files, read and checked before the port opens: a mistake is a clear
 * error at start, not a scrape refused later. */
static int load_credentials(bw_metrics_http *h, const bw_metrics_http_opts *o, char *err,
                            size_t errlen)
{
    int rc = BW_OK;
    if (o->auth_file) {
        char why[512];
        if ((rc = bw__auth_read_token_file(o->auth_file, &h->token, why, sizeof(why))) != BW_OK) {
            snprintf(err, errlen, "--metrics-auth: %s", why);
            return rc;
        }
    }
    if (!o->tls_cert)
        return BW_OK;
    if (!MHD_is_feature_supported(MHD_FEATURE_TLS)) {
        snprintf(err, errlen,
                 "--tls-cert: this libmicrohttpd has no TLS, so /metrics cannot be served over "
                 "HTTPS as the daemon's other ports are (--metrics-listen %s)",
                 o->listen);
        return BW_TLS;
    }
    if ((rc = bw__tls_load_pair(o->tls_cert, o->tls_key, &h->cert, &h->key, err, errlen)) != BW_OK)
        return rc;
    if (o->tls_client_ca)
        rc = bw__tls_load_pem("--tls-client-ca", o->tls_client_ca, 0, &h->ca, err, errlen);
    return rc;
}

int bw__metrics_http_start(bw_metrics *m, const bw_metrics_http_opts *o, bw_metrics_http **out,
                           char *url, size_t urllen, char *err, size_t errlen)
{
    *out = NULL;
    const char *listen = o->listen;
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
    int rc = load_credentials(h, o, err, errlen);
    if (rc != BW_OK) {
        http_free(h);
        return rc;
    }
    int fd = -1, bound_port = 0;
    rc = bw__sock_listen(listen, &fd, &bound_port, why, sizeof(why));
    if (rc != BW_OK) {
        snprintf(err, errlen, "--metrics-listen: %s", why);
        http_free(h);
        return rc;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    struct MHD_OptionItem tls[] = {
        {h->cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, h->cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, h->key},
        {h->ca ? MHD_OPTION_HTTPS_MEM_TRUST : MHD_OPTION_END, 0, h->ca},
        {MHD_OPTION_END, 0, NULL},
    };
    if (h->cert)
        flags |= MHD_USE_TLS;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                            NULL, /* first, or the library logs to stderr */
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned int)MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned int)IDLE_TIMEOUT_S, MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
    if (!h->d) {
        if (fcntl(fd, F_GETFD) != -1) /* the library may have closed it already */
            close(fd);
        snprintf(err, errlen, "--metrics-listen %s: the HTTP server (libmicrohttpd) did not start",
                 listen);
        http_free(h);
        return BW_INTERNAL;
    }
    /* bw__sock_split keeps an IPv6 host's brackets off; put them back for a URL. */
    bool v6 = strchr(host, ':') != NULL;
    snprintf(url, urllen, "%s://%s%s%s:%d/metrics", h->cert ? "https" : "http", v6 ? "[" : "", host,
             v6 ? "]" : "", bound_port);
    *out = h;
    return BW_OK;
}

void bw__metrics_http_stop(bw_metrics_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d); /* joins its thread and closes the listening socket */
    http_free(h);
}
