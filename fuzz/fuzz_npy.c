/* libFuzzer target: the .npy header parser and row access. */
#include "fuzz_reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bw_fuzz_reader(&bw__fmt_npy, data, size);
    return 0;
}
