/* /tokenize, /detokenize, /version (kvf_proxy_tokenize.h). */
#include "kvf_proxy_tokenize.h"
#include "kvf_proxy_chat.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KVF_PROXY_VERSION
#define KVF_PROXY_VERSION "unknown"
#endif

static char *kvf_tok_bad(int *http_p, const char **param_p, const char *param, char *err,
                         size_t cap, const char *msg)
{
    *http_p = 400;
    *param_p = param;
    snprintf(err, cap, "%s", msg);
    return NULL;
}

/* The body as an object whose keys are all in @a keys; NULL after an error. */
static cJSON *kvf_tok_body(const kvf_proxy_openai_ctx_t *ctx, const char *body, size_t len,
                           const char *const *keys, int *http_p, const char **param_p,
                           char *err, size_t cap)
{
    cJSON *root = cJSON_ParseWithLength(body, len), *it;

    *param_p = NULL;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        (void)kvf_tok_bad(http_p, param_p, NULL, err, cap, "request body must be a JSON "
                          "object");
        return NULL;
    }
    cJSON_ArrayForEach(it, root) {
        bool known = false;
        for (int i = 0; keys[i] != NULL; ++i) {
            known = known || (strcmp(keys[i], it->string) == 0);
        }
        if (!known) {
            *http_p = 400;
            snprintf(err, cap, "unknown field '%.64s'", it->string);
            cJSON_Delete(root);
            return NULL;
        }
    }
    it = cJSON_GetObjectItemCaseSensitive(root, "model");
    if ((it != NULL) && !cJSON_IsNull(it)) {
        bool ok = cJSON_IsString(it) && (strcmp(it->valuestring, ctx->model_name) == 0);
        for (int i = 0; cJSON_IsString(it) && (i < ctx->num_names); ++i) {
            ok = ok || (strcmp(it->valuestring, ctx->names[i]) == 0);
        }
        if (!ok) {
            cJSON_Delete(root);
            *http_p = 404;
            *param_p = "model";
            snprintf(err, cap, "the model does not exist; this server serves '%s'",
                     ctx->model_name);
            return NULL;
        }
    }
    return root;
}

static bool kvf_tok_bool(const cJSON *root, const char *name, bool dflt, bool *ok)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);

    if ((it == NULL) || cJSON_IsNull(it)) {
        return dflt;
    }
    if (!cJSON_IsBool(it)) {
        *ok = false;
    }
    return cJSON_IsTrue(it);
}

char *kvf_proxy_tokenize_json(const kvf_proxy_openai_ctx_t *ctx, const char *body, size_t len,
                              int *http_p, const char **param_p, char *err, size_t cap)
{
    static const char *const keys[] = {"model", "prompt", "messages", "add_special_tokens",
                                       "add_generation_prompt", "return_token_strs", NULL};
    cJSON *root = kvf_tok_body(ctx, body, len, keys, http_p, param_p, err, cap);
    const cJSON *prompt, *messages;
    char *text = NULL, *json = NULL;
    bool ok = true, chat, special, strs;
    int32_t *ids;
    int n, capn;
    cJSON *out, *arr, *sarr;

    if (root == NULL) {
        return NULL;
    }
    prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    messages = cJSON_GetObjectItemCaseSensitive(root, "messages");
    chat = (messages != NULL);
    if (chat == (prompt != NULL)) {
        cJSON_Delete(root);
        return kvf_tok_bad(http_p, param_p, "prompt", err, cap, "give 'prompt' (a string) or "
                           "'messages', one of them");
    }
    special = kvf_tok_bool(root, "add_special_tokens", !chat, &ok);
    strs = kvf_tok_bool(root, "return_token_strs", false, &ok);
    if (!ok) {
        cJSON_Delete(root);
        return kvf_tok_bad(http_p, param_p, NULL, err, cap, "add_special_tokens, "
                           "add_generation_prompt and return_token_strs must be booleans");
    }
    if (chat) {
        kvf_proxy_chat_args_t args = {.add_generation_prompt = true};
        kvf_status_t st;
        args.add_generation_prompt = kvf_tok_bool(root, "add_generation_prompt", true, &ok);
        st = kvf_proxy_chat_render(ctx, messages, &args, &text, param_p, err, cap);
        if (st != KVF_OK) {
            *http_p = 400;
            cJSON_Delete(root);
            return NULL;
        }
    } else if (!cJSON_IsString(prompt)) {
        cJSON_Delete(root);
        return kvf_tok_bad(http_p, param_p, "prompt", err, cap, "'prompt' must be a string");
    } else {
        text = strdup(prompt->valuestring);
    }
    cJSON_Delete(root);
    if (text == NULL) {
        *http_p = 500;
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    capn = (int)strlen(text) * 3 + 2;
    ids = malloc(sizeof(int32_t) * (size_t)capn);
    n = (ids != NULL) ? kvf_tokenizer_encode(ctx->tok, text, strlen(text),
                                             special && ctx->add_bos, ids, capn) : -1;
    free(text);
    if (n < 0) {
        free(ids);
        *http_p = 500;
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "count", n);
    cJSON_AddNumberToObject(out, "max_model_len", ctx->max_model_len);
    arr = cJSON_AddArrayToObject(out, "tokens");
    sarr = strs ? cJSON_AddArrayToObject(out, "token_strs") : NULL;
    if (!strs) {
        cJSON_AddNullToObject(out, "token_strs");
    }
    for (int i = 0; (arr != NULL) && (i < n); ++i) {
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
        if (sarr != NULL) {
            char t[256];
            (void)kvf_tokenizer_decode(ctx->tok, &ids[i], 1, t, sizeof(t));
            cJSON_AddItemToArray(sarr, cJSON_CreateString(t));
        }
    }
    free(ids);
    json = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    return json;
}

char *kvf_proxy_detokenize_json(const kvf_proxy_openai_ctx_t *ctx, const char *body,
                                size_t len, int *http_p, const char **param_p, char *err,
                                size_t cap)
{
    static const char *const keys[] = {"model", "tokens", NULL};
    cJSON *root = kvf_tok_body(ctx, body, len, keys, http_p, param_p, err, cap);
    const cJSON *toks, *it;
    int32_t *ids;
    int n = 0, size;
    char *text, *json;
    cJSON *out;

    if (root == NULL) {
        return NULL;
    }
    toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(toks)) {
        cJSON_Delete(root);
        return kvf_tok_bad(http_p, param_p, "tokens", err, cap, "'tokens' must be a list of "
                           "token ids");
    }
    size = cJSON_GetArraySize(toks);
    ids = malloc(sizeof(int32_t) * (size_t)(size + 1));
    text = malloc((size_t)size * 64 + 1);
    if ((ids == NULL) || (text == NULL)) {
        free(ids);
        free(text);
        cJSON_Delete(root);
        *http_p = 500;
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    cJSON_ArrayForEach(it, toks) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if ((v < 0) || (v >= ctx->tok->vocab_size) || (floor(v) != v)) {
            *http_p = 400;
            *param_p = "tokens";
            snprintf(err, cap, "'tokens'[%d] must be a token id in [0, %d)", n,
                     ctx->tok->vocab_size);
            free(ids);
            free(text);
            cJSON_Delete(root);
            return NULL;
        }
        ids[n++] = (int32_t)v;
    }
    cJSON_Delete(root);
    (void)kvf_tokenizer_decode(ctx->tok, ids, n, text, (size_t)size * 64 + 1);
    free(ids);
    out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", text);
    free(text);
    json = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    return json;
}

char *kvf_proxy_version_json(void)
{
    cJSON *out = cJSON_CreateObject();
    char *json;

    cJSON_AddStringToObject(out, "version", KVF_PROXY_VERSION);
    json = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    return json;
}
