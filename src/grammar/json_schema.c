/*
 * json_schema.c — JSON Schema -> GBNF (cmf_json_schema_to_gbnf) and the
 * any-JSON-object grammar of response_format json_object.
 *
 * Each schema becomes one rule matching its JSON text followed by optional
 * whitespace (`space`); the primitives (string, number, integer, boolean,
 * null, any value) are shared rules added once. An object's properties
 * come in the order the schema lists them, required ones mandatory,
 * optional ones skippable, with the commas right: rules first-i ("no
 * member written yet, properties i.. left") and rest-i ("at least one
 * written") make this linear in the number of properties. Extra members
 * (additionalProperties true, absent or a schema) may follow the listed
 * ones. $ref to #/$defs/NAME or #/definitions/NAME becomes a rule named
 * after the definition, emitted once (so recursive schemas work). Number
 * digits are bounded (16 integer digits, 16 fraction, 3 exponent) and
 * whitespace runs are short so a weak model cannot loop inside a number
 * or between tokens. The shape follows llama.cpp's json-schema-to-grammar
 * (its primitives' bounds); the code is ours.
 */
#include "grammar_internal.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRIM_SPACE "space ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"
#define PRIM_CHAR "json-char ::= [^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
#define PRIM_STRING "string ::= \"\\\"\" json-char* \"\\\"\" space\n"
#define PRIM_INTEGER "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) space\n"
#define PRIM_NUMBER "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? space\n"
#define PRIM_BOOLEAN "boolean ::= (\"true\" | \"false\") space\n"
#define PRIM_NULL "null ::= \"null\" space\n"
#define PRIM_VALUE \
    "value ::= object | array | string | number | boolean | null\n" \
    "object ::= \"{\" space (string \":\" space value (\",\" space string \":\" space value)*)? \"}\" space\n" \
    "array ::= \"[\" space (value (\",\" space value)*)? \"]\" space\n"

const char *cmf_json_object_gbnf(void) {
    return "root ::= object\n" PRIM_VALUE PRIM_STRING PRIM_CHAR PRIM_NUMBER PRIM_BOOLEAN PRIM_NULL PRIM_SPACE;
}

enum { P_SPACE = 1, P_CHAR = 2, P_STRING = 4, P_INTEGER = 8, P_NUMBER = 16, P_BOOLEAN = 32, P_NULL = 64, P_VALUE = 128 };

typedef struct { char *p; size_t n, cap; bool oom; } sbuf;

static void sb_vprintf(sbuf *b, const char *fmt, va_list ap) {
    if (b->oom) return;
    va_list ap2;
    va_copy(ap2, ap);
    int k = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (k < 0) { b->oom = true; return; }
    if (b->n + (size_t)k + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 1024;
        while (c < b->n + (size_t)k + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) { b->oom = true; return; }
        b->p = q;
        b->cap = c;
    }
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    b->n += (size_t)k;
}

static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(b, fmt, ap);
    va_end(ap);
}

/* s as a GBNF literal ("..." with \" \\ and control characters escaped). */
static void sb_literal(sbuf *b, const char *s) {
    sb_printf(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') sb_printf(b, "\\%c", *c);
        else if (*c == '\n') sb_printf(b, "\\n");
        else if (*c < 0x20 || *c == 0x7F) sb_printf(b, "\\x%02X", *c);
        else sb_printf(b, "%c", *c);
    }
    sb_printf(b, "\"");
}

typedef struct {
    char *ref;   /* "#/$defs/NAME" */
    char *rule;
} refmap;

typedef struct {
    sbuf out;
    const cJSON *doc;
    unsigned prims;
    unsigned counter;
    refmap *refs;
    size_t n_refs, cap_refs;
    cmf_error *err;
    cmf_status st;
    int depth;
} conv;

static bool cfail(conv *c, cmf_status st, const char *path, const char *fmt, ...) {
    if (c->st) return false;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = cmf_error_set(c->err, st, "schema at %s: %s", *path ? path : "/", msg);
    return false;
}

/* A fresh rule name into name[64]. */
static void new_name(conv *c, const char *hint, char *name) {
    snprintf(name, 64, "%s-%u", hint, ++c->counter);
}

static const char *prim(conv *c, unsigned which) {
    c->prims |= which | P_SPACE;
    if (which & P_STRING) c->prims |= P_CHAR;
    if (which & P_VALUE) c->prims |= P_STRING | P_CHAR | P_NUMBER | P_BOOLEAN | P_NULL;
    switch (which) {
    case P_STRING: return "string";
    case P_INTEGER: return "integer";
    case P_NUMBER: return "number";
    case P_BOOLEAN: return "boolean";
    case P_NULL: return "null";
    default: return "value";
    }
}

static const char *const SUPPORTED[] = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                        "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength",
                                        "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions"};
static const char *const IGNORED[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                      "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                      "multipleOf", "uniqueItems", "readOnly", "writeOnly", "deprecated",
                                      "contentMediaType", "contentEncoding"};

static bool known_keyword(const char *k) {
    for (size_t i = 0; i < sizeof SUPPORTED / sizeof *SUPPORTED; i++)
        if (!strcmp(k, SUPPORTED[i])) return true;
    for (size_t i = 0; i < sizeof IGNORED / sizeof *IGNORED; i++)
        if (!strcmp(k, IGNORED[i])) return true;
    return false;
}

static bool gen(conv *c, const cJSON *s, const char *path, char *name);

/* The rule for s into name, or fail. sub-path = path + "/" + seg. */
static bool gen_sub(conv *c, const cJSON *s, const char *path, const char *seg, char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", path, seg);
    return gen(c, s, p, name);
}

static bool get_count(conv *c, const cJSON *s, const char *key, const char *path, long *v, long dflt) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(s, key);
    *v = dflt;
    if (!j) return true;
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > 100000 || j->valuedouble != (double)(long)j->valuedouble)
        return cfail(c, CMF_ERR_UNSUPPORTED, path, "%s must be an integer in [0, 100000]", key);
    *v = (long)j->valuedouble;
    return true;
}

/* "{m,n}" / "{m,}" repetition suffix for m..n (n < 0 = unbounded). */
static void rep_suffix(char *buf, size_t cap, long m, long n) {
    if (n < 0) snprintf(buf, cap, "{%ld,}", m);
    else snprintf(buf, cap, "{%ld,%ld}", m, n);
}

static bool gen_string(conv *c, const cJSON *s, const char *path, char *name) {
    if (cJSON_GetObjectItemCaseSensitive(s, "pattern")) return cfail(c, CMF_ERR_UNSUPPORTED, path, "keyword pattern is not supported");
    long mn, mx;
    if (!get_count(c, s, "minLength", path, &mn, 0) || !get_count(c, s, "maxLength", path, &mx, -1)) return false;
    if (mn == 0 && mx < 0) { strcpy(name, prim(c, P_STRING)); return true; }
    if (mx >= 0 && mx < mn) return cfail(c, CMF_ERR_UNSUPPORTED, path, "maxLength below minLength");
    prim(c, P_STRING);
    new_name(c, "string", name);
    char rep[64];
    rep_suffix(rep, sizeof rep, mn, mx);
    sb_printf(&c->out, "%s ::= \"\\\"\" json-char%s \"\\\"\" space\n", name, rep);
    return true;
}

static bool gen_array(conv *c, const cJSON *s, const char *path, char *name) {
    long mn, mx;
    if (!get_count(c, s, "minItems", path, &mn, 0) || !get_count(c, s, "maxItems", path, &mx, -1)) return false;
    if (mx >= 0 && mx < mn) return cfail(c, CMF_ERR_UNSUPPORTED, path, "maxItems below minItems");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    char item[64];
    bool more = true;
    if (items && cJSON_IsFalse(items)) more = false;
    else if (items) { if (!gen_sub(c, items, path, "items", item)) return false; }
    else strcpy(item, prim(c, P_VALUE));
    new_name(c, "array", name);
    prim(c, 0);
    if (prefix) {
        if (!cJSON_IsArray(prefix)) return cfail(c, CMF_ERR_UNSUPPORTED, path, "prefixItems must be an array");
        int n = cJSON_GetArraySize(prefix);
        char (*names)[64] = malloc(((size_t)n + 1) * sizeof *names);
        if (!names) return cfail(c, CMF_ERR_NOMEM, path, "out of memory");
        for (int i = 0; i < n; i++) {
            char seg[32];
            snprintf(seg, sizeof seg, "prefixItems/%d", i);
            if (!gen_sub(c, cJSON_GetArrayItem(prefix, i), path, seg, names[i])) { free(names); return false; }
        }
        sb_printf(&c->out, "%s ::= \"[\" space", name);
        for (int i = 0; i < n; i++) sb_printf(&c->out, "%s %s", i ? " \",\" space" : "", names[i]);
        if (more) sb_printf(&c->out, n ? " (\",\" space %s)*" : " (%s (\",\" space %s)*)?", item, item);
        sb_printf(&c->out, " \"]\" space\n");
        free(names);
        return true;
    }
    if (!more || mx == 0) { sb_printf(&c->out, "%s ::= \"[\" space \"]\" space\n", name); return true; }
    char rep[64];
    rep_suffix(rep, sizeof rep, mn > 0 ? mn - 1 : 0, mx < 0 ? -1 : mx - 1);
    if (mn > 0) sb_printf(&c->out, "%s ::= \"[\" space %s (\",\" space %s)%s \"]\" space\n", name, item, item, rep);
    else sb_printf(&c->out, "%s ::= \"[\" space (%s (\",\" space %s)%s)? \"]\" space\n", name, item, item, rep);
    return true;
}

/* Length of the UTF-8 character at s (1 for a stray byte). */
static size_t u8len(const char *s) {
    unsigned char b = (unsigned char)*s;
    size_t n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    for (size_t i = 1; i < n; i++)
        if (!s[i]) return i;
    return n;
}

/* The rule for the rest of a JSON string, d bytes into it, that is none
 * of keys[0..n) (all sharing their first d bytes; sorted): a trie of the
 * keys where leaving the trie at any point, or ending at a node that is
 * not a whole key, is allowed (llama.cpp's "not strings" construction). */
static void gen_not_keys_node(conv *c, const char **keys, size_t n, size_t d, char *name) {
    new_name(c, "not-key", name);
    sbuf line = {0};
    sb_printf(&line, "%s ::= ", name);
    bool is_end = false, first = true;
    sbuf cls = {0};
    for (size_t i = 0; i < n;) {
        if (!keys[i][d]) { is_end = true; i++; continue; }
        size_t cl = u8len(keys[i] + d), j = i + 1;
        while (j < n && strlen(keys[j]) >= d + cl && !memcmp(keys[j] + d, keys[i] + d, cl)) j++;
        char sub[64], ch[8] = {0};
        memcpy(ch, keys[i] + d, cl);
        gen_not_keys_node(c, keys + i, j - i, d + cl, sub);
        sb_printf(&line, "%s", first ? "" : " | ");
        sb_literal(&line, ch);
        sb_printf(&line, " %s", sub);
        first = false;
        if (ch[0] == ']' || ch[0] == '\\' || ch[0] == '-' || ch[0] == '^') sb_printf(&cls, "\\%c", ch[0]);
        else if ((unsigned char)ch[0] < 0x20) sb_printf(&cls, "\\x%02X", (unsigned char)ch[0]);
        else sb_printf(&cls, "%s", ch);
        i = j;
    }
    sb_printf(&line, "%s([^\"\\\\\\x7F\\x00-\\x1F%s] | [\\\\] ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})) json-char* \"\\\"\"",
              first ? "" : " | ", cls.p ? cls.p : "");
    if (!is_end) sb_printf(&line, " | \"\\\"\"");
    if (line.oom || cls.oom) c->out.oom = true;
    else sb_printf(&c->out, "%s\n", line.p);
    free(line.p);
    free(cls.p);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static bool gen_object(conv *c, const cJSON *s, const char *path, char *name) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return cfail(c, CMF_ERR_UNSUPPORTED, path, "properties must be an object");
    if (req && !cJSON_IsArray(req)) return cfail(c, CMF_ERR_UNSUPPORTED, path, "required must be an array");
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) return cfail(c, CMF_ERR_UNSUPPORTED, path, "required must list strings");
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return cfail(c, CMF_ERR_UNSUPPORTED, path, "required property '%s' is not in properties", r->valuestring);
    }
    int n = props ? cJSON_GetArraySize(props) : 0;
    char extra[64] = "";
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return cfail(c, CMF_ERR_UNSUPPORTED, path, "additionalProperties must be a boolean or a schema");
    if (!cJSON_IsFalse(addl)) { /* extra members: a key that is none of the listed ones */
        char v[64], kv[64], key[64];
        if (cJSON_IsObject(addl)) { if (!gen_sub(c, addl, path, "additionalProperties", v)) return false; }
        else strcpy(v, prim(c, P_VALUE));
        prim(c, P_STRING);
        if (n) {
            const char **keys = malloc((size_t)n * sizeof *keys);
            if (!keys) return cfail(c, CMF_ERR_NOMEM, path, "out of memory");
            int k = 0;
            const cJSON *q;
            cJSON_ArrayForEach(q, props) {
                if (strlen(q->string) > 512) { /* the key trie below recurses per byte */
                    free(keys);
                    return cfail(c, CMF_ERR_UNSUPPORTED, path, "property name of %zu bytes (512 at most with extra members allowed)", strlen(q->string));
                }
                keys[k++] = q->string;
            }
            qsort(keys, (size_t)n, sizeof *keys, cmp_str);
            char rest[64];
            gen_not_keys_node(c, keys, (size_t)n, 0, rest);
            free(keys);
            new_name(c, "extra-key", key);
            sb_printf(&c->out, "%s ::= \"\\\"\" %s space\n", key, rest);
        } else {
            strcpy(key, "string");
        }
        new_name(c, "extra-kv", kv);
        sb_printf(&c->out, "%s ::= %s \":\" space %s\n", kv, key, v);
        strcpy(extra, kv);
    }
    prim(c, 0);
    char (*kv)[64] = malloc(((size_t)n + 1) * sizeof *kv);
    bool *required = calloc((size_t)n + 1, 1);
    if (!kv || !required) { free(kv); free(required); return cfail(c, CMF_ERR_NOMEM, path, "out of memory"); }
    int i = 0;
    const cJSON *p;
    bool ok = true;
    cJSON_ArrayForEach(p, props) {
        char seg[300], v[64];
        snprintf(seg, sizeof seg, "properties/%.280s", p->string);
        if (!(ok = gen_sub(c, p, path, seg, v))) break;
        cJSON_ArrayForEach(r, req) required[i] |= !strcmp(r->valuestring, p->string);
        cJSON *ks = cJSON_CreateString(p->string);
        char *key = ks ? cJSON_PrintUnformatted(ks) : NULL;
        cJSON_Delete(ks);
        if (!key) { ok = cfail(c, CMF_ERR_NOMEM, path, "out of memory"); break; }
        new_name(c, "kv", kv[i]);
        sb_printf(&c->out, "%s ::= ", kv[i]);
        sb_literal(&c->out, key);
        sb_printf(&c->out, " space \":\" space %s\n", v);
        free(key);
        i++;
    }
    if (ok) {
        char base[64];
        new_name(c, "obj", base);
        /* first-i and rest-i for i in [0, n] */
        for (int k = 0; k <= n; k++) {
            if (k < n && required[k]) sb_printf(&c->out, "%s-f%d ::= %s %s-r%d\n", base, k, kv[k], base, k + 1);
            else if (k < n) sb_printf(&c->out, "%s-f%d ::= %s %s-r%d | %s-f%d\n", base, k, kv[k], base, k + 1, base, k + 1);
            else if (*extra) sb_printf(&c->out, "%s-f%d ::= (%s %s-r%d)?\n", base, k, extra, base, k);
            else sb_printf(&c->out, "%s-f%d ::= \n", base, k);
            if (k < n && required[k]) sb_printf(&c->out, "%s-r%d ::= \",\" space %s %s-r%d\n", base, k, kv[k], base, k + 1);
            else if (k < n) sb_printf(&c->out, "%s-r%d ::= (\",\" space %s)? %s-r%d\n", base, k, kv[k], base, k + 1);
            else if (*extra) sb_printf(&c->out, "%s-r%d ::= (\",\" space %s)*\n", base, k, extra);
            else sb_printf(&c->out, "%s-r%d ::= \n", base, k);
        }
        snprintf(name, 64, "%s", base);
        sb_printf(&c->out, "%s ::= \"{\" space %s-f0 \"}\" space\n", base, base);
    }
    free(kv);
    free(required);
    return ok;
}

/* A rule matching exactly the texts keys[0..n) (sorted, sharing their
 * first d bytes) as a trie of their characters: one alternative per
 * distinct next character, so a large enum costs the matcher one stack
 * per live prefix instead of one per value. */
static void gen_trie_node(conv *c, const char **keys, size_t n, size_t d, char *name) {
    new_name(c, "lit", name);
    sbuf line = {0};
    sb_printf(&line, "%s ::= ", name);
    bool first = true, is_end = false;
    if (d >= 256) { /* deep shared prefixes: the suffixes as plain alternatives (bounded recursion) */
        for (size_t i = 0; i < n; i++) {
            sb_printf(&line, "%s", i ? " | " : "");
            sb_literal(&line, keys[i] + d);
        }
        n = 0;
    }
    for (size_t i = 0; i < n;) {
        if (!keys[i][d]) { is_end = true; i++; continue; }
        size_t cl = u8len(keys[i] + d), j = i + 1;
        while (j < n && strlen(keys[j]) >= d + cl && !memcmp(keys[j] + d, keys[i] + d, cl)) j++;
        char ch[8] = {0}, sub[64];
        memcpy(ch, keys[i] + d, cl);
        if (j - i == 1) { /* one key left: the rest of it as a literal */
            sb_printf(&line, "%s", first ? "" : " | ");
            sb_literal(&line, keys[i] + d);
        } else {
            gen_trie_node(c, keys + i, j - i, d + cl, sub);
            sb_printf(&line, "%s", first ? "" : " | ");
            sb_literal(&line, ch);
            sb_printf(&line, " %s", sub);
        }
        first = false;
        i = j;
    }
    if (is_end) sb_printf(&line, first ? "" : " | ");
    if (line.oom) c->out.oom = true;
    else sb_printf(&c->out, "%s\n", line.p);
    free(line.p);
}

/* One alternative per JSON value of arr (enum). */
static bool gen_literals(conv *c, const cJSON *vals, bool single, const char *path, char *name) {
    int n = single ? 1 : cJSON_GetArraySize(vals);
    if (!n) return cfail(c, CMF_ERR_UNSUPPORTED, path, "enum is empty");
    char **texts = calloc((size_t)n, sizeof *texts);
    if (!texts) return cfail(c, CMF_ERR_NOMEM, path, "out of memory");
    bool ok = true;
    int k = 0;
    const cJSON *v;
    if (single) ok = (texts[k++] = cJSON_PrintUnformatted(vals)) != NULL;
    else cJSON_ArrayForEach(v, vals) if (ok) ok = (texts[k++] = cJSON_PrintUnformatted(v)) != NULL;
    if (ok) {
        qsort(texts, (size_t)n, sizeof *texts, cmp_str);
        char trie[64];
        gen_trie_node(c, (const char **)texts, (size_t)n, 0, trie);
        new_name(c, single ? "const" : "enum", name);
        prim(c, 0);
        sb_printf(&c->out, "%s ::= %s space\n", name, trie);
    }
    for (int i = 0; i < n; i++) free(texts[i]);
    free(texts);
    return ok ? true : cfail(c, CMF_ERR_NOMEM, path, "out of memory");
}

static bool gen_type(conv *c, const cJSON *s, const char *t, const char *path, char *name) {
    if (!strcmp(t, "string")) return gen_string(c, s, path, name);
    if (!strcmp(t, "object")) return gen_object(c, s, path, name);
    if (!strcmp(t, "array")) return gen_array(c, s, path, name);
    unsigned p = !strcmp(t, "integer") ? P_INTEGER : !strcmp(t, "number") ? P_NUMBER : !strcmp(t, "boolean") ? P_BOOLEAN
                 : !strcmp(t, "null") ? P_NULL : 0;
    if (!p) return cfail(c, CMF_ERR_UNSUPPORTED, path, "unknown type '%s'", t);
    strcpy(name, prim(c, p));
    return true;
}

static bool gen_ref(conv *c, const char *ref, const char *path, char *name) {
    for (size_t i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) { snprintf(name, 64, "%s", c->refs[i].rule); return true; }
    const cJSON *target = NULL;
    const char *key = NULL;
    if (!strcmp(ref, "#")) target = c->doc;
    else if (!strncmp(ref, "#/$defs/", 8)) { key = ref + 8; target = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->doc, "$defs"), key); }
    else if (!strncmp(ref, "#/definitions/", 14)) { key = ref + 14; target = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->doc, "definitions"), key); }
    else return cfail(c, CMF_ERR_UNSUPPORTED, path, "$ref '%s' is not supported (only #, #/$defs/NAME and #/definitions/NAME)", ref);
    if (!target) return cfail(c, CMF_ERR_UNSUPPORTED, path, "$ref '%s' points to nothing", ref);
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? c->cap_refs * 2 : 8;
        refmap *q = realloc(c->refs, cap * sizeof *q);
        if (!q) return cfail(c, CMF_ERR_NOMEM, path, "out of memory");
        c->refs = q;
        c->cap_refs = cap;
    }
    char rule[64];
    char safe[40] = "";
    size_t k = 0;
    for (const char *q = key ? key : "root"; *q && k + 1 < sizeof safe; q++)
        safe[k++] = ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9')) ? *q : '-';
    safe[k] = 0;
    new_name(c, "def", rule);
    snprintf(rule + strlen(rule), sizeof rule - strlen(rule), "-%s", safe);
    c->refs[c->n_refs].ref = strdup(ref);
    c->refs[c->n_refs].rule = strdup(rule);
    if (!c->refs[c->n_refs].ref || !c->refs[c->n_refs].rule) {
        free(c->refs[c->n_refs].ref); free(c->refs[c->n_refs].rule);
        return cfail(c, CMF_ERR_NOMEM, path, "out of memory");
    }
    c->n_refs++;
    char body[64];
    if (!gen(c, target, ref + 1, body)) return false;
    sb_printf(&c->out, "%s ::= %s\n", rule, body);
    snprintf(name, 64, "%s", rule);
    return true;
}

static bool gen(conv *c, const cJSON *s, const char *path, char *name) {
    if (c->st) return false;
    if (++c->depth > 64) return cfail(c, CMF_ERR_UNSUPPORTED, path, "schema nested too deeply (at most 64 levels)");
    bool ok = false;
    if (cJSON_IsTrue(s)) { strcpy(name, prim(c, P_VALUE)); ok = true; goto out; }
    if (cJSON_IsFalse(s)) { ok = cfail(c, CMF_ERR_UNSUPPORTED, path, "the schema false matches nothing"); goto out; }
    if (!cJSON_IsObject(s)) { ok = cfail(c, CMF_ERR_UNSUPPORTED, path, "a schema must be an object or a boolean"); goto out; }
    const cJSON *k;
    cJSON_ArrayForEach(k, s)
        if (!known_keyword(k->string)) { ok = cfail(c, CMF_ERR_UNSUPPORTED, path, "keyword %s is not supported", k->string); goto out; }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (ref) {
        ok = cJSON_IsString(ref) ? gen_ref(c, ref->valuestring, path, name) : cfail(c, CMF_ERR_UNSUPPORTED, path, "$ref must be a string");
    } else if (cst) {
        ok = gen_literals(c, cst, true, path, name);
    } else if (en) {
        ok = cJSON_IsArray(en) ? gen_literals(c, en, false, path, name) : cfail(c, CMF_ERR_UNSUPPORTED, path, "enum must be an array");
    } else if (any || all) {
        const cJSON *list = any ? any : all;
        const char *kw = any ? (cJSON_GetObjectItemCaseSensitive(s, "anyOf") ? "anyOf" : "oneOf") : "allOf";
        int n = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0;
        if (!n) { ok = cfail(c, CMF_ERR_UNSUPPORTED, path, "%s must be a non-empty array", kw); goto out; }
        if (all && n > 1) { ok = cfail(c, CMF_ERR_UNSUPPORTED, path, "allOf with more than one schema is not supported"); goto out; }
        char alt[64], rule[64];
        new_name(c, "alt", rule);
        sbuf line = {0};
        sb_printf(&line, "%s ::= ", rule);
        ok = true;
        for (int i = 0; i < n && ok; i++) {
            char seg[32];
            snprintf(seg, sizeof seg, "%s/%d", kw, i);
            ok = gen_sub(c, cJSON_GetArrayItem(list, i), path, seg, alt);
            sb_printf(&line, "%s%s", i ? " | " : "", alt);
        }
        if (ok && line.oom) ok = cfail(c, CMF_ERR_NOMEM, path, "out of memory");
        if (ok) { sb_printf(&c->out, "%s\n", line.p); snprintf(name, 64, "%s", rule); }
        free(line.p);
    } else if (cJSON_IsArray(type)) {
        char alt[64], rule[64];
        new_name(c, "types", rule);
        sbuf line = {0};
        sb_printf(&line, "%s ::= ", rule);
        ok = cJSON_GetArraySize(type) > 0 || cfail(c, CMF_ERR_UNSUPPORTED, path, "type list is empty");
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            if (!ok) break;
            ok = cJSON_IsString(t) ? gen_type(c, s, t->valuestring, path, alt) : cfail(c, CMF_ERR_UNSUPPORTED, path, "type must be a string or a list of strings");
            sb_printf(&line, "%s%s", i++ ? " | " : "", alt);
        }
        if (ok && line.oom) ok = cfail(c, CMF_ERR_NOMEM, path, "out of memory");
        if (ok) { sb_printf(&c->out, "%s\n", line.p); snprintf(name, 64, "%s", rule); }
        free(line.p);
    } else if (type) {
        ok = cJSON_IsString(type) ? gen_type(c, s, type->valuestring, path, name) : cfail(c, CMF_ERR_UNSUPPORTED, path, "type must be a string or a list of strings");
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "additionalProperties")) {
        ok = gen_object(c, s, path, name);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "prefixItems")) {
        ok = gen_array(c, s, path, name);
    } else {
        strcpy(name, prim(c, P_VALUE));
        ok = true;
    }
out:
    c->depth--;
    return ok;
}

/* Offset of the first invalid UTF-8 byte of s[0..n), or n. */
static size_t utf8_invalid_at(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char b = u[i];
        size_t k = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
        if (!k || i + k > n) return i;
        uint32_t cp = k == 1 ? b : k == 2 ? b & 0x1Fu : k == 3 ? b & 0x0Fu : b & 0x07u;
        for (size_t j = 1; j < k; j++) {
            if ((u[i + j] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (u[i + j] & 0x3Fu);
        }
        if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return i;
        i += k;
    }
    return n;
}

cmf_status cmf_json_schema_to_gbnf(const char *schema, size_t len, char **gbnf, cmf_error *err) {
    if (!schema || !gbnf) return cmf_error_set(err, CMF_ERR_ARG, "cmf_json_schema_to_gbnf: NULL argument");
    *gbnf = NULL;
    size_t bad = utf8_invalid_at(schema, len);
    if (bad < len) return cmf_error_set(err, CMF_ERR_FORMAT, "JSON schema: invalid UTF-8 at byte %zu", bad);
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(schema, len, &end, 0);
    if (!doc) return cmf_error_set(err, CMF_ERR_FORMAT, "JSON schema: not valid JSON (near byte %td)", (end ? end : schema) - schema);
    for (const char *q = end; q < schema + len; q++)
        if (*q != ' ' && *q != '\n' && *q != '\r' && *q != '\t' && *q) {
            cJSON_Delete(doc);
            return cmf_error_set(err, CMF_ERR_FORMAT, "JSON schema: trailing text after the JSON value (byte %td)", q - schema);
        }
    conv C = {.doc = doc, .err = err}, *c = &C;
    char root[64];
    sb_printf(&c->out, "root ::= ROOT\n"); /* patched below */
    bool ok = gen(c, doc, "", root);
    if (ok) {
        if (c->prims & P_VALUE) sb_printf(&c->out, "%s", PRIM_VALUE);
        if (c->prims & P_STRING) sb_printf(&c->out, "%s", PRIM_STRING);
        if (c->prims & P_CHAR) sb_printf(&c->out, "%s", PRIM_CHAR);
        if (c->prims & P_INTEGER) sb_printf(&c->out, "%s", PRIM_INTEGER);
        if (c->prims & P_NUMBER) sb_printf(&c->out, "%s", PRIM_NUMBER);
        if (c->prims & P_BOOLEAN) sb_printf(&c->out, "%s", PRIM_BOOLEAN);
        if (c->prims & P_NULL) sb_printf(&c->out, "%s", PRIM_NULL);
        sb_printf(&c->out, "%s", PRIM_SPACE);
    }
    for (size_t i = 0; i < c->n_refs; i++) { free(c->refs[i].ref); free(c->refs[i].rule); }
    free(c->refs);
    cJSON_Delete(doc);
    if (ok && c->out.oom) ok = cfail(c, CMF_ERR_NOMEM, "", "out of memory");
    if (!ok) {
        free(c->out.p);
        return c->st;
    }
    /* root line: replace the placeholder */
    size_t rl = strlen(root);
    char *res = malloc(c->out.n + rl + 1);
    if (!res) { free(c->out.p); return cmf_error_set(err, CMF_ERR_NOMEM, "JSON schema: out of memory"); }
    int k = snprintf(res, c->out.n + rl + 1, "root ::= %s\n", root);
    size_t head = strlen("root ::= ROOT\n");
    memcpy(res + k, c->out.p + head, c->out.n - head + 1);
    free(c->out.p);
    *gbnf = res;
    return CMF_OK;
}
