/*
 * fuzz_tokenizer_json.c — libFuzzer target for the tokenizer.json loader:
 * any bytes must either load or fail with an error, never crash; a loaded
 * tokenizer must encode, decode and stream a fixed text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cmf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cmf_tokenizer *t = NULL;
    cmf_error err = {0};
    if (cmf_tokenizer_load_json((const char *)data, size, &t, &err) != CMF_OK) return 0;
    static const char text[] = "Hello  world! 12345 <s> caf\xC3\xA9 \xF0\x9F\x98\x8A\n\t x";
    int32_t *ids = NULL;
    size_t n = 0;
    if (cmf_tokenizer_encode(t, text, sizeof text - 1, true, &ids, &n, &err) == CMF_OK) {
        char *s = NULL;
        if (cmf_tokenizer_decode(t, ids, n, false, &s, NULL, &err) == CMF_OK) free(s);
        cmf_detok_stream *st = NULL;
        if (cmf_detok_stream_new(t, true, &st, &err) == CMF_OK) {
            const char *p;
            size_t pl;
            for (size_t i = 0; i < n; i++) (void)cmf_detok_stream_push(st, ids[i], &p, &pl, &err);
            (void)cmf_detok_stream_flush(st, &p, &pl, &err);
            cmf_detok_stream_free(st);
        }
        free(ids);
    }
    cmf_tokenizer_free(t);
    return 0;
}
