/*
 * tool_calls.c — tool calls (cmf/tools.h; in the generate module beside
 * the chat prompt it extends): the family of a chat template,
 * tools rendered into the prompt (by the template, or as a system message
 * for templates that ignore them), calls parsed out of a model's output
 * for the Hermes/Qwen, Llama 3 and Mistral shapes, the streaming hold-back
 * rule, and the grammar that forces a call (JSON Schema of
 * {name: const, arguments: parameters} per tool, through
 * cmf_json_schema_to_gbnf, wrapped in the family's markers).
 */
#include "cmf/grammar.h"

#include "cmf/tools.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define MISTRAL_MARK "[TOOL_CALLS]"
#define LLAMA_TAG "<|python_tag|>"

cmf_tool_family cmf_tool_family_detect(const char *src) {
    if (!src) return CMF_TOOLS_HERMES;
    if (strstr(src, HERMES_OPEN)) return CMF_TOOLS_HERMES;
    if (strstr(src, MISTRAL_MARK)) return CMF_TOOLS_MISTRAL;
    if (strstr(src, LLAMA_TAG) || (strstr(src, "<|start_header_id|>") && strstr(src, "tools"))) return CMF_TOOLS_LLAMA3;
    return CMF_TOOLS_HERMES;
}

const char *cmf_tool_family_name(cmf_tool_family fam) {
    switch (fam) {
    case CMF_TOOLS_LLAMA3: return "llama3";
    case CMF_TOOLS_MISTRAL: return "mistral";
    default: return "hermes";
    }
}

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The function object of a tools[] entry ({"type":"function","function":{...}}
 * or the function itself), or NULL. */
static const cJSON *tool_function(const cJSON *t) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (!cJSON_IsObject(f)) f = t;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
    return cJSON_IsString(n) && *n->valuestring ? f : NULL;
}

static cmf_status parse_tools(const char *json, size_t len, cJSON **out, cmf_error *err) {
    *out = NULL;
    if (!json) return cmf_error_set(err, CMF_ERR_ARG, "tools: NULL");
    cJSON *t = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsArray(t)) { cJSON_Delete(t); return cmf_error_set(err, CMF_ERR_ARG, "tools: not a JSON array"); }
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, t) {
        if (!tool_function(e)) { cJSON_Delete(t); return cmf_error_set(err, CMF_ERR_ARG, "tools[%d]: no function.name", i); }
        i++;
    }
    *out = t;
    return CMF_OK;
}

/* ---- rendering ------------------------------------------------------------ */

static const char *call_format(cmf_tool_family fam) {
    switch (fam) {
    case CMF_TOOLS_LLAMA3: return "{\"name\": FUNCTION_NAME, \"parameters\": ARGUMENTS_OBJECT}";
    case CMF_TOOLS_MISTRAL: return MISTRAL_MARK "[{\"name\": FUNCTION_NAME, \"arguments\": ARGUMENTS_OBJECT}]";
    default: return HERMES_OPEN "\n{\"name\": FUNCTION_NAME, \"arguments\": ARGUMENTS_OBJECT}\n" HERMES_CLOSE;
    }
}

cmf_status cmf_tool_prompt_render(const cmf_file *f, const cmf_tokenizer *tok, const cmf_chat_message *msgs,
                                  size_t n_msgs, const char *tools_json, const cmf_chat_prompt_opts *opts,
                                  char **out, size_t *len, cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tool_prompt_render: out is NULL");
    *out = NULL;
    cJSON *tools;
    cmf_status st = parse_tools(tools_json, tools_json ? strlen(tools_json) : 0, &tools, err);
    if (st) return st;
    cmf_chat_prompt_opts o = opts ? *opts : cmf_chat_prompt_default_opts();
    o.tools_json = tools_json;
    const char *src = cmf_model_chat_template(f, NULL);
    if (strstr(src, "tools")) { /* the template renders them itself */
        cJSON_Delete(tools);
        return cmf_chat_prompt_render(f, tok, msgs, n_msgs, &o, out, len, err);
    }
    /* A system message that lists the tools and the call format. */
    cmf_tool_family fam = cmf_tool_family_detect(src);
    size_t cap = 1024 + (msgs && n_msgs && !strcmp(msgs[0].role ? msgs[0].role : "", "system") && msgs[0].content ? strlen(msgs[0].content) : 0);
    const cJSON *e;
    char **lines = calloc((size_t)cJSON_GetArraySize(tools) + 1, sizeof *lines);
    int k = 0;
    bool oom = !lines;
    cJSON_ArrayForEach(e, tools) {
        if (oom) break;
        lines[k] = cJSON_PrintUnformatted(tool_function(e));
        if (!lines[k]) oom = true;
        else cap += strlen(lines[k]) + 1;
        k++;
    }
    char *sys = oom ? NULL : malloc(cap);
    cmf_chat_message *m2 = oom ? NULL : malloc((n_msgs + 1) * sizeof *m2);
    if (!sys || !m2) {
        st = cmf_error_set(err, CMF_ERR_NOMEM, "tools: out of memory");
    } else {
        bool merge = n_msgs && msgs[0].role && !strcmp(msgs[0].role, "system") && msgs[0].content;
        size_t n = 0;
        if (merge) n += (size_t)snprintf(sys + n, cap - n, "%s\n\n", msgs[0].content);
        n += (size_t)snprintf(sys + n, cap - n,
                              "You can call these functions (tools), described in JSON Schema, one per line:\n<tools>\n");
        for (int i = 0; i < k; i++) n += (size_t)snprintf(sys + n, cap - n, "%s\n", lines[i]);
        snprintf(sys + n, cap - n,
                 "</tools>\nTo call one, answer with exactly this and nothing else, arguments as a JSON object:\n%s",
                 call_format(fam));
        size_t j = 0;
        m2[j++] = (cmf_chat_message){.role = "system", .content = sys, .extra_json = merge ? msgs[0].extra_json : NULL};
        for (size_t i = merge ? 1 : 0; i < n_msgs; i++) m2[j++] = msgs[i];
        o.tools_json = NULL;
        st = cmf_chat_prompt_render(f, tok, m2, j, &o, out, len, err);
    }
    for (int i = 0; lines && i < k; i++) free(lines[i]);
    free(lines);
    free(sys);
    free(m2);
    cJSON_Delete(tools);
    return st;
}

/* ---- parsing ---------------------------------------------------------------- */

typedef struct { char *p; size_t n, cap; bool oom; } buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) { b->oom = true; return; }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static const char *find(const char *s, size_t n, const char *pat) {
    size_t m = strlen(pat);
    for (size_t i = 0; i + m <= n; i++)
        if (s[i] == pat[0] && !memcmp(s + i, pat, m)) return s + i;
    return NULL;
}

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* Add the call of JSON object o (name + arguments/parameters); false when
 * o is not a call. */
static bool add_call(cmf_tool_calls *c, const cJSON *o, uint64_t h, bool *oom) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsObject(o) || !cJSON_IsString(name) || !*name->valuestring) return false;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    cmf_tool_call *v = realloc(c->calls, (c->n + 1) * sizeof *v);
    if (!v) { *oom = true; return false; }
    c->calls = v;
    cmf_tool_call *t = &c->calls[c->n];
    memset(t, 0, sizeof *t);
    t->id = malloc(32);
    t->name = strdup(name->valuestring);
    if (!args) t->arguments = strdup("{}");
    else if (cJSON_IsString(args)) t->arguments = strdup(args->valuestring);
    else t->arguments = cJSON_PrintUnformatted(args);
    if (!t->id || !t->name || !t->arguments) {
        free(t->id); free(t->name); free(t->arguments);
        *oom = true;
        return false;
    }
    snprintf(t->id, 32, "call_%016llx%08x", (unsigned long long)h, (unsigned)c->n);
    c->n++;
    return true;
}

/* Parse one JSON value at s[0..n): the value (or NULL) and its end. */
static cJSON *json_at(const char *s, size_t n, const char **end) {
    const char *e = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &e, 0);
    *end = v ? e : s;
    return v;
}

static void trim_into(char **dst, const char *s, size_t n, bool *oom) {
    while (n && is_blank(*s)) { s++; n--; }
    while (n && is_blank(s[n - 1])) n--;
    *dst = malloc(n + 1);
    if (!*dst) { *oom = true; return; }
    memcpy(*dst, s, n);
    (*dst)[n] = 0;
}

cmf_status cmf_tool_calls_parse(cmf_tool_family fam, const char *text, size_t len, cmf_tool_calls *out,
                                cmf_error *err) {
    if (!text || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tool_calls_parse: NULL argument");
    memset(out, 0, sizeof *out);
    uint64_t h = fnv(text, len);
    bool oom = false;
    buf content = {0};
    const char *p = text, *end = text + len;
    if (fam == CMF_TOOLS_HERMES) {
        const char *k;
        while ((k = find(p, (size_t)(end - p), HERMES_OPEN))) {
            put(&content, p, (size_t)(k - p));
            const char *j = k + strlen(HERMES_OPEN), *je;
            cJSON *o = json_at(j, (size_t)(end - j), &je);
            if (o && add_call(out, o, h, &oom)) {
                while (je < end && is_blank(*je)) je++;
                if ((size_t)(end - je) >= strlen(HERMES_CLOSE) && !memcmp(je, HERMES_CLOSE, strlen(HERMES_CLOSE))) je += strlen(HERMES_CLOSE);
                p = je;
            } else {
                put(&content, k, strlen(HERMES_OPEN));
                p = j;
            }
            cJSON_Delete(o);
            if (oom) break;
        }
        put(&content, p, (size_t)(end - p));
    } else if (fam == CMF_TOOLS_MISTRAL) {
        const char *k = find(p, len, MISTRAL_MARK);
        if (k) {
            put(&content, p, (size_t)(k - p));
            const char *j = k + strlen(MISTRAL_MARK), *je;
            cJSON *arr = json_at(j, (size_t)(end - j), &je);
            const cJSON *o;
            size_t before = out->n;
            if (cJSON_IsArray(arr)) cJSON_ArrayForEach(o, arr) add_call(out, o, h, &oom);
            else if (cJSON_IsObject(arr)) add_call(out, arr, h, &oom);
            cJSON_Delete(arr);
            p = out->n > before ? je : k;
        }
        put(&content, p, (size_t)(end - p));
    } else { /* Llama 3: the output is the call(s) */
        const char *q = p;
        while (q < end && is_blank(*q)) q++;
        if ((size_t)(end - q) >= strlen(LLAMA_TAG) && !memcmp(q, LLAMA_TAG, strlen(LLAMA_TAG))) q += strlen(LLAMA_TAG);
        for (;;) {
            while (q < end && (is_blank(*q) || *q == ';')) q++;
            if (q >= end || *q != '{') break;
            const char *je;
            cJSON *o = json_at(q, (size_t)(end - q), &je);
            bool ok = o && add_call(out, o, h, &oom);
            cJSON_Delete(o);
            if (!ok) break;
            q = je;
        }
        if (out->n) p = q;
        put(&content, p, (size_t)(end - p));
    }
    if (!oom && !content.oom) trim_into(&out->content, content.p ? content.p : "", content.n, &oom);
    free(content.p);
    if (oom || content.oom) {
        cmf_tool_calls_free(out);
        return cmf_error_set(err, CMF_ERR_NOMEM, "tool calls: out of memory");
    }
    return CMF_OK;
}

void cmf_tool_calls_free(cmf_tool_calls *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) { free(c->calls[i].id); free(c->calls[i].name); free(c->calls[i].arguments); }
    free(c->calls);
    free(c->content);
    memset(c, 0, sizeof *c);
}

cmf_status cmf_tool_calls_text(cmf_tool_family fam, const cmf_tool_call *calls, size_t n, char **text, cmf_error *err) {
    if (!text || (n && !calls)) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tool_calls_text: NULL argument");
    *text = NULL;
    buf b = {0};
    cJSON *arr = fam == CMF_TOOLS_MISTRAL ? cJSON_CreateArray() : NULL;
    bool oom = fam == CMF_TOOLS_MISTRAL && !arr;
    for (size_t i = 0; i < n && !oom; i++) {
        if (!calls[i].name || !*calls[i].name) {
            cJSON_Delete(arr);
            free(b.p);
            return cmf_error_set(err, CMF_ERR_ARG, "tool call %zu: no name", i);
        }
        const char *key = fam == CMF_TOOLS_LLAMA3 ? "parameters" : "arguments";
        cJSON *o = cJSON_CreateObject();
        cJSON *args = calls[i].arguments ? cJSON_Parse(calls[i].arguments) : cJSON_CreateObject();
        if (!args && calls[i].arguments) args = cJSON_CreateString(calls[i].arguments);
        if (!o || !args || !cJSON_AddStringToObject(o, "name", calls[i].name) || !cJSON_AddItemToObject(o, key, args)) {
            if (!o || !cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_Delete(args);
            cJSON_Delete(o);
            oom = true;
            break;
        }
        if (arr) { if (!cJSON_AddItemToArray(arr, o)) { cJSON_Delete(o); oom = true; } continue; }
        char *t = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!t) { oom = true; break; }
        if (i) put(&b, fam == CMF_TOOLS_LLAMA3 ? "; " : "\n", fam == CMF_TOOLS_LLAMA3 ? 2 : 1);
        if (fam == CMF_TOOLS_HERMES) put(&b, HERMES_OPEN "\n", strlen(HERMES_OPEN) + 1);
        put(&b, t, strlen(t));
        if (fam == CMF_TOOLS_HERMES) put(&b, "\n" HERMES_CLOSE, strlen(HERMES_CLOSE) + 1);
        free(t);
    }
    if (arr && !oom) {
        char *t = cJSON_PrintUnformatted(arr);
        if (!t) oom = true;
        else { put(&b, MISTRAL_MARK, strlen(MISTRAL_MARK)); put(&b, t, strlen(t)); free(t); }
    }
    cJSON_Delete(arr);
    if (!oom && !b.oom && !b.p) put(&b, "", 0);
    if (oom || b.oom) { free(b.p); return cmf_error_set(err, CMF_ERR_NOMEM, "tool calls: out of memory"); }
    *text = b.p;
    return CMF_OK;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of m. */
static size_t partial_tail(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

size_t cmf_tool_calls_content_prefix(cmf_tool_family fam, const char *text, size_t len, bool *in_call) {
    if (in_call) *in_call = false;
    if (!text) return 0;
    if (fam == CMF_TOOLS_LLAMA3) {
        size_t i = 0;
        while (i < len && is_blank(text[i])) i++;
        size_t rest = len - i, tl = strlen(LLAMA_TAG);
        if (rest == 0) return 0;
        if (text[i] == '{' || (rest >= tl && !memcmp(text + i, LLAMA_TAG, tl))) {
            if (in_call) *in_call = true;
            return 0;
        }
        if (rest < tl && !memcmp(text + i, LLAMA_TAG, rest)) return 0;
        return len;
    }
    const char *mark = fam == CMF_TOOLS_MISTRAL ? MISTRAL_MARK : HERMES_OPEN;
    const char *k = find(text, len, mark);
    if (k) {
        if (in_call) *in_call = true;
        return (size_t)(k - text);
    }
    return len - partial_tail(text, len, mark);
}

/* ---- the forcing grammar ------------------------------------------------------ */

cmf_status cmf_tool_call_gbnf(cmf_tool_family fam, const char *tools_json, size_t len, const char *only, char **gbnf,
                              cmf_error *err) {
    if (!gbnf) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tool_call_gbnf: gbnf is NULL");
    *gbnf = NULL;
    cJSON *tools;
    cmf_status st = parse_tools(tools_json, len, &tools, err);
    if (st) return st;
    const char *args_key = fam == CMF_TOOLS_LLAMA3 ? "parameters" : "arguments";
    cJSON *schema = cJSON_CreateObject(), *any = schema ? cJSON_AddArrayToObject(schema, "anyOf") : NULL;
    bool oom = !any;
    const cJSON *e;
    int n = 0;
    cJSON_ArrayForEach(e, tools) {
        if (oom) break;
        const cJSON *f = tool_function(e);
        const char *name = cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring;
        if (only && strcmp(only, name)) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        cJSON *call = cJSON_CreateObject();
        if (!call || !cJSON_AddItemToArray(any, call)) { cJSON_Delete(call); oom = true; break; } /* owned by schema now */
        cJSON *props = cJSON_AddObjectToObject(call, "properties");
        cJSON *nm = props ? cJSON_AddObjectToObject(props, "name") : NULL;
        cJSON *args = params ? cJSON_Duplicate(params, 1) : cJSON_CreateObject();
        if (args && (!props || !cJSON_AddItemToObject(props, args_key, args))) { cJSON_Delete(args); args = NULL; }
        cJSON *req = cJSON_AddArrayToObject(call, "required");
        oom = !props || !nm || !args || !req || !cJSON_AddStringToObject(call, "type", "object") ||
              !cJSON_AddStringToObject(nm, "const", name) || (!params && !cJSON_AddStringToObject(args, "type", "object")) ||
              !cJSON_AddItemToArray(req, cJSON_CreateString("name")) || !cJSON_AddItemToArray(req, cJSON_CreateString(args_key)) ||
              !cJSON_AddFalseToObject(call, "additionalProperties");
        n++;
    }
    /* $defs of the tools' parameters stay reachable: lift them to the root */
    cJSON_ArrayForEach(e, tools) {
        if (oom) break;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(tool_function(e), "parameters");
        const char *keys[] = {"$defs", "definitions"};
        for (int k = 0; k < 2 && !oom; k++) {
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(params, keys[k]), *x;
            if (!cJSON_IsObject(d)) continue;
            cJSON *dst = cJSON_GetObjectItemCaseSensitive(schema, keys[k]);
            if (!dst && !(dst = cJSON_AddObjectToObject(schema, keys[k]))) { oom = true; break; }
            cJSON_ArrayForEach(x, d)
                if (!cJSON_GetObjectItemCaseSensitive(dst, x->string)) {
                    cJSON *dup = cJSON_Duplicate(x, 1);
                    if (!dup || !cJSON_AddItemToObject(dst, x->string, dup)) { cJSON_Delete(dup); oom = true; break; }
                }
        }
    }
    cJSON_Delete(tools);
    if (oom) { cJSON_Delete(schema); return cmf_error_set(err, CMF_ERR_NOMEM, "tools: out of memory"); }
    if (!n) {
        cJSON_Delete(schema);
        return only ? cmf_error_set(err, CMF_ERR_ARG, "tool_choice: no function named '%s' in tools", only)
                    : cmf_error_set(err, CMF_ERR_ARG, "tool_choice required: tools is empty");
    }
    char *sj = cJSON_PrintUnformatted(schema);
    cJSON_Delete(schema);
    if (!sj) return cmf_error_set(err, CMF_ERR_NOMEM, "tools: out of memory");
    char *calls = NULL;
    st = cmf_json_schema_to_gbnf(sj, strlen(sj), &calls, err);
    free(sj);
    if (st) return cmf_error_prefix(err, "tools (function parameters)");
    /* "root ::= X\n..." -> "tool-call ::= X\n..." under the family's root */
    static const char *const roots[] = {
        [CMF_TOOLS_HERMES] = "root ::= \"" HERMES_OPEN "\" \"\\n\"? tool-call \"</tool_call>\"\n",
        [CMF_TOOLS_LLAMA3] = "root ::= tool-call\n",
        [CMF_TOOLS_MISTRAL] = "root ::= \"[TOOL_CALLS]\" \"[\" space tool-call \"]\"\n",
    };
    const char *root = roots[fam <= CMF_TOOLS_MISTRAL ? fam : CMF_TOOLS_HERMES];
    assert(!strncmp(calls, "root ::= ", 9));
    size_t need = strlen(root) + strlen(calls) + 16;
    char *g = malloc(need);
    if (!g) { free(calls); return cmf_error_set(err, CMF_ERR_NOMEM, "tools: out of memory"); }
    snprintf(g, need, "%stool-call ::= %s", root, calls + 9);
    free(calls);
    *gbnf = g;
    return CMF_OK;
}
