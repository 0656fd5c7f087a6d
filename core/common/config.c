/* The configuration tables (config.h): flags, BATCHWIRE_* variables and --help from one
 * table per program, with errors that name the setting and its value; and the line reader of
 * the daemons' configuration files (--auth-tokens, --grant-key). */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "batchwire/batchwire.h"
#include "common/version.h"

/* Where a value came from, for error messages. */
typedef struct source {
    const char *kind; /* "flag", "environment", "default" */
    char name[96];    /* "--listen" or "BATCHWIRE_LISTEN" */
} source;

static void env_name(const char *name, char *out, size_t outlen)
{
    size_t j = 0;
    const char prefix[] = "BATCHWIRE_";
    for (size_t i = 0; prefix[i] && j + 1 < outlen; i++)
        out[j++] = prefix[i];
    for (size_t i = 0; name[i] && j + 1 < outlen; i++)
        out[j++] = name[i] == '-' ? '_' : (char)toupper((unsigned char)name[i]);
    out[j] = '\0';
}

static void fail(char *err, size_t errlen, const source *src, const char *value, const char *fmt,
                 ...) __attribute__((format(printf, 5, 6)));

static void fail(char *err, size_t errlen, const source *src, const char *value, const char *fmt,
                 ...)
{
    int n = snprintf(err, errlen, "%s%s: invalid value '%s': ", src->name,
                     strcmp(src->kind, "environment") == 0 ? " (environment)" : "", value);
    if (n < 0 || (size_t)n >= errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

int bw__addr_validate(const char *addr, char *err, size_t errlen)
{
    if (strncmp(addr, "unix:", 5) == 0) {
        if (addr[5] == '\0') {
            snprintf(err, errlen, "unix: address needs a path");
            return BW_INVALID_ARGUMENT;
        }
        return BW_OK;
    }
    const char *colon;
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (!close || close == addr + 1 || close[1] != ':') {
            snprintf(err, errlen, "expected [IPV6]:PORT");
            return BW_INVALID_ARGUMENT;
        }
        colon = close + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon || colon == addr) {
            snprintf(err, errlen, "expected HOST:PORT");
            return BW_INVALID_ARGUMENT;
        }
        if (memchr(addr, ':', (size_t)(colon - addr))) {
            snprintf(err, errlen, "IPv6 addresses need brackets: [IPV6]:PORT");
            return BW_INVALID_ARGUMENT;
        }
    }
    const char *port = colon + 1;
    if (*port == '\0') {
        snprintf(err, errlen, "expected HOST:PORT, the port is missing");
        return BW_INVALID_ARGUMENT;
    }
    unsigned long v = 0;
    for (const char *p = port; *p; p++) {
        if (!isdigit((unsigned char)*p) || p - port > 5) {
            snprintf(err, errlen, "port '%s' is not a number from 0 to 65535", port);
            return BW_INVALID_ARGUMENT;
        }
        v = v * 10 + (unsigned long)(*p - '0');
    }
    if (v > 65535) {
        snprintf(err, errlen, "port %lu is out of range (0 to 65535)", v);
        return BW_INVALID_ARGUMENT;
    }
    return BW_OK;
}

static int parse_bool(const char *v, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (unsigned i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *out = true;
            return BW_OK;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *out = false;
            return BW_OK;
        }
    }
    return BW_INVALID_ARGUMENT;
}

static int enum_index(const char *choices, const char *v)
{
    size_t vl = strlen(v);
    int idx = 0;
    for (const char *p = choices; *p; idx++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == vl && strncmp(p, v, len) == 0)
            return idx;
        if (!bar)
            break;
        p = bar + 1;
    }
    return -1;
}

static int set_string(char **field, const char *v)
{
    char *copy = strdup(v);
    if (!copy)
        return BW_NOMEM;
    free(*field);
    *field = copy;
    return BW_OK;
}

static int apply(const bw_opt *o, void *cfg, const char *v, const source *src, char *err,
                 size_t errlen)
{
    char *field = (char *)cfg + o->offset;
    char why[160];
    switch (o->type) {
    case BW_OPT_PATH:
        if (*v == '\0') {
            fail(err, errlen, src, v, "expected a non-empty path");
            return BW_INVALID_ARGUMENT;
        }
        return set_string((char **)field, v);
    case BW_OPT_STRING:
        return set_string((char **)field, v);
    case BW_OPT_LIST: {
        char **list = (char **)field;
        if (strchr(v, '\n')) {
            fail(err, errlen, src, v, "expected one value without a line break");
            return BW_INVALID_ARGUMENT;
        }
        size_t had = *list ? strlen(*list) + 1 : 0;
        char *grown = realloc(*list, had + strlen(v) + 1);
        if (!grown)
            return BW_NOMEM;
        if (had)
            grown[had - 1] = '\n';
        memcpy(grown + had, v, strlen(v) + 1);
        *list = grown;
        return BW_OK;
    }
    case BW_OPT_ADDR:
        if (bw__addr_validate(v, why, sizeof(why)) != BW_OK) {
            fail(err, errlen, src, v, "%s", why);
            return BW_INVALID_ARGUMENT;
        }
        return set_string((char **)field, v);
    case BW_OPT_INT: {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        bool bounded = o->min != 0 || o->max != 0;
        if (*v == '\0' || *end != '\0' || errno == ERANGE || isspace((unsigned char)*v) ||
            (bounded && (x < o->min || x > o->max))) {
            if (bounded)
                fail(err, errlen, src, v, "expected an integer from %" PRId64 " to %" PRId64,
                     o->min, o->max);
            else
                fail(err, errlen, src, v, "expected an integer");
            return BW_INVALID_ARGUMENT;
        }
        *(int64_t *)field = (int64_t)x;
        return BW_OK;
    }
    case BW_OPT_UINT64: {
        char *end;
        errno = 0;
        bool neg = v[0] == '-';
        unsigned long long x;
        if (neg) {
            long long s = strtoll(v, &end, 10);
            x = (unsigned long long)s;
        } else {
            x = strtoull(v, &end, 10);
        }
        if (*v == '\0' || *end != '\0' || errno == ERANGE || isspace((unsigned char)*v) ||
            v[0] == '+') {
            fail(err, errlen, src, v, "expected an integer from -2^63 to 2^64-1");
            return BW_INVALID_ARGUMENT;
        }
        *(uint64_t *)field = (uint64_t)x;
        return BW_OK;
    }
    case BW_OPT_BOOL:
        if (parse_bool(v, (bool *)field) != BW_OK) {
            fail(err, errlen, src, v, "expected true or false");
            return BW_INVALID_ARGUMENT;
        }
        return BW_OK;
    case BW_OPT_ENUM: {
        int idx = enum_index(o->choices, v);
        if (idx < 0) {
            fail(err, errlen, src, v, "expected one of %s", o->choices);
            return BW_INVALID_ARGUMENT;
        }
        *(int *)field = idx;
        return BW_OK;
    }
    }
    return BW_INVALID_ARGUMENT;
}

static const bw_opt *find(const bw_opt *opts, const char *name, size_t len)
{
    for (const bw_opt *o = opts; o->name; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0)
            return o;
    return NULL;
}

static bool is_set(const bw_opt *o, const void *cfg)
{
    const char *field = (const char *)cfg + o->offset;
    switch (o->type) {
    case BW_OPT_STRING:
    case BW_OPT_PATH:
    case BW_OPT_ADDR:
    case BW_OPT_LIST:
        return *(char *const *)field != NULL;
    default:
        return true;
    }
}

int bw__config_parse(const bw_opt *opts, void *cfg, int argc, char **argv, char *err, size_t errlen)
{
    int rc;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return BW_CONFIG_HELP;

    size_t nopts = 0;
    while (opts[nopts].name)
        nopts++;
    /* Which settings were given explicitly, for the required check. */
    bool *given = calloc(nopts + 1, sizeof(bool));
    if (!given)
        return BW_NOMEM;

    source src = {"default", ""};
    for (size_t k = 0; k < nopts; k++) {
        const bw_opt *o = &opts[k];
        if (!o->def)
            continue;
        snprintf(src.name, sizeof(src.name), "--%s", o->name);
        if ((rc = apply(o, cfg, o->def, &src, err, errlen)) != BW_OK)
            goto out;
    }
    src.kind = "environment";
    for (size_t k = 0; k < nopts; k++) {
        const bw_opt *o = &opts[k];
        if (o->flags & BW_OPT_NO_ENV)
            continue;
        env_name(o->name, src.name, sizeof(src.name));
        const char *v = getenv(src.name);
        if (!v)
            continue;
        if ((rc = apply(o, cfg, v, &src, err, errlen)) != BW_OK)
            goto out;
        given[k] = true;
    }
    src.kind = "flag";
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            snprintf(err, errlen, "unexpected argument '%s' (options start with --; see --help)",
                     arg);
            rc = BW_INVALID_ARGUMENT;
            goto out;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const bw_opt *o = find(opts, name, len);
        const char *value = eq ? eq + 1 : NULL;
        if (!o && !eq && strncmp(name, "no-", 3) == 0) {
            /* --no-X for a boolean X */
            const bw_opt *neg = find(opts, name + 3, len - 3);
            if (neg && neg->type == BW_OPT_BOOL) {
                o = neg;
                value = "false";
            }
        }
        if (!o) {
            snprintf(err, errlen, "unknown option '--%.*s' (see --help)", (int)len, name);
            rc = BW_INVALID_ARGUMENT;
            goto out;
        }
        snprintf(src.name, sizeof(src.name), "--%s", o->name);
        if (!value) {
            if (o->type == BW_OPT_BOOL) {
                value = "true";
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                snprintf(err, errlen, "--%s: missing value (expected %s)", o->name,
                         o->metavar ? o->metavar : "a value");
                rc = BW_INVALID_ARGUMENT;
                goto out;
            }
        }
        if ((rc = apply(o, cfg, value, &src, err, errlen)) != BW_OK)
            goto out;
        given[o - opts] = true;
    }
    for (size_t k = 0; k < nopts; k++) {
        const bw_opt *o = &opts[k];
        if ((o->flags & BW_OPT_REQUIRED) && !given[k] && !(o->def && is_set(o, cfg))) {
            char env[96];
            env_name(o->name, env, sizeof(env));
            if (o->flags & BW_OPT_NO_ENV)
                snprintf(err, errlen, "--%s is required", o->name);
            else
                snprintf(err, errlen, "--%s is required (or set %s)", o->name, env);
            rc = BW_INVALID_ARGUMENT;
            goto out;
        }
    }
    rc = BW_OK;
out:
    free(given);
    return rc;
}

void bw__config_free(const bw_opt *opts, void *cfg)
{
    for (const bw_opt *o = opts; o->name; o++) {
        if (o->type == BW_OPT_STRING || o->type == BW_OPT_PATH || o->type == BW_OPT_ADDR ||
            o->type == BW_OPT_LIST) {
            char **field = (char **)((char *)cfg + o->offset);
            free(*field);
            *field = NULL;
        }
    }
}

void bw__config_usage(FILE *out, const char *prog, const char *synopsis, const char *description,
                      const bw_opt *opts)
{
    fprintf(out, "Usage: %s %s\n", prog, synopsis);
    if (description)
        fprintf(out, "\n%s\n", description);
    fprintf(out, "\nOptions (each also read from the environment variable shown):\n");
    for (const bw_opt *o = opts; o->name; o++) {
        char left[128];
        const char *meta = o->metavar ? o->metavar : "VALUE";
        if (o->type == BW_OPT_BOOL)
            snprintf(left, sizeof(left), "--%s", o->name);
        else if (o->type == BW_OPT_ENUM && !o->metavar)
            snprintf(left, sizeof(left), "--%s %s", o->name, o->choices);
        else
            snprintf(left, sizeof(left), "--%s %s", o->name, meta);
        fprintf(out, "  %s\n      %s", left, o->help ? o->help : "");
        if (o->flags & BW_OPT_REQUIRED)
            fprintf(out, " (required)");
        if (o->def && o->type != BW_OPT_BOOL)
            fprintf(out, " (default: %s)", o->def);
        if (o->type == BW_OPT_INT && (o->min || o->max))
            fprintf(out, " [%" PRId64 "..%" PRId64 "]", o->min, o->max);
        if (!(o->flags & BW_OPT_NO_ENV)) {
            char env[96];
            env_name(o->name, env, sizeof(env));
            fprintf(out, " [env %s]", env);
        }
        fputc('\n', out);
    }
    fprintf(out, "  --help\n      show this help and exit\n");
    fprintf(out, "  --version\n      show the version and what this build has (commit, build "
                 "type, TLS, CUDA) and exit\n");
}

int bw__config_main(const char *prog, const char *synopsis, const char *description,
                    const bw_opt *opts, void *cfg, int argc, char **argv)
{
    if (bw__version_flag(argc, argv, prog))
        return 0;
    char err[512];
    int rc = bw__config_parse(opts, cfg, argc, argv, err, sizeof(err));
    if (rc == BW_CONFIG_HELP) {
        bw__config_usage(stdout, prog, synopsis, description, opts);
        return 0;
    }
    if (rc != BW_OK) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 2;
    }
    return -1;
}

int bw__config_line(FILE *f, char *buf, size_t len, const char *path, int *lineno, char **line,
                    char *err, size_t errlen)
{
    while (fgets(buf, (int)len, f)) {
        ++*lineno;
        size_t n = strlen(buf);
        if (n == len - 1 && buf[n - 1] != '\n') {
            snprintf(err, errlen, "%s line %d: longer than %zu bytes", path, *lineno, len - 2);
            return BW_INVALID_ARGUMENT;
        }
        while (n && isspace((unsigned char)buf[n - 1]))
            buf[--n] = 0;
        char *p = buf;
        while (isspace((unsigned char)*p))
            p++;
        if (*p && *p != '#') {
            *line = p;
            return BW_OK;
        }
    }
    return 1;
}
