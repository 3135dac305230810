/*
 * test_tokenizer_gguf.c — GGUF vocabularies: cmf_tokenizer_json_from_gguf on
 * every .gguf in ../shared/data/vocab (read with the import module's GGUF
 * reader), then llama.cpp's test-tokenizer-0 vectors (.inp/.out, generated
 * with HF tokenizers, no BOS) must all be exact; the streaming detokenizer
 * equals decode on every case. stories260K.gguf (SentencePiece "llama"
 * vocab) must encode like llama2.c's tok512.bin.
 */
#include "test.h"
#include "tok_test_util.h"

#include <dirent.h>

#include <cjson/cJSON.h>

#include "import/gguf.h"

static cmf_tokenizer *load_gguf(const char *path) {
    cmf_gguf *g = NULL;
    cmf_error err = {0};
    if (cmf_gguf_open(path, &g, &err)) { CHECK(0, "%s: %s", path, err.msg); return NULL; }
    char *js = NULL;
    size_t jl = 0;
    cmf_tokenizer *t = NULL;
    cmf_status st = cmf_tokenizer_json_from_gguf(cmf_gguf_meta(g), &js, &jl, &err);
    CHECK(st == CMF_OK, "%s: convert: %s", path, err.msg);
    if (!st) {
        st = cmf_tokenizer_load_json(js, jl, &t, &err);
        CHECK(st == CMF_OK, "%s: load: %s", path, err.msg);
    }
    free(js);
    cmf_gguf_close(g);
    return t;
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("shared data not found");
    char dir[4200], path[8192];
    snprintf(dir, sizeof dir, "%s/vocab", data);
    DIR *d = opendir(dir);
    REQUIRE(d, "open %s", dir);
    struct dirent *e;
    size_t n_vocab = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 5, ".gguf")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        cmf_tokenizer *t = load_gguf(path);
        if (!t) continue;
        size_t good = 0, total = 0;
        bool ok = tt_run_inp_out(t, path, &good, &total);
        CHECK(ok, "%s: %zu/%zu exact", e->d_name, good, total);
        fprintf(stderr, "%s: %zu/%zu exact\n", e->d_name, good, total);
        /* stream == decode on the encodings of every input */
        size_t il;
        char ip[8400];
        snprintf(ip, sizeof ip, "%s.inp", path);
        char *inp = tt_read(ip, &il);
        for (char *p = inp; p && *p;) {
            char *q = strstr(p, "\n__ggml_vocab_test__\n");
            if (!q) break;
            int32_t *ids = NULL;
            size_t ni = 0;
            cmf_error err = {0};
            if (cmf_tokenizer_encode(t, p, (size_t)(q - p), true, &ids, &ni, &err) == CMF_OK) {
                CHECK(tt_stream_matches(t, ids, ni, false, e->d_name), "%s stream", e->d_name);
                CHECK(tt_stream_matches(t, ids, ni, true, e->d_name), "%s stream skip", e->d_name);
            }
            free(ids);
            p = q + strlen("\n__ggml_vocab_test__\n");
        }
        free(inp);
        cmf_tokenizer_free(t);
        n_vocab++;
    }
    closedir(d);
    CHECK(n_vocab >= 7, "only %zu vocab GGUFs", n_vocab);

    /* stories260K.gguf == tok512.bin expectations */
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.gguf", data);
    cmf_tokenizer *t = load_gguf(path);
    snprintf(path, sizeof path, "%s/expected/llama2c_tokenizer_encodings.json", data);
    size_t len;
    char *js = tt_read(path, &len);
    cJSON *root = js ? cJSON_Parse(js) : NULL;
    free(js);
    const cJSON *cases = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "tok512"), "generated_cases"), *c;
    size_t good = 0, total = 0;
    cJSON_ArrayForEach(c, cases) {
        if (!t) break;
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        int32_t want[2048];
        size_t nw = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "ids")) if (nw < 2048) want[nw++] = (int32_t)x->valuedouble;
        int32_t *got = NULL;
        size_t ng = 0;
        cmf_error err = {0};
        bool eq = cmf_tokenizer_encode(t, text, strlen(text), true, &got, &ng, &err) == CMF_OK &&
                  tt_ids_equal("stories260K.gguf", got, ng, want, nw);
        CHECK(eq, "stories260K.gguf: \"%s\"", text);
        good += eq;
        total++;
        free(got);
    }
    fprintf(stderr, "stories260K.gguf vs llama2.c: %zu/%zu exact\n", good, total);
    cJSON_Delete(root);
    cmf_tokenizer_free(t);
    return test_done();
}
