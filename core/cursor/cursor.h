/*
 * The resume cursor (proto/jobs.proto, message Cursor): what a trainer stores in its
 * checkpoint to restart exactly at the next batch. Binary form: the packed protobuf. Text
 * form: "bwc1:" followed by standard base64 of the binary form, for logs, JSON and
 * environment variables. Decoding accepts either and refuses anything else with a sentence
 * saying what was wrong; it never trusts a length it has not checked.
 */
#ifndef BW_CURSOR_CURSOR_H
#define BW_CURSOR_CURSOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/arena.h"
#include "jobs.pb-c.h"

#define BW_CURSOR_VERSION 1
#define BW_CURSOR_TEXT_PREFIX "bwc1:"
/* Larger inputs are refused before decoding (a cursor is tens of bytes, plus 10 bytes per
 * stream source). */
#define BW_CURSOR_MAX_BYTES (1u << 20)

/*
 * Decodes a cursor given as binary or text into `arena` (*out lives until the arena is
 * reset). Checks the version, and that rank < world_size and the fingerprint is set.
 * Returns BW_OK, or BW_INVALID_ARGUMENT / BW_TOO_BIG with a sentence in err.
 */
int bw__cursor_decode(const uint8_t *data, size_t len, bw_arena *arena, Batchwire__V1__Cursor **out,
                      char *err, size_t errlen);

/* Packs a cursor (version set to BW_CURSOR_VERSION) into a new malloc'ed buffer (free it);
 * *len is its size. Returns NULL only when that buffer cannot be allocated: the caller
 * reports BW_NOMEM. */
uint8_t *bw__cursor_encode(const Batchwire__V1__Cursor *c, size_t *len);

/* Writes the text form of binary cursor bytes into out (NUL-terminated). Returns the length
 * written, or 0 when outlen is too small (bw__cursor_text_len tells how much is needed). */
size_t bw__cursor_to_text(const uint8_t *bin, size_t len, char *out, size_t outlen);
size_t bw__cursor_text_len(size_t binlen);

#endif
