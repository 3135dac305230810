/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader (src/import/gguf.c):
 * any byte string must either open (and then every tensor's data must lie
 * inside the input and dequantize without faults) or fail with an error
 * message; never crash, leak or read out of bounds.
 */
#include "import/gguf.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cmf_gguf *g = NULL;
    cmf_error err;
    if (cmf_gguf_open_memory(data, size, "fuzz.gguf", &g, &err) != CMF_OK) {
        if (!err.msg[0]) abort(); /* every failure explains itself */
        return 0;
    }
    for (size_t i = 0; i < cmf_gguf_tensor_count(g); i++) {
        const cmf_gguf_tensor *t = cmf_gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size) abort();
        uint32_t be, bb;
        if (!cmf_ggml_type_size(t->type, &be, &bb) || !cmf_ggml_can_dequantize(t->type)) continue;
        /* dequantize up to 4 blocks */
        uint64_t blocks = t->nbytes / bb < 4 ? t->nbytes / bb : 4;
        float *f = malloc(blocks * be * sizeof(float) + 1);
        if (f && blocks) cmf_ggml_dequantize(t->type, t->data, blocks * be, f, &err);
        free(f);
    }
    cmf_gguf_close(g);
    return 0;
}
