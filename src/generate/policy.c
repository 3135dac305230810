/*
 * policy.c — a model file's generation policy (cmf/policy.h): the stop-id
 * set, the end-of-turn stop strings, the BOS rule and the chat prompt
 * rendered from messages. Everything is read from
 * header.tokenizer_config (what the importers wrote, docs/ARCH_KEYS.md),
 * an optional header.generation_config and the tokenizer; the chat prompt
 * goes through the Jinja engine (src/chat) with the context transformers'
 * apply_chat_template builds. Nothing is cached: each call reads the
 * (immutable) file and tokenizer again, so the functions are reentrant.
 */
#include "cmf/chat.h"
#include "cmf/policy.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* End-of-turn markers chat templates write after an assistant turn
 * (ChatML/Qwen, Llama 3, Gemma, Phi-3, Llama 3.1 tool turns, Command-R,
 * Gemma 4 style, gpt-oss, GPT-2-style, SentencePiece EOS). */
static const char *const eot_markers[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>",
                                          "<|eom_id|>", "<|END_OF_TURN_TOKEN|>", "<turn|>", "<|return|>",
                                          "<|endoftext|>", "</s>"};
#define N_EOT_MARKERS (sizeof eot_markers / sizeof eot_markers[0])

static const cJSON *tokenizer_config(const cmf_file *f) {
    return f ? cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "tokenizer_config") : NULL;
}

/* A JSON number that is an integer in [0, 2^31), else -1. */
static int32_t json_id(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= (double)INT32_MAX) || floor(d) != d) return -1;
    return (int32_t)d;
}

/* The set being collected: distinct ids, in order, at most CMF_MODEL_EOS_MAX. */
typedef struct id_acc {
    int32_t v[CMF_MODEL_EOS_MAX];
    size_t n;
} id_acc;

/* Add id unless negative, already there, or the set is full. */
static void acc_add(id_acc *a, int32_t id) {
    if (id < 0 || a->n == CMF_MODEL_EOS_MAX) return;
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i] == id) return;
    a->v[a->n++] = id;
}

/* A number or a list of numbers. */
static void acc_add_json(id_acc *a, const cJSON *v) {
    if (cJSON_IsArray(v)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, v) acc_add(a, json_id(e));
    } else {
        acc_add(a, json_id(v));
    }
}

/* tokenizer_config.<key> as a string: "..." or {"content": "..."}. */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(v, "content"));
    return NULL;
}

size_t cmf_model_eos_ids(const cmf_file *f, const cmf_tokenizer *tok, bool chat, int32_t *out, size_t cap) {
    id_acc a;
    a.n = 0;
    const cJSON *cfg = tokenizer_config(f);
    acc_add_json(&a, cJSON_GetObjectItemCaseSensitive(cfg, "eos_token_ids"));
    acc_add_json(&a, cJSON_GetObjectItemCaseSensitive(cfg, "eos_token_id"));
    if (f) {
        const cJSON *gen = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "generation_config");
        acc_add_json(&a, cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id"));
    }
    if (tok) {
        acc_add(&a, cmf_tokenizer_eos_id(tok));
        const char *eos = config_token(cfg, "eos_token");
        if (eos) acc_add(&a, cmf_tokenizer_token_to_id(tok, eos));
    }
    if (chat && tok) {
        const char *tpl = cmf_model_chat_template(f, NULL);
        for (size_t i = 0; i < N_EOT_MARKERS; i++)
            if (strstr(tpl, eot_markers[i])) acc_add(&a, cmf_tokenizer_token_to_id(tok, eot_markers[i]));
    }
    if (out) memcpy(out, a.v, (a.n < cap ? a.n : cap) * sizeof *out);
    return a.n;
}

size_t cmf_model_chat_stop_strings(const cmf_file *f, const cmf_tokenizer *tok, const char **out, size_t cap) {
    const char *tpl = cmf_model_chat_template(f, NULL);
    size_t n = 0;
    for (size_t i = 0; i < N_EOT_MARKERS; i++) {
        if (strcmp(eot_markers[i], "</s>") == 0 || !strstr(tpl, eot_markers[i])) continue;
        if (tok && cmf_tokenizer_token_to_id(tok, eot_markers[i]) >= 0) continue;
        if (out && n < cap) out[n] = eot_markers[i];
        n++;
    }
    return n;
}

bool cmf_model_add_bos(const cmf_file *f, const cmf_tokenizer *tok, bool chat, int32_t *bos_id) {
    int32_t id = -1;
    if (!chat) {
        const cJSON *cfg = tokenizer_config(f);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token"))) {
            id = json_id(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token_id"));
            const char *s = config_token(cfg, "bos_token");
            if (id < 0 && s && tok) id = cmf_tokenizer_token_to_id(tok, s);
        }
        if (id < 0 && tok) id = cmf_tokenizer_bos_id(tok);
    }
    if (bos_id) *bos_id = id;
    return id >= 0;
}

cmf_status cmf_model_encode_prompt(const cmf_file *f, const cmf_tokenizer *tok, const char *text, size_t len,
                                   bool chat, int32_t **ids, size_t *n_ids, cmf_error *err) {
    if (!tok || !text || !ids || !n_ids)
        return cmf_error_set(err, CMF_ERR_ARG, "cmf_model_encode_prompt: %s is NULL",
                             !tok ? "tok" : !text ? "text" : !ids ? "ids" : "n_ids");
    cmf_status st = cmf_tokenizer_encode(tok, text, len, !chat, ids, n_ids, err);
    if (st != CMF_OK) return st;
    int32_t bos;
    if (!cmf_model_add_bos(f, tok, chat, &bos) || (*n_ids > 0 && (*ids)[0] == bos)) return CMF_OK;
    int32_t *v = realloc(*ids, (*n_ids + 1) * sizeof *v);
    if (!v) {
        free(*ids);
        *ids = NULL;
        *n_ids = 0;
        return cmf_error_set(err, CMF_ERR_NOMEM, "prompt: out of memory (%zu tokens)", *n_ids + 1);
    }
    memmove(v + 1, v, *n_ids * sizeof *v);
    v[0] = bos;
    *ids = v;
    (*n_ids)++;
    return CMF_OK;
}

const char *cmf_model_chat_template(const cmf_file *f, bool *is_fallback) {
    const char *t = f ? cmf_file_chat_template(f) : NULL;
    if (is_fallback) *is_fallback = t == NULL;
    return t ? t : cmf_chatml_template;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

cmf_status cmf_model_special_tokens(const cmf_file *f, const cmf_tokenizer *tok, char **bos, char **eos,
                                    cmf_error *err) {
    char **outs[2] = {bos, eos};
    for (int k = 0; k < 2; k++)
        if (outs[k]) *outs[k] = NULL;
    const cJSON *cfg = tokenizer_config(f);
    cmf_tokenizer *own = NULL; /* loaded here when tok is NULL and an id needs a lookup */
    cmf_status st = CMF_OK;
    for (int k = 0; k < 2 && st == CMF_OK; k++) {
        if (!outs[k]) continue;
        const char *s = config_token(cfg, k == 0 ? "bos_token" : "eos_token");
        if (!s) {
            const cJSON *idv = cJSON_GetObjectItemCaseSensitive(cfg, k == 0 ? "bos_token_id" : "eos_token_ids");
            if (cJSON_IsArray(idv)) idv = cJSON_GetArrayItem(idv, 0);
            if (!idv && k == 1) idv = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token_id");
            if (cJSON_IsArray(idv)) idv = cJSON_GetArrayItem(idv, 0);
            int32_t id = json_id(idv);
            if (id >= 0 && !tok && !own) {
                size_t tl = 0;
                const char *tj = cmf_file_tokenizer_json(f, &tl);
                if (tj && tl && cmf_tokenizer_load_json(tj, tl, &own, err) != CMF_OK) {
                    st = cmf_error_prefix(err, "%s: tokenizer", cmf_file_path(f));
                    break;
                }
            }
            const cmf_tokenizer *t = tok ? tok : own;
            if (id >= 0 && t) s = cmf_tokenizer_id_to_token(t, id);
        }
        *outs[k] = dup_str(s ? s : "");
        if (!*outs[k]) st = cmf_error_set(err, CMF_ERR_NOMEM, "special tokens: out of memory");
    }
    cmf_tokenizer_free(own);
    if (st != CMF_OK)
        for (int k = 0; k < 2; k++)
            if (outs[k]) {
                free(*outs[k]);
                *outs[k] = NULL;
            }
    return st;
}

cmf_chat_prompt_opts cmf_chat_prompt_default_opts(void) {
    cmf_chat_prompt_opts o;
    memset(&o, 0, sizeof o);
    o.add_generation_prompt = true;
    o.enable_thinking = CMF_THINK_DEFAULT;
    o.now = -1;
    return o;
}

/* messages[] of the render context. */
static cmf_status build_messages(const cmf_chat_message *msgs, size_t n, cJSON *arr, cmf_error *err) {
    for (size_t i = 0; i < n; i++) {
        const cmf_chat_message *m = &msgs[i];
        if (!m->role || !m->content)
            return cmf_error_set(err, CMF_ERR_ARG, "messages[%zu]: %s is NULL", i, !m->role ? "role" : "content");
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddStringToObject(o, "role", m->role) || !cJSON_AddStringToObject(o, "content", m->content) ||
            !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            return cmf_error_set(err, CMF_ERR_NOMEM, "messages[%zu]: out of memory", i);
        }
        if (!m->extra_json) continue;
        cJSON *extra = cJSON_Parse(m->extra_json);
        if (!cJSON_IsObject(extra)) {
            cJSON_Delete(extra);
            return cmf_error_set(err, CMF_ERR_ARG, "messages[%zu]: extra_json is not a JSON object", i);
        }
        while (extra->child) {
            cJSON *it = cJSON_DetachItemViaPointer(extra, extra->child);
            const char *key = it->string;
            if (cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_DeleteItemFromObjectCaseSensitive(o, key);
            if (!cJSON_AddItemToObject(o, key, it)) {
                cJSON_Delete(it);
                cJSON_Delete(extra);
                return cmf_error_set(err, CMF_ERR_NOMEM, "messages[%zu]: out of memory", i);
            }
        }
        cJSON_Delete(extra);
    }
    return CMF_OK;
}

cmf_status cmf_chat_prompt_render(const cmf_file *f, const cmf_tokenizer *tok, const cmf_chat_message *msgs,
                                  size_t n_msgs, const cmf_chat_prompt_opts *opts, char **out, size_t *len,
                                  cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_chat_prompt_render: out is NULL");
    *out = NULL;
    if (len) *len = 0;
    if (!msgs && n_msgs) return cmf_error_set(err, CMF_ERR_ARG, "cmf_chat_prompt_render: msgs is NULL");
    cmf_chat_prompt_opts o = opts ? *opts : cmf_chat_prompt_default_opts();
    cJSON *ctx = cJSON_CreateObject();
    cJSON *arr = ctx ? cJSON_AddArrayToObject(ctx, "messages") : NULL;
    if (!arr || !cJSON_AddNullToObject(ctx, "tools") || !cJSON_AddNullToObject(ctx, "documents") ||
        !cJSON_AddBoolToObject(ctx, "add_generation_prompt", o.add_generation_prompt) ||
        (o.enable_thinking != CMF_THINK_DEFAULT &&
         !cJSON_AddBoolToObject(ctx, "enable_thinking", o.enable_thinking == CMF_THINK_ON))) {
        cJSON_Delete(ctx);
        return cmf_error_set(err, CMF_ERR_NOMEM, "chat prompt: out of memory");
    }
    cmf_status st = build_messages(msgs, n_msgs, arr, err);
    if (st == CMF_OK && o.tools_json) {
        cJSON *tools = cJSON_Parse(o.tools_json);
        if (!cJSON_IsArray(tools) || !cJSON_ReplaceItemInObjectCaseSensitive(ctx, "tools", tools)) {
            st = tools ? (cJSON_IsArray(tools) ? CMF_ERR_NOMEM : CMF_ERR_ARG) : CMF_ERR_ARG;
            cJSON_Delete(tools);
            st = cmf_error_set(err, st, st == CMF_ERR_NOMEM ? "chat prompt: out of memory" : "tools: not a JSON array");
        }
    }
    char *bos = NULL, *eos = NULL;
    if (st == CMF_OK && (!o.bos_token || !o.eos_token))
        st = cmf_model_special_tokens(f, tok, o.bos_token ? NULL : &bos, o.eos_token ? NULL : &eos, err);
    if (st == CMF_OK && (!cJSON_AddStringToObject(ctx, "bos_token", o.bos_token ? o.bos_token : bos) ||
                         !cJSON_AddStringToObject(ctx, "eos_token", o.eos_token ? o.eos_token : eos)))
        st = cmf_error_set(err, CMF_ERR_NOMEM, "chat prompt: out of memory");
    free(bos);
    free(eos);
    bool fallback;
    const char *src = cmf_model_chat_template(f, &fallback);
    cmf_template *t = NULL;
    if (st == CMF_OK) st = cmf_template_parse(src, strlen(src), fallback ? "chatml" : cmf_file_path(f), &t, err);
    if (st == CMF_OK) {
        cmf_render_opts ro;
        memset(&ro, 0, sizeof ro);
        ro.now = o.now;
        st = cmf_template_render(t, ctx, &ro, out, len, err);
    }
    cmf_template_free(t);
    cJSON_Delete(ctx);
    return st;
}
