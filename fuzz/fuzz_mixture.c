/* libFuzzer target: mixtures (core/jobs/mixture.c, docs/semantics.md "Mixtures"). The input
 * is text: a first line "E SEED EPOCH FLAGS" (decimal; missing numbers are 0, E 0 meaning the
 * sum of the sizes; FLAGS bit 0: policy stop, bit 1 + j: source j < 63 is a stream), then one
 * source a line, "N=WEIGHT" as `batchwire plan --mix-size` takes it, the weight through the real
 * weight parser. A mixture that is accepted must hold its invariants at positions 0, E - 1 and a
 * few the input picks: the counts sum to E; position p is the k-th sample of source j with k < c_j,
 * exactly k of source j's samples before p and k + 1 after, the sources' counts before p summing to
 * p; the position of (j, k) is p; the sample index is below n_j and its stream position is epoch *
 * c_j + k (k for a stream under stop, then below n_j if p is before the epoch's end P, and position
 * P is a stream's k = n_j). A refusal says why. */
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

static void check_position(const bw__mixture *m, uint64_t p, bool stop)
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
    if (bw__mixture_position(m, j, k) != p)
        abort();
    uint64_t pass;
    bw__mixture_at(m, p, &j, &index, &pass);
    bool stop_stream = stop && bw__mixture_is_stream(m, j);
    uint64_t t = bw__mixture_stream_position(m, j, k), n = bw__mixture_size(m, j);
    if (index >= n || pass != t / n ||
        t != (stop_stream ? k : bw__mixture_epoch(m) * bw__mixture_count(m, j) + k))
        abort();
    uint64_t P = bw__mixture_end(m);
    if (stop_stream && ((p < P && k >= n) || (p == P && k != n)))
        abort();
    if (p == P && P < bw__mixture_samples(m) && !stop_stream)
        abort(); /* the epoch ends only where a stream runs dry */
    uint64_t q = p < P ? p : P, used = bw__mixture_consumed(m, j, q), next_pass;
    uint64_t rec = bw__mixture_next_record(m, j, q, &next_pass);
    if (stop_stream ? rec != used || rec > n || next_pass != 0
                    : next_pass * n + rec != t - k + used)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data, *end = p + size;
    uint64_t E = number(&p, end), seed = number(&p, end), epoch = number(&p, end);
    uint64_t flags = number(&p, end);
    static bool streams[BW__MIX_MAX_SOURCES];
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
        streams[n] = n < 63 && (flags >> (n + 1) & 1);
        n++;
    }
    bool stop = flags & 1;
    bw__mix_spec spec = {sizes, weights, n, E, streams, stop ? BW__MIX_STOP : BW__MIX_CYCLE};
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
    uint64_t P = bw__mixture_end(m);
    if (P == 0 || P > total || (!stop && P != total))
        abort();
    check_position(m, 0, stop);
    check_position(m, total - 1, stop);
    if (P < total)
        check_position(m, P, stop);
    for (uint64_t i = 1, x = seed ^ E; i <= 8; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        check_position(m, (x >> 11) % total, stop);
    }
    bw__mixture_free(m);
    return 0;
}
