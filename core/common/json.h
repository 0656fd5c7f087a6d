/* Writing JSON text: strings escaped per RFC 8259. */
#ifndef BW_COMMON_JSON_H
#define BW_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Writes `s` as a quoted JSON string (control characters, quotes and backslashes escaped;
 * bytes that are not valid UTF-8 become U+FFFD). */
void bw__json_string(FILE *out, const char *s);

/* Appends the first n bytes of s, escaped as in bw__json_string but without the quotes, to
 * out[*len..cap): whole escapes only, always NUL-terminated (cap > 0). Returns false when
 * something did not fit (what fit is kept). */
bool bw__json_escape(char *out, size_t cap, size_t *len, const char *s, size_t n);

#endif
