/* The serving end of the data channel (dchan.h): the listening socket and the server's TLS
 * context. Daemon-only (bwdaemon): the client library connects and never listens. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "rpc/dchan.h"
#include "rpc/dchan_int.h"
#include "rpc/tls.h"

int bw__sock_listen(const char *addr, int *fd, int *bound_port, char *err, size_t errlen)
{
    struct addrinfo *res = NULL;
    int rc = bw__sock_resolve(addr, true, &res, err, errlen);
    if (rc != BW_OK)
        return rc;
    int s = -1, saved = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (s < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        /* SOMAXCONN (4096 on current kernels): a burst of connections waits in the kernel
         * for the accept loop instead of costing its clients a SYN retransmission (1 s) */
        if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, SOMAXCONN) == 0)
            break;
        saved = errno;
        close(s);
        s = -1;
    }
    freeaddrinfo(res);
    if (s < 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", addr, strerror(saved));
        return BW_UNAVAILABLE;
    }
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    socklen_t sl = sizeof(ss);
    if (getsockname(s, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(err, errlen, "listening on %s: cannot read the port: %s", addr, strerror(errno));
        close(s);
        return BW_UNAVAILABLE;
    }
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    *fd = s;
    return BW_OK;
}

int bw__dchan_tls_server_ctx(const struct bw_tls_server_files *files, SSL_CTX **out, char *err,
                             size_t errlen)
{
    *out = NULL;
    SSL_CTX *ctx = bw__dchan_tls_new_ctx(TLS_server_method(), err, errlen);
    if (!ctx)
        return BW_TLS;
    int rc = bw__dchan_tls_load_pair(ctx, files->cert, files->key, err, errlen);
    if (rc == BW_OK && files->client_ca) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(files->client_ca);
        if (SSL_CTX_load_verify_locations(ctx, files->client_ca, NULL) != 1 || !names) {
            char why[256];
            bw__dchan_tls_reason(why, sizeof(why), "no certificate");
            snprintf(err, errlen, "--tls-client-ca %s: %s", files->client_ca, why);
            rc = BW_TLS;
        } else {
            SSL_CTX_set_client_CA_list(ctx, names);
            names = NULL;
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
        }
        sk_X509_NAME_pop_free(names, X509_NAME_free);
    }
    if (rc != BW_OK) {
        SSL_CTX_free(ctx);
        return rc;
    }
    *out = ctx;
    return BW_OK;
}
