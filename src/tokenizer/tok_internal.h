/*
 * tok_internal.h — the tokenizer module's private types: growable buffers,
 * a string->int32 hash map and a u64->u64 hash map (vocab, merges, added
 * token tries), the "piece list" that flows through normalization and
 * pre-tokenization, and the component structs (normalizer, pre-tokenizer,
 * model, post-processor, decoder) that tokenizer.c loads from the HF
 * tokenizer.json and drives.
 *
 * Pipeline (huggingface/tokenizers TokenizerImpl::encode_single_sequence):
 *   text -> split on non-normalized added tokens -> normalize each remaining
 *   piece -> split on normalized added tokens -> pre-tokenize -> model
 *   (BPE / Unigram / WordPiece, per word, cached) -> post-process.
 * No offsets are tracked: the public API returns ids only.
 */
#ifndef CMF_TOK_INTERNAL_H
#define CMF_TOK_INTERNAL_H

#include "cmf/tokenizer.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

struct cJSON;

/* ---- growable byte buffer / int vector (tk_util.c) -------------------- */
typedef struct { char *p; size_t n, cap; } tk_buf;
bool tk_buf_put(tk_buf *b, const void *s, size_t n);   /* false on OOM */
bool tk_buf_putc(tk_buf *b, char c);
bool tk_buf_cp(tk_buf *b, int32_t cp);                 /* append code point as UTF-8 */
bool tk_buf_nul(tk_buf *b);                            /* ensure p[n] == 0 (n unchanged) */
void tk_buf_free(tk_buf *b);

typedef struct { int32_t *v; size_t n, cap; } tk_ids;
bool tk_ids_push(tk_ids *a, int32_t x);
bool tk_ids_append(tk_ids *a, const int32_t *x, size_t n);
void tk_ids_free(tk_ids *a);

/* Decode one code point at s[0..n) (n>0). Returns its byte length (>=1) and
 * sets *cp; invalid or truncated sequences give *cp = -1 and length 1. */
size_t tk_utf8_next(const char *s, size_t n, int32_t *cp);
/* Replace invalid UTF-8 by U+FFFD like Rust String::from_utf8_lossy (one
 * U+FFFD per maximal invalid prefix). Returns a malloc'd NUL-terminated copy. */
char *tk_utf8_lossy(const char *s, size_t n, size_t *out_len);
/* Length of the longest prefix of s[0..n) that ends on a complete UTF-8
 * character boundary (incomplete trailing sequence excluded). */
size_t tk_utf8_complete_prefix(const char *s, size_t n);

/* Tables indexed by token id (id -> token, id -> added token) are sized by
 * the largest id: it must stay proportional to the n tokens that exist
 * (max_id <= 4n + 1024), so a hostile id such as 999999999 is refused
 * instead of costing gigabytes. */
static inline bool tk_ids_dense(int64_t max_id, size_t n) { return max_id <= (int64_t)n * 4 + 1024; }
/* A token id in tokenizer.json: true and *id set when v is a JSON number
 * holding an integer in [0, 0x7FFFFFF0]; false for anything else (missing,
 * a string, negative, fractional such as 1.5, too large). */
bool tk_json_id(const struct cJSON *v, int32_t *id);

/* ---- hash maps (tk_map.c) --------------------------------------------- */
/* String -> int32. Keys are copied, NUL-terminated, into one arena owned
 * by the map (entry e's key starts at arena + koff[e]; pointers into the
 * arena stay valid only while no key is added). */
typedef struct {
    uint32_t *slot;    /* cap entries: 0 = empty, else entry index + 1 */
    size_t cap;        /* power of two */
    char *arena;
    size_t arena_n, arena_cap;
    size_t *koff;
    uint32_t *klen;
    int32_t *val;
    size_t n, ecap;
} tk_smap;
#define TK_SMAP_KEY(m, e) ((m)->arena + (m)->koff[e])
bool tk_smap_init(tk_smap *m, size_t expect);
/* Insert or overwrite. false on OOM. */
bool tk_smap_set(tk_smap *m, const char *k, size_t klen, int32_t v);
/* Value or -1. */
int32_t tk_smap_get(const tk_smap *m, const char *k, size_t klen);
void tk_smap_free(tk_smap *m);

/* u64 -> u64 (keys never equal UINT64_MAX). */
typedef struct { uint64_t *k, *v; size_t cap, n; } tk_umap;
bool tk_umap_init(tk_umap *m, size_t expect);
bool tk_umap_set(tk_umap *m, uint64_t k, uint64_t v);
bool tk_umap_get(const tk_umap *m, uint64_t k, uint64_t *v);
void tk_umap_free(tk_umap *m);

uint64_t tk_hash(const void *p, size_t n);

/* ---- pieces: a list of strings (normalized text / words) -------------- */
typedef struct {
    size_t off, len;   /* into tk_pieces.buf */
    int32_t id;        /* >= 0: an added token already resolved */
    bool at_start;     /* piece begins at offset 0 of the original text */
} tk_piece;
typedef struct {
    tk_buf buf;
    tk_piece *v;
    size_t n, cap;
} tk_pieces;
bool tk_pieces_add(tk_pieces *p, const char *s, size_t len, int32_t id, bool at_start);
void tk_pieces_free(tk_pieces *p);
void tk_pieces_clear(tk_pieces *p);

/* ---- regex (PCRE2, UTF + UCP + JIT) ----------------------------------- */
typedef struct { pcre2_code *code; } tk_regex;
cmf_status tk_regex_compile(tk_regex *r, const char *pat, size_t len, const char *field,
                            cmf_error *err);
void tk_regex_free(tk_regex *r);
/* All non-overlapping matches of r in s[0..n): pairs (start,end) pushed to
 * out (flattened). Empty matches are reported as HF's onig find_iter does. */
cmf_status tk_regex_find_all(const tk_regex *r, const char *s, size_t n, tk_ids *out,
                             cmf_error *err);

/* ---- normalizer (normalizer.c) ---------------------------------------- */
typedef struct tk_normalizer tk_normalizer;
cmf_status tk_normalizer_load(const struct cJSON *j, tk_normalizer **out, cmf_error *err);
/* Normalize s[0..n) into out (cleared first). */
cmf_status tk_normalizer_apply(const tk_normalizer *nz, const char *s, size_t n, tk_buf *out,
                               cmf_error *err);
void tk_normalizer_free(tk_normalizer *nz);

/* ---- pre-tokenizer (pretokenizer.c) ----------------------------------- */
typedef struct tk_pretok tk_pretok;
cmf_status tk_pretok_load(const struct cJSON *j, tk_pretok **out, cmf_error *err);
/* Split one normalized piece into words appended to out. */
cmf_status tk_pretok_apply(const tk_pretok *pt, const char *s, size_t n, bool at_start,
                           tk_pieces *out, cmf_error *err);
void tk_pretok_free(tk_pretok *pt);
/* GPT-2 byte -> unicode char table (bytes_to_unicode()). */
int32_t tk_byte_to_cp(uint8_t b);
/* Inverse: code point -> byte, or -1. */
int tk_cp_to_byte(int32_t cp);

/* ---- models (bpe.c, unigram.c, wordpiece.c) --------------------------- */
typedef enum { TK_MODEL_BPE, TK_MODEL_UNIGRAM, TK_MODEL_WORDPIECE, TK_MODEL_WORDLEVEL } tk_model_type;

typedef struct tk_model {
    tk_model_type type;
    tk_smap vocab;           /* token -> id */
    char **id_to_tok;        /* id -> token (NULL where none); into vocab's arena
                                unless tok_owned (then each is malloc'd) */
    bool tok_owned;
    size_t n_ids;            /* size of id_to_tok */
    int32_t unk_id;          /* -1 if none */
    /* BPE */
    tk_umap merges;          /* (left_id << 32 | right_id) -> (rank << 32 | new_id) */
    char *cont_prefix, *eow_suffix;
    bool byte_fallback, ignore_merges, fuse_unk;
    int32_t byte_ids[256];   /* <0xXX> ids, -1 if absent */
    /* Unigram */
    double *scores;          /* per id */
    double min_score;
    /* WordPiece */
    char *wp_prefix;
    int max_chars;
} tk_model;

cmf_status tk_model_load(const struct cJSON *j, tk_model *m, cmf_error *err);
void tk_model_free(tk_model *m);
/* Tokenize one word (UTF-8) and append ids. */
cmf_status tk_bpe_word(const tk_model *m, const char *w, size_t n, tk_ids *out, cmf_error *err);
cmf_status tk_unigram_word(const tk_model *m, const char *w, size_t n, tk_ids *out, cmf_error *err);
cmf_status tk_wordpiece_word(const tk_model *m, const char *w, size_t n, tk_ids *out,
                             cmf_error *err);
cmf_status tk_bpe_load(const struct cJSON *j, tk_model *m, cmf_error *err);
cmf_status tk_unigram_load(const struct cJSON *j, tk_model *m, cmf_error *err);
cmf_status tk_wordpiece_load(const struct cJSON *j, tk_model *m, cmf_error *err);

/* ---- added tokens (added_tokens.c) ------------------------------------ */
typedef struct {
    char *content; size_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tk_added;
typedef struct {
    tk_added *v; size_t n;
    tk_umap trie_raw, trie_norm;   /* (node << 8 | byte) -> child node */
    int32_t *term_raw, *term_norm; /* node -> added index or -1 */
    size_t nodes_raw, nodes_norm;
    tk_smap by_content;            /* content -> added index */
} tk_added_set;
cmf_status tk_added_load(const struct cJSON *arr, tk_added_set *a, cmf_error *err);
void tk_added_free(tk_added_set *a);
/* Split s[0..n) at added tokens of the given class (normalized or not),
 * leftmost-longest, honouring lstrip/rstrip/single_word. Appends pieces:
 * matched tokens with id >= 0, text between with id -1. */
cmf_status tk_added_split(const tk_added_set *a, bool normalized, const char *s, size_t n,
                          bool at_start, tk_pieces *out, cmf_error *err);

/* ---- post-processor (postprocess.c) ----------------------------------- */
typedef struct {
    tk_ids prefix, suffix;   /* ids added around the single sequence */
    bool present;
} tk_post;
cmf_status tk_post_load(const struct cJSON *j, const tk_model *m, const tk_added_set *a,
                        tk_post *p, cmf_error *err);
void tk_post_free(tk_post *p);

/* ---- decoder (decoder.c) ---------------------------------------------- */
typedef struct tk_decoder tk_decoder;
cmf_status tk_decoder_load(const struct cJSON *j, tk_decoder **out, cmf_error *err);
/* Decode a list of token strings into out (HF decode_chain then concat). */
/* One token string's raw bytes in the middle of a text (no first-token
 * rules, no lossy UTF-8 repair); *out replaced, NUL-terminated. */
cmf_status tk_decoder_token_bytes(const tk_decoder *d, const char *s, size_t n, tk_buf *out, cmf_error *err);
cmf_status tk_decoder_run(const tk_decoder *d, char **toks, size_t *lens, size_t n, tk_buf *out,
                          cmf_error *err);
void tk_decoder_free(tk_decoder *d);

/* ---- the tokenizer ---------------------------------------------------- */
typedef struct tk_cache_entry tk_cache_entry;
struct cmf_tokenizer {
    tk_model model;
    tk_added_set added;
    tk_normalizer *norm;     /* NULL = none */
    tk_pretok *pretok;       /* NULL = none */
    tk_post post;
    tk_decoder *dec;         /* NULL = join with " " */
    int32_t bos_id, eos_id;
    size_t vocab_size;       /* max id + 1 over model and added tokens */
    int32_t *added_of_id;    /* id -> index into added.v (last wins), -1 if none */
    /* word cache: word -> ids, guarded by cache_lock */
    pthread_mutex_t cache_lock;
    tk_smap cache_index;     /* word -> slot in cache_ids */
    tk_ids *cache_ids;
    size_t cache_n, cache_cap;
};

#endif /* CMF_TOK_INTERNAL_H */
