/*
 * cmf/format.h — the CMF v2 container: open (mmap, zero-copy tensor views),
 * write (streaming), append, verify, sign; dtype codecs and hash64.
 *
 * The format: docs/FORMAT.md (section numbers below refer to it). Shapes
 * are PyTorch order: shape[0] is the output (row) dimension of a matrix,
 * shape[ndim-1] the input (contiguous) dimension.
 *
 * Thread-safety: an open cmf_file is immutable and may be read from any
 * number of threads. A cmf_writer belongs to one thread.
 */
#ifndef CMF_FORMAT_H
#define CMF_FORMAT_H

#include "cmf/core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;

/* §4 dtype ids (never reused). */
typedef enum cmf_dtype {
    CMF_DT_F32 = 0,
    CMF_DT_F16 = 1,
    CMF_DT_BF16 = 2,
    CMF_DT_Q8_ROW = 3,
    CMF_DT_Q4_BLOCK = 4,
    CMF_DT_VBIT = 8,
    CMF_DT_Q8_2F = 9,
    CMF_DT_VBIT_RO = 10,
    CMF_DT_Q4_TILED = 11,
    CMF_DT_Q1 = 12,
    CMF_DT_Q1S = 13,
    CMF_DT_Q1T = 14,
    CMF_DT_Q4TP = 15,
    CMF_DT_Q2TP = 16
} cmf_dtype;

#define CMF_MAX_DIMS 6

/* §1 required_features bits. */
#define CMF_FEAT_TENSOR_DIR (1u << 0)
#define CMF_FEAT_BINARY_MASKS (1u << 1)
#define CMF_FEAT_QUANT_2F (1u << 2)
#define CMF_FEAT_LOOP_MASKS (1u << 5)
#define CMF_FEAT_SKILL_FILE (1u << 6)

/* Name ("f32", "q4tp", ...) of a dtype; NULL for an unknown id. */
const char *cmf_dtype_name(int dtype);
/* Parse a dtype name; returns -1 if unknown. */
int cmf_dtype_from_name(const char *name);

/* Payload size in bytes of a tensor of this dtype and shape, for dtypes
 * with a fixed size (all but q1s, q1t, vbit, vbit_ro, whose size depends on
 * content). Errors: CMF_ERR_UNSUPPORTED (variable-size or unknown dtype),
 * CMF_ERR_FORMAT (shape invalid for the dtype, e.g. q4_tiled with in%32),
 * CMF_ERR_LIMIT (overflow). */
cmf_status cmf_dtype_payload_size(cmf_dtype dt, uint32_t ndim, const uint64_t *shape,
                                  uint64_t *nbytes, cmf_error *err);

/* §4 q4tp/q2tp scale ladder of one row: t[0] = exp2(lo), t[c] =
 * t[c-1]*exp2(step), in f32 from the row's f16 lo/step, so every kernel
 * that calls this gets the same bits (tile scale of q4tp code c = t[c]). */
void cmf_q4tp_ladder(uint16_t lo_f16, uint16_t step_f16, float t[32]);

/* §5 hash64 of a byte string (not cryptographic). */
uint64_t cmf_hash64(const void *data, size_t len);

/* A tensor: a read-only view into the mmap'd file (never a copy). */
typedef struct cmf_tensor {
    const char *name;        /* NUL-terminated, owned by the cmf_file */
    cmf_dtype dtype;
    uint32_t ndim;
    uint64_t shape[CMF_MAX_DIMS]; /* unused dims 0 */
    uint64_t nelem;          /* product of shape */
    const void *data;        /* payload in the mapping */
    uint64_t nbytes;         /* payload size */
    uint64_t hash64;         /* from the directory record */
    uint32_t shard;          /* 0-based shard index holding the payload */
} cmf_tensor;

typedef struct cmf_file cmf_file;

/* Open a CMF v2 file (or the whole shard set when path names a shard
 * "x-0000K-of-0000N.cmf", or is the path a sharded write was given and
 * does not exist itself: "x.cmf" opens the set "x-00001-of-0000N.cmf"
 * that cmf_shard_first_path finds; CMF_ERR_IO when several sets match).
 * Validates the envelope, feature bits, section bounds and every directory
 * record (§1, §3); parses the header JSON; mmaps the file without touching
 * weight pages. Errors name the file and field:
 * CMF_ERR_IO, CMF_ERR_FORMAT, CMF_ERR_UNSUPPORTED, CMF_ERR_NOMEM. */
cmf_status cmf_file_open(const char *path, cmf_file **out, cmf_error *err);
void cmf_file_close(cmf_file *f);

/* The path opened: as given, or the first shard when given the path of a
 * sharded write. */
const char *cmf_file_path(const cmf_file *f);
uint32_t cmf_file_required_features(const cmf_file *f);
uint32_t cmf_file_shard_count(const cmf_file *f);       /* 1 when not sharded */
/* The first shard a sharded write to `path` produced (cmf_writer_opts.
 * shard_max_bytes: "<stem>-00001-of-NNNNN.cmf", stem = path minus ".cmf",
 * in path's directory), malloc'd, to pass to cmf_file_open; NULL when there
 * is none (or out of memory). Reads the directory; thread-safe. */
char *cmf_shard_first_path(const char *path);
const char *cmf_file_shard_path(const cmf_file *f, uint32_t i);

size_t cmf_file_tensor_count(const cmf_file *f);
const cmf_tensor *cmf_file_tensor_at(const cmf_file *f, size_t i);
/* Exact-name lookup (hash table, O(1)); NULL if absent. */
const cmf_tensor *cmf_file_find(const cmf_file *f, const char *name);
/* §7 skill overlay lookup: "skill.<skill_id>.<name>" if it exists, else the
 * backbone tensor `name`; skill_id NULL = backbone. NULL if neither exists. */
const cmf_tensor *cmf_file_find_skill(const cmf_file *f, const char *skill_id, const char *name);

/* Parsed header JSON (§2), owned by the file. Never NULL after open. */
const struct cJSON *cmf_file_header(const cmf_file *f);
/* Raw header bytes as stored. */
const char *cmf_file_header_json(const cmf_file *f, size_t *len);
/* §6 tokenizer section (Hugging Face tokenizer.json bytes, not
 * NUL-terminated); NULL with *len = 0 when absent. */
const char *cmf_file_tokenizer_json(const cmf_file *f, size_t *len);
/* True when both files carry a tokenizer section and the two are byte for
 * byte the same (a draft model must share its target's tokenizer). */
bool cmf_file_same_tokenizer(const cmf_file *a, const cmf_file *b);
/* header.tokenizer_config.chat_template, or NULL. */
const char *cmf_file_chat_template(const cmf_file *f);
/* §8 masks section bytes of shard 1 (validated at open: meta JSON parses,
 * every mask blob lies in the section); NULL with *len = 0 when absent. */
const uint8_t *cmf_file_masks(const cmf_file *f, size_t *len);

/* Decode elements [first, first+count) of the flattened tensor to float32.
 * Works for every dtype in §4. Used for embedding rows and tests; kernels
 * read quantized payloads directly. Errors: CMF_ERR_ARG (range),
 * CMF_ERR_FORMAT (payload inconsistent), CMF_ERR_UNSUPPORTED. */
cmf_status cmf_tensor_decode(const cmf_tensor *t, uint64_t first, uint64_t count, float *dst,
                             cmf_error *err);

/* Encode float32 data [nelem = prod(shape)] to dtype dt (§4). *out is
 * malloc'd, *nbytes its size. Supported: f32, f16, bf16, q8_row, q8_2f,
 * q4_block, q4_tiled, q4tp. Errors: CMF_ERR_UNSUPPORTED, CMF_ERR_FORMAT
 * (shape not allowed for dt), CMF_ERR_NOMEM. */
cmf_status cmf_tensor_encode(cmf_dtype dt, uint32_t ndim, const uint64_t *shape, const float *src,
                             void **out, uint64_t *nbytes, cmf_error *err);

/* ---- writing ---------------------------------------------------------- */

typedef struct cmf_writer cmf_writer;

typedef struct cmf_writer_opts {
    uint64_t shard_max_bytes; /* 0 = one file; else split weights into shards
                                 "<stem>-0000K-of-0000N.cmf" of at most this
                                 many payload bytes each */
    uint32_t extra_features;  /* OR'd into required_features (e.g. SKILL_FILE) */
    /* Cancellation (NULL = none): polled with cancel_ctx by
     * cmf_writer_open, before each tensor is stored and every MiB while
     * finish copies the weights. When it returns true that call fails with
     * CMF_ERR_CANCELLED ("<path>: interrupted"); finish (or abort) then
     * removes every temporary file. Called on the writer's thread; keep it
     * cheap (e.g. read a flag that a signal handler sets). */
    bool (*cancel)(void *cancel_ctx);
    void *cancel_ctx;
} cmf_writer_opts;

/* Check, before any work, that `path` can be a writer's output: not empty,
 * not an existing file other than a regular one (a directory, device, FIFO
 * or socket; a symlink is followed, so one to a regular file is fine), in
 * an existing, writable directory. Creates nothing. Errors name `path` as
 * given: CMF_ERR_ARG ("" or NULL), CMF_ERR_IO ("is a directory", "is a
 * character device", "is a block device", "is a FIFO", "is a socket",
 * "directory 'D' does not exist", "'D' is not a directory", "directory 'D'
 * is not writable"). Thread-safe. */
cmf_status cmf_writer_check_path(const char *path, cmf_error *err);
/* Check, before any work, the output path of a sharded write
 * (shard_max_bytes > 0): it names the set, so a path that is itself a shard
 * name ("<stem>-KKKKK-of-NNNNN.cmf") is refused with CMF_ERR_ARG naming it
 * (its shards would be "<stem>-KKKKK-of-NNNNN-0000J-of-0000M.cmf", which
 * opening the given path never finds). Creates nothing. Thread-safe. */
cmf_status cmf_writer_check_shard_path(const char *path, cmf_error *err);

/* Start a new file at `path` (checked with cmf_writer_check_path first).
 * Tensors are streamed to a temporary file next to it; nothing appears at
 * `path` until cmf_writer_finish succeeds. opts may be NULL. Errors:
 * cmf_writer_check_path's, cmf_writer_check_shard_path's (when
 * opts->shard_max_bytes > 0), CMF_ERR_ARG (unknown extra_features),
 * CMF_ERR_IO, CMF_ERR_NOMEM, CMF_ERR_CANCELLED. */
cmf_status cmf_writer_open(const char *path, const cmf_writer_opts *opts, cmf_writer **out,
                           cmf_error *err);

/* The header JSON object (§2) the caller fills before finish: "arch",
 * "tokenizer_config", "quant_type", "provenance", "skills", ... The writer
 * itself sets "format", "version", "section_hashes" and "shard". */
struct cJSON *cmf_writer_header(cmf_writer *w);

/* Add one tensor with an already-encoded payload (copied to disk at once;
 * the caller may free it on return). Payload size is checked against the
 * dtype and shape. Names must be unique. CMF_ERR_CANCELLED when
 * opts.cancel asks to stop (the tensor is not added). */
cmf_status cmf_writer_add(cmf_writer *w, const char *name, cmf_dtype dt, uint32_t ndim,
                          const uint64_t *shape, const void *payload, uint64_t nbytes,
                          cmf_error *err);

/* Encode float32 data to dt and add it. */
cmf_status cmf_writer_add_f32(cmf_writer *w, const char *name, cmf_dtype dt, uint32_t ndim,
                              const uint64_t *shape, const float *data, cmf_error *err);

/* The tokenizer section: Hugging Face tokenizer.json bytes, stored verbatim. */
cmf_status cmf_writer_set_tokenizer(cmf_writer *w, const char *json, size_t len, cmf_error *err);

/* The §8 masks section bytes (validated, stored verbatim in shard 1; sets
 * the BINARY_MASKS feature bit). */
cmf_status cmf_writer_set_masks(cmf_writer *w, const void *data, size_t len, cmf_error *err);

/* Write directory, header, tokenizer, hashes and envelope, fsync, and
 * rename into place. Frees w whether or not it succeeds; on failure
 * (CMF_ERR_CANCELLED included) no temporary file and nothing at the output
 * path remain. */
cmf_status cmf_writer_finish(cmf_writer *w, cmf_error *err);
/* Discard: remove the temporary files and free w. */
void cmf_writer_abort(cmf_writer *w);

/* ---- append, compact, verify, sign ------------------------------------ */

/* Append-only growth (§7): add tensors (and optionally replace the header
 * JSON) to an existing single-file CMF in place: new payloads, directory
 * and header at the tail, envelope offsets updated last. `tensors` are
 * encoded payloads as for cmf_writer_add. new_header may be NULL (keep). */
typedef struct cmf_new_tensor {
    const char *name;
    cmf_dtype dtype;
    uint32_t ndim;
    uint64_t shape[CMF_MAX_DIMS];
    const void *payload;
    uint64_t nbytes;
} cmf_new_tensor;
/* An exclusive advisory lock (flock(2)) on path, held until close(*fd):
 * every in-place writer of a file's skills (skill add/remove/apply/fit/
 * quality, lora import --into) takes it around read-modify-append, so two
 * writers never lose each other's entry. Blocks until granted. Errors:
 * CMF_ERR_IO (cannot open for writing, cannot lock). */
cmf_status cmf_file_lock(const char *path, int *fd, cmf_error *err);
/* §7 skill ids cmf writes: 1-64 characters of A-Z a-z 0-9 _ - (they become
 * part of tensor names "skill.<id>.<name>" and of model names "base:<id>"). */
bool cmf_skill_id_valid(const char *id);

cmf_status cmf_file_append(const char *path, const cmf_new_tensor *tensors, size_t n,
                           const struct cJSON *new_header, cmf_error *err);

/* Options of cmf_file_append_ex (zero-initialize; NULL = none). */
typedef struct cmf_append_opts {
    /* Existing records whose name drop() accepts leave the new directory
     * (their payloads become dead bytes; compact reclaims them). A new
     * tensor may reuse a dropped name. */
    bool (*drop)(const char *name, void *drop_ctx);
    void *drop_ctx;
    /* Called after each write stage, in order: "payloads" (new payloads
     * written at the tail, not yet synced), "directory" (new directory and
     * header written and fsync'd; the envelope still points at the old
     * ones), "envelope" (envelope rewritten and fsync'd: the new file).
     * A crash at any stage leaves the old file or the new one. */
    void (*stage)(const char *stage, void *stage_ctx);
    void *stage_ctx;
    uint32_t set_features, clear_features; /* required_features bits changed in the new envelope */
} cmf_append_opts;
/* cmf_file_append with options. Errors: those of cmf_file_append. Not
 * thread-safe for one path: callers serialise writers (cmf/skills.h takes
 * an advisory lock). */
cmf_status cmf_file_append_ex(const char *path, const cmf_new_tensor *tensors, size_t n,
                              const struct cJSON *new_header, const cmf_append_opts *opts, cmf_error *err);

/* hash64 of the file's directory bytes (shard 1's, §3) into *hash; with
 * backbone_only, of the directory the file would have without its
 * "skill.*" records (same order, offsets, hashes): for a base that got
 * skills only by append, the directory it had before them — the
 * base_dir_hash of a standalone skill file (§7). Errors: CMF_ERR_ARG,
 * CMF_ERR_NOMEM. Thread-safe. */
cmf_status cmf_file_dir_hash(const cmf_file *f, bool backbone_only, uint64_t *hash, cmf_error *err);

/* Rewrite `in` to `out` without dead bytes (same tensors, header, tokenizer). */
cmf_status cmf_compact(const char *in, const char *out, cmf_error *err);
/* Options of cmf_compact_with (zero-initialize; NULL = none). */
typedef struct cmf_compact_opts {
    /* Cancellation, as cmf_writer_opts.cancel: polled before each tensor and
     * every MiB of the final copy; true stops with CMF_ERR_CANCELLED and
     * every temporary file removed, `out` not written. */
    bool (*cancel)(void *cancel_ctx);
    void *cancel_ctx;
} cmf_compact_opts;
/* cmf_compact with options. Errors: cmf_writer_check_path's on `out`
 * (before `in` is read), cmf_file_open's on `in`, CMF_ERR_HASH (a corrupt
 * tensor in `in`), CMF_ERR_CANCELLED, the writer's (CMF_ERR_IO,
 * CMF_ERR_NOMEM). Thread-safe for distinct `out`. */
cmf_status cmf_compact_with(const char *in, const char *out, const cmf_compact_opts *opts, cmf_error *err);

/* Verify report: one line per problem found, e.g.
 *   "tensor 'model.layers.0.mlp.up_proj.weight': hash64 mismatch"
 *   "header: hash64 mismatch (envelope 0x..., computed 0x...)" */
typedef struct cmf_verify_report {
    size_t n_problems;
    char **problems;        /* n_problems malloc'd strings */
    size_t n_tensors_checked;
    bool signature_present;
    bool signature_ok;
} cmf_verify_report;

/* §5 verify: envelope (flags must be 0), section bounds, header and
 * directory hashes, section_hashes, every tensor hash, and `<path>.sig`
 * when present; each problem is reported once. path is opened as by
 * cmf_file_open (a shard name or a sharded write's path verifies the set).
 * Returns CMF_OK when the checks could run (the verdict is
 * report->n_problems == 0); CMF_ERR_IO (report empty) when path cannot be
 * read at all or is a directory; CMF_ERR_NOMEM. */
cmf_status cmf_verify(const char *path, cmf_verify_report *report, cmf_error *err);
void cmf_verify_report_free(cmf_verify_report *r);

/* Ed25519 keys (libsodium). Key file: JSON {"alg":"ed25519","pubkey":hex,
 * "secret":hex}, written 0600. */
cmf_status cmf_keygen(const char *key_path, cmf_error *err);
/* Write `<path>.sig` = JSON {alg:"ed25519-sha256", pubkey, sha256, sig}
 * (hex), Ed25519 over the 32-byte SHA-256 of the whole file. */
cmf_status cmf_sign(const char *path, const char *key_path, cmf_error *err);

/* Pin the signer: *ok only when `<path>.sig` exists, verifies, and was made
 * with the trusted key — 64 hex digits of the Ed25519 public key, or a
 * JSON file with a "pubkey" field (e.g. the key file). msg[msgcap] gets a
 * one-line reason when !*ok. Errors: CMF_ERR_IO / CMF_ERR_FORMAT when the
 * trusted key or the file cannot be read. */
cmf_status cmf_verify_signature(const char *path, const char *trusted, bool *ok, char *msg, size_t msgcap,
                                cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_FORMAT_H */
