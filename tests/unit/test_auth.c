/* Principals, tokens, the authorization table, names, and the request checker
 * (core/auth/auth.c, core/common/text.c, core/rpc/proto_check.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth/auth.h"
#include "batchwire/batchwire.h"
#include "common/text.h"
#include "data.pb-c.h"
#include "rpc/proto_check.h"

static char path[64];

static void write_file(const char *text)
{
    snprintf(path, sizeof(path), "/tmp/bw-auth-test-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void load_tokens(bw_auth **a)
{
    /* The hash form of a token: computed here the way an operator would (sha256sum). */
    FILE *p = popen("printf %s 0123456789abcdef-worker0 | sha256sum | cut -c1-64", "r");
    assert_non_null(p);
    char hex[80] = "";
    assert_non_null(fgets(hex, sizeof(hex), p));
    pclose(p);
    hex[64] = 0;
    char text[1024];
    snprintf(text, sizeof(text),
             "# role name token\n"
             "admin ops 0123456789abcdef-admin\n"
             "trainer alice 0123456789abcdef-alice\n"
             "\n"
             "worker w0 sha256:%s\n"
             "trainer certonly -\n",
             hex);
    write_file(text);
    char err[256];
    assert_int_equal(bw__auth_open(path, a, err, sizeof(err)), BW_OK);
    assert_true(bw__auth_enabled(*a));
}

static void test_identify_and_authorize(void **state)
{
    (void)state;
    bw_auth *a;
    load_tokens(&a);
    bw_principal who;
    char err[256];
    assert_int_equal(
        bw__auth_check(a, BW_M_JOBS_JOIN, "0123456789abcdef-alice", NULL, &who, err, sizeof(err)),
        BW_OK);
    assert_string_equal(who.name, "alice");
    assert_int_equal(who.role, BW_ROLE_TRAINER);
    /* a trainer may not register workers */
    assert_int_equal(bw__auth_check(a, BW_M_REGISTER_WORKER, "0123456789abcdef-alice", NULL, &who,
                                    err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "RegisterWorker"));
    /* the hashed token of a worker */
    assert_int_equal(
        bw__auth_check(a, BW_M_HEARTBEAT, "0123456789abcdef-worker0", NULL, &who, err, sizeof(err)),
        BW_OK);
    assert_string_equal(who.name, "w0");
    /* a worker may not read samples or touch jobs */
    assert_int_equal(bw__auth_check(a, BW_M_DATA_READ_SAMPLES, "0123456789abcdef-worker0", NULL,
                                    &who, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_int_equal(bw__auth_check(a, BW_M_JOBS_COMMIT_CURSOR, "0123456789abcdef-worker0", NULL,
                                    &who, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    /* an admin may do everything */
    for (int m = 0; m < BW_M__COUNT; m++)
        assert_int_equal(bw__auth_check(a, (bw_method_id)m, "0123456789abcdef-admin", NULL, &who,
                                        err, sizeof(err)),
                         BW_OK);
    /* no credentials: only the health check answers */
    assert_int_equal(bw__auth_check(a, BW_M_HEALTH_CHECK, NULL, NULL, &who, err, sizeof(err)),
                     BW_OK);
    assert_int_equal(bw__auth_check(a, BW_M_COORDINATOR_INFO, NULL, NULL, &who, err, sizeof(err)),
                     BW_UNAUTHENTICATED);
    assert_int_equal(
        bw__auth_check(a, BW_M_JOBS_LIST, "wrong-token-0123456789", NULL, &who, err, sizeof(err)),
        BW_UNAUTHENTICATED);
    assert_null(strstr(err, "wrong-token")); /* a refusal never repeats a token */
    /* certificates: by name; a token and a certificate of two principals are refused */
    assert_int_equal(bw__auth_check(a, BW_M_JOBS_GET, NULL, "certonly", &who, err, sizeof(err)),
                     BW_OK);
    assert_string_equal(who.name, "certonly");
    assert_int_equal(bw__auth_check(a, BW_M_JOBS_GET, NULL, "stranger", &who, err, sizeof(err)),
                     BW_UNAUTHENTICATED);
    assert_int_equal(bw__auth_check(a, BW_M_JOBS_GET, "0123456789abcdef-alice", "certonly", &who,
                                    err, sizeof(err)),
                     BW_UNAUTHENTICATED);
    bw__auth_free(a);
    unlink(path);
}

static void test_ownership(void **state)
{
    (void)state;
    bw_principal alice = {BW_ROLE_TRAINER, "alice"}, bob = {BW_ROLE_TRAINER, "bob"};
    bw_principal admin = {BW_ROLE_ADMIN, "ops"}, open = {BW_ROLE_OPEN, ""};
    assert_true(bw__auth_owns(&alice, "alice"));
    assert_false(bw__auth_owns(&bob, "alice"));
    assert_true(bw__auth_owns(&admin, "alice"));
    assert_true(bw__auth_owns(&open, "alice"));
    assert_true(bw__auth_owns(&bob, "")); /* made while the service was open */
}

static void test_open_service(void **state)
{
    (void)state;
    bw_auth *a;
    char err[256];
    assert_int_equal(bw__auth_open(NULL, &a, err, sizeof(err)), BW_OK);
    assert_false(bw__auth_enabled(a));
    bw_principal who;
    assert_int_equal(bw__auth_check(a, BW_M_REGISTER_WORKER, NULL, NULL, &who, err, sizeof(err)),
                     BW_OK);
    assert_int_equal(who.role, BW_ROLE_OPEN);
    bw__auth_free(a);
}

static void expect_bad_file(const char *text, const char *needle)
{
    write_file(text);
    bw_auth *a = NULL;
    char err[512] = "";
    assert_int_equal(bw__auth_open(path, &a, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_null(a);
    if (!strstr(err, needle))
        fail_msg("'%s' does not say '%s'", err, needle);
    unlink(path);
}

static void test_bad_files(void **state)
{
    (void)state;
    expect_bad_file("root ops 0123456789abcdef0\n", "role 'root'");
    expect_bad_file("admin ops short\n", "at least 16");
    expect_bad_file("admin ops\n", "ROLE NAME TOKEN [ids=");
    expect_bad_file("admin ops 0123456789abcdef0 ids=a b\n", "line 1: expected ROLE NAME TOKEN");
    /* ids= on worker lines only, non-empty patterns, the line named */
    expect_bad_file("admin ops 0123456789abcdef0\ntrainer t 0123456789abcdef1 ids=x\n",
                    "line 2: unexpected fourth field 'ids=x' (only a worker line");
    expect_bad_file("worker w 0123456789abcdef0 id=x\n", "line 1: unexpected fourth field 'id=x'");
    expect_bad_file("worker w 0123456789abcdef0 ids=\n", "line 1: ids= holds an empty pattern");
    expect_bad_file("worker w 0123456789abcdef0 ids=a,,b\n", "empty pattern");
    expect_bad_file("worker w 0123456789abcdef0 ids=a,\n", "empty pattern");
    expect_bad_file("admin ops 0123456789abcdef0\ntrainer ops 0123456789abcdef1\n", "twice");
    expect_bad_file("admin a 0123456789abcdef0\ntrainer b 0123456789abcdef0\n", "same token");
    expect_bad_file("admin a sha256:1234\n", "64 hex");
    expect_bad_file("# nothing\n", "no principal");
    bw_auth *a = NULL;
    char err[256];
    assert_int_equal(bw__auth_open("/nonexistent/tokens", &a, err, sizeof(err)), BW_IO);
    assert_non_null(strstr(err, "/nonexistent/tokens"));
}

/* Which worker ids a principal may register (docs/security.md, "Worker ids"). */
static void test_worker_ids(void **state)
{
    (void)state;
    write_file("admin ops 0123456789abcdef-admin\n"
               "worker w0 0123456789abcdef-w0\n"
               "worker storage 0123456789abcdef-st ids=storage-*,w[12],exact\n"
               "trainer alice 0123456789abcdef-alice\n");
    bw_auth *a;
    char err[512];
    assert_int_equal(bw__auth_open(path, &a, err, sizeof(err)), BW_OK);
    bw_principal who = {BW_ROLE_WORKER, "w0"};
    /* without ids=: only the id equal to the name */
    assert_int_equal(bw__auth_worker_id(a, &who, "w0", err, sizeof(err)), BW_OK);
    assert_int_equal(bw__auth_worker_id(a, &who, "w00", err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "worker id 'w00'"));
    assert_non_null(strstr(err, "add ids=PATTERN to principal 'w0' in --auth-tokens"));
    /* with ids=: exactly what the patterns match, not the name itself */
    snprintf(who.name, sizeof(who.name), "storage");
    const char *yes[] = {"storage-0", "storage-", "storage-a/b", "w1", "w2", "exact"};
    const char *no[] = {"storage", "w3", "w12", "exact2", "xstorage-0", "Storage-0"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        if (bw__auth_worker_id(a, &who, yes[i], err, sizeof(err)) != BW_OK)
            fail_msg("'%s' refused: %s", yes[i], err);
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        if (bw__auth_worker_id(a, &who, no[i], err, sizeof(err)) != BW_PERMISSION_DENIED)
            fail_msg("'%s' allowed", no[i]);
    assert_non_null(strstr(err, "ids=storage-*,w[12],exact do not match it"));
    /* admins and an open service: any id; a principal no longer in the file: none */
    bw_principal admin = {BW_ROLE_ADMIN, "ops"};
    assert_int_equal(bw__auth_worker_id(a, &admin, "anything", err, sizeof(err)), BW_OK);
    bw_principal gone = {BW_ROLE_WORKER, "gone"};
    assert_int_equal(bw__auth_worker_id(a, &gone, "gone", err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_int_equal(bw__auth_worker_id(NULL, &gone, "gone", err, sizeof(err)), BW_OK);
    /* a binding narrowed on reload applies at once */
    write_file("worker storage 0123456789abcdef-st ids=other-*\n");
    size_t n;
    assert_int_equal(bw__auth_reload(a, &n, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__auth_worker_id(a, &who, "storage-0", err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_int_equal(bw__auth_worker_id(a, &who, "other-1", err, sizeof(err)), BW_OK);
    bw__auth_free(a);
    unlink(path);
}

static void test_reload(void **state)
{
    (void)state;
    write_file("trainer alice 0123456789abcdef-alice\n");
    bw_auth *a;
    char err[256];
    assert_int_equal(bw__auth_open(path, &a, err, sizeof(err)), BW_OK);
    bw_principal who;
    assert_int_equal(
        bw__auth_check(a, BW_M_JOBS_GET, "0123456789abcdef-alice", NULL, &who, err, sizeof(err)),
        BW_OK);
    /* rotated: the old token stops working, the new one works */
    write_file("trainer alice 0123456789abcdef-alice2\n");
    size_t n;
    assert_int_equal(bw__auth_reload(a, &n, err, sizeof(err)), BW_OK);
    assert_int_equal(n, 1);
    assert_int_equal(
        bw__auth_check(a, BW_M_JOBS_GET, "0123456789abcdef-alice", NULL, &who, err, sizeof(err)),
        BW_UNAUTHENTICATED);
    assert_int_equal(
        bw__auth_check(a, BW_M_JOBS_GET, "0123456789abcdef-alice2", NULL, &who, err, sizeof(err)),
        BW_OK);
    /* a broken file keeps what was loaded */
    write_file("nonsense\n");
    assert_int_not_equal(bw__auth_reload(a, &n, err, sizeof(err)), BW_OK);
    assert_int_equal(
        bw__auth_check(a, BW_M_JOBS_GET, "0123456789abcdef-alice2", NULL, &who, err, sizeof(err)),
        BW_OK);
    bw__auth_free(a);
    unlink(path);
}

static void test_token_file(void **state)
{
    (void)state;
    write_file("  0123456789abcdef-alice  \nsecond line ignored\n");
    char *t = NULL;
    char err[256];
    assert_int_equal(bw__auth_read_token_file(path, &t, err, sizeof(err)), BW_OK);
    assert_string_equal(t, "0123456789abcdef-alice");
    free(t);
    write_file("\n");
    assert_int_equal(bw__auth_read_token_file(path, &t, err, sizeof(err)), BW_INVALID_ARGUMENT);
    write_file("two words\n");
    assert_int_equal(bw__auth_read_token_file(path, &t, err, sizeof(err)), BW_INVALID_ARGUMENT);
    unlink(path);
}

static void test_names(void **state)
{
    (void)state;
    char err[256];
    assert_int_equal(bw__check_text("job", "run-17", 255, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__check_text("job", "Läufe/μ-ß", 255, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__check_text("job", "", 255, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_int_equal(bw__check_text("job", "a\tb", 255, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "control character"));
    assert_int_equal(bw__check_text("job", "a\xc2\x85z", 255, err, sizeof(err)),
                     BW_INVALID_ARGUMENT); /* U+0085, a C1 control */
    assert_int_equal(bw__check_text("job", "a\xff", 255, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "UTF-8"));
    assert_int_equal(bw__check_text("job", "\xc0\xaf", 255, err, sizeof(err)),
                     BW_INVALID_ARGUMENT); /* overlong '/' */
    assert_int_equal(bw__check_text("job", "\xed\xa0\x80", 255, err, sizeof(err)),
                     BW_INVALID_ARGUMENT); /* a surrogate */
    char long_name[300];
    memset(long_name, 'x', sizeof(long_name));
    long_name[255] = 0;
    assert_int_equal(bw__check_text("job", long_name, 255, err, sizeof(err)), BW_OK);
    long_name[255] = 'x';
    long_name[256] = 0;
    assert_int_equal(bw__check_text("job", long_name, 255, err, sizeof(err)), BW_INVALID_ARGUMENT);
}

static void test_proto_check(void **state)
{
    (void)state;
    char err[256];
    /* JoinJobRequest{job = "ab\0cd"}: field 1, length 5 */
    const uint8_t nul[] = {0x0a, 5, 'a', 'b', 0, 'c', 'd'};
    assert_int_equal(bw__proto_check(&batchwire__v1__join_job_request__descriptor, nul, sizeof(nul),
                                     err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "JoinJobRequest.job"));
    assert_non_null(strstr(err, "NUL"));
    const uint8_t bad_utf8[] = {0x0a, 2, 0xc3, 0x28};
    assert_int_equal(bw__proto_check(&batchwire__v1__join_job_request__descriptor, bad_utf8,
                                     sizeof(bad_utf8), err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    /* nested: JoinJobRequest.holder (field 4) = Holder{host = "\0"} */
    const uint8_t nested[] = {0x22, 3, 0x0a, 1, 0};
    assert_int_equal(bw__proto_check(&batchwire__v1__join_job_request__descriptor, nested,
                                     sizeof(nested), err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "Holder.host"));
    /* a fine one, with an unknown field 99 (skipped) */
    const uint8_t fine[] = {0x0a, 3, 'j', 'o', 'b', 0x10, 2, 0x98, 0x06, 7};
    assert_int_equal(bw__proto_check(&batchwire__v1__join_job_request__descriptor, fine,
                                     sizeof(fine), err, sizeof(err)),
                     BW_OK);
    /* a string over the bound */
    size_t n = BW_PROTO_STRING_MAX + 1;
    uint8_t *big = malloc(n + 4);
    assert_non_null(big);
    big[0] = 0x0a;
    big[1] = (uint8_t)(0x80 | (n & 0x7f));
    big[2] = (uint8_t)(n >> 7);
    memset(big + 3, 'x', n);
    assert_int_equal(
        bw__proto_check(&batchwire__v1__join_job_request__descriptor, big, n + 3, err, sizeof(err)),
        BW_TOO_BIG);
    assert_non_null(strstr(err, "JoinJobRequest.job"));
    free(big);
    /* packed fixed64 (ReadSamplesRequest.indices_fixed, field 10): 8 bytes an element, whatever
     * the bytes are -- the limit counts elements, not bytes without a continuation bit */
    n = (size_t)BW_PROTO_REPEATED_MAX * 8;
    big = calloc(n + 32, 1);
    assert_non_null(big);
    size_t at = 0;
    big[at++] = (10 << 3) | 2;
    for (size_t v = n; v; v >>= 7)
        big[at++] = (uint8_t)((v & 0x7f) | (v >> 7 ? 0x80 : 0));
    assert_int_equal(bw__proto_check(&batchwire__v1__read_samples_request__descriptor, big, at + n,
                                     err, sizeof(err)),
                     BW_OK);
    /* one element more is over the limit */
    at = 0;
    big[at++] = (10 << 3) | 2;
    for (size_t v = n + 8; v; v >>= 7)
        big[at++] = (uint8_t)((v & 0x7f) | (v >> 7 ? 0x80 : 0));
    assert_int_equal(bw__proto_check(&batchwire__v1__read_samples_request__descriptor, big,
                                     at + n + 8, err, sizeof(err)),
                     BW_TOO_BIG);
    assert_non_null(strstr(err, "ReadSamplesRequest.indices_fixed: 1048577"));
    free(big);
    /* a packed fixed64 field of 7 bytes is no whole element: refused naming the field */
    const uint8_t seven[] = {(10 << 3) | 2, 7, 1, 2, 3, 4, 5, 6, 7};
    assert_int_equal(bw__proto_check(&batchwire__v1__read_samples_request__descriptor, seven,
                                     sizeof(seven), err, sizeof(err)),
                     BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "ReadSamplesRequest.indices_fixed: 7 bytes, not a whole number"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identify_and_authorize),
        cmocka_unit_test(test_ownership),
        cmocka_unit_test(test_open_service),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_worker_ids),
        cmocka_unit_test(test_reload),
        cmocka_unit_test(test_token_file),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_proto_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
