/* libFuzzer target: JSON Lines and text lines (the first byte picks which). */
#include "fuzz_reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    bw_fuzz_reader(data[0] & 1 ? &bw__fmt_text : &bw__fmt_jsonl, data + 1, size - 1);
    return 0;
}
