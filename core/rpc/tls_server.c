/* The daemons' half of core/rpc/tls.h: gRPC server credentials from --tls-cert, --tls-key and
 * --tls-client-ca (docs/security.md). Daemon-only (bwdaemon): the client library holds only
 * the channel credentials of tls.c. */
#include <stdio.h>
#include <stdlib.h>

#include "batchwire/batchwire.h"
#include "rpc/tls.h"

int bw__tls_server_credentials(const bw_tls_server_files *files, grpc_server_credentials **out,
                               char *err, size_t errlen)
{
    *out = NULL;
    if (!files->cert && !files->key && !files->client_ca) {
        *out = grpc_insecure_server_credentials_create();
        return BW_OK;
    }
    if (!files->cert || !files->key) {
        snprintf(err, errlen, "TLS needs both --tls-cert and --tls-key (%s is missing)",
                 files->cert ? "--tls-key" : "--tls-cert");
        return BW_TLS;
    }
    char *cert = NULL, *key = NULL, *ca = NULL;
    int rc;
    if ((rc = bw__tls_load_pair(files->cert, files->key, &cert, &key, err, errlen)) != BW_OK)
        goto out;
    if (files->client_ca &&
        (rc = bw__tls_load_pem("--tls-client-ca", files->client_ca, 0, &ca, err, errlen)) != BW_OK)
        goto out;
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    *out = grpc_ssl_server_credentials_create_ex(
        ca, &pair, 1,
        ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    if (!*out) {
        snprintf(err, errlen, "gRPC refused the TLS server credentials from %s", files->cert);
        rc = BW_TLS;
    }
out:
    /* gRPC copies the PEM strings. */
    free(cert);
    free(key);
    free(ca);
    return rc;
}
