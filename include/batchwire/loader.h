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
 *     int rc;
 *     while ((rc = bw_loader_next(l, &b)) == BW_OK) {
 *         train_step(bw_batch_data(b), bw_batch_real(b));
 *     }
 *     if (rc == BW_END_OF_EPOCH) bw_loader_next_epoch(l);
 *     bw_loader_close(l);
 *
 * Threads: one loader is used by one thread at a time (it runs its own fetch threads inside).
 * Different loaders are independent. Errors: every function returns BW_OK or a negative code
 * from batchwire.h; bw_loader_errmsg() gives the sentence for the last failure. The library
 * never prints or exits (see bw_set_log_callback).
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
 * strings are borrowed for the duration of bw_loader_open only. */
typedef struct bw_loader_options {
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
    unsigned prefetch_batches; /* batches fetched ahead (default 4) */
    size_t max_buffer_bytes;   /* cap on memory held by prefetched batches (default 1 GiB) */
    int timeout_ms;            /* deadline of each call (default 10000) */

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
} bw_loader_options;

/* Fills `o` with the defaults above. */
BW_EXTERN void bw_loader_options_init(bw_loader_options *o);

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
 * The next batch of this rank, in plan order. *out stays valid until the next call to
 * bw_loader_next, bw_loader_next_epoch or bw_loader_close. Returns BW_OK, BW_END_OF_EPOCH when
 * the epoch is over (call bw_loader_next_epoch), or an error (e.g. BW_UNAVAILABLE when no
 * worker can serve a sample and retries are exhausted); after an error the loader can be
 * closed or the call repeated.
 */
BW_EXTERN int bw_loader_next(bw_loader *l, const bw_batch **out);

/* Starts the next epoch (at step 0). */
BW_EXTERN int bw_loader_next_epoch(bw_loader *l);

/*
 * The cursor after the last batch handed out by bw_loader_next (not the last one
 * prefetched): store it in the checkpoint. Writes up to *len bytes into buf and sets *len to
 * the cursor's size; BW_TOO_BIG if buf is too small (then *len is the size needed).
 */
BW_EXTERN int bw_loader_cursor(bw_loader *l, void *buf, size_t *len);

/* The same cursor as base64 text ("bwc1:..."), NUL-terminated; BW_TOO_BIG if it does not fit. */
BW_EXTERN int bw_loader_cursor_text(bw_loader *l, char *buf, size_t buflen);

/* Records the current cursor with the coordinator (durably) for this rank. */
BW_EXTERN int bw_loader_commit(bw_loader *l);

/* The sentence describing the loader's last failure ("" if none). Borrowed. */
BW_EXTERN const char *bw_loader_errmsg(const bw_loader *l);

/* This loader's rank and world size, and the dataset's length (0 for streams). */
BW_EXTERN int64_t bw_loader_rank(const bw_loader *l);
BW_EXTERN int64_t bw_loader_world_size(const bw_loader *l);
BW_EXTERN uint64_t bw_loader_num_samples(const bw_loader *l);

/* Leaves the job (the rank's lease is released) and frees everything. NULL is a no-op. */
BW_EXTERN void bw_loader_close(bw_loader *l);

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

/* The batch's bytes: for .npy datasets one contiguous [count, ...] tensor; otherwise the
 * samples' bytes concatenated in batch order (see bw_batch_sample). In host memory, or on the
 * device when the loader was opened with device >= 0. */
BW_EXTERN const void *bw_batch_data(const bw_batch *b);
BW_EXTERN size_t bw_batch_nbytes(const bw_batch *b);

/* .npy datasets: the numpy dtype ("<f4") and the tensor's shape ([count, ...]); ndim 0 for
 * other formats. shape points at ndim values. */
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

/* Sample i's bytes (host memory) and size. */
BW_EXTERN int bw_batch_sample(const bw_batch *b, size_t i, const void **data, size_t *size);

#ifdef __cplusplus
}
#endif
#endif
