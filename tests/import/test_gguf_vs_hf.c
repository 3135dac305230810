/*
 * test_gguf_vs_hf.c — `import-gguf` must produce what `convert` makes from
 * the same checkpoint. For several parity folders the test writes a GGUF
 * the way llama.cpp's convert_hf_to_gguf.py would (llama.cpp names, q/k
 * rows permuted into interleaved order for llama, gemma norms stored as
 * 1 + w, MoE experts stacked into [n_expert, out, in], F32 data,
 * metadata from config.json), imports it, and compares every tensor and
 * the main header.arch keys with `convert` of the folder. A second GGUF
 * stores the llama matrices as Q4_0 (ggml's reference quantizer) to check
 * that --quant keep repacks them losslessly into q4_tiled.
 */
#include "import/gguf.h"
#include "import/safetensors.h"
#include "import_test_util.h"

/* ---- a small GGUF writer ---- */
typedef struct gw {
    uint8_t *kv;
    size_t kv_n, kv_cap, n_kv;
    uint8_t *ti;
    size_t ti_n, ti_cap, n_t;
    uint8_t *data;
    size_t data_n, data_cap;
} gw;

static void app(uint8_t **b, size_t *n, size_t *cap, const void *p, size_t len) {
    if (*n + len > *cap) {
        *cap = (*n + len) * 2 + 1024;
        *b = realloc(*b, *cap);
    }
    memcpy(*b + *n, p, len);
    *n += len;
}
static void kv_str(gw *g, const char *k, const char *v) {
    uint64_t l = strlen(k);
    app(&g->kv, &g->kv_n, &g->kv_cap, &l, 8);
    app(&g->kv, &g->kv_n, &g->kv_cap, k, l);
    uint32_t t = CMF_GGUF_STRING;
    app(&g->kv, &g->kv_n, &g->kv_cap, &t, 4);
    l = strlen(v);
    app(&g->kv, &g->kv_n, &g->kv_cap, &l, 8);
    app(&g->kv, &g->kv_n, &g->kv_cap, v, l);
    g->n_kv++;
}
static void kv_u32(gw *g, const char *pre, const char *k, uint32_t v) {
    char key[200];
    snprintf(key, sizeof key, "%s%s", pre, k);
    uint64_t l = strlen(key);
    app(&g->kv, &g->kv_n, &g->kv_cap, &l, 8);
    app(&g->kv, &g->kv_n, &g->kv_cap, key, l);
    uint32_t t = CMF_GGUF_U32;
    app(&g->kv, &g->kv_n, &g->kv_cap, &t, 4);
    app(&g->kv, &g->kv_n, &g->kv_cap, &v, 4);
    g->n_kv++;
}
static void kv_f32(gw *g, const char *pre, const char *k, float v) {
    char key[200];
    snprintf(key, sizeof key, "%s%s", pre, k);
    uint64_t l = strlen(key);
    app(&g->kv, &g->kv_n, &g->kv_cap, &l, 8);
    app(&g->kv, &g->kv_n, &g->kv_cap, key, l);
    uint32_t t = CMF_GGUF_F32;
    app(&g->kv, &g->kv_n, &g->kv_cap, &t, 4);
    app(&g->kv, &g->kv_n, &g->kv_cap, &v, 4);
    g->n_kv++;
}
/* ne in GGUF order; data already in the ggml type's bytes. */
static void add_t(gw *g, const char *name, uint32_t type, uint32_t nd, const uint64_t *ne, const void *d, size_t nb) {
    uint64_t l = strlen(name);
    app(&g->ti, &g->ti_n, &g->ti_cap, &l, 8);
    app(&g->ti, &g->ti_n, &g->ti_cap, name, l);
    app(&g->ti, &g->ti_n, &g->ti_cap, &nd, 4);
    app(&g->ti, &g->ti_n, &g->ti_cap, ne, 8 * nd);
    app(&g->ti, &g->ti_n, &g->ti_cap, &type, 4);
    uint64_t off = g->data_n;
    app(&g->ti, &g->ti_n, &g->ti_cap, &off, 8);
    app(&g->data, &g->data_n, &g->data_cap, d, nb);
    static const uint8_t z[32] = {0};
    if (g->data_n % 32) app(&g->data, &g->data_n, &g->data_cap, z, 32 - g->data_n % 32);
    g->n_t++;
}
static int gw_write(gw *g, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint32_t magic = 0x46554747u, ver = 3;
    uint64_t nt = g->n_t, nkv = g->n_kv;
    fwrite(&magic, 4, 1, f);
    fwrite(&ver, 4, 1, f);
    fwrite(&nt, 8, 1, f);
    fwrite(&nkv, 8, 1, f);
    fwrite(g->kv, 1, g->kv_n, f);
    fwrite(g->ti, 1, g->ti_n, f);
    size_t pos = 24 + g->kv_n + g->ti_n;
    while (pos % 32) fputc(0, f), pos++;
    fwrite(g->data, 1, g->data_n, f);
    free(g->kv);
    free(g->ti);
    free(g->data);
    return fclose(f);
}

/* ggml quantize_row_q4_0_ref: d = max/-8 with max the signed value of
 * largest magnitude; q = min(15, (int)(x/d + 8.5)). */
static void quant_q4_0(const float *x, uint8_t *out, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) {
        const float *v = x + 32 * b;
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(v[j]) > amax) amax = fabsf(v[j]), max = v[j];
        float d = max / -8, id = d ? 1.0f / d : 0.0f;
        uint8_t *o = out + 18 * b;
        uint16_t h = cmf_f32_to_f16(d);
        memcpy(o, &h, 2);
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(v[j] * id + 8.5f), q1 = (int)(v[j + 16] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            o[2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* llama.cpp permute (HF -> interleaved): out[h*hd + 2i + j] = in[h*hd + j*hd/2 + i]. */
static void permute_rows(float *w, uint64_t rows, uint64_t cols, uint32_t heads) {
    uint64_t hd = rows / heads, half = hd / 2;
    float *t = malloc(rows * cols * 4);
    for (uint64_t h = 0; h < heads; h++)
        for (uint64_t i = 0; i < half; i++)
            for (uint64_t j = 0; j < 2; j++)
                memcpy(t + (h * hd + 2 * i + j) * cols, w + (h * hd + j * half + i) * cols, cols * 4);
    memcpy(w, t, rows * cols * 4);
    free(t);
}

static const char *gguf_name(const char *hf, const char *arch, char *buf, size_t cap) {
    static const struct { const char *hf, *g; } tab[] = {
        {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"},
        {"self_attn.v_proj", "attn_v"}, {"self_attn.o_proj", "attn_output"}, {"self_attn.qkv_proj", "attn_qkv"},
        {"self_attn.q_norm", "attn_q_norm"}, {"self_attn.k_norm", "attn_k_norm"},
        {"pre_feedforward_layernorm", "ffn_norm"}, {"post_feedforward_layernorm", "post_ffw_norm"},
        {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"}, {"mlp.gate_up_proj", "ffn_up"},
        {"mlp.down_proj", "ffn_down"}, {"mlp.gate", "ffn_gate_inp"},
    };
    if (!strcmp(hf, "model.embed_tokens.weight")) return "token_embd.weight";
    if (!strcmp(hf, "model.norm.weight")) return "output_norm.weight";
    if (!strcmp(hf, "lm_head.weight")) return "output.weight";
    unsigned l;
    int pos = 0;
    if (sscanf(hf, "model.layers.%u.%n", &l, &pos) != 1 || !pos) return NULL;
    const char *rest = hf + pos, *dot = strrchr(rest, '.');
    size_t bl = (size_t)(dot - rest);
    if (!strncmp(rest, "post_attention_layernorm", bl) && bl == 24) {
        snprintf(buf, cap, "blk.%u.%s%s", l, !strcmp(arch, "gemma2") ? "post_attention_norm" : "ffn_norm", dot);
        return buf;
    }
    for (size_t i = 0; i < sizeof tab / sizeof *tab; i++)
        if (strlen(tab[i].hf) == bl && !strncmp(rest, tab[i].hf, bl)) {
            snprintf(buf, cap, "blk.%u.%s%s", l, tab[i].g, dot);
            return buf;
        }
    return NULL;
}

static double cfgnum(const cJSON *c, const char *k, double d) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, k);
    return cJSON_IsNumber(v) ? v->valuedouble : d;
}

/* Write <tmp>/<folder>.gguf from the parity folder; q4: Q4_0 matrices. */
/* make_gguf with the keys of `patch` (a JSON object, NULL = none) replacing
 * config.json's before the metadata is written. */
static bool make_gguf_patched(const char *data, const char *folder, const char *arch, const char *out, bool q4,
                              double rope_factor, bool longrope, const char *patch);
static bool make_gguf(const char *data, const char *folder, const char *arch, const char *out, bool q4, double rope_factor, bool longrope) {
    return make_gguf_patched(data, folder, arch, out, q4, rope_factor, longrope, NULL);
}
static bool make_gguf_patched(const char *data, const char *folder, const char *arch, const char *out, bool q4,
                              double rope_factor, bool longrope, const char *patch) {
    char p[4200], *text;
    size_t len;
    cmf_error err = {0};
    snprintf(p, sizeof p, "%s/parity/%s/config.json", data, folder);
    if (cmf_read_file(p, &text, &len, &err) != CMF_OK) return false;
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    cJSON *pj = patch ? cJSON_Parse(patch) : NULL, *it;
    cJSON_ArrayForEach(it, pj) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, it->string);
        cJSON_AddItemToObject(cfg, it->string, cJSON_Duplicate(it, true));
    }
    cJSON_Delete(pj);
    snprintf(p, sizeof p, "%s/parity/%s/model.safetensors", data, folder);
    cmf_st_file *s = NULL;
    if (cmf_st_open(p, &s, &err) != CMF_OK) { cJSON_Delete(cfg); return false; }
    gw g = {0};
    char pre[64];
    snprintf(pre, sizeof pre, "%s.", arch);
    kv_str(&g, "general.architecture", arch);
    uint32_t heads = (uint32_t)cfgnum(cfg, "num_attention_heads", 0), kv = (uint32_t)cfgnum(cfg, "num_key_value_heads", heads);
    uint32_t hidden = (uint32_t)cfgnum(cfg, "hidden_size", 0), hd = (uint32_t)cfgnum(cfg, "head_dim", hidden / heads);
    kv_u32(&g, pre, "block_count", (uint32_t)cfgnum(cfg, "num_hidden_layers", 0));
    kv_u32(&g, pre, "context_length", (uint32_t)cfgnum(cfg, "max_position_embeddings", 0));
    kv_u32(&g, pre, "embedding_length", hidden);
    kv_u32(&g, pre, "feed_forward_length", (uint32_t)cfgnum(cfg, "intermediate_size", 0));
    kv_u32(&g, pre, "attention.head_count", heads);
    kv_u32(&g, pre, "attention.head_count_kv", kv);
    kv_u32(&g, pre, "attention.key_length", hd);
    kv_u32(&g, pre, "attention.value_length", hd);
    kv_f32(&g, pre, "attention.layer_norm_rms_epsilon", (float)cfgnum(cfg, "rms_norm_eps", 1e-6));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    kv_f32(&g, pre, "rope.freq_base", (float)cfgnum(rp, "rope_theta", 10000));
    if (cfgnum(cfg, "sliding_window", 0) > 0) kv_u32(&g, pre, "attention.sliding_window", (uint32_t)cfgnum(cfg, "sliding_window", 0));
    if (cfgnum(cfg, "attn_logit_softcapping", 0) > 0) kv_f32(&g, pre, "attn_logit_softcapping", (float)cfgnum(cfg, "attn_logit_softcapping", 0));
    if (cfgnum(cfg, "final_logit_softcapping", 0) > 0) kv_f32(&g, pre, "final_logit_softcapping", (float)cfgnum(cfg, "final_logit_softcapping", 0));
    uint32_t ne_exp = (uint32_t)cfgnum(cfg, "num_local_experts", cfgnum(cfg, "num_experts", 0));
    if (ne_exp) {
        kv_u32(&g, pre, "expert_count", ne_exp);
        kv_u32(&g, pre, "expert_used_count", (uint32_t)cfgnum(cfg, "num_experts_per_tok", 0));
        kv_u32(&g, pre, "expert_feed_forward_length", (uint32_t)cfgnum(cfg, "moe_intermediate_size", 0));
    }
    if (!strcmp(arch, "phi3")) kv_u32(&g, pre, "rope.dimension_count", hd);
    bool gemma = !strncmp(arch, "gemma", 5), llama = !strcmp(arch, "llama");
    if (rope_factor != 0) {
        /* llama.cpp's rope_freqs for Llama 3 scaling (low 1, high 4, context
         * 8192); a negative factor writes a vector that matches nothing. */
        float rf[256];
        double theta = cfgnum(rp, "rope_theta", 10000);
        for (uint32_t i = 0; i < hd / 2; i++) {
            double freq = 1.0 / pow(theta, 2.0 * i / hd), wl = 2 * M_PI / freq, f;
            double fac = fabs(rope_factor);
            if (wl < 8192 / 4.0) f = 1;
            else if (wl > 8192 / 1.0) f = fac;
            else {
                double sm = (8192 / wl - 1) / 3.0;
                f = 1 / ((1 - sm) / fac + sm);
            }
            rf[i] = (float)(rope_factor < 0 ? f * 1.5 : f);
        }
        uint64_t ne[1] = {hd / 2};
        add_t(&g, "rope_freqs.weight", CMF_GGML_F32, 1, ne, rf, hd / 2 * 4);
    }
    if (longrope) {
        float lf[256], sf[256];
        for (uint32_t i = 0; i < hd / 2; i++) lf[i] = 1.0f + 0.25f * (float)i, sf[i] = 1.0f + 0.01f * (float)i;
        uint64_t ne[1] = {hd / 2};
        add_t(&g, "rope_factors_long.weight", CMF_GGML_F32, 1, ne, lf, hd / 2 * 4);
        add_t(&g, "rope_factors_short.weight", CMF_GGML_F32, 1, ne, sf, hd / 2 * 4);
        kv_u32(&g, pre, "rope.scaling.original_context_length", 4096);
    }
    char nb[256];
    for (size_t i = 0; i < cmf_st_count(s); i++) {
        const cmf_st_tensor *t = cmf_st_at(s, i);
        float *v = malloc(t->nelem * 4);
        cmf_st_to_f32(t, 0, t->nelem, v);
        uint64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->shape[t->ndim - 1];
        if (llama && (strstr(t->name, "q_proj.weight") || strstr(t->name, "k_proj.weight")))
            permute_rows(v, rows, cols, strstr(t->name, "q_proj") ? heads : kv);
        size_t nl = strlen(t->name);
        if (gemma && nl > 11 && !strcmp(t->name + nl - 11, "norm.weight"))
            for (uint64_t k = 0; k < t->nelem; k++) v[k] += 1.0f;
        const char *ex = strstr(t->name, ".mlp.experts.");
        if (ex) {
            /* stack experts: emit once, at expert 0 of each projection */
            unsigned l, e;
            char proj[32];
            if (sscanf(t->name, "model.layers.%u.mlp.experts.%u.%31[a-z_]", &l, &e, proj) == 3 && e == 0) {
                float *all = malloc(t->nelem * 4 * ne_exp);
                for (unsigned k = 0; k < ne_exp; k++) {
                    char en[256];
                    snprintf(en, sizeof en, "model.layers.%u.mlp.experts.%u.%s.weight", l, k, proj);
                    cmf_st_to_f32(cmf_st_find(s, en), 0, t->nelem, all + k * t->nelem);
                }
                char gname[256];
                proj[strlen(proj) - 5] = 0; /* "gate_proj" -> "gate" */
                snprintf(gname, sizeof gname, "blk.%u.ffn_%s_exps.weight", l, proj);
                uint64_t ne[3] = {cols, rows, ne_exp};
                add_t(&g, gname, CMF_GGML_F32, 3, ne, all, t->nelem * 4 * ne_exp);
                free(all);
            }
            free(v);
            continue;
        }
        const char *gn = gguf_name(t->name, arch, nb, sizeof nb);
        if (!gn) { fprintf(stderr, "no gguf name for %s\n", t->name); free(v); continue; }
        uint64_t ne[2] = {cols, rows};
        if (q4 && t->ndim == 2 && cols % 32 == 0) {
            uint8_t *qb = malloc(t->nelem / 32 * 18);
            quant_q4_0(v, qb, t->nelem);
            add_t(&g, gn, CMF_GGML_Q4_0, 2, ne, qb, t->nelem / 32 * 18);
            free(qb);
        } else {
            add_t(&g, gn, CMF_GGML_F32, t->ndim, ne, v, t->nelem * 4);
        }
        free(v);
    }
    cmf_st_close(s);
    cJSON_Delete(cfg);
    return gw_write(&g, out) == 0;
}

static void compare_arch(const char *a, const char *b, const char *what) {
    cmf_file *fa = NULL, *fb = NULL;
    cmf_error err;
    if (cmf_file_open(a, &fa, &err) || cmf_file_open(b, &fb, &err)) { CHECK(0, "%s", err.msg); cmf_file_close(fa); return; }
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(cmf_file_header(fa), "arch");
    const cJSON *y = cJSON_GetObjectItemCaseSensitive(cmf_file_header(fb), "arch");
    static const char *keys[] = {"hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_kv_heads",
                                 "head_dim", "vocab_size", "norm_style", "rope_theta", "layer_types", "sliding_window",
                                 "tie_word_embeddings", "hidden_act", "embedding_multiplier", "attn_logit_softcapping",
                                 "final_logit_softcapping", "query_pre_attn_scalar", "partial_rotary_factor"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(x, keys[i]), *v = cJSON_GetObjectItemCaseSensitive(y, keys[i]);
        bool nullish_u = !u || cJSON_IsNull(u), nullish_v = !v || cJSON_IsNull(v);
        bool same = (nullish_u && nullish_v) || (u && v && cJSON_Compare(u, v, 1)) ||
                    (cJSON_IsNumber(u) && cJSON_IsNumber(v) && fabs(u->valuedouble - v->valuedouble) <= 1e-6 * fabs(u->valuedouble));
        CHECK(same, "%s: arch.%s differs: %s vs %s", what, keys[i], u ? cJSON_PrintUnformatted(u) : "absent",
              v ? cJSON_PrintUnformatted(v) : "absent");
    }
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(x, "moe"), *my = cJSON_GetObjectItemCaseSensitive(y, "moe");
    CHECK(cJSON_IsNull(mx) == cJSON_IsNull(my), "%s: moe", what);
    cmf_file_close(fa);
    cmf_file_close(fb);
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("shared data absent");
    const char *tmp = test_tmp_dir("gguf_vs_hf");
    static const struct { const char *folder, *arch; } cases[] = {
        {"llama", "llama"}, {"llama-tied", "llama"}, {"qwen2", "qwen2"}, {"qwen3", "qwen3"},
        {"qwen3-moe", "qwen3moe"}, {"gemma", "gemma"}, {"gemma2", "gemma2"}, {"phi3", "phi3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char gguf[4400], a[4400], b[4400], dir[4200];
        snprintf(gguf, sizeof gguf, "%s/%s.gguf", tmp, cases[i].folder);
        snprintf(a, sizeof a, "%s/%s-hf.cmf", tmp, cases[i].folder);
        snprintf(b, sizeof b, "%s/%s-gguf.cmf", tmp, cases[i].folder);
        snprintf(dir, sizeof dir, "%s/parity/%s", data, cases[i].folder);
        if (!make_gguf(data, cases[i].folder, cases[i].arch, gguf, false, 0, false)) { CHECK(0, "make gguf %s", cases[i].folder); continue; }
        cmf_import_opts o = {.quant = "f32"};
        cmf_error err = {0};
        cmf_status s1 = cmf_convert_hf(dir, a, &o, &err);
        CHECK(s1 == CMF_OK, "convert %s: %s", cases[i].folder, err.msg);
        cmf_status s2 = cmf_import_gguf(gguf, b, &o, &err);
        CHECK(s2 == CMF_OK, "import-gguf %s: %s", cases[i].folder, err.msg);
        if (s1 || s2) continue;
        /* gemma norms go through (w + 1) - 1 in f32: allow one rounding. */
        float tol = !strncmp(cases[i].arch, "gemma", 5) ? 2e-7f : 0.0f;
        CHECK(compare_cmf(a, b, tol) == 0, "%s: GGUF import differs from convert", cases[i].folder);
        compare_arch(a, b, cases[i].folder);
    }
    /* Q4_0 + keep: lossless repack into q4_tiled, equal to the f32 import. */
    char gq[4400], keep[4400], f32[4400];
    snprintf(gq, sizeof gq, "%s/llama-q4_0.gguf", tmp);
    snprintf(keep, sizeof keep, "%s/llama-q4_0-keep.cmf", tmp);
    snprintf(f32, sizeof f32, "%s/llama-q4_0-f32.cmf", tmp);
    if (make_gguf(data, "llama", "llama", gq, true, 0, false)) {
        cmf_import_opts ok = {.quant = "keep"}, of = {.quant = "f32"};
        cmf_error err = {0};
        CHECK(cmf_import_gguf(gq, keep, &ok, &err) == CMF_OK, "keep: %s", err.msg);
        CHECK(cmf_import_gguf(gq, f32, &of, &err) == CMF_OK, "f32: %s", err.msg);
        CHECK(compare_cmf(keep, f32, 0.0f) == 0, "Q4_0 keep is not lossless");
        cmf_file *f = NULL;
        if (cmf_file_open(keep, &f, &err) == CMF_OK) {
            const cmf_tensor *t = cmf_file_find(f, "model.layers.0.self_attn.q_proj.weight");
            CHECK(t && t->dtype == CMF_DT_Q4_TILED, "Q4_0 q_proj kept as q4_tiled");
            cmf_file_close(f);
        }
    }
    /* Llama 3 rope scaling recovered from rope_freqs.weight; an unknown vector is refused. */
    char g3[4400], o3[4400];
    snprintf(g3, sizeof g3, "%s/llama3.gguf", tmp);
    snprintf(o3, sizeof o3, "%s/llama3.cmf", tmp);
    if (make_gguf(data, "llama", "llama", g3, false, 32, false)) {
        cmf_import_opts o = {.quant = "f32"};
        cmf_error err = {0};
        CHECK(cmf_import_gguf(g3, o3, &o, &err) == CMF_OK, "llama3 rope: %s", err.msg);
        cmf_file *f = NULL;
        if (cmf_file_open(o3, &f, &err) == CMF_OK) {
            const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "arch"), "rope_scaling");
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type"), *fa = cJSON_GetObjectItemCaseSensitive(rs, "factor");
            CHECK(cJSON_IsString(ty) && !strcmp(ty->valuestring, "llama3") && cJSON_IsNumber(fa) && fa->valuedouble == 32,
                  "llama3 rope_scaling recovered");
            CHECK(!cmf_file_find(f, "rope_freqs.weight"), "rope_freqs not stored as a tensor");
            cmf_file_close(f);
        }
    }
    if (make_gguf(data, "llama", "llama", g3, false, -8, false)) {
        cmf_import_opts o = {.quant = "f32"};
        cmf_error err = {0};
        CHECK(cmf_import_gguf(g3, o3, &o, &err) == CMF_ERR_UNSUPPORTED && strstr(err.msg, "rope_freqs"),
              "unknown rope_freqs refused: %s", err.msg);
    }
    /* phi3 longrope factors -> rope_scaling {rope_type: longrope, long_factor, short_factor}. */
    if (make_gguf(data, "phi3", "phi3", g3, false, 0, true)) {
        cmf_import_opts o = {.quant = "f32"};
        cmf_error err = {0};
        CHECK(cmf_import_gguf(g3, o3, &o, &err) == CMF_OK, "longrope: %s", err.msg);
        cmf_file *f = NULL;
        if (cmf_file_open(o3, &f, &err) == CMF_OK) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "arch");
            const cJSON *rs = cJSON_GetObjectItemCaseSensitive(a, "rope_scaling");
            const cJSON *lf = cJSON_GetObjectItemCaseSensitive(rs, "long_factor");
            CHECK(cJSON_GetArraySize(lf) == 8 && cJSON_GetArrayItem(lf, 2)->valuedouble == 1.5, "long_factor");
            CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(rs, "short_factor")) == 8, "short_factor");
            const cJSON *om = cJSON_GetObjectItemCaseSensitive(a, "original_max_position_embeddings");
            CHECK(cJSON_IsNumber(om) && om->valuedouble == 4096, "original_max_position_embeddings");
            cmf_file_close(f);
        }
    }
    /* the header checks convert has: an eps of 0 or a negative RoPE base is
     * refused at import (naming the key), not at the first run, and leaves
     * no output and no temporary file */
    static const struct { const char *patch, *key; } bad[] = {
        {"{\"rms_norm_eps\": 0}", "rms_norm_eps"},
        {"{\"rope_parameters\": {\"rope_theta\": -1}}", "rope_theta"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char gb[4400];
        snprintf(gb, sizeof gb, "%s/bad_arch.gguf", tmp);
        if (!make_gguf_patched(data, "llama", "llama", gb, false, 0, false, bad[i].patch)) {
            CHECK(0, "make gguf %s", bad[i].patch);
            continue;
        }
        cmf_import_opts o = {.quant = "f32"};
        cmf_error err = {0};
        snprintf(o3, sizeof o3, "%s/bad_arch_out.cmf", tmp);
        unlink(o3); /* an earlier run's */
        cmf_status st = cmf_import_gguf(gb, o3, &o, &err);
        CHECK(st == CMF_ERR_FORMAT && strstr(err.msg, "bad_arch.gguf") && strstr(err.msg, bad[i].key),
              "%s: got %s \"%s\"", bad[i].patch, cmf_status_name(st), err.msg);
        CHECK(no_leftovers(tmp, "bad_arch_out"), "%s: output left behind", bad[i].patch);
    }
    return test_done();
}
