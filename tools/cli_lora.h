/*
 * cli_lora.h — the LoRA flags that run, chat, logits, ppl and bench share
 * (tools/cli_lora.c): --lora FILE[:SCALE] (repeatable, llama.cpp's flag)
 * and --lora-scaled FILE SCALE, parsed into a list, then opened and
 * resolved into one weight set of the model (cmf_model_weight_set_overlay).
 */
#ifndef CMF_CLI_LORA_H
#define CMF_CLI_LORA_H

#include "cmf.h"

#include <stdbool.h>

typedef struct cli_lora {
    const char *path[CMF_MODEL_MAX_LORA];
    char split[CMF_MODEL_MAX_LORA][4096]; /* FILE of FILE:SCALE (parsing allocates nothing) */
    float scale[CMF_MODEL_MAX_LORA];
    cmf_lora *lora[CMF_MODEL_MAX_LORA]; /* after cli_lora_open */
    size_t n;
} cli_lora;

/* The help lines of the flags. */
extern const char cli_lora_help[];

/* When argv[*i] is --lora or --lora-scaled: parse its value(s) into l,
 * advance *i, return 1; a usage error (missing value, a SCALE that is not
 * a finite number, too many adapters) is printed and returns -1; any other
 * argument returns 0. FILE:SCALE: when FILE:SCALE itself is not an
 * existing file and the text after the last ':' is a number, that is the
 * scale (default 1). */
int cli_lora_flag(const char *cmd, int argc, char **argv, int *i, cli_lora *l);
/* Open every adapter and resolve the weight set of all of them (stacked,
 * in flag order) over the weight set *ws names on entry (0 the backbone,
 * or the skill/blend --skill/--route/--blend resolved): *ws on return
 * (unchanged when there are none). Prints the error ("cmf <cmd>: ADAPTER:
 * ...") and returns false. */
bool cli_lora_apply(const char *cmd, cmf_model *m, cli_lora *l, uint32_t *ws);
/* Open the adapters only (cli_lora_apply does it); false after printing. */
bool cli_lora_open(const char *cmd, cli_lora *l);
/* Free the adapters (after the model); nothing to free before cli_lora_apply. */
void cli_lora_free(cli_lora *l);

#endif /* CMF_CLI_LORA_H */
