/*
 * One configuration table per program: each row names a setting, its type, bounds, default
 * and help. The table drives command-line flags (--name VALUE or --name=VALUE), environment
 * variables (BATCHWIRE_NAME, dashes as underscores) and --help. Precedence: default, then
 * environment, then flags. Every error names the setting and the bad value.
 */
#ifndef BW_COMMON_CONFIG_H
#define BW_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum bw_opt_type {
    BW_OPT_STRING, /* char * (owned by the config; freed by bw__config_free) */
    BW_OPT_PATH,   /* char *, must be non-empty */
    BW_OPT_ADDR,   /* char *, HOST:PORT, [V6]:PORT or unix:PATH */
    BW_OPT_INT,    /* int64_t within [min, max] */
    BW_OPT_UINT64, /* uint64_t, full range; negative decimal values wrap (two's complement) */
    BW_OPT_BOOL,   /* bool; a bare flag means true; values true/false/1/0/yes/no/on/off */
    BW_OPT_ENUM,   /* int: index into `choices` ("a|b|c") */
    BW_OPT_LIST,   /* char *: repeatable; every value given, in order, separated by '\n' */
} bw_opt_type;

#define BW_OPT_REQUIRED 1u /* must be set by flag or environment */
#define BW_OPT_NO_ENV 2u   /* not read from the environment */

typedef struct bw_opt {
    const char *name; /* flag without dashes: "listen" */
    bw_opt_type type;
    size_t offset;       /* offsetof() the field in the program's config struct */
    const char *def;     /* default as text (parsed like a flag value); NULL: none */
    int64_t min, max;    /* BW_OPT_INT bounds (both 0: any int64) */
    const char *choices; /* BW_OPT_ENUM: "torch|accelerate|iterable" */
    unsigned flags;
    const char *metavar; /* shown in --help: "HOST:PORT" */
    const char *help;
} bw_opt;

/* The table ends with a row whose name is NULL. */
#define BW_OPT_END                                                                                 \
    {                                                                                              \
        NULL, BW_OPT_STRING, 0, NULL, 0, 0, NULL, 0, NULL, NULL                                    \
    }

enum { BW_CONFIG_HELP = 1 };

/*
 * Fills `cfg` from defaults, the environment and argv[1..argc-1]. Returns BW_OK,
 * BW_CONFIG_HELP when --help/-h was given (nothing else is checked), or BW_INVALID_ARGUMENT
 * with a sentence in `err`, e.g. "--heartbeat-ms: invalid value 'x': expected an integer from
 * 10 to 60000". On error the strings already set stay owned by cfg: call bw__config_free.
 * `cfg` must be zeroed by the caller before the first call.
 */
int bw__config_parse(const bw_opt *opts, void *cfg, int argc, char **argv, char *err,
                     size_t errlen);

/* Frees the strings the table's string-typed fields hold; leaves cfg zeroed there. */
void bw__config_free(const bw_opt *opts, void *cfg);

/* Writes "Usage: PROG SYNOPSIS", the description and one paragraph per option. */
void bw__config_usage(FILE *out, const char *prog, const char *synopsis, const char *description,
                      const bw_opt *opts);

/*
 * For programs: parses argv, prints --help or --version (core/common/version.h) to stdout or
 * the error as "PROG: message" to stderr itself. Returns -1 when the program should run, else
 * the exit status (0 after --help or --version, 2 after a bad setting). `cfg` must be zeroed; free
 * it with bw__config_free.
 */
int bw__config_main(const char *prog, const char *synopsis, const char *description,
                    const bw_opt *opts, void *cfg, int argc, char **argv);

/* Validates a HOST:PORT / [V6]:PORT / unix:PATH address; on failure writes why to err. */
int bw__addr_validate(const char *addr, char *err, size_t errlen);

/* The next line of a daemon's configuration file `f` (--auth-tokens, --grant-key) that holds
 * something: blank lines and '#' comments are passed over, surrounding white space removed.
 * `buf` (len bytes) receives it and *line points into it; *lineno counts the lines read.
 * BW_OK; 1 at the end of the file; BW_INVALID_ARGUMENT with "PATH line N: longer than M bytes"
 * in err. */
int bw__config_line(FILE *f, char *buf, size_t len, const char *path, int *lineno, char **line,
                    char *err, size_t errlen);

#endif
