/*
 * cmf/tokenizer.h — Hugging Face `tokenizers`-compatible encode/decode from
 * a tokenizer.json (the CMF tokenizer section, §6), a streaming
 * detokenizer, and converters that turn other vocabularies (GGUF metadata,
 * llama2.c tokenizer.bin) into an equivalent tokenizer.json.
 *
 * Reference implementation: huggingface/tokenizers (Rust), version 0.2x;
 * the ids produced must equal it on every input.
 *
 * Thread-safety: a loaded cmf_tokenizer is immutable except for its internal
 * word cache, which is guarded; encode/decode may be called from many
 * threads. A cmf_detok_stream belongs to one thread.
 */
#ifndef CMF_TOKENIZER_H
#define CMF_TOKENIZER_H

#include "cmf/core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;
typedef struct cmf_tokenizer cmf_tokenizer;

/* Load from tokenizer.json bytes (need not be NUL-terminated). Errors name
 * the JSON field: CMF_ERR_FORMAT (malformed, bad merges, invalid regex),
 * CMF_ERR_UNSUPPORTED (unknown model/normalizer/... type), CMF_ERR_NOMEM. */
cmf_status cmf_tokenizer_load_json(const char *json, size_t len, cmf_tokenizer **out,
                                   cmf_error *err);
/* Load from a path: tokenizer.json, tokenizer.json.gz, or a .cmf file's
 * tokenizer section. */
cmf_status cmf_tokenizer_load_path(const char *path, cmf_tokenizer **out, cmf_error *err);
void cmf_tokenizer_free(cmf_tokenizer *t);

/* Encode UTF-8 text. add_special = HF add_special_tokens (post-processor
 * BOS/EOS). Added/special tokens written in the text are matched either way.
 * Invalid UTF-8 is handled as HF does (lossy replacement). *ids is malloc'd. */
cmf_status cmf_tokenizer_encode(const cmf_tokenizer *t, const char *text, size_t len,
                                bool add_special, int32_t **ids, size_t *n_ids, cmf_error *err);

/* Decode ids to UTF-8 (HF decode; skip_special = skip_special_tokens).
 * *text is malloc'd and NUL-terminated. CMF_ERR_ARG for an id out of range. */
cmf_status cmf_tokenizer_decode(const cmf_tokenizer *t, const int32_t *ids, size_t n_ids,
                                bool skip_special, char **text, size_t *len, cmf_error *err);

size_t cmf_tokenizer_vocab_size(const cmf_tokenizer *t);   /* incl. added tokens */
/* Token string as stored in the vocab (e.g. "Ġthe", "▁the"), or NULL. */
const char *cmf_tokenizer_id_to_token(const cmf_tokenizer *t, int32_t id);
/* The bytes token id stands for in the middle of a decoded text: the
 * decoder chain applied to its vocab string without the first-token rules
 * (Metaspace prepend strip, Strip) and without lossy UTF-8 repair, so a
 * byte token gives its one raw byte (possibly part of a UTF-8 character);
 * an added token gives its content. What a grammar matcher checks a token
 * against. *bytes is malloc'd and NUL-terminated (may hold NULs for a
 * <0x00> token: use *len). Errors: CMF_ERR_ARG (NULL argument, id out of
 * range), CMF_ERR_NOMEM. Thread-safe. */
cmf_status cmf_tokenizer_token_bytes(const cmf_tokenizer *t, int32_t id, char **bytes, size_t *len, cmf_error *err);
/* Exact vocab/added-token lookup; -1 if absent. */
int32_t cmf_tokenizer_token_to_id(const cmf_tokenizer *t, const char *token);
bool cmf_tokenizer_is_special(const cmf_tokenizer *t, int32_t id);
/* BOS/EOS ids the post-processor adds with add_special (-1 if none). */
int32_t cmf_tokenizer_bos_id(const cmf_tokenizer *t);
int32_t cmf_tokenizer_eos_id(const cmf_tokenizer *t);

/* Streaming detokenizer: push ids one at a time; each push returns the
 * newly completed text (only whole UTF-8 characters). The concatenation of
 * all pushes plus flush equals cmf_tokenizer_decode of all ids. */
typedef struct cmf_detok_stream cmf_detok_stream;
cmf_status cmf_detok_stream_new(const cmf_tokenizer *t, bool skip_special, cmf_detok_stream **out,
                                cmf_error *err);
/* *text points into the stream's buffer, valid until the next call. */
cmf_status cmf_detok_stream_push(cmf_detok_stream *s, int32_t id, const char **text, size_t *len,
                                 cmf_error *err);
cmf_status cmf_detok_stream_flush(cmf_detok_stream *s, const char **text, size_t *len,
                                  cmf_error *err);
/* Push the last CMF_DETOK_PRIME of ids (the prompt) as context whose text
 * is discarded, so the first generated token decodes as it does after the
 * prompt (a SentencePiece "▁word" keeps its space). Best effort: an id the
 * tokenizer rejects leaves the stream unprimed. Errors: CMF_ERR_ARG,
 * CMF_ERR_NOMEM. */
#define CMF_DETOK_PRIME 4u
cmf_status cmf_detok_stream_prime(cmf_detok_stream *s, const int32_t *ids, size_t n, cmf_error *err);
void cmf_detok_stream_free(cmf_detok_stream *s);

/* ---- vocabulary converters (used by the importers) -------------------- */

/* GGUF `tokenizer.ggml.*` metadata (given as a cJSON object whose keys are
 * the GGUF keys and whose values are the decoded metadata values, arrays as
 * JSON arrays) -> equivalent tokenizer.json text (malloc'd). Handles
 * tokenizer.ggml.model "llama" (SentencePiece BPE with scores + byte
 * fallback), "gpt2" (byte-level BPE with merges and the `pre` regex),
 * "bert" (WordPiece). */
cmf_status cmf_tokenizer_json_from_gguf(const struct cJSON *gguf_meta, char **json, size_t *len,
                                        cmf_error *err);

/* llama2.c tokenizer.bin (max_token_length, then per piece: f32 score,
 * i32 len, bytes) with vocab_size pieces -> SentencePiece-style
 * tokenizer.json (malloc'd). The file must hold exactly vocab_size pieces
 * (the checkpoint's): fewer, more, or unread trailing bytes are
 * CMF_ERR_FORMAT naming both counts; vocab_size 0 or > 10^7 is
 * CMF_ERR_ARG. */
cmf_status cmf_tokenizer_json_from_llama2c(const void *data, size_t size, uint32_t vocab_size,
                                           char **json, size_t *len, cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_TOKENIZER_H */
