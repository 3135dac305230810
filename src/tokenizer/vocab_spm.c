/*
 * vocab_spm.c — builds a SentencePiece-BPE style tokenizer.json from a list
 * of pieces with scores (llama2.c tokenizer.bin, GGUF "llama" vocab), and
 * the llama2.c converter cmf_tokenizer_json_from_llama2c.
 *
 * The JSON is what HF's LlamaConverter (legacy) writes — BPE with
 * byte_fallback, normalizer Prepend("▁") + Replace(" ", "▁"), decoder
 * Replace("▁", " ") + ByteFallback + Fuse + Strip(" ", 1, 0), a
 * TemplateProcessing for BOS/EOS — with merges derived from the scores:
 * every split of a piece into two pieces of the vocab is a merge, listed by
 * descending score of the merged piece. Two cmf extensions (ignored by HF)
 * make the merge order exactly SentencePiece's / llama.cpp's / llama2.c's:
 * model.cmf_scores (score per id) and model.cmf_merge_rank = "score": merges
 * with equal merged-piece score share a rank, so ties go to the leftmost
 * pair (bpe.c).
 */
#include "tok_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "vocab_spm.h"

typedef struct { int32_t l, r, res; float score; } spm_merge;

static int merge_cmp(const void *a, const void *b) {
    const spm_merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->res != y->res) return x->res < y->res ? -1 : 1;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return 0;
}

static bool is_byte_piece(const char *s, size_t n) {
    return n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>';
}

/* Replace ' ' by U+2581 when space_to_meta. */
static char *meta_copy(const char *s, size_t n, bool space_to_meta) {
    tk_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        bool ok = (space_to_meta && s[i] == ' ') ? tk_buf_put(&b, "\xE2\x96\x81", 3) : tk_buf_putc(&b, s[i]);
        if (!ok) { tk_buf_free(&b); return NULL; }
    }
    if (!tk_buf_nul(&b)) { tk_buf_free(&b); return NULL; }
    return b.p;
}

static cJSON *jstr_obj(const char *type, const char *k1, const char *v1) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "type", type);
    if (k1) cJSON_AddStringToObject(o, k1, v1);
    return o;
}

static cJSON *pattern_obj(const char *s) {
    cJSON *p = cJSON_CreateObject();
    if (p) cJSON_AddStringToObject(p, "String", s);
    return p;
}

cmf_status tk_spm_json(const tk_spm_vocab *v, char **json, size_t *len, cmf_error *err) {
    size_t n = v->n;
    cmf_status st = CMF_OK;
    char **piece = calloc(n + 1, sizeof *piece);
    spm_merge *mg = NULL;
    size_t nm = 0, mcap = 0;
    tk_smap map = {0};
    cJSON *root = NULL;
    if (!piece || !tk_smap_init(&map, n)) goto oom;
    for (size_t i = 0; i < n; i++) {
        if (!(piece[i] = meta_copy(v->text[i], v->len[i], v->space_to_meta))) goto oom;
        if (tk_smap_get(&map, piece[i], strlen(piece[i])) < 0 && !tk_smap_set(&map, piece[i], strlen(piece[i]), (int32_t)i))
            goto oom;
    }
    /* merges: every split of a normal piece into two vocab pieces */
    for (size_t i = 0; i < n; i++) {
        int ty = v->type ? v->type[i] : 1;
        if (ty != 1 || is_byte_piece(piece[i], strlen(piece[i]))) continue;
        if (tk_smap_get(&map, piece[i], strlen(piece[i])) != (int32_t)i) continue;   /* duplicate text */
        size_t pl = strlen(piece[i]);
        for (size_t k = 1; k < pl; k++) {
            if (((unsigned char)piece[i][k] & 0xC0) == 0x80) continue;
            int32_t l = tk_smap_get(&map, piece[i], k), r = tk_smap_get(&map, piece[i] + k, pl - k);
            if (l < 0 || r < 0) continue;
            if (nm == mcap) {
                size_t nc = mcap ? mcap * 2 : 4096;
                spm_merge *nmg = realloc(mg, nc * sizeof *nmg);
                if (!nmg) goto oom;
                mg = nmg;
                mcap = nc;
            }
            mg[nm++] = (spm_merge){l, r, (int32_t)i, v->score ? v->score[i] : 0.0f};
        }
    }
    if (nm) qsort(mg, nm, sizeof *mg, merge_cmp);

    root = cJSON_CreateObject();
    if (!root) goto oom;
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (size_t i = 0; added && i < n; i++) {
        int ty = v->type ? v->type[i] : 1;
        bool special = ty == 2 || ty == 3 || (int32_t)i == v->unk_id || (int32_t)i == v->bos_id || (int32_t)i == v->eos_id;
        if (!special && ty != 4) continue;
        cJSON *a = cJSON_CreateObject();
        if (!a) goto oom;
        cJSON_AddItemToArray(added, a);
        cJSON_AddNumberToObject(a, "id", (double)i);
        cJSON_AddStringToObject(a, "content", piece[i]);
        cJSON_AddBoolToObject(a, "single_word", false);
        cJSON_AddBoolToObject(a, "lstrip", false);
        cJSON_AddBoolToObject(a, "rstrip", false);
        cJSON_AddBoolToObject(a, "normalized", false);
        cJSON_AddBoolToObject(a, "special", special);
    }
    /* normalizer */
    if (v->add_space_prefix) {
        cJSON *nz = jstr_obj("Sequence", NULL, NULL);
        cJSON_AddItemToObject(root, "normalizer", nz);
        cJSON *arr = nz ? cJSON_AddArrayToObject(nz, "normalizers") : NULL;
        cJSON *pre = jstr_obj("Prepend", "prepend", "\xE2\x96\x81");
        cJSON *rep = jstr_obj("Replace", "content", "\xE2\x96\x81");
        if (!arr || !pre || !rep) { cJSON_Delete(pre); cJSON_Delete(rep); goto oom; }
        cJSON_AddItemToArray(arr, pre);
        cJSON_AddItemToObject(rep, "pattern", pattern_obj(" "));
        cJSON_AddItemToArray(arr, rep);
    } else {
        cJSON *rep = jstr_obj("Replace", "content", "\xE2\x96\x81");
        if (!rep) goto oom;
        cJSON_AddItemToObject(rep, "pattern", pattern_obj(" "));
        cJSON_AddItemToObject(root, "normalizer", rep);
    }
    cJSON_AddNullToObject(root, "pre_tokenizer");
    /* post-processor */
    {
        cJSON *pp = jstr_obj("TemplateProcessing", NULL, NULL);
        if (!pp) goto oom;
        cJSON_AddItemToObject(root, "post_processor", pp);
        cJSON *single = cJSON_AddArrayToObject(pp, "single");
        cJSON *pair = cJSON_AddArrayToObject(pp, "pair");
        cJSON *sp = cJSON_AddObjectToObject(pp, "special_tokens");
        if (!single || !pair || !sp) goto oom;
        int32_t ids[3] = {v->add_bos ? v->bos_id : -1, -2, v->add_eos ? v->eos_id : -1};
        for (int k = 0; k < 3; k++) {
            cJSON *it = cJSON_CreateObject(), *inner = cJSON_CreateObject();
            if (!it || !inner) { cJSON_Delete(it); cJSON_Delete(inner); goto oom; }
            if (ids[k] == -1 || (ids[k] >= 0 && (size_t)ids[k] >= n)) { cJSON_Delete(it); cJSON_Delete(inner); continue; }
            if (ids[k] == -2) {
                cJSON_AddStringToObject(inner, "id", "A");
                cJSON_AddNumberToObject(inner, "type_id", 0);
                cJSON_AddItemToObject(it, "Sequence", inner);
            } else {
                cJSON_AddStringToObject(inner, "id", piece[ids[k]]);
                cJSON_AddNumberToObject(inner, "type_id", 0);
                cJSON_AddItemToObject(it, "SpecialToken", inner);
                cJSON *d = cJSON_CreateObject();
                if (!d) { cJSON_Delete(it); goto oom; }
                cJSON_AddStringToObject(d, "id", piece[ids[k]]);
                cJSON *ia = cJSON_AddArrayToObject(d, "ids");
                cJSON *ta = cJSON_AddArrayToObject(d, "tokens");
                if (ia) cJSON_AddItemToArray(ia, cJSON_CreateNumber(ids[k]));
                if (ta) cJSON_AddItemToArray(ta, cJSON_CreateString(piece[ids[k]]));
                cJSON_DeleteItemFromObject(sp, piece[ids[k]]);
                cJSON_AddItemToObject(sp, piece[ids[k]], d);
            }
            cJSON_AddItemToArray(single, it);
        }
    }
    /* decoder */
    {
        cJSON *dec = jstr_obj("Sequence", NULL, NULL);
        if (!dec) goto oom;
        cJSON_AddItemToObject(root, "decoder", dec);
        cJSON *arr = cJSON_AddArrayToObject(dec, "decoders");
        cJSON *rep = jstr_obj("Replace", "content", " ");
        cJSON *bf = jstr_obj("ByteFallback", NULL, NULL), *fu = jstr_obj("Fuse", NULL, NULL);
        cJSON *stp = v->add_space_prefix ? jstr_obj("Strip", "content", " ") : NULL;
        if (!arr || !rep || !bf || !fu || (v->add_space_prefix && !stp)) {
            cJSON_Delete(rep); cJSON_Delete(bf); cJSON_Delete(fu); cJSON_Delete(stp);
            goto oom;
        }
        cJSON_AddItemToObject(rep, "pattern", pattern_obj("\xE2\x96\x81"));
        cJSON_AddItemToArray(arr, rep);
        cJSON_AddItemToArray(arr, bf);
        cJSON_AddItemToArray(arr, fu);
        if (stp) {
            cJSON_AddNumberToObject(stp, "start", 1);
            cJSON_AddNumberToObject(stp, "stop", 0);
            cJSON_AddItemToArray(arr, stp);
        }
    }
    /* model */
    {
        cJSON *m = cJSON_AddObjectToObject(root, "model");
        if (!m) goto oom;
        cJSON_AddStringToObject(m, "type", "BPE");
        cJSON_AddNullToObject(m, "dropout");
        if (v->unk_id >= 0 && (size_t)v->unk_id < n) cJSON_AddStringToObject(m, "unk_token", piece[v->unk_id]);
        else cJSON_AddNullToObject(m, "unk_token");
        cJSON_AddNullToObject(m, "continuing_subword_prefix");
        cJSON_AddNullToObject(m, "end_of_word_suffix");
        cJSON_AddBoolToObject(m, "fuse_unk", true);
        cJSON_AddBoolToObject(m, "byte_fallback", true);
        cJSON_AddBoolToObject(m, "ignore_merges", false);
        cJSON_AddStringToObject(m, "cmf_merge_rank", "score");
        cJSON *vo = cJSON_AddObjectToObject(m, "vocab");
        cJSON *sc = cJSON_AddArrayToObject(m, "cmf_scores");
        cJSON *me = cJSON_AddArrayToObject(m, "merges");
        if (!vo || !sc || !me) goto oom;
        for (size_t i = 0; i < n; i++) {
            if (tk_smap_get(&map, piece[i], strlen(piece[i])) == (int32_t)i)   /* first of duplicates */
                cJSON_AddItemToObject(vo, piece[i], cJSON_CreateNumber((double)i));
            float s = v->score ? v->score[i] : 0.0f;
            cJSON_AddItemToArray(sc, cJSON_CreateNumber(isfinite(s) ? s : 0.0));
        }
        for (size_t i = 0; i < nm; i++) {
            cJSON *pr = cJSON_CreateArray();
            if (!pr) goto oom;
            cJSON_AddItemToArray(pr, cJSON_CreateString(piece[mg[i].l]));
            cJSON_AddItemToArray(pr, cJSON_CreateString(piece[mg[i].r]));
            cJSON_AddItemToArray(me, pr);
        }
    }
    *json = cJSON_PrintUnformatted(root);
    if (!*json) goto oom;
    *len = strlen(*json);
    goto done;
oom:
    st = cmf_error_set(err, CMF_ERR_NOMEM, "sentencepiece vocab: out of memory");
done:
    if (piece)
        for (size_t i = 0; i < n; i++) free(piece[i]);
    free(piece);
    free(mg);
    tk_smap_free(&map);
    cJSON_Delete(root);
    return st;
}

/* ---- llama2.c tokenizer.bin ------------------------------------------------ */

cmf_status cmf_tokenizer_json_from_llama2c(const void *data, size_t size, uint32_t vocab_size, char **json,
                                           size_t *len, cmf_error *err) {
    if (!data || !json || !len) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tokenizer_json_from_llama2c: NULL argument");
    *json = NULL;
    *len = 0;
    const unsigned char *p = data;
    if (size < 4) return cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.bin: truncated header");
    if (vocab_size == 0 || vocab_size > 10000000) return cmf_error_set(err, CMF_ERR_ARG, "tokenizer.bin: bad vocab_size %u", vocab_size);
    /* A piece takes at least 8 bytes: refuse before allocating per piece. */
    if (vocab_size > (size - 4) / 8)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "tokenizer.bin: %zu bytes cannot hold the checkpoint's vocab_size %u pieces",
                             size, vocab_size);
    tk_spm_vocab v = {0};
    v.n = vocab_size;
    v.text = calloc(vocab_size, sizeof *v.text);
    v.len = calloc(vocab_size, sizeof *v.len);
    v.score = calloc(vocab_size, sizeof *v.score);
    v.type = calloc(vocab_size, sizeof *v.type);
    cmf_status st = CMF_OK;
    if (!v.text || !v.len || !v.score || !v.type) { st = cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer.bin: out of memory"); goto done; }
    size_t off = 4;
    for (uint32_t i = 0; i < vocab_size; i++) {
        if (size == off) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.bin: %u pieces, the checkpoint's vocab_size is %u", i,
                               vocab_size);
            goto done;
        }
        if (size - off < 8) { st = cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.bin: piece %u: truncated", i); goto done; }
        float sc;
        int32_t l;
        memcpy(&sc, p + off, 4);
        memcpy(&l, p + off + 4, 4);
        off += 8;
        if (l < 0 || (size_t)l > size - off) { st = cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.bin: piece %u: bad length %d", i, (int)l); goto done; }
        v.text[i] = (const char *)p + off;
        v.len[i] = (size_t)l;
        v.score[i] = sc;
        v.type[i] = 1;
        for (int32_t k = 0; k < l; k++)
            if (p[off + k] == 0) { st = cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.bin: piece %u: contains NUL", i); goto done; }
        off += (size_t)l;
        if (is_byte_piece(v.text[i], v.len[i])) v.type[i] = 6;
    }
    if (off < size) {
        /* More pieces than the checkpoint's vocabulary (another model's
         * tokenizer), or bytes that are no piece at all. */
        size_t more = 0, at = off;
        while (size - at >= 8) {
            int32_t l;
            memcpy(&l, p + at + 4, 4);
            if (l < 0 || (size_t)l > size - at - 8) break;
            at += 8 + (size_t)l;
            more++;
        }
        if (at == size)
            st = cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.bin: %zu pieces, the checkpoint's vocab_size is %u",
                               (size_t)vocab_size + more, vocab_size);
        else
            st = cmf_error_set(err, CMF_ERR_FORMAT,
                               "tokenizer.bin: %zu unread trailing bytes after the checkpoint's vocab_size %u pieces",
                               size - off, vocab_size);
        goto done;
    }
    /* llama2.c convention: 0 <unk>, 1 BOS, 2 EOS (exported as "\n<s>\n"...) */
    static const char *const names[3] = {"<unk>", "<s>", "</s>"};
    for (uint32_t i = 0; i < 3 && i < vocab_size; i++) {
        v.text[i] = names[i];
        v.len[i] = strlen(names[i]);
        v.type[i] = i == 0 ? 2 : 3;
    }
    v.unk_id = 0;
    v.bos_id = vocab_size > 1 ? 1 : -1;
    v.eos_id = vocab_size > 2 ? 2 : -1;
    v.add_bos = true;
    v.add_eos = false;
    v.add_space_prefix = true;
    v.space_to_meta = true;
    st = tk_spm_json(&v, json, len, err);
done:
    free(v.text);
    free(v.len);
    free(v.score);
    free(v.type);
    return st;
}
