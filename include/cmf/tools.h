/*
 * cmf/tools.h — tool (function) calls: rendering OpenAI `tools` through a
 * model's chat template, parsing the calls a model writes, and a grammar
 * that forces a call (tool_choice "required" or a named function).
 *
 * Families (the output shapes cmf parses), picked from the chat template:
 *   CMF_TOOLS_HERMES   Qwen 2.5/3, Hermes, and the default (ChatML, the demo
 *                      model): <tool_call>{"name": N, "arguments": {...}}</tool_call>,
 *                      one block per call, text around them is content;
 *   CMF_TOOLS_LLAMA3   Llama 3.1+: the whole output is {"name": N, "parameters":
 *                      {...}} (or "arguments"), optionally after <|python_tag|>;
 *                      several calls separated by ';' or newlines;
 *   CMF_TOOLS_MISTRAL  Mistral: [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]
 *                      after the content.
 *
 * How a server wires tool_choice:
 *   "none"      render without tools (cmf_chat_prompt_render as usual), no parse;
 *   "auto"      cmf_tool_prompt_render with the tools; generate freely; while
 *               streaming, emit only text[0 .. cmf_tool_calls_content_prefix)
 *               and hold the rest; at the end cmf_tool_calls_parse;
 *   "required"  as auto, plus the grammar of cmf_tool_call_gbnf(only = NULL);
 *   {"type": "function", "function": {"name": N}}: cmf_tool_call_gbnf(only = N).
 *
 * Thread-safety: every function is pure (no state); call from any thread.
 */
#ifndef CMF_TOOLS_H
#define CMF_TOOLS_H

#include "cmf/policy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cmf_tool_family {
    CMF_TOOLS_HERMES = 0,
    CMF_TOOLS_LLAMA3,
    CMF_TOOLS_MISTRAL
} cmf_tool_family;

/* The family of a chat template's source (NULL = ChatML: Hermes): the
 * markers it writes (<tool_call>, [TOOL_CALLS], <|python_tag|> or a
 * Llama 3 header with tools); Hermes when none. */
cmf_tool_family cmf_tool_family_detect(const char *template_src);
/* "hermes", "llama3", "mistral". */
const char *cmf_tool_family_name(cmf_tool_family fam);

/* Render msgs with tools (tools_json: the request's `tools`, a JSON array
 * of {"type": "function", "function": {"name", "description",
 * "parameters"}}) through the file's chat template
 * (cmf_chat_prompt_render with opts->tools_json set). A template that
 * never mentions `tools` (ChatML, the demo model) would drop them: then a
 * system message describing the tools and the family's call format is
 * put first (merged into the first message when that is a system one).
 * opts may be NULL. Errors: CMF_ERR_ARG ("tools: ..." for a malformed
 * tools array: not an array, an entry without function.name), and those
 * of cmf_chat_prompt_render. *out malloc'd. */
cmf_status cmf_tool_prompt_render(const cmf_file *f, const cmf_tokenizer *tok, const cmf_chat_message *msgs,
                                  size_t n_msgs, const char *tools_json, const cmf_chat_prompt_opts *opts,
                                  char **out, size_t *len, cmf_error *err);

/* One parsed call. */
typedef struct cmf_tool_call {
    char *id;        /* "call_" + 24 hex digits: a hash of the output and the index */
    char *name;      /* the function name */
    char *arguments; /* JSON object text (compact), "{}" when the model gave none */
} cmf_tool_call;

typedef struct cmf_tool_calls {
    cmf_tool_call *calls; /* [n] */
    size_t n;
    char *content;        /* the text that is not a call (trimmed; "" when none) */
} cmf_tool_calls;

/* Parse the calls of fam out of a complete output (UTF-8, len bytes).
 * Text that looks like a call but does not parse (bad JSON, no name)
 * stays content; n = 0 means a plain answer. Errors: CMF_ERR_ARG (text or
 * out NULL), CMF_ERR_NOMEM. Free with cmf_tool_calls_free. */
cmf_status cmf_tool_calls_parse(cmf_tool_family fam, const char *text, size_t len, cmf_tool_calls *out,
                                cmf_error *err);
void cmf_tool_calls_free(cmf_tool_calls *c);

/* The text a model of fam writes for calls[0..n) (name and arguments
 * used; Hermes: one <tool_call> block per call, joined by newlines; Llama
 * 3: the call objects joined by "; "; Mistral: [TOOL_CALLS] and the
 * array). For putting an assistant turn's tool_calls back into the
 * conversation as its content when the template ignores tool_calls
 * (ChatML, the demo model); cmf_tool_calls_parse reads it back. An
 * arguments text that is not JSON is written as a JSON string. *text
 * malloc'd. Errors: CMF_ERR_ARG (NULL, a call without a name),
 * CMF_ERR_NOMEM. */
cmf_status cmf_tool_calls_text(cmf_tool_family fam, const cmf_tool_call *calls, size_t n, char **text, cmf_error *err);

/* Streaming: of the output so far (text, len bytes), the length of the
 * prefix that is content whatever comes next; the rest may still become
 * (or already is) a tool call and must be held back until the output
 * ends (then cmf_tool_calls_parse decides). Hermes/Mistral: up to the
 * start of a marker, or of a tail that is a prefix of one; Llama 3: 0
 * while the output (after leading blanks) is empty or starts like a
 * call ({ or <|python_tag|>), else all. *in_call (may be NULL) is set
 * when a call has begun for sure (a whole marker, or a leading { for
 * Llama 3). */
size_t cmf_tool_calls_content_prefix(cmf_tool_family fam, const char *text, size_t len, bool *in_call);

/* GBNF that admits exactly a valid call in fam's shape of one of the
 * tools (only == NULL: any of them, "required"; else the one named only)
 * with its arguments matching the function's parameters JSON Schema
 * (cmf_json_schema_to_gbnf's subset; absent = any object). One call
 * (a small model told "one or more" repeats calls until max_tokens):
 * Hermes: one <tool_call> block; Llama 3: one call object; Mistral:
 * [TOOL_CALLS] and a JSON array of one call. *gbnf malloc'd.
 * Errors: CMF_ERR_ARG (malformed tools, `only` not among them: "tool_choice:
 * no function named ..."), the schema converter's errors prefixed with
 * "tools[i].function.parameters", CMF_ERR_NOMEM. */
cmf_status cmf_tool_call_gbnf(cmf_tool_family fam, const char *tools_json, size_t len, const char *only,
                              char **gbnf, cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_TOOLS_H */
