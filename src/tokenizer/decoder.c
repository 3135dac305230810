/*
 * decoder.c — HF `tokenizers` decoders (tokenizers/src/decoders/),
 * each a `decode_chain` over the list of token strings: ByteLevel (GPT-2
 * byte map back to bytes, lossy UTF-8), Metaspace, ByteFallback (<0xXX>
 * runs to UTF-8, U+FFFD per byte when invalid), Fuse, Strip, Replace,
 * WordPiece (with cleanup), BPEDecoder, Sequence. The final list is
 * concatenated.
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

enum { D_SEQ, D_BYTELEVEL, D_METASPACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_REPLACE, D_WORDPIECE, D_BPE };

struct tk_decoder {
    int type;
    tk_decoder **kids;
    size_t n_kids;
    char *a, *b;        /* Metaspace replacement; Replace pattern/content; Strip content; WordPiece/BPE prefix */
    size_t al, bl;
    tk_regex re;
    int start, stop;    /* Strip */
    bool flag;          /* Metaspace: strip first; WordPiece: cleanup */
};

cmf_status tk_load_pattern(const cJSON *pat, const char *field, char **str, size_t *str_len,
                           tk_regex *re, cmf_error *err);

void tk_decoder_free(tk_decoder *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_kids; i++) tk_decoder_free(d->kids[i]);
    free(d->kids);
    free(d->a);
    free(d->b);
    tk_regex_free(&d->re);
    free(d);
}

static char *dupz(const char *s, size_t *n) {
    *n = strlen(s);
    char *p = malloc(*n + 1);
    if (p) memcpy(p, s, *n + 1);
    return p;
}

static const char *jstr(const cJSON *j, const char *k, const char *dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsString(v) ? v->valuestring : dflt;
}

cmf_status tk_decoder_load(const cJSON *j, tk_decoder **out, cmf_error *err) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return CMF_OK;
    const char *ty = jstr(j, "type", NULL);
    if (!ty) return cmf_error_set(err, CMF_ERR_FORMAT, "decoder.type: missing");
    tk_decoder *d = calloc(1, sizeof *d);
    if (!d) return cmf_error_set(err, CMF_ERR_NOMEM, "decoder: out of memory");
    cmf_status st = CMF_OK;
    if (!strcmp(ty, "Sequence")) {
        d->type = D_SEQ;
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "decoders"), *e;
        if (!cJSON_IsArray(arr)) { st = cmf_error_set(err, CMF_ERR_FORMAT, "decoder.decoders: missing"); goto fail; }
        d->kids = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *d->kids);
        if (!d->kids) goto oom;
        cJSON_ArrayForEach(e, arr) {
            if ((st = tk_decoder_load(e, &d->kids[d->n_kids], err))) goto fail;
            if (d->kids[d->n_kids]) d->n_kids++;
        }
    } else if (!strcmp(ty, "ByteLevel")) d->type = D_BYTELEVEL;
    else if (!strcmp(ty, "Metaspace")) {
        d->type = D_METASPACE;
        if (!(d->a = dupz(jstr(j, "replacement", "\xE2\x96\x81"), &d->al))) goto oom;
        const char *ps = jstr(j, "prepend_scheme", NULL);
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
        d->flag = ps ? strcmp(ps, "never") != 0 : !cJSON_IsFalse(aps);
    } else if (!strcmp(ty, "ByteFallback")) d->type = D_BYTEFALLBACK;
    else if (!strcmp(ty, "Fuse")) d->type = D_FUSE;
    else if (!strcmp(ty, "Strip")) {
        d->type = D_STRIP;
        if (!(d->a = dupz(jstr(j, "content", " "), &d->al))) goto oom;
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "start"), *e = cJSON_GetObjectItemCaseSensitive(j, "stop");
        d->start = cJSON_IsNumber(s) && s->valuedouble > 0 && s->valuedouble < 1e6 ? (int)s->valuedouble : 0;
        d->stop = cJSON_IsNumber(e) && e->valuedouble > 0 && e->valuedouble < 1e6 ? (int)e->valuedouble : 0;
    } else if (!strcmp(ty, "Replace")) {
        d->type = D_REPLACE;
        const char *c = jstr(j, "content", NULL);
        if (!c) { st = cmf_error_set(err, CMF_ERR_FORMAT, "decoder Replace.content: missing"); goto fail; }
        if (!(d->b = dupz(c, &d->bl))) goto oom;
        if ((st = tk_load_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), "decoder Replace", &d->a, &d->al, &d->re, err)))
            goto fail;
    } else if (!strcmp(ty, "WordPiece")) {
        d->type = D_WORDPIECE;
        if (!(d->a = dupz(jstr(j, "prefix", "##"), &d->al))) goto oom;
        d->flag = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "cleanup"));
    } else if (!strcmp(ty, "BPEDecoder")) {
        d->type = D_BPE;
        if (!(d->a = dupz(jstr(j, "suffix", "</w>"), &d->al))) goto oom;
    } else {
        st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "decoder.type: unsupported \"%s\"", ty);
        goto fail;
    }
    *out = d;
    return CMF_OK;
oom:
    st = cmf_error_set(err, CMF_ERR_NOMEM, "decoder: out of memory");
fail:
    tk_decoder_free(d);
    return st;
}

/* Replace every occurrence of pat with rep in s[0..n), appending to out. */
static bool replace_all(tk_buf *out, const char *s, size_t n, const char *pat, size_t pl, const char *rep,
                        size_t rl) {
    size_t i = 0;
    while (i < n) {
        if (pl && n - i >= pl && !memcmp(s + i, pat, pl)) {
            if (!tk_buf_put(out, rep, rl)) return false;
            i += pl;
        } else {
            if (!tk_buf_putc(out, s[i])) return false;
            i++;
        }
    }
    return true;
}

static int hexv(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static bool flush_bytes(tk_pieces *out, tk_buf *bytes) {
    if (!bytes->n) return true;
    size_t i = 0;
    bool valid = true;
    while (i < bytes->n) {
        int32_t c;
        i += tk_utf8_next(bytes->p + i, bytes->n - i, &c);
        if (c < 0) { valid = false; break; }
    }
    bool ok;
    if (valid) ok = tk_pieces_add(out, bytes->p, bytes->n, -1, false);
    else {
        tk_buf r = {0};
        ok = true;
        for (size_t k = 0; k < bytes->n && ok; k++) ok = tk_buf_cp(&r, 0xFFFD);
        ok = ok && tk_pieces_add(out, r.p, r.n, -1, false);
        tk_buf_free(&r);
    }
    bytes->n = 0;
    return ok;
}

static const char *const CLEANUP[][2] = {
    {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
    {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};

/* One decoder step: in -> out (out cleared first). */
static cmf_status step(const tk_decoder *d, const tk_pieces *in, tk_pieces *out, cmf_error *err) {
    tk_pieces_clear(out);
    tk_buf t = {0}, u = {0};
    cmf_status st = CMF_OK;
#define P(i) (in->buf.p + in->v[i].off)
#define L(i) (in->v[i].len)
    switch (d->type) {
    case D_SEQ: {
        tk_pieces a = {0}, b = {0};
        for (size_t i = 0; i < in->n; i++)
            if (!tk_pieces_add(&a, P(i), L(i), -1, false)) { tk_pieces_free(&a); goto oom; }
        for (size_t k = 0; k < d->n_kids && !st; k++) {
            st = step(d->kids[k], &a, &b, err);
            tk_pieces sw = a; a = b; b = sw;
        }
        for (size_t i = 0; !st && i < a.n; i++)
            if (!tk_pieces_add(out, a.buf.p + a.v[i].off, a.v[i].len, -1, false)) st = cmf_error_set(err, CMF_ERR_NOMEM, "decoder: out of memory");
        tk_pieces_free(&a);
        tk_pieces_free(&b);
        return st;
    }
    case D_BYTELEVEL: {
        for (size_t i = 0; i < in->n; i++)
            for (size_t k = 0; k < L(i);) {
                int32_t c;
                size_t m = tk_utf8_next(P(i) + k, L(i) - k, &c);
                int b = tk_cp_to_byte(c);
                if (!(b >= 0 ? tk_buf_putc(&t, (char)b) : tk_buf_put(&t, P(i) + k, m))) goto oom;
                k += m;
            }
        size_t ln;
        char *s = tk_utf8_lossy(t.p ? t.p : "", t.n, &ln);
        if (!s) goto oom;
        bool ok = tk_pieces_add(out, s, ln, -1, false);
        free(s);
        if (!ok) goto oom;
        break;
    }
    case D_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            t.n = 0;
            for (size_t k = 0; k < L(i);) {
                if (L(i) - k >= d->al && !memcmp(P(i) + k, d->a, d->al)) {
                    k += d->al;
                    if (i == 0 && d->flag) continue;
                    if (!tk_buf_putc(&t, ' ')) goto oom;
                } else {
                    if (!tk_buf_putc(&t, P(i)[k])) goto oom;
                    k++;
                }
            }
            if (!tk_pieces_add(out, t.p ? t.p : "", t.n, -1, false)) goto oom;
        }
        break;
    case D_BYTEFALLBACK:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = P(i);
            if (L(i) == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexv(s[3]) >= 0 && hexv(s[4]) >= 0) {
                if (!tk_buf_putc(&t, (char)(hexv(s[3]) * 16 + hexv(s[4])))) goto oom;
                continue;
            }
            if (!flush_bytes(out, &t) || !tk_pieces_add(out, s, L(i), -1, false)) goto oom;
        }
        if (!flush_bytes(out, &t)) goto oom;
        break;
    case D_FUSE:
        for (size_t i = 0; i < in->n; i++)
            if (!tk_buf_put(&t, P(i), L(i))) goto oom;
        if (!tk_pieces_add(out, t.p ? t.p : "", t.n, -1, false)) goto oom;
        break;
    case D_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            size_t a = 0, b = L(i);
            for (int k = 0; k < d->start && b - a >= d->al && d->al && !memcmp(P(i) + a, d->a, d->al); k++) a += d->al;
            for (int k = 0; k < d->stop && b - a >= d->al && d->al && !memcmp(P(i) + b - d->al, d->a, d->al); k++) b -= d->al;
            if (!tk_pieces_add(out, P(i) + a, b - a, -1, false)) goto oom;
        }
        break;
    case D_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            t.n = 0;
            if (d->a) {
                if (!replace_all(&t, P(i), L(i), d->a, d->al, d->b, d->bl)) goto oom;
            } else {
                tk_ids m = {0};
                if ((st = tk_regex_find_all(&d->re, P(i), L(i), &m, err))) { tk_ids_free(&m); goto end; }
                size_t prev = 0;
                for (size_t k = 0; k + 1 < m.n; k += 2) {
                    if (!tk_buf_put(&t, P(i) + prev, (size_t)m.v[k] - prev) || !tk_buf_put(&t, d->b, d->bl)) { tk_ids_free(&m); goto oom; }
                    prev = (size_t)m.v[k + 1];
                }
                tk_ids_free(&m);
                if (!tk_buf_put(&t, P(i) + prev, L(i) - prev)) goto oom;
            }
            if (!tk_pieces_add(out, t.p ? t.p : "", t.n, -1, false)) goto oom;
        }
        break;
    case D_WORDPIECE:
        for (size_t i = 0; i < in->n; i++) {
            t.n = 0;
            if (i != 0) {
                if (L(i) >= d->al && !memcmp(P(i), d->a, d->al)) {
                    if (!tk_buf_put(&t, P(i) + d->al, L(i) - d->al)) goto oom;
                } else if (!tk_buf_putc(&t, ' ') || !tk_buf_put(&t, P(i), L(i))) goto oom;
            } else if (!tk_buf_put(&t, P(i), L(i))) goto oom;
            if (d->flag)
                for (size_t c = 0; c < sizeof CLEANUP / sizeof CLEANUP[0]; c++) {
                    u.n = 0;
                    if (!replace_all(&u, t.p ? t.p : "", t.n, CLEANUP[c][0], strlen(CLEANUP[c][0]), CLEANUP[c][1], strlen(CLEANUP[c][1])))
                        goto oom;
                    tk_buf sw = t; t = u; u = sw;
                }
            if (!tk_pieces_add(out, t.p ? t.p : "", t.n, -1, false)) goto oom;
        }
        break;
    case D_BPE:
        for (size_t i = 0; i < in->n; i++) {
            t.n = 0;
            const char *rep = i + 1 == in->n ? "" : " ";
            if (!replace_all(&t, P(i), L(i), d->a, d->al, rep, strlen(rep))) goto oom;
            if (!tk_pieces_add(out, t.p ? t.p : "", t.n, -1, false)) goto oom;
        }
        break;
    }
#undef P
#undef L
    goto end;
oom:
    st = cmf_error_set(err, CMF_ERR_NOMEM, "decoder: out of memory");
end:
    tk_buf_free(&t);
    tk_buf_free(&u);
    return st;
}

cmf_status tk_decoder_run(const tk_decoder *d, char **toks, size_t *lens, size_t n, tk_buf *out,
                          cmf_error *err) {
    tk_pieces in = {0}, res = {0};
    cmf_status st = CMF_OK;
    out->n = 0;
    for (size_t i = 0; i < n; i++)
        if (!tk_pieces_add(&in, toks[i], lens[i], -1, false)) { st = cmf_error_set(err, CMF_ERR_NOMEM, "decoder: out of memory"); goto done; }
    if (!d) {   /* no decoder: HF joins tokens with a space */
        for (size_t i = 0; i < in.n; i++)
            if ((i && !tk_buf_putc(out, ' ')) || !tk_buf_put(out, in.buf.p + in.v[i].off, in.v[i].len)) {
                st = cmf_error_set(err, CMF_ERR_NOMEM, "decoder: out of memory");
                goto done;
            }
    } else {
        if ((st = step(d, &in, &res, err))) goto done;
        for (size_t i = 0; i < res.n; i++)
            if (!tk_buf_put(out, res.buf.p + res.v[i].off, res.v[i].len)) { st = cmf_error_set(err, CMF_ERR_NOMEM, "decoder: out of memory"); goto done; }
    }
    if (!tk_buf_nul(out)) st = cmf_error_set(err, CMF_ERR_NOMEM, "decoder: out of memory");
done:
    tk_pieces_free(&in);
    tk_pieces_free(&res);
    return st;
}

/* ---- one token's raw bytes (cmf_tokenizer_token_bytes) ------------------ */

/* The decoder chain applied to one token string as it reads in the middle
 * of a text: no first-token rules (Metaspace's prepend strip, Strip of
 * the fused text), no lossy UTF-8 repair (ByteLevel and ByteFallback give
 * the raw bytes, possibly part of a character), WordPiece and BPE as a
 * non-first, non-last piece. s/n in, result in *io (replaced). */
static bool raw_step(const tk_decoder *d, tk_buf *io) {
    tk_buf t = {0};
    const char *p = io->p ? io->p : "";
    size_t n = io->n;
    bool ok = true;
    switch (d->type) {
    case D_SEQ:
        for (size_t k = 0; k < d->n_kids && ok; k++) ok = raw_step(d->kids[k], io);
        return ok;
    case D_BYTELEVEL:
        for (size_t k = 0; k < n && ok;) {
            int32_t c;
            size_t m = tk_utf8_next(p + k, n - k, &c);
            int b = tk_cp_to_byte(c);
            ok = b >= 0 ? tk_buf_putc(&t, (char)b) : tk_buf_put(&t, p + k, m);
            k += m;
        }
        break;
    case D_METASPACE:
        for (size_t k = 0; k < n && ok;)
            if (d->al && n - k >= d->al && !memcmp(p + k, d->a, d->al)) { ok = tk_buf_putc(&t, ' '); k += d->al; }
            else ok = tk_buf_putc(&t, p[k++]);
        break;
    case D_BYTEFALLBACK:
        if (n == 6 && !memcmp(p, "<0x", 3) && p[5] == '>' && hexv(p[3]) >= 0 && hexv(p[4]) >= 0)
            ok = tk_buf_putc(&t, (char)(hexv(p[3]) * 16 + hexv(p[4])));
        else ok = tk_buf_put(&t, p, n);
        break;
    case D_REPLACE:
        if (d->a) { ok = replace_all(&t, p, n, d->a, d->al, d->b, d->bl); break; }
        return true; /* a regex Replace: left as it is (rare in decoders) */
    case D_WORDPIECE:
        if (n >= d->al && !memcmp(p, d->a, d->al)) ok = tk_buf_put(&t, p + d->al, n - d->al);
        else ok = tk_buf_putc(&t, ' ') && tk_buf_put(&t, p, n);
        break;
    case D_BPE:
        ok = replace_all(&t, p, n, d->a, d->al, " ", 1);
        break;
    default: /* Fuse, Strip: identity in the middle of a text */
        return true;
    }
    if (ok) { tk_buf_free(io); *io = t; } else tk_buf_free(&t);
    return ok;
}

cmf_status tk_decoder_token_bytes(const tk_decoder *d, const char *s, size_t n, tk_buf *out, cmf_error *err) {
    out->n = 0;
    if (!tk_buf_put(out, s, n) || (d && !raw_step(d, out)) || !tk_buf_nul(out))
        return cmf_error_set(err, CMF_ERR_NOMEM, "decoder: out of memory");
    return CMF_OK;
}
