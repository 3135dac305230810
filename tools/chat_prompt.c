/*
 * chat_prompt.c — render a model file's chat template (or the ChatML
 * fallback) with a conversation, the way transformers' apply_chat_template
 * does: every context key a top-level variable, tools/documents None,
 * bos_token/eos_token from the model's tokenizer config.
 */
#include "chat_prompt.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

const char *cli_chat_template_source(const cmf_file *f, bool *is_fallback) {
    const char *t = f ? cmf_file_chat_template(f) : NULL;
    if (is_fallback) *is_fallback = t == NULL;
    return t ? t : cmf_chatml_template;
}

/* tokenizer_config.<key> as a string: "..." or {"content": "..."} */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(v, "content"));
    return NULL;
}

cmf_status cli_chat_add_special_tokens(const cmf_file *f, cJSON *ctx, cmf_error *err) {
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "tokenizer_config");
    const char *keys[2] = {"bos_token", "eos_token"};
    cmf_tokenizer *tok = NULL;
    for (int k = 0; k < 2; k++) {
        if (cJSON_GetObjectItemCaseSensitive(ctx, keys[k])) continue;
        const char *s = config_token(cfg, keys[k]);
        if (!s) {
            int32_t id = -1;
            const cJSON *idv = cJSON_GetObjectItemCaseSensitive(cfg, k == 0 ? "bos_token_id" : "eos_token_ids");
            if (cJSON_IsArray(idv)) idv = cJSON_GetArrayItem(idv, 0);
            if (!idv && k == 1) idv = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token_id");
            if (cJSON_IsNumber(idv)) id = (int32_t)idv->valuedouble;
            if (id >= 0 && !tok) {
                size_t tl = 0;
                const char *tj = cmf_file_tokenizer_json(f, &tl);
                if (tj && tl) {
                    cmf_status st = cmf_tokenizer_load_json(tj, tl, &tok, err);
                    if (st != CMF_OK) return cmf_error_prefix(err, "%s: tokenizer", cmf_file_path(f));
                }
            }
            if (id >= 0 && tok) s = cmf_tokenizer_id_to_token(tok, id);
        }
        if (!cJSON_AddStringToObject(ctx, keys[k], s ? s : "")) {
            cmf_tokenizer_free(tok);
            return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
        }
    }
    cmf_tokenizer_free(tok);
    return CMF_OK;
}

cmf_status cli_render_messages(const cmf_file *f, const cJSON *messages, bool add_generation_prompt,
                               bool no_think, char **out, size_t *len, cmf_error *err) {
    bool fallback;
    const char *src = cli_chat_template_source(f, &fallback);
    cJSON *ctx = cJSON_CreateObject();
    if (!ctx) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    cJSON *m = cJSON_Duplicate(messages, 1);
    if (!m || !cJSON_AddItemToObject(ctx, "messages", m) || !cJSON_AddNullToObject(ctx, "tools") ||
        !cJSON_AddNullToObject(ctx, "documents") ||
        !cJSON_AddBoolToObject(ctx, "add_generation_prompt", add_generation_prompt) ||
        (no_think && !cJSON_AddFalseToObject(ctx, "enable_thinking"))) {
        cJSON_Delete(ctx);
        return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    }
    cmf_status st = f ? cli_chat_add_special_tokens(f, ctx, err) : CMF_OK;
    cmf_template *t = NULL;
    if (st == CMF_OK) {
        const char *name = fallback ? "chatml" : (f ? cmf_file_path(f) : "template");
        st = cmf_template_parse(src, strlen(src), name, &t, err);
    }
    if (st == CMF_OK) {
        cmf_render_opts o = {0};
        o.now = -1;
        st = cmf_template_render(t, ctx, &o, out, len, err);
    }
    cmf_template_free(t);
    cJSON_Delete(ctx);
    return st;
}

int cli_render_chat_prompt(const cmf_file *f, const char *system, const char *user, bool no_think, char **out,
                            size_t *len, cmf_error *err) {
    cJSON *msgs = cJSON_CreateArray();
    if (!msgs) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    const char *roles[2] = {"system", "user"}, *texts[2] = {system, user ? user : ""};
    for (int i = 0; i < 2; i++) {
        if (!texts[i]) continue;
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddStringToObject(m, "role", roles[i]) || !cJSON_AddStringToObject(m, "content", texts[i])) {
            cJSON_Delete(m);
            cJSON_Delete(msgs);
            return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
        }
        cJSON_AddItemToArray(msgs, m);
    }
    cmf_status st = cli_render_messages(f, msgs, true, no_think, out, len, err);
    cJSON_Delete(msgs);
    return st;
}

