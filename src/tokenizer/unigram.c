/*
 * unigram.c — the Unigram model of HF `tokenizers` (models/unigram): vocab
 * as [[piece, log-prob], ...], Viterbi segmentation maximising the sum of
 * piece scores; characters no piece covers become unk with score
 * min_score - 10 (kUnkPenalty, as SentencePiece), consecutive unks fused;
 * with byte_fallback an unk piece is replaced by its <0xXX> byte tokens.
 *
 * Lattice: best[i] = best score of a segmentation of w[0..i) (i on char
 * boundaries); pieces are looked up by hash for every end position up to
 * the longest piece length, so the cost is O(n * max_piece_chars).
 */
#include "tok_internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

cmf_status tk_unigram_load(const cJSON *j, tk_model *m, cmf_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "vocab");
    if (!cJSON_IsArray(v)) return cmf_error_set(err, CMF_ERR_FORMAT, "model.vocab: missing or not an array");
    size_t n = (size_t)cJSON_GetArraySize(v);
    m->n_ids = n;
    m->tok_owned = true;
    m->id_to_tok = calloc(n + 1, sizeof *m->id_to_tok);
    m->scores = calloc(n + 1, sizeof *m->scores);
    if (!m->id_to_tok || !m->scores || !tk_smap_init(&m->vocab, n))
        return cmf_error_set(err, CMF_ERR_NOMEM, "model.vocab: out of memory");
    m->min_score = DBL_MAX;
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        const cJSON *p = cJSON_GetArrayItem(e, 0), *s = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || !cJSON_IsString(p) || !cJSON_IsNumber(s))
            return cmf_error_set(err, CMF_ERR_FORMAT, "model.vocab[%zu]: expected [piece, score]", i);
        size_t len = strlen(p->valuestring);
        m->id_to_tok[i] = malloc(len + 1);
        if (!m->id_to_tok[i]) return cmf_error_set(err, CMF_ERR_NOMEM, "model.vocab: out of memory");
        memcpy(m->id_to_tok[i], p->valuestring, len + 1);
        if (tk_smap_get(&m->vocab, p->valuestring, len) < 0 &&
            !tk_smap_set(&m->vocab, p->valuestring, len, (int32_t)i))
            return cmf_error_set(err, CMF_ERR_NOMEM, "model.vocab: out of memory");
        m->scores[i] = s->valuedouble;
        if (s->valuedouble < m->min_score) m->min_score = s->valuedouble;
        size_t chars = 0;
        for (size_t k = 0; k < len; k++) chars += ((unsigned char)p->valuestring[k] & 0xC0) != 0x80;
        if ((int)chars > m->max_chars) m->max_chars = (int)chars;
        i++;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "unk_id");
    if (cJSON_IsNumber(u)) {
        if (!tk_json_id(u, &m->unk_id) || m->unk_id >= (int64_t)n)
            return cmf_error_set(err, CMF_ERR_FORMAT, "model.unk_id: %g is not an integer in 0..%zu", u->valuedouble,
                                 n ? n - 1 : 0);
    }
    const cJSON *bf = cJSON_GetObjectItemCaseSensitive(j, "byte_fallback");
    m->byte_fallback = cJSON_IsTrue(bf);
    if (m->byte_fallback)
        for (int b = 0; b < 256; b++) {
            char t[8];
            snprintf(t, sizeof t, "<0x%02X>", b);
            m->byte_ids[b] = tk_smap_get(&m->vocab, t, 6);
        }
    if (m->max_chars < 1) m->max_chars = 1;
    return CMF_OK;
}

cmf_status tk_unigram_word(const tk_model *m, const char *w, size_t n, tk_ids *out, cmf_error *err) {
    if (n == 0) return CMF_OK;
    double *best = malloc((n + 1) * sizeof *best);
    size_t *from = malloc((n + 1) * sizeof *from);
    int32_t *tok = malloc((n + 1) * sizeof *tok);
    size_t *starts = NULL;
    cmf_status st = CMF_OK;
    if (!best || !from || !tok) goto oom;
    for (size_t i = 0; i <= n; i++) { best[i] = -INFINITY; from[i] = 0; tok[i] = -1; }
    best[0] = 0;
    double unk_score = m->min_score - 10.0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k1 = tk_utf8_next(w + i, n - i, &cp);
        if (best[i] > -INFINITY) {
            bool single = false;
            size_t j = i;
            for (int c = 0; c < m->max_chars && j < n; c++) {
                j += tk_utf8_next(w + j, n - j, &cp);
                int32_t id = tk_smap_get(&m->vocab, w + i, j - i);
                if (id < 0) continue;
                if (c == 0) single = true;
                double sc = best[i] + m->scores[id];
                if (sc > best[j]) { best[j] = sc; from[j] = i; tok[j] = id; }
            }
            if (!single) {
                double sc = best[i] + unk_score;
                if (sc > best[i + k1]) { best[i + k1] = sc; from[i + k1] = i; tok[i + k1] = -2; }
            }
        }
        i += k1;
    }
    /* backtrack into (start, end, id) triples, reversed */
    size_t cnt = 0;
    for (size_t j = n; j > 0; j = from[j]) cnt++;
    starts = malloc(cnt * 3 * sizeof *starts);
    if (!starts) goto oom;
    size_t k = cnt;
    for (size_t j = n; j > 0; j = from[j]) {
        k--;
        starts[3 * k] = from[j];
        starts[3 * k + 1] = j;
        starts[3 * k + 2] = (size_t)(tok[j] < 0 ? -1 : tok[j]);
    }
    for (size_t t = 0; t < cnt; t++) {
        int32_t id = (int32_t)starts[3 * t + 2];
        size_t a = starts[3 * t], b = starts[3 * t + 1];
        if (id >= 0 && id != m->unk_id) { if (!tk_ids_push(out, id)) goto oom; continue; }
        /* fuse consecutive unknowns */
        while (t + 1 < cnt && ((int32_t)starts[3 * (t + 1) + 2] < 0 || (int32_t)starts[3 * (t + 1) + 2] == m->unk_id)) {
            t++;
            b = starts[3 * t + 1];
        }
        bool done = false;
        if (m->byte_fallback) {
            bool all = true;
            for (size_t x = a; x < b; x++) all = all && m->byte_ids[(uint8_t)w[x]] >= 0;
            if (all) {
                for (size_t x = a; x < b; x++)
                    if (!tk_ids_push(out, m->byte_ids[(uint8_t)w[x]])) goto oom;
                done = true;
            }
        }
        if (!done) {
            if (m->unk_id < 0) { st = cmf_error_set(err, CMF_ERR_FORMAT, "unigram: text needs <unk> but model.unk_id is not set"); goto end; }
            if (!tk_ids_push(out, m->unk_id)) goto oom;
        }
    }
    goto end;
oom:
    st = cmf_error_set(err, CMF_ERR_NOMEM, "unigram: out of memory");
end:
    free(best);
    free(from);
    free(tok);
    free(starts);
    return st;
}
