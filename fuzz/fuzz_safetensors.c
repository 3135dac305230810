/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader
 * (src/import/safetensors.c): any input either opens, with every tensor's
 * bytes inside the input and convertible to f32, or fails with a message.
 */
#include "import/safetensors.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cmf_st_file *f = NULL;
    cmf_error err;
    if (cmf_st_open_memory(data, size, "fuzz.safetensors", &f, &err) != CMF_OK) {
        if (!err.msg[0]) abort();
        return 0;
    }
    for (size_t i = 0; i < cmf_st_count(f); i++) {
        const cmf_st_tensor *t = cmf_st_at(f, i);
        const uint8_t *p = t->data;
        if (p < data + 8 || p + t->nbytes > data + size) abort();
        uint64_t n = t->nelem < 64 ? t->nelem : 64;
        float v[64];
        cmf_st_to_f32(t, 0, n, v);
    }
    cmf_st_close(f);
    return 0;
}
