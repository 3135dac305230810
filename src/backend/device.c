/*
 * device.c — cmf_device (cmf/device.h): parses a device spec and owns the
 * backend that every model placed on the device uses (the CPU backend's
 * thread pool today). Models loaded without a device get a private one.
 */
#include "cmf/device.h"

#include "backend/backend.h"
#include "backend/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cmf_device {
    cmf_backend *be;
    char desc[96];
};

cmf_status cmf_device_open(const char *spec, cmf_device **out, cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_device_open: out is NULL");
    *out = NULL;
    if (!spec || !*spec) spec = "cpu";
    int threads = 0;
    if (strncmp(spec, "cpu", 3) != 0 || (spec[3] != 0 && spec[3] != ':'))
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "device \"%s\": not available (have: cpu, cpu:t=N)", spec);
    if (spec[3] == ':') {
        const char *opt = spec + 4;
        char *end = NULL;
        if (strncmp(opt, "t=", 2) != 0)
            return cmf_error_set(err, CMF_ERR_ARG, "device \"%s\": unknown option (cpu takes t=N)", spec);
        long t = strtol(opt + 2, &end, 10);
        if (end == opt + 2 || *end || t < 1 || t > 256)
            return cmf_error_set(err, CMF_ERR_ARG, "device \"%s\": t must be an integer in [1, 256]", spec);
        threads = (int)t;
    }
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
