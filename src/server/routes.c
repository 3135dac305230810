/*
 * routes.c — loading the served model and the routes that are not a
 * generation: GET /health (503 while loading), GET /v1/models (the model,
 * each skill of the file as MODEL:SKILL), POST /tokenize and /detokenize
 * (llama-server's shapes), GET /v1/status (sequences, KV pages, queue),
 * GET /metrics (metrics.c), the chat page at /, and POST /v1/embeddings.
 * GET /v1/models also lists each --lora adapter as MODEL+NAME (with its
 * default scale); adapters are opened and checked at load.
 *
 * Embeddings: the input's tokens (a string is encoded by the raw-prompt
 * BOS rule) run through the whole network on the engine thread (a KV
 * cache of their own, one sequence), the residual stream after the last
 * layer (cmf_forward_opts.hidden_out: before the final norm) is averaged
 * over the tokens (mean pooling) and scaled to unit L2 norm. Vectors have
 * n_embd floats; encoding_format "base64" gives little-endian float32
 * bytes in base64, as OpenAI's SDKs ask for by default; "dimensions"
 * other than n_embd is a 400 (the vectors are not Matryoshka-trained).
 */
#include "server/server.h"

#include "cmf/lora.h"

#include <microhttpd.h>
#include <sodium.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *dup_print(cJSON *o) {
    char *t = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!t) return NULL;
    char *r = strdup(t); /* callers free() it */
    cJSON_free(t);
    return r;
}

/* --draft / --drafter / --lookup: the drafter the engine verifies against (ep gets it
 * and the draft lengths). The draft model must share the target's
 * vocabulary; it runs on the target's device. Its KV holds every engine
 * sequence's whole context: the engine's n_seq_ctx, set here explicitly
 * by the engine's own default rule (cmf/engine.h). */
static cmf_status srv_load_drafter(srv *s, cmf_engine_params *ep, cmf_error *err) {
    const cmf_server_opts *o = &s->o;
    if (!o->draft_path && !o->drafter_path && !o->lookup) return CMF_OK;
    cmf_status st;
    uint32_t train = s->info.n_ctx_train && s->info.n_ctx_train < 4096 ? s->info.n_ctx_train : 4096;
    uint64_t n_ctx = o->n_ctx ? o->n_ctx : (uint64_t)train * o->parallel;
    if (!o->n_ctx && n_ctx > 65536) n_ctx = 65536;
    ep->n_seq_ctx = n_ctx < train ? (uint32_t)n_ctx : train;
    if (o->draft_path) {
        if ((st = cmf_file_open(o->draft_path, &s->draft_file, err)) != CMF_OK) return cmf_error_prefix(err, "--draft");
        if (!cmf_file_same_tokenizer(s->file, s->draft_file))
            return cmf_error_set(err, CMF_ERR_ARG, "--draft %s: its tokenizer differs from %s's (a draft model must "
                                 "share the target's vocabulary), or it is no model (a block drafter goes to "
                                 "--drafter, a LoRA adapter to --lora)", o->draft_path, o->model_path);
        cmf_model_params mp = {.n_threads = o->n_threads, .device = s->dev};
        if ((st = cmf_model_load(s->draft_file, &mp, &s->draft_model, err)) != CMF_OK)
            return cmf_error_prefix(err, "--draft %s", o->draft_path);
        cmf_drafter_model_params dp = {.n_ctx = ep->n_seq_ctx, .n_seq_max = o->parallel};
        if ((st = cmf_drafter_new_model(s->draft_model, s->info.n_vocab, &dp, &s->drafter, err)) != CMF_OK)
            return cmf_error_prefix(err, "--draft %s", o->draft_path);
    } else if (o->drafter_path) { /* conditioned on the target's hidden states, its context n_seq_ctx */
        if ((st = cmf_drafter_new_block(o->drafter_path, s->model, ep->n_seq_ctx, &s->drafter, err)) != CMF_OK)
            return cmf_error_prefix(err, "--drafter %s", o->drafter_path);
    } else if ((st = cmf_drafter_new_lookup(o->lookup, s->info.n_vocab, &s->drafter, err)) != CMF_OK) {
        return cmf_error_prefix(err, "--lookup %u", o->lookup);
    }
    ep->drafter = s->drafter;
    ep->spec = cmf_spec_default_params();
    if (o->draft_max >= 0) ep->spec.draft_max = (uint32_t)o->draft_max;
    if (o->draft_min >= 0) ep->spec.draft_min = (uint32_t)o->draft_min;
    if (o->draft_p_min >= 0) ep->spec.p_min = o->draft_p_min;
    if (o->draft_fixed) ep->spec.adaptive = false;
    if (s->draft_model) { /* one drafted token costs about the draft's decode over the target's (bytes read) */
        cmf_model_info di;
        cmf_model_get_info(s->draft_model, &di);
        if (s->info.decode_bytes) ep->spec.cost_draft = (float)((double)di.decode_bytes / (double)s->info.decode_bytes);
    }
    if ((st = cmf_spec_params_check(&ep->spec, err)) != CMF_OK) return st;
    return CMF_OK;
}

cmf_status srv_load(srv *s, cmf_error *err) {
    const cmf_server_opts *o = &s->o;
    cmf_status st = cmf_file_open(o->model_path, &s->file, err);
    if (st != CMF_OK) return st;
    if (o->alias) {
        s->model_id = strdup(o->alias);
    } else {
        const char *b = strrchr(o->model_path, '/');
        b = b ? b + 1 : o->model_path;
        size_t n = strlen(b);
        if (n > 4 && strcmp(b + n - 4, ".cmf") == 0) n -= 4;
        s->model_id = strndup(b, n);
    }
    if (!s->model_id) return cmf_error_set(err, CMF_ERR_NOMEM, "serve: out of memory");
    size_t tl = 0;
    const char *tj = cmf_file_tokenizer_json(s->file, &tl);
    if (!tj || tl == 0) return cmf_error_set(err, CMF_ERR_FORMAT, "%s has no tokenizer section", o->model_path);
    if ((st = cmf_tokenizer_load_json(tj, tl, &s->tok, err)) != CMF_OK) {
        cmf_error_prefix(err, "%s: tokenizer", o->model_path);
        return st;
    }
    char dspec[32];
    const char *device = o->device;
    if (!device && (o->draft_path)) { /* the draft shares the target's device (one thread pool) */
        if (o->n_threads > 0) snprintf(dspec, sizeof dspec, "cpu:t=%d", o->n_threads);
        else snprintf(dspec, sizeof dspec, "cpu");
        device = dspec;
    }
    if (device && (st = cmf_device_open(device, &s->dev, err)) != CMF_OK) {
        cmf_error_prefix(err, "--device %s", device);
        return st;
    }
    cmf_model_params mp = {.n_threads = o->n_threads, .device = s->dev, .gpu_layers = o->gpu_layers};
    if ((st = cmf_model_load(s->file, &mp, &s->model, err)) != CMF_OK) return st;
    cmf_model_get_info(s->model, &s->info);
    /* skills: resolve every one now (weight sets are made off the stepping thread only here) */
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(cmf_file_header(s->file), "skills");
    size_t k = cJSON_IsArray(sk) ? (size_t)cJSON_GetArraySize(sk) : 0;
    s->skills = calloc(k ? k : 1, sizeof *s->skills);
    s->skill_ws = calloc(k ? k : 1, sizeof *s->skill_ws);
    if (!s->skills || !s->skill_ws) return cmf_error_set(err, CMF_ERR_NOMEM, "serve: out of memory");
    const cJSON *e, *list = k ? sk : NULL;
    cJSON_ArrayForEach(e, list) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsString(id)) continue;
        uint32_t ws = 0;
        if ((st = cmf_model_weight_set(s->model, id->valuestring, &ws, err)) != CMF_OK) {
            cmf_error_prefix(err, "%s: skill %s", o->model_path, id->valuestring);
            return st;
        }
        if (!(s->skills[s->n_skills] = strdup(id->valuestring))) return cmf_error_set(err, CMF_ERR_NOMEM, "oom");
        s->skill_ws[s->n_skills++] = ws;
    }
    /* adapters (--lora): opened and checked against the model now; their
     * overlays are resolved on the engine thread when a request names them */
    s->loras = calloc(o->n_lora ? o->n_lora : 1, sizeof *s->loras);
    if (!s->loras) return cmf_error_set(err, CMF_ERR_NOMEM, "serve: out of memory");
    for (size_t i = 0; i < o->n_lora; i++) {
        if ((st = cmf_lora_open(o->lora_paths[i], &s->loras[i], err)) != CMF_OK) {
            cmf_error_prefix(err, "--lora %s", o->lora_paths[i]);
            return st;
        }
        if ((st = cmf_lora_check(s->loras[i], s->model, err)) != CMF_OK) {
            cmf_error_prefix(err, "--lora %s", o->lora_paths[i]);
            return st;
        }
    }
    /* device sampling where the model's device can (a GPU: each step reads back the rows' top-k
     * candidates, not their logits); requests with logprobs keep the logits (want_logits) */
    cmf_engine_params ep = {.n_ctx = o->n_ctx, .n_seq_max = o->parallel, .n_batch = o->n_batch,
                            .prefix_cache = o->prefix_cache, .batch_invariant = o->batch_invariant,
                            .device_sampling = true};
    if ((st = srv_load_drafter(s, &ep, err)) != CMF_OK) return st;
    if ((st = cmf_engine_new(s->model, s->tok, &ep, &s->eng, err)) != CMF_OK) return st;
    s->n_seq_ctx = cmf_engine_n_seq_ctx(s->eng);
    pthread_mutex_lock(&s->mu); /* /v1/status shows the KV cache's shape before the first step */
    cmf_kv_get_stats(cmf_engine_kv(s->eng), &s->m.kv);
    pthread_mutex_unlock(&s->mu);
    int32_t eos[CMF_MODEL_EOS_MAX];
    size_t n_eos = cmf_model_eos_ids(s->file, s->tok, true, eos, CMF_MODEL_EOS_MAX);
    if (n_eos > CMF_MODEL_EOS_MAX) n_eos = CMF_MODEL_EOS_MAX;
    if ((st = cmf_grammar_vocab_new(s->tok, s->info.n_vocab, eos, n_eos, &s->gvocab, err)) != CMF_OK) return st;
    const char *tmpl = cmf_model_chat_template(s->file, NULL);
    s->fam = cmf_tool_family_detect(tmpl);
    s->tmpl_tool_calls = tmpl && strstr(tmpl, "tool_calls");
    s->per_key = calloc(o->n_api_keys ? o->n_api_keys : 1, sizeof *s->per_key);
    if (!s->per_key) return cmf_error_set(err, CMF_ERR_NOMEM, "serve: out of memory");
    return CMF_OK;
}

void srv_unload(srv *s) {
    cmf_kv_free(s->embed_kv);
    cmf_engine_free(s->eng);
    cmf_drafter_free(s->drafter);
    cmf_model_free(s->draft_model);
    cmf_file_close(s->draft_file);
    cmf_grammar_vocab_free(s->gvocab);
    cmf_model_free(s->model);
    for (size_t i = 0; s->loras && i < s->o.n_lora; i++) cmf_lora_free(s->loras[i]);
    free(s->loras);
    free(s->ws_cache);
    cmf_device_free(s->dev);
    cmf_tokenizer_free(s->tok);
    cmf_file_close(s->file);
    for (size_t i = 0; i < s->n_skills; i++) free(s->skills[i]);
    free(s->skills);
    free(s->skill_ws);
    free(s->per_key);
    free(s->model_id);
}

static cJSON *model_obj(const char *id, long created) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "cmf");
    return m;
}

/* The models this server answers to: the base, base:SKILL per skill,
 * base+NAME per --lora adapter (with its scale). */
static cJSON *model_list(const srv *s) {
    cJSON *d = cJSON_CreateArray();
    long created = (long)time(NULL);
    cJSON_AddItemToArray(d, model_obj(s->model_id, created));
    for (size_t i = 0; i < s->n_skills; i++) {
        char id[512];
        snprintf(id, sizeof id, "%s:%s", s->model_id, s->skills[i]);
        cJSON_AddItemToArray(d, model_obj(id, created));
    }
    for (size_t i = 0; i < s->o.n_lora; i++) { /* adapters: BASE+NAME (any skill may precede the +) */
        char id[512];
        snprintf(id, sizeof id, "%s+%s", s->model_id, s->o.lora_names[i]);
        cJSON *m = model_obj(id, created);
        cJSON_AddNumberToObject(m, "scale", (double)(s->o.lora_scales ? s->o.lora_scales[i] : 1.0f));
        cJSON_AddItemToArray(d, m);
    }
    return d;
}

/* ---- embeddings ---------------------------------------------------------- */

void srv_embed_free(srv_embed *j) {
    for (size_t i = 0; i < j->n_inputs; i++) free(j->inputs[i]);
    free(j->inputs);
    free(j->n_input);
    free(j);
}

/* Mean-pooled, L2-normalized final hidden state of ids (engine thread). */
static cmf_status embed_one(srv *s, const int32_t *ids, size_t n, float *vec, cmf_error *err) {
    uint32_t d = s->info.n_embd, chunk = 256;
    if (!s->embed_kv) {
        cmf_kv_params kp = {.n_ctx = s->n_seq_ctx, .n_seq_max = 1};
        cmf_status st = cmf_kv_create(s->model, &kp, &s->embed_kv, err);
        if (st != CMF_OK) return st;
    }
    float *h = malloc((size_t)chunk * d * sizeof *h);
    int32_t *pos = malloc(chunk * sizeof *pos);
    if (!h || !pos) { free(h); free(pos); return cmf_error_set(err, CMF_ERR_NOMEM, "embeddings: out of memory"); }
    double *acc = calloc(d, sizeof *acc);
    cmf_status st = acc ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "embeddings: out of memory");
    for (size_t c0 = 0; st == CMF_OK && c0 < n; c0 += chunk) {
        uint32_t cn = (uint32_t)(n - c0 < chunk ? n - c0 : chunk);
        for (uint32_t i = 0; i < cn; i++) pos[i] = (int32_t)(c0 + i);
        cmf_batch b = {.n_tokens = cn, .tokens = ids + c0, .pos = pos};
        cmf_forward_opts fo = {.hidden_out = h};
        st = cmf_model_forward_ex(s->model, s->embed_kv, &b, &fo, err);
        for (uint32_t i = 0; st == CMF_OK && i < cn; i++)
            for (uint32_t j = 0; j < d; j++) acc[j] += h[(size_t)i * d + j];
    }
    cmf_error e2;
    cmf_kv_seq_truncate(s->embed_kv, 0, 0, &e2);
    if (st == CMF_OK) {
        double nrm = 0;
        for (uint32_t j = 0; j < d; j++) { acc[j] /= (double)n; nrm += acc[j] * acc[j]; }
        nrm = sqrt(nrm);
        for (uint32_t j = 0; j < d; j++) vec[j] = (float)(nrm > 0 ? acc[j] / nrm : 0);
    }
    free(acc);
    free(h);
    free(pos);
    return st;
}

void srv_embed_run(srv *s, srv_embed *j) {
    srv_req *r = j->req;
    uint32_t d = s->info.n_embd;
    cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data");
    float *vec = malloc(d * sizeof *vec);
    cmf_error err = {0};
    cmf_status st = vec ? CMF_OK : cmf_error_set(&err, CMF_ERR_NOMEM, "out of memory");
    size_t tokens = 0;
    if (s->stopping) st = cmf_error_set(&err, CMF_ERR_CANCELLED, "the server is shutting down");
    for (size_t i = 0; st == CMF_OK && i < j->n_inputs; i++) {
        st = embed_one(s, j->inputs[i], j->n_input[i], vec, &err);
        if (st != CMF_OK) break;
        tokens += j->n_input[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "object", "embedding");
        cJSON_AddNumberToObject(e, "index", (double)i);
        if (j->base64) {
            size_t bl = sodium_base64_encoded_len(d * sizeof(float), sodium_base64_VARIANT_ORIGINAL);
            char *b64 = malloc(bl);
            if (b64) sodium_bin2base64(b64, bl, (const unsigned char *)vec, d * sizeof(float), sodium_base64_VARIANT_ORIGINAL);
            cJSON_AddStringToObject(e, "embedding", b64 ? b64 : "");
            free(b64);
        } else {
            cJSON *a = cJSON_AddArrayToObject(e, "embedding");
            for (uint32_t k = 0; k < d; k++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)vec[k]));
        }
        cJSON_AddItemToArray(data, e);
    }
    free(vec);
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddStringToObject(o, "model", s->model_id);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)tokens);
    char *body = st == CMF_OK ? dup_print(o) : (cJSON_Delete(o), srv_error_json(st == CMF_ERR_CANCELLED ? 503 : 500, NULL, err.msg));
    pthread_mutex_lock(&s->mu);
    r->out = body;
    r->out_len = body ? strlen(body) : 0;
    r->answer_status = st == CMF_OK ? 200 : st == CMF_ERR_CANCELLED ? 503 : 500;
    r->queued_response = true;
    bool wake = srv_wake_take(r);
    struct MHD_Connection *wc = wake ? r->conn : NULL;
    srv_req_unref(r);
    pthread_mutex_unlock(&s->mu);
    if (wc) srv_resume_conn(wc);
    srv_embed_free(j);
}

static unsigned embed_queue(srv_req *r, const cJSON *b, char **out) {
    srv *s = r->s;
    char msg[512];
    uint64_t ws;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(b, "model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) { *out = srv_error_json(400, "model", "'model' must be a string"); return 400; }
        unsigned st = srv_resolve_model(s, model->valuestring, &ws, msg, sizeof msg);
        if (st) { *out = srv_error_json(st, "model", msg); return st; }
        if (ws) { *out = srv_error_json(400, "model", "embeddings come from the base model only"); return 400; }
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(b, "encoding_format");
    bool b64 = false;
    if (fmt && !cJSON_IsNull(fmt)) {
        if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64"))) {
            *out = srv_error_json(400, "encoding_format", "'encoding_format' must be 'float' or 'base64'");
            return 400;
        }
        b64 = strcmp(fmt->valuestring, "base64") == 0;
    }
    /* dimensions: OpenAI shortens its Matryoshka-trained vectors; a mean-pooled hidden state cut short
     * is not an embedding, so only the model's own width is accepted (as vLLM does for such models) */
    const cJSON *dim = cJSON_GetObjectItemCaseSensitive(b, "dimensions");
    if (dim && !cJSON_IsNull(dim)) {
        double v = cJSON_IsNumber(dim) ? dim->valuedouble : -1;
        if (!(v >= 1 && v == (double)(long long)v)) {
            *out = srv_error_json(400, "dimensions", "'dimensions' must be a positive integer");
            return 400;
        }
        if (v != (double)s->info.n_embd) {
            snprintf(msg, sizeof msg, "this model's embeddings have %u dimensions and cannot be shortened to %.0f",
                     s->info.n_embd, v);
            *out = srv_error_json(400, "dimensions", msg);
            return 400;
        }
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(b, "input");
    if (!in || (!cJSON_IsString(in) && !cJSON_IsArray(in)) || (cJSON_IsArray(in) && cJSON_GetArraySize(in) == 0)) {
        *out = srv_error_json(400, "input", "'input' must be a string, an array of strings or of token ids");
        return 400;
    }
    srv_embed *j = calloc(1, sizeof *j);
    bool list = cJSON_IsArray(in) && (cJSON_IsString(in->child) || cJSON_IsArray(in->child));
    size_t k = list ? (size_t)cJSON_GetArraySize(in) : 1;
    if (k > 256) { free(j); *out = srv_error_json(400, "input", "'input' holds more than 256 items"); return 400; }
    if (j) { j->inputs = calloc(k, sizeof *j->inputs); j->n_input = calloc(k, sizeof *j->n_input); }
    if (!j || !j->inputs || !j->n_input) { if (j) srv_embed_free(j); *out = NULL; return 500; }
    j->req = r;
    j->base64 = b64;
    size_t max_prompt = s->o.max_prompt ? s->o.max_prompt : s->n_seq_ctx;
    const cJSON *e = list ? in->child : in;
    for (size_t i = 0; i < k; i++, e = e->next) {
        unsigned st = srv_prompt_ids(s, e, "input", &j->inputs[i], &j->n_input[i], msg, sizeof msg);
        if (!st && j->n_input[i] > max_prompt) {
            snprintf(msg, sizeof msg, "input[%zu] is %zu tokens, more than the limit of %zu", i, j->n_input[i], max_prompt);
            st = 400;
        }
        j->n_inputs = i + 1;
        if (st) { srv_embed_free(j); *out = srv_error_json(st, "input", msg); return st; }
    }
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        srv_embed_free(j);
        *out = srv_error_json(503, NULL, "the server is shutting down");
        return 503;
    }
    r->refs++; /* the job's */
    if (s->embed_tail) s->embed_tail->next = j;
    else s->embed_head = j;
    s->embed_tail = j;
    r->suspended = true;
    MHD_suspend_connection(r->conn);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* ---- the simple routes ---------------------------------------------------- */

unsigned srv_route_simple(srv_req *r, const cJSON *b, char **out, const char **ctype) {
    srv *s = r->s;
    *out = NULL;
    switch (r->route) {
    case R_HEALTH: {
        pthread_mutex_lock(&s->mu);
        bool loading = s->loading;
        pthread_mutex_unlock(&s->mu);
        *out = strdup(loading ? "{\"status\":\"loading\"}" : "{\"status\":\"ok\"}");
        return loading ? 503 : 200;
    }
    case R_PAGE:
        *ctype = "text/html; charset=utf-8";
        *out = malloc(cmf_server_chat_page_len + 1);
        if (*out) {
            memcpy(*out, cmf_server_chat_page, cmf_server_chat_page_len);
            (*out)[cmf_server_chat_page_len] = 0;
        }
        return 200;
    case R_MODELS: {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToObject(o, "data", model_list(s));
        *out = dup_print(o);
        return 200;
    }
    case R_MODEL: { /* GET /v1/models/{id}: OpenAI's models.retrieve, one entry of the list */
        const char *id = r->path + (strncmp(r->path, "/v1/", 4) == 0 ? 11 : 8); /* after /v1/models/ or /models/ */
        cJSON *l = model_list(s), *m, *hit = NULL;
        cJSON_ArrayForEach(m, l) {
            const cJSON *mid = cJSON_GetObjectItemCaseSensitive(m, "id");
            if (cJSON_IsString(mid) && strcmp(mid->valuestring, id) == 0) hit = m;
        }
        if (!hit) {
            cJSON_Delete(l);
            char msg[600];
            snprintf(msg, sizeof msg, "the model '%.500s' does not exist (GET /v1/models lists them)", id);
            *out = srv_error_json(404, "model", msg);
            return 404;
        }
        cJSON_DetachItemViaPointer(l, hit);
        cJSON_Delete(l);
        *out = dup_print(hit);
        return 200;
    }
    case R_METRICS:
        *ctype = "text/plain; version=0.0.4";
        pthread_mutex_lock(&s->mu);
        *out = srv_metrics_text(s);
        pthread_mutex_unlock(&s->mu);
        return 200;
    case R_STATUS: {
        cJSON *o = cJSON_CreateObject(), *q, *kv;
        pthread_mutex_lock(&s->mu);
        cJSON_AddStringToObject(o, "model", s->model_id);
        q = cJSON_AddObjectToObject(o, "sequences");
        cJSON_AddNumberToObject(q, "running", s->m.running);
        cJSON_AddNumberToObject(q, "waiting", s->m.waiting);
        cJSON_AddNumberToObject(q, "in_flight", s->in_flight);
        cJSON_AddNumberToObject(q, "parallel", s->o.parallel);
        cJSON_AddNumberToObject(q, "queue_limit", s->o.queue);
        cJSON_AddNumberToObject(q, "context_per_sequence", s->n_seq_ctx);
        kv = cJSON_AddObjectToObject(o, "kv");
        cJSON_AddNumberToObject(kv, "pages", s->m.kv.n_pages);
        cJSON_AddNumberToObject(kv, "page_size", s->m.kv.page_size);
        cJSON_AddNumberToObject(kv, "free", s->m.kv.n_free);
        cJSON_AddNumberToObject(kv, "cached", s->m.kv.n_cached);
        cJSON_AddNumberToObject(kv, "used", s->m.kv.n_used);
        cJSON_AddNumberToObject(kv, "prefix_hits", (double)s->m.kv.prefix_hits);
        cJSON_AddNumberToObject(kv, "prefix_queries", (double)s->m.kv.prefix_queries);
        cJSON_AddNumberToObject(o, "steps", (double)s->m.steps);
        pthread_mutex_unlock(&s->mu);
        *out = dup_print(o);
        return 200;
    }
    case R_TOKENIZE: {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(b, "content");
        if (!c) c = cJSON_GetObjectItemCaseSensitive(b, "text");
        if (!cJSON_IsString(c)) { *out = srv_error_json(400, "content", "'content' must be a string"); return 400; }
        const cJSON *as = cJSON_GetObjectItemCaseSensitive(b, "add_special");
        if (as && !cJSON_IsBool(as)) { *out = srv_error_json(400, "add_special", "'add_special' must be true or false"); return 400; }
        int32_t *ids = NULL;
        size_t n = 0;
        cmf_error err = {0};
        cmf_status st = as && cJSON_IsTrue(as)
                            ? cmf_model_encode_prompt(s->file, s->tok, c->valuestring, strlen(c->valuestring), false, &ids, &n, &err)
                            : cmf_tokenizer_encode(s->tok, c->valuestring, strlen(c->valuestring), false, &ids, &n, &err);
        if (st != CMF_OK) { *out = srv_error_json(400, "content", err.msg); return 400; }
        cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "tokens");
        for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
        free(ids);
        *out = dup_print(o);
        return 200;
    }
    case R_DETOKENIZE: {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "tokens");
        char msg[256];
        int32_t *ids = NULL;
        size_t n = 0;
        if (!cJSON_IsArray(t)) { *out = srv_error_json(400, "tokens", "'tokens' must be an array of token ids"); return 400; }
        if (cJSON_GetArraySize(t) > 0) {
            unsigned st = srv_prompt_ids(s, t, "tokens", &ids, &n, msg, sizeof msg);
            if (st) { *out = srv_error_json(st, "tokens", msg); return st; }
        }
        char *text = NULL;
        size_t len = 0;
        cmf_error err = {0};
        if (n == 0) text = strdup("");
        else if (cmf_tokenizer_decode(s->tok, ids, n, false, &text, &len, &err) != CMF_OK) {
            free(ids);
            *out = srv_error_json(400, "tokens", err.msg);
            return 400;
        }
        free(ids);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "content", text ? text : "");
        free(text);
        *out = dup_print(o);
        return 200;
    }
    case R_EMBEDDINGS:
        return embed_queue(r, b, out);
    default:
        *out = srv_error_json(404, NULL, "no such route");
        return 404;
    }
}
