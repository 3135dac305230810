/*
 * quantize.c — `cmf quantize`: re-encode an existing CMF file (or shard
 * set) at another --quant, as llama-quantize does for GGUF.
 *
 * Every tensor, skill overlays included, gets the dtype the importers'
 * policy gives it (cmf_imp_pick_dtype: what `cmf convert --quant Q` would
 * write from the same values); one already stored in that dtype is copied
 * byte for byte, any other is decoded to float32 and re-encoded through
 * cmf_imp_add, one tensor at a time (peak memory about one tensor as f32
 * plus its encoding). A tensor that is already quantized is re-encoded into
 * another quantized dtype only with allow_requantize (the error otherwise
 * says so), as llama-quantize refuses without --allow-requantize; decoding
 * to f32 is exact and always allowed. The tokenizer and masks sections are
 * copied verbatim; the header is copied key by key (the writer recomputes
 * format, version, shard and section_hashes) with quant_type and
 * provenance.quant set to the new encoding. Payload hashes are checked on
 * the way, as compact does, so corruption is never silently re-encoded.
 */
#include "import/import_internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static bool is_quantized(cmf_dtype dt) { return dt != CMF_DT_F32 && dt != CMF_DT_F16 && dt != CMF_DT_BF16; }

/* Copy the input header into the writer's, naming the new encoding. */
static cmf_status copy_header(const cmf_file *f, cmf_writer *w, const cmf_imp_quant *q, cmf_error *err) {
    cJSON *h = cmf_writer_header(w);
    const cJSON *it;
    cJSON_ArrayForEach(it, cmf_file_header(f)) {
        cJSON *c = it->string ? cJSON_Duplicate(it, true) : NULL;
        if (!c) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory (header)", cmf_file_path(f));
        cJSON_AddItemToObject(h, it->string, c);
    }
    const cJSON *old_qt = cJSON_GetObjectItemCaseSensitive(h, "quant_type");
    char from[64];
    snprintf(from, sizeof from, "%s", cJSON_IsString(old_qt) ? old_qt->valuestring : "unknown");
    cJSON *qt = cJSON_CreateString(cmf_imp_quant_label(q));
    bool ok = qt && (cJSON_GetObjectItemCaseSensitive(h, "quant_type")
                         ? cJSON_ReplaceItemInObjectCaseSensitive(h, "quant_type", qt)
                         : cJSON_AddItemToObject(h, "quant_type", qt));
    if (!ok) cJSON_Delete(qt);
    cJSON *prov = cJSON_GetObjectItemCaseSensitive(h, "provenance");
    if (!cJSON_IsObject(prov)) {
        cJSON_DeleteItemFromObjectCaseSensitive(h, "provenance");
        prov = cJSON_AddObjectToObject(h, "provenance");
    }
    const char *keys[3] = {"quant", "requantized_by", "requantized_from"};
    const char *vals[3] = {q->name, "cmf quantize " CMF_VERSION_STRING, from};
    for (int i = 0; ok && i < 3; i++) {
        cJSON_DeleteItemFromObjectCaseSensitive(prov, keys[i]);
        ok = prov && cJSON_AddStringToObject(prov, keys[i], vals[i]) != NULL;
    }
    return ok ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory (header)", cmf_file_path(f));
}

/* Add tensor t to the writer in the dtype the policy gives it. */
static cmf_status quantize_tensor(cmf_writer *w, const cmf_imp_quant *q, const cmf_tensor *t, bool allow_requantize,
                                  const char *path, cmf_error *err) {
    if (cmf_hash64(t->data, (size_t)t->nbytes) != t->hash64)
        return cmf_error_set(err, CMF_ERR_HASH, "%s: tensor '%s': hash64 mismatch (refusing to quantize a corrupt file)",
                             path, t->name);
    cmf_dtype dt = cmf_imp_pick_dtype(q, t->name, t->ndim, t->shape);
    if (dt == t->dtype) return cmf_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, err);
    if (is_quantized(t->dtype) && dt != CMF_DT_F32 && !allow_requantize)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                             "%s: tensor '%s' is already quantized (%s); re-encoding it as %s compounds the "
                             "quantization error: allow it with --allow-requantize, or quantize the f32/f16/bf16 "
                             "original",
                             path, t->name, cmf_dtype_name(t->dtype), cmf_dtype_name(dt));
    float *buf;
    cmf_status st = cmf_imp_alloc_f32(t->nelem, &buf, t->name, err);
    if (st) return st;
    st = cmf_tensor_decode(t, 0, t->nelem, buf, err);
    if (st) cmf_error_prefix(err, "%s", path);
    else st = cmf_imp_add(w, q, t->name, t->ndim, t->shape, buf, err);
    free(buf);
    return st;
}

cmf_status cmf_quantize(const char *in_path, const char *out_path, const cmf_import_opts *opts, cmf_error *err) {
    cmf_error local;
    if (!err) err = &local;
    if (!in_path || !out_path) return cmf_error_set(err, CMF_ERR_ARG, "quantize: input and output paths are required");
    if (!opts || !opts->quant)
        return cmf_error_set(err, CMF_ERR_ARG, "quantize: --quant is required (f32, f16, bf16, q8, q8_2f, q4, q4t, q4tp)");
    cmf_imp_quant q;
    cmf_writer_opts wo;
    cmf_status st = cmf_imp_begin(opts, NULL, false, out_path, &q, &wo, err);
    if (st) return st;
    cmf_file *f = NULL;
    if ((st = cmf_file_open(in_path, &f, err))) return st;
    wo.extra_features = cmf_file_required_features(f) & (CMF_FEAT_SKILL_FILE | CMF_FEAT_LOOP_MASKS);
    cmf_writer *w = NULL;
    if ((st = cmf_writer_open(out_path, &wo, &w, err)) || (st = copy_header(f, w, &q, err))) goto out;
    size_t len;
    const char *tok = cmf_file_tokenizer_json(f, &len);
    if (tok && (st = cmf_writer_set_tokenizer(w, tok, len, err))) goto out;
    const uint8_t *masks = cmf_file_masks(f, &len);
    if (masks && (st = cmf_writer_set_masks(w, masks, len, err))) goto out;
    size_t n = cmf_file_tensor_count(f);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += cmf_file_tensor_at(f, i)->nbytes;
    cmf_imp_progress pr;
    cmf_imp_progress_start(&pr, opts->progress, n, total);
    for (size_t i = 0; i < n; i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        if ((st = quantize_tensor(w, &q, t, opts->allow_requantize, cmf_file_shard_path(f, t->shard), err)))
            goto out;
        cmf_imp_progress_step(&pr, t->nbytes);
    }
    cmf_imp_progress_end(&pr);
    st = cmf_writer_finish(w, err);
    w = NULL;
out:
    if (w) cmf_writer_abort(w);
    cmf_file_close(f);
    return st;
}
