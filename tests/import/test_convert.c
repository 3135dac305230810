/*
 * test_convert.c — `cmf_convert_hf` on every ../shared/data/parity folder
 * at every --quant: the output opens, verifies, has every source tensor
 * with its shape, f32 output equals the checkpoint exactly and quantized
 * output stays within the dtype's error bound; header.arch carries what
 * the forward pass needs. Also a sharded checkpoint (index.json) equals the
 * single-file one, and the tokenizer / chat template / EOS merging of the
 * side files.
 */
#include "import/safetensors.h"
#include "import_test_util.h"

static const char *folders[] = {"llama", "llama-tied", "mistral-sliding", "qwen2", "qwen3",
                                "qwen3-moe", "gemma", "gemma2", "phi3"};
static const char *quants[] = {"f32", "f16", "bf16", "q8", "q8_2f", "q4", "q4t", "q4tp"};

static const cJSON *arch_of(const cmf_file *f) {
    return cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "arch");
}

static double anum(const cmf_file *f, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(arch_of(f), k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Compare every tensor of the CMF with the source checkpoint. */
static void check_against_source(const char *src, const char *out, const char *quant) {
    cmf_st_file *s = NULL;
    cmf_file *f = NULL;
    cmf_error err = {0};
    if (cmf_st_open(src, &s, &err) != CMF_OK || cmf_file_open(out, &f, &err) != CMF_OK) {
        CHECK(0, "%s", err.msg);
        cmf_st_close(s);
        return;
    }
    CHECK(cmf_file_tensor_count(f) == cmf_st_count(s), "%s: %zu tensors, source %zu", out,
          cmf_file_tensor_count(f), cmf_st_count(s));
    bool exact = strcmp(quant, "f32") == 0;
    for (size_t i = 0; i < cmf_st_count(s); i++) {
        const cmf_st_tensor *st = cmf_st_at(s, i);
        const cmf_tensor *t = cmf_file_find(f, st->name);
        CHECK(t != NULL, "%s: tensor %s missing", out, st->name);
        if (!t) continue;
        CHECK(t->ndim == st->ndim && t->shape[0] == st->shape[0] && (st->ndim < 2 || t->shape[1] == st->shape[1]),
              "%s: %s shape", out, st->name);
        if (st->ndim == 1 || st->nelem < 32)
            CHECK(t->dtype == (exact ? CMF_DT_F32 : CMF_DT_F16), "%s: %s small tensor dtype %d", out, st->name, t->dtype);
        float *a = malloc(st->nelem * 4), *b = decode_all(t);
        cmf_st_to_f32(st, 0, st->nelem, a);
        float amax = 0, maxerr = 0;
        for (uint64_t k = 0; b && k < st->nelem; k++) {
            amax = fmaxf(amax, fabsf(a[k]));
            maxerr = fmaxf(maxerr, fabsf(a[k] - b[k]));
        }
        if (exact) CHECK(b && maxerr == 0.0f, "%s: %s differs (max err %g)", out, st->name, maxerr);
        /* q4 with per-row scale ladders: <= absmax/7 (half a step at most
         * doubled by the ladder); bf16: 2^-8 relative. */
        else CHECK(b && maxerr <= amax * 0.15f + 1e-6f, "%s: %s max err %g vs absmax %g", out, st->name, maxerr, amax);
        free(a);
        free(b);
    }
    cmf_file_close(f);
    cmf_st_close(s);
}

static void check_verify(const char *out) {
    cmf_verify_report r = {0};
    cmf_error err = {0};
    cmf_status st = cmf_verify(out, &r, &err);
    CHECK(st == CMF_OK && r.n_problems == 0, "%s: verify: %s %s", out, st ? err.msg : "",
          r.n_problems ? r.problems[0] : "");
    cmf_verify_report_free(&r);
}

static void check_arch(const char *folder, const char *out) {
    cmf_file *f = NULL;
    cmf_error err = {0};
    if (cmf_file_open(out, &f, &err) != CMF_OK) return;
    CHECK(anum(f, "num_layers") == 3 && anum(f, "hidden_size") == 64 && anum(f, "vocab_size") == 512 &&
          anum(f, "num_kv_heads") == 2, "%s: arch shapes", folder);
    const cJSON *a = arch_of(f);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(a, "layer_types");
    CHECK(cJSON_GetArraySize(lt) == 3, "%s: layer_types", folder);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "tokenizer_config");
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(tc, "eos_token_ids")) == 1, "%s: eos ids", folder);
    const char *style = cJSON_GetObjectItemCaseSensitive(a, "norm_style")->valuestring;
    if (strncmp(folder, "gemma", 5) == 0) {
        CHECK(strcmp(style, "gemma") == 0, "%s: norm_style", folder);
        CHECK(fabs(anum(f, "embedding_multiplier") - 8.0) < 1e-9, "%s: embedding_multiplier", folder);
        CHECK(strcmp(cJSON_GetObjectItemCaseSensitive(a, "hidden_act")->valuestring, "gelu_pytorch_tanh") == 0,
              "%s: act", folder);
        CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "tie_word_embeddings")), "%s: tied", folder);
    } else {
        CHECK(strcmp(style, "qwen") == 0, "%s: norm_style", folder);
    }
    if (strcmp(folder, "gemma2") == 0) {
        CHECK(anum(f, "attn_logit_softcapping") == 50 && anum(f, "final_logit_softcapping") == 30 &&
              anum(f, "query_pre_attn_scalar") == 16 && anum(f, "sliding_window") == 8, "gemma2 keys");
        CHECK(strcmp(cJSON_GetArrayItem(lt, 0)->valuestring, "SlidingAttention") == 0 &&
              strcmp(cJSON_GetArrayItem(lt, 1)->valuestring, "FullAttention") == 0, "gemma2 layer_types");
    }
    if (strcmp(folder, "mistral-sliding") == 0)
        CHECK(anum(f, "sliding_window") == 8 &&
              strcmp(cJSON_GetArrayItem(lt, 2)->valuestring, "SlidingAttention") == 0, "mistral sliding");
    if (strcmp(folder, "qwen3") == 0) CHECK(anum(f, "head_dim") == 32, "qwen3 head_dim");
    if (strcmp(folder, "qwen2") == 0) CHECK(anum(f, "rope_theta") == 1e6, "qwen2 rope_theta");
    if (strcmp(folder, "llama-tied") == 0)
        CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "tie_word_embeddings")) && !cmf_file_find(f, "lm_head.weight"),
              "llama-tied tie");
    if (strcmp(folder, "qwen3-moe") == 0) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(a, "moe");
        CHECK(cJSON_GetObjectItemCaseSensitive(m, "num_experts") &&
              cJSON_GetObjectItemCaseSensitive(m, "num_experts")->valuedouble == 8 &&
              cJSON_GetObjectItemCaseSensitive(m, "top_k")->valuedouble == 2 &&
              cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "norm_topk_prob")), "moe");
    }
    if (strcmp(folder, "phi3") == 0)
        CHECK(cmf_file_find(f, "model.layers.0.self_attn.qkv_proj.weight") &&
              cmf_file_find(f, "model.layers.0.mlp.gate_up_proj.weight"), "phi3 fused tensors kept");
    CHECK(cmf_file_tokenizer_json(f, &(size_t){0}) == NULL, "%s: no tokenizer expected", folder);
    cmf_file_close(f);
}

/* A sharded copy of parity/llama (two shards + index) converts to the same tensors. */
static void test_sharded(const char *data, const char *tmp) {
    char src[4200], dir[4200], p[4400];
    snprintf(src, sizeof src, "%s/parity/llama/model.safetensors", data);
    snprintf(dir, sizeof dir, "%s/sharded", tmp);
    mkdir(dir, 0755);
    cmf_st_file *s = NULL;
    cmf_error err = {0};

    if (cmf_st_open(src, &s, &err) != CMF_OK) { CHECK(0, "%s", err.msg); return; }
    size_t n = cmf_st_count(s), half = n / 2;
    st_entry *e = calloc(n, sizeof *e);
    cJSON *idx = cJSON_CreateObject(), *wm = cJSON_AddObjectToObject(idx, "weight_map");
    for (size_t i = 0; i < n; i++) {
        const cmf_st_tensor *t = cmf_st_at(s, i);
        e[i] = (st_entry){t->name, t->dtype == CMF_ST_F32 ? "F32" : t->dtype == CMF_ST_F16 ? "F16" : "BF16", t->ndim,
                          {t->shape[0], t->ndim > 1 ? t->shape[1] : 0}, t->data, t->nbytes};
        cJSON_AddStringToObject(wm, t->name, i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
    }
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    CHECK(write_safetensors(p, e, half) == 0, "write shard 1");
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    CHECK(write_safetensors(p, e + half, n - half) == 0, "write shard 2");
    char *js = cJSON_Print(idx);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_text(p, js);
    free(js);
    cJSON_Delete(idx);
    free(e);
    cmf_st_close(s);
    /* Side files: config, generation_config with two EOS, template, tokenizer. */
    char cfg[4200], *text;
    size_t len;
    snprintf(cfg, sizeof cfg, "%s/parity/llama/config.json", data);
    if (cmf_read_file(cfg, &text, &len, &err) == CMF_OK) {
        snprintf(p, sizeof p, "%s/config.json", dir);
        write_text(p, text);
        free(text);
    }
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    write_text(p, "{\"bos_token_id\": 1, \"eos_token_id\": [2, 7]}");
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    write_text(p, "{% for m in messages %}{{ m.content }}{% endfor %}");
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_text(p, "{\"add_bos_token\": true, \"eos_token\": \"</s>\", \"chat_template\": \"ignored\"}");
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    const char *tokjs = "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":9,\"content\":\"</s>\"}],"
                        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"d\":3,"
                        "\"e\":4,\"f\":5,\"g\":6,\"h\":7,\"i\":8},\"merges\":[]}}";
    write_text(p, tokjs);

    char out_a[4400], out_b[4400];
    snprintf(out_a, sizeof out_a, "%s/sharded.cmf", tmp);
    snprintf(out_b, sizeof out_b, "%s/single.cmf", tmp);
    cmf_import_opts o = {.quant = "f32"};
    char single_dir[4200];
    snprintf(single_dir, sizeof single_dir, "%s/parity/llama", data);
    CHECK(cmf_convert_hf(dir, out_a, &o, &err) == CMF_OK, "sharded convert: %s", err.msg);
    CHECK(cmf_convert_hf(single_dir, out_b, &o, &err) == CMF_OK, "single convert: %s", err.msg);
    CHECK(compare_cmf(out_a, out_b, 0.0f) == 0, "sharded != single");
    cmf_file *f = NULL;
    if (cmf_file_open(out_a, &f, &err) == CMF_OK) {
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "tokenizer_config");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(tc, "eos_token_ids");
        CHECK(cJSON_GetArraySize(ids) == 3 && cJSON_GetArrayItem(ids, 0)->valuedouble == 2 &&
              cJSON_GetArrayItem(ids, 1)->valuedouble == 7 && cJSON_GetArrayItem(ids, 2)->valuedouble == 9,
              "eos ids merged: %s", cJSON_PrintUnformatted(ids));
        const char *tmpl = cmf_file_chat_template(f);
        CHECK(tmpl && strstr(tmpl, "m.content"), "chat_template.jinja wins");
        size_t tl = 0;
        const char *tj = cmf_file_tokenizer_json(f, &tl);
        CHECK(tj && tl == strlen(tokjs) && memcmp(tj, tokjs, tl) == 0, "tokenizer stored verbatim");
        CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token")), "add_bos_token");
        cmf_file_close(f);
    }
    /* A tokenizer.json the runtime cannot load fails the conversion, leaving no output. */
    {
        char bad_out[4400];
        snprintf(bad_out, sizeof bad_out, "%s/badtok.cmf", tmp);
        write_text(p, "{\"model\":");
        CHECK(cmf_convert_hf(dir, bad_out, &o, &err) != CMF_OK && strstr(err.msg, "tokenizer.json"),
              "broken tokenizer.json must fail naming it: %s", err.msg);
        CHECK(access(bad_out, F_OK) != 0, "no output after a failed convert");
        write_text(p, tokjs);
    }
    /* Shard-split output: a small --shard-max-gb gives several files that open as one. */
    char out_c[4400];
    snprintf(out_c, sizeof out_c, "%s/split.cmf", tmp);
    cmf_import_opts os = {.quant = "f32", .shard_max_gb = 0.0005};
    cmf_status st = cmf_convert_hf(single_dir, out_c, &os, &err);
    CHECK(st == CMF_OK, "shard-max-gb convert: %s", err.msg);
    char *first = cmf_shard_first_path(out_c);
    snprintf(out_c, sizeof out_c, "%s/split-00001-of-00002.cmf", tmp);
    CHECK(first && !strcmp(first, out_c), "cmf_shard_first_path: %s, expected %s", first ? first : "NULL", out_c);
    free(first);
    char none[4400];
    snprintf(none, sizeof none, "%s/never-written.cmf", tmp);
    first = cmf_shard_first_path(none);
    CHECK(first == NULL, "cmf_shard_first_path of an unwritten path: %s", first ? first : "");
    free(first);
    CHECK(compare_cmf(out_c, out_b, 0.0f) == 0, "2-shard output differs from single file");
    check_verify(out_c);
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("shared data absent");
    const char *tmp = test_tmp_dir("convert");
    bool quick = getenv("CMF_TEST_QUICK") != NULL;
    for (size_t i = 0; i < sizeof folders / sizeof *folders; i++)
        for (size_t k = 0; k < sizeof quants / sizeof *quants; k++) {
            char dir[4200], src[4300], out[4400];
            snprintf(dir, sizeof dir, "%s/parity/%s", data, folders[i]);
            snprintf(src, sizeof src, "%s/model.safetensors", dir);
            snprintf(out, sizeof out, "%s/%s-%s.cmf", tmp, folders[i], quants[k]);
            cmf_import_opts o = {.quant = quants[k]};
            cmf_error err = {0};
            cmf_status st = cmf_convert_hf(dir, out, &o, &err);
            CHECK(st == CMF_OK, "%s --quant %s: %s", folders[i], quants[k], err.msg);
            if (st != CMF_OK) continue;
            check_verify(out);
            if (!quick || k == 0 || k == 3) check_against_source(src, out, quants[k]);
            if (k == 0) check_arch(folders[i], out);
            unlink(out);
        }
    test_sharded(data, tmp);
    return test_done();
}
