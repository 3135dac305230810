/*
 * cmf/import.h — turning other model formats into CMF v2 files:
 * Hugging Face folders (config.json + safetensors + tokenizer files),
 * GGUF v2/v3 files, and llama2.c checkpoints; and re-encoding a CMF file
 * at another --quant (cmf_quantize).
 *
 * Every importer streams: peak memory is about one tensor (f32) plus its
 * encoded form, never the whole model. Output is written through
 * cmf_writer (temporary name, renamed when complete), so a failed import
 * leaves no output file. The output path is checked
 * (cmf_writer_check_path) before anything is read. An import stopped by
 * opts->cancel fails with CMF_ERR_CANCELLED and leaves no file either.
 *
 * Thread-safety: importers share no state; run them from any thread.
 */
#ifndef CMF_IMPORT_H
#define CMF_IMPORT_H

#include "cmf/format.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cmf_import_opts {
    const char *quant;        /* "f32","f16","bf16","q8" (= "q8_row", llama.cpp's
                                 "Q8_0"),"q8_2f","q4" (= "q4_block", "Q4_0"),
                                 "q4t" (= "q4_tiled"),"q4tp"; case-insensitive;
                                 GGUF also "keep". NULL = "q8" (GGUF: "keep") */
    double shard_max_gb;      /* 0 = single file */
    bool progress;            /* progress bar on stderr (callers pass isatty(2)) */
    /* polled between tensors (cmf_writer_opts.cancel); NULL = never stop */
    bool (*cancel)(void *cancel_ctx);
    void *cancel_ctx;
    bool allow_requantize;    /* cmf_quantize: re-encode tensors that are already
                                 quantized (q8_row, q4_*, ...) into another
                                 quantized dtype (llama-quantize --allow-requantize) */
} cmf_import_opts;

/* Hugging Face folder -> CMF. Errors name the file and field
 * (e.g. "config.json: model_type 'foo' is not supported"); a tokenizer.json
 * with an id >= config.json's vocab_size is CMF_ERR_FORMAT. Warning on
 * stderr ("cmf: warning: ..."): a tokenizer.json with fewer ids than
 * vocab_size (padded embedding; accepted). */
cmf_status cmf_convert_hf(const char *hf_dir, const char *out_path, const cmf_import_opts *opts,
                          cmf_error *err);

/* GGUF v2/v3 -> CMF (a vocabulary-only GGUF gives a tensor-less CMF with
 * the tokenizer section). Default quant "keep": the GGUF's own types where
 * CMF has them (F32/F16/BF16 copied, Q4_0 repacked losslessly). */
cmf_status cmf_import_gguf(const char *gguf_path, const char *out_path, const cmf_import_opts *opts,
                           cmf_error *err);

/* llama2.c checkpoint + tokenizer.bin -> llama-architecture CMF. */
cmf_status cmf_import_llama2c(const char *model_path, const char *tokenizer_path,
                              const char *out_path, const cmf_import_opts *opts, cmf_error *err);

/* Re-encode the CMF file (or shard set) `in_path` at opts->quant (required;
 * "keep" is not accepted) into `out_path`, like llama-quantize: every tensor
 * gets the dtype `cmf convert --quant` would give it (skill overlays
 * included), decoded from its stored dtype; a tensor already in that dtype
 * is copied byte for byte. The tokenizer and masks sections are copied
 * verbatim and every header field is kept (tokenizer_config with the chat
 * template, skills, arch, provenance, ...) except quant_type and
 * provenance.quant, which name the new encoding (provenance.requantized_by
 * names the tool). Each payload's hash64 is checked first: a corrupt input
 * is refused. Errors: CMF_ERR_ARG (no or unknown quant),
 * CMF_ERR_UNSUPPORTED (a tensor is quantized, the target is another
 * quantized dtype and !opts->allow_requantize), CMF_ERR_HASH, the reader's
 * and the writer's errors (CMF_ERR_CANCELLED included). */
cmf_status cmf_quantize(const char *in_path, const char *out_path, const cmf_import_opts *opts,
                        cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_IMPORT_H */
