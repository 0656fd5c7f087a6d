/* Text that daemons report, made safe for a terminal (text_safe.c): `batchwire status` prints
 * worker ids, addresses, versions, host names and error sentences that a worker or a client
 * chose, and a control character or an ANSI escape among them must not reach the terminal
 * (docs/security.md). JSON output needs none of this: JSON escapes control characters. */
#ifndef BW_CLI_TEXT_SAFE_H
#define BW_CLI_TEXT_SAFE_H

#include <stdbool.h>
#include <stddef.h>
#include <protobuf-c/protobuf-c.h>

#include "common/arena.h"

/* Writes s into out[0..cap) (cap > 0, always NUL-terminated, whole escapes only): C0 control
 * characters, DEL and C1 controls (U+0080..U+009F) as \xHH, a backslash as \\, bytes that are
 * not UTF-8 as \xHH; everything else as it is. Returns whether anything was escaped. */
bool bw__cli_safe_text(char *out, size_t cap, const char *s);

/* Every string field of m and of the messages it holds, recursively, that needs escaping is
 * replaced by its escaped copy in `arena` (the message's own memory is not written to). False
 * when the arena is out of memory (the fields done so far stay replaced). */
bool bw__cli_safe_message(ProtobufCMessage *m, bw_arena *arena);

#endif
