/*
 * cmf/device.h — where models run: a device opened from a spec string and
 * shared by every model placed on it (a draft and its target share one
 * thread pool; two pools on the same cores would fight over them).
 *
 * Specs: "cpu" (threads = physical cores; also NULL), "cpu:t=N" (N
 * threads, 1..256), "vulkan" or "vulkan:N" (the N-th Vulkan physical device
 * of cmf_device_list, builds with CMF_VULKAN; docs/VULKAN.md). The CPU kernel level (and the
 * CMF_CPU override) is read when the device is opened.
 *
 * Thread-safety: a device runs one forward pass at a time; models on one
 * device must be stepped from one thread (or serialized by the caller).
 * Free the device after every model placed on it.
 */
#ifndef CMF_DEVICE_H
#define CMF_DEVICE_H

#include "cmf/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cmf_device cmf_device;

/* Open a device: spec "cpu" (NULL too), "cpu:t=N" (N threads, 1..256),
 * "vulkan", "vulkan:N". Errors: CMF_ERR_ARG (a malformed, unknown or empty spec, naming it),
 * CMF_ERR_UNSUPPORTED (a backend this build lacks), CMF_ERR_NOMEM. */
cmf_status cmf_device_open(const char *spec, cmf_device **out, cmf_error *err);
/* Whether spec is one cmf_device_open reads (the syntax only: nothing is
 * opened; a CLI checks its --device at parse time with it). Errors:
 * CMF_ERR_ARG as cmf_device_open's, naming the spec. Thread-safe. */
cmf_status cmf_device_spec_check(const char *spec, cmf_error *err);
void cmf_device_free(cmf_device *d);
/* "cpu" and the kernel level in use, e.g. "cpu (avx512vnni, 8 threads)". */
const char *cmf_device_description(const cmf_device *d);
int cmf_device_threads(const cmf_device *d);

/* What cmf_device_list reports of one device. */
typedef struct cmf_device_info {
    char spec[32];        /* what cmf_device_open takes: "cpu", "vulkan:0" */
    char name[256];       /* "llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H200" */
    char api[32];         /* "Vulkan 1.3.230", or "" */
    uint64_t memory;      /* bytes of its device-local heap (0: host memory) */
    uint32_t subgroup;    /* subgroup size (0 for the cpu) */
    int coopmat;          /* VK_KHR_cooperative_matrix present */
    int int_dot;          /* integer dot product (VK_KHR_shader_integer_dot_product) */
} cmf_device_info;

/* The devices this build can open: "cpu" first, then each Vulkan physical
 * device. Fills up to cap entries of out and sets *n to the count found.
 * A missing Vulkan loader or driver is not an error (only cpu is listed).
 * Errors: CMF_ERR_ARG (NULL n). */
cmf_status cmf_device_list(cmf_device_info *out, size_t cap, size_t *n, cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_DEVICE_H */
