/*
 * cmf/policy.h — a model file's generation policy: which token ids end a
 * generation (the stop-id set), whether a prompt's token ids start with
 * BOS (the BOS rule), and the chat prompt built from a list of messages
 * with the file's chat template (ChatML when it has none). `cmf run`,
 * `cmf chat` and a program embedding libcmf call these, so they all
 * prompt and stop the same way. Implementation: src/generate/policy.c.
 *
 * Inputs are the open file (its header.tokenizer_config, format §2/§6;
 * the keys importers write are in docs/ARCH_KEYS.md) and the tokenizer
 * loaded from its tokenizer section (cmf_tokenizer_load_json of
 * cmf_file_tokenizer_json, or cmf_tokenizer_load_path of the .cmf file).
 * No cJSON type appears here: a program needs only cmf.h and -lcmf.
 *
 * Thread-safety: every function only reads f and tok (both immutable once
 * opened/loaded) and keeps no state; call them from any thread.
 */
#ifndef CMF_POLICY_H
#define CMF_POLICY_H

#include "cmf/format.h"
#include "cmf/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- stop ids and stop strings ------------------------------------------ */

/* The ids on which a generation stops (cmf_gen_params.eos_ids), in this
 * order, each once:
 *   1. header.tokenizer_config.eos_token_ids (every EOS id the importer
 *      merged from generation_config.json, config.json and
 *      tokenizer_config.json, the primary first), then its legacy
 *      eos_token_id (a number or a list);
 *   2. header.generation_config.eos_token_id (a number or a list), for
 *      files that carry a generation_config object;
 *   3. the tokenizer's EOS (cmf_tokenizer_eos_id) and the id of the
 *      tokenizer_config.eos_token string when it is a token;
 *   4. with chat = true (the prompt was rendered with the chat template):
 *      the ids of the end-of-turn markers the template writes
 *      (<|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>, <|eom_id|>,
 *      <|END_OF_TURN_TOKEN|>, <turn|>, <|return|>, <|endoftext|>, </s>)
 *      that are single tokens of tok; see cmf_model_chat_stop_strings for
 *      the others.
 * Values that are not integers in [0, 2^31) are ignored, and the set
 * holds at most CMF_MODEL_EOS_MAX ids (a file listing more distinct ones
 * gets the first of them). f or tok may be NULL (then their part is
 * skipped; chat markers need tok). Writes at most cap ids to out (out may
 * be NULL) and returns the size of the whole set, like snprintf: a buffer
 * of CMF_MODEL_EOS_MAX always suffices, or call with cap 0 to size one. */
#define CMF_MODEL_EOS_MAX 256
size_t cmf_model_eos_ids(const cmf_file *f, const cmf_tokenizer *tok, bool chat, int32_t *out, size_t cap);

/* The end-of-turn markers of the list above that the chat template writes
 * but that are not a single token of tok (all of them when tok is NULL),
 * to pass as stop strings (cmf_gen_params.stop_strings) for a chat prompt;
 * "</s>" is never one (it is ordinary text in many vocabularies). The
 * strings are static (never freed). Writes at most cap of them and returns
 * how many there are, like cmf_model_eos_ids. f may be NULL (ChatML). */
size_t cmf_model_chat_stop_strings(const cmf_file *f, const cmf_tokenizer *tok, const char **out, size_t cap);

/* ---- BOS rule ------------------------------------------------------------- */

/* Whether the token ids of a prompt must start with BOS, and which id
 * (*bos_id, may be NULL; -1 when the answer is false).
 *   chat = false, a raw prompt (as Hugging Face `tokenizer(text)`): true
 *     when header.tokenizer_config.add_bos_token is true (the id is its
 *     bos_token_id, else the id of its bos_token string, else the
 *     tokenizer's BOS), or when the tokenizer's post-processor adds a BOS
 *     (cmf_tokenizer_bos_id >= 0);
 *   chat = true, a prompt rendered by cmf_chat_prompt_render (as
 *     transformers' apply_chat_template): false, the template writes BOS
 *     itself when the model wants one (bos_token).
 * f or tok may be NULL. */
bool cmf_model_add_bos(const cmf_file *f, const cmf_tokenizer *tok, bool chat, int32_t *bos_id);

/* Encode a prompt by the BOS rule: a raw prompt (chat = false) with
 * add_special = true (the post-processor's BOS/EOS) and then the BOS of
 * cmf_model_add_bos prepended when it does not lead already; a rendered
 * chat prompt with add_special = false and nothing added. text is UTF-8 of
 * len bytes; *ids is malloc'd, *n_ids its length (may be 0). f may be NULL.
 * Errors: CMF_ERR_ARG (tok, text, ids or n_ids NULL), CMF_ERR_NOMEM, and
 * those of cmf_tokenizer_encode. */
cmf_status cmf_model_encode_prompt(const cmf_file *f, const cmf_tokenizer *tok, const char *text, size_t len,
                                   bool chat, int32_t **ids, size_t *n_ids, cmf_error *err);

/* ---- chat prompt ---------------------------------------------------------- */

/* The chat template source: header.tokenizer_config.chat_template, or the
 * ChatML fallback (cmf_chatml_template, format §6) when the file has none
 * or f is NULL; *is_fallback (may be NULL) says which. Owned by f (or
 * static). */
const char *cmf_model_chat_template(const cmf_file *f, bool *is_fallback);

/* The strings a chat template gets as bos_token and eos_token:
 * header.tokenizer_config.bos_token / eos_token (a string or
 * {"content": string}), else the token of bos_token_id / of the first
 * eos_token_ids (or eos_token_id) looked up in tok, else "". When tok is
 * NULL and an id must be looked up, the file's tokenizer section is loaded
 * for it. *bos and *eos (either may be NULL: not wanted) are malloc'd.
 * f may be NULL ("" for both). Errors: CMF_ERR_NOMEM; the tokenizer
 * section's load errors, prefixed "<path>: tokenizer". */
cmf_status cmf_model_special_tokens(const cmf_file *f, const cmf_tokenizer *tok, char **bos, char **eos,
                                    cmf_error *err);

/* One message of a conversation. */
typedef struct cmf_chat_message {
    const char *role;       /* "system", "user", "assistant", "tool", ... (UTF-8) */
    const char *content;    /* the text (UTF-8) */
    const char *extra_json; /* NULL, or the text of a JSON object whose members are
                               added to the message for the template, e.g.
                               {"reasoning_content": "...", "tool_calls": [...]} */
} cmf_chat_message;

/* enable_thinking as the template sees it. */
typedef enum cmf_chat_think {
    CMF_THINK_DEFAULT = 0, /* not set: the template's own default */
    CMF_THINK_OFF,         /* enable_thinking = false (e.g. `cmf chat --no-think`) */
    CMF_THINK_ON           /* enable_thinking = true */
} cmf_chat_think;

typedef struct cmf_chat_prompt_opts {
    bool add_generation_prompt;   /* end with the assistant's header (default true) */
    cmf_chat_think enable_thinking; /* default CMF_THINK_DEFAULT */
    const char *bos_token;        /* NULL (default) = the model's (cmf_model_special_tokens) */
    const char *eos_token;        /* NULL (default) = the model's */
    int64_t now;                  /* strftime_now clock, seconds since the epoch (UTC);
                                     < 0 (default -1) = the real clock */
    const char *tools_json;       /* NULL (default) = tools None; else the text of a JSON
                                     array (OpenAI's tools: {"type": "function", "function":
                                     {...}}) the template gets as tools; cmf/tools.h renders
                                     them for templates that ignore tools */
} cmf_chat_prompt_opts;

/* The defaults above (add_generation_prompt true, now -1). */
cmf_chat_prompt_opts cmf_chat_prompt_default_opts(void);

/* Render msgs[0..n_msgs) with the file's chat template
 * (cmf_model_chat_template) the way transformers' apply_chat_template
 * does: the context has messages, tools = None, documents = None,
 * add_generation_prompt, bos_token, eos_token, and enable_thinking unless
 * CMF_THINK_DEFAULT (tools: opts->tools_json, else None). opts NULL = cmf_chat_prompt_default_opts(). tok is
 * used for the special-token strings (NULL: loaded from f when needed).
 * f may be NULL (ChatML, bos/eos ""). Tokenize the result with
 * cmf_model_encode_prompt(chat = true). *out is malloc'd and
 * NUL-terminated, *len (may be NULL) its length in bytes.
 * Errors: CMF_ERR_ARG (out NULL, msgs NULL with n_msgs > 0, a message
 * without role or content, an extra_json that is not a JSON object: named
 * "messages[i]..."; a tools_json that is not a JSON array: "tools"), CMF_ERR_NOMEM, CMF_ERR_FORMAT (the template does not
 * parse), CMF_ERR_RENDER / CMF_ERR_LIMIT (it raises or fails; message
 * "NAME:LINE:COL: ..." with NAME the file's path or "chatml"). */
cmf_status cmf_chat_prompt_render(const cmf_file *f, const cmf_tokenizer *tok, const cmf_chat_message *msgs,
                                  size_t n_msgs, const cmf_chat_prompt_opts *opts, char **out, size_t *len,
                                  cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_POLICY_H */
