/*
 * test_tokenizer_hf.c — exact parity with Hugging Face `tokenizers` 0.23 on
 * ../shared/data/tokenizers/{qwen3,llama3,gemma3}: for each of the 63 cases
 * in cases.json, encode without and with special tokens, decode, the
 * streaming detokenizer (equal to decode), decode(encode(text)) == text for
 * the byte-level vocabularies; plus the llama.cpp .inp/.out vectors that
 * pair with tokenizers/qwen3 (qwen2, deepseek-r1-qwen); plus a long run of
 * one character (no quadratic behaviour).
 */
#include "test.h"
#include "tok_test_util.h"

#include <cjson/cJSON.h>

static int32_t *json_ids(const cJSON *a, size_t *n) {
    *n = (size_t)cJSON_GetArraySize(a);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) v[i++] = (int32_t)e->valuedouble;
    return v;
}

static void run_cases(const char *data, const char *name, bool byte_level) {
    char path[8192];
    snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer.json.gz", data, name);
    cmf_tokenizer *t = NULL;
    cmf_error err = {0};
    cmf_status st = cmf_tokenizer_load_path(path, &t, &err);
    CHECK(st == CMF_OK, "%s: load: %s", name, err.msg);
    if (st) return;
    snprintf(path, sizeof path, "%s/tokenizers/%s/cases.json", data, name);
    size_t len;
    char *js = tt_read(path, &len);
    cJSON *root = js ? cJSON_Parse(js) : NULL;
    free(js);
    CHECK(root != NULL, "%s: cases.json", name);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *c;
    size_t idx = 0, ok_enc = 0, total = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        char label[128];
        snprintf(label, sizeof label, "%s case %zu", name, idx);
        for (int sp = 0; sp < 2; sp++) {
            size_t nw;
            int32_t *want = json_ids(cJSON_GetObjectItem(c, sp ? "ids_with_special" : "ids"), &nw);
            int32_t *got = NULL;
            size_t ng = 0;
            st = cmf_tokenizer_encode(t, text, strlen(text), sp, &got, &ng, &err);
            CHECK(st == CMF_OK, "%s: encode: %s", label, err.msg);
            bool eq = st == CMF_OK && tt_ids_equal(label, got, ng, want, nw);
            CHECK(eq, "%s (special=%d) text=\"%s\"", label, sp, text);
            total++;
            ok_enc += eq;
            if (!sp) {
                char *dec = NULL;
                size_t dl = 0;
                st = cmf_tokenizer_decode(t, want, nw, false, &dec, &dl, &err);
                const char *wd = cJSON_GetObjectItem(c, "decoded")->valuestring;
                CHECK(st == CMF_OK && strcmp(dec, wd) == 0, "%s: decode \"%s\" != \"%s\"", label, dec ? dec : "(null)", wd);
                /* decode(encode(text)) == text unless normalization changed it (NFC) */
                if (byte_level && strcmp(wd, text) == 0) {
                    char *rt = NULL;
                    st = cmf_tokenizer_decode(t, got, ng, false, &rt, NULL, &err);
                    CHECK(st == CMF_OK && strcmp(rt, text) == 0, "%s: round trip \"%s\"", label, rt ? rt : "");
                    free(rt);
                }
                free(dec);
                CHECK(tt_stream_matches(t, want, nw, false, label), "%s: stream", label);
                CHECK(tt_stream_matches(t, want, nw, true, label), "%s: stream skip", label);
            } else
                CHECK(tt_stream_matches(t, want, nw, true, label), "%s: stream skip (special)", label);
            free(want);
            free(got);
        }
        idx++;
    }
    fprintf(stderr, "%s: %zu/%zu encodings exact\n", name, ok_enc, total);

    /* long run without spaces: must finish quickly (not timed) */
    size_t n = getenv("CMF_TEST_QUICK") ? 10000 : 100000;
    char *big = malloc(n + 1);
    memset(big, 'a', n);
    big[n] = 0;
    int32_t *ids = NULL;
    size_t ni = 0;
    st = cmf_tokenizer_encode(t, big, n, false, &ids, &ni, &err);
    CHECK(st == CMF_OK && ni > 0, "%s: long run: %s", name, err.msg);
    char *dec = NULL;
    if (st == CMF_OK && cmf_tokenizer_decode(t, ids, ni, false, &dec, NULL, &err) == CMF_OK)
        CHECK(strcmp(dec, big) == 0 || !byte_level, "%s: long run round trip", name);
    free(dec);
    free(ids);
    free(big);
    cJSON_Delete(root);
    cmf_tokenizer_free(t);
}

/* llama.cpp test-tokenizer-0 vectors for a tokenizer.json */
static void run_inp_out(const char *data, const char *tok, const char *vocab) {
    char path[8192];
    snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer.json.gz", data, tok);
    cmf_tokenizer *t = NULL;
    cmf_error err = {0};
    if (cmf_tokenizer_load_path(path, &t, &err)) { CHECK(0, "%s", err.msg); return; }
    snprintf(path, sizeof path, "%s/vocab/%s", data, vocab);
    size_t good = 0, total = 0;
    CHECK(tt_run_inp_out(t, path, &good, &total), "%s: %zu/%zu", vocab, good, total);
    fprintf(stderr, "%s via tokenizers/%s: %zu/%zu exact\n", vocab, tok, good, total);
    cmf_tokenizer_free(t);
}

/* argv[1]: the tokenizer to check (qwen3 | llama3 | gemma3 | all; default
 * qwen3), so ctest runs the three as separate tests in parallel. */
int main(int argc, char **argv) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("shared data not found");
    const char *only = argc > 1 ? argv[1] : "qwen3";
    if (!strcmp(only, "all")) only = NULL;
    if (!only || !strcmp(only, "qwen3")) {
        run_cases(data, "qwen3", true);
        run_inp_out(data, "qwen3", "ggml-vocab-qwen2.gguf");
        run_inp_out(data, "qwen3", "ggml-vocab-deepseek-r1-qwen.gguf");
    }
    if (!only || !strcmp(only, "llama3")) run_cases(data, "llama3", true);
    if (!only || !strcmp(only, "gemma3")) run_cases(data, "gemma3", false);
    return test_done();
}
