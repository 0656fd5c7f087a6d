/* The loader's fixed sizes, shared by the session, batches and the loader. Nothing here is part
 * of the public API. */
#ifndef BW_CLIENT_LOADER_LIMITS_H
#define BW_CLIENT_LOADER_LIMITS_H

enum {
    BW_LOADER_NUM_SHARDS = 256, /* storage shards samples are routed by (blocks, modulo) */
    BW_LOADER_MAX_NDIM = 16,
    BW_LOADER_ERRLEN = 1024,
};

#endif
