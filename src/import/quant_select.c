/*
 * quant_select.c — the importers' --quant policy (issue 3): which CMF dtype
 * each tensor gets, and the one place that encodes a float32 tensor and
 * hands it to the writer. Also small shared helpers (EOS id lists, the
 * rotary row un-permutation).
 */
#include "import/import_internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name, *label;
    cmf_dtype dt;
} quants[] = {
    {"f32", "F32", CMF_DT_F32},           {"f16", "F16", CMF_DT_F16},
    {"bf16", "BF16", CMF_DT_BF16},        {"q8", "Q8_ROW", CMF_DT_Q8_ROW},
    {"q8_row", "Q8_ROW", CMF_DT_Q8_ROW},  {"q8_2f", "Q8_2F", CMF_DT_Q8_2F},
    {"q4", "Q4_BLOCK", CMF_DT_Q4_BLOCK},  {"q4_block", "Q4_BLOCK", CMF_DT_Q4_BLOCK},
    {"q4t", "Q4_TILED", CMF_DT_Q4_TILED}, {"q4_tiled", "Q4_TILED", CMF_DT_Q4_TILED},
    {"q4tp", "Q4TP", CMF_DT_Q4TP},
    /* llama.cpp's names (llama-quantize, convert_hf_to_gguf --outtype) where a
     * CMF dtype has the same layout idea: one scale per row / per 32 values */
    {"q8_0", "Q8_ROW", CMF_DT_Q8_ROW},    {"q4_0", "Q4_BLOCK", CMF_DT_Q4_BLOCK},
};

cmf_status cmf_imp_quant_parse(const char *q, bool allow_keep, cmf_imp_quant *out, cmf_error *err) {
    if (!q) q = "q8";
    memset(out, 0, sizeof *out);
    out->name = q;
    if (allow_keep && strcasecmp(q, "keep") == 0) {
        out->keep = true;
        out->matrix = CMF_DT_Q8_ROW; /* for types with no lossless CMF equivalent */
        return CMF_OK;
    }
    for (size_t i = 0; i < sizeof quants / sizeof *quants; i++)
        if (strcasecmp(q, quants[i].name) == 0) {
            out->matrix = quants[i].dt;
            return CMF_OK;
        }
    return cmf_error_set(err, CMF_ERR_ARG,
                         "--quant '%s' is not one of f32, f16, bf16, q8 (= q8_row, Q8_0), q8_2f, "
                         "q4 (= q4_block, Q4_0), q4t (= q4_tiled), q4tp%s (case-insensitive)",
                         q, allow_keep ? ", keep" : "");
}

cmf_status cmf_imp_begin(const cmf_import_opts *opts, const char *dflt_quant, bool allow_keep,
                         const char *out_path, cmf_imp_quant *q, cmf_writer_opts *wo, cmf_error *err) {
    memset(wo, 0, sizeof *wo);
    cmf_status st = cmf_imp_quant_parse(opts && opts->quant ? opts->quant : dflt_quant, allow_keep, q, err);
    if (st != CMF_OK || (st = cmf_writer_check_path(out_path, err)) != CMF_OK) return st;
    if (opts && opts->shard_max_gb > 0) wo->shard_max_bytes = (uint64_t)(opts->shard_max_gb * 1e9);
    if (wo->shard_max_bytes && (st = cmf_writer_check_shard_path(out_path, err)) != CMF_OK) return st;
    if (opts) wo->cancel = opts->cancel, wo->cancel_ctx = opts->cancel_ctx;
    return CMF_OK;
}

const char *cmf_imp_quant_label(const cmf_imp_quant *q) {
    if (q->keep) return "KEEP";
    for (size_t i = 0; i < sizeof quants / sizeof *quants; i++)
        if (quants[i].dt == q->matrix) return quants[i].label;
    return "UNKNOWN";
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

cmf_dtype cmf_imp_pick_dtype(const cmf_imp_quant *q, const char *name, uint32_t ndim,
                             const uint64_t *shape) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndim; i++) n *= shape[i];
    cmf_dtype small = q->matrix == CMF_DT_F32 ? CMF_DT_F32 : CMF_DT_F16;
    if (ndim != 2 || n < 32) return small;
    if (q->matrix == CMF_DT_F32 || q->matrix == CMF_DT_F16 || q->matrix == CMF_DT_BF16)
        return q->matrix;
    /* MoE router: tiny and sensitive (the original tool keeps it f16 too). */
    if (ends_with(name, "mlp.gate.weight")) return small;
    if ((q->matrix == CMF_DT_Q4_BLOCK || q->matrix == CMF_DT_Q4_TILED || q->matrix == CMF_DT_Q4TP) &&
        shape[1] % 32 != 0)
        return CMF_DT_Q8_ROW;
    return q->matrix;
}

cmf_status cmf_imp_add(cmf_writer *w, const cmf_imp_quant *q, const char *name, uint32_t ndim,
                       const uint64_t *shape, const float *data, cmf_error *err) {
    cmf_dtype dt = cmf_imp_pick_dtype(q, name, ndim, shape);
    cmf_status st = cmf_writer_add_f32(w, name, dt, ndim, shape, data, err);
    if (st != CMF_OK && st != CMF_ERR_CANCELLED) cmf_error_prefix(err, "tensor '%s' (%s)", name, cmf_dtype_name(dt));
    return st;
}

cmf_status cmf_imp_add_eos(cJSON *ids, double id, cmf_error *err) {
    const cJSON *e;
    cJSON_ArrayForEach(e, ids) if (e->valuedouble == id) return CMF_OK;
    cJSON *n = cJSON_CreateNumber(id);
    if (!n) return cmf_error_set(err, CMF_ERR_NOMEM, "eos_token_ids: out of memory");
    cJSON_AddItemToArray(ids, n);
    return CMF_OK;
}

cmf_status cmf_imp_alloc_f32(uint64_t n, float **out, const char *what, cmf_error *err) {
    uint64_t bytes;
    if (!cmf_mul_ok(n, sizeof(float), &bytes) || bytes > SIZE_MAX || !(*out = malloc(bytes ? (size_t)bytes : 1)))
        return cmf_error_set(err, CMF_ERR_NOMEM, "%s: cannot allocate %llu floats", what,
                             (unsigned long long)n);
    return CMF_OK;
}

cmf_status cmf_imp_unpermute_rows(float *w, uint64_t rows, uint64_t cols, uint32_t n_head,
                                  cmf_error *err) {
    if (n_head == 0 || rows % n_head != 0 || (rows / n_head) % 2 != 0)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "rotary un-permute: %llu rows do not split into %u heads of even size",
                             (unsigned long long)rows, n_head);
    uint64_t hd = rows / n_head, half = hd / 2;
    float *tmp;
    cmf_status st = cmf_imp_alloc_f32(hd * cols, &tmp, "rotary un-permute", err);
    if (st != CMF_OK) return st;
    for (uint32_t h = 0; h < n_head; h++) {
        float *head = w + (uint64_t)h * hd * cols;
        for (uint64_t i = 0; i < half; i++)
            for (uint64_t j = 0; j < 2; j++)
                memcpy(tmp + (j * half + i) * cols, head + (2 * i + j) * cols, cols * sizeof(float));
        memcpy(head, tmp, hd * cols * sizeof(float));
    }
    free(tmp);
    return CMF_OK;
}
