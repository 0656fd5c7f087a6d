/* libFuzzer target: a storage worker's request decoding, as each transport does it
 * (worker/request.c). Input that starts with "BWD1" is data-channel traffic: the 16-byte
 * header is checked against the worker's limit exactly as the data channel does, and an
 * accepted body (the bytes after the header, at most the announced length) is decoded as its
 * kind. Any other input is a gRPC request body: the first byte chooses ReadSamples (even) or
 * ReadStream (odd), and the rest goes through the same bounded decoding. Every field of a
 * decoded request is read, and the decoder's memory count must return to zero once it is
 * freed (or when decoding failed). */
#include <string.h>

#include "batchwire/batchwire.h"
#include "worker/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t bw_fuzz_sink;

static uint64_t touch_str(const char *s)
{
    uint64_t x = 0;
    for (; s && *s; s++)
        x = x * 31 + (uint8_t)*s;
    return x;
}

static uint64_t touch_dataset(const Batchwire__V1__Dataset *d)
{
    uint64_t x = 0;
    if (!d)
        return 0;
    x += touch_str(d->format) + d->pre_sharded;
    for (size_t i = 0; i < d->n_sources; i++)
        x += touch_str(d->sources[i]);
    return x;
}

static uint64_t touch_routing(const Batchwire__V1__Routing *r)
{
    return r ? r->placement_version + r->num_shards + (uint64_t)r->shard_mode + r->by_source +
                   r->block_samples
             : 0;
}

static void decode(uint32_t kind, const uint8_t *body, size_t len)
{
    bw__req r;
    char err[512];
    uint64_t x = 0;
    if (bw__req_decode(&r, kind, body, len, err, sizeof(err)) == BW_OK) {
        if (kind == BW_REQ_SAMPLES) {
            const Batchwire__V1__ReadSamplesRequest *m = (const void *)r.msg;
            x += touch_dataset(m->dataset) + touch_routing(m->routing) + touch_str(m->fingerprint) +
                 m->max_message_bytes;
            for (size_t i = 0; i < m->n_indices; i++)
                x += m->indices[i];
            for (size_t i = 0; i < m->n_datasets; i++)
                x +=
                    touch_dataset(m->datasets[i]->dataset) + touch_str(m->datasets[i]->fingerprint);
            for (size_t i = 0; i < m->n_index_datasets; i++)
                x += m->index_datasets[i];
        } else {
            const Batchwire__V1__ReadStreamRequest *m = (const void *)r.msg;
            x += touch_dataset(m->dataset) + touch_routing(m->routing) + touch_str(m->fingerprint) +
                 m->source + m->offset + m->max_records + m->first_record + m->seek_record +
                 m->locate_only + m->max_message_bytes;
        }
        if (r.used > r.cap)
            __builtin_trap(); /* the cap holds */
    } else if (strlen(err) == 0) {
        __builtin_trap(); /* every failure says why */
    }
    bw__req_free(&r);
    if (r.used != 0)
        __builtin_trap(); /* everything counted was freed */
    bw_fuzz_sink = x;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= BW_DCHAN_REQ_HEADER && memcmp(data, "BWD1", 4) == 0) {
        uint32_t kind;
        uint64_t len;
        char err[512];
        if (bw__req_header(data, BW_DCHAN_MAX_REQUEST, "--max-request-bytes", &kind, &len, err,
                           sizeof(err)) != BW_OK)
            return 0;
        size_t avail = size - BW_DCHAN_REQ_HEADER;
        decode(kind, data + BW_DCHAN_REQ_HEADER, len < avail ? (size_t)len : avail);
        return 0;
    }
    if (size == 0)
        return 0;
    decode(data[0] & 1 ? BW_REQ_STREAM : BW_REQ_SAMPLES, data + 1, size - 1);
    return 0;
}
