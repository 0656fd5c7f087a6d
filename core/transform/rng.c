/* Random choices of the transforms: a counter-based PRNG keyed by (seed, epoch, source,
 * index, op position), and torchvision's RandomResizedCrop parameters drawn from it
 * (docs/transforms.md, "Random choices", spells out both for re-implementation). */
#include <math.h>

#include "placement/placement.h"
#include "transform/transform.h"

static const uint64_t GOLDEN = 0x9e3779b97f4a7c15ull;

void bw__tf_rng_init(bw__tf_rng *r, const bw__tf_key *key, int op)
{
    /* Each part is folded in through the splitmix64 finalizer, so that neighbouring indexes,
     * epochs and ops give unrelated streams. */
    uint64_t k = bw__placement_mix64(key->seed ^ 0x5851f42d4c957f2dull);
    k = bw__placement_mix64(k ^ (key->epoch * GOLDEN + 1));
    k = bw__placement_mix64(k ^ (key->source * GOLDEN + 2));
    k = bw__placement_mix64(k ^ (key->index * GOLDEN + 3));
    k = bw__placement_mix64(k ^ ((uint64_t)op * GOLDEN + 4));
    r->key = k;
    r->n = 0;
}

uint64_t bw__tf_rng_next(bw__tf_rng *r)
{
    /* splitmix64 started at the key: the n-th output is mix(key + n * golden), n = 1, 2, ... */
    r->n++;
    return bw__placement_mix64(r->key + r->n * GOLDEN);
}

double bw__tf_rng_uniform(bw__tf_rng *r)
{
    return (double)(bw__tf_rng_next(r) >> 11) * 0x1p-53;
}

uint64_t bw__tf_rng_below(bw__tf_rng *r, uint64_t n)
{
    /* Rejection of the 2^64 mod n lowest words keeps every residue equally likely. */
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t x = bw__tf_rng_next(r);
        if (x >= threshold)
            return x % n;
    }
}

void bw__tf_rrc_params(bw__tf_rng *r, int h, int w, const double scale[2], const double ratio[2],
                       int64_t box[4])
{
    double area = (double)h * (double)w;
    double lr0 = log(ratio[0]), lr1 = log(ratio[1]);
    for (int t = 0; t < 10; t++) {
        double target = area * (scale[0] + (scale[1] - scale[0]) * bw__tf_rng_uniform(r));
        double aspect = exp(lr0 + (lr1 - lr0) * bw__tf_rng_uniform(r));
        /* Python's round(): halves to even, which rint does in the default rounding mode. */
        double cw = rint(sqrt(target * aspect)), chh = rint(sqrt(target / aspect));
        if (cw > 0 && cw <= w && chh > 0 && chh <= h) {
            int64_t ih = (int64_t)chh, iw = (int64_t)cw;
            box[0] = (int64_t)bw__tf_rng_below(r, (uint64_t)(h - ih + 1));
            box[1] = (int64_t)bw__tf_rng_below(r, (uint64_t)(w - iw + 1));
            box[2] = ih;
            box[3] = iw;
            return;
        }
    }
    /* Ten misses: the largest central crop whose aspect ratio is within the range. */
    double in_ratio = (double)w / (double)h;
    int64_t cw = w, chh = h;
    if (in_ratio < ratio[0])
        chh = (int64_t)rint(w / ratio[0]);
    else if (in_ratio > ratio[1])
        cw = (int64_t)rint(h * ratio[1]);
    /* A crop of zero rows or columns (a ratio range far from the image's) is one instead. */
    chh = chh < 1 ? 1 : chh;
    cw = cw < 1 ? 1 : cw;
    box[0] = (h - chh) / 2;
    box[1] = (w - cw) / 2;
    box[2] = chh;
    box[3] = cw;
}
