/*
 * safetensors.h — a validating, zero-copy reader for Hugging Face
 * .safetensors files: u64 header length N, N bytes of JSON
 * {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the data, which starts exactly at byte 8 + N (offsets are relative
 * to it; never rounded up). Spec: huggingface/safetensors README.
 */
#ifndef CMF_IMPORT_SAFETENSORS_H
#define CMF_IMPORT_SAFETENSORS_H

#include "cmf/core.h"

#define CMF_ST_MAX_DIMS 8

typedef enum cmf_st_dtype { CMF_ST_F32, CMF_ST_F16, CMF_ST_BF16 } cmf_st_dtype;

typedef struct cmf_st_tensor {
    char *name;
    cmf_st_dtype dtype;
    uint32_t ndim;                  /* 0 = scalar */
    uint64_t shape[CMF_ST_MAX_DIMS]; /* PyTorch order: last dim contiguous */
    uint64_t nelem;
    const void *data;               /* into the mapping */
    uint64_t nbytes;
} cmf_st_tensor;

typedef struct cmf_st_file cmf_st_file;

/* Open and validate. Errors name the file and the tensor/field:
 * CMF_ERR_IO, CMF_ERR_FORMAT (truncated, bad JSON, offsets out of range or
 * not matching dtype x shape), CMF_ERR_UNSUPPORTED (dtype other than
 * F32/F16/BF16), CMF_ERR_NOMEM. */
cmf_status cmf_st_open(const char *path, cmf_st_file **out, cmf_error *err);
/* Same over a caller-owned buffer (fuzzing); name is used in messages. */
cmf_status cmf_st_open_memory(const void *data, size_t size, const char *name, cmf_st_file **out,
                              cmf_error *err);
void cmf_st_close(cmf_st_file *f);

size_t cmf_st_count(const cmf_st_file *f);
const cmf_st_tensor *cmf_st_at(const cmf_st_file *f, size_t i);
const cmf_st_tensor *cmf_st_find(const cmf_st_file *f, const char *name);
const char *cmf_st_path(const cmf_st_file *f);

/* Convert elements [first, first+count) of t to float32. */
void cmf_st_to_f32(const cmf_st_tensor *t, uint64_t first, uint64_t count, float *dst);

#endif /* CMF_IMPORT_SAFETENSORS_H */
