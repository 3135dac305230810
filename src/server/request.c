/*
 * request.c — the fields of POST /v1/chat/completions and /v1/completions
 * (OpenAI's API reference) turned into engine sequence parameters. Every
 * known field is type- and range-checked and a bad one is a 400 naming it
 * (OpenAI's error shape, `param` set); unknown fields are ignored. The
 * prompt is built here, on the HTTP thread: chat messages through the
 * model's chat template (cmf_chat_prompt_render, ChatML when the file has
 * none) and the BOS rule of cmf/policy.h; the stop-id set and the chat
 * end-of-turn stop strings come from the same policy as `cmf run --chat`.
 *
 * The `model` field names a weight set: the backbone, a skill
 * ("base:SKILL", resolved at load), and LoRA adapters on top
 * ("+NAME[@SCALE]" terms, the --lora adapters). A combination not seen
 * before is a job for the engine thread (weight-set calls may not run
 * beside a step), which resolves it between two steps
 * (cmf_model_weight_set_extend) while this thread waits; the result is
 * cached here under srv.mu.
 *
 * Sampling defaults when a field is absent are cmf's (llama-server's):
 * temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no penalties; a
 * request that names a field gets exactly that value (temperature 0 is
 * greedy).
 */
#include "server/server.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(st, p, ...) do { snprintf(msg, cap, __VA_ARGS__); *param = (p); return (st); } while (0)

static const cJSON *field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL; /* null = absent, as OpenAI's SDKs send it */
}

/* A number field within [lo, hi]; false with msg on a bad one. */
static bool num_field(const cJSON *o, const char *k, double lo, double hi, double *out, bool *given, char *msg,
                      size_t cap) {
    const cJSON *v = field(o, k);
    if (given) *given = v != NULL;
    if (!v) return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        snprintf(msg, cap, "'%s' must be a number in [%g, %g]", k, lo, hi);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

static bool int_field(const cJSON *o, const char *k, double lo, double hi, long long *out, bool *given, char *msg,
                      size_t cap) {
    const cJSON *v = field(o, k);
    if (given) *given = v != NULL;
    if (!v) return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < lo || v->valuedouble > hi) {
        snprintf(msg, cap, "'%s' must be an integer in [%.0f, %.0f]", k, lo, hi);
        return false;
    }
    *out = (long long)v->valuedouble;
    return true;
}

static bool bool_field(const cJSON *o, const char *k, bool *out, char *msg, size_t cap) {
    const cJSON *v = field(o, k);
    if (!v) return true;
    if (!cJSON_IsBool(v)) {
        snprintf(msg, cap, "'%s' must be true or false", k);
        return false;
    }
    *out = cJSON_IsTrue(v);
    return true;
}

/* An adapter term "NAME" or "NAME@SCALE" of a model string (len bytes at t). */
static unsigned parse_term(srv *s, const char *name, const char *t, size_t len, srv_overlay *ov, char *msg,
                           size_t cap) {
    const char *at = memchr(t, '@', len);
    size_t nl = at ? (size_t)(at - t) : len;
    if (nl == 0) {
        snprintf(msg, cap, "model '%.200s': an empty adapter name after '+' (the form is BASE+ADAPTER@SCALE)", name);
        return 400;
    }
    size_t k = 0;
    while (k < s->o.n_lora && !(strlen(s->o.lora_names[k]) == nl && memcmp(s->o.lora_names[k], t, nl) == 0)) k++;
    if (k == s->o.n_lora) {
        snprintf(msg, cap, "model '%.200s': no adapter '%.*s' is loaded (--lora; GET /v1/models lists them)", name,
                 (int)(nl > 200 ? 200 : nl), t);
        return 404;
    }
    float scale = s->o.lora_scales ? s->o.lora_scales[k] : 1.0f;
    if (at) {
        char buf[64];
        size_t sl = len - nl - 1;
        char *e = NULL;
        double d = 0;
        if (sl > 0 && sl < sizeof buf) {
            memcpy(buf, at + 1, sl);
            buf[sl] = 0;
            d = strtod(buf, &e);
        }
        /* a decimal number only: strtod would also take hex ("0x10"), "inf", "nan" */
        bool dec = sl > 0 && sl < sizeof buf && strchr("+-.0123456789", buf[0]) && !strpbrk(buf, "xXpP");
        if (!e || *e || !dec || !isfinite(d) || d < -SRV_MAX_LORA_SCALE || d > SRV_MAX_LORA_SCALE) {
            snprintf(msg, cap, "model '%.200s': the scale of adapter '%.*s' must be a number in [%g, %g]", name,
                     (int)(nl > 200 ? 200 : nl), t, -SRV_MAX_LORA_SCALE, SRV_MAX_LORA_SCALE);
            return 400;
        }
        scale = (float)d;
    }
    if (ov->n == CMF_MODEL_MAX_LORA) {
        snprintf(msg, cap, "model '%.200s': more than %d adapters", name, CMF_MODEL_MAX_LORA);
        return 400;
    }
    ov->lora[ov->n] = (uint32_t)k;
    ov->scale[ov->n++] = scale;
    return 0;
}

static bool overlay_eq(const srv_overlay *a, const srv_overlay *b) {
    if (a->base != b->base || a->n != b->n) return false;
    for (uint32_t i = 0; i < a->n; i++)
        if (a->lora[i] != b->lora[i] || memcmp(&a->scale[i], &b->scale[i], sizeof a->scale[i]) != 0) return false;
    return true;
}

/* The weight set of an overlay: the cache, else a job for the engine
 * thread, waited for. */
static unsigned overlay_ws(srv *s, const char *name, const srv_overlay *ov, uint64_t *ws, char *msg, size_t cap) {
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n_ws_cache; i++)
        if (overlay_eq(&s->ws_cache[i].ov, ov)) {
            *ws = s->ws_cache[i].ws;
            pthread_mutex_unlock(&s->mu);
            return 0;
        }
    bool stopping = s->stopping;
    if (stopping || s->n_ws_cache >= SRV_MAX_OVERLAYS) {
        pthread_mutex_unlock(&s->mu);
        if (stopping) snprintf(msg, cap, "the server is shutting down");
        else snprintf(msg, cap, "model '%.200s': this server holds %d adapter combinations already; use one of those "
                      "(same adapters and scales)", name, SRV_MAX_OVERLAYS);
        return stopping ? 503 : 400;
    }
    srv_wsjob job = {.ov = *ov};
    job.next = s->ws_head;
    s->ws_head = &job;
    while (!job.done && (job.taken || !s->stopping)) pthread_cond_wait(&s->ws_cv, &s->mu);
    if (!job.done) { /* stopping: take the job back if the engine thread did not */
        for (srv_wsjob **p = &s->ws_head; *p; p = &(*p)->next)
            if (*p == &job) { *p = job.next; break; }
        pthread_mutex_unlock(&s->mu);
        snprintf(msg, cap, "the server is shutting down");
        return 503;
    }
    pthread_mutex_unlock(&s->mu);
    if (job.st != CMF_OK) {
        snprintf(msg, cap, "model '%.200s': %s", name, job.msg);
        return job.st == CMF_ERR_NOMEM ? 500 : 400;
    }
    *ws = job.ws;
    return 0;
}

void srv_ws_jobs_run(srv *s) {
    pthread_mutex_lock(&s->mu);
    srv_wsjob *jobs = s->ws_head;
    s->ws_head = NULL;
    for (srv_wsjob *j = jobs; j; j = j->next) j->taken = true;
    pthread_mutex_unlock(&s->mu);
    if (!jobs) return;
    for (srv_wsjob *j = jobs; j; j = j->next) {
        const cmf_lora *l[CMF_MODEL_MAX_LORA];
        for (uint32_t i = 0; i < j->ov.n; i++) l[i] = s->loras[j->ov.lora[i]];
        cmf_error err = {0};
        j->st = cmf_model_weight_set_extend(s->model, j->ov.base, l, j->ov.scale, j->ov.n, &j->ws, &err);
        if (j->st != CMF_OK) snprintf(j->msg, sizeof j->msg, "%.250s", err.msg);
    }
    pthread_mutex_lock(&s->mu);
    for (srv_wsjob *j = jobs, *nx; j; j = nx) {
        nx = j->next; /* j lives on its waiter's stack: read next before done */
        if (j->st == CMF_OK) {
            if (s->n_ws_cache == s->cap_ws_cache) {
                size_t nc = s->cap_ws_cache ? 2 * s->cap_ws_cache : 16;
                srv_wscache *c = realloc(s->ws_cache, nc * sizeof *c);
                if (c) { s->ws_cache = c; s->cap_ws_cache = nc; }
            }
            if (s->n_ws_cache < s->cap_ws_cache) s->ws_cache[s->n_ws_cache++] = (srv_wscache){j->ov, j->ws};
        }
        j->done = true;
    }
    pthread_cond_broadcast(&s->ws_cv);
    pthread_mutex_unlock(&s->mu);
}

unsigned srv_resolve_model(srv *s, const char *name, uint64_t *ws, char *msg, size_t cap) {
    *ws = 0;
    if (!name || strcmp(name, s->model_id) == 0) return 0;
    size_t bl = strlen(s->model_id);
    if (strncmp(name, s->model_id, bl) != 0 || (name[bl] != ':' && name[bl] != '+')) {
        snprintf(msg, cap, "the model '%.200s' does not exist; this server serves '%.200s' (GET /v1/models)", name,
                 s->model_id);
        return 404;
    }
    srv_overlay ov = {0};
    const char *p = name + bl;
    if (*p == ':') {
        const char *sk = p + 1, *plus = strchr(sk, '+');
        size_t sl = plus ? (size_t)(plus - sk) : strlen(sk);
        size_t i = 0;
        while (i < s->n_skills && !(strlen(s->skills[i]) == sl && memcmp(s->skills[i], sk, sl) == 0)) i++;
        if (i == s->n_skills) {
            snprintf(msg, cap, "model '%.200s': the file has no skill '%.*s' (GET /v1/models lists them)", name,
                     (int)(sl > 200 ? 200 : sl), sk);
            return sl ? 404 : 400;
        }
        ov.base = (uint32_t)s->skill_ws[i];
        p = sk + sl;
    }
    while (*p == '+') {
        const char *t = p + 1, *nx = strchr(t, '+');
        size_t tl = nx ? (size_t)(nx - t) : strlen(t);
        unsigned st = parse_term(s, name, t, tl, &ov, msg, cap);
        if (st) return st;
        p = t + tl;
    }
    assert(*p == 0);
    if (ov.n == 0) {
        *ws = ov.base;
        return 0;
    }
    return overlay_ws(s, name, &ov, ws, msg, cap);
}

unsigned srv_prompt_ids(srv *s, const cJSON *item, const char *fld, int32_t **ids, size_t *n, char *msg,
                        size_t cap) {
    *ids = NULL;
    *n = 0;
    if (cJSON_IsString(item)) {
        cmf_error err = {0};
        const char *t = item->valuestring;
        if (cmf_model_encode_prompt(s->file, s->tok, t, strlen(t), false, ids, n, &err) != CMF_OK) {
            snprintf(msg, cap, "'%s': %s", fld, err.msg);
            return 400;
        }
    } else if (cJSON_IsArray(item)) {
        size_t k = (size_t)cJSON_GetArraySize(item);
        *ids = malloc((k ? k : 1) * sizeof **ids);
        if (!*ids) { snprintf(msg, cap, "out of memory"); return 500; }
        size_t nv = cmf_tokenizer_vocab_size(s->tok);
        const cJSON *e;
        cJSON_ArrayForEach(e, item) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
                e->valuedouble >= (double)nv) {
                snprintf(msg, cap, "'%s': token ids must be integers in [0, %zu)", fld, nv);
                free(*ids);
                *ids = NULL;
                return 400;
            }
            (*ids)[(*n)++] = (int32_t)e->valuedouble;
        }
    } else {
        snprintf(msg, cap, "'%s' must be a string or an array of token ids", fld);
        return 400;
    }
    if (*n == 0) {
        snprintf(msg, cap, "'%s' is empty (it encodes to no tokens)", fld);
        free(*ids);
        *ids = NULL;
        return 400;
    }
    return 0;
}

/* messages[] -> the rendered, encoded chat prompt. */
/* An assistant turn's tool_calls as the text the model writes (for a
 * template that ignores tool_calls): appended to its content. */
static char *calls_as_text(srv *s, const char *content, const cJSON *tc) {
    size_t k = cJSON_IsArray(tc) ? (size_t)cJSON_GetArraySize(tc) : 0;
    cmf_tool_call *calls = calloc(k ? k : 1, sizeof *calls);
    char **args = calloc(k ? k : 1, sizeof *args);
    char *text = NULL, *out = NULL;
    size_t n = 0;
    const cJSON *c;
    if (!calls || !args) goto done;
    cJSON_ArrayForEach(c, tc) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(name)) continue;
        calls[n].name = name->valuestring;
        if (cJSON_IsString(a)) calls[n].arguments = a->valuestring;
        else if (a && (args[n] = cJSON_PrintUnformatted(a))) calls[n].arguments = args[n];
        else calls[n].arguments = "{}";
        n++;
    }
    cmf_error err;
    if (n && cmf_tool_calls_text(s->fam, calls, n, &text, &err) == CMF_OK) {
        size_t lc = strlen(content), lt = strlen(text);
        if ((out = malloc(lc + lt + 2))) {
            memcpy(out, content, lc);
            size_t w = lc;
            if (lc) out[w++] = '\n';
            memcpy(out + w, text, lt + 1);
        }
    }
done:
    for (size_t i = 0; args && i < k; i++) cJSON_free(args[i]);
    free(args);
    free(calls);
    free(text);
    return out;
}

static unsigned chat_prompt(srv *s, const cJSON *msgs, const char *tools_json, int32_t **ids, size_t *n, char *msg,
                            size_t cap, const char **param) {
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) FAIL(400, "messages", "'messages' must be a non-empty array");
    size_t k = (size_t)cJSON_GetArraySize(msgs);
    cmf_chat_message *cm = calloc(k, sizeof *cm);
    char **owned = calloc(2 * k, sizeof *owned);
    unsigned st = 0;
    if (!cm || !owned) { free(cm); free(owned); FAIL(500, NULL, "out of memory"); }
    size_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            snprintf(msg, cap, "messages[%zu] needs a string 'role'", i);
            *param = "messages";
            st = 400;
            break;
        }
        cm[i].role = role->valuestring;
        if (cJSON_IsString(content)) {
            cm[i].content = content->valuestring;
        } else if (cJSON_IsArray(content)) { /* text parts, joined by newlines (as vLLM) */
            size_t tot = 1;
            const cJSON *p;
            bool bad = false;
            cJSON_ArrayForEach(p, content) {
                const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
                if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") != 0 || !cJSON_IsString(tx)) bad = true;
                else tot += strlen(tx->valuestring) + 1;
            }
            if (bad) {
                snprintf(msg, cap, "messages[%zu].content: only parts {\"type\": \"text\", \"text\": ...} are supported", i);
                *param = "messages";
                st = 400;
                break;
            }
            char *buf = malloc(tot), *w = buf;
            if (!buf) { st = 500; snprintf(msg, cap, "out of memory"); break; }
            cJSON_ArrayForEach(p, content) {
                const char *tx = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
                if (w != buf) *w++ = '\n';
                size_t l = strlen(tx);
                memcpy(w, tx, l);
                w += l;
            }
            *w = 0;
            owned[2 * i] = buf;
            cm[i].content = buf;
        } else if ((!content || cJSON_IsNull(content)) && strcmp(role->valuestring, "assistant") != 0 &&
                   !cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) {
            snprintf(msg, cap, "messages[%zu] (role '%.40s') needs 'content' (only an assistant turn with tool calls may "
                     "leave it out)", i, role->valuestring);
            *param = "messages";
            st = 400;
            break;
        } else if (!content || cJSON_IsNull(content)) {
            cm[i].content = ""; /* an assistant turn with only tool calls */
        } else {
            snprintf(msg, cap, "messages[%zu].content must be a string or an array of text parts", i);
            *param = "messages";
            st = 400;
            break;
        }
        /* tool calls and ids reach the template as message members */
        cJSON *extra = NULL;
        static const char *const keys[] = {"tool_calls", "tool_call_id", "name", "reasoning_content"};
        for (size_t j = 0; j < sizeof keys / sizeof keys[0]; j++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, keys[j]);
            if (!v || cJSON_IsNull(v)) continue;
            if (!extra && !(extra = cJSON_CreateObject())) break;
            cJSON_AddItemToObject(extra, keys[j], cJSON_Duplicate(v, true));
        }
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!s->tmpl_tool_calls && cJSON_IsArray(tc) && cJSON_GetArraySize(tc) > 0) {
            char *t = calls_as_text(s, cm[i].content, tc);
            if (t) {
                free(owned[2 * i]);
                owned[2 * i] = t;
                cm[i].content = t;
            }
        }
        if (extra) {
            owned[2 * i + 1] = cJSON_PrintUnformatted(extra);
            cm[i].extra_json = owned[2 * i + 1];
            cJSON_Delete(extra);
        }
        i++;
    }
    char *text = NULL;
    size_t tl = 0;
    if (!st) {
        cmf_error err = {0};
        cmf_status rs = tools_json ? cmf_tool_prompt_render(s->file, s->tok, cm, k, tools_json, NULL, &text, &tl, &err)
                                   : cmf_chat_prompt_render(s->file, s->tok, cm, k, NULL, &text, &tl, &err);
        if (rs != CMF_OK && err.status == CMF_ERR_ARG && strncmp(err.msg, "tools", 5) == 0) {
            snprintf(msg, cap, "%s", err.msg);
            *param = "tools";
            st = 400;
        } else if (rs != CMF_OK) {
            snprintf(msg, cap, "messages: the chat template failed: %s", err.msg);
            *param = "messages";
            st = 400;
        } else if (cmf_model_encode_prompt(s->file, s->tok, text, tl, true, ids, n, &err) != CMF_OK) {
            snprintf(msg, cap, "messages: %s", err.msg);
            *param = "messages";
            st = 400;
        }
    }
    free(text);
    for (size_t j = 0; j < 2 * k; j++) free(owned[j]); /* cJSON_free = free here (default hooks) */
    free(owned);
    free(cm);
    return st;
}

void srv_gen_free(srv_gen *g) {
    for (size_t i = 0; i < g->n_prompts; i++) free(g->prompts[i]);
    free(g->prompts);
    free(g->n_prompt);
    free(g->bias);
    for (size_t i = 0; i < g->n_stop; i++) free(g->stops[i]);
    free(g->model);
    cmf_grammar_free(g->grammar);
    memset(g, 0, sizeof *g);
}

static bool add_prompt(srv_gen *g, int32_t *ids, size_t n) {
    int32_t **p = realloc(g->prompts, (g->n_prompts + 1) * sizeof *p);
    if (!p) return false;
    g->prompts = p;
    size_t *q = realloc(g->n_prompt, (g->n_prompts + 1) * sizeof *q);
    if (!q) return false;
    g->n_prompt = q;
    g->prompts[g->n_prompts] = ids;
    g->n_prompt[g->n_prompts++] = n;
    return true;
}

unsigned srv_gen_parse(srv *s, const cJSON *b, bool chat, srv_gen *g, char *msg, size_t cap, const char **param) {
    *param = NULL;
    g->chat = chat;
    g->n = 1;
    g->sampler = cmf_sampler_default_params();
    /* model */
    const cJSON *model = field(b, "model");
    if (model && !cJSON_IsString(model)) FAIL(400, "model", "'model' must be a string");
    if (model) {
        unsigned st = srv_resolve_model(s, model->valuestring, &g->weight_set, msg, cap);
        if (st) { *param = "model"; return st; }
        if (!(g->model = strdup(model->valuestring))) FAIL(500, NULL, "out of memory");
    } else if (!(g->model = strdup(s->model_id))) FAIL(500, NULL, "out of memory");
    /* structured output: a grammar over the output */
    char *gbnf = NULL;
    const char *gbnf_static = NULL;
    const cJSON *rf = field(b, "response_format");
    if (rf) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(ty)) FAIL(400, "response_format", "'response_format' must be an object with a string 'type'");
        if (strcmp(ty->valuestring, "json_object") == 0) {
            gbnf_static = cmf_json_object_gbnf();
        } else if (strcmp(ty->valuestring, "json_schema") == 0) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(js, "schema");
            if (!cJSON_IsObject(js) || !(cJSON_IsObject(sc) || cJSON_IsBool(sc)))
                FAIL(400, "response_format", "response_format.json_schema.schema must be a JSON Schema object");
            char *txt = cJSON_PrintUnformatted(sc);
            cmf_error err = {0};
            cmf_status cs = txt ? cmf_json_schema_to_gbnf(txt, strlen(txt), &gbnf, &err) : CMF_ERR_NOMEM;
            cJSON_free(txt);
            if (cs != CMF_OK) FAIL(400, "response_format", "response_format.json_schema.schema: %s", txt ? err.msg : "out of memory");
        } else if (strcmp(ty->valuestring, "text") != 0) {
            FAIL(400, "response_format", "response_format.type must be 'text', 'json_object' or 'json_schema'");
        }
    }
    /* tools and tool_choice */
    const cJSON *tools = field(b, "tools"), *tch = field(b, "tool_choice");
    char *tools_json = NULL;
    if (tools && !cJSON_IsArray(tools)) { free(gbnf); FAIL(400, "tools", "'tools' must be an array"); }
    if (tools && !chat) { free(gbnf); FAIL(400, "tools", "'tools' needs /v1/chat/completions"); }
    const char *only = NULL;
    bool forced = false, none = false;
    if (tch) {
        if (cJSON_IsString(tch)) {
            none = strcmp(tch->valuestring, "none") == 0;
            forced = strcmp(tch->valuestring, "required") == 0;
            if (!none && !forced && strcmp(tch->valuestring, "auto") != 0) {
                free(gbnf);
                FAIL(400, "tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}");
            }
        } else {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tch, "function");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsObject(tch) || !cJSON_IsString(nm)) {
                free(gbnf);
                FAIL(400, "tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}");
            }
            only = nm->valuestring;
            forced = true;
        }
        if (forced && (!tools || cJSON_GetArraySize(tools) == 0)) { free(gbnf); FAIL(400, "tool_choice", "'tool_choice' forces a call but 'tools' is empty"); }
    }
    if (tools && cJSON_GetArraySize(tools) > 0 && !none) {
        if (gbnf || gbnf_static) { free(gbnf); FAIL(400, "response_format", "response_format and tools cannot be combined"); }
        if (!(tools_json = cJSON_PrintUnformatted(tools))) FAIL(500, NULL, "out of memory");
        g->tools = true;
        if (forced) {
            cmf_error err = {0};
            if (cmf_tool_call_gbnf(s->fam, tools_json, strlen(tools_json), only, &gbnf, &err) != CMF_OK) {
                cJSON_free(tools_json);
                FAIL(400, only ? "tool_choice" : "tools", "%s", err.msg);
            }
        }
    }
    if (gbnf || gbnf_static) {
        const char *t = gbnf ? gbnf : gbnf_static;
        cmf_error err = {0};
        cmf_status gs = cmf_grammar_parse(t, strlen(t), &g->grammar, &err);
        if (gs == CMF_OK) gs = cmf_grammar_use_vocab(g->grammar, s->gvocab, &err);
        free(gbnf);
        if (gs != CMF_OK) { cJSON_free(tools_json); FAIL(400, g->tools ? "tools" : "response_format", "the output grammar: %s", err.msg); }
    }
    /* prompt */
    size_t max_prompt = s->o.max_prompt ? s->o.max_prompt : s->n_seq_ctx;
    if (chat) {
        int32_t *ids = NULL;
        size_t n = 0;
        unsigned st = chat_prompt(s, field(b, "messages"), tools_json, &ids, &n, msg, cap, param);
        cJSON_free(tools_json);
        if (st) return st;
        if (!add_prompt(g, ids, n)) { free(ids); FAIL(500, NULL, "out of memory"); }
    } else {
        /* OpenAI completions fields cmf does not implement: refused, not ignored (the answer would differ) */
        const cJSON *ec = field(b, "echo"), *bo = field(b, "best_of"), *sx = field(b, "suffix");
        if (ec && !cJSON_IsNull(ec) && !cJSON_IsFalse(ec)) FAIL(400, "echo", "'echo' is not supported");
        if (bo && !cJSON_IsNull(bo) && !(cJSON_IsNumber(bo) && bo->valuedouble == 1))
            FAIL(400, "best_of", "'best_of' other than 1 is not supported (use n)");
        if (sx && !cJSON_IsNull(sx)) FAIL(400, "suffix", "'suffix' (insertion) is not supported");
        const cJSON *p = field(b, "prompt");
        if (!p) FAIL(400, "prompt", "'prompt' is required");
        bool list = cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 &&
                    (cJSON_IsString(p->child) || cJSON_IsArray(p->child));
        if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 0) FAIL(400, "prompt", "'prompt' is empty");
        if (list) {
            const cJSON *e;
            cJSON_ArrayForEach(e, p) {
                int32_t *ids;
                size_t n;
                unsigned st = srv_prompt_ids(s, e, "prompt", &ids, &n, msg, cap);
                if (st) { *param = "prompt"; return st; }
                if (!add_prompt(g, ids, n)) { free(ids); FAIL(500, NULL, "out of memory"); }
            }
        } else {
            int32_t *ids;
            size_t n;
            unsigned st = srv_prompt_ids(s, p, "prompt", &ids, &n, msg, cap);
            if (st) { *param = "prompt"; return st; }
            if (!add_prompt(g, ids, n)) { free(ids); FAIL(500, NULL, "out of memory"); }
        }
    }
    for (size_t i = 0; i < g->n_prompts; i++)
        if (g->n_prompt[i] > max_prompt)
            FAIL(400, chat ? "messages" : "prompt",
                 "the prompt is %zu tokens, more than this server's limit of %zu (--max-prompt / the context)",
                 g->n_prompt[i], max_prompt);
    /* numbers */
    double d;
    long long ll;
    bool given;
    if (!num_field(b, "temperature", 0, 2, &d, &given, msg, cap)) { *param = "temperature"; return 400; }
    if (given) { g->sampler.temp = (float)d; g->sampler.greedy = d <= 0; }
    if (!num_field(b, "top_p", 0, 1, &d, &given, msg, cap)) { *param = "top_p"; return 400; }
    if (given) g->sampler.top_p = (float)d;
    if (!int_field(b, "top_k", -1, 1e9, &ll, &given, msg, cap)) { *param = "top_k"; return 400; }
    if (given) g->sampler.top_k = (int32_t)ll;
    if (!num_field(b, "min_p", 0, 1, &d, &given, msg, cap)) { *param = "min_p"; return 400; }
    if (given) g->sampler.min_p = (float)d;
    if (!num_field(b, "presence_penalty", -2, 2, &d, &given, msg, cap)) { *param = "presence_penalty"; return 400; }
    if (given) g->sampler.presence_penalty = (float)d;
    if (!num_field(b, "frequency_penalty", -2, 2, &d, &given, msg, cap)) { *param = "frequency_penalty"; return 400; }
    if (given) g->sampler.frequency_penalty = (float)d;
    if (!num_field(b, "repetition_penalty", 0.01, 10, &d, &given, msg, cap)) { *param = "repetition_penalty"; return 400; }
    if (given) g->sampler.repeat_penalty = (float)d;
    if (!int_field(b, "seed", -9.2e18, 9.2e18, &ll, &given, msg, cap)) { *param = "seed"; return 400; }
    if (given) { g->sampler.seed = (uint64_t)ll; g->sampler.has_seed = true; }
    if (!int_field(b, "n", 1, s->o.max_n, &ll, &given, msg, cap)) { *param = "n"; return 400; }
    if (given) g->n = (uint32_t)ll;
    if ((size_t)g->n * g->n_prompts > SRV_MAX_CHOICES)
        FAIL(400, "n", "n times the number of prompts is more than %d choices", SRV_MAX_CHOICES);
    if ((size_t)g->n * g->n_prompts > (size_t)s->o.parallel + s->o.queue) /* never fits: not a 429 to retry */
        FAIL(400, "n", "n (%u) times %zu prompt(s) needs %zu sequences, more than this server ever holds "
             "(--parallel %u + --queue %u = %u)", g->n, g->n_prompts, (size_t)g->n * g->n_prompts,
             s->o.parallel, s->o.queue, s->o.parallel + s->o.queue);
    size_t max_tokens = s->o.max_tokens ? s->o.max_tokens : s->n_seq_ctx;
    /* the default: the whole ceiling for chat, OpenAI's 16 for completions (within the ceiling) */
    g->max_tokens = (int32_t)(chat || max_tokens < 16 ? max_tokens : 16);
    if (!int_field(b, "max_tokens", 1, (double)max_tokens, &ll, &given, msg, cap)) { *param = "max_tokens"; return 400; }
    if (given) g->max_tokens = (int32_t)ll;
    if (!int_field(b, "max_completion_tokens", 1, (double)max_tokens, &ll, &given, msg, cap)) { *param = "max_completion_tokens"; return 400; }
    if (given) g->max_tokens = (int32_t)ll;
    /* speculative decoding (cmf's field; default: on when the server has a drafter) */
    bool spec = true;
    if (!bool_field(b, "speculative", &spec, msg, cap)) { *param = "speculative"; return 400; }
    g->no_draft = !spec;
    /* stream */
    if (!bool_field(b, "stream", &g->stream, msg, cap)) { *param = "stream"; return 400; }
    const cJSON *so = field(b, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) FAIL(400, "stream_options", "'stream_options' must be an object");
        if (!g->stream) FAIL(400, "stream_options", "'stream_options' needs 'stream': true");
        if (!bool_field(so, "include_usage", &g->include_usage, msg, cap)) { *param = "stream_options"; return 400; }
    }
    /* logprobs */
    if (chat) {
        if (!bool_field(b, "logprobs", &g->logprobs, msg, cap)) { *param = "logprobs"; return 400; }
        if (!int_field(b, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &ll, &given, msg, cap)) { *param = "top_logprobs"; return 400; }
        if (given && !g->logprobs) FAIL(400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (given) g->top_logprobs = (uint32_t)ll;
    } else {
        if (!int_field(b, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &ll, &given, msg, cap)) { *param = "logprobs"; return 400; }
        if (given) { g->logprobs = true; g->top_logprobs = (uint32_t)ll; }
    }
    /* stop */
    const cJSON *stop = field(b, "stop");
    if (stop) {
        const cJSON *one = cJSON_IsString(stop) ? stop : NULL, *e;
        if (!one && !cJSON_IsArray(stop)) FAIL(400, "stop", "'stop' must be a string or an array of strings");
        if (!one && cJSON_GetArraySize(stop) > SRV_MAX_STOP) FAIL(400, "stop", "'stop' holds more than %d strings", SRV_MAX_STOP);
        for (e = one ? one : stop->child; e; e = one ? NULL : e->next) {
            if (!cJSON_IsString(e) || !e->valuestring[0]) FAIL(400, "stop", "'stop' strings must be non-empty strings");
            if (!(g->stops[g->n_stop] = strdup(e->valuestring))) FAIL(500, NULL, "out of memory");
            g->n_stop++;
        }
    }
    if (chat) { /* end-of-turn markers that are not single tokens */
        const char *cs[8];
        size_t k = cmf_model_chat_stop_strings(s->file, s->tok, cs, 8);
        for (size_t i = 0; i < k && i < 8; i++)
            if (!(g->stops[g->n_stop++] = strdup(cs[i]))) FAIL(500, NULL, "out of memory");
    }
    g->n_eos = cmf_model_eos_ids(s->file, s->tok, chat, g->eos, CMF_MODEL_EOS_MAX);
    if (g->n_eos > CMF_MODEL_EOS_MAX) g->n_eos = CMF_MODEL_EOS_MAX;
    bool ignore_eos = false; /* vLLM's extension: EOS ids are ordinary tokens (benchmarks) */
    if (!bool_field(b, "ignore_eos", &ignore_eos, msg, cap)) { *param = "ignore_eos"; return 400; }
    if (ignore_eos && g->grammar) FAIL(400, "ignore_eos", "'ignore_eos' cannot be combined with a grammar");
    if (ignore_eos) g->n_eos = 0;
    /* logit_bias {"id": bias} */
    const cJSON *lb = field(b, "logit_bias");
    if (lb) {
        if (!cJSON_IsObject(lb)) FAIL(400, "logit_bias", "'logit_bias' must be an object of token id -> bias");
        size_t k = (size_t)cJSON_GetArraySize(lb);
        if (k > 1024) FAIL(400, "logit_bias", "'logit_bias' holds more than 1024 entries");
        g->bias = malloc((k ? k : 1) * sizeof *g->bias);
        if (!g->bias) FAIL(500, NULL, "out of memory");
        const cJSON *e;
        size_t nv = cmf_tokenizer_vocab_size(s->tok);
        cJSON_ArrayForEach(e, lb) {
            char *end = NULL;
            long id = strtol(e->string, &end, 10);
            if (!e->string[0] || *end || id < 0 || (size_t)id >= nv || e->string[0] == '+' || e->string[0] == ' ')
                FAIL(400, "logit_bias", "logit_bias: '%.40s' is not a token id in [0, %zu)", e->string, nv);
            if (!cJSON_IsNumber(e) || !(e->valuedouble >= -100 && e->valuedouble <= 100))
                FAIL(400, "logit_bias", "logit_bias['%.40s'] must be a number in [-100, 100]", e->string);
            g->bias[g->sampler.n_logit_bias].id = (int32_t)id;
            g->bias[g->sampler.n_logit_bias++].bias = (float)e->valuedouble;
        }
        g->sampler.logit_bias = g->bias;
    }
    return 0;
}
