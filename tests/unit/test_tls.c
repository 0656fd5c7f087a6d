/* TLS credential loading: good files give credentials; missing, empty, malformed, swapped,
 * mismatched and expired files give an error naming the flag and the file. Certificates are
 * generated with the openssl command (and one expired one with the OpenSSL API). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "test_dir.h"
#include "batchwire/batchwire.h"
#include "rpc/dchan.h"
#include "rpc/tls.h"

static char dir[256];
static char err[1024];

static const char *path(const char *name)
{
    static char bufs[8][512];
    static int next;
    char *p = bufs[next++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static void write_file(const char *name, const char *text, size_t len)
{
    FILE *f = fopen(path(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
}

static void run(const char *cmd)
{
    char full[2048];
    snprintf(full, sizeof(full), "cd %s && %s >/dev/null 2>&1", dir, cmd);
    if (system(full) != 0)
        fail_msg("command failed: %s", cmd);
}

/* A certificate valid from two hours ago to one hour ago. */
static void write_expired(void)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    assert_non_null(k);
    assert_non_null(x);
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 7);
    X509_gmtime_adj(X509_getm_notBefore(x), -7200);
    X509_gmtime_adj(X509_getm_notAfter(x), -3600);
    X509_set_pubkey(x, k);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"old", -1, -1, 0);
    X509_set_issuer_name(x, name);
    assert_true(X509_sign(x, k, EVP_sha256()) > 0);
    FILE *f = fopen(path("expired.pem"), "wb");
    PEM_write_X509(f, x);
    fclose(f);
    f = fopen(path("expired.key"), "wb");
    PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL);
    fclose(f);
    X509_free(x);
    EVP_PKEY_free(k);
}

static int group_setup(void **state)
{
    (void)state;
    if (bw_test_dir_make(dir, sizeof(dir), "bw_test_tls") != 0)
        return -1;
    const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 %s -keyout ca.key -out ca.pem -subj /CN=test-ca "
             "-days 2",
             ec);
    run(cmd);
    snprintf(cmd, sizeof(cmd),
             "openssl req %s -keyout server.key -out server.csr -subj /CN=localhost && "
             "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext && "
             "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
             "-out server.pem -days 2 -extfile san.ext",
             ec);
    run(cmd);
    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 %s -keyout other.key -out other.pem -subj /CN=o "
             "-days 2",
             ec);
    run(cmd);
    write_expired();
    write_file("empty.pem", "", 0);
    const char garbage[] = "this is not PEM at all\n";
    write_file("garbage.pem", garbage, sizeof(garbage) - 1);
    /* A certificate cut in half. */
    FILE *f = fopen(path("server.pem"), "rb");
    char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    write_file("truncated.pem", buf, n / 2);
    grpc_init();
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    grpc_shutdown();
    return bw_test_dir_remove(dir);
}

static int server(const char *cert, const char *key, const char *ca)
{
    bw_tls_server_files f = {cert ? path(cert) : NULL, key ? path(key) : NULL,
                             ca ? path(ca) : NULL};
    grpc_server_credentials *creds = NULL;
    err[0] = '\0';
    int rc = bw__tls_server_credentials(&f, &creds, err, sizeof(err));
    if (rc == BW_OK) {
        assert_non_null(creds);
        grpc_server_credentials_release(creds);
    } else {
        assert_null(creds);
        assert_true(strlen(err) > 0);
    }
    return rc;
}

static int client(const char *ca, const char *cert, const char *key)
{
    bw_tls_client_files f = {
        ca ? path(ca) : NULL, cert ? path(cert) : NULL, key ? path(key) : NULL, NULL, 0, NULL};
    grpc_channel_credentials *creds = NULL;
    err[0] = '\0';
    int rc = bw__tls_client_credentials(&f, &creds, err, sizeof(err));
    if (rc == BW_OK) {
        assert_non_null(creds);
        grpc_channel_credentials_release(creds);
    } else {
        assert_null(creds);
    }
    return rc;
}

static void assert_err_has(const char *a, const char *b)
{
    if (!strstr(err, a) || (b && !strstr(err, b)))
        fail_msg("error '%s' lacks '%s'%s%s", err, a, b ? " or " : "", b ? b : "");
}

static void test_good_files(void **state)
{
    (void)state;
    assert_int_equal(server(NULL, NULL, NULL), BW_OK); /* plaintext */
    assert_int_equal(server("server.pem", "server.key", NULL), BW_OK);
    assert_int_equal(server("server.pem", "server.key", "ca.pem"), BW_OK);
    assert_int_equal(client(NULL, NULL, NULL), BW_OK); /* plaintext */
    assert_int_equal(client("ca.pem", NULL, NULL), BW_OK);
    assert_int_equal(client("ca.pem", "server.pem", "server.key"), BW_OK);
}

static void test_missing_files(void **state)
{
    (void)state;
    assert_int_equal(server("nope.pem", "server.key", NULL), BW_TLS);
    assert_err_has("--tls-cert", "nope.pem: cannot open: No such file or directory");
    assert_int_equal(server("server.pem", "nope.key", NULL), BW_TLS);
    assert_err_has("--tls-key", "nope.key: cannot open");
    assert_int_equal(server("server.pem", "server.key", "nope-ca.pem"), BW_TLS);
    assert_err_has("--tls-client-ca", "nope-ca.pem");
    assert_int_equal(client("nope-ca.pem", NULL, NULL), BW_TLS);
    assert_err_has("--tls-ca", "nope-ca.pem: cannot open");
    assert_int_equal(server(".", "server.key", NULL), BW_TLS);
    assert_err_has("--tls-cert", "not a regular file");
}

static void test_incomplete_pairs(void **state)
{
    (void)state;
    assert_int_equal(server("server.pem", NULL, NULL), BW_TLS);
    assert_err_has("needs both --tls-cert and --tls-key", "--tls-key is missing");
    assert_int_equal(server(NULL, "server.key", NULL), BW_TLS);
    assert_err_has("--tls-cert is missing", NULL);
    assert_int_equal(client("ca.pem", "server.pem", NULL), BW_TLS);
    assert_err_has("--tls-key is missing", NULL);
}

static void test_malformed_pem(void **state)
{
    (void)state;
    assert_int_equal(server("empty.pem", "server.key", NULL), BW_TLS);
    assert_err_has("--tls-cert", "empty.pem: file is empty");
    assert_int_equal(server("garbage.pem", "server.key", NULL), BW_TLS);
    assert_err_has("--tls-cert", "garbage.pem: not a PEM certificate");
    assert_int_equal(server("truncated.pem", "server.key", NULL), BW_TLS);
    assert_err_has("truncated.pem: not a PEM certificate", NULL);
    assert_int_equal(server("server.pem", "garbage.pem", NULL), BW_TLS);
    assert_err_has("--tls-key", "garbage.pem: not a PEM private key");
    assert_int_equal(client("garbage.pem", NULL, NULL), BW_TLS);
    assert_err_has("--tls-ca", "not a PEM certificate");
    assert_int_equal(server("server.pem", "server.key", "empty.pem"), BW_TLS);
    assert_err_has("--tls-client-ca", "file is empty");
}

static void test_swapped_and_mismatched(void **state)
{
    (void)state;
    /* The key given as the certificate and the other way round. */
    assert_int_equal(server("server.key", "server.pem", NULL), BW_TLS);
    assert_err_has("--tls-cert", "server.key: not a PEM certificate");
    /* A key that belongs to another certificate. */
    assert_int_equal(server("server.pem", "other.key", NULL), BW_TLS);
    assert_err_has("--tls-key", "other.key does not match the certificate in --tls-cert");
    assert_int_equal(client("ca.pem", "server.pem", "other.key"), BW_TLS);
    assert_err_has("does not match", NULL);
}

static void test_expired(void **state)
{
    (void)state;
    assert_int_equal(server("expired.pem", "expired.key", NULL), BW_TLS);
    assert_err_has("--tls-cert", "expired.pem: certificate is expired");
    assert_int_equal(client("expired.pem", NULL, NULL), BW_TLS);
    assert_err_has("--tls-ca", "certificate is expired");
}

static X509 *read_cert(const char *name)
{
    FILE *f = fopen(path(name), "rb");
    assert_non_null(f);
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    assert_non_null(x);
    return x;
}

/* What a refused worker's certificate names, as the errors give it (docs/security.md,
 * "Worker certificates"): DNS and IP subject alternative names in order, IPv6 included, or
 * the CN when there are none; a short buffer is cut, never overrun. */
static void test_cert_names(void **state)
{
    (void)state;
    char names[256];
    X509 *x = read_cert("server.pem");
    bw__tls_cert_names(x, names, sizeof(names));
    assert_string_equal(names, "DNS:localhost, IP:127.0.0.1");
    memset(names, 'z', sizeof(names));
    bw__tls_cert_names(x, names, 12);
    assert_string_equal(names, "DNS:localho");
    X509_free(x);
    x = read_cert("other.pem");
    bw__tls_cert_names(x, names, sizeof(names));
    assert_string_equal(names, "no DNS or IP subject alternative name (CN=o)");
    X509_free(x);

    x = X509_new();
    assert_non_null(x);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, NID_subject_alt_name,
                                              "IP:2001:db8::7, DNS:*.w.example, email:a@b.c");
    assert_non_null(ext);
    assert_int_equal(X509_add_ext(x, ext, -1), 1);
    X509_EXTENSION_free(ext);
    bw__tls_cert_names(x, names, sizeof(names));
    assert_string_equal(names, "IP:2001:db8::7, DNS:*.w.example");
    X509_free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_files),
        cmocka_unit_test(test_missing_files),
        cmocka_unit_test(test_incomplete_pairs),
        cmocka_unit_test(test_malformed_pem),
        cmocka_unit_test(test_swapped_and_mismatched),
        cmocka_unit_test(test_expired),
        cmocka_unit_test(test_cert_names),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
