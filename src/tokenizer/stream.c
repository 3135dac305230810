/*
 * stream.c — streaming detokenizer. Keeps a small window of ids: the ids of
 * the previously emitted chunk (context) followed by the ids not yet
 * emitted. On each push it decodes the window and the context alone; if the
 * window's text is longer and does not end in U+FFFD (an incomplete UTF-8
 * sequence from ByteLevel or ByteFallback) the difference is emitted and
 * the window slides. Decoding both from the same first token makes the
 * first-token rules (Metaspace / Strip leading space) cancel out, so the
 * concatenated output equals cmf_tokenizer_decode of all ids (the scheme of
 * HF tokenizers' DecodeStream). flush emits whatever is held back.
 *
 * Text that really contains U+FFFD at its end would be held forever and
 * make every push decode a growing window (quadratic); after
 * MAX_PENDING held ids the text is emitted anyway. Only a byte-fallback
 * sequence left incomplete across that point could then differ from
 * decode(all) — a pathological input (>= 256 ids of U+FFFD text).
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_PENDING 256

struct cmf_detok_stream {
    const cmf_tokenizer *t;
    bool skip;
    tk_ids win;        /* window ids */
    size_t ctx;        /* first ctx ids of win are context (already emitted) */
    char *prefix;      /* decode(win[0..ctx]) */
    size_t prefix_len;
    tk_buf out;        /* returned text */
};

cmf_status cmf_detok_stream_new(const cmf_tokenizer *t, bool skip_special, cmf_detok_stream **out,
                                cmf_error *err) {
    if (!t || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_detok_stream_new: NULL argument");
    cmf_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return cmf_error_set(err, CMF_ERR_NOMEM, "detok stream: out of memory");
    s->t = t;
    s->skip = skip_special;
    s->prefix = calloc(1, 1);
    if (!s->prefix) { free(s); return cmf_error_set(err, CMF_ERR_NOMEM, "detok stream: out of memory"); }
    *out = s;
    return CMF_OK;
}

void cmf_detok_stream_free(cmf_detok_stream *s) {
    if (!s) return;
    tk_ids_free(&s->win);
    free(s->prefix);
    tk_buf_free(&s->out);
    free(s);
}

/* Emit decode(win) minus the prefix when it is stable (or always when
 * force). */
static cmf_status advance(cmf_detok_stream *s, bool force, const char **text, size_t *len, cmf_error *err) {
    char *full = NULL;
    size_t fl = 0;
    s->out.n = 0;
    if (!tk_buf_nul(&s->out)) return cmf_error_set(err, CMF_ERR_NOMEM, "detok stream: out of memory");
    *text = s->out.p;
    *len = 0;
    cmf_status st = cmf_tokenizer_decode(s->t, s->win.v, s->win.n, s->skip, &full, &fl, err);
    if (st) return st;
    bool ends_bad = fl >= 3 && !memcmp(full + fl - 3, "\xEF\xBF\xBD", 3);
    /* A decoder that rewrites earlier text (WordPiece cleanup " do not")
     * breaks the prefix property; then the common prefix is kept. */
    size_t pl = s->prefix_len;
    if (fl < pl || memcmp(full, s->prefix, pl) != 0) {
        pl = 0;
        while (pl < fl && pl < s->prefix_len && full[pl] == s->prefix[pl]) pl++;
    }
    if (s->win.n - s->ctx >= MAX_PENDING) force = true;
    if (fl > pl && (force || !ends_bad)) {
        if (!tk_buf_put(&s->out, full + pl, fl - pl)) { free(full); return cmf_error_set(err, CMF_ERR_NOMEM, "detok stream: out of memory"); }
        /* slide: drop old context, the ids just emitted become context */
        size_t keep = s->win.n - s->ctx;
        memmove(s->win.v, s->win.v + s->ctx, keep * sizeof *s->win.v);
        s->win.n = keep;
        s->ctx = keep;
        free(s->prefix);
        s->prefix = NULL;
        st = cmf_tokenizer_decode(s->t, s->win.v, s->win.n, s->skip, &s->prefix, &s->prefix_len, err);
        free(full);
        if (st) return st;
        *text = s->out.p;
        *len = s->out.n;
        return CMF_OK;
    }
    free(full);
    return CMF_OK;
}

cmf_status cmf_detok_stream_push(cmf_detok_stream *s, int32_t id, const char **text, size_t *len,
                                 cmf_error *err) {
    if (!s || !text || !len) return cmf_error_set(err, CMF_ERR_ARG, "cmf_detok_stream_push: NULL argument");
    if (id < 0 || (size_t)id >= cmf_tokenizer_vocab_size(s->t))
        return cmf_error_set(err, CMF_ERR_ARG, "cmf_detok_stream_push: id %d out of range", (int)id);
    if (!tk_ids_push(&s->win, id)) return cmf_error_set(err, CMF_ERR_NOMEM, "detok stream: out of memory");
    return advance(s, false, text, len, err);
}

cmf_status cmf_detok_stream_flush(cmf_detok_stream *s, const char **text, size_t *len, cmf_error *err) {
    if (!s || !text || !len) return cmf_error_set(err, CMF_ERR_ARG, "cmf_detok_stream_flush: NULL argument");
    cmf_status st = advance(s, true, text, len, err);
    if (st) return st;
    s->win.n = 0;
    s->ctx = 0;
    free(s->prefix);
    s->prefix = calloc(1, 1);
    s->prefix_len = 0;
    if (!s->prefix) return cmf_error_set(err, CMF_ERR_NOMEM, "detok stream: out of memory");
    return CMF_OK;
}

cmf_status cmf_detok_stream_prime(cmf_detok_stream *s, const int32_t *ids, size_t n, cmf_error *err) {
    if (!s || (n && !ids)) return cmf_error_set(err, CMF_ERR_ARG, "cmf_detok_stream_prime: NULL argument");
    size_t k = n < CMF_DETOK_PRIME ? n : CMF_DETOK_PRIME;
    for (size_t i = n - k; i < n; i++) {
        const char *text;
        size_t len;
        cmf_error perr;
        if (cmf_detok_stream_push(s, ids[i], &text, &len, &perr) != CMF_OK) { /* best effort: start clean */
            s->win.n = 0;
            s->ctx = 0;
            free(s->prefix);
            s->prefix = calloc(1, 1);
            s->prefix_len = 0;
            if (!s->prefix) return cmf_error_set(err, CMF_ERR_NOMEM, "detok stream: out of memory");
            break;
        }
    }
    return CMF_OK;
}
