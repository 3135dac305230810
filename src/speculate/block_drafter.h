/*
 * block_drafter.h — the block drafter (docs/DRAFTER.md): a few small
 * transformer layers beside a target model that, from the target's
 * residual stream after chosen layers (the "taps") of the accepted tokens
 * and the last accepted token, draft a block of B-1 tokens in one forward
 * with a block mask (the block's positions see each other and the whole
 * context). Our design in the spirit of DFlash (block diffusion drafting
 * conditioned on target features); trained by tools/train/train_drafter.py.
 *
 * The drafter shares the target's backend and its token embedding / LM
 * head (tied: the target's model.embed_tokens.weight), so it refuses a
 * file whose header names another target (dims or embedding hash).
 * Thread-safety: a drafter and its sequences are used by one thread at a
 * time (they run on the target's backend); distinct drafters are
 * independent.
 */
#ifndef CMF_SPECULATE_BLOCK_DRAFTER_H
#define CMF_SPECULATE_BLOCK_DRAFTER_H
#include "cmf/core.h"
#include "cmf/model.h"
#include <stddef.h>
#include <stdint.h>

#define CMF_BD_MAX_TAPS 8
#define CMF_BD_MAX_BLOCK 64

typedef struct cmf_block_drafter cmf_block_drafter;
typedef struct cmf_bd_seq cmf_bd_seq;

/* Open the drafter file `path` for `target` (which must outlive it).
 * Errors: CMF_ERR_IO / CMF_ERR_FORMAT (not a CMF file, a missing or bad
 * header key or tensor, naming the file and key), CMF_ERR_ARG (a drafter
 * for another target: names the file, the key and both values),
 * CMF_ERR_UNSUPPORTED (kind other than "block", too many taps / block),
 * CMF_ERR_NOMEM. */
cmf_status cmf_block_drafter_open(const char *path, cmf_model *target, cmf_block_drafter **out,
                                  cmf_error *err);
void cmf_block_drafter_free(cmf_block_drafter *d);

/* Block size B (the block holds the last token and B-1 drafts). */
uint32_t cmf_block_drafter_block_size(const cmf_block_drafter *d);
/* Target layers whose residual stream (after the layer, before the final
 * norm) the drafter reads, in the order of the taps passed to append. */
uint32_t cmf_block_drafter_n_taps(const cmf_block_drafter *d);
const uint32_t *cmf_block_drafter_tap_layers(const cmf_block_drafter *d);
uint32_t cmf_block_drafter_n_vocab(const cmf_block_drafter *d);

/* Per-sequence state: the drafter's context K/V (one row per context
 * token and drafter layer, f32) for up to n_ctx_max tokens. Errors:
 * CMF_ERR_ARG (n_ctx_max 0), CMF_ERR_NOMEM. */
cmf_status cmf_bd_seq_new(cmf_block_drafter *d, uint32_t n_ctx_max, cmf_bd_seq **out, cmf_error *err);
void cmf_bd_seq_free(cmf_bd_seq *s);
/* Context tokens held (positions 0 .. len-1). */
uint32_t cmf_bd_seq_len(const cmf_bd_seq *s);

/* Append n context tokens at positions len .. len+n-1 from their taps:
 * element (tap t, token r, dim e) at taps[t*tap_stride + r*n_embd + e],
 * float32 host memory. One recorded step. Errors: CMF_ERR_CONTEXT_FULL
 * (len + n > n_ctx_max: nothing appended), those of the backend ops. */
cmf_status cmf_bd_seq_append(cmf_block_drafter *d, cmf_bd_seq *s, const float *taps, size_t tap_stride,
                             uint32_t n, cmf_error *err);
/* Keep the first n context tokens (n >= len: no change). */
void cmf_bd_seq_truncate(cmf_bd_seq *s, uint32_t n);

/* Draft a block after the context: `last` is the token at position len
 * (the last accepted one, not in the context). Writes draft[i] = argmax
 * of the drafter's distribution for position len+1+i, i < B-1, and when
 * logits is not NULL their logits, float32 [B-1][n_vocab] row-major. One
 * recorded step (begin .. submit). Errors: CMF_ERR_ARG (last outside the
 * vocabulary), CMF_ERR_CONTEXT_FULL (len == 0 is allowed; len > n_ctx_max
 * never happens), those of the backend ops. */
cmf_status cmf_bd_propose(cmf_block_drafter *d, cmf_bd_seq *s, int32_t last, int32_t *draft, float *logits,
                          cmf_error *err);
#endif /* CMF_SPECULATE_BLOCK_DRAFTER_H */
