/* A mixture job's description (docs/semantics.md, "Mixtures"): made by the coordinator from
 * its sources' descriptions, which workers gave, so that the planner, the job's fingerprint and
 * the loaders read one DatasetInfo as for any job. */
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/refuse.h"
#include "jobs.h"

/* Whether two layouts describe the same samples (dtype, shape, size). */
static bool same_layout(const Batchwire__V1__SampleLayout *a, const Batchwire__V1__SampleLayout *b)
{
    if (!a || !b)
        return a == b;
    if (a->sample_bytes != b->sample_bytes || a->n_shape != b->n_shape ||
        strcmp(a->dtype ? a->dtype : "", b->dtype ? b->dtype : "") != 0)
        return false;
    for (size_t i = 0; i < a->n_shape; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

int bw__jobs_mixture_info(bw_arena *arena, const Batchwire__V1__Mixture *mix,
                          Batchwire__V1__DatasetInfo *const *infos,
                          Batchwire__V1__DatasetInfo **out, char *err, size_t errlen)
{
    *out = NULL;
    size_t n = mix->n_sources;
    Batchwire__V1__DatasetInfo *info = bw__arena_alloc(arena, sizeof(*info));
    Batchwire__V1__SourceInfo *src = bw__arena_alloc(arena, n * sizeof(*src));
    Batchwire__V1__SourceInfo **srcp = bw__arena_alloc(arena, n * sizeof(*srcp));
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!info || !src || !srcp || !md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(md);
        snprintf(err, errlen, "out of memory describing a mixture of %zu sources", n);
        return BW_NOMEM;
    }
    batchwire__v1__dataset_info__init(info);
    info->format = "mixture";
    uint64_t sum = 0;
    int rc = BW_OK;
    for (size_t j = 0; j < n && rc == BW_OK; j++) {
        const Batchwire__V1__DatasetInfo *d = infos[j];
        const Batchwire__V1__Dataset *ds = mix->sources[j]->dataset;
        if (d->n_fields > 0)
            rc = bw__refuse(err, errlen,
                            "source %zu (%s:%s%s) holds named arrays (%zu fields): a "
                            "mixture reads whole samples of one array per source",
                            j, ds->format, ds->n_sources ? ds->sources[0] : "",
                            ds->n_sources > 1 ? ",..." : "", d->n_fields);
        else if (d->length == 0)
            rc = bw__refuse(err, errlen, "source %zu (%s:%s%s) is empty", j, ds->format,
                            ds->n_sources ? ds->sources[0] : "", ds->n_sources > 1 ? ",..." : "");
        batchwire__v1__source_info__init(&src[j]);
        src[j].path = d->format;
        src[j].records = d->length;
        src[j].size_bytes = d->total_bytes;
        srcp[j] = &src[j];
        sum = d->length > UINT64_MAX - sum ? UINT64_MAX : sum + d->length;
        info->total_bytes += d->total_bytes;
        const char *fp = d->fingerprint ? d->fingerprint : "";
        if (EVP_DigestUpdate(md, fp, strlen(fp) + 1) != 1)
            rc = BW_NOMEM;
    }
    unsigned char h[EVP_MAX_MD_SIZE];
    unsigned int hlen = 0;
    if (rc == BW_OK && EVP_DigestFinal_ex(md, h, &hlen) != 1)
        rc = BW_NOMEM;
    EVP_MD_CTX_free(md);
    char *hex = rc == BW_OK ? bw__arena_alloc(arena, 2 * (size_t)hlen + 1) : NULL;
    if (rc == BW_OK && !hex)
        rc = BW_NOMEM;
    if (rc == BW_NOMEM)
        snprintf(err, errlen, "out of memory describing a mixture of %zu sources", n);
    if (rc != BW_OK)
        return rc;
    for (unsigned i = 0; i < hlen; i++)
        snprintf(hex + 2 * i, 3, "%02x", h[i]);
    info->fingerprint = hex;
    info->length = mix->samples ? mix->samples : sum;
    info->n_sources = n;
    info->sources = srcp;
    info->n_mix_sources = n;
    info->mix_sources = (Batchwire__V1__DatasetInfo **)infos;
    /* The samples' layout when every source has the same one (a batch of one dtype). */
    bool same = true;
    for (size_t j = 1; j < n; j++)
        same = same && same_layout(infos[0]->layout, infos[j]->layout);
    info->layout = same ? infos[0]->layout : NULL;
    *out = info;
    return BW_OK;
}
