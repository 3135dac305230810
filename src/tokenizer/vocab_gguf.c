/*
 * vocab_gguf.c — cmf_tokenizer_json_from_gguf: GGUF `tokenizer.ggml.*`
 * metadata (as a cJSON object) -> an equivalent Hugging Face tokenizer.json.
 *
 *   "llama": SentencePiece BPE with scores and byte fallback (vocab_spm.c).
 *   "gpt2":  byte-level BPE with the GGUF merges; the pre-tokenizer is the
 *            one of the HF tokenizer the GGUF was converted from, chosen by
 *            tokenizer.ggml.pre (the same regex lists llama.cpp's
 *            llama-vocab.cpp uses, written as HF Split pre-tokenizers
 *            followed by ByteLevel without its own regex).
 *   "bert":  WordPiece; llama.cpp's converter stores word-initial pieces
 *            with a leading U+2581 and continuation pieces without "##",
 *            which is undone here. BertNormalizer (lowercase) +
 *            BertPreTokenizer + BertProcessing + WordPiece decoder.
 * Token types (GGUF): 1 normal, 2 unknown, 3 control, 4 user defined,
 * 5 unused, 6 byte. Control/unknown become special added tokens, user
 * defined become normal added tokens.
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "vocab_spm.h"

static const cJSON *meta(const cJSON *m, const char *k) { return cJSON_GetObjectItemCaseSensitive(m, k); }

static int32_t meta_id(const cJSON *m, const char *k, int32_t dflt) {
    const cJSON *v = meta(m, k);
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 2e9) return (int32_t)v->valuedouble;
    return dflt;
}

static bool meta_bool(const cJSON *m, const char *k, bool dflt) {
    const cJSON *v = meta(m, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* Numeric metadata array -> C ints (dflt where absent / not a number).
 * cJSON_GetArrayItem is O(i): never index a cJSON array in a loop. */
static int *int_array(const cJSON *arr, int n, int dflt) {
    int *v = malloc(((size_t)n + 1) * sizeof *v);
    if (!v) return NULL;
    for (int i = 0; i < n; i++) v[i] = dflt;
    int i = 0;
    const cJSON *e;
    if (cJSON_IsArray(arr))
        cJSON_ArrayForEach(e, arr) {
            if (i >= n) break;
            if (cJSON_IsNumber(e)) v[i] = (int)e->valuedouble;
            i++;
        }
    return v;
}

/* ---- pre-tokenizer regexes per tokenizer.ggml.pre -------------------------- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct {
    const char *pre[8];      /* tokenizer.ggml.pre values */
    const char *split[8];    /* Split(Isolated) regexes, in order */
    bool bytelevel_regex;    /* final ByteLevel uses the GPT-2 regex */
    bool digits_first;       /* Digits(individual) before ByteLevel */
    bool punct_first;        /* Punctuation(Contiguous) first (Falcon) */
    const char *after[2];    /* Split regexes after ByteLevel */
    bool ignore_merges;
    bool nfc;
} pre_spec;

static const pre_spec PRES[] = {
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "pixtral", NULL}, {RE_LLAMA3}, false, false, false, {NULL}, true, false},
    {{"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "megrez", NULL}, {RE_QWEN2}, false, false, false, {NULL}, false, false},
    {{"deepseek-llm", NULL},
     {"[\\r\\n]",
      "\\s?[A-Za-z\xC2\xB5\xC3\x80-\xC3\x96\xC3\x98-\xC3\xB6\xC3\xB8-\xC6\xBA\xC6\xBC-\xC6\xBF\xC7\x84-\xCA\x93\xCA\x95-\xCA\xAF\xCD\xB0-\xCD\xB3\xCD\xB6\xCD\xB7\xCD\xBB-\xCD\xBD\xCD\xBF\xCE\x86\xCE\x88-\xCE\x8A\xCE\x8C\xCE\x8E-\xCE\xA1\xCE\xA3-\xCF\xB5\xCF\xB7-\xD2\x81\xD2\x8A-\xD4\xAF\xD4\xB1-\xD5\x96\xE1\x82\xA0-\xE1\x83\x85\xE1\x8E\xA0-\xE1\x8F\xB5\xE1\x8F\xB8-\xE1\x8F\xBD\xE1\xB2\x90-\xE1\xB2\xBA\xE1\xB2\xBD-\xE1\xB2\xBF\xE1\xB4\x80-\xE1\xB4\xAB\xE1\xB5\xAB-\xE1\xB5\xB7\xE1\xB5\xB9-\xE1\xB6\x9A\xE1\xB8\x80-\xE1\xBC\x95\xE1\xBC\x98-\xE1\xBC\x9D\xE1\xBC\xA0-\xE1\xBD\x85\xE1\xBD\x88-\xE1\xBD\x8D\xE1\xBD\x90-\xE1\xBD\x97\xE1\xBD\x99\xE1\xBD\x9B\xE1\xBD\x9D\xE1\xBD\x9F-\xE1\xBD\xBD\xE1\xBE\x80-\xE1\xBE\xB4\xE1\xBE\xB6-\xE1\xBE\xBC\xE1\xBE\xBE\xE1\xBF\x82-\xE1\xBF\x84\xE1\xBF\x86-\xE1\xBF\x8C\xE1\xBF\x90-\xE1\xBF\x93\xE1\xBF\x96-\xE1\xBF\x9B\xE1\xBF\xA0-\xE1\xBF\xAC\xE1\xBF\xB2-\xE1\xBF\xB4\xE1\xBF\xB6-\xE1\xBF\xBC\xE2\x84\x82\xE2\x84\x87\xE2\x84\x8A-\xE2\x84\x93\xE2\x84\x95\xE2\x84\x99-\xE2\x84\x9D\xE2\x84\xA4\xE2\x84\xA6\xE2\x84\xA8\xE2\x84\xAA-\xE2\x84\xAD\xE2\x84\xAF-\xE2\x84\xB4\xE2\x84\xB9\xE2\x84\xBC-\xE2\x84\xBF\xE2\x85\x85-\xE2\x85\x89\xE2\x85\x8E\xE2\x86\x83\xE2\x86\x84\xE2\xB0\x80-\xE2\xB1\xBB\xE2\xB1\xBE-\xE2\xB3\xA4\xE2\xB3\xAB-\xE2\xB3\xAE\xE2\xB3\xB2\xE2\xB3\xB3\xEA\x99\x80-\xEA\x99\xAD\xEA\x9A\x80-\xEA\x9A\x9B\xEA\x9C\xA2-\xEA\x9D\xAF\xEA\x9D\xB1-\xEA\x9E\x87\xEA\x9E\x8B-\xEA\x9E\x8E\xEA\xAD\xB0-\xEA\xAE\xBF\xEF\xAC\x80-\xEF\xAC\x86\xEF\xAC\x93-\xEF\xAC\x97\xEF\xBC\xA1-\xEF\xBC\xBA\xEF\xBD\x81-\xEF\xBD\x9A\xF0\x90\x90\x80-\xF0\x90\x91\x8F\xF0\x90\x92\xB0-\xF0\x90\x93\x93\xF0\x90\x93\x98-\xF0\x90\x93\xBB\xF0\x90\xB2\x80-\xF0\x90\xB2\xB2\xF0\x90\xB3\x80-\xF0\x90\xB3\xB2\xF0\x91\xA2\xA0-\xF0\x91\xA3\x9F\xF0\x9E\xA4\x80-\xF0\x9E\xA5\x83]+",
      "\\s?[!-/:-~\xEF\xBC\x81-\xEF\xBC\x8F\xEF\xBC\x9A-\xEF\xBD\x9E\xE2\x80\x98-\xE2\x80\x9F\xE3\x80\x80-\xE3\x80\x82]+",
      "\\s+$",
      "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED\x9F\xBF]+",
      "\\p{N}+"},
     false, false, false, {NULL}, false, false},
    {{"deepseek-coder", NULL},
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED\x9F\xBF]+", "\\p{N}"},
     false, false, false, {NULL}, false, false},
    {{"falcon", NULL}, {NULL}, true, false, true, {"[0-9][0-9][0-9]"}, false, false},
    {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva", NULL}, {NULL}, true, true, false, {NULL}, false, false},
    {{"mpt", "olmo", NULL}, {NULL}, true, false, false, {NULL}, false, true},
    {{"gpt-2", "gpt2", "jais", "default", NULL}, {NULL}, true, false, false, {NULL}, false, false},
};

static const pre_spec *find_pre(const char *pre) {
    if (!pre) return &PRES[sizeof PRES / sizeof PRES[0] - 1];
    for (size_t i = 0; i < sizeof PRES / sizeof PRES[0]; i++)
        for (size_t k = 0; k < 8 && PRES[i].pre[k]; k++)
            if (!strcmp(PRES[i].pre[k], pre)) return &PRES[i];
    return NULL;
}

static cJSON *split_obj(const char *re) {
    cJSON *s = cJSON_CreateObject(), *p = cJSON_CreateObject();
    if (!s || !p) { cJSON_Delete(s); cJSON_Delete(p); return NULL; }
    cJSON_AddStringToObject(s, "type", "Split");
    cJSON_AddStringToObject(p, "Regex", re);
    cJSON_AddItemToObject(s, "pattern", p);
    cJSON_AddStringToObject(s, "behavior", "Isolated");
    cJSON_AddBoolToObject(s, "invert", false);
    return s;
}

static cJSON *bytelevel_obj(bool use_regex) {
    cJSON *b = cJSON_CreateObject();
    if (!b) return NULL;
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddBoolToObject(b, "add_prefix_space", false);
    cJSON_AddBoolToObject(b, "trim_offsets", true);
    cJSON_AddBoolToObject(b, "use_regex", use_regex);
    return b;
}

static bool add_item(cJSON *arr, cJSON *it) {
    if (!it) return false;
    cJSON_AddItemToArray(arr, it);
    return true;
}

/* added_tokens from token types; returns false on OOM */
static bool add_added(cJSON *root, int n, const int *types, char **text) {
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    if (!added) return false;
    for (int i = 0; i < n; i++) {
        int t = types[i];
        if (t != 2 && t != 3 && t != 4) continue;
        cJSON *a = cJSON_CreateObject();
        if (!a) return false;
        cJSON_AddItemToArray(added, a);
        cJSON_AddNumberToObject(a, "id", i);
        cJSON_AddStringToObject(a, "content", text[i]);
        cJSON_AddBoolToObject(a, "single_word", false);
        cJSON_AddBoolToObject(a, "lstrip", false);
        cJSON_AddBoolToObject(a, "rstrip", false);
        cJSON_AddBoolToObject(a, "normalized", false);
        cJSON_AddBoolToObject(a, "special", t != 4);
    }
    return true;
}

static bool add_template(cJSON *root, int32_t bos, int32_t eos, char **text, int n) {
    cJSON *pp = cJSON_AddObjectToObject(root, "post_processor");
    if (!pp) return false;
    cJSON_AddStringToObject(pp, "type", "TemplateProcessing");
    cJSON *single = cJSON_AddArrayToObject(pp, "single");
    cJSON *sp = cJSON_AddObjectToObject(pp, "special_tokens");
    if (!single || !sp) return false;
    int32_t ids[3] = {bos, -2, eos};
    for (int k = 0; k < 3; k++) {
        if (ids[k] == -1 || ids[k] >= n) continue;
        cJSON *it = cJSON_CreateObject(), *inner = cJSON_CreateObject();
        if (!it || !inner) { cJSON_Delete(it); cJSON_Delete(inner); return false; }
        cJSON_AddItemToArray(single, it);
        cJSON_AddNumberToObject(inner, "type_id", 0);
        if (ids[k] == -2) {
            cJSON_AddStringToObject(inner, "id", "A");
            cJSON_AddItemToObject(it, "Sequence", inner);
            continue;
        }
        cJSON_AddStringToObject(inner, "id", text[ids[k]]);
        cJSON_AddItemToObject(it, "SpecialToken", inner);
        if (cJSON_GetObjectItemCaseSensitive(sp, text[ids[k]])) continue;
        cJSON *d = cJSON_AddObjectToObject(sp, text[ids[k]]);
        if (!d) return false;
        cJSON_AddStringToObject(d, "id", text[ids[k]]);
        cJSON *ia = cJSON_AddArrayToObject(d, "ids"), *ta = cJSON_AddArrayToObject(d, "tokens");
        if (!ia || !ta) return false;
        cJSON_AddItemToArray(ia, cJSON_CreateNumber(ids[k]));
        cJSON_AddItemToArray(ta, cJSON_CreateString(text[ids[k]]));
    }
    return true;
}

static cmf_status get_tokens(const cJSON *m, const cJSON **tokens, char ***text, int *n, cmf_error *err) {
    *tokens = meta(m, "tokenizer.ggml.tokens");
    if (!cJSON_IsArray(*tokens) || cJSON_GetArraySize(*tokens) == 0)
        return cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.ggml.tokens: missing or empty");
    *n = cJSON_GetArraySize(*tokens);
    *text = calloc((size_t)*n + 1, sizeof **text);
    if (!*text) return cmf_error_set(err, CMF_ERR_NOMEM, "gguf vocab: out of memory");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, *tokens) {
        if (!cJSON_IsString(e)) return cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.ggml.tokens[%d]: not a string", i);
        (*text)[i++] = e->valuestring;
    }
    return CMF_OK;
}

static cmf_status from_llama(const cJSON *m, char **json, size_t *len, cmf_error *err) {
    const cJSON *tokens;
    char **text = NULL;
    int n;
    cmf_status st = get_tokens(m, &tokens, &text, &n, err);
    tk_spm_vocab v = {0};
    if (st) goto done;
    v.n = (size_t)n;
    v.text = (const char **)text;
    v.len = calloc((size_t)n, sizeof *v.len);
    v.score = calloc((size_t)n, sizeof *v.score);
    v.type = calloc((size_t)n, sizeof *v.type);
    if (!v.len || !v.score || !v.type) { st = cmf_error_set(err, CMF_ERR_NOMEM, "gguf vocab: out of memory"); goto done; }
    const cJSON *sc = meta(m, "tokenizer.ggml.scores"), *x;
    for (int i = 0; i < n; i++) v.len[i] = strlen(text[i]);
    int k = 0;
    if (cJSON_IsArray(sc))
        cJSON_ArrayForEach(x, sc) {
            if (k >= n) break;
            v.score[k++] = cJSON_IsNumber(x) ? (float)x->valuedouble : 0.0f;
        }
    int *ty = int_array(meta(m, "tokenizer.ggml.token_type"), n, 1);
    if (!ty) { st = cmf_error_set(err, CMF_ERR_NOMEM, "gguf vocab: out of memory"); goto done; }
    memcpy(v.type, ty, (size_t)n * sizeof *ty);
    free(ty);
    v.unk_id = meta_id(m, "tokenizer.ggml.unknown_token_id", 0);
    v.bos_id = meta_id(m, "tokenizer.ggml.bos_token_id", 1);
    v.eos_id = meta_id(m, "tokenizer.ggml.eos_token_id", 2);
    if (v.unk_id >= n) v.unk_id = -1;
    if (v.bos_id >= n) v.bos_id = -1;
    if (v.eos_id >= n) v.eos_id = -1;
    v.add_bos = meta_bool(m, "tokenizer.ggml.add_bos_token", true);
    v.add_eos = meta_bool(m, "tokenizer.ggml.add_eos_token", false);
    v.add_space_prefix = meta_bool(m, "tokenizer.ggml.add_space_prefix", true);
    v.space_to_meta = false;
    st = tk_spm_json(&v, json, len, err);
done:
    free(text);
    free(v.len);
    free(v.score);
    free(v.type);
    return st;
}

static cmf_status from_gpt2(const cJSON *m, char **json, size_t *len, cmf_error *err) {
    const cJSON *tokens;
    char **text = NULL;
    int n;
    cmf_status st = get_tokens(m, &tokens, &text, &n, err);
    cJSON *root = NULL;
    tk_smap seen = {0};
    int *types = NULL;
    if (st) goto done;
    const cJSON *pre_j = meta(m, "tokenizer.ggml.pre");
    const char *pre = cJSON_IsString(pre_j) ? pre_j->valuestring : NULL;
    const pre_spec *ps = find_pre(pre);
    if (!ps) { st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "tokenizer.ggml.pre: unsupported \"%s\"", pre); goto done; }
    const cJSON *merges = meta(m, "tokenizer.ggml.merges");
    if (!cJSON_IsArray(merges)) { st = cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.ggml.merges: missing"); goto done; }
    root = cJSON_CreateObject();
    if (!root || !tk_smap_init(&seen, (size_t)n)) goto oom;
    cJSON_AddStringToObject(root, "version", "1.0");
    types = int_array(meta(m, "tokenizer.ggml.token_type"), n, 1);
    if (!types || !add_added(root, n, types, text)) goto oom;
    if (ps->nfc) {
        cJSON *nz = cJSON_AddObjectToObject(root, "normalizer");
        if (!nz) goto oom;
        cJSON_AddStringToObject(nz, "type", "NFC");
    } else cJSON_AddNullToObject(root, "normalizer");
    cJSON *pt = cJSON_AddObjectToObject(root, "pre_tokenizer");
    if (!pt) goto oom;
    cJSON_AddStringToObject(pt, "type", "Sequence");
    cJSON *arr = cJSON_AddArrayToObject(pt, "pretokenizers");
    if (!arr) goto oom;
    if (ps->punct_first) {
        cJSON *p = cJSON_CreateObject();
        if (!p) goto oom;
        cJSON_AddStringToObject(p, "type", "Punctuation");
        cJSON_AddStringToObject(p, "behavior", "Contiguous");
        cJSON_AddItemToArray(arr, p);
    }
    if (ps->digits_first) {
        cJSON *d = cJSON_CreateObject();
        if (!d) goto oom;
        cJSON_AddStringToObject(d, "type", "Digits");
        cJSON_AddBoolToObject(d, "individual_digits", true);
        cJSON_AddItemToArray(arr, d);
    }
    for (int k = 0; k < 8 && ps->split[k]; k++)
        if (!add_item(arr, split_obj(ps->split[k]))) goto oom;
    if (!add_item(arr, bytelevel_obj(ps->bytelevel_regex))) goto oom;
    for (int k = 0; k < 2 && ps->after[k]; k++)
        if (!add_item(arr, split_obj(ps->after[k]))) goto oom;
    int32_t bos = meta_id(m, "tokenizer.ggml.bos_token_id", -1), eos = meta_id(m, "tokenizer.ggml.eos_token_id", -1);
    if (!add_template(root, meta_bool(m, "tokenizer.ggml.add_bos_token", false) ? bos : -1,
                      meta_bool(m, "tokenizer.ggml.add_eos_token", false) ? eos : -1, text, n))
        goto oom;
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    if (!dec) goto oom;
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON *mo = cJSON_AddObjectToObject(root, "model");
    if (!mo) goto oom;
    cJSON_AddStringToObject(mo, "type", "BPE");
    cJSON_AddNullToObject(mo, "unk_token");
    cJSON_AddBoolToObject(mo, "byte_fallback", false);
    cJSON_AddBoolToObject(mo, "ignore_merges", ps->ignore_merges);
    cJSON *vo = cJSON_AddObjectToObject(mo, "vocab");
    if (!vo) goto oom;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(text[i]);
        if (tk_smap_get(&seen, text[i], l) >= 0) continue;
        if (!tk_smap_set(&seen, text[i], l, i)) goto oom;
        cJSON_AddItemToObject(vo, text[i], cJSON_CreateNumber(i));
    }
    cJSON *mc = cJSON_Duplicate(merges, true);
    if (!mc) goto oom;
    cJSON_AddItemToObject(mo, "merges", mc);
    *json = cJSON_PrintUnformatted(root);
    if (!*json) goto oom;
    *len = strlen(*json);
    goto done;
oom:
    st = cmf_error_set(err, CMF_ERR_NOMEM, "gguf vocab: out of memory");
done:
    cJSON_Delete(root);
    tk_smap_free(&seen);
    free(types);
    free(text);
    return st;
}

static cmf_status from_bert(const cJSON *m, char **json, size_t *len, cmf_error *err) {
    const cJSON *tokens;
    char **text = NULL;
    int n;
    cmf_status st = get_tokens(m, &tokens, &text, &n, err);
    cJSON *root = NULL;
    char **wp = NULL;
    tk_smap seen = {0};
    int *types = NULL;
    if (st) goto done;
    types = int_array(meta(m, "tokenizer.ggml.token_type"), n, 1);
    wp = calloc((size_t)n + 1, sizeof *wp);
    if (!types || !wp || !tk_smap_init(&seen, (size_t)n)) goto oom;
    for (int i = 0; i < n; i++) {   /* undo llama.cpp's phantom-space encoding */
        int t = types[i];
        const char *s = text[i];
        size_t l = strlen(s);
        tk_buf b = {0};
        bool ok;
        if (t != 1) ok = tk_buf_put(&b, s, l);
        else if (l >= 3 && !memcmp(s, "\xE2\x96\x81", 3)) ok = tk_buf_put(&b, s + 3, l - 3);
        else ok = tk_buf_put(&b, "##", 2) && tk_buf_put(&b, s, l);
        if (!ok || !tk_buf_nul(&b)) { tk_buf_free(&b); goto oom; }
        wp[i] = b.p;
    }
    root = cJSON_CreateObject();
    if (!root) goto oom;
    cJSON_AddStringToObject(root, "version", "1.0");
    if (!add_added(root, n, types, wp)) goto oom;
    cJSON *nz = cJSON_AddObjectToObject(root, "normalizer");
    if (!nz) goto oom;
    cJSON_AddStringToObject(nz, "type", "BertNormalizer");
    cJSON_AddBoolToObject(nz, "clean_text", true);
    cJSON_AddBoolToObject(nz, "handle_chinese_chars", true);
    cJSON_AddNullToObject(nz, "strip_accents");
    cJSON_AddBoolToObject(nz, "lowercase", true);
    cJSON *pt = cJSON_AddObjectToObject(root, "pre_tokenizer");
    if (!pt) goto oom;
    cJSON_AddStringToObject(pt, "type", "BertPreTokenizer");
    int32_t cls = meta_id(m, "tokenizer.ggml.cls_token_id", meta_id(m, "tokenizer.ggml.bos_token_id", -1));
    int32_t sep = meta_id(m, "tokenizer.ggml.seperator_token_id", meta_id(m, "tokenizer.ggml.eos_token_id", -1));
    if (cls >= 0 && sep >= 0 && cls < n && sep < n) {
        cJSON *pp = cJSON_AddObjectToObject(root, "post_processor");
        cJSON *a = cJSON_CreateArray(), *b = cJSON_CreateArray();
        if (!pp || !a || !b) { cJSON_Delete(a); cJSON_Delete(b); goto oom; }
        cJSON_AddStringToObject(pp, "type", "BertProcessing");
        cJSON_AddItemToArray(a, cJSON_CreateString(wp[sep]));
        cJSON_AddItemToArray(a, cJSON_CreateNumber(sep));
        cJSON_AddItemToArray(b, cJSON_CreateString(wp[cls]));
        cJSON_AddItemToArray(b, cJSON_CreateNumber(cls));
        cJSON_AddItemToObject(pp, "sep", a);
        cJSON_AddItemToObject(pp, "cls", b);
    }
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    if (!dec) goto oom;
    cJSON_AddStringToObject(dec, "type", "WordPiece");
    cJSON_AddStringToObject(dec, "prefix", "##");
    cJSON_AddBoolToObject(dec, "cleanup", true);
    cJSON *mo = cJSON_AddObjectToObject(root, "model");
    if (!mo) goto oom;
    cJSON_AddStringToObject(mo, "type", "WordPiece");
    int32_t unk = meta_id(m, "tokenizer.ggml.unknown_token_id", -1);
    cJSON_AddStringToObject(mo, "unk_token", unk >= 0 && unk < n ? wp[unk] : "[UNK]");
    cJSON_AddStringToObject(mo, "continuing_subword_prefix", "##");
    cJSON_AddNumberToObject(mo, "max_input_chars_per_word", 100);
    cJSON *vo = cJSON_AddObjectToObject(mo, "vocab");
    if (!vo) goto oom;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(wp[i]);
        if (tk_smap_get(&seen, wp[i], l) >= 0) continue;
        if (!tk_smap_set(&seen, wp[i], l, i)) goto oom;
        cJSON_AddItemToObject(vo, wp[i], cJSON_CreateNumber(i));
    }
    *json = cJSON_PrintUnformatted(root);
    if (!*json) goto oom;
    *len = strlen(*json);
    goto done;
oom:
    st = cmf_error_set(err, CMF_ERR_NOMEM, "gguf vocab: out of memory");
done:
    if (wp)
        for (int i = 0; i < n; i++) free(wp[i]);
    free(wp);
    free(types);
    cJSON_Delete(root);
    tk_smap_free(&seen);
    free(text);
    return st;
}

cmf_status cmf_tokenizer_json_from_gguf(const cJSON *gguf_meta, char **json, size_t *len, cmf_error *err) {
    if (!gguf_meta || !json || !len) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tokenizer_json_from_gguf: NULL argument");
    *json = NULL;
    *len = 0;
    const cJSON *model = meta(gguf_meta, "tokenizer.ggml.model");
    if (!cJSON_IsString(model)) return cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.ggml.model: missing");
    const char *m = model->valuestring;
    if (!strcmp(m, "llama")) return from_llama(gguf_meta, json, len, err);
    if (!strcmp(m, "gpt2")) return from_gpt2(gguf_meta, json, len, err);
    if (!strcmp(m, "bert")) return from_bert(gguf_meta, json, len, err);
    return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "tokenizer.ggml.model: unsupported \"%s\"", m);
}
