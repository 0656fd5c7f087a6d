/* libFuzzer target: mixtures (core/jobs/mixture.c, docs/semantics.md "Mixtures"). The input
 * is text: a first line "E SEED EPOCH" (decimal; missing numbers are 0, E 0 meaning the sum of
 * the sizes), then one source a line, "N=WEIGHT" as `batchwire plan --mix-size` takes it, the
 * weight through the real weight parser. A mixture that is accepted must hold its invariants
 * at positions 0, E - 1 and a few the input picks: the counts sum to E; position p is the
 * k-th sample of source j with k < c_j, exactly k of source j's samples before p and k + 1
 * after, the sources' counts before p summing to p; the sample index is below n_j and its
 * stream position is epoch * c_j + k. A refusal says why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "jobs/mixture.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t number(const char **p, const char *end)
{
    uint64_t v = 0;
    while (*p < end && **p == ' ')
        (*p)++;
    while (*p < end && **p >= '0' && **p <= '9') {
        v = v * 10 + (uint64_t)(**p - '0'); /* wraps on long input: any value is a test */
        (*p)++;
    }
    return v;
}

static void check_position(const bw__mixture *m, uint64_t p)
{
    uint32_t j;
    uint64_t k, index;
    bw__mixture_locate(m, p, &j, &k);
    if (j >= bw__mixture_nsources(m) || k >= bw__mixture_count(m, j) ||
        bw__mixture_consumed(m, j, p) != k || bw__mixture_consumed(m, j, p + 1) != k + 1)
        abort();
    uint64_t before = 0;
    for (size_t s = 0; s < bw__mixture_nsources(m); s++)
        before += bw__mixture_consumed(m, (uint32_t)s, p);
    if (before != p)
        abort();
    bw__mixture_at(m, p, &j, &index);
    if (index >= bw__mixture_size(m, j) ||
        bw__mixture_stream_position(m, j, k) != bw__mixture_epoch(m) * bw__mixture_count(m, j) + k)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data, *end = p + size;
    uint64_t E = number(&p, end), seed = number(&p, end), epoch = number(&p, end);
    while (p < end && *p != '\n')
        p++;
    static uint64_t sizes[BW__MIX_MAX_SOURCES], weights[BW__MIX_MAX_SOURCES];
    size_t n = 0;
    char err[256], text[64];
    while (p < end && n < BW__MIX_MAX_SOURCES) {
        p++; /* the newline */
        sizes[n] = number(&p, end);
        if (p >= end || *p != '=')
            break;
        p++;
        size_t len = 0;
        while (p < end && *p != '\n' && len + 1 < sizeof(text))
            text[len++] = *p++;
        text[len] = '\0';
        if (bw__mix_weight_parse(text, &weights[n], err, sizeof(err)) != BW_OK) {
            if (!strstr(err, "weight '"))
                abort(); /* a refusal quotes the weight */
            return 0;
        }
        n++;
    }
    bw__mix_spec spec = {sizes, weights, n, E};
    bw__mixture *m;
    if (bw__mixture_new(&m, &spec, seed, epoch, err, sizeof(err)) != BW_OK) {
        if (m != NULL || err[0] == '\0')
            abort();
        return 0;
    }
    uint64_t total = bw__mixture_samples(m), sum = 0;
    for (size_t j = 0; j < n; j++)
        sum += bw__mixture_count(m, j);
    if (sum != total || total == 0)
        abort();
    check_position(m, 0);
    check_position(m, total - 1);
    for (uint64_t i = 1, x = seed ^ E; i <= 8; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        check_position(m, (x >> 11) % total);
    }
    bw__mixture_free(m);
    return 0;
}
