/* The loader's GPU path (gpu.h): devices, device buffers, and one CUDA stream per batch slot
 * for asynchronous copies; without CUDA (BW_HAVE_CUDA unset) the same calls refuse devices
 * with BW_NO_DEVICE. A batch's pinned host buffer is batch.c's. */
#include "gpu.h"

#include <stdio.h>
#include <stdlib.h>

#include "batchwire/batchwire.h"

#ifdef BW_HAVE_CUDA
#include <cuda_runtime_api.h>

struct bw__gpu_stream {
    int device;
    cudaStream_t stream;
};

bool bw__gpu_built(void)
{
    return true;
}

static int cuda_fail(cudaError_t e, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
                   e == cudaErrorInvalidDevice || e == cudaErrorInitializationError
               ? BW_NO_DEVICE
               : BW_INTERNAL;
}

int bw__gpu_check(int device, char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cuda_fail(e, "no usable CUDA device: cudaGetDeviceCount", err, errlen);
        return BW_NO_DEVICE;
    }
    if (device < 0 || device >= n) {
        snprintf(err, errlen, "cuda:%d does not exist: this machine has %d CUDA device%s", device,
                 n, n == 1 ? "" : "s");
        return BW_NO_DEVICE;
    }
    return BW_OK;
}

int bw__gpu_stream_new(int device, bw__gpu_stream **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = bw__gpu_check(device, err, errlen);
    if (rc != BW_OK)
        return rc;
    bw__gpu_stream *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory for a copy stream on cuda:%d", device);
        return BW_NOMEM;
    }
    s->device = device;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(s);
        return cuda_fail(e, "cannot create a CUDA stream", err, errlen);
    }
    *out = s;
    return BW_OK;
}

void bw__gpu_stream_free(bw__gpu_stream *s)
{
    if (!s)
        return;
    cudaSetDevice(s->device);
    cudaStreamDestroy(s->stream);
    free(s);
}

int bw__gpu_alloc(bw__gpu_stream *s, size_t n, void **dptr, char *err, size_t errlen)
{
    cudaSetDevice(s->device);
    cudaError_t e = cudaMalloc(dptr, n ? n : 1);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaMalloc", err, errlen);
    return BW_OK;
}

void bw__gpu_free(bw__gpu_stream *s, void *dptr)
{
    if (dptr) {
        cudaSetDevice(s->device);
        cudaFree(dptr);
    }
}

int bw__gpu_copy(bw__gpu_stream *s, void *dst, const void *src, size_t n, char *err, size_t errlen)
{
    cudaSetDevice(s->device);
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess)
        return cuda_fail(e, "host-to-device copy", err, errlen);
    return BW_OK;
}

#else /* no CUDA at build time */

struct bw__gpu_stream {
    int unused;
};

bool bw__gpu_built(void)
{
    return false;
}

static int no_cuda(char *err, size_t errlen)
{
    snprintf(err, errlen,
             "this libbatchwire was built without CUDA (rebuild with the CUDA "
             "toolkit installed, or use host batches: device -1)");
    return BW_NO_DEVICE;
}

int bw__gpu_check(int device, char *err, size_t errlen)
{
    (void)device;
    return no_cuda(err, errlen);
}

int bw__gpu_stream_new(int device, bw__gpu_stream **out, char *err, size_t errlen)
{
    (void)device;
    *out = NULL;
    return no_cuda(err, errlen);
}

void bw__gpu_stream_free(bw__gpu_stream *s)
{
    (void)s;
}

int bw__gpu_alloc(bw__gpu_stream *s, size_t n, void **dptr, char *err, size_t errlen)
{
    (void)s;
    (void)n;
    *dptr = NULL;
    return no_cuda(err, errlen);
}

void bw__gpu_free(bw__gpu_stream *s, void *dptr)
{
    (void)s;
    (void)dptr;
}

int bw__gpu_copy(bw__gpu_stream *s, void *dst, const void *src, size_t n, char *err, size_t errlen)
{
    (void)s;
    (void)dst;
    (void)src;
    (void)n;
    return no_cuda(err, errlen);
}

#endif

int bw__gpu_upload(bw__gpu_stream *s, const void *src, size_t n, void **dptr, size_t *cap,
                   char *err, size_t errlen)
{
    if (n > *cap) {
        bw__gpu_free(s, *dptr);
        *dptr = NULL;
        *cap = 0;
        int rc = bw__gpu_alloc(s, n, dptr, err, errlen);
        if (rc != BW_OK)
            return rc;
        *cap = n;
    }
    return bw__gpu_copy(s, *dptr, src, n, err, errlen);
}
