/* Writing JSON text: strings escaped per RFC 8259. */
#ifndef BW_COMMON_JSON_H
#define BW_COMMON_JSON_H

#include <stdio.h>

/* Writes `s` as a quoted JSON string (control characters, quotes and backslashes escaped;
 * bytes that are not valid UTF-8 become U+FFFD). */
void bw__json_string(FILE *out, const char *s);

#endif
