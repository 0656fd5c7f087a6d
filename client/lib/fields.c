/* Samples as named fields (bw_batch_fields): a tar (WebDataset) sample's members, whose names
 * and sizes arrive in a field table in front of the sample's bytes (formats/field_table.h)
 * and are stripped here, and a JSON Lines sample's top-level keys, found by scanning the line
 * (bw__json_keys: the values are not parsed, only delimited). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "formats/field_table.h"
#include "batch_int.h"

int bw__fields_kind_of(const char *format, bool wanted, enum bw__fields_kind *kind, char *err,
                       size_t errlen)
{
    *kind = BW_FIELDS_NONE;
    if (!wanted)
        return BW_OK;
    /* Named arrays carry their fields as arrays (bw_batch_array): nothing to find. */
    if (format && (strcmp(format, "fields") == 0 || strcmp(format, "npz") == 0))
        return BW_OK;
    if (format && strcmp(format, "tar") == 0)
        *kind = BW_FIELDS_TABLE;
    else if (format && strcmp(format, "jsonl") == 0)
        *kind = BW_FIELDS_JSON;
    if (*kind != BW_FIELDS_NONE)
        return BW_OK;
    snprintf(err, errlen,
             "fields: tar (WebDataset) and jsonl samples have fields; format '%s' has none",
             format ? format : "?");
    return BW_INVALID_ARGUMENT;
}

void bw__batch_fields_free(bw_batch *b)
{
    free(b->fields);
    free(b->field_first);
    free(b->field_names);
    b->fields = NULL;
    b->field_first = NULL;
    b->field_names = NULL;
    b->nfields = b->capfields = b->names_len = b->names_cap = 0;
    b->has_fields = false;
}

/* Appends a field whose name is name[0..nl) (copied, NUL-terminated); its `name` pointer is
 * set once the batch is complete (the name buffer may move until then). */
static int add_field(bw_batch *b, const char *name, size_t nl, size_t offset, size_t size)
{
    if (b->nfields == b->capfields) {
        size_t cap = b->capfields ? 2 * b->capfields : 64;
        bw_field *f = realloc(b->fields, cap * sizeof(*f));
        if (!f)
            return BW_NOMEM;
        b->fields = f;
        b->capfields = cap;
    }
    if (b->names_len + nl + 1 > b->names_cap) {
        size_t cap = b->names_cap ? b->names_cap : 1024;
        while (cap < b->names_len + nl + 1)
            cap *= 2;
        char *n = realloc(b->field_names, cap);
        if (!n)
            return BW_NOMEM;
        b->field_names = n;
        b->names_cap = cap;
    }
    memcpy(b->field_names + b->names_len, name, nl);
    b->field_names[b->names_len + nl] = '\0';
    /* the name's offset, until the pointers are set */
    b->fields[b->nfields++] = (bw_field){(const char *)(uintptr_t)b->names_len, offset, size};
    b->names_len += nl + 1;
    return BW_OK;
}

/* bw__json_keys's callback: one key of a JSON Lines sample becomes a field. */
static int json_field(void *arg, const char *name, size_t name_len, size_t value_off,
                      size_t value_len)
{
    return add_field(arg, name, name_len, value_off, value_len);
}

int bw__batch_split_fields(bw_batch *b, enum bw__fields_kind kind)
{
    b->has_fields = false;
    b->nfields = b->names_len = 0;
    if (kind == BW_FIELDS_NONE)
        return BW_OK;
    size_t *first = realloc(b->field_first, (b->count + 1) * sizeof(*first));
    if (!first)
        return BW_NOMEM;
    b->field_first = first;
    size_t out = 0; /* tables: where the next sample's fields go once its table is cut */
    for (size_t i = 0; i < b->count; i++) {
        first[i] = b->nfields;
        uint8_t *s = b->data + b->offsets[i];
        size_t len = b->sizes[i];
        int rc = BW_OK;
        if (kind == BW_FIELDS_JSON) {
            size_t at = 0;
            rc = bw__json_keys(s, len, json_field, b, &at);
            if (rc == BW_CORRUPT)
                snprintf(b->err, sizeof(b->err),
                         "sample %llu: not a JSON object (at byte %zu of %zu), so it has no "
                         "fields",
                         (unsigned long long)b->indices[i], at, len);
            if (rc != BW_OK)
                return b->rc = rc;
            continue;
        }
        bw__field_ref refs[BW_FMT_MAX_FIELDS];
        size_t n = 0, tlen = 0;
        char why[256];
        rc = bw__field_table_parse(s, len, &tlen, refs, BW_FMT_MAX_FIELDS, &n, why, sizeof(why));
        for (size_t f = 0, off = 0; rc == BW_OK && f < n; off += refs[f].size, f++)
            rc = add_field(b, refs[f].name, refs[f].name_len, off, (size_t)refs[f].size);
        if (rc != BW_OK) {
            snprintf(b->err, sizeof(b->err), "sample %llu: %s", (unsigned long long)b->indices[i],
                     rc == BW_NOMEM ? "out of memory for its fields" : why);
            return b->rc = rc;
        }
        /* The sample's bytes are its fields: the table goes. */
        memmove(b->data + out, s + tlen, len - tlen);
        b->offsets[i] = out;
        b->sizes[i] = len - tlen;
        out += len - tlen;
    }
    first[b->count] = b->nfields;
    if (kind == BW_FIELDS_TABLE)
        b->nbytes = out;
    for (size_t f = 0; f < b->nfields; f++)
        b->fields[f].name = b->field_names + (uintptr_t)b->fields[f].name;
    b->has_fields = true;
    return BW_OK;
}

int bw_batch_fields(const bw_batch *b, size_t i, const bw_field **fields, size_t *n)
{
    *fields = NULL;
    *n = 0;
    if (!b->has_fields)
        return BW_FAILED_PRECONDITION;
    if (i >= b->count)
        return BW_OUT_OF_RANGE;
    *n = b->field_first[i + 1] - b->field_first[i];
    *fields = *n ? b->fields + b->field_first[i] : NULL; /* none at all: no array */
    return BW_OK;
}
