/*
 * Helpers shared by the sampler tests: compare a rank's batches with a JSON array of
 * batches, and describe a configuration in failure messages. Header-only.
 */
#ifndef BW_TESTS_SAMPLER_TESTUTIL_H
#define BW_TESTS_SAMPLER_TESTUTIL_H

#include "sampler/sampler.h"
#include "sampler_json.h"

#include "batchwire/batchwire.h"

#include <inttypes.h>
#include <stdio.h>

#ifndef BW_TEST_DATA_DIR
#define BW_TEST_DATA_DIR "tests/data"
#endif

static inline void st_describe(const bw__sampler_cfg *c, char *buf, size_t len)
{
    snprintf(buf, len,
             "mode=%s n=%" PRIu64 " R=%" PRIu64 " B=%" PRIu64 " shuffle=%d seed=%" PRIu64
             " epoch=%" PRIu64 " algo=%d drop_last=%d sampler_drop_last=%d split=%d even=%d",
             bw__sampler_mode_name(c->mode), c->num_samples, c->world_size, c->batch_size,
             c->shuffle, c->seed, c->epoch, (int)c->shuffle_algo, c->drop_last,
             c->sampler_drop_last, c->split_batches, c->even_batches);
}

static inline bool st_rank_matches_batches(const bw__sampler *s, uint64_t rank, uint64_t from,
                                           const sj *expect, bw__batch *out, const char *desc);

/* True when rank's batches from step `from` to its end equal `expect` (an array of arrays).
 * On a difference prints what differs. */
static inline bool st_rank_matches(const bw__sampler *s, uint64_t rank, uint64_t from,
                                   const sj *expect)
{
    char desc[256];
    st_describe(bw__sampler_config(s), desc, sizeof(desc));
    size_t cap = bw__sampler_max_batch(s);
    bw__batch b = {malloc(cap * sizeof(uint64_t)), malloc(cap), 0, 0};
    bool ok = st_rank_matches_batches(s, rank, from, expect, &b, desc);
    free(b.indices);
    free(b.padding);
    return ok;
}

static inline bool st_rank_matches_batches(const bw__sampler *s, uint64_t rank, uint64_t from,
                                           const sj *expect, bw__batch *out, const char *desc)
{
    bw__batch b = *out;
    uint64_t end = bw__sampler_end_step(s, rank);
    uint64_t have = end > from ? end - from : 0;
    if (!expect || expect->type != SJ_ARR || have != expect->n) {
        fprintf(stderr, "%s rank %" PRIu64 " from %" PRIu64 ": %" PRIu64 " batches, want %zu\n",
                desc, rank, from, have, expect ? expect->n : (size_t)0);
        return false;
    }
    for (size_t k = 0; k < expect->n; k++) {
        const sj *eb = &expect->items[k];
        int rc = bw__sampler_batch(s, rank, from + k, &b);
        bool same = rc == BW_OK && b.count == eb->n;
        for (size_t j = 0; same && j < eb->n; j++)
            same = b.indices[j] == eb->items[j].u;
        if (!same) {
            fprintf(stderr, "%s rank %" PRIu64 " step %" PRIu64 ": rc %d, got [", desc, rank,
                    from + k, rc);
            for (size_t j = 0; j < b.count; j++)
                fprintf(stderr, "%s%" PRIu64, j ? "," : "", b.indices[j]);
            fprintf(stderr, "] want [");
            for (size_t j = 0; j < eb->n; j++)
                fprintf(stderr, "%s%" PRIu64, j ? "," : "", eb->items[j].u);
            fprintf(stderr, "]\n");
            return false;
        }
    }
    return true;
}

#endif
