/*
 * cmf/import.h — turning other model formats into CMF v2 files:
 * Hugging Face folders (config.json + safetensors + tokenizer files),
 * GGUF v2/v3 files, and llama2.c checkpoints.
 *
 * Every importer streams: peak memory is about one tensor (f32) plus its
 * encoded form, never the whole model. Output is written through
 * cmf_writer (temporary name, renamed when complete), so a failed import
 * leaves no output file.
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
    const char *quant;        /* "f32","f16","bf16","q8","q8_2f","q4","q4t","q4tp";
                                 GGUF also "keep". NULL = "q8" */
    double shard_max_gb;      /* 0 = single file */
    bool progress;            /* progress bar on stderr (callers pass isatty(2)) */
} cmf_import_opts;

/* Hugging Face folder -> CMF. Errors name the file and field
 * (e.g. "config.json: model_type 'foo' is not supported"); a tokenizer.json
 * with an id >= config.json's vocab_size is CMF_ERR_FORMAT. Warning on
 * stderr ("cmf: warning: ..."): a tokenizer.json with fewer ids than
 * vocab_size (padded embedding; accepted). */
cmf_status cmf_convert_hf(const char *hf_dir, const char *out_path, const cmf_import_opts *opts,
                          cmf_error *err);

/* GGUF v2/v3 -> CMF (a vocabulary-only GGUF gives a tensor-less CMF with
 * the tokenizer section). */
cmf_status cmf_import_gguf(const char *gguf_path, const char *out_path, const cmf_import_opts *opts,
                           cmf_error *err);

/* llama2.c checkpoint + tokenizer.bin -> llama-architecture CMF. */
cmf_status cmf_import_llama2c(const char *model_path, const char *tokenizer_path,
                              const char *out_path, const cmf_import_opts *opts, cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_IMPORT_H */
