/* TFRecord internals exposed for tests and the fuzzer. */
#ifndef BW_FORMATS_TFRECORD_H
#define BW_FORMATS_TFRECORD_H

#include <stddef.h>
#include <stdint.h>

#include "formats/formats.h"

/* Validates an index sidecar's bytes against the opened source `s` and, if valid, installs it
 * as the source's index. BW_CORRUPT with the reason in why otherwise (s unchanged). */
int bw__tfrecord_index_parse(bw__source *s, const uint8_t *b, size_t len, char *why, size_t whylen);

#endif
