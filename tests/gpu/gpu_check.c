/* On a machine with a GPU: checks that batches delivered to cuda:N hold exactly the host
 * batch's bytes, and measures host-to-device bandwidth of the loader's copy path against a
 * plain cudaMemcpy of the same bytes, in the same run.
 *   gpu_check COORDINATOR JOB DATASET DEVICE BATCH_SIZE */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "batchwire/loader.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: gpu_check COORDINATOR JOB DATASET DEVICE BATCH_SIZE\n");
        return 2;
    }
    int device = (int)strtol(argv[4], NULL, 10);
    bw_loader_options o;
    bw_loader_options_init(&o);
    o.coordinator = argv[1];
    o.job = argv[2];
    o.dataset = argv[3];
    o.rank = 0;
    o.world_size = 1;
    o.batch_size = strtoull(argv[5], NULL, 10);
    o.device = device;
    char err[1024];
    bw_loader *l;
    int rc = bw_loader_open(&o, &l, err, sizeof(err));
    if (rc != BW_OK) {
        fprintf(stderr, "open: %s: %s\n", bw_err_name(rc), err);
        return 1;
    }
    size_t batches = 0, bytes = 0, bad = 0, cap = 0;
    unsigned char *back = NULL;
    void *dev = NULL, *pinned = NULL;
    double loader_s = 0, plain_s = 0;
    const bw_batch *b;
    double t0 = now();
    while ((rc = bw_loader_next(l, &b)) == BW_OK) {
        size_t n = bw_batch_nbytes(b);
        if (bw_batch_device(b) != device) {
            fprintf(stderr, "batch %zu is not on cuda:%d\n", batches, device);
            return 1;
        }
        if (n > cap) {
            void *nb = realloc(back, n);
            if (!nb) {
                fprintf(stderr, "out of memory for a batch of %zu bytes\n", n);
                return 1;
            }
            back = nb;
            cudaFree(dev);
            cudaFreeHost(pinned);
            cudaMalloc(&dev, n);
            cudaHostAlloc(&pinned, n, 0);
            cap = n;
        }
        /* Correctness: the device copy equals the host batch. */
        cudaMemcpy(back, bw_batch_data(b), n, cudaMemcpyDeviceToHost);
        if (memcmp(back, bw_batch_host_data(b), n) != 0)
            bad++;
        /* Baseline: a plain pinned cudaMemcpy of the same bytes. */
        memcpy(pinned, bw_batch_host_data(b), n);
        double p0 = now();
        cudaMemcpy(dev, pinned, n, cudaMemcpyHostToDevice);
        plain_s += now() - p0;
        /* The loader's explicit copy path (its own stream). */
        double q0 = now();
        if (bw_loader_to_device(l, b, device, dev, cap) != BW_OK) {
            fprintf(stderr, "to_device: %s\n", bw_loader_errmsg(l));
            return 1;
        }
        loader_s += now() - q0;
        batches++;
        bytes += n;
    }
    double total = now() - t0;
    printf("{\"batches\":%zu,\"bytes\":%zu,\"mismatched\":%zu,\"end_to_end_mib_s\":%.1f,"
           "\"loader_copy_gib_s\":%.2f,\"plain_cudamemcpy_gib_s\":%.2f,\"ratio\":%.2f}\n",
           batches, bytes, bad, (double)bytes / (1 << 20) / total,
           (double)bytes / (1 << 30) / loader_s, (double)bytes / (1 << 30) / plain_s,
           plain_s / loader_s);
    bw_loader_close(l);
    return bad || rc != BW_END_OF_EPOCH ? 1 : 0;
}
