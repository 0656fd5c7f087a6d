/*
 * The smallest complete C trainer loop over libbatchwire, using only the installed public
 * headers (include/batchwire/) and the shared library. The build compiles it with
 * -Wall -Wextra -Werror -pedantic against nothing else, and
 * tests/integration/test_c_example.py runs it against a real coordinator and worker.
 *
 *     minimal COORDINATOR JOB DATASET [EPOCHS]
 *     minimal 10.0.0.5:7700 run1 npy:train/part-00000.npy 2
 *
 * Rank and world size come from RANK and WORLD_SIZE (torchrun) or SLURM_PROCID and
 * SLURM_NTASKS (srun). It reads EPOCHS epochs (default 1), prints one line per epoch, commits
 * the cursor, and prints what the cursor says (bw_cursor_describe) and the loader's counters.
 * A restart before the last epoch's end resumes after the committed cursor; once every rank
 * has delivered its last epoch the coordinator removes the job (o.epochs), and a later run of
 * the same job starts it anew, with the same batches and cursors.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <batchwire/loader.h>

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s COORDINATOR JOB DATASET [EPOCHS]\n", argv[0]);
        return 2;
    }
    uint64_t epochs = argc == 5 ? strtoull(argv[4], NULL, 10) : 1;

    bw_loader_options o;
    bw_loader_options_init(&o); /* the defaults, and o.size for this header's struct */
    o.coordinator = argv[1];
    o.job = argv[2];
    o.dataset = argv[3];
    o.batch_size = 16;
    o.shuffle = 1;
    o.seed = 7;
    o.epochs = epochs;

    char err[512];
    bw_loader *l;
    int rc = bw_loader_open(&o, &l, err, sizeof(err));
    if (rc != BW_OK) {
        fprintf(stderr, "open: %s: %s\n", bw_err_name(rc), err);
        return 1;
    }
    printf("rank %" PRId64 " of %" PRId64 ", %" PRIu64 " samples, %" PRIu64 " steps per epoch\n",
           bw_loader_rank(l), bw_loader_world_size(l), bw_loader_num_samples(l),
           bw_loader_epoch_steps(l));

    /* As PyTorch's `for epoch in range(start, N): sampler.set_epoch(epoch); for b in loader:`;
     * a resumed loader continues in the middle of its epoch. */
    for (uint64_t e = bw_loader_epoch(l); e < epochs && rc == BW_OK; e++) {
        if ((rc = bw_loader_set_epoch(l, e)) != BW_OK)
            break;
        const bw_batch *b;
        uint64_t batches = 0, real = 0, bytes = 0;
        while ((rc = bw_loader_next(l, &b)) == BW_OK) {
            batches++;
            real += bw_batch_real(b);
            bytes += bw_batch_nbytes(b);
        }
        if (rc == BW_END_OF_EPOCH)
            rc = BW_OK;
        printf("epoch %" PRIu64 ": %" PRIu64 " batches, %" PRIu64 " samples, %" PRIu64 " bytes\n",
               e, batches, real, bytes);
    }
    if (rc == BW_OK)
        rc = bw_loader_commit(l); /* a call to the coordinator (loader.h, "Network") */
    if (rc != BW_OK) {
        fprintf(stderr, "%s: %s\n", bw_err_name(rc), bw_loader_errmsg(l));
        bw_loader_close(l);
        return 1;
    }

    char cursor[4096];
    bw_cursor_info info;
    if ((rc = bw_loader_cursor_text(l, cursor, sizeof(cursor))) != BW_OK ||
        (rc = bw_cursor_describe(cursor, 0, &info, sizeof(info), err, sizeof(err))) != BW_OK) {
        fprintf(stderr, "cursor: %s\n", bw_err_name(rc));
        bw_loader_close(l);
        return 1;
    }
    printf("cursor %s: job %s rank %" PRIu32 "/%" PRIu32 " epoch %" PRIu64 " step %" PRIu64 "\n",
           cursor, info.job, info.rank, info.world_size, info.epoch, info.step);

    bw_loader_stats st;
    if (bw_loader_get_stats(l, &st, sizeof(st)) == BW_OK)
        printf("stats: %" PRIu64 " batches, %" PRIu64 " requests, %" PRIu64 " retries\n",
               st.batches, st.requests, st.retries);
    bw_loader_close(l);
    return 0;
}
