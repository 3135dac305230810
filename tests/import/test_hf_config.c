/*
 * test_hf_config.c — config.json -> header.arch for the architectures the
 * parity folders do not cover and for both rope spellings: transformers 4
 * (rope_theta + rope_scaling with "type") and 5 (rope_parameters, per layer
 * type for gemma3), llama3/yarn scaling, gemma3 sliding pattern and local
 * base, granite multipliers, qwen2 use_sliding_window, phi3 partial rotary,
 * rope_scaling beside rope_parameters (transformers 5 takes rope_scaling),
 * longrope (supported) and dynamic (refused here, not at run time), and
 * the errors for unknown model_type, missing keys and values outside their
 * domain (rms_norm_eps <= 0, rope_theta <= 0, an odd rotary dim).
 */
#include "import/import_internal.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>

static cJSON *arch_of(const char *json, cmf_imp_hf_info *info, cmf_error *err) {
    cJSON *cfg = cJSON_Parse(json), *arch = NULL;
    if (!cfg) return NULL;
    cmf_status st = cmf_imp_hf_arch(cfg, "config.json", &arch, info, err);
    cJSON_Delete(cfg);
    return st == CMF_OK ? arch : NULL;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}
static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

#define BASE "\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":6,\"num_attention_heads\":4,\"vocab_size\":100"

int main(void) {
    cmf_imp_hf_info in;
    cmf_error err = {0};
    /* transformers 4: rope_theta + rope_scaling {"type": "linear"} */
    cJSON *a = arch_of("{\"model_type\":\"llama\"," BASE ",\"rope_theta\":500000,"
                       "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}", &in, &err);
    CHECK(a, "llama4: %s", err.msg);
    if (a) {
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(a, "rope_scaling");
        CHECK(num(a, "rope_theta") == 500000 && !strcmp(str(rs, "rope_type"), "linear") && num(rs, "factor") == 2,
              "rope_scaling normalised");
        CHECK(!cJSON_GetObjectItemCaseSensitive(rs, "type"), "old 'type' key dropped");
        CHECK(num(a, "num_kv_heads") == 4 && num(a, "head_dim") == 16, "kv/head_dim defaults");
        CHECK(!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "tie_word_embeddings")), "llama untied by default");
        cJSON_Delete(a);
    }
    /* transformers 5: rope_parameters with llama3 scaling */
    a = arch_of("{\"model_type\":\"llama\"," BASE ",\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000,"
                "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}",
                &in, &err);
    CHECK(a, "llama5: %s", err.msg);
    if (a) {
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(a, "rope_scaling");
        CHECK(num(a, "rope_theta") == 500000 && !strcmp(str(rs, "rope_type"), "llama3") && num(rs, "high_freq_factor") == 4 &&
              num(rs, "original_max_position_embeddings") == 8192, "llama3 rope_parameters");
        cJSON_Delete(a);
    }
    /* yarn: also the format's optional `yarn` key */
    a = arch_of("{\"model_type\":\"qwen3\"," BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
                "\"original_max_position_embeddings\":32768}}", &in, &err);
    CHECK(a && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(a, "yarn")), "yarn: %s", err.msg);
    cJSON_Delete(a);
    /* gemma3_text, transformers 5 per-layer-type rope, pattern 6 */
    a = arch_of("{\"model_type\":\"gemma3_text\"," BASE ",\"head_dim\":32,\"num_key_value_heads\":1,\"sliding_window\":512,"
                "\"query_pre_attn_scalar\":32,\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"linear\",\"factor\":8.0,"
                "\"rope_theta\":1000000},\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":10000}}}", &in, &err);
    CHECK(a, "gemma3: %s", err.msg);
    if (a) {
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(a, "layer_types");
        CHECK(num(a, "rope_theta") == 1e6 && num(a, "rope_local_base_freq") == 10000, "gemma3 rope bases");
        CHECK(!strcmp(str(cJSON_GetObjectItemCaseSensitive(a, "rope_scaling"), "rope_type"), "linear"), "gemma3 global scaling");
        CHECK(!strcmp(cJSON_GetArrayItem(lt, 0)->valuestring, "SlidingAttention") &&
              !strcmp(cJSON_GetArrayItem(lt, 5)->valuestring, "FullAttention"), "gemma3 pattern");
        CHECK(!strcmp(str(a, "norm_style"), "gemma") && fabs(num(a, "embedding_multiplier") - 8.0) < 1e-9 &&
              num(a, "query_pre_attn_scalar") == 32 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "tie_word_embeddings")),
              "gemma3 keys");
        cJSON_Delete(a);
    }
    /* gemma3 multimodal wrapper: text_config is used */
    a = arch_of("{\"model_type\":\"gemma3\",\"text_config\":{\"model_type\":\"gemma3_text\"," BASE ",\"sliding_window\":4}}", &in, &err);
    CHECK(a && !strcmp(str(a, "arch_name"), "gemma3_text") && num(a, "hidden_size") == 64, "gemma3 text_config: %s", err.msg);
    cJSON_Delete(a);
    /* granite multipliers */
    a = arch_of("{\"model_type\":\"granite\"," BASE ",\"embedding_multiplier\":12.0,\"attention_multiplier\":0.015625,"
                "\"residual_multiplier\":0.22,\"logits_scaling\":8.0}", &in, &err);
    CHECK(a && num(a, "embedding_multiplier") == 12 && num(a, "attention_multiplier") == 0.015625 &&
          num(a, "residual_multiplier") == 0.22 && num(a, "logits_scaling") == 8, "granite: %s", err.msg);
    cJSON_Delete(a);
    /* qwen2: sliding only with use_sliding_window, from max_window_layers on */
    a = arch_of("{\"model_type\":\"qwen2\"," BASE ",\"sliding_window\":4096,\"use_sliding_window\":false}", &in, &err);
    CHECK(a && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(a, "sliding_window")) &&
          cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "attention_bias")), "qwen2 no sliding");
    cJSON_Delete(a);
    a = arch_of("{\"model_type\":\"qwen2\"," BASE ",\"sliding_window\":16,\"use_sliding_window\":true,\"max_window_layers\":4}", &in, &err);
    const cJSON *lt = a ? cJSON_GetObjectItemCaseSensitive(a, "layer_types") : NULL;
    CHECK(lt && !strcmp(cJSON_GetArrayItem(lt, 3)->valuestring, "FullAttention") &&
          !strcmp(cJSON_GetArrayItem(lt, 4)->valuestring, "SlidingAttention"), "qwen2 max_window_layers");
    cJSON_Delete(a);
    /* phi3 partial rotary (transformers 4 spelling), olmo2 accepted */
    a = arch_of("{\"model_type\":\"phi3\"," BASE ",\"partial_rotary_factor\":0.5,\"original_max_position_embeddings\":4096}", &in, &err);
    CHECK(a && num(a, "partial_rotary_factor") == 0.5 && num(a, "original_max_position_embeddings") == 4096, "phi3");
    cJSON_Delete(a);
    a = arch_of("{\"model_type\":\"olmo2\"," BASE "}", &in, &err);
    CHECK(a && !strcmp(str(a, "arch_name"), "olmo2"), "olmo2: %s", err.msg);
    cJSON_Delete(a);
    /* rope_scaling and rope_parameters both: transformers 5 takes rope_scaling
     * (`rope_scaling or rope_parameters`), rope_theta from the top level */
    a = arch_of("{\"model_type\":\"llama\"," BASE ",\"rope_theta\":500000,\"rope_parameters\":{\"rope_type\":\"default\","
                "\"rope_theta\":1000000},\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}", &in, &err);
    CHECK(a, "both rope spellings: %s", err.msg);
    if (a) {
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(a, "rope_scaling");
        CHECK(!strcmp(str(rs, "rope_type"), "linear") && num(rs, "factor") == 2 && num(a, "rope_theta") == 500000,
              "rope_scaling wins over rope_parameters: %s, theta %g", str(rs, "rope_type"), num(a, "rope_theta"));
        cJSON_Delete(a);
    }
    /* an empty rope_scaling does not hide rope_parameters */
    a = arch_of("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{},\"rope_parameters\":{\"rope_type\":\"linear\","
                "\"factor\":4.0,\"rope_theta\":1000000}}", &in, &err);
    CHECK(a && num(cJSON_GetObjectItemCaseSensitive(a, "rope_scaling"), "factor") == 4 && num(a, "rope_theta") == 1e6,
          "empty rope_scaling: %s", err.msg);
    cJSON_Delete(a);
    /* Phi-3.5 longrope: supported; the top-level original_max_position_embeddings
     * goes into the rope object (transformers' standardize_rope_params) */
#define FACT8 "[1.0,1.1,1.2,1.3,1.4,1.5,1.6,1.7]"
    a = arch_of("{\"model_type\":\"phi3\"," BASE ",\"max_position_embeddings\":131072,"
                "\"original_max_position_embeddings\":4096,\"rope_scaling\":{\"type\":\"longrope\","
                "\"short_factor\":" FACT8 ",\"long_factor\":" FACT8 ",\"original_max_position_embeddings\":2048}}",
                &in, &err);
    CHECK(a, "longrope: %s", err.msg);
    if (a) {
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(a, "rope_scaling");
        CHECK(!strcmp(str(rs, "rope_type"), "longrope") && num(rs, "original_max_position_embeddings") == 4096 &&
              cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(rs, "long_factor")) == 8,
              "longrope object: original %g", num(rs, "original_max_position_embeddings"));
        cJSON_Delete(a);
    }
    /* yarn without it: max_position_embeddings */
    a = arch_of("{\"model_type\":\"qwen2\"," BASE ",\"max_position_embeddings\":32768,"
                "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}}", &in, &err);
    CHECK(a && num(cJSON_GetObjectItemCaseSensitive(a, "rope_scaling"), "original_max_position_embeddings") == 32768,
          "yarn original defaults to max_position_embeddings: %s", err.msg);
    cJSON_Delete(a);
    /* refused at convert time, naming config.json and the key */
    struct { const char *json; cmf_status st; const char *needle; } bad[] = {
        {"\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2.0}", CMF_ERR_UNSUPPORTED, "rope_type \"dynamic\""},
        {"\"rope_parameters\":{\"rope_type\":\"dynamic\",\"factor\":2.0}", CMF_ERR_UNSUPPORTED, "dynamic"},
        {"\"rope_scaling\":{\"type\":\"spiral\",\"factor\":2.0}", CMF_ERR_UNSUPPORTED, "\"spiral\""},
        {"\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1],\"long_factor\":" FACT8 "}", CMF_ERR_FORMAT,
         "rope_scaling.short_factor"},
        {"\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":" FACT8 ",\"long_factor\":[1,1,1,1,1,1,1,-1]}",
         CMF_ERR_FORMAT, "rope_scaling.long_factor"},
        {"\"rope_scaling\":{\"type\":\"linear\",\"factor\":0}", CMF_ERR_FORMAT, "rope_scaling.factor"},
        {"\"rms_norm_eps\":0", CMF_ERR_FORMAT, "rms_norm_eps"},
        {"\"rms_norm_eps\":-1e-6", CMF_ERR_FORMAT, "rms_norm_eps"},
        {"\"rms_norm_eps\":\"1e-6\"", CMF_ERR_FORMAT, "rms_norm_eps"},
        {"\"rope_theta\":-10000", CMF_ERR_FORMAT, "rope_theta"},
        {"\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":0}", CMF_ERR_FORMAT, "rope_theta"},
        {"\"head_dim\":15", CMF_ERR_FORMAT, "head_dim 15"},
        {"\"partial_rotary_factor\":0", CMF_ERR_FORMAT, "partial_rotary_factor"},
        {"\"max_position_embeddings\":-5", CMF_ERR_FORMAT, "max_position_embeddings"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char js[1024];
        snprintf(js, sizeof js, "{\"model_type\":\"llama\"," BASE ",%s}", bad[i].json);
        memset(&err, 0, sizeof err);
        a = arch_of(js, &in, &err);
        CHECK(!a && err.status == bad[i].st && strstr(err.msg, bad[i].needle) && strstr(err.msg, "config.json"),
              "%s: %s \"%s\" (want %s naming \"%s\")", bad[i].json, cmf_status_name(err.status), err.msg,
              cmf_status_name(bad[i].st), bad[i].needle);
        cJSON_Delete(a);
    }
    /* errors */
    a = arch_of("{\"model_type\":\"bloom\"," BASE "}", &in, &err);
    CHECK(!a && err.status == CMF_ERR_UNSUPPORTED && strstr(err.msg, "bloom") && strstr(err.msg, "config.json"), "unknown type: %s", err.msg);
    a = arch_of("{\"model_type\":\"llama\",\"hidden_size\":64}", &in, &err);
    CHECK(!a && strstr(err.msg, "intermediate_size"), "missing key: %s", err.msg);
    a = arch_of("{\"model_type\":\"llama\"," BASE ",\"num_key_value_heads\":3}", &in, &err);
    CHECK(!a && strstr(err.msg, "num_key_value_heads"), "bad kv heads: %s", err.msg);
    a = arch_of("{\"model_type\":\"llama\",\"hidden_size\":-3,\"intermediate_size\":128,\"num_hidden_layers\":6,"
                "\"num_attention_heads\":4,\"vocab_size\":100}", &in, &err);
    CHECK(!a && strstr(err.msg, "hidden_size"), "negative: %s", err.msg);
    a = arch_of("{\"model_type\":\"qwen3_moe\"," BASE "}", &in, &err);
    CHECK(!a && strstr(err.msg, "num_local_experts"), "moe keys: %s", err.msg);
    /* 2^32 + 2 experts used to become 2 (uint32 truncation) */
    a = arch_of("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4294967298,\"num_experts_per_tok\":2,"
                "\"moe_intermediate_size\":32}", &in, &err);
    CHECK(!a && strstr(err.msg, "num_experts") && strstr(err.msg, "4294967298"), "huge num_experts: %s", err.msg);
    a = arch_of("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":8,"
                "\"moe_intermediate_size\":32}", &in, &err);
    CHECK(!a && strstr(err.msg, "num_experts_per_tok"), "top-k > experts: %s", err.msg);
    return test_done();
}
