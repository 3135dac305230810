/*
 * gguf.h — a validating, zero-copy reader for GGUF v2/v3 files (the
 * llama.cpp / ggml container), and dequantizers for the ggml block types.
 *
 * Layout (ggml docs/gguf.md): magic "GGUF", u32 version, u64 tensor count,
 * u64 metadata count; metadata key/value pairs (string key, u32 type,
 * value); tensor infos (string name, u32 n_dims, u64 ne[n_dims], u32 ggml
 * type, u64 offset relative to the data section); padding to
 * `general.alignment` (default 32, any power of two); the data section.
 * All integers little-endian. Strings are u64 length + bytes (no NUL).
 *
 * The file is mmap'd read-only; tensor data pointers point into the
 * mapping and stay valid until cmf_gguf_close. Every count, length, offset
 * and size is checked against the file before use: a truncated or lying
 * file gives CMF_ERR_FORMAT with a message naming the file and field.
 *
 * Owner: import module. Also used by the tokenizer tests (vocab GGUFs).
 */
#ifndef CMF_IMPORT_GGUF_H
#define CMF_IMPORT_GGUF_H

#include "cmf/core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;

/* ggml tensor type ids (ggml.h enum ggml_type). */
enum {
    CMF_GGML_F32 = 0,
    CMF_GGML_F16 = 1,
    CMF_GGML_Q4_0 = 2,
    CMF_GGML_Q4_1 = 3,
    CMF_GGML_Q5_0 = 6,
    CMF_GGML_Q5_1 = 7,
    CMF_GGML_Q8_0 = 8,
    CMF_GGML_Q8_1 = 9,
    CMF_GGML_Q2_K = 10,
    CMF_GGML_Q3_K = 11,
    CMF_GGML_Q4_K = 12,
    CMF_GGML_Q5_K = 13,
    CMF_GGML_Q6_K = 14,
    CMF_GGML_Q8_K = 15,
    CMF_GGML_BF16 = 30
};

/* GGUF metadata value types (gguf.md). */
enum {
    CMF_GGUF_U8 = 0, CMF_GGUF_I8 = 1, CMF_GGUF_U16 = 2, CMF_GGUF_I16 = 3,
    CMF_GGUF_U32 = 4, CMF_GGUF_I32 = 5, CMF_GGUF_F32 = 6, CMF_GGUF_BOOL = 7,
    CMF_GGUF_STRING = 8, CMF_GGUF_ARRAY = 9, CMF_GGUF_U64 = 10, CMF_GGUF_I64 = 11,
    CMF_GGUF_F64 = 12
};

#define CMF_GGUF_MAX_DIMS 4

typedef struct cmf_gguf_tensor {
    const char *name;     /* NUL-terminated, owned by the cmf_gguf */
    uint32_t type;        /* ggml type id (CMF_GGML_*) */
    uint32_t ndim;        /* 1..4 */
    uint64_t ne[CMF_GGUF_MAX_DIMS]; /* GGUF order: ne[0] is the contiguous dim; unused = 1 */
    uint64_t nelem;       /* product of ne */
    uint64_t offset;      /* from the start of the data section */
    const void *data;     /* into the mapping */
    uint64_t nbytes;      /* payload size (whole blocks) */
} cmf_gguf_tensor;

typedef struct cmf_gguf cmf_gguf;

/* Open and validate a GGUF file (v2 or v3). Errors: CMF_ERR_IO,
 * CMF_ERR_FORMAT (naming the field), CMF_ERR_UNSUPPORTED (v1, big-endian,
 * unknown tensor type), CMF_ERR_NOMEM. */
cmf_status cmf_gguf_open(const char *path, cmf_gguf **out, cmf_error *err);

/* Same over a caller-owned buffer (not copied; must outlive the handle).
 * `name` is used in error messages. Used by the fuzz target. */
cmf_status cmf_gguf_open_memory(const void *data, size_t size, const char *name, cmf_gguf **out,
                                cmf_error *err);

void cmf_gguf_close(cmf_gguf *g);

uint32_t cmf_gguf_version(const cmf_gguf *g);
uint32_t cmf_gguf_alignment(const cmf_gguf *g);
const char *cmf_gguf_path(const cmf_gguf *g);

/* Object: GGUF key -> decoded value. Integers and floats are numbers
 * (u64/i64 beyond 2^53 lose precision), bools are booleans, strings are
 * strings (bytes up to the first NUL), arrays are JSON arrays (nested
 * arrays nest). Owned by the handle. */
const struct cJSON *cmf_gguf_meta(const cmf_gguf *g);
/* The stored value type of a key (CMF_GGUF_*), or -1 if absent. For arrays,
 * *elem_type (may be NULL) receives the element type. */
int cmf_gguf_meta_type(const cmf_gguf *g, const char *key, int *elem_type);

size_t cmf_gguf_tensor_count(const cmf_gguf *g);
const cmf_gguf_tensor *cmf_gguf_tensor_at(const cmf_gguf *g, size_t i);
/* Exact-name lookup; NULL if absent. */
const cmf_gguf_tensor *cmf_gguf_find(const cmf_gguf *g, const char *name);

/* ---- ggml types ------------------------------------------------------- */

/* "F32", "Q4_K", ...; NULL for an unknown id. */
const char *cmf_ggml_type_name(uint32_t type);
/* Elements per block and bytes per block; false for an unknown type. */
bool cmf_ggml_type_size(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);
/* True for the types cmf_ggml_dequantize handles. */
bool cmf_ggml_can_dequantize(uint32_t type);

/* Dequantize n elements (n a multiple of the block size) from src (n /
 * block_elems blocks) to float32. Layouts and formulas from ggml-quants.c
 * (dequantize_row_*). Errors: CMF_ERR_UNSUPPORTED (type), CMF_ERR_ARG (n). */
cmf_status cmf_ggml_dequantize(uint32_t type, const void *src, uint64_t n, float *dst,
                               cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_IMPORT_GGUF_H */
