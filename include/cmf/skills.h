/*
 * cmf/skills.h — skills (docs/FORMAT.md §7): specialists stored as
 * replacement tensors "skill.<id>.<backbone name>" beside the backbone in
 * one CMF file, their registry in header.skills[], and routing (choosing a
 * skill for a prompt by its hidden state).
 *
 * File changes (add, remove, apply, fit, quality) grow the base file in
 * place through cmf_file_append_ex: new payloads at the tail, then a new
 * directory and header, fsync, then the 128-byte envelope rewritten last,
 * fsync. A crash at any moment leaves the old file or the new one, both of
 * which open and verify. Writers of one file are serialised by an
 * advisory lock (flock(2) LOCK_EX on the base file, held from before the
 * file is read until the envelope is synced); readers take no lock (they
 * see the envelope of the old or of the new file).
 *
 * Routing (§7): φ = mean over the prompt's positions of the residual
 * stream after layer phi_layer (computed with the backbone); r = φ − mean;
 * E = ‖r − B·Bᵀ·r‖² / ‖φ‖², B the skill's orthonormal basis [rank][n_embd]
 * (principal directions of its example prompts' φ). The smallest E wins;
 * a soft blend uses wᵢ = softmax(−Eᵢ/T).
 *
 * Thread-safety: the functions share no state; distinct files from any
 * thread. cmf_skill_phi and cmf_skill_route run a forward of the model
 * (one at a time per model, as cmf_model_forward).
 */
#ifndef CMF_SKILLS_H
#define CMF_SKILLS_H

#include "cmf/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which backbone tensors a skill may replace (cmf_skill_add_opts.tensors). */
typedef enum cmf_skill_tensors {
    CMF_SKILL_ALL = 0,  /* every per-layer tensor (attention, MLP, norms) */
    CMF_SKILL_FFN = 1,  /* MLP / MoE tensors of a layer (".mlp.", ".feed_forward.", experts) */
    CMF_SKILL_ATTN = 2, /* attention tensors of a layer (".self_attn.", ".attention.") */
} cmf_skill_tensors;

/* Stage callback of the write (cmf_append_opts.stage), plus "locked" (the
 * lock is held, nothing written yet). Crash tests raise SIGKILL there. */
typedef void (*cmf_skill_stage_fn)(const char *stage, void *ctx);

typedef struct cmf_skill_add_opts {
    const char *id;          /* required: [A-Za-z0-9_-]{1,64}, not already in header.skills */
    const char *name;        /* registry "name" (NULL = id) */
    const char *donor;       /* a Hugging Face folder (converted to f32 in a temporary file
                                beside the base, removed afterwards) or a .cmf file of the
                                same architecture and shapes */
    cmf_skill_tensors tensors;
    const char *layers;      /* "all" (NULL), "A-B" (inclusive) or "i,j,k" (0-based) */
    double min_delta;        /* store a tensor when ||D-B||/||B|| > min_delta (>= 0; 0 = any
                                difference); ||B|| = 0 counts as relative delta +inf */
    const char *quant;       /* dtype of the stored tensors ("f32", "q8", ... as
                                cmf_import_opts.quant); NULL = each backbone tensor's dtype
                                (a donor .cmf tensor already in it is copied byte for byte) */
    cmf_skill_stage_fn stage;
    void *stage_ctx;
    bool (*cancel)(void *ctx); /* polled while converting an HF donor; NULL = never */
    void *cancel_ctx;
} cmf_skill_add_opts;

typedef struct cmf_skill_add_report {
    uint32_t n_compared;     /* backbone tensors in the chosen tensors/layers */
    uint32_t n_stored;       /* tensors stored as skill.<id>.* */
    uint32_t n_ignored;      /* differing tensors outside a layer (embeddings, final norm,
                                head): not replaceable at run time, not stored */
    uint64_t stored_bytes;   /* payload bytes of the stored tensors */
    double max_delta;        /* largest relative delta seen among the compared tensors */
} cmf_skill_add_report;

/* Add skill o->id to the base file: every backbone tensor of the chosen
 * kind and layers whose donor counterpart differs by more than min_delta
 * is stored as skill.<id>.<name>, and a registry entry {id, name, layers
 * (the layers with a stored tensor), quality: null} is appended to
 * header.skills. rep may be NULL. Errors: CMF_ERR_ARG (bad id, duplicate
 * id, bad layers spec or a layer >= num_layers, min_delta < 0, unknown
 * quant), CMF_ERR_FORMAT (donor of another architecture or shape — named —
 * or a donor lacking a backbone tensor), CMF_ERR_NOT_FOUND (the donor
 * differs nowhere in the chosen tensors: nothing to store),
 * CMF_ERR_UNSUPPORTED (a shard set; a backbone dtype that cannot be
 * encoded: pass quant), the reader's, the importer's and the append's
 * errors (CMF_ERR_IO, CMF_ERR_NOMEM, CMF_ERR_CANCELLED). On error the
 * base is unchanged. */
cmf_status cmf_skill_add(const char *base, const cmf_skill_add_opts *o, cmf_skill_add_report *rep,
                         cmf_error *err);

/* Drop skill id: its registry entry and its skill.<id>.* records (their
 * payloads become dead bytes that `compact` reclaims). Errors:
 * CMF_ERR_NOT_FOUND (no such skill), the append's. */
cmf_status cmf_skill_remove(const char *base, const char *id, cmf_skill_stage_fn stage, void *stage_ctx,
                            cmf_error *err);

/* Write skill id of base as a standalone skill file `out` (feature bit 6
 * SKILL_FILE; header: arch, skills [its entry], base_dir_hash = hex of
 * cmf_file_dir_hash(base, backbone_only) — the directory the base had
 * before any skill — and its tensors). Errors: CMF_ERR_NOT_FOUND, the
 * writer's. */
cmf_status cmf_skill_export(const char *base, const char *id, const char *out, cmf_error *err);

/* Append the skill of a standalone skill file to base. Errors:
 * CMF_ERR_FORMAT (skill_file is not a skill file, or holds not exactly
 * one skill), CMF_ERR_ARG (base_dir_hash differs from the base's — a
 * different backbone — or the id is already in base), the append's. */
cmf_status cmf_skill_apply(const char *base, const char *skill_file, cmf_skill_stage_fn stage, void *stage_ctx,
                           cmf_error *err);

/* Replace fields of skill id's registry entry: each non-NULL item is
 * copied in under its key ("selection", "quality"), the rest is kept.
 * Errors: CMF_ERR_NOT_FOUND, the append's. */
cmf_status cmf_skill_set_fields(const char *base, const char *id, const struct cJSON *selection,
                                const struct cJSON *quality, cmf_error *err);

/* The registry entry of skill id in an open file's header, or NULL. */
const struct cJSON *cmf_skill_entry(const cmf_file *f, const char *id);

/* ---- routing ------------------------------------------------------------ */

/* φ of one prompt: out[n_embd] = mean over its n tokens (positions 0..n-1,
 * backbone weights, an empty f32 KV cache) of the residual stream after
 * each of the n_layers layers in layers[] (out is [n_layers][n_embd]).
 * Errors: CMF_ERR_ARG (n == 0, a layer >= n_layer), the forward's. */
cmf_status cmf_skill_phi(cmf_model *m, const int32_t *tokens, size_t n, const uint32_t *layers, uint32_t n_layers,
                         float *out, cmf_error *err);

/* The routing descriptor from n_prompts φ vectors phi[n_prompts][dim]:
 * mean[dim] and an orthonormal basis[rank][dim] of the principal
 * directions of the centred φ (PCA by Jacobi eigen-decomposition of the
 * Gram matrix; rank is lowered to the number of non-zero directions, at
 * most n_prompts - 1, and returned in *rank). Errors: CMF_ERR_ARG
 * (n_prompts < 2, rank 0), CMF_ERR_NOMEM. */
cmf_status cmf_skill_pca(const float *phi, uint32_t n_prompts, uint32_t dim, uint32_t *rank, float *mean,
                         float *basis, cmf_error *err);

/* header.skills[].selection as JSON: {metric: "mse", phi_layer, dim, rank,
 * mean, basis} with mean[dim] and basis[rank][dim] (row-major) as
 * little-endian f16, base64 (RFC 4648, padded). NULL on out of memory. */
struct cJSON *cmf_skill_selection_json(uint32_t phi_layer, uint32_t dim, uint32_t rank, const float *mean,
                                       const float *basis);

/* A parsed selection (cmf_skill_selection_parse; free with
 * cmf_skill_selection_free). */
typedef struct cmf_skill_selection {
    uint32_t phi_layer, dim, rank;
    float *mean;   /* [dim] */
    float *basis;  /* [rank][dim] */
} cmf_skill_selection;
/* Errors: CMF_ERR_FORMAT naming the field (missing, bad base64, sizes that
 * disagree with dim/rank, metric other than "mse"). */
cmf_status cmf_skill_selection_parse(const struct cJSON *sel, cmf_skill_selection *out, cmf_error *err);
void cmf_skill_selection_free(cmf_skill_selection *s);

/* E of φ[dim] under a selection (§7); +inf when ‖φ‖ = 0. */
double cmf_skill_energy(const cmf_skill_selection *s, const float *phi);

/* Routing of a prompt over every skill of the file with a selection. */
typedef struct cmf_skill_route_result {
    uint32_t n;          /* skills with a selection */
    char **ids;          /* [n] */
    double *energy;      /* [n] E of each */
    int32_t best;        /* index of the smallest E, -1 when n == 0 */
} cmf_skill_route_result;
/* Errors: the φ forward's, a bad selection's (CMF_ERR_FORMAT), CMF_ERR_NOMEM. */
cmf_status cmf_skill_route(cmf_model *m, const cmf_file *f, const int32_t *tokens, size_t n,
                           cmf_skill_route_result *out, cmf_error *err);
void cmf_skill_route_free(cmf_skill_route_result *r);

/* Soft-blend weights w[i] = softmax(−E[i]/T) over n energies (T > 0). */
void cmf_skill_softmax_weights(const double *energy, uint32_t n, double T, double *w);

/* ---- blends -------------------------------------------------------------- */

/* The in-memory base of the blend Σ w[i]·T_i (§7) of skills ids[0..n) of
 * f, for cmf_model_weight_set_overlay (cmf_model_overlay.base): for every
 * backbone tensor that at least one of the skills replaces, T = Σ w[i]·
 * (skill i's replacement, or the backbone tensor where skill i has none),
 * decoded and summed in f32 and kept as an f32 tensor (4 bytes a weight,
 * once per blend); every other name is the backbone's view. The weights
 * are used as given (softmax weights sum to 1; others are not
 * renormalised). hook->key is "blend:ID=W,..." (the model's cache key:
 * check cmf_model_weight_set_cached before building). The hook's user
 * data is freed by hook->release (the model calls it; call it yourself
 * when the overlay fails). f must outlive it. Errors: CMF_ERR_ARG (n == 0,
 * a weight not finite, an id twice), CMF_ERR_NOT_FOUND (an id not in
 * header.skills), CMF_ERR_NOMEM, a tensor's decode errors. */
cmf_status cmf_skill_blend(const cmf_file *f, const char *const *ids, const float *w, uint32_t n,
                           cmf_model_base_hook *hook, cmf_error *err);
/* The blend key cmf_skill_blend gives (malloc'd; NULL on out of memory). */
char *cmf_skill_blend_key(const char *const *ids, const float *w, uint32_t n);

#ifdef __cplusplus
}
#endif
#endif /* CMF_SKILLS_H */
