/*
 * device.c — cmf_device (cmf/device.h): parses a device spec and owns the
 * backend that every model placed on the device uses (the CPU backend's
 * thread pool, or a Vulkan device: src/backend/vulkan/). Models loaded
 * without a device get a private CPU one. Lists the devices this build can
 * open (cmf_device_list).
 */
#include "cmf/device.h"

#include "backend/backend.h"
#include "backend/cpu/cpu.h"

#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

struct cmf_device {
    cmf_backend *be;
    char desc[96];
};

#ifdef CMF_HAVE_VULKAN
cmf_status cmf_vk_list(cmf_device_info *out, size_t cap, size_t *n, cmf_error *err);
const char *cmf_backend_vulkan_name(cmf_backend *b);
#define HAVE_SPECS "cpu, cpu:t=N, vulkan, vulkan:N"
#else
#define HAVE_SPECS "cpu, cpu:t=N"
#endif

/* The one reading of a spec: *kind 0 = cpu (*n threads, 0 = physical cores), 1 = vulkan (*n the index).
 * Errors: CMF_ERR_ARG naming the spec. */
static cmf_status parse_spec(const char *spec, int *kind, long *n, cmf_error *err) {
    *kind = 0, *n = 0;
    if (!spec) return CMF_OK;
    if (!*spec) return cmf_error_set(err, CMF_ERR_ARG, "device \"\": an empty spec (have: " HAVE_SPECS ")");
    const char *opt;
    if (strncmp(spec, "vulkan", 6) == 0 && (spec[6] == 0 || spec[6] == ':')) {
        *kind = 1;
        if (spec[6] == 0) return CMF_OK;
        char *end = NULL;
        *n = strtol(spec + 7, &end, 10);
        if (end == spec + 7 || *end || *n < 0 || *n > 64)
            return cmf_error_set(err, CMF_ERR_ARG, "device \"%s\": N of vulkan:N must be an integer in [0, 64]", spec);
        return CMF_OK;
    }
    if (strncmp(spec, "cpu", 3) != 0 || (spec[3] != 0 && spec[3] != ':'))
        return cmf_error_set(err, CMF_ERR_ARG, "device \"%s\": not available (have: " HAVE_SPECS ")", spec);
    if (spec[3] == 0) return CMF_OK;
    opt = spec + 4;
    if (strncmp(opt, "t=", 2) != 0)
        return cmf_error_set(err, CMF_ERR_ARG, "device \"%s\": unknown option (cpu takes t=N)", spec);
    char *end = NULL;
    *n = strtol(opt + 2, &end, 10);
    if (end == opt + 2 || *end || *n < 1 || *n > 256)
        return cmf_error_set(err, CMF_ERR_ARG, "device \"%s\": t must be an integer in [1, 256]", spec);
    return CMF_OK;
}

cmf_status cmf_device_spec_check(const char *spec, cmf_error *err) {
    int kind;
    long n;
    return parse_spec(spec, &kind, &n, err);
}

/* Vulkan device idx of cmf_device_list ("vulkan" or "vulkan:N") */
static cmf_status open_vulkan(const char *spec, long idx, cmf_device **out, cmf_error *err) {
#ifdef CMF_HAVE_VULKAN
    cmf_device *d = calloc(1, sizeof *d);
    if (!d) return cmf_error_set(err, CMF_ERR_NOMEM, "device: out of memory");
    cmf_status st = cmf_backend_vulkan_new((int)idx, &d->be, err);
    if (st != CMF_OK) {
        free(d);
        return cmf_error_prefix(err, "device \"%s\"", spec);
    }
    snprintf(d->desc, sizeof d->desc, "vulkan:%ld (%s)", idx, cmf_backend_vulkan_name(d->be));
    *out = d;
    return CMF_OK;
#else
    (void)out, (void)idx;
    return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "device \"%s\": this build has no Vulkan backend (CMF_VULKAN=OFF)",
                         spec);
#endif
}

cmf_status cmf_device_list(cmf_device_info *out, size_t cap, size_t *n, cmf_error *err) {
    if (!n) return cmf_error_set(err, CMF_ERR_ARG, "cmf_device_list: n is NULL");
    *n = 0;
    if (cap > 0 && out) {
        memset(&out[0], 0, sizeof out[0]);
        snprintf(out[0].spec, sizeof out[0].spec, "cpu");
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        snprintf(out[0].name, sizeof out[0].name, "host CPU (%ld logical cores)", nc);
    }
    *n = 1;
#ifdef CMF_HAVE_VULKAN
    size_t nv = 0;
    cmf_status st = cmf_vk_list(out && cap > 1 ? out + 1 : NULL, out && cap > 1 ? cap - 1 : 0, &nv, err);
    if (st) return st;
    *n += nv;
#endif
    return CMF_OK;
}

cmf_status cmf_device_open(const char *spec, cmf_device **out, cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_device_open: out is NULL");
    *out = NULL;
    int kind;
    long n;
    cmf_status ps = parse_spec(spec, &kind, &n, err);
    if (ps) return ps;
    if (!spec) spec = "cpu";
    if (kind == 1) return open_vulkan(spec, n, out, err);
    int threads = (int)n;
    cmf_device *d = calloc(1, sizeof *d);
    if (!d) return cmf_error_set(err, CMF_ERR_NOMEM, "device: out of memory");
    cmf_status st = cmf_backend_cpu_new(threads, &d->be, err);
    if (st != CMF_OK) {
        free(d);
        return cmf_error_prefix(err, "device \"%s\"", spec);
    }
    cmf_cpu_level lv = cmf_cpu_pool_level(cmf_backend_cpu_pool(d->be));
    snprintf(d->desc, sizeof d->desc, "cpu (%s, %d threads)", cmf_cpu_level_name(lv),
             d->be->n_threads);
    *out = d;
    return CMF_OK;
}

void cmf_device_free(cmf_device *d) {
    if (!d) return;
    d->be->ops->free(d->be);
    free(d);
}

const char *cmf_device_description(const cmf_device *d) { return d ? d->desc : ""; }
int cmf_device_threads(const cmf_device *d) { return d ? d->be->n_threads : 0; }

cmf_backend *cmf_device_backend(cmf_device *d) { return d ? d->be : NULL; }
