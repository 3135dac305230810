/*
 * test_model_ppl.c — `cmf ppl` against the definition in its --help,
 * computed here independently with the library: the stories260K model
 * (imported from llama2.c), the llama2.c reference story as text,
 * tokenized with add_special_tokens=false, non-overlapping windows of c
 * tokens (the last shorter one counted when >= 2 tokens), each window one
 * batch from an empty cache, ppl = exp(mean NLL of tokens 1..L-1 of every
 * window). The CLI evaluates windows in chunks (-b), so this also checks
 * that chunked prefill gives the same numbers. Also checks `cmf logits`
 * writes a .npy this file's reader accepts with the same values.
 */
#include "model_util.h"
#include "npy.h"
#include "test.h"

#include <unistd.h>

static double ref_ppl(cmf_model *m, const int32_t *ids, size_t n, size_t c) {
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    float *lg = malloc(c * info.n_vocab * sizeof(float));
    double nll = 0;
    size_t scored = 0;
    cmf_error err = {0};
    for (size_t w = 0; w + 2 <= n; w += c) {
        size_t L = n - w < c ? n - w : c;
        if (mu_logits(m, ids + w, L, CMF_KV_F32, lg, &err) != CMF_OK) { free(lg); return -1; }
        for (size_t i = 1; i < L; i++) {
            const float *r = lg + (i - 1) * info.n_vocab;
            double mx = r[0], s = 0;
            for (size_t j = 1; j < info.n_vocab; j++) mx = r[j] > mx ? r[j] : mx;
            for (size_t j = 0; j < info.n_vocab; j++) s += exp(r[j] - mx);
            nll += log(s) + mx - r[ids[w + i]];
            scored++;
        }
    }
    free(lg);
    return exp(nll / (double)scored);
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("no shared data");
    char cmf[8192], path[8192], model[8192], text[8192], cmd[40000];
    snprintf(cmf, sizeof cmf, "%s/../../tools/cmf", CMF_BINARY_DIR);
    if (access(cmf, X_OK) != 0) TEST_SKIP("no cmf binary at %s", cmf);
    const char *tmp = test_tmp_dir("model_ppl");
    snprintf(model, sizeof model, "%s/stories.cmf", tmp);
    snprintf(text, sizeof text, "%s/story.txt", tmp);
    cmf_error err = {0};
    char bin[8192], tokp[8192];
    snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", data);
    snprintf(tokp, sizeof tokp, "%s/models/stories260K/tok512.bin", data);
    cmf_import_opts o = {.quant = "f32"};
    cmf_status st = cmf_import_llama2c(bin, tokp, model, &o, &err);
    REQUIRE(st == CMF_OK, "import: %s", err.msg);

    /* the text: llama2.c's reference story */
    snprintf(path, sizeof path, "%s/expected/stories260K_llama2c_reference.json", data);
    char *js = NULL;
    size_t jl = 0;
    st = cmf_read_file(path, &js, &jl, &err);
    REQUIRE(st == CMF_OK, "%s", err.msg);
    cJSON *j = cJSON_Parse(js);
    free(js);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "official_expected"), "doc_greedy_t0"),
        "text");
    REQUIRE(cJSON_IsString(t), "reference text");
    FILE *f = fopen(text, "wb");
    REQUIRE(f, "%s", text);
    fputs(t->valuestring, f);
    fclose(f);

    cmf_file *cf = NULL;
    cmf_model *m = NULL;
    cmf_tokenizer *tok = NULL;
    st = cmf_file_open(model, &cf, &err);
    if (!st) st = cmf_model_load(cf, &(cmf_model_params){.n_threads = 2}, &m, &err);
    if (!st) st = cmf_tokenizer_load_path(model, &tok, &err);
    REQUIRE(st == CMF_OK, "load: %s", err.msg);
    int32_t *ids = NULL;
    size_t n = 0;
    st = cmf_tokenizer_encode(tok, t->valuestring, strlen(t->valuestring), false, &ids, &n, &err);
    REQUIRE(st == CMF_OK && n > 100, "encode: %s", err.msg);

    const size_t ctxs[] = {64, 100, 512};
    for (int k = 0; k < 3; k++) {
        double want = ref_ppl(m, ids, n, ctxs[k]);
        snprintf(cmd, sizeof cmd, "'%s' ppl '%s' --file '%s' -c %zu -b 7 --kv-f32 -t 2 2>/dev/null", cmf, model, text,
                 ctxs[k]);
        FILE *p = popen(cmd, "r");
        double got = -1;
        if (p) {
            if (fscanf(p, "%lf", &got) != 1) got = -1;
            pclose(p);
        }
        fprintf(stderr, "c=%zu: %zu tokens, cmf ppl %.6f, reference %.6f\n", ctxs[k], n, got, want);
        CHECK(want > 1 && fabs(got - want) <= 1e-4 * want, "c=%zu: cmf ppl %.6f != %.6f", ctxs[k], got, want);
    }

    /* cmf logits -> .npy round trip */
    char npy[8192], list[4096] = "";
    snprintf(npy, sizeof npy, "%s/l.npy", tmp);
    size_t nl = n < 20 ? n : 20, off = 0;
    for (size_t i = 0; i < nl; i++) off += (size_t)snprintf(list + off, sizeof list - off, "%s%d", i ? "," : "", ids[i]);
    snprintf(cmd, sizeof cmd, "'%s' logits '%s' --tokens %s -o '%s' --kv-f32 -t 2", cmf, model, list, npy);
    CHECK(system(cmd) == 0, "%s", cmd);
    npy_f32 a;
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    if (npy_read_f32(npy, &a) == 0) {
        float *lg = malloc(nl * info.n_vocab * sizeof(float));
        st = mu_logits(m, ids, nl, CMF_KV_F32, lg, &err);
        CHECK(!st && a.ndim == 2 && a.shape[0] == nl && a.shape[1] == info.n_vocab, "npy shape");
        if (!st && a.count == nl * info.n_vocab) CHECK(mu_maxdiff(a.data, lg, a.count) <= 1e-5, "npy values differ: %g", mu_maxdiff(a.data, lg, a.count));
        free(lg);
        npy_free(&a);
    } else CHECK(0, "cannot read %s", npy);
    unlink(npy);

    free(ids);
    cmf_tokenizer_free(tok);
    cmf_model_free(m);
    cmf_file_close(cf);
    cJSON_Delete(j);
    unlink(model);
    unlink(text);
    return test_done();
}
