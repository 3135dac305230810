/*
 * cmf/lora.h — LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of
 * Large Language Models"), applied unmerged at run time.
 *
 * An adapter holds, for some projections of some layers, a pair A [r, in],
 * B [out, r] (PyTorch order, as PEFT stores lora_A / lora_B) and one scale
 * s = alpha / r (rsLoRA, Kalajdzievski 2023: alpha / √r). A weight set with
 * the adapter computes y = W·x + user_scale · s · B·(A·x) for each adapted
 * projection (cmf_model_weight_set_overlay in cmf/model.h), so sequences
 * with different adapters, or none, share one batch.
 *
 * Where adapters live (docs/LORA.md): a standalone adapter file (`cmf lora
 * import PEFT_DIR -o ADAPTER.cmf`), or a low-rank skill inside a base file
 * (`--into BASE.cmf --id ID`: tensors skill.ID.<name>, a header.skills[]
 * entry with "kind": "lora").
 *
 * Memory: the file's mapping (A is read in place) plus each B transposed
 * to f32 (Bᵀ [r, out], the layout the backend op reads), made at open.
 * Thread-safety: a cmf_lora is immutable after open and may be shared by
 * threads and models; free it after every model that uses it.
 */
#ifndef CMF_LORA_H
#define CMF_LORA_H

#include "cmf/format.h"
#include "cmf/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CMF_LORA_MAX_RANK 1024 /* largest r the runtime takes */

/* Open an adapter file (docs/LORA.md: header.lora, tensors
 * <module>.lora_A / .lora_B). Every pair is checked here: both present,
 * 2-D, A [r, in] and B [out, r] with the header's r, float dtype (f32,
 * f16, bf16). Errors name the file and tensor: CMF_ERR_IO (missing
 * file), cmf_file_open's, CMF_ERR_FORMAT (no header.lora, a lone A or B,
 * a shape, r or alpha out of range), CMF_ERR_UNSUPPORTED (a dtype, a
 * module the runtime cannot adapt), CMF_ERR_NOMEM. */
cmf_status cmf_lora_open(const char *path, cmf_lora **out, cmf_error *err);
/* The low-rank skill `id` of an open base file (header.skills[] entry of
 * kind "lora", tensors skill.<id>.<module>.lora_A / _B). f must outlive
 * the adapter. Errors: CMF_ERR_NOT_FOUND (no such skill), CMF_ERR_FORMAT
 * (the skill is not of kind "lora", or as cmf_lora_open), CMF_ERR_NOMEM. */
cmf_status cmf_lora_open_skill(const cmf_file *f, const char *id, cmf_lora **out, cmf_error *err);
void cmf_lora_free(cmf_lora *l);

typedef struct cmf_lora_info {
    const char *path;      /* the file it was read from */
    const char *skill;     /* the skill id, or NULL for an adapter file */
    const char *arch_name; /* of the model it was made for ("" when unknown) */
    uint32_t rank;         /* r */
    float alpha;
    bool rslora;
    float scale;           /* alpha / r, or alpha / √r with rslora */
    uint32_t n_pairs;      /* adapted projections (A/B pairs) */
} cmf_lora_info;
void cmf_lora_get_info(const cmf_lora *l, cmf_lora_info *info);

/* Whether l fits model m: same architecture name (when the adapter names
 * one), every pair's layer < n_layer and A/B shapes equal to the
 * projection's [out, in]. Errors: CMF_ERR_FORMAT naming the adapter, the
 * tensor and both shapes; CMF_ERR_UNSUPPORTED (an MLP adapter on a MoE
 * layer). cmf_model_weight_set_overlay runs it. */
cmf_status cmf_lora_check(const cmf_lora *l, const cmf_model *m, cmf_error *err);

/* ---- import (src/import/lora_import.c) ---------------------------------- */

typedef struct cmf_lora_import_opts {
    const char *dtype;     /* "f32" (default), "f16" or "bf16" */
    const char *into;      /* store into this base file as a low-rank skill ... */
    const char *id;        /* ... of this id (both or neither) */
    const char *base;      /* with out_path: the base file the adapter is for (may be
                              NULL): every pair is checked against its tensors and its
                              arch_name recorded (then cmf_lora_check compares it) */
} cmf_lora_import_opts;

/* Convert a PEFT LoRA folder (adapter_config.json + adapter_model
 * .safetensors) to an adapter file at out_path, or (opts->into) append it
 * to a base file as low-rank skill opts->id (appended in place,
 * cmf_file_append; out_path is then NULL). Scale alpha/r, alpha/√r when
 * use_rslora. Module names map to cmf tensor names as the HF importer
 * maps the base weights (base_model.model.<name>.lora_A.weight ->
 * <name>.lora_A). With `into` (or `base`), every pair is checked against
 * the base's tensors first. Errors name the file and key: CMF_ERR_IO,
 * CMF_ERR_FORMAT (config keys, shapes, a lone A/B), CMF_ERR_UNSUPPORTED
 * (peft_type other than LORA, use_dora, rank_pattern / alpha_pattern,
 * fan_in_fan_out, a module that is not a projection of a decoder layer),
 * CMF_ERR_ARG (bad opts, an id already in header.skills), CMF_ERR_NOMEM. */
cmf_status cmf_lora_import(const char *peft_dir, const char *out_path, const cmf_lora_import_opts *opts,
                           cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_LORA_H */
