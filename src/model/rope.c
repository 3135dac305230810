/*
 * rope.c — rotary position embedding frequencies from header.arch.
 *
 * inv_freq[i] = 1 / base^(2i / n_rot), i < n_rot/2, n_rot = head_dim ·
 * partial_rotary_factor (RoFormer, Su et al. 2021), then modified by the
 * scaling of `rope_scaling.rope_type`, following the semantics of Hugging
 * Face transformers' modeling_rope_utils `_compute_*_parameters`:
 *   default — as above;
 *   linear  — inv_freq / factor (positions interpolated);
 *   llama3  — wavelengths above original_max/low_freq_factor divided by
 *             factor, below original_max/high_freq_factor kept, smooth in
 *             between;
 *   yarn    — per-dim blend of interpolation and extrapolation with a
 *             linear ramp between the correction dims of beta_fast /
 *             beta_slow, and cos/sin scaled by attention_factor
 *             (default 0.1·ln(factor) + 1, or the mscale ratio)
 *             (Peng et al. 2023, "YaRN").
 * Sliding layers use `rope_local_base_freq` with default scaling when the
 * file has it (gemma3); otherwise the global table.
 */
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static double num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static double yarn_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_corr_dim(double n_rotations, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (n_rotations * 2.0 * M_PI))) / (2.0 * log(base));
}

/* Fill t (n_rot/2 frequencies) for base and scaling object sc (NULL = default). */
static cmf_status rope_table(cmf_rope_table *t, int n_rot, bool interleaved, double base,
                             const cJSON *sc, double max_pos, const char *path, cmf_error *err) {
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
    double factor = num(sc, "factor", 1.0);
    if (!(factor > 0))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: arch.rope_scaling.factor invalid", path);
    if (strcmp(type, "linear") == 0) {
        for (int i = 0; i < half; i++) t->inv_freq[i] = (float)(t->inv_freq[i] / factor);
        return CMF_OK;
    }
    if (strcmp(type, "llama3") == 0) {
        double lo = num(sc, "low_freq_factor", 1.0), hi = num(sc, "high_freq_factor", 4.0);
        double old = num(sc, "original_max_position_embeddings", 8192.0);
        double lo_wl = old / lo, hi_wl = old / hi;
        for (int i = 0; i < half; i++) {
            double f = t->inv_freq[i], wl = 2.0 * M_PI / f, r;
            if (wl < hi_wl) r = f;
            else if (wl > lo_wl) r = f / factor;
            else {
                double s = (old / wl - lo) / (hi - lo);
                r = (1.0 - s) * f / factor + s * f;
            }
            t->inv_freq[i] = (float)r;
        }
        return CMF_OK;
    }
    if (strcmp(type, "yarn") == 0) {
        /* transformers 5: factor as given; only when absent, the ratio
         * max_position_embeddings / original_max_position_embeddings */
        double orig = num(sc, "original_max_position_embeddings", max_pos);
        if (orig <= 0) orig = max_pos;
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(sc, "factor"))) factor = max_pos / orig;
        double af = num(sc, "attention_factor", 0.0);
        if (af <= 0) {
            double ms = num(sc, "mscale", 0.0), msa = num(sc, "mscale_all_dim", 0.0);
            af = (ms != 0 && msa != 0) ? yarn_mscale(factor, ms) / yarn_mscale(factor, msa)
                                        : yarn_mscale(factor, 1.0);
        }
        double bf = num(sc, "beta_fast", 32.0), bs = num(sc, "beta_slow", 1.0);
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
    return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: arch.rope_scaling.rope_type \"%s\" not supported",
                         path, type);
}

cmf_status cmf_model_rope_init(cmf_model *m, const cJSON *arch, cmf_error *err) {
    const char *path = cmf_file_path(m->file);
    const cJSON *hdr = cmf_file_header(m->file);
    const cJSON *prov = cJSON_GetObjectItemCaseSensitive(hdr, "provenance");
    const cJSON *extras = cJSON_IsObject(prov) ? cJSON_GetObjectItemCaseSensitive(prov, "hf_config_extras") : NULL;
    const cJSON *rp = cJSON_IsObject(extras) ? cJSON_GetObjectItemCaseSensitive(extras, "rope_parameters") : NULL;
    if (!cJSON_IsObject(rp)) rp = NULL;

    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(arch, "rope_scaling");
    if (!cJSON_IsObject(sc)) sc = rp; /* original tool: HF rope_parameters */
    double base = num(arch, "rope_theta", num(rp, "rope_theta", 10000.0));
    double prf = num(arch, "partial_rotary_factor", num(rp, "partial_rotary_factor", 1.0));
    if (prf <= 0 || prf > 1)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: arch.partial_rotary_factor %g invalid", path, prf);
    int n_rot = (int)((double)m->hp.head_dim * prf);
    n_rot &= ~1;
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(arch, "rope_layout");
    bool inter = cJSON_IsString(lay) && strcmp(lay->valuestring, "interleaved") == 0;
    if (cJSON_IsString(lay) && !inter && strcmp(lay->valuestring, "neox") != 0)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: arch.rope_layout \"%s\" not supported", path,
                             lay->valuestring);
    cmf_status st = rope_table(&m->rope_global, n_rot, inter, base, sc, m->hp.n_ctx_train, path, err);
    if (st) return st;
    double local = num(arch, "rope_local_base_freq", 0.0);
    if (local <= 0) local = base;
    return rope_table(&m->rope_local, n_rot, inter, local,
                      num(arch, "rope_local_base_freq", 0.0) > 0 ? NULL : sc, m->hp.n_ctx_train, path,
                      err);
}
