/*
 * cli_gpu.c — the -ngl / --gpu-layers flag of the subcommands that run a
 * model (cli_gpu.h): parsing, and its effect on the --device spec.
 */
#include "cli_gpu.h"

#include "cli.h"

#include <string.h>

bool cli_gpu_layers_flag(const char *cmd, int argc, char **argv, int *i, long *ngl, bool *ok) {
    static const char *const names[] = {"-ngl", "--gpu-layers", "--n-gpu-layers"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const char *v;
        bool missing = false;
        if (!cli_flag_value(argc, argv, i, names[k], &v, &missing)) continue;
        if (missing) {
            cli_usage_error(cmd, "%s needs a value", names[k]);
            *ok = false;
        } else {
            *ok = cli_parse_long(cmd, names[k], v, 0, 100000, ngl);
        }
        return true;
    }
    return false;
}

bool cli_gpu_layers_apply(const char *cmd, long ngl, const char **device, uint32_t *gpu_layers) {
    if (ngl < 0) return true;
    if (ngl == 0) { /* llama.cpp's -ngl 0: nothing offloaded */
        *device = "cpu";
        *gpu_layers = 0;
        return true;
    }
    if (!*device || !**device) *device = "vulkan";
    else if (strncmp(*device, "cpu", 3) == 0) {
        cli_usage_error(cmd, "--gpu-layers %ld needs a GPU device, not --device %s", ngl, *device);
        return false;
    }
    *gpu_layers = (uint32_t)ngl;
    return true;
}
