/*
 * batchwire — the trainer's loader: exactly this rank's batches, in plan order, with exact
 * resume from a cursor and failover across storage workers.
 *
 *     bw_loader_options o;
 *     bw_loader_options_init(&o);
 *     o.coordinator = "10.0.0.5:7700";
 *     o.job = "resnet-run-17";
 *     o.dataset = "npy:imagenet/train-*.npy";
 *     o.mode = "torch";
 *     o.batch_size = 256;
 *     o.shuffle = 1;
 *     bw_loader *l;
 *     char err[512];
 *     if (bw_loader_open(&o, &l, err, sizeof err) != BW_OK) { fprintf(stderr, "%s\n", err); ... }
 *     const bw_batch *b;
 *     int rc = BW_OK;
 *     // Epochs as PyTorch's `for epoch in range(start, N): sampler.set_epoch(epoch); for b in
 *     // loader:` -- a resumed loader continues in the middle of its epoch.
 *     for (uint64_t e = bw_loader_epoch(l); e < N && rc == BW_OK; e++) {
 *         if ((rc = bw_loader_set_epoch(l, e)) != BW_OK) break;
 *         while ((rc = bw_loader_next(l, &b)) == BW_OK)
 *             train_step(bw_batch_data(b), bw_batch_real(b));
 *         if (rc == BW_END_OF_EPOCH) rc = BW_OK;
 *     }
 *     bw_loader_close(l);
 *
 * (Equivalently: after BW_END_OF_EPOCH call bw_loader_next_epoch, as the Python Loader does
 * when it is iterated again. Set `epochs` = N in the options so that the job is marked
 * finished once the last epoch has been delivered.)
 *
 * Threads: the rule in batchwire.h ("Threads"): one thread at a time per loader, with the
 * exceptions listed there (bw_loader_get_stats, bw_loader_lease_state, holds). Blocking calls
 * return BW_INTERRUPTED after bw_interrupt (batchwire.h: signals). Errors: every function
 * returns BW_OK or a negative code from batchwire.h; a failing call always leaves a sentence:
 * in `err` for the calls that take one, else in bw_loader_errmsg() (except where noted: a
 * batch accessor's code, bw_loader_get_stats and bw_loader_lease_state leave it unchanged).
 * The library never prints or exits (see bw_set_log_callback).
 *
 * Network: bw_loader_open, _open_at, _open_elastic, bw_loader_rank_steps and
 * bw_job_checkpoint call the coordinator (retried for retry_ms while it is unreachable).
 * bw_loader_next waits for the loader's fetch threads, which read from the workers and ask
 * the coordinator for placement when a worker fails. bw_loader_commit calls the coordinator;
 * bw_loader_close tells it the rank leaves (a short deadline). For streams (mode iterable),
 * bw_loader_cursor, bw_loader_cursor_text and bw_loader_commit also ask a worker where each
 * source's next record starts. Everything else is local: bw_loader_seek,
 * bw_loader_set_epoch and bw_loader_next_epoch only move the position (the fetch threads
 * then read from the new one), and the batch and stats accessors read memory.
 */
#ifndef BATCHWIRE_LOADER_H
#define BATCHWIRE_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "batchwire/batchwire.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bw_loader bw_loader;
typedef struct bw_batch bw_batch;

/* Settings of a loader. Initialise with bw_loader_options_init, then set what you need;
 * strings are borrowed for the duration of the call they are passed to (bw_loader_open ...).
 *
 * ABI: `size` comes first and is set by bw_loader_options_init to sizeof(bw_loader_options)
 * as the caller was compiled. Fields are only ever added at the end. A library newer than the
 * caller reads the fields within `size` and uses the defaults for the rest; a library older
 * than the caller accepts a longer struct only when every byte past its own struct is zero
 * (a newer setting left at its default), else the call fails with BW_INVALID_ARGUMENT naming
 * the size. A size below the first version's (a struct not initialised) is refused the same
 * way. */
typedef struct bw_loader_options {
    size_t size; /* set by bw_loader_options_init; do not change */

    /* where and who */
    const char *coordinator; /* HOST:PORT (required) */
    const char *tls_ca;      /* PEM CA: use TLS; NULL: plaintext */
    const char *tls_cert;    /* client certificate for mutual TLS, with tls_key */
    const char *tls_key;
    const char *tls_server_name; /* name to verify instead of the host in `coordinator` */
    const char *job;             /* job name (required) */
    const char *dataset;         /* "FORMAT:PATH[,PATH...]" below the workers' --data-root */
    int64_t rank;                /* -1: from RANK or SLURM_PROCID */
    int64_t world_size;          /* -1: from WORLD_SIZE or SLURM_NTASKS */

    /* the sampler (docs/semantics.md); must match the job's if it exists */
    const char *mode; /* "torch" (default), "accelerate" or "iterable" */
    uint64_t batch_size;
    int shuffle;
    int64_t seed;
    const char *shuffle_algo; /* "torch" (default) or "feistel" */
    int drop_last;
    int sampler_drop_last;
    int split_batches;
    int even_batches; /* default 1 */

    /* the fast path */
    /* batches fetched ahead; 0 (the default): auto -- for batches of fixed-size samples up to
     * 1 MiB enough to keep about 8 MiB in flight, read in groups (128 batches of 64 KiB in groups
     * of 32; 8 of 1 MiB in pairs), for larger ones as many as hold 8 MiB, from 2 to 4 (4 of
     * 2 MiB, 2 of 4 MiB and more), else 4; docs/client.md, "Fetches ahead" */
    unsigned prefetch_batches;
    size_t max_buffer_bytes; /* cap on memory held by prefetched batches (default 1 GiB) */
    int timeout_ms;          /* deadline of each call (default 10000) */

    /* GPU: -1 (default) keeps batches in host memory; N asks for batches on cuda:N */
    int device;

    /* How sample bytes travel: "auto" (default; the BATCHWIRE_TRANSPORT environment variable
     * when NULL) uses a worker's data channel when it offers one (TLS with the loader's TLS
     * settings when they are given), else gRPC; "grpc" always uses gRPC
     * (docs/data-channel.md). */
    const char *transport;

    /* How long a call to the coordinator (joining, committing a cursor) is retried, with
     * jittered backoff, while the coordinator is unreachable or restarting (default 60000;
     * 0: no retry). Heartbeats and placement refreshes retry for as long as the loader
     * runs. */
    int retry_ms;

    /* A file whose first line is the bearer token to present to the coordinator when it
     * requires one (--auth-tokens; docs/security.md). Never sent to a worker: reads carry the
     * lease's read grant instead ("Read grants"). NULL: the BATCHWIRE_TOKEN_FILE environment
     * variable, else no token. */
    const char *token_file;

    /* The number of epochs this rank will run, when known (0: unknown). Once the last one has
     * been delivered to its end, closing the loader tells the coordinator that this rank is
     * finished; when every rank is, the coordinator removes the job (its cursors stay valid
     * for a job created again with the same configuration). */
    uint64_t epochs;

    /* More of the sampler (docs/semantics.md); like the settings above, every rank of a job
     * must agree. allow_uneven: with even_batches off and drop_last off, ranks may get
     * different numbers of batches; the job is refused unless this is set, since unequal
     * counts hang a DDP job (each rank learns its own count: bw_loader_epoch_steps).
     * dispatch_batches: accelerate, Accelerate's DataLoaderDispatcher. pad_single_process:
     * accelerate with one process, BatchSamplerShard's padding instead of the plain
     * BatchSampler's short last batch that prepare_data_loader yields. All default 0. */
    int allow_uneven;
    int dispatch_batches;
    int pad_single_process;

    /* Where bw_loader_open starts: start_epoch >= 0 starts at (start_epoch, start_step)
     * instead of where the coordinator says this rank resumes. Default -1. */
    int64_t start_epoch;
    uint64_t start_step;

    /* One rank read by several processes (DataLoader workers, python/README.md): this loader
     * hands out only the steps first + share_index + k * share_count (k = 0, 1, ...), where
     * `first` is the step it starts at (open, bw_loader_seek, the next epoch); the cursor
     * after step s is still the rank's (s + 1). Share 0 claims the rank as usual; the others
     * read without claiming it and cannot commit. Default: share 0 of 1 (every step). */
    uint32_t share_index;
    uint32_t share_count;

    /* Samples as named fields (bw_batch_fields): tar (WebDataset) samples' members, JSON
     * Lines samples' top-level keys. Refused for other formats. Default 0. */
    int fields;

    /* 0 (default): getpid(). The trainer process this rank's claim belongs to: reported as the
     * lease holder and checked for exit when a restarted trainer on the same host reclaims the
     * rank (a DataLoader worker passes its trainer's pid). */
    uint32_t holder_pid;

    /* share_index > 0: the rank's lease as bw_loader_lease wrote it in share 0's process; the
     * share then confirms the lease exactly like share 0 (it hands out nothing once the lease
     * may have lapsed until the coordinator confirms it, and stops for good on BW_LEASE_LOST;
     * docs/client.md, "Fencing"), without joining, committing, leaving or reporting live
     * counters. Refused (BW_INVALID_ARGUMENT) for share 0 and for text that is not exactly a
     * lease; BW_LEASE_LOST from bw_loader_open when the lease is no longer the rank's. NULL
     * (default): the share reads without confirming anything. */
    const char *lease;

    /* A dataset of named arrays indexed together, like torch's TensorDataset(x, y)
     * (docs/formats.md, "Named arrays"), instead of `dataset`: n_dataset_fields entries
     * "NAME=npy:PATH[,PATH...]", one per array, every array of the same length and split over
     * its files the same way. (An uncompressed .npz archive is such a dataset by itself:
     * dataset = "npz:PATH[,PATH...]".) Batches then carry every array: bw_batch_array. */
    const char *const *dataset_fields;
    size_t n_dataset_fields;

    /* A transform the workers run on every sample before sending it (docs/transforms.md):
     * a pipeline such as "decode|random_resized_crop(224)|flip|normalize(0.485,0.456,0.406;
     * 0.229,0.224,0.225)|chw" (files, tar or jsonl datasets), or "truncate(L)|pad(L,VALUE)" on
     * the 1-D rows of an npy dataset or a jsonl key's arrays (token arrays). Each batch is then one
     * tensor [B, ...] of the spec's output shape and dtype (bw_batch_dtype, bw_batch_shape); a
     * sample the transform fails on fails the batch with an error naming its source and index. Part
     * of the job's configuration (every rank must give the same; its canonical text is what is
     * compared). Map-style jobs only (torch, accelerate). NULL or "" (default): none. */
    const char *transform;
    /* tar (WebDataset) datasets: the member the transform runs on ("jpg"); jsonl datasets:
     * the top-level key whose value it runs on -- a base64 string of a JPEG or PNG for an image
     * pipeline, an array of integers (int64, "<i8") for token ops, which must then end with
     * pad(L,VALUE) (docs/transforms.md, "JSON Lines fields"). Without `fields` each sample is
     * that member's or key's result (the batch one tensor, as above); with `fields` the other
     * members or keys pass through unchanged (a "cls" or "label" stays the label; a jsonl key
     * as its JSON text) and that one's bytes are its result. Required for tar and jsonl,
     * refused for other formats. NULL (default): none. */
    const char *transform_field;
    /* A weighted mixture of datasets (docs/semantics.md, "Mixtures"; docs/client.md), instead
     * of `dataset`: n_mixture entries "[stream:]FORMAT:PATH[,PATH...]=WEIGHT", source j being
     * entry j, WEIGHT a positive decimal number ("0.7", "70"; at most 9 digits after the point;
     * the weights are normalised by their sum); the "stream:" prefix makes the source a stream
     * (tfrecord, jsonl, text, tar), read in its own order under mix_policy. mix_samples: the
     * epoch's size E (0, the default: the sum of the sources' sizes). Any mode, shuffle off (a
     * mixture orders itself from the seed); batches then say each sample's source
     * (bw_batch_sources) and its index within that source (bw_batch_indices; a stream
     * source's: the record number). */
    const char *const *mixture;
    size_t n_mixture;
    uint64_t mix_samples;
    /* Compression of sample bytes on the workers' data channel (docs/data-channel.md,
     * "Compression"): "none" (default; the BATCHWIRE_COMPRESS environment variable when NULL)
     * sends them as they are; "zstd" or "zstd:LEVEL" (1 to 19; default 1) asks each worker to
     * compress them with zstd; "auto" (zstd level 1) asks it to compress a request only when a
     * probe of its first samples shrinks by a tenth or more (token arrays yes, JPEGs no).
     * Asked per connection: a worker without it sends them raw. The delivered bytes are the
     * same, so it is not part of the job's configuration. gRPC ignores it. */
    const char *compress;
    /* A mixture's policy for a stream source that runs dry (docs/semantics.md, "Streams in a
     * mixture"): "cycle" (NULL, the default: start it again from its first record) or "stop"
     * (end the epoch there). Given, it needs a "stream:" source. Part of the job's
     * configuration. */
    const char *mix_policy;
} bw_loader_options;

/*
 * Fills `o` with the defaults above and sets o->size. Call it through the macro, which passes
 * the size of the struct this program was compiled with: the library writes only that many
 * bytes (zeroing what it does not know of a larger struct). Bindings that allocate the
 * struct themselves call bw_loader_options_init_sized with their allocation's size.
 */
BW_EXTERN void bw_loader_options_init_sized(bw_loader_options *o, size_t size);
#define bw_loader_options_init(o) bw_loader_options_init_sized((o), sizeof(*(o)))

/*
 * Joins the job as one rank (creating the job if it does not exist) and starts fetching at
 * this rank's committed cursor (epoch 0, step 0 for a new job). On success *out is the
 * loader; free with bw_loader_close. On failure returns a code with a sentence in err, and
 * *out is NULL. Errors include BW_ALREADY_EXISTS (another live process holds this rank; the
 * message names it) and BW_MISMATCH (the job exists with another configuration; the message
 * lists the differing fields).
 */
BW_EXTERN int bw_loader_open(const bw_loader_options *o, bw_loader **out, char *err, size_t errlen);

/*
 * As bw_loader_open, but resumes at `cursor` (bytes from bw_loader_cursor, or the base64
 * text from bw_loader_cursor_text with len 0 meaning NUL-terminated text). The next batch is
 * the one after the batch the cursor describes; nothing before it is read. A cursor of
 * another job, rank or configuration is refused with BW_MISMATCH; a corrupt one with
 * BW_CORRUPT.
 */
BW_EXTERN int bw_loader_open_at(const bw_loader_options *o, const void *cursor, size_t len,
                                bw_loader **out, char *err, size_t errlen);

/*
 * The next batch of this rank, in plan order. *out, the batch, stays valid until the next
 * call to bw_loader_next, bw_loader_next_epoch, bw_loader_set_epoch, bw_loader_seek (also one
 * that fails) or bw_loader_close; bw_loader_hold keeps its bytes longer. Returns BW_OK,
 * BW_END_OF_EPOCH when the epoch is over (call bw_loader_next_epoch), or an error (e.g.
 * BW_UNAVAILABLE when no worker can serve a sample and retries are exhausted); after an error the
 * loader can be closed or the call repeated.
 */
BW_EXTERN int bw_loader_next(bw_loader *l, const bw_batch **out);

/*
 * Gives back the batch bw_loader_next returned last, as if it had not been handed out: the
 * cursor (bw_loader_cursor) returns to before it, and the next bw_loader_next hands the same
 * batch out again. For a binding whose caller was interrupted between the library's hand-out
 * and its own (Python's KeyboardInterrupt raised as bw_loader_next returns), so that a
 * checkpoint taken then does not skip a batch the trainer never saw. BW_OK, or
 * BW_FAILED_PRECONDITION when another call (next, a move, close) came in between.
 */
BW_EXTERN int bw_loader_unnext(bw_loader *l);

/* Starts the next epoch (at its step 0), discarding batches prefetched for the old position;
 * the batch handed out last becomes invalid. What the Python Loader does when it is iterated
 * again (a DataLoader over a DistributedSampler whose set_epoch is called each time). On error
 * (BW_MISMATCH: the next epoch runs at a world this rank is not part of) the loader stays
 * where it was. */
BW_EXTERN int bw_loader_next_epoch(bw_loader *l);

/*
 * DistributedSampler.set_epoch: positions the loader at the start of `epoch` (step 0, or the
 * first step of this world when the epoch was resized), discarding batches prefetched for the
 * old position. A no-op when `epoch` is the current epoch and no batch has been handed out
 * since the loader was opened or positioned (open, open_at, seek, next_epoch, set_epoch): a
 * loader resumed from a cursor in the middle of epoch e continues there after
 * bw_loader_set_epoch(l, e). Any other call starts the epoch over -- also the current one
 * after some of its batches were handed out. Earlier epochs may be read again. On error the
 * loader stays where it was.
 */
BW_EXTERN int bw_loader_set_epoch(bw_loader *l, uint64_t epoch);

/* The epoch the next batch belongs to (the cursor's epoch). */
BW_EXTERN uint64_t bw_loader_epoch(bw_loader *l);

/*
 * Moves the loader to `cursor` (bytes from bw_loader_cursor, or its text with len 0): the
 * next batch is the one after the batch the cursor describes, as with bw_loader_open_at;
 * batches prefetched for the old position are discarded, and the batch bw_loader_next
 * returned last becomes invalid (its pointer must not be used again; a hold keeps its bytes),
 * also when the seek fails. Local: nothing is sent (loader.h, "Network"). The same checks
 * (BW_MISMATCH for a cursor of another job or rank, BW_CORRUPT); on error the loader's
 * position stays where it was.
 */
BW_EXTERN int bw_loader_seek(bw_loader *l, const void *cursor, size_t len);

/* One past the last step of this rank in the current epoch: its batches this epoch are
 * steps [first, end), first being 0 unless the epoch was resized. With allow_uneven, ranks
 * may differ by one; every rank learns its own count here before its first batch. */
BW_EXTERN uint64_t bw_loader_epoch_steps(bw_loader *l);

/*
 * This rank's number of steps in `epoch` without opening a loader: what bw_loader_epoch_steps
 * returns there (one past the last step; the steps are [first, end), first 0 unless the epoch
 * was resized -- then the rank's world of o->world_size runs from the resize on), computed
 * from the job the coordinator has for o->job. The job is created as bw_loader_open would
 * create it when it does not exist; BW_MISMATCH (naming the differing fields) when it exists
 * with another configuration, or when o->world_size is not the job's world size in that epoch
 * (after an elastic resize, epochs before it ran at the old size). Nothing is claimed, joined
 * or read: a DataLoader's __len__ may call it from any process. Only the settings that
 * bw_loader_open sends to the coordinator are used (the coordinator, TLS and token, the job,
 * the dataset and the sampler, rank and world size). Retries like bw_loader_open while the
 * coordinator is unreachable; interruptible (bw_interrupt).
 */
BW_EXTERN int bw_loader_rank_steps(const bw_loader_options *o, uint64_t epoch, uint64_t *steps,
                                   char *err, size_t errlen);

/*
 * Elastic resume (docs/semantics.md, "Elastic resume"): joins as rank o->rank of a world of
 * o->world_size ranks, continuing the job from a checkpoint taken at another world size.
 * cursors[0..n) are the cursors of every rank of the old world, taken after the same step
 * (bytes, or text where lens[i] is 0); n == 0 takes every rank's committed cursor from the
 * coordinator (bw_job_checkpoint's). The rest of the epoch is re-sharded over the new world:
 * every sample is delivered exactly once (plus declared padding). Every rank of the new world
 * calls it with the same cursors; the resize is recorded once. Cursors of the job's current
 * world size resize nothing: this rank starts at its own cursor. Errors as bw_loader_open,
 * and BW_FAILED_PRECONDITION for cursors that disagree (ranks stopped at different steps), a
 * rank without a committed cursor, or cursors of a world size the job no longer runs at.
 */
BW_EXTERN int bw_loader_open_elastic(const bw_loader_options *o, const void *const *cursors,
                                     const size_t *lens, size_t n, bw_loader **out, char *err,
                                     size_t errlen);

/*
 * The job-level checkpoint, for launchers: every rank's committed cursor (bw_loader_commit)
 * as text, one "bwc1:..." line per rank in rank order, written NUL-terminated into buf. Only
 * o->coordinator, the TLS and token settings and o->job are used; nothing is joined. Resume
 * from it at any world size with bw_loader_open_elastic (or `batchwire fetch
 * --resume-elastic FILE`). BW_NOT_FOUND for an unknown job, BW_FAILED_PRECONDITION naming a
 * rank that has committed nothing, BW_TOO_BIG when buflen is too small.
 */
BW_EXTERN int bw_job_checkpoint(const bw_loader_options *o, char *buf, size_t buflen, char *err,
                                size_t errlen);

/*
 * The cursor after the last batch handed out by bw_loader_next (not the last one
 * prefetched): store it in the checkpoint. Writes up to *len bytes into buf and sets *len to
 * the cursor's size; BW_TOO_BIG if buf is too small (then *len is the size needed).
 */
BW_EXTERN int bw_loader_cursor(bw_loader *l, void *buf, size_t *len);

/* The same cursor as base64 text ("bwc1:..."), NUL-terminated; BW_TOO_BIG if it does not fit. */
BW_EXTERN int bw_loader_cursor_text(bw_loader *l, char *buf, size_t buflen);

/* What a cursor says (bw_cursor_describe). Caller-allocated: its size travels as
 * bw_cursor_describe's `size`; fields are only ever added at the end. */
typedef struct bw_cursor_info {
    char job[256];        /* the job's name, NUL-terminated (at most 255 bytes) */
    uint64_t fingerprint; /* the job configuration's fingerprint */
    uint32_t rank;        /* the rank it was taken from, of a world of world_size */
    uint32_t world_size;
    uint64_t epoch; /* where the next batch is: step `step` of epoch `epoch` */
    uint64_t step;
    uint64_t stream_position; /* streams: position in the epoch's global stream order, else 0 */
    size_t nsources;          /* streams: sources whose resume offsets it carries, else 0 */
} bw_cursor_info;

/*
 * Decodes and checks a cursor (bytes from bw_loader_cursor, or its text with len 0) without
 * a loader or a network call, for messages, checkpoints and bindings: *out receives its
 * fields. `size` is sizeof(bw_cursor_info) as the caller was built with (a shorter struct gets
 * the fields it has; a longer one reads 0 past this library's). BW_OK, BW_CORRUPT with the
 * reason in err for anything that is not an intact cursor (the same check as
 * bw_loader_open_at's), BW_INVALID_ARGUMENT for a NULL cursor or out. Any thread.
 */
BW_EXTERN int bw_cursor_describe(const void *cursor, size_t len, bw_cursor_info *out, size_t size,
                                 char *err, size_t errlen);

/* Records the current cursor with the coordinator (durably) for this rank: a call to the
 * coordinator, retried for retry_ms while it is unreachable. BW_FAILED_PRECONDITION for a
 * share (share_index > 0), which does not hold the rank. */
BW_EXTERN int bw_loader_commit(bw_loader *l);

/*
 * The rank's lease, for the loader that holds it (the one that claimed the rank: share 0), as
 * NUL-terminated text ("bwl1:" and 32 hex digits; 38 bytes with the NUL, 64 leave room for a
 * later version): what the trainer's other processes reading shares of the rank pass as
 * bw_loader_options.lease, so that they are fenced with it. The lease is a secret -- whoever
 * has it can keep the rank claimed, commit its cursor or release it (docs/security.md,
 * "Leases"): pass it only to the trainer's own processes (not on a command line, not in a
 * log). Returns BW_OK, BW_FAILED_PRECONDITION for a loader that holds no lease (a share),
 * BW_LEASE_LOST once the lease was taken over, BW_TOO_BIG when buflen is too small.
 */
BW_EXTERN int bw_loader_lease(bw_loader *l, char *buf, size_t buflen);

/*
 * Where the lease stands, for a loader that holds it (share 0) or confirms it (a share given
 * bw_loader_options.lease): *proven_until_ms is the CLOCK_MONOTONIC time in milliseconds (what
 * Python's time.monotonic() reads on Linux) until which the coordinator has vouched for the
 * lease, less the margin the loader's own hand-out check keeps -- the loader hands out nothing
 * from that moment until the coordinator confirms the lease again (docs/client.md, "Fencing");
 * UINT64_MAX when the coordinator states no lease length, 0 once the lease is lost. *lost is 1
 * once the coordinator refused the lease (for good), else 0. For a process that hands out
 * what another process's loader read (batchwire.torch.DataLoader's main process checks worker
 * 0's). Reads atomics only: cheap, any thread, while the loader is open. BW_OK, or
 * BW_FAILED_PRECONDITION (bw_loader_errmsg unchanged) for a loader with no lease to confirm.
 */
BW_EXTERN int bw_loader_lease_state(bw_loader *l, uint64_t *proven_until_ms, int *lost);

/* The sentence describing the loader's last failure ("" if none). Borrowed. */
BW_EXTERN const char *bw_loader_errmsg(const bw_loader *l);

/* This loader's rank and world size, and the dataset's length (0 for streams). */
BW_EXTERN int64_t bw_loader_rank(const bw_loader *l);
BW_EXTERN int64_t bw_loader_world_size(const bw_loader *l);
BW_EXTERN uint64_t bw_loader_num_samples(const bw_loader *l);

/* A job with a transform: the dtype text ("<f4", "|u1", "<f2", "bfloat16", "<i8"...) and the
 * shape of one sample's result, as bw_batch_dtype / bw_batch_shape give them for a batch without
 * fields -- also with transform_field and `fields`, where each sample's transformed member or
 * key holds one such result (docs/transforms.md, "What a batch is"). *dtype is borrowed (the
 * loader's); up to `cap` dimensions go to shape, their number to *ndim. BW_OK, or
 * BW_FAILED_PRECONDITION (bw_loader_errmsg unchanged) for a job without a transform. */
BW_EXTERN int bw_loader_transform_layout(const bw_loader *l, const char **dtype, uint64_t *shape,
                                         size_t cap, size_t *ndim);

/* Leaves the job (the rank's lease is released) and frees everything. NULL is a no-op. */
BW_EXTERN void bw_loader_close(bw_loader *l);

/* ---- statistics ---- */

/* What a loader has done since it was opened (docs/client.md, "Statistics"). Fields are only
 * ever added at the end. */
typedef struct bw_loader_stats {
    uint64_t batches; /* batches handed out by bw_loader_next */
    uint64_t samples; /* samples in them, padding included */
    uint64_t bytes;   /* their bytes: bw_batch_nbytes summed */
    uint64_t wait_ns; /* time spent inside bw_loader_next: the trainer waiting for data */
    /* Samples and sample bytes that arrived from workers: each sample of a batch once
     * (padding repeats none), plus what arrived again after a retry. */
    uint64_t samples_received;
    uint64_t bytes_received;
    uint64_t requests;  /* read requests sent to workers */
    uint64_t retries;   /* requests that ended before all their samples came, asked again */
    uint64_t failovers; /* workers found failed during a fetch, their samples read elsewhere */
    uint64_t busy; /* answers from a worker over its in-flight budget (a retry after a pause) */
} bw_loader_stats;

/*
 * Copies the loader's counters into *out. `size` is sizeof(bw_loader_stats) as the caller
 * was built with (the struct carries no size of its own: this argument is its size field): an
 * older, shorter struct gets the fields it has; a newer, longer one gets 0 in the fields this
 * library does not know. Safe from any thread while
 * the loader runs (each counter is read atomically; together they are not one snapshot).
 * BW_OK, or BW_INVALID_ARGUMENT for a NULL loader or out.
 */
BW_EXTERN int bw_loader_get_stats(const bw_loader *l, bw_loader_stats *out, size_t size);

/* ---- a batch (borrowed from the loader) ---- */

BW_EXTERN uint64_t bw_batch_epoch(const bw_batch *b);
BW_EXTERN uint64_t bw_batch_step(const bw_batch *b);
/* Samples in the batch (real + padding) and how many are real. */
BW_EXTERN size_t bw_batch_count(const bw_batch *b);
BW_EXTERN size_t bw_batch_real(const bw_batch *b);
/* count sample indices; for streams, positions in the epoch's global stream order. */
BW_EXTERN const uint64_t *bw_batch_indices(const bw_batch *b);
/* count flags: 1 where the sample is a padding duplicate. */
BW_EXTERN const uint8_t *bw_batch_padding(const bw_batch *b);
/* A mixture job's batch (bw_loader_options.mixture): each sample's source, the number of its
 * mixture entry (bw_batch_indices then holds its index within that source); count entries.
 * NULL for other jobs. Valid until the next bw_loader_next. */
BW_EXTERN const uint32_t *bw_batch_sources(const bw_batch *b);
/* A mixture job with stream sources (docs/semantics.md, "Streams in a mixture"): each
 * sample's pass over its source's stream of samples (batchwire plan's "passes"); count
 * entries. NULL for other jobs. Valid until the next bw_loader_next. */
BW_EXTERN const uint64_t *bw_batch_passes(const bw_batch *b);

/* The batch's bytes: for .npy datasets one contiguous [count, ...] tensor; otherwise the
 * samples' bytes concatenated in batch order (see bw_batch_sample). In host memory, or on the
 * device when the loader was opened with device >= 0. */
BW_EXTERN const void *bw_batch_data(const bw_batch *b);
BW_EXTERN size_t bw_batch_nbytes(const bw_batch *b);

/* .npy datasets (one array): the numpy dtype ("<f4") and the tensor's shape ([count, ...]);
 * ndim 0 for other formats. shape points at ndim values. */
BW_EXTERN const char *bw_batch_dtype(const bw_batch *b);
BW_EXTERN size_t bw_batch_ndim(const bw_batch *b);
BW_EXTERN const uint64_t *bw_batch_shape(const bw_batch *b);

/* The batch's bytes in host memory, also when it was delivered to a GPU. */
BW_EXTERN const void *bw_batch_host_data(const bw_batch *b);

/* The CUDA device bw_batch_data points into, or -1 for host memory. */
BW_EXTERN int bw_batch_device(const bw_batch *b);

/*
 * Copies a host batch to `dst`, device memory of `cap` bytes on cuda:`device`, with
 * cudaMemcpyAsync on the loader's own stream, and waits for the copy. BW_NO_DEVICE (with the
 * reason in bw_loader_errmsg) when CUDA or the device is unavailable; BW_TOO_BIG when cap is
 * smaller than bw_batch_nbytes. For overlapped copies open the loader with device >= 0:
 * then every prefetched batch is copied on its slot's stream while others are received.
 */
BW_EXTERN int bw_loader_to_device(bw_loader *l, const bw_batch *b, int device, void *dst,
                                  size_t cap);

/* Sample i's bytes (host memory) and size. BW_FAILED_PRECONDITION for a batch of named
 * arrays (bw_batch_array), whose samples are rows of several tensors. */
BW_EXTERN int bw_batch_sample(const bw_batch *b, size_t i, const void **data, size_t *size);

/* A named part of a sample (bw_batch_fields). Filled by the library, never allocated by the
 * caller (bw_batch_fields hands out pointers into the batch), so it needs no size field: a
 * later version may add fields at its end. */
typedef struct bw_field {
    const char *name; /* NUL-terminated; tar: the member's extension ("jpg", "seg.png");
                       * JSON Lines: the key as written between its quotes (escapes kept) */
    size_t offset;    /* from the start of the sample's bytes (bw_batch_sample) */
    size_t size;      /* tar: the member's bytes; JSON Lines: the value's JSON text */
} bw_field;

/*
 * Sample i's fields, for a loader opened with `fields`: *fields points at *n of them, in the
 * order of the archive or the line (borrowed from the batch: valid as bw_batch_sample's bytes).
 * The sample's bytes are the fields' bytes (tar: concatenated; JSON Lines: the line itself).
 * BW_FAILED_PRECONDITION without `fields`, BW_OUT_OF_RANGE for i.
 */
BW_EXTERN int bw_batch_fields(const bw_batch *b, size_t i, const bw_field **fields, size_t *n);

/* One named array of a batch (datasets of named arrays: bw_loader_options.dataset_fields, or
 * an .npz archive): a contiguous C-order tensor of shape [count, ...], in the order of the
 * dataset's samples (row i of every array is sample i of the batch, padding included). The
 * caller allocates it and bw_batch_array fills it: it is frozen as it is (a later version
 * that needs more adds a new function rather than a field). */
typedef struct bw_array {
    const char *name;      /* the field's name ("x"); an .npz: the member without ".npy" */
    const char *dtype;     /* the numpy dtype ("<f4", "<i8") */
    size_t ndim;           /* dims, the batch's count first */
    const uint64_t *shape; /* ndim values */
    size_t offset;         /* where it starts in bw_batch_data (and bw_batch_host_data) */
    size_t nbytes;
} bw_array;

/*
 * Datasets of named arrays: the number of arrays of every batch (0 for other datasets), and
 * array k of batch b into *out (borrowed: valid as the batch's bytes). The batch's bytes are
 * the arrays one after the other, in field order; bw_batch_dtype, bw_batch_shape and
 * bw_batch_sample do not apply to such a batch (ndim 0; BW_FAILED_PRECONDITION).
 * bw_batch_array returns BW_OUT_OF_RANGE for k >= bw_batch_narrays.
 */
BW_EXTERN size_t bw_batch_narrays(const bw_batch *b);
BW_EXTERN int bw_batch_array(const bw_batch *b, size_t k, bw_array *out);

/* ---- keeping a batch's bytes past the next batch ---- */

typedef struct bw_hold bw_hold;

/*
 * Keeps the host bytes of `b`, the batch bw_loader_next returned last, valid and unchanged
 * until bw_hold_release -- also after the loader has moved on, and after bw_loader_close.
 * Nothing is copied: when the loader reuses the batch's slot while a hold on it is live, the
 * slot continues with another buffer. Holding the same batch again returns the same hold with
 * one more reference. Returns BW_OK, BW_FAILED_PRECONDITION when b is not the current batch
 * (the loader moved on), or BW_NOMEM. Same thread rules as bw_loader_next.
 */
BW_EXTERN int bw_loader_hold(bw_loader *l, const bw_batch *b, bw_hold **out);

/* The held bytes (host memory, bw_batch_host_data's at the time of the hold) and their size. */
BW_EXTERN const void *bw_hold_data(const bw_hold *h);
BW_EXTERN size_t bw_hold_nbytes(const bw_hold *h);

/* Drops one reference; the bytes are given back when the last one goes. Any thread, also
 * after bw_loader_close. NULL is a no-op. */
BW_EXTERN void bw_hold_release(bw_hold *h);

#ifdef __cplusplus
}
#endif
#endif
