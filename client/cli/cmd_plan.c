/*
 * batchwire plan: the offline view of the planner (core/jobs/plan.h), the function the
 * coordinator and the client library call for the same configuration. Prints, for each rank
 * (ascending) and each step (ascending), one JSON object per line:
 *   {"rank":0,"step":0,"indices":[3,1,4],"real":3,"padding":[0,0,0]}
 * `step` counts from the start of the epoch. Other tools parse this output: keep the
 * contract in docs/semantics.md in step with it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "jobs/plan.h"

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
} plan_cfg;

#define I64_MAX_TEXT INT64_MAX

static const bw_opt options[] = {
    {"mode", BW_OPT_ENUM, offsetof(plan_cfg, mode), NULL, 0, 0, "torch|accelerate|iterable",
     BW_OPT_NO_ENV, "MODE",
     "whose semantics: torch (DistributedSampler + DataLoader), accelerate (BatchSamplerShard) "
     "or iterable (IterableDatasetShard); required"},
    {"num-samples", BW_OPT_INT, offsetof(plan_cfg, num_samples), NULL, 0, 1ll << 62, NULL,
     BW_OPT_NO_ENV, "N", "dataset length (iterable: stream length); required"},
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
    {"shuffle-algo", BW_OPT_ENUM, offsetof(plan_cfg, shuffle_algo), "torch", 0, 0, "torch|feistel",
     BW_OPT_NO_ENV, "ALGO",
     "torch: bit-exact torch.randperm (4-8 bytes a sample); feistel: O(1) memory, not "
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
    BW_OPT_END,
};

static const char synopsis[] =
    "--mode torch|accelerate|iterable --num-samples N --world-size R --batch-size B [options]";
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

static void print_metadata(const bw__plan *p, uint64_t first_rank, uint64_t last_rank)
{
    const bw__sampler_cfg *c = bw__plan_config(p);
    printf("{\"metadata\":{\"mode\":\"%s\",\"num_samples\":%" PRIu64 ",\"world_size\":%" PRIu64
           ",\"batch_size\":%" PRIu64 ",\"epoch\":%" PRIu64 ",\"first_step\":%" PRIu64
           ",\"end_step\":[",
           bw__sampler_mode_name(c->mode), c->num_samples, bw__plan_world_size(p), c->batch_size,
           bw__plan_epoch(p), bw__plan_first_step(p));
    for (uint64_t r = first_rank; r <= last_rank; r++)
        printf("%s%" PRIu64, r == first_rank ? "" : ",", bw__plan_end_step(p, r));
    printf("],\"equal_batches\":%s,\"torch_identical\":%s}}\n",
           bw__plan_equal_batches(p) ? "true" : "false",
           c->shuffle && c->shuffle_algo == BW__SHUFFLE_FEISTEL ? "false" : "true");
}

static int run(const plan_cfg *pc)
{
    char err[512];
    if (pc->mode == UNSET)
        return bad("--mode is required (torch, accelerate or iterable)");
    if (pc->num_samples == UNSET)
        return bad("--num-samples is required");
    if (pc->world_size == UNSET)
        return bad("--world-size is required");
    if (pc->batch_size == UNSET)
        return bad("--batch-size is required");
    if ((pc->resume_world == UNSET) != (pc->resume_step == UNSET))
        return bad("--resume-from-world and --resume-from-step must be given together");

    bw__plan_spec spec;
    memset(&spec, 0, sizeof(spec));
    bw__sampler_cfg *c = &spec.sampler;
    bw__sampler_cfg_init(c);
    c->mode = (bw__sampler_mode)pc->mode;
    c->num_samples = (uint64_t)pc->num_samples;
    c->world_size = (uint64_t)(pc->resume_world != UNSET ? pc->resume_world : pc->world_size);
    c->batch_size = (uint64_t)pc->batch_size;
    c->shuffle = pc->shuffle;
    c->seed = pc->seed;
    c->epoch = (uint64_t)pc->epoch;
    c->shuffle_algo = (bw__shuffle_algo)pc->shuffle_algo;
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
    bw__plan *p;
    int rc = bw__plan_new(&spec, c->epoch, false, &p, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "batchwire plan: %s\n", err);
        return rc == BW_INVALID_ARGUMENT ? 2 : 1;
    }

    uint64_t first_rank = pc->rank == UNSET ? 0 : (uint64_t)pc->rank;
    uint64_t last_rank = pc->rank == UNSET ? R - 1 : (uint64_t)pc->rank;
    if (pc->metadata)
        print_metadata(p, first_rank, last_rank);
    if (!bw__plan_equal_batches(p))
        fprintf(stderr, "batchwire plan: note: ranks get different numbers of batches "
                        "(even_batches off); a DDP job would hang on the shorter ranks\n");
    fflush(stdout);

    size_t cap = bw__plan_max_batch(p);
    bw__batch b = {malloc(cap * sizeof(uint64_t)), malloc(cap), 0, 0};
    out_buf *o = malloc(sizeof(*o));
    if (!b.indices || !b.padding || !o) {
        free(b.indices);
        free(b.padding);
        free(o);
        bw__plan_free(p);
        fprintf(stderr, "batchwire plan: out of memory\n");
        return 1;
    }
    o->len = 0;
    uint64_t start = bw__plan_first_step(p);
    if ((uint64_t)pc->skip > start)
        start = (uint64_t)pc->skip;
    for (uint64_t r = first_rank; r <= last_rank; r++) {
        uint64_t end = bw__plan_end_step(p, r);
        for (uint64_t step = start; step < end; step++) {
            if (bw__plan_batch(p, r, step, &b) != 0)
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
    bw__plan_free(p);
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
    int status = bw__config_main("batchwire plan", synopsis, description, options, &pc, argc, argv);
    if (status < 0)
        status = run(&pc);
    bw__config_free(options, &pc);
    return status;
}
