/*
 * json_strict.c — the server's request JSON is parsed strictly with
 * cJSON (the project's one JSON library): the body must be valid UTF-8
 * (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF)
 * without NUL bytes or escapes of U+0000 (cJSON's strings end at a NUL:
 * the rest of the string would be dropped silently), hold exactly one
 * JSON value (cJSON_ParseWithOpts with require_null_terminated: trailing
 * garbage is refused), and no object may
 * repeat a key (RFC 8259 leaves duplicates undefined; cJSON would keep
 * both, and a validator and the sampler could read different ones). Also
 * the OpenAI error body every 4xx/5xx answer carries.
 */
#include "server/server.h"
#include "format/format_internal.h" /* cmf_utf8_valid */

#include <stdlib.h>
#include <string.h>

static int cmp_name(const void *a, const void *b) {
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    return strcmp(x, y);
}

/* First duplicate key found in the tree (depth-first), or NULL; *oom on
 * allocation failure. */
static const char *dup_key(const cJSON *n, bool *oom) {
    for (; n; n = n->next) {
        if (cJSON_IsObject(n)) {
            size_t k = 0;
            for (const cJSON *c = n->child; c; c = c->next) k++;
            if (k > 1) {
                const char **names = malloc(k * sizeof *names);
                if (!names) { *oom = true; return NULL; }
                size_t i = 0;
                for (const cJSON *c = n->child; c; c = c->next) names[i++] = c->string ? c->string : "";
                qsort(names, k, sizeof *names, cmp_name);
                const char *d = NULL;
                for (i = 1; i < k && !d; i++)
                    if (strcmp(names[i - 1], names[i]) == 0) d = names[i];
                free(names);
                if (d) return d;
            }
        }
        if (n->child) {
            const char *d = dup_key(n->child, oom);
            if (d || *oom) return d;
        }
    }
    return NULL;
}

/* Offset of the first escape of U+0000 (backslash, u, 0000) in valid JSON
 * text (a backslash is only ever inside a string there, and starts an
 * escape when an even number of backslashes precede it), or len. cJSON
 * decodes it into a NUL byte, and the string would be cut there. */
static size_t escaped_nul(const char *b, size_t len) {
    for (size_t i = 0; i + 6 <= len; i++) {
        if (b[i] != '\\') continue;
        if (memcmp(b + i + 1, "u0000", 5) == 0) return i;
        i++; /* the escaped character: never the start of another escape */
    }
    return len;
}

/* How deep arrays and objects are open at byte off of b (strings skipped):
 * cJSON refuses nesting past CJSON_NESTING_LIMIT, which the error should
 * say rather than "not valid JSON". */
static long depth_at(const char *b, size_t off) {
    long d = 0;
    bool str = false;
    for (size_t i = 0; i < off && b[i]; i++) {
        char c = b[i];
        if (str) {
            if (c == '\\') i++;
            else if (c == '"') str = false;
        } else if (c == '"') str = true;
        else if (c == '[' || c == '{') d++;
        else if (c == ']' || c == '}') d--;
    }
    return d;
}

cJSON *srv_json_parse(const char *body, size_t len, char *msg, size_t cap) {
    if (!body || len == 0) {
        snprintf(msg, cap, "the request body is empty; send a JSON object");
        return NULL;
    }
    const char *nul = memchr(body, 0, len);
    if (nul) {
        snprintf(msg, cap, "the request body holds a NUL byte (at byte %zu), which JSON does not allow",
                 (size_t)(nul - body));
        return NULL;
    }
    if (!cmf_utf8_valid(body, len)) {
        snprintf(msg, cap, "the request body is not valid UTF-8");
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(body, &end, true); /* body is NUL-terminated at len */
    if (!j) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        if (depth_at(body, off) >= CJSON_NESTING_LIMIT)
            snprintf(msg, cap, "the request body nests arrays and objects deeper than %d levels (at byte %zu)",
                     CJSON_NESTING_LIMIT, off);
        else snprintf(msg, cap, "the request body is not valid JSON (at byte %zu)", off);
        return NULL;
    }
    size_t at = escaped_nul(body, len);
    if (at < len) {
        snprintf(msg, cap, "a string in the request holds \\u0000 (at byte %zu): cmf's text and stop strings cannot "
                 "carry a NUL character", at);
        cJSON_Delete(j);
        return NULL;
    }
    bool oom = false;
    const char *d = dup_key(j, &oom);
    if (d || oom) {
        if (oom) snprintf(msg, cap, "out of memory checking the request");
        else snprintf(msg, cap, "the request body repeats the key \"%.200s\"", d);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

const char *srv_error_type(unsigned status) {
    switch (status) {
    case 400: case 404: case 405: case 409: case 413: case 415: case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

char *srv_error_json(unsigned status, const char *param, const char *msg) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_CreateObject();
    char *t = NULL;
    bool model = param && strcmp(param, "model") == 0; /* a 404 elsewhere is a route, not a model */
    const char *code = status == 404 && model ? "model_not_found" : status == 401 ? "invalid_api_key"
                     : status == 429 ? "rate_limit_exceeded" : status == 413 ? "request_too_large" : NULL;
    if (root && e && cJSON_AddItemToObject(root, "error", e)) {
        e = cJSON_GetObjectItemCaseSensitive(root, "error");
        cJSON_AddStringToObject(e, "message", msg ? msg : "");
        cJSON_AddStringToObject(e, "type", srv_error_type(status));
        if (param) cJSON_AddStringToObject(e, "param", param);
        else cJSON_AddNullToObject(e, "param");
        if (code) cJSON_AddStringToObject(e, "code", code);
        else cJSON_AddNullToObject(e, "code");
        t = cJSON_PrintUnformatted(root);
    } else {
        cJSON_Delete(e);
    }
    cJSON_Delete(root);
    return t;
}
