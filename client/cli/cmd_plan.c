/*
 * batchwire plan: the offline view of the planner (core/jobs/plan.h), the function the
 * coordinator and the client library call for the same configuration. Prints, for each rank
 * (ascending) and each step (ascending), one JSON object per line:
 *   {"rank":0,"step":0,"indices":[3,1,4],"real":3,"padding":[0,0,0]}
 * `step` counts from the start of the epoch. With --mix-size (a mixture of datasets,
 * core/jobs/mixture.h) each line also has "sources" beside "indices", which are then indices
 * within each sample's source, and with a stream source "passes". Other tools parse this output:
 * keep the contract in docs/semantics.md in step with it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common/json.h"
#include "jobs/job_check.h"
#include "jobs/mixture.h"
#include "jobs/plan.h"
#include "transform/transform.h"

#define UNSET (-1)

typedef struct plan_cfg {
    int mode;
    int64_t num_samples, world_size, batch_size, rank;
    bool shuffle;
    uint64_t seed;
    int64_t epoch;
    int shuffle_algo;
    bool drop_last, sampler_drop_last, split_batches, even_batches;
    bool dispatch_batches, pad_single_process;
    int64_t skip, resume_world, resume_step;
    bool metadata;
    char *mix_sizes; /* --mix-size values, one a line */
    int64_t mix_samples;
    int mix_policy;
    char *transform, *transform_field;
} plan_cfg;

#define I64_MAX_TEXT INT64_MAX

static const bw_opt options[] = {
    {"mode", BW_OPT_ENUM, offsetof(plan_cfg, mode), NULL, 0, 0, "torch|accelerate|iterable",
     BW_OPT_NO_ENV, "MODE",
     "whose semantics: torch (DistributedSampler + DataLoader), accelerate (BatchSamplerShard) "
     "or iterable (IterableDatasetShard); required"},
    {"num-samples", BW_OPT_INT, offsetof(plan_cfg, num_samples), NULL, 0, 1ll << 62, NULL,
     BW_OPT_NO_ENV, "N", "dataset length (iterable: stream length); required without --mix-size"},
    {"world-size", BW_OPT_INT, offsetof(plan_cfg, world_size), NULL, 1, 1 << 20, NULL,
     BW_OPT_NO_ENV, "R", "number of ranks (after the resize, with --resume-from-world); required"},
    {"batch-size", BW_OPT_INT, offsetof(plan_cfg, batch_size), NULL, 1, 1 << 24, NULL,
     BW_OPT_NO_ENV, "B", "batch size per rank (global with --split-batches); required"},
    {"rank", BW_OPT_INT, offsetof(plan_cfg, rank), NULL, 0, (1 << 20) - 1, NULL, BW_OPT_NO_ENV, "r",
     "print only this rank (default: every rank)"},
    {"shuffle", BW_OPT_BOOL, offsetof(plan_cfg, shuffle), "false", 0, 0, NULL, BW_OPT_NO_ENV, NULL,
     "shuffle: torch.randperm(n) seeded with seed + epoch (torch, accelerate)"},
    {"seed", BW_OPT_UINT64, offsetof(plan_cfg, seed), "0", 0, 0, NULL, BW_OPT_NO_ENV, "S",
     "shuffle seed, 64-bit (negative values are two's complement, as in torch)"},
    {"epoch", BW_OPT_INT, offsetof(plan_cfg, epoch), "0", 0, INT64_MAX, NULL, BW_OPT_NO_ENV, "E",
     "epoch, as given to set_epoch()"},
    {"shuffle-algo", BW_OPT_ENUM, offsetof(plan_cfg, shuffle_algo), NULL, 0, 0, "torch|feistel",
     BW_OPT_NO_ENV, "ALGO",
     "torch (default): bit-exact torch.randperm (4-8 bytes a sample); feistel: O(1) memory, not "
     "torch-identical"},
    {"drop-last", BW_OPT_BOOL, offsetof(plan_cfg, drop_last), "false", 0, 0, NULL, BW_OPT_NO_ENV,
     NULL,
     "torch: the DataLoader's drop_last; accelerate: the BatchSampler's; iterable: "
     "IterableDatasetShard's"},
    {"sampler-drop-last", BW_OPT_BOOL, offsetof(plan_cfg, sampler_drop_last), "false", 0, 0, NULL,
     BW_OPT_NO_ENV, NULL, "torch only: DistributedSampler's drop_last"},
    {"split-batches", BW_OPT_BOOL, offsetof(plan_cfg, split_batches), "false", 0, 0, NULL,
     BW_OPT_NO_ENV, NULL,
     "accelerate, iterable: --batch-size is global and each rank gets batch-size / world-size"},
    {"even-batches", BW_OPT_BOOL, offsetof(plan_cfg, even_batches), "true", 0, 0, NULL,
     BW_OPT_NO_ENV, NULL,
     "accelerate: pad the tail from the epoch's start so every rank gets as many batches "
     "(--no-even-batches: ranks may differ by one, flagged in --metadata)"},
    {"dispatch-batches", BW_OPT_BOOL, offsetof(plan_cfg, dispatch_batches), "false", 0, 0, NULL,
     BW_OPT_NO_ENV, NULL,
     "accelerate: Accelerate's DataLoaderDispatcher (dispatch_batches=True): the short last "
     "global batch is sliced among the ranks"},
    {"pad-single-process", BW_OPT_BOOL, offsetof(plan_cfg, pad_single_process), "false", 0, 0, NULL,
     BW_OPT_NO_ENV, NULL,
     "accelerate with --world-size 1: pad the last batch as BatchSamplerShard does (default: "
     "the plain BatchSampler's short last batch, as prepare_data_loader gives one process)"},
    {"skip", BW_OPT_INT, offsetof(plan_cfg, skip), "0", 0, INT64_MAX, NULL, BW_OPT_NO_ENV, "K",
     "start at step K of each rank, as after a resume (steps keep their epoch numbering)"},
    {"resume-from-world", BW_OPT_INT, offsetof(plan_cfg, resume_world), NULL, 1, 1 << 20, NULL,
     BW_OPT_NO_ENV, "R0",
     "elastic resume: the epoch ran --resume-from-step steps at world size R0 before "
     "continuing at --world-size"},
    {"resume-from-step", BW_OPT_INT, offsetof(plan_cfg, resume_step), NULL, 0, INT64_MAX, NULL,
     BW_OPT_NO_ENV, "K0", "elastic resume: steps every rank ran at --resume-from-world"},
    {"metadata", BW_OPT_BOOL, offsetof(plan_cfg, metadata), "false", 0, 0, NULL, BW_OPT_NO_ENV,
     NULL,
     "print one {\"metadata\":{...}} line first (steps per rank, equal_batches, "
     "torch_identical)"},
    {"transform", BW_OPT_STRING, offsetof(plan_cfg, transform), NULL, 0, 0, NULL, BW_OPT_NO_ENV,
     "SPEC",
     "the job's transform (docs/transforms.md), checked as fetch checks it and named in "
     "--metadata (its canonical text; for an image pipeline each sample's dtype and shape); "
     "the batches' indices do not depend on it"},
    {"transform-field", BW_OPT_STRING, offsetof(plan_cfg, transform_field), NULL, 0, 0, NULL,
     BW_OPT_NO_ENV, "KEY",
     "the tar member or jsonl key --transform transforms, checked as fetch checks it (a token "
     "pipeline on a jsonl key must end with pad(L,VALUE): its rows become int64 of length L)"},
    {"mix-size", BW_OPT_LIST, offsetof(plan_cfg, mix_sizes), NULL, 0, 0, NULL, BW_OPT_NO_ENV,
     "N=WEIGHT",
     "a mixture's source: its number of samples N and its weight (a positive decimal, e.g. "
     "0.7); repeat for each source, in order (at most 256). stream:N=WEIGHT: a stream of N "
     "records, read in its own order. Replaces --num-samples; each batch then has "
     "\"sources\" beside \"indices\" (docs/semantics.md, Mixtures)"},
    {"mix-samples", BW_OPT_INT, offsetof(plan_cfg, mix_samples), NULL, 1, 1ll << 62, NULL,
     BW_OPT_NO_ENV, "E", "the mixture's epoch size (default: the sum of the sources' sizes)"},
    {"mix-policy", BW_OPT_ENUM, offsetof(plan_cfg, mix_policy), NULL, 0, 0, "cycle|stop",
     BW_OPT_NO_ENV, "POLICY",
     "a stream source that runs dry: cycle (default) starts it again from its first record, "
     "stop ends the epoch there; needs a stream:N=WEIGHT source"},
    BW_OPT_END,
};

static const char synopsis[] =
    "--mode torch|accelerate|iterable --num-samples N --world-size R --batch-size B [options]\n"
    "       batchwire plan --mode torch|accelerate|iterable --mix-size [stream:]N=WEIGHT "
    "[--mix-size ...] [--mix-samples E] [--mix-policy cycle|stop] --world-size R --batch-size "
    "B [options]";
static const char description[] =
    "Prints the batches each rank receives in one epoch, one JSON object per line, ranks "
    "ascending then steps ascending:\n"
    "  {\"rank\":0,\"step\":0,\"indices\":[3,1,4],\"real\":3,\"padding\":[0,0,0]}\n"
    "`real` counts the samples that are not padding duplicates; `padding` flags them. "
    "An invalid combination exits with status 2. Semantics: docs/semantics.md.";

/* Output is large for big epochs: format integers by hand into one buffer. */
typedef struct out_buf {
    char data[1 << 16];
    size_t len;
} out_buf;

static void flush_out(out_buf *o)
{
    fwrite(o->data, 1, o->len, stdout);
    o->len = 0;
}

static void put_str(out_buf *o, const char *s)
{
    size_t n = strlen(s);
    if (o->len + n > sizeof(o->data))
        flush_out(o);
    memcpy(o->data + o->len, s, n);
    o->len += n;
}

static void put_u64(out_buf *o, uint64_t v)
{
    char tmp[24];
    int i = (int)sizeof(tmp);
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (o->len + sizeof(tmp) > sizeof(o->data))
        flush_out(o);
    memcpy(o->data + o->len, tmp + i, sizeof(tmp) - (size_t)i);
    o->len += sizeof(tmp) - (size_t)i;
}

static int bad(const char *msg)
{
    fprintf(stderr, "batchwire plan: %s\n", msg);
    return 2;
}

/* The plan of one dataset or of a mixture: what the printing below asks of either. */
typedef struct view {
    bw__plan *plan;       /* one dataset */
    bw__mix_sampler *mix; /* a mixture (plan NULL) */
} view;

static uint64_t view_first_step(const view *v)
{
    return v->mix ? bw__sampler_first_step(bw__mix_sampler_positions(v->mix))
                  : bw__plan_first_step(v->plan);
}

static uint64_t view_end_step(const view *v, uint64_t rank)
{
    return v->mix ? bw__sampler_end_step(bw__mix_sampler_positions(v->mix), rank)
                  : bw__plan_end_step(v->plan, rank);
}

static bool view_equal_batches(const view *v)
{
    return v->mix ? bw__sampler_equal_batches(bw__mix_sampler_positions(v->mix))
                  : bw__plan_equal_batches(v->plan);
}

static size_t view_max_batch(const view *v)
{
    return v->mix ? bw__sampler_max_batch(bw__mix_sampler_positions(v->mix))
                  : bw__plan_max_batch(v->plan);
}

static int view_batch(const view *v, uint64_t rank, uint64_t step, bw__batch *b, uint32_t *sources,
                      uint64_t *passes)
{
    return v->mix ? bw__mix_sampler_batch(v->mix, rank, step, b, sources, passes)
                  : bw__plan_batch(v->plan, rank, step, b);
}

static void view_free(view *v)
{
    bw__plan_free(v->plan);
    bw__mix_sampler_free(v->mix);
}

/* --transform: the spec checked, its canonical text and, for an image pipeline or token ops
 * on a jsonl key (--transform-field), the shape of every sample's result (a token pipeline's
 * on npy rows comes from the dataset's rows). */
typedef struct plan_tf {
    char canon[BW_TF_CANON_MAX];
    const char *field;
    bool shaped;
    bw__tf_shape shape;
} plan_tf;

static int check_transform(const char *text, const char *field, plan_tf *t, char *err,
                           size_t errlen)
{
    bw__tf_spec spec;
    char why[512];
    memset(t, 0, sizeof(*t));
    field = field && field[0] ? field : NULL;
    if (!text) {
        if (field)
            snprintf(err, errlen, "--transform-field '%.200s' given without --transform", field);
        return field ? 2 : 0;
    }
    if (field && strlen(field) >= BW_JOB_FIELD_MAX) {
        snprintf(err, errlen, "--transform-field '%.64s...': longer than %d bytes", field,
                 BW_JOB_FIELD_MAX - 1);
        return 2;
    }
    /* Token ops with a field read a jsonl key's arrays (docs/transforms.md, "JSON Lines
     * fields"): their length must be fixed, as fetch requires. */
    if (bw__tf_parse(text, &spec, why, sizeof(why)) != BW_OK ||
        (!bw__tf_is_tokens(&spec) ? bw__tf_output_shape(&spec, &t->shape, why, sizeof(why))
         : field                  ? bw__tf_tokens_json_shape(&spec, &t->shape, why, sizeof(why))
                                  : BW_OK) != BW_OK) {
        snprintf(err, errlen, "--transform '%.200s'%s%.80s%s: %.500s", text,
                 field ? " on jsonl key '" : "", field ? field : "", field ? "'" : "", why);
        return 2;
    }
    t->shaped = !bw__tf_is_tokens(&spec) || field;
    t->field = field;
    if (bw__tf_format(&spec, t->canon, sizeof(t->canon)) < 0) {
        snprintf(err, errlen, "--transform '%.200s': its canonical text is too long", text);
        return 2;
    }
    return 0;
}

static void print_metadata(const view *v, const bw__sampler_cfg *c, uint64_t first_rank,
                           uint64_t last_rank, const plan_tf *tf)
{
    const bw__sampler *ps = v->mix ? bw__mix_sampler_positions(v->mix) : NULL;
    printf("{\"metadata\":{\"mode\":\"%s\",\"num_samples\":%" PRIu64 ",\"world_size\":%" PRIu64
           ",\"batch_size\":%" PRIu64 ",\"epoch\":%" PRIu64 ",\"first_step\":%" PRIu64
           ",\"end_step\":[",
           bw__sampler_mode_name(c->mode), c->num_samples,
           ps ? bw__sampler_world_size(ps) : bw__plan_world_size(v->plan), c->batch_size, c->epoch,
           view_first_step(v));
    for (uint64_t r = first_rank; r <= last_rank; r++)
        printf("%s%" PRIu64, r == first_rank ? "" : ",", view_end_step(v, r));
    printf("],\"equal_batches\":%s,\"torch_identical\":%s",
           view_equal_batches(v) ? "true" : "false",
           c->shuffle && c->shuffle_algo == BW__SHUFFLE_FEISTEL ? "false" : "true");
    if (v->mix) {
        const bw__mixture *m = bw__mix_sampler_mixture(v->mix);
        printf(",\"mix_samples\":%" PRIu64 ",\"mix_end\":%" PRIu64 ",\"mix_counts\":[",
               bw__mixture_samples(m), bw__mixture_end(m));
        for (size_t j = 0; j < bw__mixture_nsources(m); j++)
            printf("%s%" PRIu64, j ? "," : "", bw__mixture_count(m, j));
        printf("]");
    }
    if (tf->canon[0]) { /* the canonical text is printable ASCII without '"' or '\\' */
        printf(",\"transform\":\"%s\"", tf->canon);
        if (tf->field) {
            printf(",\"transform_field\":");
            bw__json_string(stdout, tf->field);
        }
        if (tf->shaped) {
            printf(",\"sample_dtype\":\"%s\",\"sample_shape\":[", tf->shape.descr);
            for (int d = 0; d < tf->shape.ndim; d++)
                printf("%s%d", d ? "," : "", tf->shape.dims[d]);
            printf("]");
        }
    }
    printf("}}\n");
}

/* --mix-size values: "[stream:]N=WEIGHT" a line, at most BW__MIX_MAX_SOURCES. */
static int parse_mix_sizes(const char *text, uint64_t *sizes, uint64_t *weights, bool *streams,
                           size_t *n, char *err, size_t errlen)
{
    *n = 0;
    for (const char *line = text; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char item[128];
        if (len >= sizeof(item)) {
            snprintf(err, errlen, "--mix-size '%.40s...': longer than %zu characters", line,
                     sizeof(item) - 1);
            return 2;
        }
        memcpy(item, line, len);
        item[len] = '\0';
        line = nl ? nl + 1 : NULL;
        if (*n == BW__MIX_MAX_SOURCES) {
            snprintf(err, errlen,
                     "--mix-size given more than %d times: a mixture has at most %d "
                     "sources",
                     BW__MIX_MAX_SOURCES, BW__MIX_MAX_SOURCES);
            return 2;
        }
        const char *number = item;
        streams[*n] = strncmp(item, "stream:", 7) == 0;
        if (streams[*n])
            number += 7;
        const char *eq = strchr(number, '=');
        if (!eq || eq == number) {
            snprintf(err, errlen,
                     "--mix-size '%s': expected N=WEIGHT or stream:N=WEIGHT (the "
                     "source's number of samples and its weight, e.g. 1000=0.7)",
                     item);
            return 2;
        }
        uint64_t size = 0;
        for (const char *c = number; c < eq; c++) {
            if (*c < '0' || *c > '9') {
                snprintf(err, errlen, "--mix-size '%s': the size '%.*s' is not a whole number",
                         item, (int)(eq - number), number);
                return 2;
            }
            size = size * 10 + (uint64_t)(*c - '0');
            if (size > BW__MIX_MAX_SAMPLES) {
                snprintf(err, errlen, "--mix-size '%s': the size is above 2^62", item);
                return 2;
            }
        }
        if (size == 0) {
            snprintf(err, errlen, "--mix-size '%s': a source needs at least one sample (N = 0)",
                     item);
            return 2;
        }
        char why[256];
        if (bw__mix_weight_parse(eq + 1, &weights[*n], why, sizeof(why)) != 0) {
            snprintf(err, errlen, "--mix-size '%s': %s", item, why);
            return 2;
        }
        sizes[(*n)++] = size;
    }
    return 0;
}

/* What --mix-size excludes, or 0. */
static const char *mix_conflict(const plan_cfg *pc)
{
    if (pc->num_samples != UNSET)
        return "--num-samples and --mix-size exclude each other: a mixture's epoch size is "
               "--mix-samples (default: the sum of the sources' sizes)";
    if (pc->shuffle)
        return "--shuffle does not apply to a mixture: it draws each source's samples in a seeded "
               "permutation and interleaves the sources by the seed already (docs/semantics.md, "
               "Mixtures)";
    if (pc->shuffle_algo != UNSET)
        return "--shuffle-algo does not apply to a mixture: its permutations are its own "
               "(docs/semantics.md, Mixtures)";
    return NULL;
}

static int run(const plan_cfg *pc)
{
    char err[1024];
    bool mixture = pc->mix_sizes != NULL;
    if (pc->mode == UNSET)
        return bad("--mode is required (torch, accelerate or iterable)");
    if (mixture && mix_conflict(pc))
        return bad(mix_conflict(pc));
    if (!mixture && pc->mix_samples != UNSET)
        return bad("--mix-samples needs the mixture's sources (--mix-size N=WEIGHT, repeated)");
    if (!mixture && pc->mix_policy != UNSET)
        return bad("--mix-policy needs a mixture with a stream source (--mix-size "
                   "stream:N=WEIGHT)");
    if (!mixture && pc->num_samples == UNSET)
        return bad("--num-samples is required (or --mix-size for a mixture)");
    if (pc->world_size == UNSET)
        return bad("--world-size is required");
    plan_tf tf;
    if (check_transform(pc->transform, pc->transform_field, &tf, err, sizeof(err)) != 0)
        return bad(err);
    if (pc->batch_size == UNSET)
        return bad("--batch-size is required");
    if ((pc->resume_world == UNSET) != (pc->resume_step == UNSET))
        return bad("--resume-from-world and --resume-from-step must be given together");

    uint64_t sizes[BW__MIX_MAX_SOURCES], weights[BW__MIX_MAX_SOURCES];
    bool streams[BW__MIX_MAX_SOURCES];
    bw__mix_spec mix = {
        sizes,   weights,
        0,       pc->mix_samples == UNSET ? 0 : (uint64_t)pc->mix_samples,
        streams, pc->mix_policy == UNSET ? BW__MIX_CYCLE : (bw__mix_policy)pc->mix_policy};
    uint64_t num_samples = (uint64_t)pc->num_samples;
    bool any_stream = false;
    if (mixture) {
        if (parse_mix_sizes(pc->mix_sizes, sizes, weights, streams, &mix.nsources, err,
                            sizeof(err)))
            return bad(err);
        for (size_t j = 0; j < mix.nsources; j++)
            any_stream |= streams[j];
        if (pc->mix_policy != UNSET && !any_stream)
            return bad("--mix-policy applies to stream sources (--mix-size stream:N=WEIGHT) and "
                       "this mixture has none: a map-style source never runs dry (each pass is "
                       "a new permutation), so there is nothing to stop or cycle");
        bw__mixture *m;
        if (bw__mixture_new(&m, &mix, pc->seed, (uint64_t)pc->epoch, err, sizeof(err)) != 0)
            return bad(err);
        num_samples = bw__mixture_end(m);
        bw__mixture_free(m);
    }

    bw__plan_spec spec;
    memset(&spec, 0, sizeof(spec));
    bw__sampler_cfg *c = &spec.sampler;
    bw__sampler_cfg_init(c);
    c->mode = (bw__sampler_mode)pc->mode;
    c->num_samples = num_samples;
    c->world_size = (uint64_t)(pc->resume_world != UNSET ? pc->resume_world : pc->world_size);
    c->batch_size = (uint64_t)pc->batch_size;
    c->shuffle = pc->shuffle;
    c->seed = pc->seed;
    c->epoch = (uint64_t)pc->epoch;
    c->shuffle_algo =
        pc->shuffle_algo == UNSET ? BW__SHUFFLE_TORCH : (bw__shuffle_algo)pc->shuffle_algo;
    c->drop_last = pc->drop_last;
    c->sampler_drop_last = pc->sampler_drop_last;
    c->split_batches = pc->split_batches;
    c->even_batches = pc->even_batches;
    c->dispatch_batches = pc->dispatch_batches;
    c->shard_single_process = pc->pad_single_process;
    /* Check the world size the epoch starts with, then the final one, so that each message
     * names the value it is about. */
    if (bw__sampler_cfg_check(c, err, sizeof(err)) != 0 ||
        (c->world_size = (uint64_t)pc->world_size, bw__sampler_cfg_check(c, err, sizeof(err)) != 0))
        return bad(err);
    uint64_t R = (uint64_t)pc->world_size;
    if (pc->rank != UNSET && (uint64_t)pc->rank >= R) {
        snprintf(err, sizeof(err), "--rank %" PRId64 " is out of range for --world-size %" PRIu64,
                 pc->rank, R);
        return bad(err);
    }

    /* The epoch as a job's history records it: it started at R0 (or R) and, with an elastic
     * resume, continued at R from step K0. An iterable stream is one source of N records. */
    Batchwire__V1__WorldSegment segs[2] = {BATCHWIRE__V1__WORLD_SEGMENT__INIT,
                                           BATCHWIRE__V1__WORLD_SEGMENT__INIT};
    const Batchwire__V1__WorldSegment *history[2] = {&segs[0], &segs[1]};
    segs[0].epoch = segs[1].epoch = c->epoch;
    segs[0].world_size = (uint32_t)(pc->resume_world != UNSET ? pc->resume_world : pc->world_size);
    segs[1].start_step = pc->resume_world != UNSET ? (uint64_t)pc->resume_step : 0;
    segs[1].world_size = (uint32_t)R;
    uint64_t records = c->num_samples;
    spec.records = &records;
    spec.nsources = 1;
    spec.history = history;
    spec.nhistory = pc->resume_world != UNSET ? 2 : 1;
    view v = {NULL, NULL};
    int rc = mixture ? bw__mix_sampler_new(&v.mix, &mix, c, history, spec.nhistory, c->epoch, err,
                                           sizeof(err))
                     : bw__plan_new(&spec, c->epoch, false, &v.plan, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "batchwire plan: %s\n", err);
        return rc == BW_INVALID_ARGUMENT ? 2 : 1;
    }

    uint64_t first_rank = pc->rank == UNSET ? 0 : (uint64_t)pc->rank;
    uint64_t last_rank = pc->rank == UNSET ? R - 1 : (uint64_t)pc->rank;
    if (pc->metadata)
        print_metadata(&v, c, first_rank, last_rank, &tf);
    if (!view_equal_batches(&v))
        fprintf(stderr, "batchwire plan: note: ranks get different numbers of batches "
                        "(even_batches off); a DDP job would hang on the shorter ranks\n");
    fflush(stdout);

    size_t cap = view_max_batch(&v);
    bw__batch b = {malloc(cap * sizeof(uint64_t)), malloc(cap), 0, 0};
    uint32_t *sources = malloc(cap * sizeof(*sources));
    uint64_t *passes = malloc(cap * sizeof(*passes));
    out_buf *o = malloc(sizeof(*o));
    if (!b.indices || !b.padding || !sources || !passes || !o) {
        free(b.indices);
        free(b.padding);
        free(sources);
        free(passes);
        free(o);
        view_free(&v);
        fprintf(stderr, "batchwire plan: out of memory\n");
        return 1;
    }
    o->len = 0;
    uint64_t start = view_first_step(&v);
    if ((uint64_t)pc->skip > start)
        start = (uint64_t)pc->skip;
    for (uint64_t r = first_rank; r <= last_rank; r++) {
        uint64_t end = view_end_step(&v, r);
        for (uint64_t step = start; step < end; step++) {
            if (view_batch(&v, r, step, &b, sources, passes) != 0)
                break;
            put_str(o, "{\"rank\":");
            put_u64(o, r);
            put_str(o, ",\"step\":");
            put_u64(o, step);
            put_str(o, ",\"indices\":[");
            for (size_t j = 0; j < b.count; j++) {
                if (j)
                    put_str(o, ",");
                put_u64(o, b.indices[j]);
            }
            if (mixture) {
                put_str(o, "],\"sources\":[");
                for (size_t j = 0; j < b.count; j++) {
                    if (j)
                        put_str(o, ",");
                    put_u64(o, sources[j]);
                }
            }
            if (any_stream) {
                put_str(o, "],\"passes\":[");
                for (size_t j = 0; j < b.count; j++) {
                    if (j)
                        put_str(o, ",");
                    put_u64(o, passes[j]);
                }
            }
            put_str(o, "],\"real\":");
            put_u64(o, b.real);
            put_str(o, ",\"padding\":[");
            for (size_t j = 0; j < b.count; j++)
                put_str(o, j ? (b.padding[j] ? ",1" : ",0") : (b.padding[j] ? "1" : "0"));
            put_str(o, "]}\n");
        }
    }
    flush_out(o);
    free(o);
    free(b.indices);
    free(b.padding);
    free(sources);
    free(passes);
    view_free(&v);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "batchwire plan: cannot write the output\n");
        return 1;
    }
    return 0;
}

int bw__cmd_plan(int argc, char **argv)
{
    plan_cfg pc;
    memset(&pc, 0, sizeof(pc));
    /* Settings without a default start unset; the table leaves them alone unless given. */
    pc.mode = UNSET;
    pc.num_samples = pc.world_size = pc.batch_size = pc.rank = UNSET;
    pc.resume_world = pc.resume_step = UNSET;
    pc.shuffle_algo = UNSET;
    pc.mix_samples = UNSET;
    pc.mix_policy = UNSET;
    int status = bw__config_main("batchwire plan", synopsis, description, options, &pc, argc, argv);
    if (status < 0)
        status = run(&pc);
    bw__config_free(options, &pc);
    return status;
}
