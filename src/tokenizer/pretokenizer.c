/*
 * pretokenizer.c — HF `tokenizers` pre-tokenizers: Sequence, ByteLevel
 * (GPT-2 regex optional, add_prefix_space), Split (string or regex;
 * Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous;
 * invert), Metaspace (prepend_scheme always/first/never, split), Whitespace,
 * WhitespaceSplit, Punctuation, Digits, BertPreTokenizer, CharDelimiterSplit.
 *
 * Every splitter reduces to one routine (split_apply) that takes the list of
 * pattern matches over a piece and applies the delimiter behaviour exactly
 * as tokenizers/src/tokenizer/normalizer.rs `NormalizedString::split` does;
 * empty pieces are dropped. Also holds the GPT-2 bytes_to_unicode table.
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

enum { PT_SEQ, PT_BYTELEVEL, PT_SPLIT, PT_METASPACE, PT_WHITESPACE, PT_WSSPLIT, PT_PUNCT,
       PT_DIGITS, PT_BERT, PT_CHARDELIM };
enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };

struct tk_pretok {
    int type;
    tk_pretok **kids;
    size_t n_kids;
    bool add_prefix_space, use_regex;  /* ByteLevel */
    tk_regex re;                       /* Split (regex), ByteLevel, Whitespace */
    char *pat;                         /* Split (string), Metaspace replacement, CharDelimiter */
    size_t pat_len;
    int behavior;
    bool invert;
    int prepend;                       /* Metaspace: 0 always, 1 first, 2 never */
    bool split;                        /* Metaspace */
    bool individual;                   /* Digits */
};

/* ---- bytes_to_unicode (GPT-2 encoder.py) ------------------------------- */

/* The 188 printable bytes map to themselves; the other 68 (0x00-0x20,
 * 0x7F-0xA0, 0xAD) map, in byte order, to U+0100.. U+0143. */
static bool printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

int32_t tk_byte_to_cp(uint8_t b) {
    if (printable(b)) return b;
    if (b <= 0x20) return 256 + b;
    if (b <= 0xA0) return 256 + 33 + (b - 0x7F);
    return 256 + 67;   /* 0xAD */
}

int tk_cp_to_byte(int32_t cp) {
    if (cp < 0 || cp > 323) return -1;
    if (cp < 256) return printable(cp) ? cp : -1;
    int k = cp - 256;
    if (k <= 0x20) return k;
    if (k < 67) return 0x7F + (k - 33);
    return 0xAD;
}

static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- loading ------------------------------------------------------------ */

cmf_status tk_load_pattern(const cJSON *pat, const char *field, char **str, size_t *str_len,
                           tk_regex *re, cmf_error *err);

void tk_pretok_free(tk_pretok *pt) {
    if (!pt) return;
    for (size_t i = 0; i < pt->n_kids; i++) tk_pretok_free(pt->kids[i]);
    free(pt->kids);
    tk_regex_free(&pt->re);
    free(pt->pat);
    free(pt);
}

static bool jbool(const cJSON *j, const char *k, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static char *dupz(const char *s, size_t *n) {
    *n = strlen(s);
    char *p = malloc(*n + 1);
    if (p) memcpy(p, s, *n + 1);
    return p;
}

cmf_status tk_pretok_load(const cJSON *j, tk_pretok **out, cmf_error *err) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return CMF_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t)) return cmf_error_set(err, CMF_ERR_FORMAT, "pre_tokenizer.type: missing");
    tk_pretok *pt = calloc(1, sizeof *pt);
    if (!pt) return cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory");
    const char *ty = t->valuestring;
    cmf_status st = CMF_OK;
    if (!strcmp(ty, "Sequence")) {
        pt->type = PT_SEQ;
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
        if (!cJSON_IsArray(arr)) { st = cmf_error_set(err, CMF_ERR_FORMAT, "pre_tokenizer.pretokenizers: missing"); goto fail; }
        pt->kids = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *pt->kids);
        if (!pt->kids) { st = cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory"); goto fail; }
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) {
            if ((st = tk_pretok_load(e, &pt->kids[pt->n_kids], err))) goto fail;
            if (pt->kids[pt->n_kids]) pt->n_kids++;
        }
    } else if (!strcmp(ty, "ByteLevel")) {
        pt->type = PT_BYTELEVEL;
        pt->add_prefix_space = jbool(j, "add_prefix_space", true);
        pt->use_regex = jbool(j, "use_regex", true);
        if (pt->use_regex && (st = tk_regex_compile(&pt->re, GPT2_RE, sizeof GPT2_RE - 1, "pre_tokenizer ByteLevel", err)))
            goto fail;
    } else if (!strcmp(ty, "Split")) {
        pt->type = PT_SPLIT;
        st = tk_load_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), "pre_tokenizer Split",
                             &pt->pat, &pt->pat_len, &pt->re, err);
        if (st) goto fail;
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "behavior");
        const char *bs = cJSON_IsString(b) ? b->valuestring : "";
        if (!strcmp(bs, "Removed")) pt->behavior = B_REMOVED;
        else if (!strcmp(bs, "Isolated")) pt->behavior = B_ISOLATED;
        else if (!strcmp(bs, "MergedWithPrevious")) pt->behavior = B_MERGED_PREV;
        else if (!strcmp(bs, "MergedWithNext")) pt->behavior = B_MERGED_NEXT;
        else if (!strcmp(bs, "Contiguous")) pt->behavior = B_CONTIGUOUS;
        else { st = cmf_error_set(err, CMF_ERR_FORMAT, "pre_tokenizer Split.behavior: unknown \"%s\"", bs); goto fail; }
        pt->invert = jbool(j, "invert", false);
    } else if (!strcmp(ty, "Metaspace")) {
        pt->type = PT_METASPACE;
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "replacement");
        pt->pat = dupz(cJSON_IsString(r) ? r->valuestring : "\xE2\x96\x81", &pt->pat_len);
        if (!pt->pat) { st = cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory"); goto fail; }
        if (pt->pat_len == 0) { st = cmf_error_set(err, CMF_ERR_FORMAT, "pre_tokenizer Metaspace.replacement: empty"); goto fail; }
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        if (cJSON_IsString(ps)) {
            if (!strcmp(ps->valuestring, "always")) pt->prepend = 0;
            else if (!strcmp(ps->valuestring, "first")) pt->prepend = 1;
            else if (!strcmp(ps->valuestring, "never")) pt->prepend = 2;
            else { st = cmf_error_set(err, CMF_ERR_FORMAT, "pre_tokenizer Metaspace.prepend_scheme: unknown \"%s\"", ps->valuestring); goto fail; }
        } else pt->prepend = jbool(j, "add_prefix_space", true) ? 0 : 2;
        pt->split = jbool(j, "split", true);
    } else if (!strcmp(ty, "Whitespace")) {
        pt->type = PT_WHITESPACE;
        static const char WS_RE[] = "\\w+|[^\\w\\s]+";
        if ((st = tk_regex_compile(&pt->re, WS_RE, sizeof WS_RE - 1, "pre_tokenizer Whitespace", err))) goto fail;
    } else if (!strcmp(ty, "WhitespaceSplit")) pt->type = PT_WSSPLIT;
    else if (!strcmp(ty, "Punctuation")) {
        pt->type = PT_PUNCT;
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "behavior");
        const char *bs = cJSON_IsString(b) ? b->valuestring : "Isolated";
        pt->behavior = !strcmp(bs, "Removed") ? B_REMOVED : !strcmp(bs, "MergedWithPrevious") ? B_MERGED_PREV
                     : !strcmp(bs, "MergedWithNext") ? B_MERGED_NEXT : !strcmp(bs, "Contiguous") ? B_CONTIGUOUS
                     : B_ISOLATED;
    } else if (!strcmp(ty, "Digits")) {
        pt->type = PT_DIGITS;
        pt->individual = jbool(j, "individual_digits", false);
    } else if (!strcmp(ty, "BertPreTokenizer")) pt->type = PT_BERT;
    else if (!strcmp(ty, "CharDelimiterSplit")) {
        pt->type = PT_CHARDELIM;
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "delimiter");
        if (!cJSON_IsString(d)) { st = cmf_error_set(err, CMF_ERR_FORMAT, "pre_tokenizer CharDelimiterSplit.delimiter: missing"); goto fail; }
        pt->pat = dupz(d->valuestring, &pt->pat_len);
        if (!pt->pat) { st = cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory"); goto fail; }
    } else {
        st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "pre_tokenizer.type: unsupported \"%s\"", ty);
        goto fail;
    }
    *out = pt;
    return CMF_OK;
fail:
    tk_pretok_free(pt);
    return st;
}

/* ---- splitting ------------------------------------------------------------ */

/* Rust char::is_whitespace (White_Space property). */
static bool is_ws(int32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static bool is_punct(int32_t c) {
    if (c < 0) return false;
    if (c < 128) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

static bool is_numeric(int32_t c) {
    if (c < 0) return false;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* Matches of a per-character predicate: every matching char is its own match. */
static bool char_matches(const char *s, size_t n, bool (*pred)(int32_t), tk_ids *m) {
    for (size_t i = 0; i < n;) {
        int32_t c;
        size_t k = tk_utf8_next(s + i, n - i, &c);
        if (pred(c) && (!tk_ids_push(m, (int32_t)i) || !tk_ids_push(m, (int32_t)(i + k)))) return false;
        i += k;
    }
    return true;
}

static bool str_matches(const char *s, size_t n, const char *p, size_t pn, tk_ids *m) {
    if (pn == 0) return true;
    for (size_t i = 0; i + pn <= n;) {
        if (!memcmp(s + i, p, pn)) {
            if (!tk_ids_push(m, (int32_t)i) || !tk_ids_push(m, (int32_t)(i + pn))) return false;
            i += pn;
        } else i++;
    }
    return true;
}

/* Apply delimiter behaviour to matches m (flattened start,end pairs, in
 * order, non-overlapping) over s[0..n) and append the non-empty pieces. */
static cmf_status split_apply(const char *s, size_t n, const tk_ids *m, bool invert, int behavior,
                              bool at_start, tk_pieces *out, cmf_error *err) {
    /* 1. segments covering s, each flagged is_match */
    size_t cap = m->n + 2, ns = 0;
    size_t *a = malloc(cap * sizeof *a), *b = malloc(cap * sizeof *b);
    bool *im = malloc(cap * sizeof *im);
    cmf_status st = CMF_OK;
    if (!a || !b || !im) { st = cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory"); goto done; }
    size_t prev = 0;
    for (size_t k = 0; k + 1 < m->n; k += 2) {
        size_t x = (size_t)m->v[k], y = (size_t)m->v[k + 1];
        if (prev != x) { a[ns] = prev; b[ns] = x; im[ns++] = invert; }
        a[ns] = x; b[ns] = y; im[ns++] = !invert;
        prev = y;
    }
    if (prev != n) { a[ns] = prev; b[ns] = n; im[ns++] = invert; }

    /* 2. behaviour -> output segments (in place, nr <= ns) */
    size_t nr = 0;
    bool pm = false;
    switch (behavior) {
    case B_REMOVED:
        for (size_t i = 0; i < ns; i++)
            if (!im[i]) { a[nr] = a[i]; b[nr++] = b[i]; }
        break;
    case B_ISOLATED:
        nr = ns;
        break;
    case B_MERGED_PREV:
        for (size_t i = 0; i < ns; i++) {
            if (im[i] && !pm && nr > 0) b[nr - 1] = b[i];
            else { a[nr] = a[i]; b[nr++] = b[i]; }
            pm = im[i];
        }
        break;
    case B_CONTIGUOUS:
        for (size_t i = 0; i < ns; i++) {
            if (im[i] == pm && nr > 0) b[nr - 1] = b[i];
            else { a[nr] = a[i]; b[nr++] = b[i]; }
            pm = im[i];
        }
        break;
    case B_MERGED_NEXT: {
        /* walk backwards; result reversed into the tail, then compacted */
        size_t w = ns;   /* write index from the end */
        for (size_t ii = ns; ii-- > 0;) {
            if (im[ii] && !pm && w < ns) a[w] = a[ii];
            else { w--; a[w] = a[ii]; b[w] = b[ii]; }
            pm = im[ii];
        }
        for (size_t i = w; i < ns; i++) { a[nr] = a[i]; b[nr++] = b[i]; }
        break;
    }
    }
    for (size_t i = 0; i < nr; i++) {
        if (b[i] <= a[i]) continue;
        if (!tk_pieces_add(out, s + a[i], b[i] - a[i], -1, at_start && a[i] == 0)) {
            st = cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory");
            break;
        }
    }
done:
    free(a);
    free(b);
    free(im);
    return st;
}

static cmf_status bytelevel_map(const char *s, size_t n, bool at_start, tk_pieces *out, cmf_error *err) {
    tk_buf t = {0};
    for (size_t i = 0; i < n; i++)
        if (!tk_buf_cp(&t, tk_byte_to_cp((uint8_t)s[i]))) { tk_buf_free(&t); goto oom; }
    bool ok = tk_pieces_add(out, t.p ? t.p : "", t.n, -1, at_start);
    tk_buf_free(&t);
    if (ok) return CMF_OK;
oom:
    return cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory");
}

cmf_status tk_pretok_apply(const tk_pretok *pt, const char *s, size_t n, bool at_start,
                           tk_pieces *out, cmf_error *err) {
    cmf_status st = CMF_OK;
    tk_ids m = {0};
    if (n == 0) return CMF_OK;
    switch (pt->type) {
    case PT_SEQ: {
        tk_pieces cur = {0}, nxt = {0};
        if (!tk_pieces_add(&cur, s, n, -1, at_start)) { st = cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory"); goto seq_done; }
        for (size_t k = 0; k < pt->n_kids; k++) {
            tk_pieces_clear(&nxt);
            for (size_t i = 0; i < cur.n; i++)
                if ((st = tk_pretok_apply(pt->kids[k], cur.buf.p + cur.v[i].off, cur.v[i].len,
                                          cur.v[i].at_start, &nxt, err)))
                    goto seq_done;
            tk_pieces sw = cur; cur = nxt; nxt = sw;
        }
        for (size_t i = 0; i < cur.n; i++)
            if (!tk_pieces_add(out, cur.buf.p + cur.v[i].off, cur.v[i].len, -1, cur.v[i].at_start)) {
                st = cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory");
                break;
            }
    seq_done:
        tk_pieces_free(&cur);
        tk_pieces_free(&nxt);
        return st;
    }
    case PT_BYTELEVEL: {
        tk_buf pre = {0};
        const char *t = s;
        size_t tn = n;
        if (pt->add_prefix_space && s[0] != ' ') {
            if (!tk_buf_putc(&pre, ' ') || !tk_buf_put(&pre, s, n)) { tk_buf_free(&pre); return cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory"); }
            t = pre.p;
            tn = pre.n;
        }
        if (!pt->use_regex) st = bytelevel_map(t, tn, at_start, out, err);
        else {
            tk_pieces words = {0};
            st = tk_regex_find_all(&pt->re, t, tn, &m, err);
            if (!st) st = split_apply(t, tn, &m, false, B_ISOLATED, at_start, &words, err);
            for (size_t i = 0; !st && i < words.n; i++)
                st = bytelevel_map(words.buf.p + words.v[i].off, words.v[i].len, words.v[i].at_start, out, err);
            tk_pieces_free(&words);
        }
        tk_buf_free(&pre);
        break;
    }
    case PT_SPLIT:
        if (pt->pat) {
            if (!str_matches(s, n, pt->pat, pt->pat_len, &m)) goto oom;
        } else if ((st = tk_regex_find_all(&pt->re, s, n, &m, err))) break;
        st = split_apply(s, n, &m, pt->invert, pt->behavior, at_start, out, err);
        break;
    case PT_METASPACE: {
        tk_buf t = {0};
        /* HF replaces spaces first, then prepends unless the result already
         * starts with the replacement */
        if ((pt->prepend == 0 || (pt->prepend == 1 && at_start)) && s[0] != ' ' &&
            !(n >= pt->pat_len && !memcmp(s, pt->pat, pt->pat_len)))
            if (!tk_buf_put(&t, pt->pat, pt->pat_len)) { tk_buf_free(&t); goto oom; }
        for (size_t i = 0; i < n; i++) {
            bool ok = s[i] == ' ' ? tk_buf_put(&t, pt->pat, pt->pat_len) : tk_buf_putc(&t, s[i]);
            if (!ok) { tk_buf_free(&t); goto oom; }
        }
        if (pt->split) {
            if (!str_matches(t.p, t.n, pt->pat, pt->pat_len, &m)) { tk_buf_free(&t); goto oom; }
            st = split_apply(t.p, t.n, &m, false, B_MERGED_NEXT, at_start, out, err);
        } else if (!tk_pieces_add(out, t.p, t.n, -1, at_start)) { tk_buf_free(&t); goto oom; }
        tk_buf_free(&t);
        break;
    }
    case PT_WHITESPACE:
        if ((st = tk_regex_find_all(&pt->re, s, n, &m, err))) break;
        st = split_apply(s, n, &m, true, B_REMOVED, at_start, out, err);
        break;
    case PT_WSSPLIT:
        if (!char_matches(s, n, is_ws, &m)) goto oom;
        st = split_apply(s, n, &m, false, B_REMOVED, at_start, out, err);
        break;
    case PT_PUNCT:
        if (!char_matches(s, n, is_punct, &m)) goto oom;
        st = split_apply(s, n, &m, false, pt->behavior, at_start, out, err);
        break;
    case PT_DIGITS:
        if (!char_matches(s, n, is_numeric, &m)) goto oom;
        st = split_apply(s, n, &m, false, pt->individual ? B_ISOLATED : B_CONTIGUOUS, at_start, out, err);
        break;
    case PT_CHARDELIM:
        if (!str_matches(s, n, pt->pat, pt->pat_len, &m)) goto oom;
        st = split_apply(s, n, &m, false, B_REMOVED, at_start, out, err);
        break;
    case PT_BERT: {
        tk_pieces words = {0};
        if (!char_matches(s, n, is_ws, &m)) { tk_pieces_free(&words); goto oom; }
        st = split_apply(s, n, &m, false, B_REMOVED, at_start, &words, err);
        for (size_t i = 0; !st && i < words.n; i++) {
            m.n = 0;
            const char *w = words.buf.p + words.v[i].off;
            if (!char_matches(w, words.v[i].len, is_punct, &m)) { tk_pieces_free(&words); goto oom; }
            st = split_apply(w, words.v[i].len, &m, false, B_ISOLATED, words.v[i].at_start, out, err);
        }
        tk_pieces_free(&words);
        break;
    }
    }
    tk_ids_free(&m);
    return st;
oom:
    tk_ids_free(&m);
    return cmf_error_set(err, CMF_ERR_NOMEM, "pre_tokenizer: out of memory");
}
