/*
 * convert_hf.c — `cmf convert`: a Hugging Face folder (config.json,
 * model.safetensors or model.safetensors.index.json + shards,
 * tokenizer.json, tokenizer_config.json, chat_template.jinja/.json,
 * generation_config.json) to one CMF file.
 *
 * Tensors keep their HF names (format §3) and are streamed one at a time:
 * mmap'd source -> float32 buffer -> encoded payload -> writer, after
 * which the source pages are dropped (madvise), so peak memory is about
 * one tensor as f32 plus its encoding. Before any tensor is written, the
 * checkpoint is checked against config.json: every tensor the forward pass
 * needs must exist with the shape the config implies.
 */
#include "cmf/tokenizer.h"
#include "import/import_internal.h"
#include "import/safetensors.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SHARDS 4096

typedef struct src_tensor {
    const cmf_st_tensor *t;
    const cmf_st_file *file;
    char *name; /* HF name after prefix normalisation */
} src_tensor;

typedef struct conv {
    const char *dir;
    cmf_st_file **shards;
    size_t n_shards;
    src_tensor *ts;
    size_t n_ts;
    cmf_error *err;
} conv;

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Read and parse an optional JSON file: *out NULL when absent. */
static cmf_status read_json(const char *dir, const char *name, bool required, cJSON **out,
                            cmf_error *err) {
    *out = NULL;
    char *path = join(dir, name);
    if (!path) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", name);
    if (!exists(path)) {
        cmf_status st = required ? cmf_error_set(err, CMF_ERR_NOT_FOUND, "%s: file not found", path) : CMF_OK;
        free(path);
        return st;
    }
    char *text;
    size_t len;
    cmf_status st = cmf_read_file(path, &text, &len, err);
    if (st == CMF_OK) {
        const char *end = NULL;
        *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
        if (!*out) {
            size_t at = end ? (size_t)(end - text) : 0;
            st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, at);
        }
        free(text);
    }
    free(path);
    return st;
}

cmf_status cmf_imp_hf_map_name(const char *in, char **out, cmf_error *err) {
    *out = NULL;
    static const char *const skip[] = {"vision_tower.", "model.vision_tower.", "multi_modal_projector.",
                                       "model.multi_modal_projector."};
    for (size_t i = 0; i < sizeof skip / sizeof *skip; i++)
        if (strncmp(in, skip[i], strlen(skip[i])) == 0) return CMF_OK;
    if (strstr(in, "rotary_emb.inv_freq")) return CMF_OK;
    /* gemma3 multimodal: language_model.model.X / model.language_model.X -> model.X */
    const char *rest = NULL, *prefix = "";
    if (strncmp(in, "language_model.model.", 21) == 0) rest = in + 21, prefix = "model.";
    else if (strncmp(in, "model.language_model.", 21) == 0) rest = in + 21, prefix = "model.";
    else if (strncmp(in, "language_model.lm_head.", 23) == 0) rest = in + 15, prefix = "";
    else rest = in;
    size_t len = strlen(prefix) + strlen(rest) + 1;
    if (!(*out = malloc(len))) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    snprintf(*out, len, "%s%s", prefix, rest);
    return CMF_OK;
}

static const src_tensor *find(const conv *c, const char *name) {
    for (size_t i = 0; i < c->n_ts; i++)
        if (strcmp(c->ts[i].name, name) == 0) return &c->ts[i];
    return NULL;
}

/* Open model.safetensors or every shard of the index. */
static cmf_status open_weights(conv *c) {
    cmf_error *err = c->err;
    char *single = join(c->dir, "model.safetensors");
    if (!single) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    cJSON *index = NULL;
    cmf_status st = CMF_OK;
    const char **files = NULL;
    size_t n_files = 0;
    if (!exists(single)) {
        st = read_json(c->dir, "model.safetensors.index.json", false, &index, err);
        if (st != CMF_OK) goto out;
        if (!index) {
            st = cmf_error_set(err, CMF_ERR_NOT_FOUND,
                               "%s: neither model.safetensors nor model.safetensors.index.json found",
                               c->dir);
            goto out;
        }
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
        if (!cJSON_IsObject(wm)) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "%s/model.safetensors.index.json: missing 'weight_map'", c->dir);
            goto out;
        }
        files = calloc(MAX_SHARDS, sizeof *files);
        if (!files) { st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory"); goto out; }
        const cJSON *e;
        cJSON_ArrayForEach(e, wm) {
            if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || e->valuestring[0] == '.' ||
                !e->valuestring[0]) {
                st = cmf_error_set(err, CMF_ERR_FORMAT,
                                   "%s/model.safetensors.index.json: weight_map['%s']: invalid file name",
                                   c->dir, e->string);
                goto out;
            }
            size_t k = 0;
            while (k < n_files && strcmp(files[k], e->valuestring) != 0) k++;
            if (k == n_files) {
                if (n_files == MAX_SHARDS) {
                    st = cmf_error_set(err, CMF_ERR_LIMIT, "%s: more than %d shards", c->dir, MAX_SHARDS);
                    goto out;
                }
                files[n_files++] = e->valuestring;
            }
        }
    }
    size_t n_open = index ? n_files : 1;
    c->shards = calloc(n_open ? n_open : 1, sizeof *c->shards);
    if (!c->shards) { st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory"); goto out; }
    size_t total = 0;
    for (size_t i = 0; i < n_open; i++) {
        char *p = index ? join(c->dir, files[i]) : strdup(single);
        if (!p) { st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory"); goto out; }
        st = cmf_st_open(p, &c->shards[i], err);
        free(p);
        if (st != CMF_OK) goto out;
        c->n_shards++;
        total += cmf_st_count(c->shards[i]);
    }
    c->ts = calloc(total ? total : 1, sizeof *c->ts);
    if (!c->ts) { st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory"); goto out; }
    for (size_t i = 0; i < c->n_shards; i++)
        for (size_t j = 0; j < cmf_st_count(c->shards[i]); j++) {
            const cmf_st_tensor *t = cmf_st_at(c->shards[i], j);
            char *nm;
            st = cmf_imp_hf_map_name(t->name, &nm, err);
            if (st != CMF_OK) goto out;
            if (!nm) continue;
            if (find(c, nm)) {
                st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s' appears twice",
                                   cmf_st_path(c->shards[i]), nm);
                free(nm);
                goto out;
            }
            c->ts[c->n_ts].t = t;
            c->ts[c->n_ts].file = c->shards[i];
            c->ts[c->n_ts].name = nm;
            c->n_ts++;
        }
    /* Every index entry must exist in its shard. */
    if (index) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(index, "weight_map")) {
            size_t k = 0;
            while (k < n_files && strcmp(files[k], e->valuestring) != 0) k++;
            if (!cmf_st_find(c->shards[k], e->string)) {
                st = cmf_error_set(err, CMF_ERR_FORMAT,
                                   "%s/model.safetensors.index.json: tensor '%s' is not in %s", c->dir,
                                   e->string, e->valuestring);
                goto out;
            }
        }
    }
out:
    free(files);
    cJSON_Delete(index);
    free(single);
    return st;
}

/* Require tensor `name` with the given shape (d1 = 0: 1-D). */
static cmf_status need(const conv *c, const char *name, uint64_t d0, uint64_t d1, const char *why) {
    const src_tensor *s = find(c, name);
    if (!s)
        return cmf_error_set(c->err, CMF_ERR_NOT_FOUND, "%s: missing tensor '%s'", c->dir, name);
    uint32_t nd = d1 ? 2 : 1;
    if (s->t->ndim != nd || s->t->shape[0] != d0 || (d1 && s->t->shape[1] != d1)) {
        char got[96] = "";
        for (uint32_t i = 0; i < s->t->ndim && strlen(got) < 70; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? ", " : "",
                     (unsigned long long)s->t->shape[i]);
        return cmf_error_set(c->err, CMF_ERR_FORMAT,
                             "%s: tensor '%s': shape [%s] does not match config.json (expected [%llu%s%llu] "
                             "from %s)",
                             cmf_st_path(s->file), name, got, (unsigned long long)d0, d1 ? ", " : "",
                             (unsigned long long)d1, why);
    }
    return CMF_OK;
}

static cmf_status check_tensors(const conv *c, const cmf_imp_hf_info *in, bool *has_lm_head) {
    uint64_t H = in->hidden, hd = in->head_dim, q = (uint64_t)in->n_heads * hd,
             kv = (uint64_t)in->n_kv_heads * hd;
    cmf_status st;
    if ((st = need(c, "model.embed_tokens.weight", in->vocab, H, "vocab_size, hidden_size")) ||
        (st = need(c, "model.norm.weight", H, 0, "hidden_size")))
        return st;
    *has_lm_head = find(c, "lm_head.weight") != NULL;
    if (*has_lm_head && (st = need(c, "lm_head.weight", in->vocab, H, "vocab_size, hidden_size"))) return st;
    bool olmo2 = strcmp(in->model_type, "olmo2") == 0;
    char n[256];
#define L(fmt) (snprintf(n, sizeof n, "model.layers.%u." fmt, l), n)
    for (uint32_t l = 0; l < in->n_layers; l++) {
        if (olmo2) {
            if ((st = need(c, L("post_attention_layernorm.weight"), H, 0, "hidden_size")) ||
                (st = need(c, L("post_feedforward_layernorm.weight"), H, 0, "hidden_size")))
                return st;
        } else if ((st = need(c, L("input_layernorm.weight"), H, 0, "hidden_size"))) {
            return st;
        }
        if (find(c, L("self_attn.qkv_proj.weight"))) {
            if ((st = need(c, n, q + 2 * kv, H, "(heads + 2*kv_heads)*head_dim, hidden_size"))) return st;
        } else if ((st = need(c, L("self_attn.q_proj.weight"), q, H, "num_attention_heads*head_dim, hidden_size")) ||
                   (st = need(c, L("self_attn.k_proj.weight"), kv, H, "num_key_value_heads*head_dim, hidden_size")) ||
                   (st = need(c, L("self_attn.v_proj.weight"), kv, H, "num_key_value_heads*head_dim, hidden_size"))) {
            return st;
        }
        if ((st = need(c, L("self_attn.o_proj.weight"), H, q, "hidden_size, num_attention_heads*head_dim")))
            return st;
        if (in->n_experts && find(c, L("mlp.gate.weight"))) {
            if ((st = need(c, n, in->n_experts, H, "num_experts, hidden_size"))) return st;
            for (uint32_t e = 0; e < in->n_experts; e++) {
                uint64_t mi = in->moe_intermediate;
#define E(fmt) (snprintf(n, sizeof n, "model.layers.%u.mlp.experts.%u." fmt, l, e), n)
                if ((st = need(c, E("gate_proj.weight"), mi, H, "moe_intermediate_size, hidden_size")) ||
                    (st = need(c, E("up_proj.weight"), mi, H, "moe_intermediate_size, hidden_size")) ||
                    (st = need(c, E("down_proj.weight"), H, mi, "hidden_size, moe_intermediate_size")))
                    return st;
#undef E
            }
        } else {
            uint64_t I = in->intermediate;
            if (find(c, L("mlp.gate_up_proj.weight"))) {
                if ((st = need(c, n, 2 * I, H, "2*intermediate_size, hidden_size"))) return st;
            } else if ((st = need(c, L("mlp.gate_proj.weight"), I, H, "intermediate_size, hidden_size")) ||
                       (st = need(c, L("mlp.up_proj.weight"), I, H, "intermediate_size, hidden_size"))) {
                return st;
            }
            if ((st = need(c, L("mlp.down_proj.weight"), H, I, "hidden_size, intermediate_size"))) return st;
        }
    }
#undef L
    return CMF_OK;
}

/* The chat template: chat_template.jinja, else chat_template.json, else
 * tokenizer_config.json's chat_template (a string, or a list of
 * {name, template} of which "default" is used). Malloc'd or NULL. */
static cmf_status find_template(const char *dir, const cJSON *tok_cfg, char **out, cmf_error *err) {
    *out = NULL;
    char *p = join(dir, "chat_template.jinja");
    if (!p) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    if (exists(p)) {
        size_t len;
        cmf_status st = cmf_read_file(p, out, &len, err);
        free(p);
        return st;
    }
    free(p);
    cJSON *cj;
    cmf_status st = read_json(dir, "chat_template.json", false, &cj, err);
    if (st != CMF_OK) return st;
    const cJSON *t = cj ? cJSON_GetObjectItemCaseSensitive(cj, "chat_template") : NULL;
    if (!t && tok_cfg) t = cJSON_GetObjectItemCaseSensitive(tok_cfg, "chat_template");
    if (cJSON_IsArray(t)) {
        const cJSON *e, *pick = NULL;
        cJSON_ArrayForEach(e, t) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0) pick = e;
        }
        if (!pick) pick = cJSON_GetArrayItem(t, 0);
        t = pick ? cJSON_GetObjectItemCaseSensitive(pick, "template") : NULL;
    }
    if (cJSON_IsString(t) && !(*out = strdup(t->valuestring)))
        st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    cJSON_Delete(cj);
    return st;
}

/* Add ids of tokenizer_config.json's eos_token string (looked up in
 * tokenizer.json added_tokens) to eos_token_ids. */
static void add_eos_from_tokenizer(const char *tok_json, size_t len, cJSON *tc, cmf_error *err) {
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(tc, "eos_token");
    if (!cJSON_IsString(eos)) return;
    cJSON *tj = cJSON_ParseWithLength(tok_json, len);
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(tj, "added_tokens")) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (cJSON_IsString(content) && cJSON_IsNumber(id) && strcmp(content->valuestring, eos->valuestring) == 0)
            cmf_imp_add_eos(cJSON_GetObjectItemCaseSensitive(tc, "eos_token_ids"), id->valuedouble, err);
    }
    cJSON_Delete(tj);
}

/* Every token id must have an embedding row: ids beyond vocab_size are an
 * error; fewer ids than rows is common padding (a warning). */
static cmf_status check_tokenizer_vocab(const cmf_tokenizer *tk, const cmf_imp_hf_info *in, const char *tok_path,
                                        const char *cfg_path, cmf_error *err) {
    size_t n = cmf_tokenizer_vocab_size(tk);
    if (n > in->vocab) {
        const char *t = cmf_tokenizer_id_to_token(tk, (int32_t)(n - 1));
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: token id %zu (\"%.40s\") is outside the model's vocab_size %llu (%s)", tok_path,
                             n - 1, t ? t : "", (unsigned long long)in->vocab, cfg_path);
    }
    if (n < in->vocab)
        cmf_imp_warn("%s: %zu token ids, the embedding has %llu rows (vocab_size in %s): rows %zu.. are padding",
                     tok_path, n, (unsigned long long)in->vocab, cfg_path, n);
    return CMF_OK;
}

/* Drop the source pages of a tensor from our resident set. */
static void release_pages(const cmf_st_tensor *t) {
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || !t->nbytes) return;
    uintptr_t a = (uintptr_t)t->data & ~(uintptr_t)(pg - 1);
    uintptr_t e = (uintptr_t)t->data + t->nbytes;
    madvise((void *)a, e - a, MADV_DONTNEED);
}

cmf_status cmf_convert_hf(const char *hf_dir, const char *out_path, const cmf_import_opts *opts,
                          cmf_error *err) {
    cmf_error local;
    if (!err) err = &local;
    if (!hf_dir || !out_path) return cmf_error_set(err, CMF_ERR_ARG, "convert: hf_dir and out_path are required");
    cmf_imp_quant q;
    cmf_writer_opts wo;
    cmf_status st = cmf_imp_begin(opts, "q8", false, out_path, &q, &wo, err);
    if (st != CMF_OK) return st;
    conv c = {.dir = hf_dir, .err = err};
    cJSON *cfg = NULL, *gen = NULL, *tok_cfg = NULL, *arch = NULL;
    char *tok_json = NULL, *tmpl = NULL, *cfg_path = join(hf_dir, "config.json");
    size_t tok_len = 0;
    float *buf = NULL;
    cmf_writer *w = NULL;
    cmf_imp_hf_info info;
    if (!cfg_path) { st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory"); goto out; }
    if ((st = read_json(hf_dir, "config.json", true, &cfg, err)) ||
        (st = cmf_imp_hf_arch(cfg, cfg_path, &arch, &info, err)) ||
        (st = read_json(hf_dir, "generation_config.json", false, &gen, err)) ||
        (st = read_json(hf_dir, "tokenizer_config.json", false, &tok_cfg, err)) ||
        (st = find_template(hf_dir, tok_cfg, &tmpl, err)) || (st = open_weights(&c)))
        goto out;
    bool has_lm_head;
    if ((st = check_tensors(&c, &info, &has_lm_head))) goto out;
    if (!has_lm_head) cJSON_ReplaceItemInObjectCaseSensitive(arch, "tie_word_embeddings", cJSON_CreateTrue());
    char *tok_path = join(hf_dir, "tokenizer.json");
    if (!tok_path) { st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory"); goto out; }
    if (exists(tok_path)) st = cmf_read_file(tok_path, &tok_json, &tok_len, err);
    if (!st && tok_json) {
        /* Store only a tokenizer the runtime can load: a broken tokenizer.json
         * fails the conversion here, not every later run. */
        cmf_tokenizer *tk = NULL;
        st = cmf_tokenizer_load_json(tok_json, tok_len, &tk, err);
        if (st) cmf_error_prefix(err, "%s", tok_path);
        else st = check_tokenizer_vocab(tk, &info, tok_path, cfg_path, err);
        cmf_tokenizer_free(tk);
    }
    free(tok_path);
    if (st) goto out;

    if ((st = cmf_writer_open(out_path, &wo, &w, err))) goto out;
    cJSON *h = cmf_writer_header(w);
    cJSON_AddItemToObject(h, "arch", arch);
    arch = NULL;
    cJSON_AddStringToObject(h, "quant_type", cmf_imp_quant_label(&q));
    cJSON *tc = cJSON_AddObjectToObject(h, "tokenizer_config");
    cJSON *prov = cJSON_AddObjectToObject(h, "provenance");
    if (!tc || !prov) { st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory"); goto out; }
    cJSON_AddStringToObject(prov, "tool", "cmf convert " CMF_VERSION_STRING);
    cJSON_AddStringToObject(prov, "source_format", "huggingface");
    cJSON_AddStringToObject(prov, "quant", q.name);
    if ((st = cmf_imp_hf_tokenizer_config(cfg, gen, tok_cfg, tmpl, tc, err))) goto out;
    if (tok_json) {
        add_eos_from_tokenizer(tok_json, tok_len, tc, err);
        if ((st = cmf_writer_set_tokenizer(w, tok_json, tok_len, err))) goto out;
    }

    uint64_t total = 0;
    for (size_t i = 0; i < c.n_ts; i++) total += c.ts[i].t->nbytes;
    cmf_imp_progress pr;
    cmf_imp_progress_start(&pr, opts && opts->progress, c.n_ts, total);
    for (size_t i = 0; i < c.n_ts; i++) {
        const cmf_st_tensor *t = c.ts[i].t;
        if ((st = cmf_imp_alloc_f32(t->nelem, &buf, c.ts[i].name, err))) goto out;
        cmf_st_to_f32(t, 0, t->nelem, buf);
        release_pages(t); /* the f32 copy is all we need from here on */
        uint64_t shape[CMF_MAX_DIMS];
        uint32_t nd = t->ndim;
        if (nd > CMF_MAX_DIMS) {
            st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': %u dims (CMF allows %d)",
                               cmf_st_path(c.ts[i].file), t->name, nd, CMF_MAX_DIMS);
            goto out;
        }
        for (uint32_t d = 0; d < nd; d++) shape[d] = t->shape[d];
        if (nd == 0) shape[nd++] = 1; /* scalar -> [1] */
        st = cmf_imp_add(w, &q, c.ts[i].name, nd, shape, buf, err);
        free(buf);
        buf = NULL;
        if (st) goto out;
        cmf_imp_progress_step(&pr, t->nbytes);
    }
    cmf_imp_progress_end(&pr);
    st = cmf_writer_finish(w, err);
    w = NULL;
out:
    if (w) cmf_writer_abort(w);
    free(buf);
    for (size_t i = 0; i < c.n_ts; i++) free(c.ts[i].name);
    free(c.ts);
    for (size_t i = 0; i < c.n_shards; i++) cmf_st_close(c.shards[i]);
    free(c.shards);
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    cJSON_Delete(tok_cfg);
    cJSON_Delete(arch);
    free(tok_json);
    free(tmpl);
    free(cfg_path);
    return st;
}
