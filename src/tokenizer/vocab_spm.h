/*
 * vocab_spm.h — input of the SentencePiece-BPE tokenizer.json builder
 * (vocab_spm.c), shared by the llama2.c and GGUF "llama" converters.
 */
#ifndef CMF_TOK_VOCAB_SPM_H
#define CMF_TOK_VOCAB_SPM_H

#include "cmf/core.h"

typedef struct {
    size_t n;
    const char **text;     /* piece bytes (not NUL-terminated), n entries */
    size_t *len;
    float *score;          /* NULL = all 0 */
    int *type;             /* GGUF token types: 1 normal, 2 unknown, 3 control,
                              4 user defined, 5 unused, 6 byte; NULL = all 1 */
    int32_t unk_id, bos_id, eos_id;   /* -1 = none */
    bool add_bos, add_eos;
    bool add_space_prefix; /* SentencePiece add_dummy_prefix */
    bool space_to_meta;    /* pieces use ' ' where SentencePiece has U+2581 */
} tk_spm_vocab;

cmf_status tk_spm_json(const tk_spm_vocab *v, char **json, size_t *len, cmf_error *err);

#endif
