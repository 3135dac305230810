/*
 * cmd_lora.c — `cmf lora import` (a PEFT LoRA folder to an adapter file,
 * or into a base file as a low-rank skill) and `cmf lora info` (what an
 * adapter holds). The library side is cmf/lora.h; the flags that apply
 * adapters at run time are in cli_lora.c.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const char lora_help[] =
    "usage: cmf lora import PEFT_DIR (-o ADAPTER.cmf [--base BASE.cmf] | --into BASE.cmf --id ID)\n"
    "                       [--dtype f32|f16|bf16]\n"
    "       cmf lora info ADAPTER.cmf | cmf lora info BASE.cmf --id ID\n"
    "  import: converts a PEFT LoRA adapter (adapter_config.json +\n"
    "  adapter_model.safetensors) to an adapter file for --lora, or appends it in\n"
    "  place to BASE.cmf as low-rank skill ID (tensors skill.ID.*, a header.skills\n"
    "  entry of kind \"lora\"; then --skill ID runs it). Scale alpha/r (alpha/sqrt(r)\n"
    "  with use_rslora). Any of the q/k/v/o (qkv) and gate/up/down (gate_up)\n"
    "  projections; A and B stored in --dtype (default f32). --base: check the\n"
    "  adapter against the model it is for and record its architecture (then\n"
    "  --lora refuses it on another one). docs/LORA.md.\n"
    "  info: rank, alpha, scale and the adapted projections.\n";

static int do_import(int argc, char **argv) {
    const char *cmd = "lora import", *dir = NULL, *out = NULL, *v;
    cmf_lora_import_opts o = {0};
    bool missing = false;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (cli_is_help(flag)) { fputs(lora_help, stdout); return CLI_EXIT_OK; }
        if (cli_flag_value(argc, argv, &i, "-o", &v, &missing)) out = v;
        else if (cli_flag_value(argc, argv, &i, "--into", &v, &missing)) o.into = v;
        else if (cli_flag_value(argc, argv, &i, "--id", &v, &missing)) o.id = v;
        else if (cli_flag_value(argc, argv, &i, "--dtype", &v, &missing)) o.dtype = v;
        else if (cli_flag_value(argc, argv, &i, "--base", &v, &missing)) o.base = v;
        else if (flag[0] == '-') return cli_usage_error(cmd, "unknown option %s (see cmf lora --help)", flag);
        else if (!dir) dir = flag;
        else return cli_usage_error(cmd, "unexpected argument %s", flag);
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
    }
    if (!dir) return cli_usage_error(cmd, "need PEFT_DIR (see cmf lora --help)");
    if (!out && !o.into) return cli_usage_error(cmd, "need -o ADAPTER.cmf or --into BASE.cmf --id ID");
    if (out && o.into) return cli_usage_error(cmd, "-o and --into exclude each other");
    if (!!o.into != !!o.id) return cli_usage_error(cmd, "--into and --id go together");
    if (o.base && o.into) return cli_usage_error(cmd, "--base goes with -o (with --into, BASE is the base)");
    if (o.dtype && strcmp(o.dtype, "f32") && strcmp(o.dtype, "f16") && strcmp(o.dtype, "bf16"))
        return cli_usage_error(cmd, "--dtype %s: f32, f16 or bf16", o.dtype);
    const char *inputs[2] = {dir, o.base};
    if (out && !cli_check_output(cmd, out, inputs, o.base ? 2 : 1)) return CLI_EXIT_USAGE;
    if (o.id && !cmf_skill_id_valid(o.id))
        return cli_usage_error(cmd, "--id '%s': a skill id is 1-64 characters of A-Z a-z 0-9 _ -", o.id);
    cmf_error err = {0};
    if (cmf_lora_import(dir, out, &o, &err) != CMF_OK) return cli_fail(cmd, &err);
    cmf_lora *l = NULL;
    cmf_file *f = NULL;
    cmf_status st = out ? cmf_lora_open(out, &l, &err) : cmf_file_open(o.into, &f, &err);
    if (!st && !out) st = cmf_lora_open_skill(f, o.id, &l, &err);
    if (st) {
        cmf_file_close(f);
        return cli_fail(cmd, &err);
    }
    cmf_lora_info info;
    cmf_lora_get_info(l, &info);
    fprintf(stderr, "cmf lora import: %s%s%s: %u projections, rank %u, alpha %g, scale %g%s\n",
            out ? out : o.into, out ? "" : " skill ", out ? "" : o.id, info.n_pairs, info.rank, (double)info.alpha,
            (double)info.scale, info.rslora ? " (rsLoRA)" : "");
    cmf_lora_free(l);
    cmf_file_close(f);
    return CLI_EXIT_OK;
}

static int do_info(int argc, char **argv) {
    const char *cmd = "lora info", *path = NULL, *id = NULL, *v;
    bool missing = false;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { fputs(lora_help, stdout); return CLI_EXIT_OK; }
        if (cli_flag_value(argc, argv, &i, "--id", &v, &missing)) id = v;
        else if (argv[i][0] == '-') return cli_usage_error(cmd, "unknown option %s", argv[i]);
        else if (!path) path = argv[i];
        else return cli_usage_error(cmd, "unexpected argument %s", argv[i]);
        if (missing) return cli_usage_error(cmd, "%s needs a value", argv[i]);
    }
    if (!path) return cli_usage_error(cmd, "need ADAPTER.cmf (see cmf lora --help)");
    cmf_error err = {0};
    cmf_lora *l = NULL;
    cmf_file *f = NULL;
    cmf_status st;
    if (id) {
        if (!cli_open_file(cmd, path, &f)) return CLI_EXIT_FAIL;
        st = cmf_lora_open_skill(f, id, &l, &err);
    } else {
        if (cli_refuse_foreign(cmd, path)) return CLI_EXIT_FAIL;
        st = cmf_lora_open(path, &l, &err);
    }
    if (st) {
        cmf_file_close(f);
        return cli_fail(cmd, &err);
    }
    cmf_lora_info info;
    cmf_lora_get_info(l, &info);
    printf("adapter: %s%s%s\n", info.path, info.skill ? " skill " : "", info.skill ? info.skill : "");
    printf("arch: %s\nrank: %u\nalpha: %g\nrslora: %s\nscale: %g\nprojections: %u\n",
           info.arch_name[0] ? info.arch_name : "(any)", info.rank, (double)info.alpha, info.rslora ? "yes" : "no",
           (double)info.scale, info.n_pairs);
    cmf_lora_free(l);
    cmf_file_close(f);
    return CLI_EXIT_OK;
}

int cmd_lora(int argc, char **argv) {
    if (argc < 2 || cli_is_help(argv[1])) {
        fputs(lora_help, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "import") == 0) return do_import(argc - 1, argv + 1);
    if (strcmp(argv[1], "info") == 0) return do_info(argc - 1, argv + 1);
    return cli_usage_error("lora", "unknown subcommand '%s' (import, info)", argv[1]);
}
