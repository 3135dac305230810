/*
 * fuzz_tokenizer_encode.c — libFuzzer target for encode/decode/streaming:
 * a small built-in tokenizer.json exercising the byte-level path (Split
 * regex + ByteLevel + BPE merges + added tokens with lstrip/rstrip) and the
 * SentencePiece path (Replace/Prepend normalizers, byte_fallback, Metaspace
 * style decoder). The input bytes (any, including invalid UTF-8) are the
 * text; the ids produced are decoded and streamed, and arbitrary ids from
 * the input are decoded too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cmf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char BYTELEVEL[] =
    "{\"added_tokens\":[{\"id\":10,\"content\":\"<|x|>\",\"special\":true,\"lstrip\":true,\"rstrip\":true,\"normalized\":false},"
    "{\"id\":11,\"content\":\"ab\",\"special\":false,\"single_word\":true,\"normalized\":true}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|x|>\"}},{\"Sequence\":{\"id\":\"A\"}}],"
    "\"special_tokens\":{\"<|x|>\":{\"id\":\"<|x|>\",\"ids\":[10],\"tokens\":[\"<|x|>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"\\u0120\":2,\"ab\":3,\"\\u0120ab\":4,\"c\":5,\"\\u0120\\u0120\":6,\"1\":7},"
    "\"merges\":[\"a b\",\"\\u0120 ab\",\"\\u0120 \\u0120\"]}}";

static const char SPM[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,\"content\":\"<s>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},\"pre_tokenizer\":null,"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"fuse_unk\":true,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"<0xC3>\":2,\"<0xA9>\":3,\"<0xF0>\":4,\"<0x9F>\":5,\"a\":6,\"b\":7,\"\\u2581\":8,\"ab\":9,\"\\u2581ab\":10},"
    "\"merges\":[[\"a\",\"b\"],[\"\\u2581\",\"ab\"]]}}";

static cmf_tokenizer *tok[2];

static void run(const cmf_tokenizer *t, const uint8_t *data, size_t size) {
    cmf_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (cmf_tokenizer_encode(t, (const char *)data, size, size & 1, &ids, &n, &err) != CMF_OK) return;
    char *s = NULL;
    if (cmf_tokenizer_decode(t, ids, n, false, &s, NULL, &err) == CMF_OK) free(s);
    cmf_detok_stream *st = NULL;
    if (cmf_detok_stream_new(t, false, &st, &err) == CMF_OK) {
        const char *p;
        size_t pl;
        for (size_t i = 0; i < n; i++) (void)cmf_detok_stream_push(st, ids[i], &p, &pl, &err);
        (void)cmf_detok_stream_flush(st, &p, &pl, &err);
        cmf_detok_stream_free(st);
    }
    free(ids);
    /* raw ids from the input bytes, in and out of range */
    int32_t raw[64];
    size_t nr = 0;
    for (size_t i = 0; i < size && nr < 64; i++) raw[nr++] = (int32_t)data[i] % 14 - 1;
    if (cmf_tokenizer_decode(t, raw, nr, size & 2, &s, NULL, &err) == CMF_OK) free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cmf_error err = {0};
    if (!tok[0] && cmf_tokenizer_load_json(BYTELEVEL, sizeof BYTELEVEL - 1, &tok[0], &err) != CMF_OK) abort();
    if (!tok[1] && cmf_tokenizer_load_json(SPM, sizeof SPM - 1, &tok[1], &err) != CMF_OK) abort();
    run(tok[0], data, size);
    run(tok[1], data, size);
    return 0;
}
