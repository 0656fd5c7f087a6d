/* NumPy .npy (format versions 1.0, 2.0 and 3.0): the header is a Python dict literal with
 * 'descr', 'fortran_order' and 'shape'; sample i is row i along axis 0. Bytes are served as
 * stored: the dtype string (with its byte order) travels in the layout, nothing is swapped.
 * The array may start anywhere in its file (bw__npy_open_at): npz.c serves an archive's
 * stored members with the same code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"

typedef struct npy {
    uint64_t data_off;
    uint64_t rows;
    uint64_t row_bytes;
} npy;

typedef struct parser {
    const char *p, *end;
} parser;

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static bool eat(parser *ps, char ch)
{
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ch) {
        ps->p++;
        return true;
    }
    return false;
}

/* A quoted Python string without escapes (numpy never writes any in these keys/values). */
static bool string_lit(parser *ps, char *out, size_t outlen)
{
    skip_ws(ps);
    if (ps->p >= ps->end || (*ps->p != '\'' && *ps->p != '"'))
        return false;
    char q = *ps->p++;
    size_t n = 0;
    while (ps->p < ps->end && *ps->p != q) {
        if (*ps->p == '\\' || n + 1 >= outlen)
            return false;
        out[n++] = *ps->p++;
    }
    if (ps->p >= ps->end)
        return false;
    ps->p++;
    out[n] = '\0';
    return true;
}

static bool word(parser *ps, const char *w)
{
    skip_ws(ps);
    size_t n = strlen(w);
    if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, w, n) == 0) {
        ps->p += n;
        return true;
    }
    return false;
}

static bool uint_lit(parser *ps, uint64_t *v)
{
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        return false;
    uint64_t x = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        unsigned d = (unsigned)(*ps->p++ - '0');
        if (x > (UINT64_MAX - d) / 10)
            return false;
        x = x * 10 + d;
    }
    if (ps->p < ps->end && *ps->p == 'L') /* Python 2 longs */
        ps->p++;
    *v = x;
    return true;
}

/* The item size of a simple descr ("<f4", "|b1", "<U10", "<M8[ns]"), or 0 with a reason. */
static uint64_t item_size(const char *d, const char **why)
{
    const char *p = d;
    if (*p == '<' || *p == '>' || *p == '|' || *p == '=')
        p++;
    char kind = *p++;
    if (kind == '?' && *p == '\0')
        return 1;
    if (!strchr("biufcSUVMm", kind) || kind == '\0') {
        *why = kind == 'O' ? "object arrays (dtype 'O') hold Python pointers, not data"
                           : "unknown dtype kind";
        return 0;
    }
    if (*p < '0' || *p > '9') {
        *why = "dtype has no item size";
        return 0;
    }
    uint64_t n = 0;
    while (*p >= '0' && *p <= '9') {
        n = n * 10 + (uint64_t)(*p++ - '0');
        if (n > (1u << 30)) {
            *why = "dtype item size too large";
            return 0;
        }
    }
    if ((kind == 'M' || kind == 'm') && *p == '[') {
        const char *close = strchr(p, ']');
        if (!close || close[1] != '\0') {
            *why = "malformed datetime unit";
            return 0;
        }
        p = close + 1;
    }
    if (*p != '\0') {
        *why = "trailing characters in dtype";
        return 0;
    }
    if (strchr("biufc", kind) && n != 1 && n != 2 && n != 4 && n != 8 && n != 16 && n != 32) {
        *why = "numeric item size must be 1, 2, 4, 8, 16 or 32 bytes";
        return 0;
    }
    return kind == 'U' ? n * 4 : n;
}

static int npy_open(bw__source *s, char *err, size_t errlen)
{
    return bw__npy_open_at(s, 0, s->size, err, errlen);
}

/* Offsets in messages and in the state are the file's; b and len are the array's. */
int bw__npy_open_at(bw__source *s, uint64_t start, uint64_t len, char *err, size_t errlen)
{
    const uint8_t *b = len ? s->map->base + start : NULL; /* no arithmetic on NULL */
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return bw__fmt_fail(s, BW_CORRUPT, start, err, errlen,
                            "not a .npy file (missing the \\x93NUMPY magic)");
    unsigned major = b[6], minor = b[7];
    uint64_t hlen, hstart;
    if (major == 1) {
        hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8;
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12)
            return bw__fmt_fail(s, BW_CORRUPT, start + 8, err, errlen,
                                "truncated .npy header length");
        hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8 | (uint64_t)b[10] << 16 | (uint64_t)b[11] << 24;
        hstart = 12;
    } else {
        return bw__fmt_fail(s, BW_CORRUPT, start + 6, err, errlen,
                            ".npy format version %u.%u is not 1.0, 2.0 or 3.0", major, minor);
    }
    if (minor != 0)
        return bw__fmt_fail(s, BW_CORRUPT, start + 7, err, errlen,
                            ".npy format version %u.%u is not 1.0, 2.0 or 3.0", major, minor);
    if (hstart + hlen > len)
        return bw__fmt_fail(s, BW_CORRUPT, start + hstart, err, errlen,
                            "truncated .npy header: %llu bytes announced, %llu in the file",
                            (unsigned long long)hlen, (unsigned long long)(len - hstart));
    parser ps = {(const char *)b + hstart, (const char *)b + hstart + hlen};
    char descr[32] = "";
    int fortran = -1, have_descr = 0, have_shape = 0;
    uint64_t shape[BW_FMT_MAX_DIMS];
    int ndim = 0;
    const char *bad = NULL;
    if (!eat(&ps, '{'))
        bad = "header is not a dict literal";
    while (!bad && !eat(&ps, '}')) {
        char key[32];
        if (!string_lit(&ps, key, sizeof(key)) || !eat(&ps, ':')) {
            bad = "expected 'key': value in the header dict";
            break;
        }
        if (strcmp(key, "descr") == 0 && !have_descr) {
            skip_ws(&ps);
            if (ps.p < ps.end && *ps.p == '[')
                bad = "structured dtypes (a list of fields) are not supported";
            else if (!string_lit(&ps, descr, sizeof(descr)))
                bad = "'descr' is not a short string";
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && fortran < 0) {
            if (word(&ps, "True"))
                fortran = 1;
            else if (word(&ps, "False"))
                fortran = 0;
            else
                bad = "'fortran_order' is not True or False";
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            have_shape = 1;
            if (!eat(&ps, '('))
                bad = "'shape' is not a tuple";
            else if (!eat(&ps, ')'))
                for (;;) {
                    if (ndim == BW_FMT_MAX_DIMS || !uint_lit(&ps, &shape[ndim])) {
                        bad = "'shape' is not a tuple of at most 32 non-negative integers";
                        break;
                    }
                    ndim++;
                    if (eat(&ps, ')'))
                        break;
                    if (!eat(&ps, ',')) {
                        bad = "'shape' tuple is malformed";
                        break;
                    }
                    if (eat(&ps, ')'))
                        break;
                }
        } else {
            bad = "unexpected or repeated key in the header dict";
        }
        if (bad)
            break;
        if (eat(&ps, ','))
            continue;
        if (eat(&ps, '}'))
            break;
        bad = "expected ',' or '}' in the header dict";
    }
    if (!bad && (!have_descr || fortran < 0 || !have_shape))
        bad = "header lacks one of 'descr', 'fortran_order', 'shape'";
    if (bad)
        return bw__fmt_fail(s, BW_CORRUPT, start + (uint64_t)(ps.p - (const char *)b), err, errlen,
                            "bad .npy header: %s", bad);
    const char *why = NULL;
    uint64_t isz = item_size(descr, &why);
    if (isz == 0)
        return bw__fmt_fail(s, BW_UNIMPLEMENTED, start + hstart, err, errlen,
                            "dtype '%s' is not supported: %s", descr, why);
    if (ndim == 0)
        return bw__fmt_fail(s, BW_UNIMPLEMENTED, start + hstart, err, errlen,
                            "a 0-d array (shape ()) has no axis 0 to take samples along");
    if (fortran && ndim > 1)
        return bw__fmt_fail(s, BW_UNIMPLEMENTED, start + hstart, err, errlen,
                            "Fortran-order arrays are not supported (samples would not be "
                            "contiguous); rewrite it with np.save(path, np.ascontiguousarray(a))");
    uint64_t row = isz;
    for (int d = 1; d < ndim; d++) {
        if (shape[d] && row > UINT64_MAX / shape[d])
            return bw__fmt_fail(s, BW_CORRUPT, start + hstart, err, errlen, "shape overflows");
        row *= shape[d];
    }
    uint64_t data_off = hstart + hlen;
    uint64_t avail = len - data_off;
    if (row && shape[0] > avail / row)
        return bw__fmt_fail(s, BW_CORRUPT, start + data_off, err, errlen,
                            "truncated: shape[0]=%llu rows of %llu bytes need %llu bytes after "
                            "the header, the file has %llu",
                            (unsigned long long)shape[0], (unsigned long long)row,
                            (unsigned long long)shape[0] * (row ? row : 1),
                            (unsigned long long)avail);
    if (avail != shape[0] * row)
        return bw__fmt_fail(s, BW_CORRUPT, start + data_off + shape[0] * row, err, errlen,
                            "%llu unexpected bytes after the array's data (wrong shape?)",
                            (unsigned long long)(avail - shape[0] * row));
    npy *st = calloc(1, sizeof(*st));
    if (!st)
        return BW_NOMEM;
    st->data_off = start + data_off;
    st->rows = shape[0];
    st->row_bytes = row;
    s->state = st;
    snprintf(s->layout.dtype, sizeof(s->layout.dtype), "%s", descr);
    s->layout.ndim = ndim - 1;
    for (int d = 1; d < ndim; d++)
        s->layout.shape[d - 1] = shape[d];
    s->layout.sample_bytes = row;
    return BW_OK;
}

int bw__npy_index(bw__source *s, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    s->count = ((npy *)s->state)->rows;
    s->indexed = true;
    return BW_OK;
}

int bw__npy_get(bw__source *s, uint64_t i, bw__record *r, char *err, size_t errlen)
{
    bw__record_init(r);
    const npy *st = s->state;
    if (i >= st->rows)
        return bw__fmt_fail(s, BW_OUT_OF_RANGE, st->data_off, err, errlen,
                            "row %llu requested but shape[0]=%llu", (unsigned long long)i,
                            (unsigned long long)st->rows);
    r->nparts = 1;
    r->parts[0].p = s->map->base + st->data_off + i * st->row_bytes;
    r->parts[0].len = st->row_bytes;
    r->size = st->row_bytes;
    r->owner = s->map;
    return BW_OK;
}

const uint8_t *bw__npy_locate(const bw__source *s, uint64_t i, size_t *len)
{
    const npy *st = s->state;
    *len = (size_t)st->row_bytes;
    return s->map->base + st->data_off + i * st->row_bytes;
}

void bw__npy_close(bw__source *s)
{
    free(s->state);
    s->state = NULL;
}

const bw__format_ops bw__fmt_npy = {
    .name = "npy",
    .open = npy_open,
    .index = bw__npy_index,
    .get = bw__npy_get,
    .next = NULL,
    .locate = bw__npy_locate,
    .back_to_back = true,
    .close = bw__npy_close,
};
