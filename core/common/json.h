/* Writing JSON text: strings escaped per RFC 8259; finding an object's top-level keys. */
#ifndef BW_COMMON_JSON_H
#define BW_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Writes `s` as a quoted JSON string (control characters, quotes and backslashes escaped;
 * bytes that are not valid UTF-8 become U+FFFD). */
void bw__json_string(FILE *out, const char *s);

/* Appends the first n bytes of s, escaped as in bw__json_string but without the quotes, to
 * out[*len..cap): whole escapes only, always NUL-terminated (cap > 0). Returns false when
 * something did not fit (what fit is kept). */
bool bw__json_escape(char *out, size_t cap, size_t *len, const char *s, size_t n);

/* Called once per top-level key, in order: the key's text between its quotes (escapes left
 * as they are, not NUL-terminated) and where its value's JSON text lies in the object
 * (offset and length). Anything but BW_OK stops the scan and is returned. */
typedef int (*bw__json_key_fn)(void *arg, const char *name, size_t name_len, size_t value_off,
                               size_t value_len);

/* Scans the JSON object p[0..n) (whitespace around it allowed) and calls fn for each of its
 * top-level keys. Values are delimited, not parsed or checked (strings by their quotes,
 * objects and arrays by their brackets outside strings, other values up to a delimiter): the
 * JSON Lines fields of the client (bw_batch_fields) and of a worker's transform_field
 * (docs/transforms.md, "JSON Lines fields") are found by this one scanner. BW_OK; BW_CORRUPT
 * with *at the byte offset where p is not such an object; or fn's code. */
int bw__json_keys(const uint8_t *p, size_t n, bw__json_key_fn fn, void *arg, size_t *at);

#endif
