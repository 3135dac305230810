/*
 * test_template_reference.c — every template under
 * ../shared/data/chat_templates rendered for every context of
 * expected/jinja2_reference_renders.json must equal the Python jinja2
 * render byte for byte (or fail where jinja2 raised).
 */
#include "chat_test_util.h"

static char *load_template(const char *data, const char *rel) {
    /* "chat_templates/x/y.jinja", "x/index.json#[N] (name)" or "x/config.json#key" */
    char path[4096];
    const char *hash = strchr(rel, '#');
    if (hash) {
        if (snprintf(path, sizeof path, "%s/%.*s", data, (int)(hash - rel), rel) >= (int)sizeof path) return NULL;
        cJSON *idx = ctu_load_json(path);
        if (!idx) return NULL;
        cJSON *t;
        if (hash[1] == '[') /* "#[N] (name)": entry N of an index array */
            t = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(idx, atoi(hash + 2)), "template");
        else /* "#key": a string field, e.g. tokenizer_config.json#chat_template */
            t = cJSON_GetObjectItemCaseSensitive(idx, hash + 1);
        char *r = cJSON_IsString(t) ? strdup(t->valuestring) : NULL;
        cJSON_Delete(idx);
        return r;
    }
    if (snprintf(path, sizeof path, "%s/%s", data, rel) >= (int)sizeof path) return NULL;
    char *buf = NULL;
    size_t len;
    cmf_error err = {0};
    if (cmf_read_file(path, &buf, &len, &err) != CMF_OK) return NULL;
    return buf;
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("shared data not found");
    char path[4096];
    if (snprintf(path, sizeof path, "%s/chat_templates/expected/jinja2_reference_renders.json", data) >= (int)sizeof path)
        TEST_SKIP("path too long");
    cJSON *ref = ctu_load_json(path);
    REQUIRE(ref, "cannot load %s", path);
    cJSON *contexts = cJSON_GetObjectItemCaseSensitive(ref, "contexts");
    cJSON *renders = cJSON_GetObjectItemCaseSensitive(ref, "renders");
    REQUIRE(cJSON_IsObject(contexts) && cJSON_IsArray(renders), "unexpected file structure");
    int n = 0, ok = 0;
    cJSON *r;
    cJSON_ArrayForEach(r, renders) {
        const char *tname = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "template"));
        const char *cname = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "context"));
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "output"));
        bool want_err = cJSON_GetObjectItemCaseSensitive(r, "error") != NULL;
        if (!tname || !cname) continue;
        char *tpl = load_template(data, tname);
        CHECK(tpl, "cannot load template %s", tname);
        if (!tpl) continue;
        cJSON *ctx = cJSON_GetObjectItemCaseSensitive(contexts, cname);
        char *out;
        size_t len;
        cmf_error err = {0};
        cmf_status st = ctu_render(tname, tpl, ctx, &out, &len, &err);
        char what[1024];
        if (snprintf(what, sizeof what, "%.900s [%.100s]", tname, cname) < 0) what[0] = 0;
        n++;
        if (want_err) {
            CHECK(st != CMF_OK, "%s: jinja2 raised but we rendered", what);
            if (st != CMF_OK) ok++;
        } else if (st != CMF_OK) {
            CHECK(0, "%s: render failed: %s", what, err.msg);
        } else {
            bool same = want && len == strlen(want) && memcmp(out, want, len) == 0;
            if (!same) ctu_diff(what, out, len, want ? want : "");
            CHECK(same, "%s differs", what);
            if (same) ok++;
        }
        free(out);
        free(tpl);
    }
    fprintf(stderr, "%d/%d reference renders match\n", ok, n);
    cJSON_Delete(ref);
    return test_done();
}
