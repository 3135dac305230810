/*
 * chat_prompt.h — building prompts from a model file's chat template, shared
 * by `cmf template`, `cmf chat` and `cmf run --chat` (chat_prompt.c).
 */
#ifndef CMF_CLI_CHAT_PROMPT_H
#define CMF_CLI_CHAT_PROMPT_H

#include "cmf.h"

#include <stdbool.h>
#include <stddef.h>

struct cJSON;

/* The template source of f: header.tokenizer_config.chat_template, or the
 * ChatML fallback (cmf_chatml_template) when the file has none. */
const char *cli_chat_template_source(const cmf_file *f, bool *is_fallback);

/* Add "bos_token"/"eos_token" to ctx when absent: the strings in
 * header.tokenizer_config (bos_token/eos_token, plain or {"content": ...}),
 * else the tokens of bos_token_id / eos_token_ids[0] looked up in the
 * file's tokenizer, else "". */
cmf_status cli_chat_add_special_tokens(const cmf_file *f, struct cJSON *ctx, cmf_error *err);

/* Render f's template with `messages` (a JSON array, not consumed) plus
 * add_generation_prompt, bos/eos tokens, tools=None, documents=None, and
 * enable_thinking=false when no_think. *out malloc'd. */
cmf_status cli_render_messages(const cmf_file *f, const struct cJSON *messages, bool add_generation_prompt,
                               bool no_think, char **out, size_t *len, cmf_error *err);

/* Single-turn prompt for `cmf run --chat`: optional system, then user. */
int cli_render_chat_prompt(const cmf_file *f, const char *system, const char *user, bool no_think, char **out,
                           size_t *len, cmf_error *err);

#endif /* CMF_CLI_CHAT_PROMPT_H */
