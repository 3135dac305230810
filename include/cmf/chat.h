/*
 * cmf/chat.h — chat templates: a Jinja2 engine with the semantics Hugging
 * Face transformers uses (jinja2 ImmutableSandboxedEnvironment with
 * trim_blocks=True, lstrip_blocks=True, loop controls, tojson with
 * ensure_ascii=False and kept key order, raise_exception, strftime_now).
 *
 * Reference: jinja2 3.x templates documentation; transformers
 * `utils/chat_template_utils.py` (_compile_jinja_template, render).
 *
 * Thread-safety: a parsed cmf_template is immutable; rendering it from
 * several threads at once is safe.
 */
#ifndef CMF_CHAT_H
#define CMF_CHAT_H

#include "cmf/core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;
typedef struct cmf_template cmf_template;

/* Parse template source. `name` is used in error messages
 * ("NAME:LINE:COL: message"). Errors: CMF_ERR_FORMAT (syntax),
 * CMF_ERR_NOMEM, CMF_ERR_LIMIT (nesting too deep). */
cmf_status cmf_template_parse(const char *src, size_t len, const char *name, cmf_template **out,
                              cmf_error *err);
void cmf_template_free(cmf_template *t);

typedef struct cmf_render_opts {
    /* Fixed "now" for strftime_now, seconds since the epoch (UTC);
     * < 0 = the real clock. */
    int64_t now;
    size_t max_output_bytes;  /* 0 = default (16 MiB) */
    size_t max_loop_iterations; /* total across the render; 0 = default (1e6) */
    int max_recursion;        /* macro/call/include depth; 0 = default (64) */
    /* Evaluation work across the render, in steps: one expression node or
     * statement, one element compared, looked up or visited, or 64 bytes
     * copied or scanned (about 10-50 ns each). Bounds the time of a render
     * whose loops, sorts and searches stay under the other limits.
     * 0 = default (1e8). Over it: CMF_ERR_LIMIT. */
    uint64_t max_work;
} cmf_render_opts;

/* Render with `context` (a JSON object: every key becomes a top-level
 * variable, e.g. messages, tools, add_generation_prompt, bos_token...).
 * cJSON keeps no int/float distinction, so integral numbers arrive as ints
 * (1.0 renders "1"); cmf_template_render_json below keeps them exact.
 * *out is malloc'd, NUL-terminated; *len its length in bytes.
 * Errors: CMF_ERR_RENDER (raise_exception, type errors, undefined
 * attribute), CMF_ERR_LIMIT; the message carries name:line:col. opts may
 * be NULL. */
cmf_status cmf_template_render(const cmf_template *t, const struct cJSON *context,
                               const cmf_render_opts *opts, char **out, size_t *len,
                               cmf_error *err);

/* Same, with the context as JSON text. Unlike the cJSON form this keeps
 * Python's int/float distinction (1.0 renders as "1.0", 1 as "1"), ints
 * beyond 64 bits exactly (up to Python's 4300 digits), and strings holding
 * U+0000, as transformers would see them. Errors also
 * CMF_ERR_FORMAT for invalid JSON (with the byte offset) and CMF_ERR_ARG
 * when the top level is not an object. */
cmf_status cmf_template_render_json(const cmf_template *t, const char *context_json, size_t json_len,
                                    const cmf_render_opts *opts, char **out, size_t *len,
                                    cmf_error *err);

/* ChatML template used for files that carry none (§6). */
extern const char *const cmf_chatml_template;

#ifdef __cplusplus
}
#endif
#endif /* CMF_CHAT_H */
