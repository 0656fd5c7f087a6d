/* The data channel's framing (dchan.h, docs/data-channel.md): the 16-byte request header,
 * checked once on the worker, and the 24-byte response frame header, both little-endian. */
#include <stdio.h>

#include "batchwire/batchwire.h"
#include "common/util.h"
#include "rpc/dchan.h"

void bw__dchan_put_req_header(uint8_t out[BW_DCHAN_REQ_HEADER], uint32_t kind, uint64_t length)
{
    bw__put_le32(out, BW_DCHAN_MAGIC);
    bw__put_le32(out + 4, kind);
    bw__put_le64(out + 8, length);
}

int bw__dchan_get_req_header(const uint8_t in[BW_DCHAN_REQ_HEADER], uint32_t *kind,
                             uint64_t *length, char *err, size_t errlen)
{
    uint32_t magic = bw__get_le32(in);
    *kind = bw__get_le32(in + 4);
    *length = bw__get_le64(in + 8);
    if (magic != BW_DCHAN_MAGIC) {
        snprintf(err, errlen,
                 "data channel: the request does not start with \"BWD1\" (got bytes %02x %02x %02x "
                 "%02x): not a batchwire client, or a gRPC client on the data port",
                 in[0], in[1], in[2], in[3]);
        return BW_PROTOCOL;
    }
    if (*kind != BW_DCHAN_KIND_READ_SAMPLES && *kind != BW_DCHAN_KIND_READ_STREAM &&
        *kind != BW_DCHAN_KIND_AUTH && *kind != BW_DCHAN_KIND_FEATURES) {
        snprintf(err, errlen,
                 "data channel: request kind %u is unknown (1 = ReadSamples, 2 = ReadStream, 3 = "
                 "Auth, 4 = Features)",
                 *kind);
        return BW_PROTOCOL;
    }
    if (*length > BW_DCHAN_MAX_REQUEST) {
        snprintf(err, errlen, "data channel: a request of %llu bytes is more than the limit of %d",
                 (unsigned long long)*length, BW_DCHAN_MAX_REQUEST);
        return BW_TOO_BIG;
    }
    return BW_OK;
}

void bw__dchan_put_frame(uint8_t out[BW_DCHAN_FRAME_HEADER], const bw_dchan_frame *f)
{
    bw__put_le32(out, f->type);
    bw__put_le32(out + 4, f->code);
    bw__put_le64(out + 8, f->a);
    bw__put_le64(out + 16, f->b);
}

void bw__dchan_get_frame(const uint8_t in[BW_DCHAN_FRAME_HEADER], bw_dchan_frame *f)
{
    f->type = bw__get_le32(in);
    f->code = bw__get_le32(in + 4);
    f->a = bw__get_le64(in + 8);
    f->b = bw__get_le64(in + 16);
}
