/*
 * Field tables (docs/formats.md, "Field tables"): how a tar (WebDataset) sample's fields travel
 * with its bytes when the client asks for them (ReadSamplesRequest.field_table), over any
 * transport. The sample's bytes then start with the table, followed by the fields' bytes in
 * the table's order:
 *
 *     "BWF1"  u32 n  then n times:  u64 size  u32 name_len  name (name_len bytes, no NUL)
 *
 * little-endian; names are the members' extensions ("jpg", "seg.png"). The worker builds it
 * from a record (bw__field_table_prepend); the client parses and strips it
 * (bw__field_table_parse).
 */
#ifndef BW_FORMATS_FIELD_TABLE_H
#define BW_FORMATS_FIELD_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "formats/formats.h"

#define BW_FIELD_TABLE_MAGIC "BWF1"

/*
 * Puts r's field table in front of its fields: the table is written into r->text after what
 * it holds and becomes parts[0]; r->size grows by its length, and r->has_names is cleared (the
 * table now carries the names). A record without names is left as it is. BW_TOO_BIG (with a
 * sentence) when the table does not fit in r->text.
 */
int bw__field_table_prepend(bw__record *r, char *err, size_t errlen);

/* One field of a parsed table: its name (not NUL-terminated, pointing into the table) and
 * its size. */
typedef struct bw__field_ref {
    const char *name;
    uint32_t name_len;
    uint64_t size;
} bw__field_ref;

/*
 * Parses the table at the start of a sample's len bytes: *table_len is its length, and the
 * fields go to out[0..*n) (at most cap; BW_TOO_BIG beyond). Checks the magic, that every
 * length stays inside the sample and that the fields' sizes add up to what follows the table.
 * BW_CORRUPT with a sentence otherwise.
 */
int bw__field_table_parse(const uint8_t *p, size_t len, size_t *table_len, bw__field_ref *out,
                          size_t cap, size_t *n, char *err, size_t errlen);

#endif
