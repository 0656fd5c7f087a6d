/* The loader's GPU path: devices, device buffers and an asynchronous host-to-device copy on a
 * stream of the loader's own (a batch's pinned host buffer is batch.c's). Built against the
 * CUDA runtime when it is found at build time (BW_HAVE_CUDA); otherwise every call reports
 * BW_NO_DEVICE with a sentence saying so, and the host path is unaffected. */
#ifndef BW_CLIENT_GPU_H
#define BW_CLIENT_GPU_H

#include <stdbool.h>
#include <stddef.h>

typedef struct bw__gpu_stream bw__gpu_stream;

/* BW_OK when `device` is a usable CUDA device here; BW_NO_DEVICE with the reason otherwise
 * (built without CUDA, no driver, no such device). */
int bw__gpu_check(int device, char *err, size_t errlen);

/* A stream on `device` and device memory for it. */
int bw__gpu_stream_new(int device, bw__gpu_stream **out, char *err, size_t errlen);
void bw__gpu_stream_free(bw__gpu_stream *s);
int bw__gpu_alloc(bw__gpu_stream *s, size_t n, void **dptr, char *err, size_t errlen);
void bw__gpu_free(bw__gpu_stream *s, void *dptr);

/* Copies n bytes host -> device with cudaMemcpyAsync on the stream and waits for it. */
int bw__gpu_copy(bw__gpu_stream *s, void *dst, const void *src, size_t n, char *err, size_t errlen);
/* Copies n bytes from src to the device buffer *dptr of *cap bytes (NULL, 0: none yet),
 * replacing it first with one of n bytes when it is smaller; on error *dptr may be NULL (and
 * *cap 0), with err saying why. */
int bw__gpu_upload(bw__gpu_stream *s, const void *src, size_t n, void **dptr, size_t *cap,
                   char *err, size_t errlen);

/* Whether this build has the CUDA path at all. */
bool bw__gpu_built(void);

#endif
