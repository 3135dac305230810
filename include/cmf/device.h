/*
 * cmf/device.h — where models run: a device opened from a spec string and
 * shared by every model placed on it (a draft and its target share one
 * thread pool; two pools on the same cores would fight over them).
 *
 * Specs: "cpu" (threads = physical cores; also NULL or ""), "cpu:t=N" (N
 * threads, 1..256).
 * Later backends add their own ("vulkan:0"). The CPU kernel level (and the
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

/* Open a device. Errors: CMF_ERR_ARG (malformed spec, naming it),
 * CMF_ERR_UNSUPPORTED (a backend this build lacks), CMF_ERR_NOMEM. */
cmf_status cmf_device_open(const char *spec, cmf_device **out, cmf_error *err);
void cmf_device_free(cmf_device *d);
/* "cpu" and the kernel level in use, e.g. "cpu (avx512vnni, 8 threads)". */
const char *cmf_device_description(const cmf_device *d);
int cmf_device_threads(const cmf_device *d);

#ifdef __cplusplus
}
#endif
#endif /* CMF_DEVICE_H */
