/* libFuzzer target: tar headers (ustar, GNU, pax) and WebDataset grouping. */
#include "fuzz_reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bw_fuzz_reader(&bw__fmt_tar, data, size);
    return 0;
}
