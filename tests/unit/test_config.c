/* The configuration table: flags, environment, defaults, bounds, help, and error messages
 * that name the setting and the value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/config.h"

typedef struct cfg {
    char *listen;
    char *state_dir;
    char *name;
    int64_t heartbeat_ms;
    uint64_t seed;
    bool json;
    int mode;
} cfg;

static const bw_opt opts[] = {
    {"listen", BW_OPT_ADDR, offsetof(cfg, listen), "127.0.0.1:7700", 0, 0, NULL, 0, "HOST:PORT",
     "where to listen"},
    {"state-dir", BW_OPT_PATH, offsetof(cfg, state_dir), NULL, 0, 0, NULL, BW_OPT_REQUIRED, "DIR",
     "state"},
    {"name", BW_OPT_STRING, offsetof(cfg, name), NULL, 0, 0, NULL, BW_OPT_NO_ENV, "NAME", "name"},
    {"heartbeat-ms", BW_OPT_INT, offsetof(cfg, heartbeat_ms), "1000", 10, 60000, NULL, 0, "MS",
     "interval"},
    {"seed", BW_OPT_UINT64, offsetof(cfg, seed), "0", 0, 0, NULL, 0, "S", "seed"},
    {"json", BW_OPT_BOOL, offsetof(cfg, json), "false", 0, 0, NULL, 0, NULL, "json"},
    {"mode", BW_OPT_ENUM, offsetof(cfg, mode), "torch", 0, 0, "torch|accelerate|iterable", 0, NULL,
     "mode"},
    BW_OPT_END,
};

static char err[512];

static int parse(cfg *c, int argc, char **argv)
{
    memset(c, 0, sizeof(*c));
    err[0] = '\0';
    return bw__config_parse(opts, c, argc, argv, err, sizeof(err));
}

static int setup(void **state)
{
    (void)state;
    unsetenv("BATCHWIRE_LISTEN");
    unsetenv("BATCHWIRE_STATE_DIR");
    unsetenv("BATCHWIRE_HEARTBEAT_MS");
    unsetenv("BATCHWIRE_NAME");
    unsetenv("BATCHWIRE_JSON");
    return 0;
}

static void test_defaults_and_flags(void **state)
{
    (void)state;
    cfg c;
    char *argv[] = {"p",      "--state-dir", "/tmp/x", "--heartbeat-ms=250",  "--json",
                    "--mode", "iterable",    "--seed", "18446744073709551615"};
    assert_int_equal(parse(&c, 9, argv), BW_OK);
    assert_string_equal(c.listen, "127.0.0.1:7700");
    assert_string_equal(c.state_dir, "/tmp/x");
    assert_int_equal(c.heartbeat_ms, 250);
    assert_true(c.json);
    assert_int_equal(c.mode, 2);
    assert_true(c.seed == UINT64_MAX);
    assert_null(c.name);
    bw__config_free(opts, &c);
    assert_null(c.listen);
}

static void test_negative_seed_wraps(void **state)
{
    (void)state;
    cfg c;
    char *argv[] = {"p", "--state-dir", "d", "--seed", "-1"};
    assert_int_equal(parse(&c, 5, argv), BW_OK);
    assert_true(c.seed == UINT64_MAX);
    bw__config_free(opts, &c);
}

static void test_env_then_flag_precedence(void **state)
{
    (void)state;
    cfg c;
    setenv("BATCHWIRE_STATE_DIR", "/env/dir", 1);
    setenv("BATCHWIRE_HEARTBEAT_MS", "500", 1);
    setenv("BATCHWIRE_NAME", "ignored", 1); /* BW_OPT_NO_ENV */
    char *argv1[] = {"p"};
    assert_int_equal(parse(&c, 1, argv1), BW_OK);
    assert_string_equal(c.state_dir, "/env/dir");
    assert_int_equal(c.heartbeat_ms, 500);
    assert_null(c.name);
    bw__config_free(opts, &c);

    char *argv2[] = {"p", "--heartbeat-ms", "700"};
    assert_int_equal(parse(&c, 3, argv2), BW_OK);
    assert_int_equal(c.heartbeat_ms, 700); /* the flag wins */
    bw__config_free(opts, &c);
    setup(NULL);
}

static void test_bad_values_name_flag_and_value(void **state)
{
    (void)state;
    cfg c;
    char *a1[] = {"p", "--state-dir", "d", "--heartbeat-ms", "abc"};
    assert_int_equal(parse(&c, 5, a1), BW_INVALID_ARGUMENT);
    assert_string_equal(err, "--heartbeat-ms: invalid value 'abc': expected an integer from 10 to "
                             "60000");
    bw__config_free(opts, &c);

    char *a2[] = {"p", "--state-dir", "d", "--heartbeat-ms", "5"};
    assert_int_equal(parse(&c, 5, a2), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "--heartbeat-ms: invalid value '5'"));
    bw__config_free(opts, &c);

    char *a3[] = {"p", "--state-dir", "d", "--listen", "localhost"};
    assert_int_equal(parse(&c, 5, a3), BW_INVALID_ARGUMENT);
    assert_string_equal(err, "--listen: invalid value 'localhost': expected HOST:PORT");
    bw__config_free(opts, &c);

    char *a4[] = {"p", "--state-dir", "d", "--listen", "h:70000"};
    assert_int_equal(parse(&c, 5, a4), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "port 70000 is out of range"));
    bw__config_free(opts, &c);

    char *a5[] = {"p", "--state-dir", "d", "--mode", "keras"};
    assert_int_equal(parse(&c, 5, a5), BW_INVALID_ARGUMENT);
    assert_string_equal(err,
                        "--mode: invalid value 'keras': expected one of torch|accelerate|iterable");
    bw__config_free(opts, &c);

    char *a6[] = {"p", "--state-dir", "d", "--json=maybe"};
    assert_int_equal(parse(&c, 4, a6), BW_INVALID_ARGUMENT);
    assert_string_equal(err, "--json: invalid value 'maybe': expected true or false");
    bw__config_free(opts, &c);

    char *a7[] = {"p", "--state-dir", "d", "--seed", "12x"};
    assert_int_equal(parse(&c, 5, a7), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "--seed: invalid value '12x'"));
    bw__config_free(opts, &c);

    char *a8[] = {"p", "--state-dir", "d", "--heartbeat-ms", "99999999999999999999"};
    assert_int_equal(parse(&c, 5, a8), BW_INVALID_ARGUMENT);
    bw__config_free(opts, &c);

    char *a9[] = {"p", "--state-dir", ""};
    assert_int_equal(parse(&c, 3, a9), BW_INVALID_ARGUMENT);
    assert_string_equal(err, "--state-dir: invalid value '': expected a non-empty path");
    bw__config_free(opts, &c);
}

static void test_bad_env_value_names_variable(void **state)
{
    (void)state;
    cfg c;
    setenv("BATCHWIRE_HEARTBEAT_MS", "fast", 1);
    char *argv[] = {"p", "--state-dir", "d"};
    assert_int_equal(parse(&c, 3, argv), BW_INVALID_ARGUMENT);
    assert_string_equal(err, "BATCHWIRE_HEARTBEAT_MS (environment): invalid value 'fast': "
                             "expected an integer from 10 to 60000");
    bw__config_free(opts, &c);
    setup(NULL);
}

static void test_usage_errors(void **state)
{
    (void)state;
    cfg c;
    char *a1[] = {"p", "--state-dir", "d", "--bogus", "1"};
    assert_int_equal(parse(&c, 5, a1), BW_INVALID_ARGUMENT);
    assert_string_equal(err, "unknown option '--bogus' (see --help)");
    bw__config_free(opts, &c);

    char *a2[] = {"p"};
    assert_int_equal(parse(&c, 1, a2), BW_INVALID_ARGUMENT);
    assert_string_equal(err, "--state-dir is required (or set BATCHWIRE_STATE_DIR)");
    bw__config_free(opts, &c);

    char *a3[] = {"p", "--state-dir"};
    assert_int_equal(parse(&c, 2, a3), BW_INVALID_ARGUMENT);
    assert_string_equal(err, "--state-dir: missing value (expected DIR)");
    bw__config_free(opts, &c);

    char *a4[] = {"p", "--state-dir", "d", "stray"};
    assert_int_equal(parse(&c, 4, a4), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "unexpected argument 'stray'"));
    bw__config_free(opts, &c);

    char *a5[] = {"p", "--state-dir", "d", "--no-json"};
    assert_int_equal(parse(&c, 4, a5), BW_OK);
    assert_false(c.json);
    bw__config_free(opts, &c);

    char *a6[] = {"p", "--bogus", "--help"};
    assert_int_equal(parse(&c, 3, a6), BW_CONFIG_HELP);
    bw__config_free(opts, &c);
}

static void test_addresses(void **state)
{
    (void)state;
    char e[128];
    assert_int_equal(bw__addr_validate("127.0.0.1:0", e, sizeof(e)), BW_OK);
    assert_int_equal(bw__addr_validate("[::1]:7700", e, sizeof(e)), BW_OK);
    assert_int_equal(bw__addr_validate("unix:/tmp/s", e, sizeof(e)), BW_OK);
    assert_int_equal(bw__addr_validate("host.example:65535", e, sizeof(e)), BW_OK);
    assert_int_equal(bw__addr_validate("::1:7700", e, sizeof(e)), BW_INVALID_ARGUMENT);
    assert_int_equal(bw__addr_validate(":7700", e, sizeof(e)), BW_INVALID_ARGUMENT);
    assert_int_equal(bw__addr_validate("h:", e, sizeof(e)), BW_INVALID_ARGUMENT);
    assert_int_equal(bw__addr_validate("h:12a", e, sizeof(e)), BW_INVALID_ARGUMENT);
    assert_int_equal(bw__addr_validate("[]:1", e, sizeof(e)), BW_INVALID_ARGUMENT);
    assert_int_equal(bw__addr_validate("unix:", e, sizeof(e)), BW_INVALID_ARGUMENT);
}

static void test_help_lists_every_option(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    bw__config_usage(f, "prog", "[options]", "Does things.", opts);
    fclose(f);
    for (const bw_opt *o = opts; o->name; o++) {
        char flag[64];
        snprintf(flag, sizeof(flag), "--%s", o->name);
        assert_non_null(strstr(buf, flag));
    }
    assert_non_null(strstr(buf, "[env BATCHWIRE_HEARTBEAT_MS]"));
    assert_non_null(strstr(buf, "(default: 1000)"));
    assert_non_null(strstr(buf, "(required)"));
    assert_null(strstr(buf, "BATCHWIRE_NAME")); /* not read from the environment */
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults_and_flags, setup),
        cmocka_unit_test_setup(test_negative_seed_wraps, setup),
        cmocka_unit_test_setup(test_env_then_flag_precedence, setup),
        cmocka_unit_test_setup(test_bad_values_name_flag_and_value, setup),
        cmocka_unit_test_setup(test_bad_env_value_names_variable, setup),
        cmocka_unit_test_setup(test_usage_errors, setup),
        cmocka_unit_test(test_addresses),
        cmocka_unit_test(test_help_lists_every_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
