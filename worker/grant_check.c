/* The worker's check of read grants (docs/security.md, "Read grants"; core/auth/grant.h):
 * with authentication on, a ReadSamples or ReadStream request from a caller without
 * credentials or from a trainer is served only with a valid grant for this worker and the
 * request's dataset; admins read without one. Both transports call it once a request is
 * decoded and before anything is opened (data_service.c, data_channel.c). */
#include <stdio.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/util.h"
#include "request.h"
#include "worker.h"

static bw_log_limit refusals; /* a hostile client cannot flood the log */

int bw__worker_grant_check(bw_worker *w, bw_role role, const ProtobufCMessage *req,
                           const char *peer, char *err, size_t errlen)
{
    if (!w->grants || role == BW_ROLE_ADMIN || role == BW_ROLE_OPEN)
        return BW_OK;
    const Batchwire__V1__ReadGrant *grant;
    const Batchwire__V1__Dataset *dataset;
    const char *method;
    const Batchwire__V1__ReadSamplesRequest *multi = NULL;
    if (req->descriptor == &batchwire__v1__read_stream_request__descriptor) {
        const Batchwire__V1__ReadStreamRequest *r = (const void *)req;
        grant = r->grant;
        dataset = r->dataset;
        method = "ReadStream";
    } else {
        const Batchwire__V1__ReadSamplesRequest *r = (const void *)req;
        grant = r->grant;
        dataset = r->dataset;
        method = "ReadSamples";
        multi = r->n_datasets ? r : NULL;
    }
    char why[768];
    bool reader = role == BW_ROLE_NONE || role == BW_ROLE_TRAINER;
    int rc = !reader ? BW_PERMISSION_DENIED
             : multi ? BW_OK
                     : bw__grant_verify(w->grants, w->id, grant, dataset, bw__unix_ms(), why,
                                        sizeof(why));
    /* Several datasets (docs/data-channel.md, "Several datasets in one request"): the grant
     * covers every one of them, or the request is refused naming the first it does not. */
    for (size_t k = 0; reader && multi && k < multi->n_datasets && rc == BW_OK; k++) {
        const Batchwire__V1__Dataset *d = multi->datasets[k]->dataset;
        char one[640];
        if ((rc = bw__grant_verify(w->grants, w->id, grant, d, bw__unix_ms(), one, sizeof(one))) !=
            BW_OK)
            snprintf(why, sizeof(why), "dataset %zu of %zu (%s %s%s): %s", k, multi->n_datasets,
                     d && d->format ? d->format : "?", bw__ds_spec_first(d),
                     d && d->n_sources > 1 ? ",..." : "", one);
    }
    if (rc == BW_PERMISSION_DENIED && role != BW_ROLE_NONE && role != BW_ROLE_TRAINER)
        snprintf(why, sizeof(why), "role %s may not read", bw__role_name(role));
    if (rc == BW_OK)
        return BW_OK;
    uint64_t quiet;
    if (bw__log_limit_allow(&refusals, &quiet))
        BW_WARN("read refused method=%s peer=%s code=%s not_logged_before=%llu err=%s", method,
                peer, bw_err_name(rc), (unsigned long long)quiet, why);
    snprintf(err, errlen, "%s: %s", method, why);
    return rc;
}
