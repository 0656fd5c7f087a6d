/* bw_cursor_describe: a cursor's fields for programs and bindings, without a loader
 * (include/batchwire/loader.h). The one cursor decoder (core/cursor/cursor.h) checks it, so a
 * binding never parses the protobuf itself. */
#include <stdio.h>
#include <string.h>

#include "batchwire/loader.h"
#include "common/arena.h"
#include "cursor/cursor.h"

int bw_cursor_describe(const void *cursor, size_t len, bw_cursor_info *out, size_t size, char *err,
                       size_t errlen)
{
    if (!cursor || !out) {
        snprintf(err, errlen, "bw_cursor_describe: %s", !cursor ? "no cursor given" : "no output");
        return BW_INVALID_ARGUMENT;
    }
    bw_cursor_info info;
    memset(&info, 0, sizeof(info));
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__Cursor *c = NULL;
    char why[512];
    int rc = BW_OK;
    if (bw__cursor_decode(cursor, len ? len : strlen(cursor), &a, &c, why, sizeof(why)) != BW_OK) {
        snprintf(err, errlen, "cursor refused: %s", why);
        rc = BW_CORRUPT;
    } else if (strlen(c->job) >= sizeof(info.job)) {
        snprintf(err, errlen,
                 "cursor refused: its job name has %zu bytes, more than a job name "
                 "can have (%zu)",
                 strlen(c->job), sizeof(info.job) - 1);
        rc = BW_CORRUPT;
    } else {
        memcpy(info.job, c->job, strlen(c->job) + 1);
        info.fingerprint = c->job_fingerprint;
        info.rank = c->rank;
        info.world_size = c->world_size;
        info.epoch = c->epoch;
        info.step = c->step;
        info.stream_position = c->stream_position;
        info.nsources = c->n_source_offsets;
    }
    bw__arena_reset(&a);
    if (rc != BW_OK)
        return rc;
    /* A caller built against an older (shorter) struct gets the fields it knows; a newer
     * (longer) one reads 0 past them. */
    memcpy(out, &info, size < sizeof(info) ? size : sizeof(info));
    if (size > sizeof(info))
        memset((char *)out + sizeof(info), 0, size - sizeof(info));
    return BW_OK;
}
