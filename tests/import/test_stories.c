/*
 * test_stories.c — stories260K imported from its llama2.c form
 * (stories260K.bin + tok512.bin) and its GGUF form must give the same
 * file: same tensor names and shapes, identical decoded values (at f32
 * and at q8), one embedding copy (the GGUF's output.weight duplicates
 * token_embd and is dropped; llama2.c shares its classifier), a tokenizer
 * section, and BOS/EOS ids. This checks the GGUF name mapping and both
 * rotary row permutations (llama.cpp's and llama2.c's interleaved order
 * to HF order) against each other.
 */
#include "import_test_util.h"

static void check_file(const char *path) {
    cmf_file *f = NULL;
    cmf_error err = {0};
    if (cmf_file_open(path, &f, &err) != CMF_OK) { CHECK(0, "%s", err.msg); return; }
    const cJSON *h = cmf_file_header(f);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(h, "arch");
    CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "tie_word_embeddings")), "%s: tied", path);
    CHECK(!cmf_file_find(f, "lm_head.weight"), "%s: lm_head dropped", path);
    CHECK(cJSON_GetObjectItemCaseSensitive(a, "num_layers")->valuedouble == 5 &&
          cJSON_GetObjectItemCaseSensitive(a, "num_kv_heads")->valuedouble == 4 &&
          cJSON_GetObjectItemCaseSensitive(a, "intermediate_size")->valuedouble == 172 &&
          cJSON_GetObjectItemCaseSensitive(a, "vocab_size")->valuedouble == 512, "%s: arch", path);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(h, "tokenizer_config");
    CHECK(cJSON_GetObjectItemCaseSensitive(tc, "bos_token_id") &&
          cJSON_GetObjectItemCaseSensitive(tc, "bos_token_id")->valuedouble == 1, "%s: bos", path);
    CHECK(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(tc, "eos_token_ids"), 0)->valuedouble == 2, "%s: eos", path);
    size_t tl = 0;
    CHECK(cmf_file_tokenizer_json(f, &tl) && tl > 100, "%s: tokenizer section", path);
    CHECK(cmf_file_tensor_count(f) == 1 + 5 * 9 + 1, "%s: %zu tensors", path, cmf_file_tensor_count(f));
    cmf_file_close(f);
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("shared data absent");
    const char *tmp = test_tmp_dir("stories");
    char bin[4200], tok[4200], gguf[4200];
    snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", data);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", data);
    snprintf(gguf, sizeof gguf, "%s/models/stories260K/stories260K.gguf", data);
    static const char *quants[] = {"f32", "q8", "q4t"};
    for (size_t k = 0; k < 3; k++) {
        char a[4400], b[4400];
        snprintf(a, sizeof a, "%s/l2c-%s.cmf", tmp, quants[k]);
        snprintf(b, sizeof b, "%s/gguf-%s.cmf", tmp, quants[k]);
        cmf_import_opts o = {.quant = quants[k]};
        cmf_error err = {0};
        cmf_status s1 = cmf_import_llama2c(bin, tok, a, &o, &err);
        CHECK(s1 == CMF_OK, "import-llama2c --quant %s: %s", quants[k], err.msg);
        cmf_status s2 = cmf_import_gguf(gguf, b, &o, &err);
        CHECK(s2 == CMF_OK, "import-gguf --quant %s: %s", quants[k], err.msg);
        if (s1 || s2) continue;
        CHECK(compare_cmf(a, b, 0.0f) == 0, "--quant %s: llama2.c and GGUF imports differ", quants[k]);
        if (k == 0) {
            check_file(a);
            check_file(b);
        }
    }
    /* --quant keep of an all-F32 GGUF is a lossless copy. */
    char keep[4400], f32[4400];
    snprintf(keep, sizeof keep, "%s/gguf-keep.cmf", tmp);
    snprintf(f32, sizeof f32, "%s/gguf-f32.cmf", tmp);
    cmf_import_opts o = {.quant = "keep"};
    cmf_error err = {0};
    CHECK(cmf_import_gguf(gguf, keep, &o, &err) == CMF_OK, "keep: %s", err.msg);
    CHECK(compare_cmf(keep, f32, 0.0f) == 0, "keep differs from f32");
    return test_done();
}
