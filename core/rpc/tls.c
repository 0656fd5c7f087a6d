/* TLS for gRPC (tls.h): reading and checking PEM files, and the channel credentials a client
 * presents. The server credentials are in tls_server.c (daemon-only). */
#include "rpc/tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "batchwire/batchwire.h"

enum { PEM_MAX = 1 << 20 };

static int read_file(const char *flag, const char *path, char **out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s %s: cannot open: %s", flag, path, strerror(errno));
        return BW_TLS;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s %s: not a regular file", flag, path);
        fclose(f);
        return BW_TLS;
    }
    if (st.st_size > PEM_MAX) {
        snprintf(err, errlen, "%s %s: %lld bytes is too large for a PEM file (limit %d)", flag,
                 path, (long long)st.st_size, PEM_MAX);
        fclose(f);
        return BW_TLS;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        snprintf(err, errlen, "%s %s: out of memory for its %lld bytes", flag, path,
                 (long long)st.st_size);
        fclose(f);
        return BW_NOMEM;
    }
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    buf[n] = '\0';
    if (n == 0) {
        snprintf(err, errlen, "%s %s: file is empty", flag, path);
        free(buf);
        return BW_TLS;
    }
    *out = buf;
    return BW_OK;
}

static void openssl_reason(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, buf, len);
    else
        snprintf(buf, len, "no PEM block found");
    ERR_clear_error();
}

/* Parses every certificate in `pem`; returns how many, 0 with a reason on failure. */
static int count_certs(const char *pem, X509 **first, char *why, size_t whylen)
{
    BIO *bio = BIO_new_mem_buf(pem, -1);
    if (!bio) {
        snprintf(why, whylen, "out of memory reading it");
        return 0;
    }
    int n = 0;
    X509 *x;
    ERR_clear_error();
    while ((x = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL) {
        if (n == 0 && first)
            *first = x;
        else
            X509_free(x);
        n++;
    }
    unsigned long e = ERR_peek_last_error();
    if (n == 0)
        openssl_reason(why, whylen);
    else if (e && ERR_GET_REASON(e) != PEM_R_NO_START_LINE) {
        openssl_reason(why, whylen);
        if (first && *first) {
            X509_free(*first);
            *first = NULL;
        }
        n = 0;
    }
    ERR_clear_error();
    BIO_free(bio);
    return n;
}

int bw__tls_load_pem(const char *flag, const char *path, int want_key, char **pem, char *err,
                     size_t errlen)
{
    char *buf = NULL;
    int rc = read_file(flag, path, &buf, err, errlen);
    if (rc != BW_OK)
        return rc;
    char why[256];
    if (want_key) {
        BIO *bio = BIO_new_mem_buf(buf, -1);
        ERR_clear_error();
        EVP_PKEY *k = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
        BIO_free(bio);
        if (!k) {
            openssl_reason(why, sizeof(why));
            snprintf(err, errlen, "%s %s: not a PEM private key (%s)", flag, path, why);
            free(buf);
            return BW_TLS;
        }
        EVP_PKEY_free(k);
    } else {
        X509 *first = NULL;
        int n = count_certs(buf, &first, why, sizeof(why));
        if (n == 0) {
            snprintf(err, errlen, "%s %s: not a PEM certificate (%s)", flag, path, why);
            free(buf);
            return BW_TLS;
        }
        int expired = X509_cmp_current_time(X509_get0_notAfter(first)) < 0;
        int future = X509_cmp_current_time(X509_get0_notBefore(first)) > 0;
        X509_free(first);
        if (expired || future) {
            snprintf(err, errlen, "%s %s: certificate is %s", flag, path,
                     expired ? "expired" : "not valid yet");
            free(buf);
            return BW_TLS;
        }
    }
    *pem = buf;
    return BW_OK;
}

/* Checks that the key in key_pem belongs to the first certificate of cert_pem: BW_OK, or
 * BW_TLS with a sentence naming both settings and files. */
static int check_pair(const char *cert_flag, const char *cert_path, const char *cert_pem,
                      const char *key_flag, const char *key_path, const char *key_pem, char *err,
                      size_t errlen)
{
    BIO *cb = BIO_new_mem_buf(cert_pem, -1);
    BIO *kb = BIO_new_mem_buf(key_pem, -1);
    X509 *x = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
    EVP_PKEY *k = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
    int ok = x && k && X509_check_private_key(x, k) == 1;
    X509_free(x);
    EVP_PKEY_free(k);
    BIO_free(cb);
    BIO_free(kb);
    ERR_clear_error();
    if (!ok) {
        snprintf(err, errlen, "%s %s does not match the certificate in %s %s", key_flag, key_path,
                 cert_flag, cert_path);
        return BW_TLS;
    }
    return BW_OK;
}

int bw__tls_load_pair(const char *cert_path, const char *key_path, char **cert, char **key,
                      char *err, size_t errlen)
{
    int rc;
    if ((rc = bw__tls_load_pem("--tls-cert", cert_path, 0, cert, err, errlen)) != BW_OK ||
        (rc = bw__tls_load_pem("--tls-key", key_path, 1, key, err, errlen)) != BW_OK)
        return rc;
    return check_pair("--tls-cert", cert_path, *cert, "--tls-key", key_path, *key, err, errlen);
}

int bw__tls_client_enabled(const bw_tls_client_files *files)
{
    return files && (files->ca || files->cert || files->key || files->use_tls);
}

int bw__tls_client_credentials(const bw_tls_client_files *files, grpc_channel_credentials **out,
                               char *err, size_t errlen)
{
    *out = NULL;
    if (!bw__tls_client_enabled(files)) {
        *out = grpc_insecure_credentials_create();
        return BW_OK;
    }
    if ((files->cert != NULL) != (files->key != NULL)) {
        snprintf(err, errlen,
                 "a client certificate needs both --tls-cert and --tls-key (%s is "
                 "missing)",
                 files->cert ? "--tls-key" : "--tls-cert");
        return BW_TLS;
    }
    char *cert = NULL, *key = NULL, *ca = NULL;
    int rc = BW_OK;
    if (files->ca && (rc = bw__tls_load_pem("--tls-ca", files->ca, 0, &ca, err, errlen)) != BW_OK)
        goto out;
    if (files->cert &&
        (rc = bw__tls_load_pair(files->cert, files->key, &cert, &key, err, errlen)) != BW_OK)
        goto out;
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    *out = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    if (!*out) {
        snprintf(err, errlen, "gRPC refused the TLS client credentials");
        rc = BW_TLS;
    }
out:
    free(cert);
    free(key);
    free(ca);
    return rc;
}
