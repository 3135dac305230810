/*
 * cli_gpu.h — llama.cpp's `-ngl N` / `--gpu-layers N` / `--n-gpu-layers N`
 * for every subcommand that runs a model: the flag's parsing and what it
 * does to the --device spec (cmf_model_params.gpu_layers, docs/VULKAN.md).
 */
#ifndef CMF_CLI_GPU_H
#define CMF_CLI_GPU_H

#include <stdbool.h>
#include <stdint.h>

/* Whether argv[*i] is one of the flags (then *i is advanced past its value
 * and *ok says whether it parsed: an integer 0 .. 100000 into *ngl, or a
 * usage error printed for cmd). */
bool cli_gpu_layers_flag(const char *cmd, int argc, char **argv, int *i, long *ngl, bool *ok);

/* The flag applied to a device spec, after parsing: ngl < 0 (not given)
 * changes nothing; 0 puts every layer on the CPU (*device = "cpu"); N > 0
 * needs a GPU device (*device NULL or "" becomes "vulkan"; a "cpu" spec is
 * a usage error, printed) and sets *gpu_layers = N (N >= the model's
 * layers: all of them and the head on the GPU). False after a usage error. */
bool cli_gpu_layers_apply(const char *cmd, long ngl, const char **device, uint32_t *gpu_layers);

#define CLI_GPU_LAYERS_HELP \
    "  -ngl, --gpu-layers N    the first N layers on the GPU (--device, default vulkan), the rest and, unless\n" \
    "                          N >= the model's layers, the output head on the CPU; 0 = all on the CPU\n"

#endif /* CMF_CLI_GPU_H */
