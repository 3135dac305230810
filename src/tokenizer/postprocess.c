/*
 * postprocess.c — HF `tokenizers` post-processors for a single sequence
 * with add_special_tokens=True: TemplateProcessing ("single" template:
 * SpecialToken items before/after the Sequence "A"), BertProcessing
 * ([CLS] A [SEP]), RobertaProcessing (<s> A </s>), ByteLevel (ids
 * unchanged: it only trims offsets) and Sequence of those. Reduced at load
 * time to a prefix and a suffix id list.
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

void tk_post_free(tk_post *p) {
    tk_ids_free(&p->prefix);
    tk_ids_free(&p->suffix);
    p->present = false;
}

static cmf_status pair_id(const cJSON *j, const char *key, int32_t *id, cmf_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    const cJSON *x = cJSON_GetArrayItem(v, 1);
    if (!cJSON_IsArray(v) || !tk_json_id(x, id))
        return cmf_error_set(err, CMF_ERR_FORMAT, "post_processor.%s: expected [token, id]", key);
    return CMF_OK;
}

static cmf_status load1(const cJSON *j, tk_post *p, cmf_error *err) {
    if (!j || cJSON_IsNull(j)) return CMF_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t)) return cmf_error_set(err, CMF_ERR_FORMAT, "post_processor.type: missing");
    const char *ty = t->valuestring;
    cmf_status st;
    if (!strcmp(ty, "ByteLevel")) return CMF_OK;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "processors"), *e;
        if (!cJSON_IsArray(arr)) return cmf_error_set(err, CMF_ERR_FORMAT, "post_processor.processors: missing");
        cJSON_ArrayForEach(e, arr) if ((st = load1(e, p, err))) return st;
        return CMF_OK;
    }
    if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) {
        int32_t cls = -1, sep = -1;
        if ((st = pair_id(j, "cls", &cls, err)) || (st = pair_id(j, "sep", &sep, err))) return st;
        p->prefix.n = p->suffix.n = 0;
        if (!tk_ids_push(&p->prefix, cls) || !tk_ids_push(&p->suffix, sep))
            return cmf_error_set(err, CMF_ERR_NOMEM, "post_processor: out of memory");
        p->present = true;
        return CMF_OK;
    }
    if (!strcmp(ty, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
        if (!cJSON_IsArray(single)) return cmf_error_set(err, CMF_ERR_FORMAT, "post_processor.single: missing");
        p->prefix.n = p->suffix.n = 0;
        bool after = false;
        const cJSON *e;
        size_t i = 0;
        cJSON_ArrayForEach(e, single) {
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
            if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) { after = true; i++; continue; }
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "id");
            if (!cJSON_IsString(name))
                return cmf_error_set(err, CMF_ERR_FORMAT, "post_processor.single[%zu]: expected SpecialToken or Sequence", i);
            const cJSON *def = cJSON_GetObjectItemCaseSensitive(sp, name->valuestring);
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids"), *x;
            if (!cJSON_IsArray(ids))
                return cmf_error_set(err, CMF_ERR_FORMAT, "post_processor.special_tokens[\"%.64s\"].ids: missing", name->valuestring);
            cJSON_ArrayForEach(x, ids) {
                int32_t xid;
                if (!tk_json_id(x, &xid))
                    return cmf_error_set(err, CMF_ERR_FORMAT, "post_processor.special_tokens[\"%.64s\"].ids: bad id", name->valuestring);
                if (!tk_ids_push(after ? &p->suffix : &p->prefix, xid))
                    return cmf_error_set(err, CMF_ERR_NOMEM, "post_processor: out of memory");
            }
            i++;
        }
        p->present = true;
        return CMF_OK;
    }
    return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "post_processor.type: unsupported \"%s\"", ty);
}

cmf_status tk_post_load(const cJSON *j, const tk_model *m, const tk_added_set *a, tk_post *p,
                        cmf_error *err) {
    (void)m;
    (void)a;
    memset(p, 0, sizeof *p);
    cmf_status st = load1(j, p, err);
    if (st) tk_post_free(p);
    return st;
}
