/*
 * rope.c — rotary position embedding frequencies from header.arch.
 *
 * inv_freq[i] = 1 / base^(2i / n_rot), i < n_rot/2, n_rot = head_dim ·
 * partial_rotary_factor (RoFormer, Su et al. 2021), then modified by the
 * scaling of `rope_scaling.rope_type`, following the semantics of Hugging
 * Face transformers' modeling_rope_utils `_compute_*_parameters`:
 *   default  — as above;
 *   linear   — inv_freq / factor (positions interpolated);
 *   llama3   — wavelengths above original_max/low_freq_factor divided by
 *              factor, below original_max/high_freq_factor kept, smooth in
 *              between;
 *   yarn     — per-dim blend of interpolation and extrapolation with a
 *              linear ramp between the correction dims of beta_fast /
 *              beta_slow, and cos/sin scaled by attention_factor
 *              (default 0.1·ln(factor) + 1, or the mscale ratio)
 *              (Peng et al. 2023, "YaRN");
 *   longrope — per-dim factors: inv_freq[i] = 1 / (ext[i] · base^(2i/n_rot))
 *              with ext = long_factor when the context exceeds
 *              original_max_position_embeddings, else short_factor, and
 *              cos/sin scaled by attention_factor (default
 *              sqrt(1 + ln(factor) / ln(original_max)), factor =
 *              max_position_embeddings / original_max unless given)
 *              (Ding et al. 2024, "LongRoPE"; Phi-3.5, Phi-4-mini).
 *              transformers switches factor sets per forward call by the
 *              sequence length; the tables here are fixed per model load,
 *              so the set is chosen once from the context the model is run
 *              with (llama.cpp's rule: long when n_ctx > original_max).
 * `dynamic` (NTK) rescales with the sequence length as it grows and is
 * refused. Sliding layers use `rope_local_base_freq` with default scaling
 * when the file has it (gemma3); otherwise the global table.
 *
 * Every value is checked before use (a positive finite base and factors,
 * an even number of rotated dims, factor lists of n_rot/2 entries), so a
 * bad header is an error naming the key, never NaN logits.
 */
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where messages come from: "<path>: <key> ..." with key the full name. */
typedef struct rope_src {
    const char *path;
    const char *pfx;   /* prefix of header.arch keys: "arch." in a file, "" in config.json */
    const char *sc;    /* full name of the scaling object */
    cmf_error *err;
} rope_src;

static double num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* sc[key] as a positive finite number: dflt when absent or null (or 0,
 * when zero_dflt: HF's `x or default`). */
static bool pos_num(const rope_src *s, const cJSON *sc, const char *key, double dflt, bool zero_dflt, double *out) {
    const cJSON *v = sc ? cJSON_GetObjectItemCaseSensitive(sc, key) : NULL;
    *out = dflt;
    if (!v || cJSON_IsNull(v) || (zero_dflt && cJSON_IsNumber(v) && v->valuedouble == 0)) return true;
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble > 0) {
        *out = v->valuedouble;
        return true;
    }
    cmf_error_set(s->err, CMF_ERR_FORMAT, "%s: %s.%s: must be a positive number", s->path, s->sc, key);
    return false;
}

static double yarn_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_corr_dim(double n_rotations, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (n_rotations * 2.0 * M_PI))) / (2.0 * log(base));
}

/* longrope's short_factor / long_factor: n positive finite numbers. */
static bool factor_list(const rope_src *s, const cJSON *sc, const char *key, int n, float *out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(sc, key);
    int k = 0;
    const cJSON *e;
    if (cJSON_IsArray(a))
        cJSON_ArrayForEach(e, a) {
            if (k == n || !cJSON_IsNumber(e) || !isfinite(e->valuedouble) || !(e->valuedouble > 0)) {
                k = -1;
                break;
            }
            if (out) out[k] = (float)e->valuedouble;
            k++;
        }
    if (k == n) return true;
    cmf_error_set(s->err, CMF_ERR_FORMAT, "%s: %s.%s: must be a list of %d positive numbers (rotary dims / 2)",
                  s->path, s->sc, key, n);
    return false;
}

/* The pre-extension context of llama3 / yarn / longrope: the scaling
 * object's original_max_position_embeddings (cmf convert puts it there,
 * transformers' standardize_rope_params), else arch's top-level one (Phi3
 * keeps it there; GGUF imports), else dflt. */
static bool orig_ctx(const rope_src *s, const cJSON *sc, double top, double dflt, double *out) {
    if (!pos_num(s, sc, "original_max_position_embeddings", top > 0 ? top : dflt, false, out)) return false;
    if (*out >= 1) return true;
    cmf_error_set(s->err, CMF_ERR_FORMAT, "%s: %s.original_max_position_embeddings: must be >= 1", s->path, s->sc);
    return false;
}

/* Fill t (n_rot/2 frequencies) for base and scaling object sc (NULL =
 * default); max_pos = max_position_embeddings, top_orig = arch's
 * top-level original_max_position_embeddings (0 = absent), n_ctx = the
 * context the model runs with (longrope). */
static cmf_status rope_table(cmf_rope_table *t, int n_rot, bool interleaved, double base, const char *base_key,
                             const cJSON *sc, double max_pos, double top_orig, double n_ctx, const rope_src *s) {
    cmf_error *err = s->err;
    if (!isfinite(base) || !(base > 0))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s%s %g: must be a positive number", s->path, s->pfx,
                             base_key, base);
    int half = n_rot / 2;
    t->inv_freq = malloc((size_t)(half ? half : 1) * sizeof(float));
    if (!t->inv_freq) return cmf_error_set(err, CMF_ERR_NOMEM, "rope: out of memory");
    t->rope.n_rot = n_rot;
    t->rope.interleaved = interleaved;
    t->rope.inv_freq = t->inv_freq;
    t->rope.attn_factor = 1.0f;
    /* HF: base ** (arange(0, dim, 2).float() / dim), in float32 */
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)n_rot;
        t->inv_freq[i] = 1.0f / (float)pow(base, (double)e);
    }
    const char *type = "default";
    const cJSON *ty = sc ? cJSON_GetObjectItemCaseSensitive(sc, "rope_type") : NULL;
    if (!cJSON_IsString(ty) && sc) ty = cJSON_GetObjectItemCaseSensitive(sc, "type");
    if (cJSON_IsString(ty)) type = ty->valuestring;

    if (strcmp(type, "default") == 0) return CMF_OK;
    if (strcmp(type, "dynamic") == 0)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                             "%s: %s.rope_type \"dynamic\" (dynamic NTK scaling) is not supported: it rescales "
                             "RoPE as the sequence grows (supported: default, linear, llama3, yarn, longrope)",
                             s->path, s->sc);
    if (strcmp(type, "linear") != 0 && strcmp(type, "llama3") != 0 && strcmp(type, "yarn") != 0 &&
        strcmp(type, "longrope") != 0)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                             "%s: %s.rope_type \"%.32s\" is not supported (default, linear, llama3, yarn, longrope)",
                             s->path, s->sc, type);
    /* transformers' rope validation requires these keys (a missing one is a
     * KeyError there); a default here would silently run another model. */
    bool is_llama3 = strcmp(type, "llama3") == 0;
    const char *need[] = {"factor", is_llama3 ? "low_freq_factor" : NULL, is_llama3 ? "high_freq_factor" : NULL};
    for (int k = 0; k < 3 && (is_llama3 || strcmp(type, "linear") == 0); k++)
        if (need[k] && !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(sc, need[k])))
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s.%s: required for rope_type \"%s\"", s->path, s->sc,
                                 need[k], type);
    double factor;
    if (!pos_num(s, sc, "factor", 1.0, false, &factor)) return err->status;
    if (strcmp(type, "linear") == 0) {
        for (int i = 0; i < half; i++) t->inv_freq[i] = (float)(t->inv_freq[i] / factor);
        return CMF_OK;
    }
    if (strcmp(type, "llama3") == 0) {
        double lo, hi, old;
        if (!pos_num(s, sc, "low_freq_factor", 1.0, false, &lo) || !pos_num(s, sc, "high_freq_factor", 4.0, false, &hi) ||
            !orig_ctx(s, sc, top_orig, 8192.0, &old))
            return err->status;
        if (hi == lo)
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s: high_freq_factor must differ from low_freq_factor",
                                 s->path, s->sc);
        double lo_wl = old / lo, hi_wl = old / hi;
        for (int i = 0; i < half; i++) {
            double f = t->inv_freq[i], wl = 2.0 * M_PI / f, r;
            if (wl < hi_wl) r = f;
            else if (wl > lo_wl) r = f / factor;
            else {
                double sm = (old / wl - lo) / (hi - lo);
                r = (1.0 - sm) * f / factor + sm * f;
            }
            t->inv_freq[i] = (float)r;
        }
        return CMF_OK;
    }
    if (strcmp(type, "yarn") == 0) {
        /* transformers 5: factor as given; only when absent, the ratio
         * max_position_embeddings / original_max_position_embeddings */
        double orig, af, bf, bs, ms = num(sc, "mscale", 0.0), msa = num(sc, "mscale_all_dim", 0.0);
        if (!orig_ctx(s, sc, top_orig, max_pos, &orig)) return err->status;
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(sc, "factor"))) factor = max_pos / orig;
        if (!pos_num(s, sc, "attention_factor", 0.0, true, &af) || !pos_num(s, sc, "beta_fast", 32.0, true, &bf) ||
            !pos_num(s, sc, "beta_slow", 1.0, true, &bs))
            return err->status;
        if (af <= 0)
            af = (ms != 0 && msa != 0) ? yarn_mscale(factor, ms) / yarn_mscale(factor, msa)
                                       : yarn_mscale(factor, 1.0);
        const cJSON *tr = cJSON_GetObjectItemCaseSensitive(sc, "truncate");
        bool truncate = !cJSON_IsFalse(tr);
        double low = yarn_corr_dim(bf, n_rot, base, orig), high = yarn_corr_dim(bs, n_rot, base, orig);
        if (truncate) { low = floor(low); high = ceil(high); }
        if (low < 0) low = 0;
        if (high > n_rot - 1) high = n_rot - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            float extra = t->inv_freq[i];
            float inter = (float)(1.0 / (factor * (1.0 / extra)));
            double ramp = ((double)i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double ef = 1.0 - ramp; /* extrapolation weight */
            t->inv_freq[i] = (float)(inter * (1.0 - ef) + extra * ef);
        }
        t->rope.attn_factor = (float)af;
        return CMF_OK;
    }
    /* longrope */
    double orig, af;
    if (!orig_ctx(s, sc, top_orig, max_pos, &orig)) return err->status;
    if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(sc, "factor"))) factor = max_pos / orig;
    if (!pos_num(s, sc, "attention_factor", 0.0, true, &af)) return err->status;
    if (af <= 0) af = factor <= 1.0 || orig <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log(orig));
    bool use_long = n_ctx > orig;
    /* both lists are checked, whichever is used */
    if (!factor_list(s, sc, "short_factor", half, use_long ? NULL : t->inv_freq) ||
        !factor_list(s, sc, "long_factor", half, use_long ? t->inv_freq : NULL))
        return err->status;
    /* HF: 1.0 / (ext_factors * base ** (arange(0, dim, 2).float() / dim)), float32 */
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)n_rot;
        t->inv_freq[i] = 1.0f / (t->inv_freq[i] * (float)pow(base, (double)e));
    }
    t->rope.attn_factor = (float)af;
    return CMF_OK;
}

/* Both tables from arch (+ hf_config_extras) for head_dim and a context of
 * n_ctx tokens; on error the tables may hold allocations (caller frees). */
static cmf_status rope_build(const cJSON *arch, const cJSON *extras, uint32_t head_dim, double n_ctx,
                             const char *path, const char *pfx, cmf_rope_table *global, cmf_rope_table *local,
                             cmf_error *err) {
    const cJSON *rp = cJSON_IsObject(extras) ? cJSON_GetObjectItemCaseSensitive(extras, "rope_parameters") : NULL;
    if (!cJSON_IsObject(rp)) rp = NULL;
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(arch, "rope_scaling");
    char scn[64];
    snprintf(scn, sizeof scn, "%srope_scaling", pfx);
    if (!cJSON_IsObject(sc)) { /* original tool: HF rope_parameters */
        sc = rp;
        snprintf(scn, sizeof scn, "provenance.hf_config_extras.rope_parameters");
    }
    rope_src s = {path, pfx, scn, err};
    double base = num(arch, "rope_theta", num(rp, "rope_theta", 10000.0));
    double prf = num(arch, "partial_rotary_factor", num(rp, "partial_rotary_factor", 1.0));
    if (!(prf > 0) || prf > 1)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %spartial_rotary_factor %g: must be in (0, 1]", path, pfx,
                             prf);
    int n_rot = (int)((double)head_dim * prf);
    if (n_rot % 2)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: %shead_dim %u x partial_rotary_factor %g = %d rotated dims: must be even "
                             "(RoPE rotates pairs)",
                             path, pfx, head_dim, prf, n_rot);
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(arch, "rope_layout");
    bool inter = cJSON_IsString(lay) && strcmp(lay->valuestring, "interleaved") == 0;
    if (cJSON_IsString(lay) && !inter && strcmp(lay->valuestring, "neox") != 0)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: %srope_layout \"%s\" not supported", path, pfx,
                             lay->valuestring);
    double max_pos = num(arch, "max_position_embeddings", num(extras, "max_position_embeddings", 4096.0));
    double top_orig = num(arch, "original_max_position_embeddings", num(extras, "original_max_position_embeddings", 0));
    cmf_status st = rope_table(global, n_rot, inter, base, "rope_theta", sc, max_pos, top_orig, n_ctx, &s);
    if (st) return st;
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(arch, "rope_local_base_freq");
    bool has_local = cJSON_IsNumber(lb);
    return rope_table(local, n_rot, inter, has_local ? lb->valuedouble : base,
                      has_local ? "rope_local_base_freq" : "rope_theta", has_local ? NULL : sc, max_pos, top_orig,
                      n_ctx, &s);
}

cmf_status cmf_model_rope_init(cmf_model *m, const cJSON *arch, uint32_t n_ctx, cmf_error *err) {
    const cJSON *prov = cJSON_GetObjectItemCaseSensitive(cmf_file_header(m->file), "provenance");
    const cJSON *extras = cJSON_IsObject(prov) ? cJSON_GetObjectItemCaseSensitive(prov, "hf_config_extras") : NULL;
    return rope_build(arch, extras, m->hp.head_dim, (double)n_ctx, cmf_file_path(m->file), "arch.", &m->rope_global,
                      &m->rope_local, err);
}

cmf_status cmf_rope_check(const cJSON *arch, const cJSON *extras, uint32_t head_dim, const char *path,
                          const char *pfx, cmf_error *err) {
    cmf_rope_table g = {0}, l = {0};
    cmf_status st = rope_build(arch, extras, head_dim, 0, path, pfx, &g, &l, err);
    free(g.inv_freq);
    free(l.inv_freq);
    return st;
}
