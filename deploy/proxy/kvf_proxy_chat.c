/* Chat messages: checked, then rendered with the checkpoint's template (kvf_proxy_chat.h). */
#include "kvf_proxy_chat.h"
#include "kvf_proxy_refuse.h"
#include "kvf_proxy_jinja.h"
#include "kvf_proxy_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* content: a string, null (assistant), or text parts joined with "\n" (as vLLM joins them). */
static kvf_status_t kvf_chat_content(const cJSON *m, int i, cJSON *out, const char **param_p,
                                     char *err, size_t cap)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *part;
    char *joined = NULL;
    size_t len = 0;

    if ((c == NULL) || cJSON_IsNull(c)) {
        cJSON_AddStringToObject(out, "content", "");
        return KVF_OK;
    }
    if (cJSON_IsString(c)) {
        cJSON_AddStringToObject(out, "content", c->valuestring);
        return KVF_OK;
    }
    if (!cJSON_IsArray(c)) {
        return kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                 "'messages'[%d].content must be a string or a "
                                 "list of text parts", i);
    }
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        size_t n;
        char *grown;

        if (cJSON_IsObject(part) && cJSON_IsString(type) &&
            (strcmp(type->valuestring, "text") != 0)) {
            /* image_url, video_url, input_audio, file...: a multimodal checkpoint is served
             * text-only (its vision tower is not loaded), so the part is refused by name */
            free(joined);
            return kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                     "'messages'[%d].content part of type '%.64s' is not "
                                     "supported: text-only serving, only parts {\"type\": "
                                     "\"text\", \"text\": ...} (no images, video, audio or files)",
                                     i, type->valuestring);
        }
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || !cJSON_IsString(text)) {
            free(joined);
            return kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                     "'messages'[%d].content: only parts "
                                     "{\"type\": \"text\", \"text\": ...} are supported (no images,"
                                     " audio or files)", i);
        }
        n = strlen(text->valuestring);
        grown = realloc(joined, len + n + 2);
        if (grown == NULL) {
            free(joined);
            return KVF_ERR_NO_MEMORY;
        }
        joined = grown;
        if (len > 0) {
            joined[len++] = '\n';
        }
        memcpy(joined + len, text->valuestring, n + 1);
        len += n;
    }
    cJSON_AddStringToObject(out, "content", (joined != NULL) ? joined : "");
    free(joined);
    return KVF_OK;
}

/* The messages the template sees: role and content (a string) of each, checked. */
static kvf_status_t kvf_chat_messages(const cJSON *messages, cJSON *list, const char **param_p,
                                      char *err, size_t cap)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    const cJSON *m;
    int i = 0;

    if (!cJSON_IsArray(messages) || (cJSON_GetArraySize(messages) == 0)) {
        return kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                 "'messages' must be a non-empty list of "
                                 "messages");
    }
    cJSON_ArrayForEach(m, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *k;
        cJSON *out;
        bool known = false;
        kvf_status_t st;

        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            return kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                     "'messages'[%d] must be an object with a "
                                     "string 'role'", i);
        }
        for (size_t r = 0; r < sizeof(roles) / sizeof(roles[0]); ++r) {
            known = known || (strcmp(role->valuestring, roles[r]) == 0);
        }
        if (!known) {
            return kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                     "'messages'[%d].role '%.32s' is not one of "
                                     "system, developer, user, assistant, tool", i,
                                     role->valuestring);
        }
        cJSON_ArrayForEach(k, m) {
            if ((strcmp(k->string, "role") != 0) && (strcmp(k->string, "content") != 0) &&
                (strcmp(k->string, "name") != 0) && (strcmp(k->string, "tool_calls") != 0) &&
                (strcmp(k->string, "tool_call_id") != 0)) {
                return kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                         "'messages'[%d].%.32s is not supported"
                                         " (role, content, name, tool_calls and tool_call_id are)",
                                         i, k->string);
            }
        }
        out = cJSON_CreateObject();
        if (out == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        cJSON_AddItemToArray(list, out);
        cJSON_AddStringToObject(out, "role", role->valuestring);
        k = cJSON_GetObjectItemCaseSensitive(m, "name");
        if (k != NULL) {
            if (!cJSON_IsString(k)) {
                return kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                         "'messages'[%d].name must be a string",
                                         i);
            }
            cJSON_AddStringToObject(out, "name", k->valuestring);
        }
        st = kvf_chat_content(m, i, out, param_p, err, cap);
        if (st == KVF_OK) {
            st = kvf_proxy_tools_message(m, role->valuestring, i, out, err, cap);
            if ((st != KVF_OK) && (param_p != NULL)) {
                *param_p = "messages";
            }
        }
        if (st != KVF_OK) {
            return st;
        }
        ++i;
    }
    return KVF_OK;
}

/* continue_final_message: the rendering cut after the last message's content. */
static kvf_status_t kvf_chat_continue(const cJSON *list, char *text, const char **param_p,
                                      char *err, size_t cap)
{
    const cJSON *last = cJSON_GetArrayItem(list, cJSON_GetArraySize(list) - 1);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(last, "content");

    if (!kvf_proxy_chat_continue_cut(text, cJSON_IsString(c) ? c->valuestring : "")) {
        (void)kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                "continue_final_message: the last message's "
                                "content does not appear in the template's rendering");
        if (param_p != NULL) {
            *param_p = "continue_final_message";
        }
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

kvf_status_t kvf_proxy_chat_render(const kvf_proxy_openai_ctx_t *ctx, const cJSON *messages,
                                   const kvf_proxy_chat_args_t *args, char **text_p,
                                   const char **param_p, char *err, size_t cap)
{
    cJSON *vars, *list, *it;
    kvf_status_t st;
    char jerr[256];

    if (ctx->chat_template == NULL) {
        return kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                 "this model has no chat template (no "
                                 "'chat_template' in its tokenizer_config.json): use "
                                 "/v1/completions");
    }
    vars = cJSON_CreateObject();
    list = cJSON_AddArrayToObject(vars, "messages");
    if (list == NULL) {
        cJSON_Delete(vars);
        return KVF_ERR_NO_MEMORY;
    }
    st = kvf_chat_messages(messages, list, param_p, err, cap);
    if (st == KVF_OK) {
        cJSON_AddBoolToObject(vars, "add_generation_prompt", args->add_generation_prompt);
        cJSON_AddStringToObject(vars, "bos_token", (ctx->bos_token != NULL) ? ctx->bos_token : "");
        cJSON_AddStringToObject(vars, "eos_token", (ctx->eos_token != NULL) ? ctx->eos_token : "");
        /* as transformers (vLLM) passes them: None when the request has none, so that a
         * template's 'tools is not none' reads as it does there */
        cJSON_AddNullToObject(vars, "tools");
        cJSON_AddNullToObject(vars, "documents");
        cJSON_ArrayForEach(it, args->vars) {   /* last: chat_template_kwargs override */
            cJSON *copy = cJSON_Duplicate(it, true);
            if (copy == NULL) {
                cJSON_Delete(vars);
                return KVF_ERR_NO_MEMORY;
            }
            cJSON_DeleteItemFromObjectCaseSensitive(vars, it->string);
            cJSON_AddItemToObject(vars, it->string, copy);
        }
        st = kvf_proxy_jinja_render(ctx->chat_template, vars, text_p, jerr, sizeof(jerr));
        if (st != KVF_OK) {
            (void)kvf_proxy_invalid(NULL, param_p, "messages", err, cap,
                                    "the chat template failed on these messages: "
                                    "%s", jerr);
        }
    }
    if ((st == KVF_OK) && args->continue_final_message) {
        st = kvf_chat_continue(list, *text_p, param_p, err, cap);
        if (st != KVF_OK) {
            free(*text_p);
            *text_p = NULL;
        }
    }
    cJSON_Delete(vars);
    return st;
}
