/*
 * chat_prompt.h — the CLI's glue to the library's chat prompt
 * (cmf_chat_prompt_render, cmf/policy.h): `cmf chat` keeps its
 * conversation as a JSON array of messages (what /save and /load write),
 * `cmf run --chat` has one system and one user text (chat_prompt.c).
 */
#ifndef CMF_CLI_CHAT_PROMPT_H
#define CMF_CLI_CHAT_PROMPT_H

#include "cmf.h"

#include <stdbool.h>
#include <stddef.h>

struct cJSON;

/* Render f's template with `messages` (a JSON array of objects with string
 * "role" and "content", not consumed; their other members reach the
 * template too) and add_generation_prompt; enable_thinking=false when
 * no_think. tok may be NULL. *out malloc'd. */
cmf_status cli_render_messages(const cmf_file *f, const cmf_tokenizer *tok, const struct cJSON *messages,
                               bool no_think, char **out, size_t *len, cmf_error *err);

/* Single-turn prompt for `cmf run --chat`: optional system, then user. */
int cli_render_chat_prompt(const cmf_file *f, const char *system, const char *user, bool no_think, char **out,
                           size_t *len, cmf_error *err);

#endif /* CMF_CLI_CHAT_PROMPT_H */
