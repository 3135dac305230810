/*
 * import_internal.h — what the three importers (convert_hf.c,
 * import_gguf.c, llama2c.c) share: the --quant policy, the progress bar,
 * adding one float32 tensor to the writer under that policy, and helpers
 * for header.arch / header.tokenizer_config. Not a public API.
 */
#ifndef CMF_IMPORT_INTERNAL_H
#define CMF_IMPORT_INTERNAL_H

#include "cmf/import.h"

#include <stdio.h>
#include <time.h>

struct cJSON;

/* ---- quant policy (quant_select.c) ------------------------------------ */

typedef struct cmf_imp_quant {
    const char *name;  /* as given: "q8", "q4t", "keep", ... */
    cmf_dtype matrix;  /* dtype for quantizable matrices */
    bool keep;         /* GGUF --quant keep */
} cmf_imp_quant;

/* Parse --quant (NULL = "q8"), case-insensitively; llama.cpp's Q8_0 and
 * Q4_0 name q8_row and q4_block. "keep" only when allow_keep. Errors:
 * CMF_ERR_ARG naming the value and the accepted ones. */
cmf_status cmf_imp_quant_parse(const char *q, bool allow_keep, cmf_imp_quant *out, cmf_error *err);

/* What every importer does before reading its input: parse opts->quant
 * (dflt_quant when opts or opts->quant is NULL), check out_path
 * (cmf_writer_check_path; cmf_writer_check_shard_path when sharded) and
 * fill *wo from opts (shard size, cancel callback). opts may be NULL.
 * Errors: those calls'. */
cmf_status cmf_imp_begin(const cmf_import_opts *opts, const char *dflt_quant, bool allow_keep,
                         const char *out_path, cmf_imp_quant *q, cmf_writer_opts *wo, cmf_error *err);

/* The dtype a tensor gets: 1-D, < 32 elements, > 2-D and MoE routers stay
 * f16 (f32 when the matrix dtype is f32); q4_block/q4_tiled/q4tp matrices
 * whose input width (shape[ndim-1]) is not a multiple of 32 fall back to
 * q8_row. */
cmf_dtype cmf_imp_pick_dtype(const cmf_imp_quant *q, const char *name, uint32_t ndim,
                             const uint64_t *shape);

/* "Q8_ROW", "F16", ... for header.quant_type. */
const char *cmf_imp_quant_label(const cmf_imp_quant *q);

/* Encode f32 data under the policy and add it to the writer. Errors are
 * prefixed with the tensor name. */
cmf_status cmf_imp_add(cmf_writer *w, const cmf_imp_quant *q, const char *name, uint32_t ndim,
                       const uint64_t *shape, const float *data, cmf_error *err);

/* ---- progress bar (progress.c) ---------------------------------------- */

typedef struct cmf_imp_progress {
    bool on;
    size_t n_total, n_done;
    uint64_t bytes_total, bytes_done;
    struct timespec t0;
    double last_draw;
} cmf_imp_progress;

void cmf_imp_progress_start(cmf_imp_progress *p, bool on, size_t n_total, uint64_t bytes_total);
void cmf_imp_progress_step(cmf_imp_progress *p, uint64_t bytes);
void cmf_imp_progress_end(cmf_imp_progress *p);
/* One line "cmf: warning: ..." on stderr: an input the import accepts but
 * the user should know about (import.h lists them). */
void cmf_imp_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- header helpers (quant_select.c) ---------------------------------- */

/* Append id to the array if not already there. */
cmf_status cmf_imp_add_eos(struct cJSON *ids, double id, cmf_error *err);
/* Allocate a 1-D float buffer of n floats; error names `what`. */
cmf_status cmf_imp_alloc_f32(uint64_t n, float **out, const char *what, cmf_error *err);
/* Shape-invariant row permutation undoing the interleaved (GPT-J / Meta)
 * rotary layout into HF (neox) order, per head: for rows of a [n_head *
 * head_dim, cols] matrix, out[h*hd + j*hd/2 + i] = in[h*hd + 2*i + j]
 * (HF convert_llama_weights_to_hf.py `permute`). */
cmf_status cmf_imp_unpermute_rows(float *w, uint64_t rows, uint64_t cols, uint32_t n_head,
                                  cmf_error *err);

#endif /* CMF_IMPORT_INTERNAL_H */

/* ---- Hugging Face config.json -> header.arch (hf_config.c) ------------ */

typedef struct cmf_imp_hf_info {
    char model_type[32];   /* normalised arch_name */
    uint32_t n_layers, n_heads, n_kv_heads, head_dim, n_experts;
    uint64_t hidden, intermediate, vocab, moe_intermediate;
    bool tie;              /* config's tie_word_embeddings (before looking at tensors) */
    bool gemma_norm;       /* norm_style "gemma" */
} cmf_imp_hf_info;

/* Map a Hugging Face checkpoint tensor name to the name cmf stores
 * (convert_hf.c; gemma3 multimodal "language_model.model.X" -> "model.X");
 * *out malloc'd, NULL when the tensor is skipped (vision tower, rotary
 * inv_freq). The LoRA importer maps PEFT module paths the same way.
 * Errors: CMF_ERR_NOMEM. */
cmf_status cmf_imp_hf_map_name(const char *in, char **out, cmf_error *err);

/* Build header.arch from a parsed config.json (for gemma3 multimodal, its
 * text_config). Errors name `cfg_path` and the key: a missing or invalid
 * required key, an unknown model_type (CMF_ERR_UNSUPPORTED). *arch is a new
 * cJSON object. */
cmf_status cmf_imp_hf_arch(const struct cJSON *cfg, const char *cfg_path, struct cJSON **arch,
                           cmf_imp_hf_info *info, cmf_error *err);

/* Fill header.tokenizer_config from the ids of config.json,
 * generation_config.json and tokenizer_config.json (any may be NULL):
 * eos_token_ids (merged, primary first), bos_token_id, pad_token_id,
 * add_bos_token, bos_token / eos_token strings, chat_template (if given). */
cmf_status cmf_imp_hf_tokenizer_config(const struct cJSON *cfg, const struct cJSON *gen,
                                       const struct cJSON *tok_cfg, const char *chat_template,
                                       struct cJSON *out, cmf_error *err);
