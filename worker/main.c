/* batchwire-worker: serves dataset shards below --data-root and keeps itself registered with
 * the coordinator. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/text.h"
#include "common/util.h"
#include <openssl/ssl.h>

#include "rpc/dchan.h"
#include "rpc/tls.h"
#include "sample_transform.h"
#include "worker.h"

static const bw_opt options[] = {
    BW_DAEMON_OPTS(bw_worker_config, common, "127.0.0.1:7701"),
    {"coordinator", BW_OPT_ADDR, offsetof(bw_worker_config, coordinator), NULL, 0, 0, NULL,
     BW_OPT_REQUIRED, "HOST:PORT", "the coordinator to register with"},
    {"data-root", BW_OPT_PATH, offsetof(bw_worker_config, data_root), NULL, 0, 0, NULL,
     BW_OPT_REQUIRED, "DIR", "datasets are read below this directory only"},
    {"id", BW_OPT_STRING, offsetof(bw_worker_config, id), NULL, 0, 0, NULL, 0, "NAME",
     "worker id, unique in the cluster (default: HOST:PORT, the host name and the bound "
     "--listen port: one per process on a host, the same after a restart at a fixed port)"},
    {"takeover", BW_OPT_BOOL, offsetof(bw_worker_config, takeover), "false", 0, 0, NULL, 0, NULL,
     "take the id over from a live worker at another address that holds it (that worker "
     "stops); without it such a start is refused"},
    {"advertise", BW_OPT_ADDR, offsetof(bw_worker_config, advertise), NULL, 0, 0, NULL, 0,
     "HOST:PORT", "address clients use to reach this worker (default: the bound address)"},
    {"data-listen", BW_OPT_STRING, offsetof(bw_worker_config, data_listen), NULL, 0, 0, NULL, 0,
     "HOST:PORT|off",
     "bulk data channel for ReadSamples and ReadStream, TLS like --listen (default: the --listen "
     "host, any "
     "free port)"},
    {"data-advertise", BW_OPT_ADDR, offsetof(bw_worker_config, data_advertise), NULL, 0, 0, NULL, 0,
     "HOST:PORT",
     "address clients use for the data channel (default: the advertised host, "
     "the bound data port)"},
    {"data-max-connections", BW_OPT_INT, offsetof(bw_worker_config, data_max_connections), "4096",
     1, 65536, NULL, 0, "N",
     "data-channel connections served at once (a thread each); more are refused and those "
     "clients fetch over gRPC"},
    {"data-compress-max-level", BW_OPT_INT, offsetof(bw_worker_config, data_compress_max_level),
     "9", 0, BW_DCHAN_ZSTD_LEVEL_MAX, NULL, 0, "N",
     "the highest zstd level a data-channel client may ask for (higher asks get this one); 0: "
     "never compress, as a worker without compression (docs/data-channel.md, \"Compression\")"},
    {"data-idle-timeout-ms", BW_OPT_INT, offsetof(bw_worker_config, data_idle_timeout_ms), "300000",
     0, 86400000, NULL, 0, "MS", "close a data-channel connection idle this long (0: never)"},
    {"max-request-bytes", BW_OPT_INT, offsetof(bw_worker_config, max_request_bytes), "16777216",
     65536, BW_DCHAN_MAX_REQUEST, NULL, 0, "BYTES",
     "largest ReadSamples/ReadStream request body accepted: on the data channel a larger one is "
     "refused from its header, before any of it is read; over gRPC it is the receive limit (with "
     "--max-message-bytes)"},
    {"inflight-bytes", BW_OPT_INT, offsetof(bw_worker_config, inflight_bytes), "268435456", 8388608,
     (int64_t)1 << 40, NULL, 0, "BYTES",
     "memory the requests in progress may hold together (bodies, decoding, response buffers); a "
     "request that does not fit waits up to 1 s, then gets BW_BUSY with a retry hint"},
    {"read-threads", BW_OPT_INT, offsetof(bw_worker_config, read_threads), "4", 1, 256, NULL, 0,
     "N", "threads that open, index and check datasets for requests of both transports"},
    {"transform-threads", BW_OPT_INT, offsetof(bw_worker_config, transform_threads), "0", 0, 1024,
     NULL, 0, "N",
     "threads that run jobs' transforms (decode, crop, normalize: docs/transforms.md), each "
     "with its own scratch memory; 0: one per core online"},
    {"transform-max-pixels", BW_OPT_INT, offsetof(bw_worker_config, transform_max_pixels),
     "89478485", 1, (int64_t)1 << 32, NULL, 0, "N",
     "largest image (width x height) a transform decodes; larger ones fail their sample with "
     "BW_TOO_BIG. A transform thread's scratch holds about 9 bytes per pixel of the largest "
     "image it decoded"},
    {"max-open-files", BW_OPT_INT, offsetof(bw_worker_config, max_open_files), "0", 0, 1 << 24,
     NULL, 0, "N",
     "files the cached datasets may hold open together (0: the process's descriptor limit less "
     "--data-max-connections and 256 for other sockets); over it idle datasets are closed, then "
     "requests refused"},
    {"dataset-memory-bytes", BW_OPT_INT, offsetof(bw_worker_config, dataset_memory_bytes),
     "1073741824", 8388608, (int64_t)1 << 42, NULL, 0, "BYTES",
     "memory the cached datasets may hold together: their record indexes (8 bytes a line of "
     "text or jsonl, a record of tfrecord or tar) and source tables; over it idle datasets are "
     "dropped, then requests refused"},
    {"max-sources", BW_OPT_INT, offsetof(bw_worker_config, max_sources), "16384", 1, 65536, NULL, 0,
     "N", "files one dataset may list once its globs are expanded"},
    {"open-timeout-ms", BW_OPT_INT, offsetof(bw_worker_config, open_timeout_ms), "60000", 100,
     3600000, NULL, 0, "MS",
     "longest a request's directory walks may take (globs, format files), when the request's own "
     "deadline is not sooner"},
    {"data-hello-timeout-ms", BW_OPT_INT, offsetof(bw_worker_config, data_hello_timeout_ms), "5000",
     100, 600000, NULL, 0, "MS",
     "a new data-channel connection must finish its TLS handshake and send its first request or "
     "hello within this, or it is closed"},
    {"data-max-connections-per-peer", BW_OPT_INT,
     offsetof(bw_worker_config, data_max_connections_per_peer), "512", 1, 65536, NULL, 0, "N",
     "data-channel connections one peer address may hold at once; more are refused (that client "
     "fetches over gRPC)"},
    {"tls-ca", BW_OPT_PATH, offsetof(bw_worker_config, tls_ca), NULL, 0, 0, NULL, 0, "FILE",
     "PEM CA that signed the coordinator's certificate: talk TLS to the coordinator"},
    {"tls-server-name", BW_OPT_STRING, offsetof(bw_worker_config, tls_server_name), NULL, 0, 0,
     NULL, 0, "NAME", "name to verify in the coordinator's certificate instead of its host"},
    {"rpc-timeout-ms", BW_OPT_INT, offsetof(bw_worker_config, rpc_timeout_ms), "2000", 10, 600000,
     NULL, 0, "MS", "deadline of each call to the coordinator"},
    BW_OPT_END,
};

/* What a scrape shows of the parts of the worker this file owns (metrics.h). */
static void metrics_state(void *user, bw__wm_state *out)
{
    bw_worker *w = user;
    out->in_flight_bytes = bw__exec_held(w->exec);
    out->budget_bytes = (uint64_t)w->cfg->inflight_bytes;
    bw__ds_cache_counts(w->datasets, &out->datasets, &out->files);
    out->connections = bw__dchan_server_connections(w->dchan);
}

static int resolve_data_root(bw_worker *w, char *err, size_t errlen)
{
    char real[PATH_MAX];
    if (!realpath(w->cfg->data_root, real)) {
        snprintf(err, errlen, "--data-root %s: %s", w->cfg->data_root, strerror(errno));
        return BW_INVALID_ARGUMENT;
    }
    struct stat st;
    if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "--data-root %s: not a directory", w->cfg->data_root);
        return BW_INVALID_ARGUMENT;
    }
    snprintf(w->data_root, sizeof(w->data_root), "%s", real);
    return BW_OK;
}

/* The default worker id (docs/operating.md, "Worker ids"): HOST:PORT, the host name and the
 * bound port (or HOST:unix:PATH), so that two workers on one host differ and a worker
 * restarted at its port keeps its id. Called by the RPC server once the port is bound, before
 * any call can read w->id. Bytes a name may not hold (spaces, controls) become '_'. */
static void default_id(void *user, const char *bound)
{
    bw_worker *w = user;
    if (w->cfg->id)
        return;
    char host[128];
    bw__hostname(host, sizeof(host));
    const char *colon = strncmp(bound, "unix:", 5) == 0 ? NULL : strrchr(bound, ':');
    snprintf(w->id, sizeof(w->id), "%s:%s", host, colon ? colon + 1 : bound);
    for (char *p = w->id; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f)
            *p = '_';
}

/* Clients need a routable address: replace a wildcard host by the host name. */
static void advertise_address(bw_worker *w)
{
    if (w->cfg->advertise) {
        snprintf(w->advertise, sizeof(w->advertise), "%s", w->cfg->advertise);
        return;
    }
    const char *colon = strrchr(w->bound, ':');
    size_t hostlen = colon ? (size_t)(colon - w->bound) : 0;
    if (colon && ((hostlen == 7 && strncmp(w->bound, "0.0.0.0", 7) == 0) ||
                  (hostlen == 4 && strncmp(w->bound, "[::]", 4) == 0))) {
        char host[200];
        bw__hostname(host, sizeof(host));
        snprintf(w->advertise, sizeof(w->advertise), "%s%s", host, colon);
    } else {
        snprintf(w->advertise, sizeof(w->advertise), "%s", w->bound);
    }
}

/* The dataset cache's budgets (docs/operating.md, "Worker budgets"). --max-open-files 0 takes
 * the descriptor limit (the soft limit raised to the hard one first) less room for the data
 * channel's connections and 256 more for gRPC, the coordinator and the metrics listener. */
static void set_budgets(bw_worker *w, bw__ds_limits *out, uint64_t *descriptors)
{
    const bw_worker_config *cfg = w->cfg;
    uint64_t files = (uint64_t)cfg->max_open_files;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    uint64_t limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                         ? (uint64_t)rl.rlim_cur
                         : 1 << 20;
    uint64_t headroom = (uint64_t)cfg->data_max_connections + 256;
    if (!files)
        files = limit > headroom + 64 ? limit - headroom : limit / 2;
    if (files + 256 > limit)
        BW_WARN("--max-open-files leaves fewer than 256 descriptors for sockets "
                "max_open_files=%llu descriptor_limit=%llu",
                (unsigned long long)files, (unsigned long long)limit);
    *out = (bw__ds_limits){files, (uint64_t)cfg->dataset_memory_bytes, (size_t)cfg->max_sources,
                           (uint64_t)cfg->open_timeout_ms};
    *descriptors = limit;
    bw__ds_cache_set_limits(w->datasets, out);
}

/* The data channel speaks what the gRPC listener speaks: plain TCP, or TLS with the same
 * certificate and client-certificate rule; `--data-listen off` turns it off. */
static int start_data_channel(bw_worker *w, char *err, size_t errlen)
{
    const char *dl = w->cfg->data_listen;
    if (dl && strcmp(dl, "off") == 0)
        return BW_OK;
    char host[256], port[16], listen[300];
    if (dl) {
        if (bw__sock_split(dl, host, sizeof(host), port, sizeof(port)) != BW_OK) {
            snprintf(err, errlen, "--data-listen %s: expected HOST:PORT or off", dl);
            return BW_INVALID_ARGUMENT;
        }
        snprintf(listen, sizeof(listen), "%s", dl);
    } else {
        const char *colon = strrchr(w->bound, ':');
        snprintf(listen, sizeof(listen), "%.*s:0", colon ? (int)(colon - w->bound) : 0, w->bound);
    }
    SSL_CTX *tls = NULL;
    if (w->cfg->common.tls_cert) {
        bw_tls_server_files f = {w->cfg->common.tls_cert, w->cfg->common.tls_key,
                                 w->cfg->common.tls_client_ca};
        int rc = bw__dchan_tls_server_ctx(&f, &tls, err, errlen);
        if (rc != BW_OK)
            return rc;
    }
    int bound_port = 0;
    int rc = bw__dchan_server_start(w, listen, tls, &w->dchan, &bound_port, err, errlen);
    if (rc != BW_OK)
        return rc;
    if (w->cfg->data_advertise) {
        snprintf(w->data_advertise, sizeof(w->data_advertise), "%s", w->cfg->data_advertise);
    } else {
        const char *colon = strrchr(w->advertise, ':');
        snprintf(w->data_advertise, sizeof(w->data_advertise), "%.*s:%d",
                 colon ? (int)(colon - w->advertise) : 0, w->advertise, bound_port);
    }
    return BW_OK;
}

int main(int argc, char **argv)
{
    bw__daemon_block_signals();
    bw__tune_malloc();
    bw_worker_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    int status =
        bw__config_main("batchwire-worker", "--coordinator HOST:PORT --data-root DIR [options]",
                        "Serves dataset shards to batchwire clients.", options, &cfg, argc, argv);
    char err[512];
    if (status < 0 && cfg.id && bw__check_name("--id", cfg.id, BW_NAME_MAX, err, sizeof(err))) {
        fprintf(stderr, "batchwire-worker: %s\n", err); /* the coordinator's rule for ids */
        status = 2;
    }
    if (status >= 0) {
        bw__config_free(options, &cfg);
        return status;
    }
    bw__daemon_logging(&cfg.common, "worker");

    bw_worker w;
    memset(&w, 0, sizeof(w));
    w.cfg = &cfg;
    w.start_ms = bw__mono_ms();
    w.incarnation = bw__random_u64();
    if (cfg.id)
        snprintf(w.id, sizeof(w.id), "%s", cfg.id);

    bw_rpc_server *srv = NULL;
    bw_metrics *metrics = NULL;
    bw_metrics_http *metrics_http = NULL;
    bw__pview_init(&w.placement);
    int rc = bw__daemon_auth(&cfg.common, &w.auth, &w.token, err, sizeof(err));
    if (rc == BW_OK)
        rc = bw__daemon_grants(&cfg.common, w.auth, &w.grants, err, sizeof(err));
    if (rc == BW_OK)
        rc = resolve_data_root(&w, err, sizeof(err));
    if (rc == BW_OK && !(w.datasets = bw__ds_cache_new(w.data_root))) {
        snprintf(err, sizeof(err), "out of memory");
        rc = BW_NOMEM;
    }
    if (rc == BW_OK)
        rc = bw__metrics_daemon_new(cfg.common.metrics_listen, &metrics, err, sizeof(err));
    if (rc == BW_OK && (w.metrics = bw__wm_new(metrics, metrics_state, &w, &rc)) == NULL &&
        rc != BW_OK)
        snprintf(err, sizeof(err), "out of memory for the metrics");
    if (rc == BW_OK)
        bw__ds_cache_set_metrics(w.datasets, w.metrics);
    bw__ds_limits lim;
    uint64_t descriptors = 0;
    if (rc == BW_OK)
        set_budgets(&w, &lim, &descriptors);
    if (rc == BW_OK) {
        bw__exec_opts xo = {(int)cfg.read_threads, (uint64_t)cfg.inflight_bytes,
                            BW_WORKER_ADMIT_WAIT_MS, "--inflight-bytes"};
        rc = bw__exec_start(&xo, &w.exec, err, sizeof(err));
    }
    if (rc == BW_OK) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int n = cfg.transform_threads ? (int)cfg.transform_threads : cores > 0 ? (int)cores : 1;
        bw__stf_set_max_pixels((uint64_t)cfg.transform_max_pixels);
        rc = bw__tfpool_start(n, &w.tfpool, err, sizeof(err));
    }
    if (rc == BW_OK)
        rc = bw__worker_connect(&w, err, sizeof(err));
    if (rc == BW_OK) {
        bw_rpc_server_opts so;
        bw__daemon_server_opts(&cfg.common, "worker", &so);
        /* Data requests are decoded on the executor, bounded by their charge; gRPC refuses
         * larger ones (both limits hold: --max-message-bytes is every daemon's). */
        if (cfg.max_request_bytes < cfg.common.max_message_bytes)
            so.max_receive_bytes = (int)cfg.max_request_bytes;
        so.auth = w.auth;
        so.grants = w.grants;
        so.self_id = w.id; /* set by default_id at the latest */
        so.raw_methods = bw__data_raw_methods;
        so.nraw_methods = bw__data_nraw_methods;
        so.on_bound = default_id;
        rc = bw__rpc_server_start(&so, bw__worker_handlers, bw__worker_nhandlers, &w, &srv, w.bound,
                                  sizeof(w.bound), err, sizeof(err));
    }
    if (rc == BW_OK) {
        advertise_address(&w);
        rc = start_data_channel(&w, err, sizeof(err));
    }
    char metrics_bound[300] = ""; /* its scrapes read the executor, cache and data channel */
    bw_metrics_http_opts mo = {cfg.common.metrics_listen, cfg.common.metrics_auth,
                               cfg.common.tls_cert, cfg.common.tls_key, cfg.common.tls_client_ca};
    if (rc == BW_OK && metrics)
        rc = bw__metrics_http_start(metrics, &mo, &metrics_http, metrics_bound,
                                    sizeof(metrics_bound), err, sizeof(err));
    if (rc == BW_OK) {
        BW_INFO("listening on %s (%s%s) worker=%s advertise=%s data-channel=%s data-root=%s "
                "coordinator=%s",
                w.bound, cfg.common.tls_cert ? "TLS" : "plaintext",
                cfg.common.tls_client_ca ? ", client certificates required" : "", w.id, w.advertise,
                w.data_advertise[0] ? w.data_advertise : "off", w.data_root, cfg.coordinator);
        if (metrics_http)
            BW_INFO("metrics on %s%s", metrics_bound,
                    cfg.common.metrics_auth ? " (bearer token required)" : "");
        bw__daemon_auth_announce(&cfg.common, "worker", w.auth, cfg.tls_ca || cfg.common.tls_cert);
        BW_INFO("dataset budgets max_open_files=%llu descriptor_limit=%llu "
                "dataset_memory_bytes=%llu max_sources=%zu transform_threads=%d",
                (unsigned long long)lim.max_open_files, (unsigned long long)descriptors,
                (unsigned long long)lim.memory_bytes, lim.max_sources,
                bw__tfpool_threads(w.tfpool));
        rc = bw__worker_membership_start(&w, err, sizeof(err));
    }
    if (rc != BW_OK && srv) {
        bw__metrics_http_stop(metrics_http); /* started after the servers: stopped first */
        bw__dchan_server_stop(w.dchan);
        bw__rpc_server_stop(srv, 0);
    }
    if (rc != BW_OK) {
        BW_ERROR("cannot start err=%s", err);
        bw__worker_membership_stop(&w);
        bw__tfpool_stop(w.tfpool);
        bw__exec_stop(w.exec);
        bw__ds_cache_free(w.datasets);
        bw__pview_destroy(&w.placement);
        bw__auth_free(w.auth);
        bw__grants_free(w.grants);
        free(w.token);
        bw__wm_free(w.metrics);
        bw__metrics_free(metrics);
        bw__config_free(options, &cfg);
        return 1;
    }
    int sig;
    while (((sig = bw__daemon_wait_signal(200)) == 0 || sig == SIGHUP) && !atomic_load(&w.fatal))
        if (sig == SIGHUP) {
            bw__daemon_auth_reload(w.auth);
            bw__daemon_grants_reload(w.grants);
        }
    if (sig)
        BW_INFO("received %s; shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    bw__worker_membership_stop(&w);
    bw__metrics_http_stop(metrics_http); /* its scrapes read the parts stopped below */
    bw__dchan_server_stop(w.dchan);
    bw__rpc_server_stop(srv, (int)cfg.common.grace_ms); /* waits for calls on the executor */
    bw__tfpool_stop(w.tfpool); /* after every read that could run a window */
    bw__exec_stop(w.exec);
    bw__ds_cache_free(w.datasets);
    bw__pview_destroy(&w.placement);
    bw__auth_free(w.auth);
    bw__grants_free(w.grants);
    free(w.token);
    bw__wm_free(w.metrics);
    bw__metrics_free(metrics);
    BW_INFO("stopped");
    status = atomic_load(&w.fatal) ? 1 : 0;
    bw__config_free(options, &cfg);
    return status;
}
