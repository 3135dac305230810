/*
 * import_gguf.c — `cmf import-gguf`: a GGUF v2/v3 model (or vocabulary-only
 * file) to CMF.
 *
 * Names: llama.cpp's `blk.N.*` tensor names map back to the Hugging Face
 * names `cmf convert` writes (llama.cpp src/llama-arch.cpp tables, read in
 * reverse). Shapes: GGUF lists ne[0] (contiguous) first; CMF/PyTorch lists
 * it last, so shapes are reversed and the bytes stay as they are.
 *
 * Values: every supported ggml type is dequantized to f32 and re-encoded
 * under --quant, except in --quant keep, where F32/F16/BF16 are copied and
 * Q4_0 is repacked losslessly into q4_tiled (same f16 scale, same
 * (q - 8)·d values; only the nibble order differs: ggml puts element j and
 * j+16 in byte j, CMF elements 2j and 2j+1). Other types in keep mode are
 * requantized to the nearest CMF dtype; header.provenance.gguf_keep says
 * which.
 *
 * Undoing llama.cpp's conversion: for llama-architecture files the q/k
 * projection rows are in the interleaved rotary order (convert_hf_to_gguf
 * `LlamaModel.permute`); they are permuted back to HF (neox) order. For
 * gemma-family files llama.cpp stored norm weights as (1 + w); 1 is
 * subtracted again. MoE expert stacks [n_expert, out, in] are split into
 * HF's per-expert tensors. An `output.weight` byte-identical to
 * `token_embd.weight` is dropped (tie_word_embeddings). Llama 3's
 * `rope_freqs.weight` becomes rope_scaling again (llama3_rope) and phi3's
 * `rope_factors_long/short.weight` the longrope rope_scaling object.
 */
#include "cmf/tokenizer.h"
#include "import/gguf.h"
#include "import/import_internal.h"
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct gctx {
    const cmf_gguf *g;
    const cJSON *meta;
    const char *arch; /* general.architecture */
    char prefix[64];
    const char *path;
    cmf_error *err;
} gctx;

static const cJSON *mget(const gctx *c, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(c->meta, key);
}

/* "{arch}.suffix" */
static const cJSON *aget(const gctx *c, const char *suffix) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", c->arch, suffix);
    return mget(c, k);
}

static bool a_uint(const gctx *c, const char *suffix, uint64_t *out, bool required) {
    const cJSON *v = aget(c, suffix);
    if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0); /* per-layer arrays: first layer */
    if (!v) {
        if (required) cmf_error_set(c->err, CMF_ERR_FORMAT, "%s: missing metadata '%s.%s'", c->path, c->arch, suffix);
        return false;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e12) {
        cmf_error_set(c->err, CMF_ERR_FORMAT, "%s: metadata '%s.%s' is not a valid count", c->path, c->arch, suffix);
        return false;
    }
    *out = (uint64_t)v->valuedouble;
    return true;
}

static double a_num(const gctx *c, const char *suffix, double dflt) {
    const cJSON *v = aget(c, suffix);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static double num_or_default(const cJSON *v, double d) { return cJSON_IsNumber(v) ? v->valuedouble : d; }

typedef struct ginfo {
    const char *arch_name;
    bool llama, gemma, moe, phi3;
    uint32_t n_layers, n_heads, n_kv_heads, head_dim;
    uint64_t hidden;
} ginfo;

static const struct { const char *gguf, *hf; } arch_map[] = {
    {"llama", "llama"}, {"mistral", "mistral"}, {"qwen2", "qwen2"},   {"qwen3", "qwen3"},
    {"qwen3moe", "qwen3_moe"}, {"gemma", "gemma"}, {"gemma2", "gemma2"}, {"gemma3", "gemma3_text"},
    {"phi3", "phi3"},
};

static cmf_status build_arch(const gctx *c, cJSON *a, ginfo *gi) {
    cmf_error *err = c->err;
    gi->arch_name = NULL;
    for (size_t i = 0; i < sizeof arch_map / sizeof *arch_map; i++)
        if (strcmp(c->arch, arch_map[i].gguf) == 0) gi->arch_name = arch_map[i].hf;
    if (!gi->arch_name)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                             "%s: general.architecture '%.64s' is not supported (llama, mistral, qwen2, "
                             "qwen3, qwen3moe, gemma, gemma2, gemma3, phi3)",
                             c->path, c->arch);
    gi->llama = strcmp(c->arch, "llama") == 0 || strcmp(c->arch, "mistral") == 0;
    gi->gemma = strncmp(c->arch, "gemma", 5) == 0;
    gi->moe = strcmp(c->arch, "qwen3moe") == 0;
    gi->phi3 = strcmp(c->arch, "phi3") == 0;
    bool gemma2 = strcmp(c->arch, "gemma2") == 0, gemma3 = strcmp(c->arch, "gemma3") == 0;
    uint64_t hidden, inter = 0, layers, heads, kv, hd;
    if (!a_uint(c, "embedding_length", &hidden, true) || !a_uint(c, "block_count", &layers, true) ||
        !a_uint(c, "attention.head_count", &heads, true))
        return err->status;
    if (!a_uint(c, "feed_forward_length", &inter, !gi->moe) && !gi->moe) return err->status;
    if (!a_uint(c, "attention.head_count_kv", &kv, false)) kv = heads;
    if (!a_uint(c, "attention.key_length", &hd, false)) hd = heads ? hidden / heads : 0;
    if (heads == 0 || kv == 0 || hd == 0 || layers == 0 || layers > 100000 || heads % kv)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s.attention.head_count/head_count_kv/block_count invalid",
                             c->path, c->arch);
    gi->hidden = hidden;
    gi->n_layers = (uint32_t)layers;
    gi->n_heads = (uint32_t)heads;
    gi->n_kv_heads = (uint32_t)kv;
    gi->head_dim = (uint32_t)hd;
    uint64_t vocab = 0;
    const cmf_gguf_tensor *emb = cmf_gguf_find(c->g, "token_embd.weight");
    if (emb) vocab = emb->ndim >= 2 ? emb->ne[1] : 0;
    else if (!a_uint(c, "vocab_size", &vocab, false))
        vocab = (uint64_t)cJSON_GetArraySize(mget(c, "tokenizer.ggml.tokens"));
    /* A vocabulary larger than the embedding would let the tokenizer emit
     * ids with no embedding row (fewer tokens than rows is padding, fine). */
    uint64_t n_tok = (uint64_t)cJSON_GetArraySize(mget(c, "tokenizer.ggml.tokens"));
    if (emb && n_tok > vocab)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: tokenizer.ggml.tokens has %llu entries but token_embd.weight has %llu rows",
                             c->path, (unsigned long long)n_tok, (unsigned long long)vocab);
    bool ok = cJSON_AddStringToObject(a, "arch_name", gi->arch_name) &&
              cJSON_AddNumberToObject(a, "hidden_size", (double)hidden) &&
              cJSON_AddNumberToObject(a, "intermediate_size", (double)inter) &&
              cJSON_AddNumberToObject(a, "num_layers", (double)layers) &&
              cJSON_AddNumberToObject(a, "num_attention_heads", (double)heads) &&
              cJSON_AddNumberToObject(a, "num_kv_heads", (double)kv) &&
              cJSON_AddNumberToObject(a, "head_dim", (double)hd) &&
              cJSON_AddNumberToObject(a, "vocab_size", (double)vocab) &&
              cJSON_AddNumberToObject(a, "rms_norm_eps", a_num(c, "attention.layer_norm_rms_epsilon", 1e-5)) &&
              cJSON_AddStringToObject(a, "norm_style", gi->gemma ? "gemma" : "qwen") &&
              cJSON_AddStringToObject(a, "rope_layout", "neox") &&
              cJSON_AddNumberToObject(a, "rope_theta", a_num(c, "rope.freq_base", gemma3 ? 1e6 : 10000.0));
    const cJSON *rst = aget(c, "rope.scaling.type");
    if (cJSON_IsString(rst) && strcmp(rst->valuestring, "none") != 0) {
        cJSON *rs = cJSON_AddObjectToObject(a, "rope_scaling");
        ok = ok && rs && cJSON_AddStringToObject(rs, "rope_type", rst->valuestring) &&
             cJSON_AddNumberToObject(rs, "factor", a_num(c, "rope.scaling.factor", 1.0));
        const cJSON *oc = aget(c, "rope.scaling.original_context_length");
        if (rs && cJSON_IsNumber(oc))
            ok = ok && cJSON_AddNumberToObject(rs, "original_max_position_embeddings", oc->valuedouble);
    } else {
        ok = ok && cJSON_AddNullToObject(a, "rope_scaling");
    }
    const cmf_gguf_tensor *rl = cmf_gguf_find(c->g, "rope_factors_long.weight"),
                          *rsh = cmf_gguf_find(c->g, "rope_factors_short.weight");
    if (rl && rsh) {
        /* phi3 longrope: the HF rope_scaling object is the two factor lists. */
        if (rl->type != CMF_GGML_F32 || rsh->type != CMF_GGML_F32 || rl->nelem != rsh->nelem || rl->nelem > 4096)
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: rope_factors_long/short.weight: expected two F32 vectors", c->path);
        cJSON *rs = cJSON_CreateObject();
        cJSON *lf = cJSON_AddArrayToObject(rs, "long_factor"), *sf = cJSON_AddArrayToObject(rs, "short_factor");
        ok = ok && rs && lf && sf && cJSON_AddStringToObject(rs, "rope_type", "longrope");
        for (uint64_t i = 0; ok && i < rl->nelem; i++)
            ok = cJSON_AddItemToArray(lf, cJSON_CreateNumber(((const float *)rl->data)[i])) &&
                 cJSON_AddItemToArray(sf, cJSON_CreateNumber(((const float *)rsh->data)[i]));
        if (rs) cJSON_ReplaceItemInObjectCaseSensitive(a, "rope_scaling", rs);
        const cJSON *oc = aget(c, "rope.scaling.original_context_length");
        if (cJSON_IsNumber(oc)) ok = ok && cJSON_AddNumberToObject(a, "original_max_position_embeddings", oc->valuedouble);
    }
    uint64_t rot;
    double prf = a_uint(c, "rope.dimension_count", &rot, false) ? (double)rot / (double)hd : 1.0;
    ok = ok && cJSON_AddNumberToObject(a, "partial_rotary_factor", prf);
    if (gemma3) ok = ok && cJSON_AddNumberToObject(a, "rope_local_base_freq", 10000.0);
    uint64_t sw = 0;
    bool has_sw = a_uint(c, "attention.sliding_window", &sw, false) && sw > 0;
    ok = ok && (has_sw ? cJSON_AddNumberToObject(a, "sliding_window", (double)sw) != NULL
                       : cJSON_AddNullToObject(a, "sliding_window") != NULL);
    cJSON *lt = cJSON_AddArrayToObject(a, "layer_types");
    ok = ok && lt;
    for (uint64_t i = 0; ok && i < layers; i++) {
        bool sliding = has_sw && (gemma2 ? i % 2 == 0 : gemma3 ? (i + 1) % 6 != 0 : true);
        ok = ok && cJSON_AddItemToArray(lt, cJSON_CreateString(sliding ? "SlidingAttention" : "FullAttention"));
    }
    if (gemma3) ok = ok && cJSON_AddNumberToObject(a, "sliding_window_pattern", 6);
    ok = ok && cJSON_AddNumberToObject(a, "max_position_embeddings", a_num(c, "context_length", 2048));
    ok = ok && cJSON_AddStringToObject(a, "hidden_act", gi->gemma ? "gelu_pytorch_tanh" : "silu");
    if (gi->gemma) {
        ok = ok && cJSON_AddNumberToObject(a, "embedding_multiplier", (double)(float)sqrt((double)hidden));
        /* llama.cpp: the 27B gemma2/gemma3 scale by hidden/heads, the rest by head_dim. */
        double qpas = (gemma2 && layers == 46) || (gemma3 && layers == 62) ? (double)hidden / (double)heads : (double)hd;
        if (gemma2 || gemma3) ok = ok && cJSON_AddNumberToObject(a, "query_pre_attn_scalar", qpas);
    }
    const cJSON *asc = aget(c, "attn_logit_softcapping"), *fsc = aget(c, "final_logit_softcapping");
    if (cJSON_IsNumber(asc)) ok = ok && cJSON_AddNumberToObject(a, "attn_logit_softcapping", asc->valuedouble);
    if (cJSON_IsNumber(fsc)) ok = ok && cJSON_AddNumberToObject(a, "final_logit_softcapping", fsc->valuedouble);
    if (gi->moe) {
        uint64_t ne, topk, mi;
        if (!a_uint(c, "expert_count", &ne, true) || !a_uint(c, "expert_used_count", &topk, true) ||
            !a_uint(c, "expert_feed_forward_length", &mi, true))
            return err->status;
        cJSON *m = cJSON_AddObjectToObject(a, "moe");
        ok = ok && m && cJSON_AddNumberToObject(m, "num_experts", (double)ne) &&
             cJSON_AddNumberToObject(m, "top_k", (double)topk) &&
             cJSON_AddNumberToObject(m, "moe_intermediate_size", (double)mi) &&
             cJSON_AddBoolToObject(m, "norm_topk_prob", true) &&
             cJSON_AddNumberToObject(m, "shared_expert_intermediate_size", 0) &&
             cJSON_AddBoolToObject(m, "router_sigmoid", false) &&
             cJSON_AddNumberToObject(m, "routed_scaling_factor", 1.0);
    } else {
        ok = ok && cJSON_AddNullToObject(a, "moe");
    }
    if (!ok) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory building header.arch", c->path);
    return CMF_OK;
}

/* llama.cpp stores Llama 3 RoPE scaling only as the per-frequency factor
 * vector `rope_freqs.weight` [head_dim/2] (convert_hf_to_gguf.py
 * LlamaModel.generate_extra_tensors). Recover HF's rope_scaling by matching
 * the vector against the published configurations (Llama 3.1/3.3:
 * factor 8; Llama 3.2: factor 32; both low 1, high 4, original context
 * 8192). Unknown vectors are an error rather than a silently wrong model. */
static cmf_status llama3_rope(const gctx *c, const ginfo *gi, cJSON *arch, cmf_error *err) {
    const cmf_gguf_tensor *t = cmf_gguf_find(c->g, "rope_freqs.weight");
    if (!t) return CMF_OK;
    uint64_t n = t->nelem;
    if (t->type != CMF_GGML_F32 || n != gi->head_dim / 2 || n == 0)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor 'rope_freqs.weight': expected F32 [%u]", c->path,
                             gi->head_dim / 2);
    const float *v = t->data;
    double theta = num_or_default(cJSON_GetObjectItemCaseSensitive(arch, "rope_theta"), 10000.0);
    static const double cand[][4] = {{8, 1, 4, 8192}, {32, 1, 4, 8192}, {16, 1, 4, 8192}, {4, 1, 4, 8192}};
    for (size_t k = 0; k < sizeof cand / sizeof *cand; k++) {
        double factor = cand[k][0], lo = cand[k][1], hi = cand[k][2], old = cand[k][3];
        bool match = true;
        for (uint64_t i = 0; i < n && match; i++) {
            double freq = 1.0 / pow(theta, (double)(2 * i) / (double)gi->head_dim);
            double wl = 2 * M_PI / freq, f;
            if (wl < old / hi) f = 1;
            else if (wl > old / lo) f = factor;
            else {
                double smooth = (old / wl - lo) / (hi - lo);
                f = 1 / ((1 - smooth) / factor + smooth);
            }
            match = fabs((double)v[i] - f) <= 1e-3 * f;
        }
        if (!match) continue;
        cJSON *rs = cJSON_CreateObject();
        if (!rs || !cJSON_AddStringToObject(rs, "rope_type", "llama3") || !cJSON_AddNumberToObject(rs, "factor", factor) ||
            !cJSON_AddNumberToObject(rs, "low_freq_factor", lo) || !cJSON_AddNumberToObject(rs, "high_freq_factor", hi) ||
            !cJSON_AddNumberToObject(rs, "original_max_position_embeddings", old)) {
            cJSON_Delete(rs);
            return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
        }
        cJSON_ReplaceItemInObjectCaseSensitive(arch, "rope_scaling", rs);
        return CMF_OK;
    }
    return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                         "%s: tensor 'rope_freqs.weight' does not match a known Llama 3 rope scaling "
                         "(factor 4/8/16/32, low 1, high 4, original context 8192)", c->path);
}

/* GGUF name -> HF name. *split_experts set for ffn_*_exps (name then holds
 * the per-expert suffix, e.g. "gate_proj.weight", and *layer the block).
 * Returns false (with err) for a name we do not know; *out empty = skip. */
static bool map_name(const gctx *c, const ginfo *gi, const char *in, char *out, size_t cap,
                     bool *split_experts, int *layer) {
    *split_experts = false;
    *layer = -1;
    out[0] = 0;
    if (strcmp(in, "token_embd.weight") == 0) return snprintf(out, cap, "model.embed_tokens.weight"), true;
    if (strcmp(in, "output_norm.weight") == 0) return snprintf(out, cap, "model.norm.weight"), true;
    if (strcmp(in, "output.weight") == 0) return snprintf(out, cap, "lm_head.weight"), true;
    if (strncmp(in, "rope_freqs", 10) == 0 || strncmp(in, "rope_factors", 12) == 0) return true; /* skipped */
    unsigned l;
    int pos = 0;
    if (sscanf(in, "blk.%u.%n", &l, &pos) != 1 || pos == 0 || l >= gi->n_layers) {
        cmf_error_set(c->err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': unknown tensor name", c->path, in);
        return false;
    }
    *layer = (int)l;
    const char *rest = in + pos, *dot = strrchr(rest, '.');
    if (!dot || (strcmp(dot, ".weight") != 0 && strcmp(dot, ".bias") != 0)) {
        cmf_error_set(c->err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': unknown tensor name", c->path, in);
        return false;
    }
    size_t base_len = (size_t)(dot - rest);
    static const struct { const char *gguf, *hf; } tab[] = {
        {"attn_norm", "input_layernorm"},
        {"attn_q", "self_attn.q_proj"},
        {"attn_k", "self_attn.k_proj"},
        {"attn_v", "self_attn.v_proj"},
        {"attn_output", "self_attn.o_proj"},
        {"attn_qkv", "self_attn.qkv_proj"},
        {"attn_q_norm", "self_attn.q_norm"},
        {"attn_k_norm", "self_attn.k_norm"},
        {"post_attention_norm", "post_attention_layernorm"},
        {"post_ffw_norm", "post_feedforward_layernorm"},
        {"ffn_gate", "mlp.gate_proj"},
        {"ffn_down", "mlp.down_proj"},
        {"ffn_gate_inp", "mlp.gate"},
        {"ffn_norm", NULL},
        {"ffn_up", NULL},
        {"ffn_gate_exps", "gate_proj"},
        {"ffn_up_exps", "up_proj"},
        {"ffn_down_exps", "down_proj"},
    };
    for (size_t i = 0; i < sizeof tab / sizeof *tab; i++) {
        if (strlen(tab[i].gguf) != base_len || strncmp(rest, tab[i].gguf, base_len) != 0) continue;
        const char *hf = tab[i].hf;
        if (strcmp(tab[i].gguf, "ffn_norm") == 0)
            hf = strcmp(c->arch, "gemma2") == 0 || strcmp(c->arch, "gemma3") == 0 ? "pre_feedforward_layernorm"
                                                                                : "post_attention_layernorm";
        if (strcmp(tab[i].gguf, "ffn_up") == 0) hf = gi->phi3 ? "mlp.gate_up_proj" : "mlp.up_proj";
        if (strstr(tab[i].gguf, "_exps")) {
            *split_experts = true;
            snprintf(out, cap, "%s%s", hf, dot);
            return true;
        }
        snprintf(out, cap, "model.layers.%u.%s%s", l, hf, dot);
        return true;
    }
    cmf_error_set(c->err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': unknown tensor name", c->path, in);
    return false;
}

/* Permute whole rows (row_bytes each) of [n_head * hd] rows from the
 * interleaved rotary order to HF order (see cmf_imp_unpermute_rows). */
static cmf_status unpermute_raw(uint8_t *p, uint64_t rows, uint64_t row_bytes, uint32_t n_head, cmf_error *err) {
    if (n_head == 0 || rows % n_head || (rows / n_head) % 2)
        return cmf_error_set(err, CMF_ERR_FORMAT, "rotary un-permute: %llu rows do not split into %u heads",
                             (unsigned long long)rows, n_head);
    uint64_t hd = rows / n_head, half = hd / 2;
    uint8_t *tmp = malloc(hd * row_bytes);
    if (!tmp) return cmf_error_set(err, CMF_ERR_NOMEM, "rotary un-permute: out of memory");
    for (uint32_t h = 0; h < n_head; h++) {
        uint8_t *head = p + (uint64_t)h * hd * row_bytes;
        for (uint64_t i = 0; i < half; i++)
            for (uint64_t j = 0; j < 2; j++)
                memcpy(tmp + (j * half + i) * row_bytes, head + (2 * i + j) * row_bytes, row_bytes);
        memcpy(head, tmp, hd * row_bytes);
    }
    free(tmp);
    return CMF_OK;
}

/* Q4_0 blocks -> q4_tiled tiles (same bytes count, 18 per 32 values). */
static void q4_0_to_tiled(const uint8_t *src, uint8_t *dst, uint64_t n_blocks) {
    for (uint64_t b = 0; b < n_blocks; b++) {
        const uint8_t *s = src + 18 * b;
        uint8_t *d = dst + 18 * b;
        uint8_t v[32];
        for (int j = 0; j < 16; j++) {
            v[j] = s[2 + j] & 0x0F;
            v[j + 16] = s[2 + j] >> 4;
        }
        d[0] = s[0];
        d[1] = s[1];
        for (int j = 0; j < 16; j++) d[2 + j] = (uint8_t)(v[2 * j] | (v[2 * j + 1] << 4));
    }
}

static const char *keep_target(uint32_t type, cmf_dtype *dt, bool *lossless) {
    *lossless = false;
    switch (type) {
    case CMF_GGML_F32: *dt = CMF_DT_F32; *lossless = true; return "f32";
    case CMF_GGML_F16: *dt = CMF_DT_F16; *lossless = true; return "f16";
    case CMF_GGML_BF16: *dt = CMF_DT_BF16; *lossless = true; return "bf16";
    case CMF_GGML_Q4_0: *dt = CMF_DT_Q4_TILED; *lossless = true; return "q4_tiled";
    case CMF_GGML_Q4_1: case CMF_GGML_Q2_K: case CMF_GGML_Q3_K: case CMF_GGML_Q4_K:
        *dt = CMF_DT_Q4_TILED; return "q4_tiled";
    default: *dt = CMF_DT_Q8_ROW; return "q8_row";
    }
}

/* Write one HF tensor from GGUF data (a slice of a GGUF tensor for experts). */
typedef struct out_tensor {
    const char *name;
    uint32_t type;          /* ggml type of the source bytes */
    const uint8_t *data;
    uint64_t rows, cols;    /* cols = ne[0]; rows = product of the rest */
    uint32_t ndim;          /* 1 or 2 (PyTorch shape [rows, cols] or [cols]) */
    int permute_heads;      /* > 0: un-permute rows with this many heads */
    bool minus_one;         /* gemma norm: subtract 1 */
} out_tensor;

static cmf_status write_tensor(cmf_writer *w, const cmf_imp_quant *q, const out_tensor *o,
                               cJSON *keep_log, cmf_error *err) {
    uint32_t be, bb;
    cmf_ggml_type_size(o->type, &be, &bb);
    uint64_t row_bytes = o->cols / be * bb, n = o->rows * o->cols;
    uint64_t shape[2];
    if (o->ndim == 1) shape[0] = o->cols;
    else shape[0] = o->rows, shape[1] = o->cols;
    cmf_status st;
    if (q->keep) {
        cmf_dtype dt;
        bool lossless;
        const char *tn = keep_target(o->type, &dt, &lossless);
        bool ok_shape = dt != CMF_DT_Q4_TILED || (o->ndim == 2 && o->cols % 32 == 0);
        if (lossless && ok_shape && !o->minus_one) {
            uint64_t nbytes = n / be * bb;
            uint8_t *p = malloc(nbytes ? nbytes : 1);
            if (!p) return cmf_error_set(err, CMF_ERR_NOMEM, "tensor '%s': out of memory", o->name);
            if (o->type == CMF_GGML_Q4_0) q4_0_to_tiled(o->data, p, n / 32);
            else memcpy(p, o->data, n / be * bb);
            st = o->permute_heads ? unpermute_raw(p, o->rows, row_bytes, (uint32_t)o->permute_heads, err) : CMF_OK;
            if (st == CMF_OK) st = cmf_writer_add(w, o->name, dt, o->ndim, shape, p, n / be * bb, err);
            free(p);
            if (st != CMF_OK) return cmf_error_prefix(err, "tensor '%s'", o->name);
            if (keep_log && !cJSON_GetObjectItemCaseSensitive(keep_log, cmf_ggml_type_name(o->type)))
                cJSON_AddStringToObject(keep_log, cmf_ggml_type_name(o->type), tn);
            return CMF_OK;
        }
        if (!lossless && keep_log && !cJSON_GetObjectItemCaseSensitive(keep_log, cmf_ggml_type_name(o->type))) {
            char msg[64];
            snprintf(msg, sizeof msg, "%s (requantized)", tn);
            cJSON_AddStringToObject(keep_log, cmf_ggml_type_name(o->type), msg);
        }
        float *f;
        if ((st = cmf_imp_alloc_f32(n, &f, o->name, err))) return st;
        st = cmf_ggml_dequantize(o->type, o->data, n, f, err);
        if (st == CMF_OK && o->permute_heads) st = cmf_imp_unpermute_rows(f, o->rows, o->cols, (uint32_t)o->permute_heads, err);
        if (st == CMF_OK && o->minus_one) for (uint64_t i = 0; i < n; i++) f[i] -= 1.0f;
        if (st == CMF_OK) {
            cmf_imp_quant kq = *q;
            kq.keep = false;
            kq.matrix = dt;
            st = cmf_imp_add(w, &kq, o->name, o->ndim, shape, f, err);
        } else {
            cmf_error_prefix(err, "tensor '%s'", o->name);
        }
        free(f);
        return st;
    }
    float *f;
    if ((st = cmf_imp_alloc_f32(n, &f, o->name, err))) return st;
    st = cmf_ggml_dequantize(o->type, o->data, n, f, err);
    if (st == CMF_OK && o->permute_heads) st = cmf_imp_unpermute_rows(f, o->rows, o->cols, (uint32_t)o->permute_heads, err);
    if (st == CMF_OK && o->minus_one) for (uint64_t i = 0; i < n; i++) f[i] -= 1.0f;
    if (st != CMF_OK) cmf_error_prefix(err, "tensor '%s'", o->name);
    else st = cmf_imp_add(w, q, o->name, o->ndim, shape, f, err);
    free(f);
    return st;
}

static cmf_status tokenizer_config(const gctx *c, cJSON *tc, cmf_error *err) {
    const cJSON *toks = mget(c, "tokenizer.ggml.tokens");
    cJSON *ids = cJSON_AddArrayToObject(tc, "eos_token_ids");
    if (!ids) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < 3; i++) {
        const cJSON *v = mget(c, eos_keys[i]);
        if (cJSON_IsNumber(v) && cmf_imp_add_eos(ids, v->valuedouble, err)) return err->status;
    }
    const cJSON *bos = mget(c, "tokenizer.ggml.bos_token_id"), *pad = mget(c, "tokenizer.ggml.padding_token_id");
    if (cJSON_IsNumber(bos)) cJSON_AddNumberToObject(tc, "bos_token_id", bos->valuedouble);
    if (cJSON_IsNumber(pad)) cJSON_AddNumberToObject(tc, "pad_token_id", pad->valuedouble);
    const cJSON *ab = mget(c, "tokenizer.ggml.add_bos_token");
    if (cJSON_IsBool(ab)) cJSON_AddBoolToObject(tc, "add_bos_token", cJSON_IsTrue(ab));
    const cJSON *ae = mget(c, "tokenizer.ggml.add_eos_token");
    if (cJSON_IsBool(ae)) cJSON_AddBoolToObject(tc, "add_eos_token", cJSON_IsTrue(ae));
    if (cJSON_IsNumber(bos) && cJSON_IsString(cJSON_GetArrayItem(toks, (int)bos->valuedouble)))
        cJSON_AddStringToObject(tc, "bos_token", cJSON_GetArrayItem(toks, (int)bos->valuedouble)->valuestring);
    const cJSON *eos = cJSON_GetArrayItem(ids, 0);
    if (eos && cJSON_IsString(cJSON_GetArrayItem(toks, (int)eos->valuedouble)))
        cJSON_AddStringToObject(tc, "eos_token", cJSON_GetArrayItem(toks, (int)eos->valuedouble)->valuestring);
    const cJSON *tmpl = mget(c, "tokenizer.chat_template");
    if (cJSON_IsString(tmpl) && !cJSON_AddStringToObject(tc, "chat_template", tmpl->valuestring))
        return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    return CMF_OK;
}

cmf_status cmf_import_gguf(const char *path, const char *out_path, const cmf_import_opts *opts, cmf_error *err) {
    cmf_error local;
    if (!err) err = &local;
    if (!path || !out_path) return cmf_error_set(err, CMF_ERR_ARG, "import-gguf: input and output paths are required");
    cmf_imp_quant q;
    cmf_writer_opts wo;
    cmf_status st = cmf_imp_begin(opts, "keep", true, out_path, &q, &wo, err);
    if (st != CMF_OK) return st;
    cmf_gguf *g = NULL;
    if ((st = cmf_gguf_open(path, &g, err))) return st;
    gctx c = {.g = g, .meta = cmf_gguf_meta(g), .path = path, .err = err};
    const cJSON *arch_v = mget(&c, "general.architecture");
    c.arch = cJSON_IsString(arch_v) ? arch_v->valuestring : "";
    size_t nt = cmf_gguf_tensor_count(g);
    cmf_writer *w = NULL;
    char *tok_json = NULL;
    size_t tok_len = 0;
    ginfo gi = {0};
    if (nt > 0 && !cJSON_IsString(arch_v)) {
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: missing metadata 'general.architecture'", path);
        goto out;
    }
    if (cJSON_IsString(mget(&c, "tokenizer.ggml.model"))) {
        st = cmf_tokenizer_json_from_gguf(c.meta, &tok_json, &tok_len, err);
        if (st) { cmf_error_prefix(err, "%s: tokenizer.ggml.*", path); goto out; }
    } else if (nt == 0) {
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: no tensors and no tokenizer.ggml.model: nothing to import", path);
        goto out;
    }
    if ((st = cmf_writer_open(out_path, &wo, &w, err))) goto out;
    cJSON *h = cmf_writer_header(w);
    cJSON *arch = cJSON_AddObjectToObject(h, "arch");
    cJSON *tc = cJSON_AddObjectToObject(h, "tokenizer_config");
    cJSON *prov = cJSON_AddObjectToObject(h, "provenance");
    if (!arch || !tc || !prov || !cJSON_AddStringToObject(h, "quant_type", cmf_imp_quant_label(&q))) {
        st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
        goto out;
    }
    cJSON_AddStringToObject(prov, "tool", "cmf import-gguf " CMF_VERSION_STRING);
    cJSON_AddStringToObject(prov, "source_format", "gguf");
    cJSON_AddNumberToObject(prov, "gguf_version", cmf_gguf_version(g));
    cJSON_AddStringToObject(prov, "quant", q.name);
    const cJSON *gname = mget(&c, "general.name");
    if (cJSON_IsString(gname)) cJSON_AddStringToObject(prov, "source_model", gname->valuestring);
    cJSON *keep_log = q.keep ? cJSON_AddObjectToObject(prov, "gguf_keep") : NULL;
    if ((st = tokenizer_config(&c, tc, err))) goto out;
    if (tok_json && (st = cmf_writer_set_tokenizer(w, tok_json, tok_len, err))) goto out;
    if (nt == 0) {
        /* Vocabulary-only: a minimal arch naming the source. */
        cJSON_AddStringToObject(arch, "arch_name", c.arch[0] ? c.arch : "none");
        cJSON_AddNumberToObject(arch, "vocab_size", cJSON_GetArraySize(mget(&c, "tokenizer.ggml.tokens")));
        cJSON_AddBoolToObject(prov, "vocab_only", true);
        st = cmf_writer_finish(w, err);
        w = NULL;
        goto out;
    }
    if ((st = build_arch(&c, arch, &gi)) || (gi.llama && (st = llama3_rope(&c, &gi, arch, err)))) goto out;
    /* Store only an arch the engine can run, as convert does (eps, RoPE,
     * head_dim by the engine's rules); the abort below removes the spool. */
    if ((st = cmf_model_check_arch(arch, NULL, path, "arch.", err))) goto out;

    /* Tied embeddings: no output.weight, or one identical to token_embd. */
    const cmf_gguf_tensor *emb = cmf_gguf_find(g, "token_embd.weight"), *outw = cmf_gguf_find(g, "output.weight");
    if (!emb) { st = cmf_error_set(err, CMF_ERR_NOT_FOUND, "%s: missing tensor 'token_embd.weight'", path); goto out; }
    if (!cmf_gguf_find(g, "output_norm.weight")) { st = cmf_error_set(err, CMF_ERR_NOT_FOUND, "%s: missing tensor 'output_norm.weight'", path); goto out; }
    bool drop_output = outw && outw->type == emb->type && outw->nbytes == emb->nbytes &&
                       memcmp(outw->ne, emb->ne, sizeof emb->ne) == 0 && memcmp(outw->data, emb->data, emb->nbytes) == 0;
    cJSON_AddBoolToObject(arch, "tie_word_embeddings", !outw || drop_output);

    uint64_t total = 0;
    for (size_t i = 0; i < nt; i++) total += cmf_gguf_tensor_at(g, i)->nbytes;
    cmf_imp_progress pr;
    cmf_imp_progress_start(&pr, opts && opts->progress, nt, total);
    for (size_t i = 0; i < nt; i++) {
        const cmf_gguf_tensor *t = cmf_gguf_tensor_at(g, i);
        if (t == outw && drop_output) { cmf_imp_progress_step(&pr, t->nbytes); continue; }
        char name[256];
        bool split;
        int layer;
        if (!map_name(&c, &gi, t->name, name, sizeof name, &split, &layer)) { st = err->status; goto out; }
        if (!name[0]) { cmf_imp_progress_step(&pr, t->nbytes); continue; }
        if (!cmf_ggml_can_dequantize(t->type)) {
            st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': ggml type %s (%u) is not supported",
                               path, t->name, cmf_ggml_type_name(t->type) ? cmf_ggml_type_name(t->type) : "?", t->type);
            goto out;
        }
        out_tensor o = {.name = name, .type = t->type, .data = t->data, .cols = t->ne[0]};
        o.rows = t->nelem / t->ne[0];
        o.ndim = t->ndim == 1 ? 1 : 2;
        size_t nl = strlen(name);
        o.minus_one = gi.gemma && nl > 11 && strcmp(name + nl - 11, "norm.weight") == 0;
        if (gi.llama && (strstr(name, "self_attn.q_proj.") || strstr(name, "self_attn.k_proj.")))
            o.permute_heads = (int)(strstr(name, "q_proj") ? gi.n_heads : gi.n_kv_heads);
        if (t->ndim > 2 && !split) {
            st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': %u-D tensors are not supported here", path, t->name, t->ndim);
            goto out;
        }
        if (split) {
            /* ne = [in, out, n_expert]: expert e is a contiguous [out, in] matrix. */
            uint32_t be, bb;
            cmf_ggml_type_size(t->type, &be, &bb);
            uint64_t per = t->ne[0] / be * bb * t->ne[1];
            for (uint64_t e = 0; e < t->ne[2]; e++) {
                char en[400];
                snprintf(en, sizeof en, "model.layers.%d.mlp.experts.%llu.%s", layer, (unsigned long long)e, name);
                out_tensor oe = o;
                oe.name = en;
                oe.rows = t->ne[1];
                oe.data = (const uint8_t *)t->data + e * per;
                if ((st = write_tensor(w, &q, &oe, keep_log, err))) goto out;
            }
        } else if ((st = write_tensor(w, &q, &o, keep_log, err))) {
            goto out;
        }
        cmf_imp_progress_step(&pr, t->nbytes);
    }
    cmf_imp_progress_end(&pr);
    st = cmf_writer_finish(w, err);
    w = NULL;
out:
    if (w) cmf_writer_abort(w);
    free(tok_json);
    cmf_gguf_close(g);
    return st;
}
