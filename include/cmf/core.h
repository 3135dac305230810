/*
 * cmf/core.h — status codes, errors and scalar conversions shared by every
 * module of libcmf.
 *
 * Error convention (whole library): a function that can fail returns a
 * cmf_status and takes a `cmf_error *err` as its last argument. On failure
 * it fills err (if non-NULL) with the status and a one-line message that
 * names the file, field or argument at fault, e.g.
 *   "model.cmf: tensor directory: record 12 (\"lm_head.weight\"): off+nbytes exceeds blob"
 * and returns the same status. On success err is left untouched. The
 * library never calls exit() or abort() and never prints.
 *
 * Thread-safety: everything here is reentrant.
 */
#ifndef CMF_CORE_H
#define CMF_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of these headers (the CMake project version; CMakeLists.txt
 * checks that they agree). */
#define CMF_VERSION_STRING "0.1.0"

/* The version of the library linked at run time, "MAJOR.MINOR.PATCH" (the
 * CMake project version it was built from); compare with
 * CMF_VERSION_STRING to catch a header/library mismatch. Static string. */
const char *cmf_version(void);

typedef enum cmf_status {
    CMF_OK = 0,
    CMF_ERR_IO,           /* open/read/write/mmap/rename failed (errno text in msg) */
    CMF_ERR_FORMAT,       /* malformed or corrupt input data */
    CMF_ERR_NOMEM,        /* allocation failed */
    CMF_ERR_ARG,          /* invalid argument from the caller */
    CMF_ERR_UNSUPPORTED,  /* valid input we do not handle (dtype, arch, feature) */
    CMF_ERR_HASH,         /* integrity check failed (hash64, signature) */
    CMF_ERR_LIMIT,        /* a resource limit was hit (render size, recursion, ...) */
    CMF_ERR_CONTEXT_FULL, /* the KV cache has no room for more tokens */
    CMF_ERR_RENDER,       /* a chat template raised or failed to render */
    CMF_ERR_NOT_FOUND,    /* a named thing (tensor, key, file) does not exist */
    CMF_ERR_INTERNAL,     /* an invariant broke: a bug in cmf */
    CMF_ERR_CANCELLED     /* the caller's cancel callback asked to stop (e.g. on SIGINT) */
} cmf_status;

#define CMF_ERROR_MSG_MAX 1024

typedef struct cmf_error {
    cmf_status status;
    char msg[CMF_ERROR_MSG_MAX];
} cmf_error;

/* Fill err (may be NULL) with st and a printf-style message; returns st. */
cmf_status cmf_error_set(cmf_error *err, cmf_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Prefix an existing message: "prefix: old message". Returns err->status. */
cmf_status cmf_error_prefix(cmf_error *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Short constant name of a status ("CMF_ERR_FORMAT", ...). */
const char *cmf_status_name(cmf_status st);

/* IEEE 754 half and bfloat16 <-> float32. f32->f16 and f32->bf16 round to
 * nearest even (as numpy/PyTorch do); NaN stays NaN, overflow gives inf. */
float cmf_f16_to_f32(uint16_t h);
uint16_t cmf_f32_to_f16(float f);
float cmf_bf16_to_f32(uint16_t h);
uint16_t cmf_f32_to_bf16(float f);

/* Read a whole file into a malloc'd buffer (NUL-terminated, *len excludes
 * the NUL). Files ending in ".gz" are gunzipped. Errors: CMF_ERR_IO,
 * CMF_ERR_NOMEM, CMF_ERR_FORMAT (bad gzip). */
cmf_status cmf_read_file(const char *path, char **out, size_t *len, cmf_error *err);
/* As cmf_read_file, refusing a file (after gunzip) longer than max_bytes
 * with CMF_ERR_LIMIT before reading it all: small inputs (keys, signatures,
 * saved chats) whose path a user gives, so /dev/zero or a wrong file
 * cannot exhaust memory. */
cmf_status cmf_read_file_max(const char *path, size_t max_bytes, char **out, size_t *len, cmf_error *err);

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool cmf_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool cmf_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

#ifdef __cplusplus
}
#endif
#endif /* CMF_CORE_H */
