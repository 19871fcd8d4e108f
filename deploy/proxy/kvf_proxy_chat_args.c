/* The chat template's arguments beyond the messages (kvf_proxy_chat_args.h). */
#include "kvf_proxy_chat_args.h"
#include "kvf_proxy_refuse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cJSON *kvf_args_get(const cJSON *root, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);

    return ((it == NULL) || cJSON_IsNull(it)) ? NULL : it;
}

kvf_status_t kvf_proxy_chat_args_set(kvf_proxy_chat_args_t *args, const char *name,
                                     const cJSON *value)
{
    cJSON *copy = cJSON_Duplicate(value, true);

    if ((args->vars == NULL) && (copy != NULL)) {
        args->vars = cJSON_CreateObject();
    }
    if ((copy == NULL) || (args->vars == NULL)) {
        cJSON_Delete(copy);
        return KVF_ERR_NO_MEMORY;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(args->vars, name);
    cJSON_AddItemToObject(args->vars, name, copy);
    return KVF_OK;
}

/* documents: a list of objects whose values are strings (vLLM's list[dict[str, str]]). */
static bool kvf_args_documents_ok(const cJSON *docs)
{
    const cJSON *d, *kv;

    if (!cJSON_IsArray(docs)) {
        return false;
    }
    cJSON_ArrayForEach(d, docs) {
        if (!cJSON_IsObject(d)) {
            return false;
        }
        cJSON_ArrayForEach(kv, d) {
            if (!cJSON_IsString(kv)) {
                return false;
            }
        }
    }
    return true;
}

static kvf_status_t kvf_args_bool(const cJSON *root, const char *name, bool *out,
                                  int *http_p, const char **param_p, char *err, size_t cap)
{
    const cJSON *it = kvf_args_get(root, name);

    if (it == NULL) {
        return KVF_OK;
    }
    if (!cJSON_IsBool(it)) {
        return kvf_proxy_invalid(http_p, param_p, name, err, cap, "'%s' must be a boolean", name);
    }
    *out = cJSON_IsTrue(it);
    return KVF_OK;
}

kvf_status_t kvf_proxy_chat_args_parse(const cJSON *root, kvf_proxy_chat_args_t *args,
                                       int *http_p, const char **param_p, char *err,
                                       size_t cap)
{
    const cJSON *docs = kvf_args_get(root, "documents");
    const cJSON *kw = kvf_args_get(root, "chat_template_kwargs"), *it;
    kvf_status_t st;

    args->add_generation_prompt = true;
    st = kvf_args_bool(root, "add_generation_prompt", &args->add_generation_prompt, http_p,
                       param_p, err, cap);
    if (st == KVF_OK) {
        st = kvf_args_bool(root, "continue_final_message", &args->continue_final_message,
                           http_p, param_p, err, cap);
    }
    if (st != KVF_OK) {
        return st;
    }
    if (args->continue_final_message && args->add_generation_prompt) {
        return kvf_proxy_invalid(http_p, param_p, "continue_final_message", err, cap,
                                 "'continue_final_message' and 'add_generation_prompt' cannot both "
                                 "be true (set add_generation_prompt to false)");
    }
    if ((docs != NULL) && !kvf_args_documents_ok(docs)) {
        return kvf_proxy_invalid(http_p, param_p, "documents", err, cap, "'documents' must be a "
                                 "list of objects whose values are strings");
    }
    if ((docs != NULL) && (kvf_proxy_chat_args_set(args, "documents", docs) != KVF_OK)) {
        goto nomem;
    }
    if ((kw != NULL) && !cJSON_IsObject(kw)) {
        return kvf_proxy_invalid(http_p, param_p, "chat_template_kwargs", err, cap,
                                 "'chat_template_kwargs' must be an object of template variables");
    }
    cJSON_ArrayForEach(it, kw) {
        if (strcmp(it->string, "messages") == 0) {
            return kvf_proxy_invalid(http_p, param_p, "chat_template_kwargs", err, cap,
                                     "'chat_template_kwargs' cannot set 'messages'");
        }
        if (kvf_proxy_chat_args_set(args, it->string, it) != KVF_OK) {
            goto nomem;
        }
    }
    return KVF_OK;
nomem:
    *http_p = 500;
    snprintf(err, cap, "out of memory");
    return KVF_ERR_NO_MEMORY;
}

void kvf_proxy_chat_args_cleanup(kvf_proxy_chat_args_t *args)
{
    cJSON_Delete(args->vars);
    args->vars = NULL;
}

/* The last occurrence of @a needle (@a n bytes) in @a hay, or NULL. */
static char *kvf_args_rfind(char *hay, const char *needle, size_t n)
{
    char *last = NULL;

    for (char *p = strstr(hay, needle); (n > 0) && (p != NULL); p = strstr(p + 1, needle)) {
        last = p;
    }
    return last;
}

bool kvf_proxy_chat_continue_cut(char *text, const char *final)
{
    size_t n = strlen(final), lead = 0;
    char *hit = kvf_args_rfind(text, final, n), *trimmed;

    if (n == 0) {
        return true;   /* an empty message: nothing to continue, nothing cut */
    }
    if (hit == NULL) {   /* a template that strips the content: look for it stripped */
        while ((lead < n) && (strchr(" \t\r\n", final[lead]) != NULL)) {
            ++lead;
        }
        while ((n > lead) && (strchr(" \t\r\n", final[n - 1]) != NULL)) {
            --n;
        }
        if (n == lead) {
            return true;
        }
        trimmed = strndup(final + lead, n - lead);
        hit = (trimmed != NULL) ? kvf_args_rfind(text, trimmed, n - lead) : NULL;
        free(trimmed);
        if (hit == NULL) {
            return false;
        }
        n -= lead;
    }
    hit[n] = '\0';
    return true;
}
