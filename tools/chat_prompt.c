/*
 * chat_prompt.c — hand a conversation to cmf_chat_prompt_render (the
 * library renders the template exactly as transformers'
 * apply_chat_template does; see cmf/policy.h): the CLI's JSON messages
 * become cmf_chat_message records, members other than role and content
 * passed along as extra_json.
 */
#include "chat_prompt.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

cmf_status cli_render_messages(const cmf_file *f, const cmf_tokenizer *tok, const cJSON *messages,
                               bool no_think, char **out, size_t *len, cmf_error *err) {
    size_t n = (size_t)cJSON_GetArraySize(messages), i = 0;
    cmf_chat_message *msgs = calloc(n ? n : 1, sizeof *msgs);
    char **extras = calloc(n ? n : 1, sizeof *extras);
    cmf_status st = msgs && extras ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        if (st != CMF_OK) break;
        msgs[i].role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        msgs[i].content = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "content"));
        if (cJSON_GetArraySize(m) > 2) { /* more than role and content */
            cJSON *extra = cJSON_Duplicate(m, 1);
            if (extra) {
                cJSON_DeleteItemFromObjectCaseSensitive(extra, "role");
                cJSON_DeleteItemFromObjectCaseSensitive(extra, "content");
                extras[i] = cJSON_PrintUnformatted(extra);
            }
            cJSON_Delete(extra);
            if (!extras[i]) st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
            msgs[i].extra_json = extras[i];
        }
        i++;
    }
    if (st == CMF_OK) {
        cmf_chat_prompt_opts o = cmf_chat_prompt_default_opts();
        if (no_think) o.enable_thinking = CMF_THINK_OFF;
        st = cmf_chat_prompt_render(f, tok, msgs, i, &o, out, len, err);
    }
    for (size_t k = 0; extras && k < n; k++) cJSON_free(extras[k]);
    free(extras);
    free(msgs);
    return st;
}

int cli_render_chat_prompt(const cmf_file *f, const char *system, const char *user, bool no_think, char **out,
                           size_t *len, cmf_error *err) {
    cmf_chat_message msgs[2] = {{"system", system, NULL}, {"user", user ? user : "", NULL}};
    cmf_chat_prompt_opts o = cmf_chat_prompt_default_opts();
    if (no_think) o.enable_thinking = CMF_THINK_OFF;
    return cmf_chat_prompt_render(f, NULL, system ? msgs : msgs + 1, system ? 2 : 1, &o, out, len, err);
}
