/* Rules for the names people choose (job names, worker ids, principal names, dataset paths):
 * one place, so every daemon and tool refuses the same things with the same words. */
#ifndef BW_COMMON_TEXT_H
#define BW_COMMON_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Whether p[0..n) is valid UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF). On false, *bad (may be NULL) is the offset of the first invalid byte. */
bool bw__utf8_valid(const char *p, size_t n, size_t *bad);

/* A name: 1 to max bytes of valid UTF-8 without control characters (U+0000-U+001F,
 * U+007F-U+009F). BW_OK, or BW_INVALID_ARGUMENT with a sentence naming `what` and the
 * offending byte in err. */
int bw__check_text(const char *what, const char *v, size_t max, char *err, size_t errlen);

/* A name as above that also holds no space (U+0020): job names, worker ids and principal
 * names appear in "key=value" log lines and as command-line words. */
int bw__check_name(const char *what, const char *v, size_t max, char *err, size_t errlen);

/* The name of a dataset's field (a named array, docs/formats.md): a name as bw__check_name, of
 * at most BW_FIELD_NAME_MAX bytes, without '=' or ',' (they separate fields on command
 * lines). */
int bw__check_field_name(const char *v, char *err, size_t errlen);

/* The longest name, in bytes: worker ids, principal names, dataset paths -- and job names,
 * one limit for the coordinator, libbatchwire (and so the Python binding's messages) and the
 * CLI (docs/security.md, "Input limits"). */
enum { BW_NAME_MAX = 255, BW_JOB_NAME_MAX = BW_NAME_MAX };
enum { BW_FIELD_NAME_MAX = 64 }; /* a dataset's field names (bytes) */

#endif
