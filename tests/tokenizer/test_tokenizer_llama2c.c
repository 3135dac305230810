/*
 * test_tokenizer_llama2c.c — cmf_tokenizer_json_from_llama2c on the Llama 2
 * tokenizer.bin and the stories260K tok512.bin: encode(text, BOS) equals
 * llama2.c run.c encode() on every case of
 * expected/llama2c_tokenizer_encodings.json; decode and the streaming
 * detokenizer agree; byte fallback streams one emoji as one character.
 */
#include "test.h"
#include "tok_test_util.h"

#include <cjson/cJSON.h>

static cmf_tokenizer *load_bin(const char *path, uint32_t vocab) {
    size_t len;
    char *bin = tt_read(path, &len);
    if (!bin) return NULL;
    char *js = NULL;
    size_t jl = 0;
    cmf_error err = {0};
    cmf_tokenizer *t = NULL;
    cmf_status st = cmf_tokenizer_json_from_llama2c(bin, len, vocab, &js, &jl, &err);
    CHECK(st == CMF_OK, "%s: convert: %s", path, err.msg);
    if (st == CMF_OK) {
        st = cmf_tokenizer_load_json(js, jl, &t, &err);
        CHECK(st == CMF_OK, "%s: load: %s", path, err.msg);
    }
    /* truncated input must fail cleanly */
    char *js2 = NULL;
    size_t jl2;
    CHECK(cmf_tokenizer_json_from_llama2c(bin, len / 2, vocab, &js2, &jl2, &err) == CMF_ERR_FORMAT, "truncated accepted");
    free(js2);
    free(js);
    free(bin);
    return t;
}

static void run(const cmf_tokenizer *t, const cJSON *cases, const char *name) {
    const cJSON *c;
    size_t k = 0, good = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const cJSON *ids = cJSON_GetObjectItem(c, "ids"), *e;
        int32_t want[4096];
        size_t nw = 0;
        cJSON_ArrayForEach(e, ids) if (nw < 4096) want[nw++] = (int32_t)e->valuedouble;
        int32_t *got = NULL;
        size_t ng = 0;
        cmf_error err = {0};
        char label[96];
        snprintf(label, sizeof label, "%s case %zu", name, k);
        cmf_status st = cmf_tokenizer_encode(t, text, strlen(text), true, &got, &ng, &err);
        bool eq = st == CMF_OK && tt_ids_equal(label, got, ng, want, nw);
        CHECK(eq, "%s: \"%s\"", label, text);
        good += eq;
        CHECK(tt_stream_matches(t, want, nw, true, label), "%s stream", label);
        char *dec = NULL;
        if (cmf_tokenizer_decode(t, want, nw, true, &dec, NULL, &err) == CMF_OK)
            CHECK(strcmp(dec, text) == 0, "%s: decode \"%s\" != \"%s\"", label, dec, text);
        free(dec);
        free(got);
        k++;
    }
    fprintf(stderr, "%s: %zu/%zu exact\n", name, good, k);
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("shared data not found");
    char path[8192];
    snprintf(path, sizeof path, "%s/expected/llama2c_tokenizer_encodings.json", data);
    size_t len;
    char *js = tt_read(path, &len);
    REQUIRE(js, "read %s", path);
    cJSON *root = cJSON_Parse(js);
    free(js);
    REQUIRE(root, "parse %s", path);

    snprintf(path, sizeof path, "%s/models/llama2c_tokenizer/tokenizer.bin", data);
    cmf_tokenizer *t = load_bin(path, 32000);
    REQUIRE(t, "llama2 tokenizer");
    const cJSON *l2 = cJSON_GetObjectItem(root, "llama2_tokenizer_bin");
    run(t, cJSON_GetObjectItem(l2, "official_cases"), "llama2 official");
    run(t, cJSON_GetObjectItem(l2, "generated_cases"), "llama2 generated");
    CHECK(cmf_tokenizer_bos_id(t) == 1, "bos %d", cmf_tokenizer_bos_id(t));

    /* byte fallback emoji: 😊 is not a Llama 2 piece -> <0xF0><0x9F><0x98><0x8A> */
    int32_t *ids = NULL;
    size_t n = 0;
    cmf_error err = {0};
    CHECK(cmf_tokenizer_encode(t, "\xF0\x9F\x98\x8A", 4, false, &ids, &n, &err) == CMF_OK, "%s", err.msg);
    CHECK(n >= 4 && ids[n - 4] == 0xF0 + 3 && ids[n - 1] == 0x8A + 3, "emoji byte fallback (n=%zu)", n);
    cmf_detok_stream *s = NULL;
    CHECK(cmf_detok_stream_new(t, false, &s, &err) == CMF_OK, "stream");
    size_t pieces = 0;
    for (size_t i = 0; s && i < n; i++) {
        const char *p;
        size_t pl;
        CHECK(cmf_detok_stream_push(s, ids[i], &p, &pl, &err) == CMF_OK, "push");
        if (pl) {
            pieces++;
            CHECK(pl == 4 && !memcmp(p, "\xF0\x9F\x98\x8A", 4), "emoji chunk \"%.*s\"", (int)pl, p);
        }
    }
    CHECK(pieces == 1, "emoji streamed in %zu chunks", pieces);
    cmf_detok_stream_free(s);
    free(ids);
    cmf_tokenizer_free(t);

    snprintf(path, sizeof path, "%s/models/stories260K/tok512.bin", data);
    t = load_bin(path, 512);
    REQUIRE(t, "tok512");
    run(t, cJSON_GetObjectItem(cJSON_GetObjectItem(root, "tok512"), "generated_cases"), "tok512");
    cmf_tokenizer_free(t);
    cJSON_Delete(root);
    return test_done();
}
