/*
 * hf_config.c — Hugging Face config.json to header.arch (docs/ARCH_KEYS.md)
 * and the stop/special-token ids to header.tokenizer_config. Accepts both
 * the transformers 4.x spellings (rope_theta, rope_scaling) and the
 * transformers 5 one (rope_parameters, possibly per layer type as in
 * gemma3). Semantics per architecture follow the transformers modeling
 * code: gemma's embedding scale sqrt(hidden) in the activation dtype,
 * gemma2's softcaps and query_pre_attn_scalar, gemma3's local RoPE base and
 * sliding pattern, phi3's partial rotary, granite's multipliers.
 */
#include "import/import_internal.h"
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

typedef struct cfgctx {
    const cJSON *cfg;
    const char *path;
    cmf_error *err;
} cfgctx;

static const cJSON *get(const cfgctx *c, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->cfg, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A required non-negative integer. */
static bool req_uint(const cfgctx *c, const char *key, uint64_t *out) {
    const cJSON *v = get(c, key);
    if (!v) {
        cmf_error_set(c->err, CMF_ERR_FORMAT, "%s: missing key '%s'", c->path, key);
        return false;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e12 ||
        v->valuedouble != floor(v->valuedouble)) {
        cmf_error_set(c->err, CMF_ERR_FORMAT, "%s: '%s' must be a positive integer", c->path, key);
        return false;
    }
    *out = (uint64_t)v->valuedouble;
    return true;
}

static double num_or(const cfgctx *c, const char *key, double dflt) {
    const cJSON *v = get(c, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* An optional number: false (error set) when present but not a number. */
static bool opt_num(const cfgctx *c, const char *key) {
    const cJSON *v = get(c, key);
    if (!v || cJSON_IsNumber(v)) return true;
    cmf_error_set(c->err, CMF_ERR_FORMAT, "%s: '%s' must be a number", c->path, key);
    return false;
}

static bool add_num(cJSON *o, const char *k, double v) { return cJSON_AddNumberToObject(o, k, v) != NULL; }

/* Copy key from cfg to arch as-is (number / null). */
static bool copy_num_or_null(const cfgctx *c, cJSON *arch, const char *from, const char *to) {
    const cJSON *v = get(c, from);
    if (cJSON_IsNumber(v)) return add_num(arch, to, v->valuedouble);
    return cJSON_AddNullToObject(arch, to) != NULL;
}

static const char *const known_types[] = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe",
                                          "gemma", "gemma2", "gemma3_text", "phi3", "olmo2",
                                          "granite"};

/* The rope object in use, as transformers 5 picks it
 * (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict:
 * `rope_parameters = rope_scaling or rope_parameters`): rope_scaling when
 * it is a non-empty object (transformers 4 reads only that one), else
 * rope_parameters (for gemma3 a per-layer-type map whose "full_attention"
 * entry is the global one; *local receives the sliding layers' entry).
 * Keys the object lacks come from the top level (rope_theta,
 * partial_rotary_factor: see cmf_imp_hf_arch). */
static const cJSON *rope_obj(const cfgctx *c, const cJSON **local) {
    *local = NULL;
    const cJSON *rs = get(c, "rope_scaling");
    if (cJSON_IsObject(rs) && rs->child) return rs;
    const cJSON *rp = get(c, "rope_parameters");
    if (cJSON_IsObject(rp)) {
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        if (cJSON_IsObject(full)) {
            *local = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
            return full;
        }
        return rp;
    }
    return NULL;
}

static const char *rope_type_of(const cJSON *r) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "rope_type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(r, "type");
    return cJSON_IsString(t) ? t->valuestring : "default";
}

cmf_status cmf_imp_hf_arch(const cJSON *cfg_in, const char *path, cJSON **arch_out,
                           cmf_imp_hf_info *info, cmf_error *err) {
    *arch_out = NULL;
    memset(info, 0, sizeof *info);
    cfgctx c = {cfg_in, path, err};
    const cJSON *mt = get(&c, "model_type");
    if (!cJSON_IsString(mt)) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: missing key 'model_type'", path);
    const char *type = mt->valuestring;
    /* gemma3 multimodal: the language model's config is text_config. */
    if (strcmp(type, "gemma3") == 0) {
        const cJSON *tc = get(&c, "text_config");
        if (cJSON_IsObject(tc)) c.cfg = tc;
        type = "gemma3_text";
    }
    bool known = false;
    for (size_t i = 0; i < sizeof known_types / sizeof *known_types; i++)
        if (strcmp(type, known_types[i]) == 0) known = true;
    if (!known)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                             "%s: model_type '%.64s' is not supported (llama, mistral, qwen2, qwen3, "
                             "qwen3_moe, gemma, gemma2, gemma3, gemma3_text, phi3, olmo2, granite)",
                             path, type);
    snprintf(info->model_type, sizeof info->model_type, "%s", type);
    bool gemma = strncmp(type, "gemma", 5) == 0;
    bool gemma2 = strcmp(type, "gemma2") == 0, gemma3 = strcmp(type, "gemma3_text") == 0;
    info->gemma_norm = gemma;

    uint64_t hidden, inter, layers, heads, kv, vocab, head_dim;
    if (!req_uint(&c, "hidden_size", &hidden) || !req_uint(&c, "intermediate_size", &inter) ||
        !req_uint(&c, "num_hidden_layers", &layers) || !req_uint(&c, "num_attention_heads", &heads) ||
        !req_uint(&c, "vocab_size", &vocab))
        return err->status;
    if (get(&c, "num_key_value_heads")) {
        if (!req_uint(&c, "num_key_value_heads", &kv)) return err->status;
    } else {
        kv = heads;
    }
    if (get(&c, "head_dim")) {
        if (!req_uint(&c, "head_dim", &head_dim)) return err->status;
    } else {
        if (hidden % heads)
            return cmf_error_set(err, CMF_ERR_FORMAT,
                                 "%s: hidden_size %llu is not a multiple of num_attention_heads %llu "
                                 "and head_dim is absent",
                                 path, (unsigned long long)hidden, (unsigned long long)heads);
        head_dim = hidden / heads;
    }
    if (heads % kv)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: num_attention_heads %llu is not a multiple of num_key_value_heads %llu",
                             path, (unsigned long long)heads, (unsigned long long)kv);
    if (layers > 100000 || heads > 100000 || head_dim > 100000)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: num_hidden_layers/heads/head_dim absurdly large", path);
    if (!opt_num(&c, "rms_norm_eps") || !opt_num(&c, "rope_theta") || !opt_num(&c, "partial_rotary_factor"))
        return err->status;
    info->hidden = hidden;
    info->intermediate = inter;
    info->n_layers = (uint32_t)layers;
    info->n_heads = (uint32_t)heads;
    info->n_kv_heads = (uint32_t)kv;
    info->head_dim = (uint32_t)head_dim;
    info->vocab = vocab;

    cJSON *a = cJSON_CreateObject();
    if (!a) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
    bool ok = cJSON_AddStringToObject(a, "arch_name", type) && add_num(a, "hidden_size", (double)hidden) &&
              add_num(a, "intermediate_size", (double)inter) && add_num(a, "num_layers", (double)layers) &&
              add_num(a, "num_attention_heads", (double)heads) && add_num(a, "num_kv_heads", (double)kv) &&
              add_num(a, "head_dim", (double)head_dim) && add_num(a, "vocab_size", (double)vocab) &&
              add_num(a, "rms_norm_eps", num_or(&c, "rms_norm_eps", 1e-6)) &&
              cJSON_AddStringToObject(a, "norm_style", gemma ? "gemma" : "qwen") &&
              cJSON_AddStringToObject(a, "rope_layout", "neox");

    /* RoPE: theta, scaling object (rope_type normalised), local base. */
    const cJSON *local = NULL, *rope = rope_obj(&c, &local);
    double theta = num_or(&c, "rope_theta", 10000.0);
    if (rope && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(rope, "rope_theta")))
        theta = cJSON_GetObjectItemCaseSensitive(rope, "rope_theta")->valuedouble;
    ok = ok && add_num(a, "rope_theta", theta);
    const char *rtype = rope ? rope_type_of(rope) : "default";
    if (rope && strcmp(rtype, "default") != 0) {
        cJSON *rs = cJSON_Duplicate(rope, 1);
        ok = ok && rs;
        if (rs) {
            cJSON_DeleteItemFromObjectCaseSensitive(rs, "type");
            cJSON_DeleteItemFromObjectCaseSensitive(rs, "rope_type");
            ok = ok && cJSON_AddStringToObject(rs, "rope_type", rtype);
            /* transformers' standardize_rope_params: for llama3 / yarn /
             * longrope the pre-extension context is the top-level
             * original_max_position_embeddings when the config has one (Phi3
             * keeps it there; it wins), else the object's, else
             * max_position_embeddings. */
            const cJSON *oc = get(&c, "original_max_position_embeddings"), *mp = get(&c, "max_position_embeddings");
            const char *omp = "original_max_position_embeddings";
            if (strcmp(rtype, "llama3") == 0 || strcmp(rtype, "yarn") == 0 || strcmp(rtype, "longrope") == 0) {
                if (cJSON_IsNumber(oc)) {
                    cJSON_DeleteItemFromObjectCaseSensitive(rs, omp);
                    ok = ok && add_num(rs, omp, oc->valuedouble);
                } else if (!cJSON_GetObjectItemCaseSensitive(rs, omp) && cJSON_IsNumber(mp)) {
                    ok = ok && add_num(rs, omp, mp->valuedouble);
                }
            }
            cJSON_AddItemToObject(a, "rope_scaling", rs);
        }
        if (strcmp(rtype, "yarn") == 0 && rs) ok = ok && cJSON_AddItemToObject(a, "yarn", cJSON_Duplicate(rs, 1));
    } else {
        ok = ok && cJSON_AddNullToObject(a, "rope_scaling");
    }
    double prf = num_or(&c, "partial_rotary_factor", 1.0);
    if (rope && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(rope, "partial_rotary_factor")))
        prf = cJSON_GetObjectItemCaseSensitive(rope, "partial_rotary_factor")->valuedouble;
    ok = ok && add_num(a, "partial_rotary_factor", prf);
    if (gemma3) {
        double lb = num_or(&c, "rope_local_base_freq", 10000.0);
        if (local && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(local, "rope_theta")))
            lb = cJSON_GetObjectItemCaseSensitive(local, "rope_theta")->valuedouble;
        ok = ok && add_num(a, "rope_local_base_freq", lb);
    }
    if (get(&c, "original_max_position_embeddings"))
        ok = ok && copy_num_or_null(&c, a, "original_max_position_embeddings", "original_max_position_embeddings");

    /* Sliding window and per-layer attention types. */
    const cJSON *sw = get(&c, "sliding_window");
    bool use_sw = cJSON_IsNumber(sw) && sw->valuedouble > 0;
    if (strcmp(type, "qwen2") == 0 || strcmp(type, "qwen3") == 0 || strcmp(type, "qwen3_moe") == 0)
        use_sw = use_sw && cJSON_IsTrue(get(&c, "use_sliding_window"));
    ok = ok && (use_sw ? add_num(a, "sliding_window", sw->valuedouble)
                       : cJSON_AddNullToObject(a, "sliding_window") != NULL);
    cJSON *lt = cJSON_CreateArray();
    ok = ok && lt;
    if (lt) cJSON_AddItemToObject(a, "layer_types", lt);
    const cJSON *cfg_lt = get(&c, "layer_types");
    double pattern = num_or(&c, "sliding_window_pattern", gemma3 ? 6 : 0);
    double max_window_layers = num_or(&c, "max_window_layers", 0);
    for (uint64_t i = 0; ok && i < layers; i++) {
        bool sliding = false;
        if (cJSON_IsArray(cfg_lt)) {
            const cJSON *e = cJSON_GetArrayItem(cfg_lt, (int)i);
            if (!cJSON_IsString(e)) {
                cJSON_Delete(a);
                return cmf_error_set(err, CMF_ERR_FORMAT, "%s: layer_types[%llu] missing or not a string",
                                     path, (unsigned long long)i);
            }
            sliding = strcmp(e->valuestring, "sliding_attention") == 0;
        } else if (!use_sw) {
            sliding = false;
        } else if (gemma2) {
            sliding = i % 2 == 0;
        } else if (gemma3) {
            sliding = pattern > 0 ? (i + 1) % (uint64_t)pattern != 0 : true;
        } else if (strncmp(type, "qwen", 4) == 0) {
            sliding = (double)i >= max_window_layers;
        } else {
            sliding = true;
        }
        ok = ok && cJSON_AddItemToArray(lt, cJSON_CreateString(sliding ? "SlidingAttention" : "FullAttention"));
    }
    if (gemma3 && pattern > 0) ok = ok && add_num(a, "sliding_window_pattern", pattern);

    /* Embeddings and misc. */
    const cJSON *tie = get(&c, "tie_word_embeddings");
    if (!tie) tie = cJSON_GetObjectItemCaseSensitive(cfg_in, "tie_word_embeddings");
    info->tie = tie ? cJSON_IsTrue(tie) : gemma;
    ok = ok && cJSON_AddBoolToObject(a, "tie_word_embeddings", info->tie);
    ok = ok && copy_num_or_null(&c, a, "max_position_embeddings", "max_position_embeddings");

    /* Activation: gemma's hidden_activation wins; gemma "gelu" is the tanh
     * approximation in the reference code. */
    const cJSON *act = get(&c, "hidden_activation");
    if (!cJSON_IsString(act)) act = get(&c, "hidden_act");
    const char *act_s = cJSON_IsString(act) ? act->valuestring : (gemma ? "gelu_pytorch_tanh" : "silu");
    if (gemma && strcmp(act_s, "gelu") == 0) act_s = "gelu_pytorch_tanh";
    if (strcmp(act_s, "silu") != 0 && strcmp(act_s, "swish") != 0 && strcmp(act_s, "gelu") != 0 &&
        strcmp(act_s, "gelu_pytorch_tanh") != 0 && strcmp(act_s, "gelu_new") != 0) {
        cJSON_Delete(a);
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: hidden_act '%.32s' is not supported", path, act_s);
    }
    if (strcmp(act_s, "swish") == 0) act_s = "silu";
    if (strcmp(act_s, "gelu_new") == 0) act_s = "gelu_pytorch_tanh";
    ok = ok && cJSON_AddStringToObject(a, "hidden_act", act_s);

    /* Attention scale, softcaps, multipliers. */
    ok = ok && copy_num_or_null(&c, a, "attn_logit_softcapping", "attn_logit_softcapping");
    ok = ok && copy_num_or_null(&c, a, "final_logit_softcapping", "final_logit_softcapping");
    ok = ok && copy_num_or_null(&c, a, "query_pre_attn_scalar", "query_pre_attn_scalar");
    if (gemma) {
        /* HF: normalizer = tensor(hidden_size ** 0.5, dtype=activation dtype). */
        ok = ok && add_num(a, "embedding_multiplier", (double)(float)sqrt((double)hidden));
    } else if (strcmp(type, "granite") == 0) {
        ok = ok && add_num(a, "embedding_multiplier", num_or(&c, "embedding_multiplier", 1.0)) &&
             copy_num_or_null(&c, a, "attention_multiplier", "attention_multiplier") &&
             add_num(a, "residual_multiplier", num_or(&c, "residual_multiplier", 1.0)) &&
             add_num(a, "logits_scaling", num_or(&c, "logits_scaling", 1.0));
    }
    const cJSON *ab = get(&c, "attention_bias");
    ok = ok && cJSON_AddBoolToObject(a, "attention_bias", ab ? cJSON_IsTrue(ab) : strcmp(type, "qwen2") == 0);

    /* Mixture of experts. */
    if (strcmp(type, "qwen3_moe") == 0) {
        uint64_t ne, topk, mi;
        const char *ne_key = get(&c, "num_experts") ? "num_experts" : "num_local_experts";
        if (!req_uint(&c, ne_key, &ne) || !req_uint(&c, "num_experts_per_tok", &topk) ||
            !req_uint(&c, "moe_intermediate_size", &mi)) {
            cJSON_Delete(a);
            return err->status;
        }
        if (ne > 65536 || topk > ne) {
            cJSON_Delete(a);
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: '%s' %llu / num_experts_per_tok %llu invalid (at most 65536 "
                                 "experts, top-k at most the experts)",
                                 path, ne_key, (unsigned long long)ne, (unsigned long long)topk);
        }
        info->n_experts = (uint32_t)ne;
        info->moe_intermediate = mi;
        cJSON *m = cJSON_AddObjectToObject(a, "moe");
        ok = ok && m && add_num(m, "num_experts", (double)ne) && add_num(m, "top_k", (double)topk) &&
             add_num(m, "moe_intermediate_size", (double)mi) &&
             cJSON_AddBoolToObject(m, "norm_topk_prob", cJSON_IsTrue(get(&c, "norm_topk_prob"))) &&
             add_num(m, "shared_expert_intermediate_size", num_or(&c, "shared_expert_intermediate_size", 0)) &&
             cJSON_AddBoolToObject(m, "router_sigmoid", false) &&
             add_num(m, "routed_scaling_factor", num_or(&c, "routed_scaling_factor", 1.0)) &&
             add_num(m, "decoder_sparse_step", num_or(&c, "decoder_sparse_step", 1));
        const cJSON *mlo = get(&c, "mlp_only_layers");
        if (m && cJSON_IsArray(mlo)) ok = ok && cJSON_AddItemToObject(m, "mlp_only_layers", cJSON_Duplicate(mlo, 1));
    } else {
        ok = ok && cJSON_AddNullToObject(a, "moe");
    }
    if (!ok) {
        cJSON_Delete(a);
        return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory building header.arch", path);
    }
    /* Store only an arch the engine can run: the values it reads (eps,
     * RoPE base and scaling, head_dim) checked by the engine's own rules
     * (dynamic RoPE is refused here, not at the first run). */
    cmf_status st = cmf_model_check_arch(a, NULL, path, "", err);
    if (st) {
        cJSON_Delete(a);
        return st;
    }
    *arch_out = a;
    return CMF_OK;
}

/* Add every id of v (number or array of numbers) to ids. */
static cmf_status add_ids(cJSON *ids, const cJSON *v, cmf_error *err) {
    if (cJSON_IsNumber(v)) return cmf_imp_add_eos(ids, v->valuedouble, err);
    const cJSON *e;
    if (cJSON_IsArray(v))
        cJSON_ArrayForEach(e, v) if (cJSON_IsNumber(e)) {
            cmf_status st = cmf_imp_add_eos(ids, e->valuedouble, err);
            if (st != CMF_OK) return st;
        }
    return CMF_OK;
}

/* tokenizer_config.json token fields are strings or {"content": ...}. */
static const char *token_str(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

cmf_status cmf_imp_hf_tokenizer_config(const cJSON *cfg, const cJSON *gen, const cJSON *tok_cfg,
                                       const char *chat_template, cJSON *out, cmf_error *err) {
    cJSON *ids = cJSON_AddArrayToObject(out, "eos_token_ids");
    if (!ids) return cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer_config: out of memory");
    const cJSON *srcs[] = {gen, cfg};
    for (int i = 0; i < 2; i++) {
        if (!srcs[i]) continue;
        cmf_status st = add_ids(ids, cJSON_GetObjectItemCaseSensitive(srcs[i], "eos_token_id"), err);
        if (st != CMF_OK) return st;
    }
    const char *keys[] = {"bos_token_id", "pad_token_id"};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 2; i++) {
            const cJSON *v = srcs[i] ? cJSON_GetObjectItemCaseSensitive(srcs[i], keys[k]) : NULL;
            if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0);
            if (cJSON_IsNumber(v)) {
                if (!cJSON_AddNumberToObject(out, keys[k], v->valuedouble))
                    return cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer_config: out of memory");
                break;
            }
        }
    if (tok_cfg) {
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(tok_cfg, "add_bos_token");
        if (cJSON_IsBool(ab)) cJSON_AddBoolToObject(out, "add_bos_token", cJSON_IsTrue(ab));
        const char *bos = token_str(cJSON_GetObjectItemCaseSensitive(tok_cfg, "bos_token"));
        const char *eos = token_str(cJSON_GetObjectItemCaseSensitive(tok_cfg, "eos_token"));
        if (bos) cJSON_AddStringToObject(out, "bos_token", bos);
        if (eos) cJSON_AddStringToObject(out, "eos_token", eos);
        const cJSON *pad = cJSON_GetObjectItemCaseSensitive(tok_cfg, "pad_token");
        if (token_str(pad)) cJSON_AddStringToObject(out, "pad_token", token_str(pad));
    }
    if (chat_template && !cJSON_AddStringToObject(out, "chat_template", chat_template))
        return cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer_config: out of memory");
    return CMF_OK;
}
