/* Logging (core/common/log.c): the text and JSON line formats, how a message's key=value words
 * become JSON members, escaping and cutting, the terminal's status line; JSON escaping
 * (core/common/json.c); and the build line every --version prints (core/common/version.c). */
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/json.h"
#include "common/log.h"
#include "common/version.h"

static char captured[16384];
static int ncaptured;

static void capture(void *user, bw_log_level level, const char *line)
{
    (void)user;
    (void)level;
    snprintf(captured, sizeof(captured), "%s", line);
    ncaptured++;
}

/* A strict check of the flat objects the JSON format writes: {"k":"v" or number, ...}. */
static const char *json_string_end(const char *p)
{
    if (*p != '"')
        return NULL;
    for (p++; *p && *p != '"'; p++) {
        if ((unsigned char)*p < 0x20)
            return NULL;
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]))
                        return NULL;
                p += 4;
            } else if (!strchr("\"\\/bfnrt", *p)) {
                return NULL;
            }
        }
    }
    return *p == '"' ? p + 1 : NULL;
}

static int valid_flat_object(const char *p)
{
    if (*p++ != '{')
        return 0;
    for (int first = 1;; first = 0) {
        if (*p == '}')
            return !first ? p[1] == '\0' : 0;
        if (!first && *p++ != ',')
            return 0;
        if (!(p = json_string_end(p)) || *p++ != ':')
            return 0;
        if (*p == '"') {
            if (!(p = json_string_end(p)))
                return 0;
        } else {
            const char *q = p;
            while (*p >= '0' && *p <= '9')
                p++;
            if (p == q)
                return 0;
        }
    }
}

/* The members after "pid":N (the part that does not change from run to run). */
static const char *after_pid(const char *line)
{
    const char *p = strstr(line, "\"pid\":");
    assert_non_null(p);
    p += 6;
    while (*p >= '0' && *p <= '9')
        p++;
    return p;
}

static void json_setup(void)
{
    bw_set_log_callback(capture, NULL, BW_LOG_DEBUG);
    bw__log_set_format(BW_LOG_FORMAT_JSON);
}

static void test_json_fields(void **state)
{
    (void)state;
    json_setup();
    BW_INFO("worker=%s address=%s peer=%s registered again (new process)", "w1", "10.0.0.1:7701",
            "ipv4:10.0.0.9:5555");
    assert_true(valid_flat_object(captured));
    assert_non_null(strstr(captured, "\"level\":\"info\""));
    assert_non_null(strstr(captured, "\"component\":"));
    assert_string_equal(after_pid(captured),
                        ",\"msg\":\"registered again (new process)\",\"worker\":\"w1\","
                        "\"address\":\"10.0.0.1:7701\",\"peer\":\"ipv4:10.0.0.9:5555\"}");

    /* err= takes the rest of the line, key=value words in it included */
    BW_WARN("lease heartbeat failed (will retry) job=j rank=3 err=rank=3 of job 'j': \"gone\"");
    assert_true(valid_flat_object(captured));
    assert_string_equal(after_pid(captured),
                        ",\"msg\":\"lease heartbeat failed (will retry)\",\"job\":\"j\","
                        "\"rank\":\"3\",\"err\":\"rank=3 of job 'j': \\\"gone\\\"\"}");

    /* a key seen before, reserved names and words that are not keys stay in the text */
    BW_ERROR("a=1 a=2 msg=x level=y Key=z 9k=1 =v data-root=/d");
    assert_true(valid_flat_object(captured));
    assert_string_equal(after_pid(captured),
                        ",\"msg\":\"a=2 msg=x level=y Key=z 9k=1 =v\",\"a\":\"1\","
                        "\"data-root\":\"/d\"}");
    assert_non_null(strstr(captured, "\"level\":\"error\""));

    /* control characters, quotes, backslashes and bytes that are not UTF-8 */
    BW_DEBUG("odd path=%s text \"q\" \\ \t \x01 \xff \xc3\xa9", "a\"b");
    assert_true(valid_flat_object(captured));
    assert_non_null(strstr(captured, "\"path\":\"a\\\"b\""));
    assert_non_null(strstr(captured, "\\u0001"));
    assert_non_null(strstr(captured, "\\ufffd"));
    assert_non_null(strstr(captured, "\xc3\xa9"));
    assert_non_null(strstr(captured, "\"level\":\"debug\""));

    /* a newline in a value does not split the event */
    BW_INFO("two lines err=first\nsecond");
    assert_true(valid_flat_object(captured));
    assert_null(strchr(captured, '\n'));
    bw_set_log_callback(NULL, NULL, BW_LOG_ERROR);
    bw__log_set_format(BW_LOG_FORMAT_TEXT);
}

static void test_json_long_messages_stay_whole(void **state)
{
    (void)state;
    json_setup();
    /* Messages longer than a line: cut, but always one complete object. */
    static char big[20000];
    for (size_t len = 100; len < sizeof(big); len = len * 3 / 2) {
        for (int escape = 0; escape < 2; escape++) {
            memset(big, escape ? '"' : 'x', len);
            big[len] = '\0';
            for (size_t i = 7; i < len; i += 11)
                big[i] = ' ';
            memcpy(big, "k=v ", 4);
            BW_INFO("%s", big);
            assert_true(valid_flat_object(captured));
            BW_INFO("many %s err=%s", "a=1 b=2 c=3 d=4 e=5 f=6 g=7 h=8 i=9 j=10", big);
            assert_true(valid_flat_object(captured));
        }
    }
    bw_set_log_callback(NULL, NULL, BW_LOG_ERROR);
    bw__log_set_format(BW_LOG_FORMAT_TEXT);
}

static void test_text_format_and_levels(void **state)
{
    (void)state;
    bw_set_log_callback(capture, NULL, BW_LOG_INFO);
    ncaptured = 0;
    BW_INFO("listening on %s tls=off", "127.0.0.1:1");
    assert_int_equal(ncaptured, 1);
    /* "2024-01-01T00:00:00.000Z INFO  component[pid]: message" */
    assert_int_equal(strlen(captured) > 24 && captured[4] == '-' && captured[23] == 'Z', 1);
    assert_non_null(strstr(captured, " INFO  "));
    assert_non_null(strstr(captured, "]: listening on 127.0.0.1:1 tls=off"));
    BW_DEBUG("not formatted at info");
    assert_int_equal(ncaptured, 1);
    bw_log_level lv;
    assert_int_equal(bw__log_level_parse("warning", &lv), BW_OK);
    assert_int_equal(lv, BW_LOG_WARN);
    assert_int_equal(bw__log_level_parse("loud", &lv), BW_INVALID_ARGUMENT);
    /* no status line without a terminal on stderr */
    assert_false(bw__log_has_status_line());
    bw_set_log_callback(NULL, NULL, BW_LOG_ERROR);
}

/* On a terminal the status line is drawn, erased before each log line and drawn again. */
static void test_status_line_on_a_terminal(void **state)
{
    (void)state;
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    assert_true(master >= 0);
    assert_int_equal(grantpt(master), 0);
    assert_int_equal(unlockpt(master), 0);
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    assert_true(slave >= 0);
    int saved = dup(STDERR_FILENO);
    dup2(slave, STDERR_FILENO);
    bw__log_to_stderr("unit", BW_LOG_INFO);
    bool has = bw__log_has_status_line();
    bw__log_status_line("indexing done=1");
    BW_INFO("an event");
    bw__log_status_line(NULL);
    bw__log_set_format(BW_LOG_FORMAT_JSON);
    bool json_has = bw__log_has_status_line(); /* JSON lines never get a status line */
    bw__log_set_format(BW_LOG_FORMAT_TEXT);
    dup2(saved, STDERR_FILENO);
    close(saved);
    bw_set_log_callback(NULL, NULL, BW_LOG_ERROR);
    assert_true(has);
    assert_false(json_has);
    /* Everything written to the terminal, read until it has been quiet for 200 ms: the pty
     * hands it over in pieces. */
    char out[4096];
    size_t n = 0;
    fcntl(master, F_SETFL, O_NONBLOCK);
    for (;;) {
        struct pollfd pfd = {master, POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0)
            break;
        ssize_t got = read(master, out + n, sizeof(out) - 1 - n);
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    assert_true(n > 0);
    out[n] = '\0';
    const char *a = strstr(out, "\r\033[Kindexing done=1");
    assert_non_null(a);
    const char *b = strstr(a + 1, "\r\033[K");
    assert_non_null(b);
    const char *c = strstr(b, "]: an event");
    assert_non_null(c);
    const char *d = strstr(c, "indexing done=1"); /* drawn again below the event */
    assert_non_null(d);
    assert_non_null(strstr(d, "\r\033[K")); /* and removed */
    close(slave);
    close(master);
}

static void test_json_escape(void **state)
{
    (void)state;
    char buf[16];
    size_t len = 0;
    assert_true(bw__json_escape(buf, sizeof(buf), &len, "a\"b", 3));
    assert_string_equal(buf, "a\\\"b");
    /* whole escapes only: \u0001 (6 bytes) does not fit in what is left */
    len = 0;
    assert_false(bw__json_escape(buf, 10, &len, "abcd\x01", 5));
    assert_string_equal(buf, "abcd");
    /* a UTF-8 sequence cut by the end of the input is not valid */
    len = 0;
    assert_true(bw__json_escape(buf, sizeof(buf), &len, "\xc3\xa9\xc3", 3));
    assert_string_equal(buf, "\xc3\xa9\\ufffd");
}

static void test_build_line(void **state)
{
    (void)state;
    const char *b = bw_build_info();
    /* "0.1.0 commit=... build=... tls=yes cuda=yes|no" */
    assert_int_equal(strncmp(b, bw_version(), strlen(bw_version())), 0);
    assert_non_null(strstr(b, " commit="));
    assert_non_null(strstr(b, " build="));
    assert_non_null(strstr(b, " tls=yes cuda="));
    assert_true(strlen(bw__build_commit()) > 0 && !strchr(bw__build_commit(), ' '));
    size_t n;
    const char *const *f = bw__build_features(&n);
    assert_true(n >= 1);
    assert_string_equal(f[0], "tls");
    char out[512];
    FILE *m = fmemopen(out, sizeof(out), "w");
    bw__version_print(m, "prog");
    fclose(m);
    assert_int_equal(strncmp(out, "prog ", 5), 0);
    assert_string_equal(out + 5 + strlen(b), "\n");
    char *args[] = {"prog", "--x", "--version", NULL};
    assert_false(bw__version_flag(2, args, "prog"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_fields),
        cmocka_unit_test(test_json_long_messages_stay_whole),
        cmocka_unit_test(test_text_format_and_levels),
        cmocka_unit_test(test_status_line_on_a_terminal),
        cmocka_unit_test(test_json_escape),
        cmocka_unit_test(test_build_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
