/*
 * OpenAI /v1/completions and /v1/chat/completions request validation (the response JSON
 * is kvf_proxy_openai_reply.c, the field table and typed getters kvf_proxy_fields.c).
 *
 * Validation is strict about types (a string max_tokens is an error, not
 * a number) because silently coercing is how clients end up with requests
 * that do something else than they asked. Parameters kvferry cannot honour
 * are refused with 400 instead of being ignored for the same reason.
 */
#include "kvf_proxy_openai.h"
#include "kvf_proxy_fields.h"
#include "kvf_proxy_refuse.h"
#include "kvf_proxy_chat.h"
#include "kvf_proxy_sampling.h"
#include "kvf_proxy_message.h"
#include "kvf_sampling_limits.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_TRY(x) do { kvf_status_t st_ = (x); if (st_ != KVF_OK) { return st_; } } while (0)

/* One prompt (a string, or a list of token ids) into req->prompts[i]. */
static kvf_status_t kvf_proxy_parse_one_prompt(const kvf_proxy_openai_ctx_t *ctx,
                                               const cJSON *prompt, int idx, bool add_bos,
                                               kvf_proxy_completion_req_t *req, int *http_p,
                                               const char **param_p, char *err, size_t cap)
{
    int32_t *ids = NULL;
    int n = 0;

    if (cJSON_IsString(prompt)) {
        size_t len = strlen(prompt->valuestring);
        /* at most one token per byte plus BOS, once each invalid UTF-8 byte has become
         * U+FFFD (3 bytes): a shorter capacity would call "a\xffb" too long */
        size_t most = 3 * len + 2;
        int capacity = (int)((most < (size_t)ctx->max_prompt_tokens + 1) ?
                             most : (size_t)ctx->max_prompt_tokens + 1);

        ids = malloc(sizeof(int32_t) * (size_t)(capacity > 0 ? capacity : 1));
        if (ids == NULL) {
            return kvf_proxy_refuse(http_p, param_p, NULL,
                                    500, err, cap, KVF_ERR_NO_MEMORY, "out of memory");
        }
        req->prompts[idx] = ids;
        n = kvf_tokenizer_encode(ctx->tok, prompt->valuestring, len, add_bos, ids, capacity);
        if (n < 0) {
            return kvf_proxy_refuse(http_p, param_p, "prompt", 400, err, cap, KVF_ERR_OUT_OF_RANGE,
                                    "'prompt' is longer than %d tokens", ctx->max_prompt_tokens);
        }
    } else if (cJSON_IsArray(prompt)) {
        int size = cJSON_GetArraySize(prompt);
        const cJSON *item;

        ids = malloc(sizeof(int32_t) * (size_t)(size > 0 ? size : 1));
        if (ids == NULL) {
            return kvf_proxy_refuse(http_p, param_p, NULL,
                                    500, err, cap, KVF_ERR_NO_MEMORY, "out of memory");
        }
        req->prompts[idx] = ids;
        cJSON_ArrayForEach(item, prompt) {
            double v;
            if (!kvf_proxy_json_int(item, 0, (double)ctx->tok->vocab_size - 1, &v)) {
                return kvf_proxy_refuse(http_p, param_p, "prompt",
                                        400, err, cap, KVF_ERR_INVALID_PARAM,
                                        "'prompt'[%d] must be a token id in [0, %d)", n,
                                        ctx->tok->vocab_size);
            }
            ids[n++] = (int32_t)v;
        }
    } else {
        return kvf_proxy_refuse(http_p, param_p, "prompt", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'prompt' must be a string, an array of token ids, or an array "
                                "of those");
    }
    if (n == 0) {
        return kvf_proxy_refuse(http_p, param_p, "prompt",
                                400, err, cap, KVF_ERR_INVALID_PARAM, "'prompt' is empty");
    }
    if (n > ctx->max_prompt_tokens) {
        return kvf_proxy_refuse(http_p, param_p, "prompt", 400, err, cap, KVF_ERR_OUT_OF_RANGE,
                                "'prompt' has %d tokens, more than the limit %d", n,
                                ctx->max_prompt_tokens);
    }
    req->prompt_lens[idx] = n;
    return KVF_OK;
}

/* prompt: a string, a list of ids, or a list of those (one choice set per prompt). */
static kvf_status_t kvf_proxy_parse_prompt(const kvf_proxy_openai_ctx_t *ctx, const cJSON *prompt,
                                           bool add_bos, kvf_proxy_completion_req_t *req,
                                           int *http_p, const char **param_p, char *err,
                                           size_t cap)
{
    const cJSON *first;

    if (prompt == NULL) {
        return kvf_proxy_refuse(http_p, param_p, "prompt", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'prompt' is required");
    }
    first = cJSON_IsArray(prompt) ? cJSON_GetArrayItem(prompt, 0) : NULL;
    if ((first != NULL) && (cJSON_IsString(first) || cJSON_IsArray(first))) {
        int size = cJSON_GetArraySize(prompt);
        const cJSON *item;

        if (size > KVF_PROXY_MAX_CHOICES) {
            return kvf_proxy_refuse(http_p, param_p, "prompt", 400, err, cap,
                                    KVF_ERR_INVALID_PARAM, "'prompt' has %d prompts, more than "
                                    "%d", size, KVF_PROXY_MAX_CHOICES);
        }
        cJSON_ArrayForEach(item, prompt) {
            if (!cJSON_IsString(item) && !cJSON_IsArray(item)) {
                return kvf_proxy_refuse(http_p, param_p, "prompt", 400, err, cap,
                                        KVF_ERR_INVALID_PARAM, "'prompt'[%d] must be a string or "
                                        "an array of token ids", req->num_prompts);
            }
            KVF_TRY(kvf_proxy_parse_one_prompt(ctx, item, req->num_prompts, add_bos, req,
                                               http_p, param_p, err, cap));
            req->num_prompts++;
        }
    } else {
        KVF_TRY(kvf_proxy_parse_one_prompt(ctx, prompt, 0, add_bos, req, http_p, param_p, err,
                                           cap));
        req->num_prompts = 1;
    }
    req->prompt_ids = req->prompts[0];
    req->num_prompt = req->prompt_lens[0];
    return KVF_OK;
}

/* stop: a string or a list of strings (each 1..256 bytes). */
static kvf_status_t kvf_proxy_parse_stop(const cJSON *root, kvf_proxy_completion_req_t *req,
                                         int *http_p, const char **param_p, char *err,
                                         size_t cap)
{
    const cJSON *it = kvf_proxy_get(root, "stop"), *s;
    const cJSON *one[1];
    int n;

    if (it == NULL) {
        return KVF_OK;
    }
    n = cJSON_IsString(it) ? 1 : cJSON_IsArray(it) ? cJSON_GetArraySize(it) : -1;
    if (n < 0) {
        return kvf_proxy_refuse(http_p, param_p, "stop", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'stop' must be a string or an array of strings");
    }
    if (n > KVF_PROXY_MAX_STOP) {
        return kvf_proxy_refuse(http_p, param_p, "stop", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'stop' has %d strings, more than %d", n, KVF_PROXY_MAX_STOP);
    }
    one[0] = it;
    for (int i = 0; i < n; ++i) {
        s = cJSON_IsString(it) ? one[0] : cJSON_GetArrayItem(it, i);
        if (!cJSON_IsString(s) || (s->valuestring[0] == '\0') ||
            (strlen(s->valuestring) > 256)) {
            return kvf_proxy_refuse(http_p, param_p, "stop", 400, err, cap,
                                    KVF_ERR_INVALID_PARAM, "'stop'[%d] must be a string of 1 to "
                                    "256 bytes", i);
        }
        req->stop[req->num_stop] = strdup(s->valuestring);
        if (req->stop[req->num_stop] == NULL) {
            return kvf_proxy_refuse(http_p, param_p, NULL, 500, err, cap, KVF_ERR_NO_MEMORY,
                                    "out of memory");
        }
        req->num_stop++;
    }
    return KVF_OK;
}

/* stream_options: {include_usage, continuous_usage_stats}, only with stream. */
static kvf_status_t kvf_proxy_parse_stream_options(const cJSON *root,
                                                   kvf_proxy_completion_req_t *req,
                                                   int *http_p, const char **param_p,
                                                   char *err, size_t cap)
{
    const cJSON *o = kvf_proxy_get(root, "stream_options"), *it;

    if (o == NULL) {
        return KVF_OK;
    }
    if (!cJSON_IsObject(o)) {
        return kvf_proxy_refuse(http_p, param_p, "stream_options", 400, err, cap,
                                KVF_ERR_INVALID_PARAM, "'stream_options' must be an object");
    }
    if (!req->stream) {
        return kvf_proxy_refuse(http_p, param_p, "stream_options", 400, err, cap,
                                KVF_ERR_INVALID_PARAM, "'stream_options' needs 'stream': true");
    }
    cJSON_ArrayForEach(it, o) {
        bool *dst = (strcmp(it->string, "include_usage") == 0) ? &req->include_usage :
                    (strcmp(it->string, "continuous_usage_stats") == 0) ?
                    &req->continuous_usage : NULL;
        if (dst == NULL) {
            return kvf_proxy_refuse(http_p, param_p, "stream_options", 400, err, cap,
                                    KVF_ERR_INVALID_PARAM, "'stream_options' has an unknown key "
                                    "'%.64s' (include_usage, continuous_usage_stats)",
                                    it->string);
        }
        if (cJSON_IsNull(it)) {
            continue;
        }
        if (!cJSON_IsBool(it)) {
            return kvf_proxy_refuse(http_p, param_p, "stream_options", 400, err, cap,
                                    KVF_ERR_INVALID_PARAM, "'stream_options.%s' must be a boolean",
                                    it->string);
        }
        *dst = cJSON_IsTrue(it);
    }
    return KVF_OK;
}

/* stop_token_ids: ids in the vocabulary, at most 64. */
static kvf_status_t kvf_proxy_parse_stop_ids(const kvf_proxy_openai_ctx_t *ctx,
                                             const cJSON *root, kvf_proxy_completion_req_t *req,
                                             int *http_p, const char **param_p, char *err,
                                             size_t cap)
{
    const cJSON *it = kvf_proxy_get(root, "stop_token_ids"), *item;
    int max = (int)(sizeof(req->stop_token_ids) / sizeof(req->stop_token_ids[0]));

    if (it == NULL) {
        return KVF_OK;
    }
    if (!cJSON_IsArray(it) || (cJSON_GetArraySize(it) > max)) {
        return kvf_proxy_refuse(http_p, param_p, "stop_token_ids", 400, err, cap,
                                KVF_ERR_INVALID_PARAM, "'stop_token_ids' must be an array of at "
                                "most %d token ids", max);
    }
    cJSON_ArrayForEach(item, it) {
        double v;
        if (!kvf_proxy_json_int(item, 0, (double)ctx->tok->vocab_size - 1, &v)) {
            return kvf_proxy_refuse(http_p, param_p, "stop_token_ids", 400, err, cap,
                                    KVF_ERR_INVALID_PARAM, "'stop_token_ids'[%d] must be a token "
                                    "id in [0, %d)", req->num_stop_ids, ctx->tok->vocab_size);
        }
        req->stop_token_ids[req->num_stop_ids++] = (int32_t)v;
    }
    return KVF_OK;
}

/* The served names: model_name and the other --served-model-name ones. */
static bool kvf_proxy_serves(const kvf_proxy_openai_ctx_t *ctx, const char *name)
{
    if (strcmp(name, ctx->model_name) == 0) {
        return true;
    }
    for (int i = 0; i < ctx->num_names; ++i) {
        if (strcmp(name, ctx->names[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* "model" (one of the served names: 404 otherwise) and "max_tokens" (chat: or
 * "max_completion_tokens", which wins) in [1, MAX_TOKENS_LIMIT]. */
static kvf_status_t kvf_proxy_parse_model_max(const kvf_proxy_openai_ctx_t *ctx,
                                              const cJSON *root,
                                              kvf_proxy_completion_req_t *req, int *http_p,
                                              const char **param_p, char *err, size_t cap)
{
    const cJSON *it;
    double v;

    it = kvf_proxy_get(root, "model");
    if (it != NULL) {
        if (!cJSON_IsString(it)) {
            return kvf_proxy_refuse(http_p, param_p, "model", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                    "'model' must be a string");
        }
        if (!kvf_proxy_serves(ctx, it->valuestring)) {
            return kvf_proxy_refuse(http_p, param_p, "model", 404, err, cap, KVF_ERR_NOT_FOUND,
                                    "the model '%s' does not exist; this server serves '%s'",
                                    it->valuestring, ctx->model_name);
        }
    }
    req->max_tokens = ctx->default_max_tokens;
    {
        const char *mt = (req->chat && (kvf_proxy_get(root, "max_completion_tokens") != NULL)) ?
                         "max_completion_tokens" : "max_tokens";
        v = -1;
        KVF_TRY(kvf_proxy_intf(root, mt, -1e18, 1e18, &v, http_p, param_p, err, cap));
        if ((kvf_proxy_get(root, mt) != NULL) && ((v < 1) || (v > ctx->max_tokens_limit))) {
            return kvf_proxy_refuse(http_p, param_p, mt, 400, err, cap, KVF_ERR_INVALID_PARAM,
                                    "'%s' = %.0f must be in [1, %u]", mt, v,
                                    ctx->max_tokens_limit);
        }
        if (kvf_proxy_get(root, mt) != NULL) {
            req->max_tokens = (uint32_t)v;
        }
    }
    return KVF_OK;
}

/* The sampling and output fields both endpoints share. */
static kvf_status_t kvf_proxy_parse_common(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                           kvf_proxy_completion_req_t *req, int *http_p,
                                           const char **param_p, char *err, size_t cap)
{
    const cJSON *it;
    double v;

    KVF_TRY(kvf_proxy_parse_model_max(ctx, root, req, http_p, param_p, err, cap));
    req->temperature = 1.0f;
    KVF_TRY(kvf_proxy_num(root, "temperature", 0, 100, "[0, 100]", &req->temperature, http_p,
                          param_p, err, cap));
    req->top_p = 1.0f;
    KVF_TRY(kvf_proxy_num(root, "top_p", 0, 1, "(0, 1]", &req->top_p, http_p, param_p, err,
                          cap));
    if (req->top_p <= 0.0f) {
        return kvf_proxy_refuse(http_p, param_p, "top_p", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'top_p' = %g must be in (0, 1]", (double)req->top_p);
    }
    v = 0;
    KVF_TRY(kvf_proxy_intf(root, "top_k", -1, 1e9, &v, http_p, param_p, err, cap));
    req->top_k = (v > 0) ? (int)v : 0;
    KVF_TRY(kvf_proxy_num(root, "min_p", 0, 1, "[0, 1]", &req->min_p, http_p, param_p, err,
                          cap));
    KVF_TRY(kvf_proxy_num(root, "presence_penalty", -2, 2, "[-2, 2]", &req->presence_penalty,
                          http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_num(root, "frequency_penalty", -2, 2, "[-2, 2]", &req->frequency_penalty,
                          http_p, param_p, err, cap));
    req->repetition_penalty = 1.0f;
    KVF_TRY(kvf_proxy_num(root, "repetition_penalty", 0, 1e9, "(0, inf)",
                          &req->repetition_penalty, http_p, param_p, err, cap));
    if (req->repetition_penalty <= 0.0f) {
        return kvf_proxy_refuse(http_p, param_p, "repetition_penalty", 400, err, cap,
                                KVF_ERR_INVALID_PARAM, "'repetition_penalty' = %g must be > 0",
                                (double)req->repetition_penalty);
    }
    v = 0;
    KVF_TRY(kvf_proxy_intf(root, "min_tokens", 0, req->max_tokens, &v, http_p, param_p, err,
                           cap));
    req->min_tokens = (uint32_t)v;
    it = kvf_proxy_get(root, "seed");
    if (it != NULL) {
        /* vLLM takes any integer; the engine's generator takes its 64 bits */
        if (!kvf_proxy_json_int(it, -9223372036854775807.0, 18446744073709551615.0, &v)) {
            return kvf_proxy_refuse(http_p, param_p, "seed", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                    "'seed' must be an integer");
        }
        req->has_seed = true;
        req->seed = (v < 0) ? (uint64_t)(int64_t)v : (uint64_t)v;
    }
    it = kvf_proxy_get(root, "cache_salt");
    if ((it != NULL) && !cJSON_IsNull(it)) {
        /* vLLM: a non-empty string; kvferry also bounds it (the hash chain's root) */
        if (!cJSON_IsString(it) || (it->valuestring[0] == '\0') ||
            (strlen(it->valuestring) > 256)) {
            return kvf_proxy_refuse(http_p, param_p, "cache_salt", 400, err, cap,
                                    KVF_ERR_INVALID_PARAM,
                                    "'cache_salt' must be a non-empty string of at most 256 bytes");
        }
        req->cache_salt_len = (int)strlen(it->valuestring);
        memcpy(req->cache_salt, it->valuestring, (size_t)req->cache_salt_len + 1);
    }
    KVF_TRY(kvf_proxy_boolf(root, "stream", &req->stream, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_boolf(root, "ignore_eos", &req->ignore_eos, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_boolf(root, "return_token_ids", &req->return_token_ids, http_p, param_p,
                            err, cap));
    KVF_TRY(kvf_proxy_boolf(root, "include_stop_str_in_output", &req->include_stop_str_in_output,
                            http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_boolf(root, "echo", &req->echo, http_p, param_p, err, cap));
    v = 1;
    KVF_TRY(kvf_proxy_intf(root, "n", 1, KVF_PROXY_MAX_CHOICES, &v, http_p, param_p, err, cap));
    req->n = (int)v;
    KVF_TRY(kvf_proxy_parse_best_of(root, req, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_parse_prompt_logprobs(root, req, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_parse_stream_options(root, req, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_parse_stop(root, req, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_parse_stop_ids(ctx, root, req, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_parse_lists(ctx, root, req, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_parse_priority(ctx, root, req, http_p, param_p, err, cap));
    it = kvf_proxy_get(root, "user");
    if ((it != NULL) && !cJSON_IsString(it)) {   /* an end-user id: kept by no one */
        return kvf_proxy_refuse(http_p, param_p, "user", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'user' must be a string");
    }
    it = kvf_proxy_get(root, "request_id");
    if (it != NULL) {
        if (!cJSON_IsString(it) || (it->valuestring[0] == '\0') ||
            (strlen(it->valuestring) > 64)) {
            return kvf_proxy_refuse(http_p, param_p, "request_id", 400, err, cap,
                                    KVF_ERR_INVALID_PARAM, "'request_id' must be a string of 1 to"
                                    " 64 bytes");
        }
        snprintf(req->response_id, sizeof(req->response_id), "%s-%s",
                 req->chat ? "chatcmpl" : "cmpl", it->valuestring);
    }
    return KVF_OK;
}

/* logprobs: completions an integer in [0, 20]; chat a boolean with top_logprobs. */
static kvf_status_t kvf_proxy_parse_logprobs(const cJSON *root, kvf_proxy_completion_req_t *req,
                                             int *http_p, const char **param_p, char *err,
                                             size_t cap)
{
    double v = -1;

    if (!req->chat) {
        KVF_TRY(kvf_proxy_intf(root, "logprobs", 0, KVF_SAMPLING_MAX_LOGPROBS, &v, http_p,
                               param_p, err, cap));
        req->want_logprobs = (v >= 0);
        req->logprobs = (v >= 0) ? (int)v : 0;
        if (req->want_logprobs && req->echo) {
            return kvf_proxy_refuse(http_p, param_p, "echo", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                    "'echo' with 'logprobs' (the echoed prompt's logprobs in "
                                    "'logprobs') is not supported; ask 'prompt_logprobs'");
        }
        return KVF_OK;
    }
    KVF_TRY(kvf_proxy_boolf(root, "logprobs", &req->want_logprobs, http_p, param_p, err, cap));
    v = 0;
    KVF_TRY(kvf_proxy_intf(root, "top_logprobs", 0, KVF_SAMPLING_MAX_LOGPROBS, &v, http_p,
                           param_p, err, cap));
    if ((v > 0) && !req->want_logprobs) {
        return kvf_proxy_refuse(http_p, param_p, "top_logprobs", 400, err, cap,
                                KVF_ERR_INVALID_PARAM, "'top_logprobs' needs 'logprobs': true");
    }
    req->logprobs = (int)v;
    return KVF_OK;
}

/* truncate_prompt_tokens: keep the last k tokens of each prompt (-1: the model's length). */
static kvf_status_t kvf_proxy_truncate(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                       kvf_proxy_completion_req_t *req, int *http_p,
                                       const char **param_p, char *err, size_t cap)
{
    double v = 0;

    KVF_TRY(kvf_proxy_intf(root, "truncate_prompt_tokens", -1, 1e9, &v, http_p, param_p, err,
                           cap));
    if (v == 0) {
        if (kvf_proxy_get(root, "truncate_prompt_tokens") != NULL) {
            return kvf_proxy_refuse(http_p, param_p, "truncate_prompt_tokens", 400, err, cap,
                                    KVF_ERR_INVALID_PARAM, "'truncate_prompt_tokens' must be -1"
                                    " or at least 1");
        }
        return KVF_OK;
    }
    if (v < 0) {
        v = (ctx->max_model_len > 0) ? ctx->max_model_len : ctx->max_prompt_tokens;
    }
    for (int i = 0; i < req->num_prompts; ++i) {
        int keep = (int)v, n = req->prompt_lens[i];
        if (n > keep) {
            memmove(req->prompts[i], req->prompts[i] + (n - keep), (size_t)keep * sizeof(int32_t));
            req->prompt_lens[i] = keep;
        }
    }
    req->num_prompt = req->prompt_lens[0];
    return KVF_OK;
}

/* The fields of a chat request; messages rendered into prompts[0]. */
static kvf_status_t kvf_proxy_chat_fields(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                          kvf_proxy_completion_req_t *req, int *http_p,
                                          const char **param_p, char *err, size_t cap)
{
    bool add_special = false;
    kvf_proxy_chat_args_t args = {0};
    char *text = NULL;
    cJSON *s;
    kvf_status_t st;

    KVF_TRY(kvf_proxy_check_keys(root, KVF_F_CHAT, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_parse_common(ctx, root, req, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_parse_logprobs(root, req, http_p, param_p, err, cap));
    if (req->echo) {
        return kvf_proxy_refuse(http_p, param_p, "echo", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'echo' is not supported for chat (the prompt is a template's "
                                "rendering)");
    }
    /* chat: the template writes BOS itself; vLLM adds no special tokens by default */
    KVF_TRY(kvf_proxy_boolf(root, "add_special_tokens", &add_special, http_p, param_p, err,
                            cap));
    if (kvf_proxy_get(root, "messages") == NULL) {
        return kvf_proxy_refuse(http_p, param_p, "messages", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'messages' is required");
    }
    st = kvf_proxy_chat_args_parse(root, &args, http_p, param_p, err, cap);
    if (st == KVF_OK) {   /* tools, tool_choice, include_reasoning */
        st = kvf_proxy_message_parse(ctx, root, req, &args, http_p, param_p, err, cap);
    }
    if (st == KVF_OK) {
        st = kvf_proxy_chat_render(ctx, kvf_proxy_get(root, "messages"), &args, &text, param_p,
                                   err, cap);
        *http_p = (st == KVF_ERR_NO_MEMORY) ? 500 : 400;
    }
    kvf_proxy_chat_args_cleanup(&args);
    if (st != KVF_OK) {
        return st;
    }
    s = cJSON_CreateString(text);
    free(text);
    if (s == NULL) {
        return kvf_proxy_refuse(http_p, param_p, NULL, 500, err, cap, KVF_ERR_NO_MEMORY,
                                "out of memory");
    }
    st = kvf_proxy_parse_one_prompt(ctx, s, 0, ctx->add_bos && add_special, req, http_p,
                                    param_p, err, cap);
    cJSON_Delete(s);
    if (st != KVF_OK) {
        if ((param_p != NULL) && (*param_p != NULL) && (strcmp(*param_p, "prompt") == 0)) {
            *param_p = "messages";
        }
        return st;
    }
    req->num_prompts = 1;
    req->prompt_ids = req->prompts[0];
    req->num_prompt = req->prompt_lens[0];
    if (req->n > KVF_PROXY_MAX_CHOICES) {
        return kvf_proxy_refuse(http_p, param_p, "n", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'n' = %d is more than %d choices", req->n, KVF_PROXY_MAX_CHOICES);
    }
    return kvf_proxy_truncate(ctx, root, req, http_p, param_p, err, cap);
}

static kvf_status_t kvf_proxy_parse_fields(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                           kvf_proxy_completion_req_t *req, int *http_p,
                                           const char **param_p, char *err, size_t cap)
{
    bool add_special = true;

    KVF_TRY(kvf_proxy_check_keys(root, KVF_F_CMPL, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_parse_common(ctx, root, req, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_parse_logprobs(root, req, http_p, param_p, err, cap));
    KVF_TRY(kvf_proxy_boolf(root, "add_special_tokens", &add_special, http_p, param_p, err,
                            cap));
    KVF_TRY(kvf_proxy_parse_prompt(ctx, kvf_proxy_get(root, "prompt"), ctx->add_bos &&
                                   add_special, req, http_p, param_p, err, cap));
    if (req->num_prompts * kvf_proxy_req_per_prompt(req) > KVF_PROXY_MAX_CHOICES) {
        const char *f = (req->best_of > req->n) ? "best_of" : "n";
        return kvf_proxy_refuse(http_p, param_p, f, 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "%d prompts x '%s' = %d is %d choices, more than %d",
                                req->num_prompts, f, kvf_proxy_req_per_prompt(req),
                                req->num_prompts * kvf_proxy_req_per_prompt(req),
                                KVF_PROXY_MAX_CHOICES);
    }
    return kvf_proxy_truncate(ctx, root, req, http_p, param_p, err, cap);
}
/*
 * Whether the JSON text holds a NUL character: the escape \u0000 (any hex
 * case) or a raw NUL byte. cJSON keeps strings NUL-terminated, so such a
 * string would silently end at the NUL ("a\u0000bc" becomes "a"). Outside
 * strings a backslash is invalid JSON anyway, so walking escapes pairwise
 * (an escaped backslash is skipped whole, so "\\u0000" is not a NUL) is
 * enough without tracking string boundaries.
 */
static bool kvf_proxy_json_has_nul(const char *body, size_t len)
{
    for (size_t i = 0; i < len; ++i) {
        if (body[i] == '\0') {
            return true;
        }
        if (body[i] != '\\') {
            continue;
        }
        if ((i + 5 < len) && ((body[i + 1] == 'u') || (body[i + 1] == 'U')) &&
            (body[i + 2] == '0') && (body[i + 3] == '0') && (body[i + 4] == '0') &&
            (body[i + 5] == '0')) {
            return true;
        }
        ++i;   /* skip the escaped character, a backslash included */
    }
    return false;
}

static kvf_status_t kvf_proxy_parse_body(const kvf_proxy_openai_ctx_t *ctx, const char *body,
                                         size_t len, bool chat,
                                         kvf_proxy_completion_req_t *req_p, int *http_p,
                                         const char **param_p, char *err, size_t err_cap)
{
    kvf_proxy_completion_req_t req = {0};
    bool tok_ready = ctx->tok_ready;   /* read first: ctx->tok is then the real one */
    kvf_status_t status;
    cJSON *root;

    if (param_p != NULL) {
        *param_p = NULL;
    }
    if (kvf_proxy_json_has_nul(body, len)) {
        return kvf_proxy_refuse(http_p, param_p, NULL, 400, err, err_cap, KVF_ERR_INVALID_PARAM,
                                "the request contains a NUL character (\\u0000), which kvferry "
                                "cannot pass on; remove it, or send the prompt as token ids");
    }
    {
        const char *end = NULL;

        root = cJSON_ParseWithLengthOpts(body, len, &end, false);
        if (root == NULL) {
            return kvf_proxy_refuse(http_p, param_p, NULL, 400, err, err_cap, KVF_ERR_PARSE,
                                    "request body is not valid JSON");
        }
        /* one JSON value and nothing after it but white space: a second object
         * or stray bytes would be silently ignored otherwise */
        while ((end != NULL) && (end < body + len) &&
               ((*end == ' ') || (*end == '\t') || (*end == '\r') || (*end == '\n'))) {
            end++;
        }
        if ((end == NULL) || (end < body + len)) {
            size_t at = (end != NULL) ? (size_t)(end - body) : 0;
            cJSON_Delete(root);
            return kvf_proxy_refuse(http_p, param_p, NULL, 400, err, err_cap, KVF_ERR_PARSE,
                                    "request body has %zu bytes after its JSON value (at byte %zu):"
                                    " send exactly one JSON object", len - at, at);
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kvf_proxy_refuse(http_p, param_p, NULL, 400, err, err_cap, KVF_ERR_INVALID_PARAM,
                                "request body must be a JSON object");
    }
    req.chat = chat;
    status = chat ? kvf_proxy_chat_fields(ctx, root, &req, http_p, param_p, err, err_cap) :
                    kvf_proxy_parse_fields(ctx, root, &req, http_p, param_p, err, err_cap);
    cJSON_Delete(root);
    for (int i = 0; (status == KVF_OK) && (ctx->max_model_len > 0) && (i < req.num_prompts);
         ++i) {
        const char *what = chat ? "'messages'" : "'prompt'";
        if (req.prompt_lens[i] > ctx->max_model_len) {
            status = kvf_proxy_refuse(http_p, param_p, chat ? "messages" : "prompt", 400, err,
                                      err_cap, KVF_ERR_OUT_OF_RANGE, "%s is %d tokens, longer "
                                      "than the model's max_position_embeddings (%d)", what,
                                      req.prompt_lens[i], ctx->max_model_len);
        } else if ((int64_t)req.prompt_lens[i] + req.max_tokens > ctx->max_model_len) {
            status = kvf_proxy_refuse(http_p, param_p, "max_tokens", 400, err, err_cap,
                                      KVF_ERR_OUT_OF_RANGE, "%s (%d tokens) plus 'max_tokens' (%u)"
                                      " is longer than the model's max_position_embeddings (%d)",
                                      what, req.prompt_lens[i], req.max_tokens, ctx->max_model_len);
        }
    }
    if ((status == KVF_OK) && !tok_ready) {
        /* checked with a stand-in, never sent: byte ids would give a wrong answer */
        status = kvf_proxy_refuse(http_p, param_p, NULL, 503, err, err_cap, KVF_ERR_BUSY,
                                  "no healthy instance has given this proxy a tokenizer (started "
                                  "without --model, it takes the daemons' model folder when it "
                                  "can read it; its log and /health say why not); give it --model");
    }
    if (status != KVF_OK) {
        kvf_proxy_openai_req_cleanup(&req);
        return status;
    }
    *req_p = req;
    return KVF_OK;
}

kvf_status_t kvf_proxy_openai_parse(const kvf_proxy_openai_ctx_t *ctx, const char *body,
                                    size_t len, kvf_proxy_completion_req_t *req_p, int *http_p,
                                    const char **param_p, char *err, size_t err_cap)
{
    return kvf_proxy_parse_body(ctx, body, len, false, req_p, http_p, param_p, err, err_cap);
}

kvf_status_t kvf_proxy_openai_parse_chat(const kvf_proxy_openai_ctx_t *ctx, const char *body,
                                         size_t len, kvf_proxy_completion_req_t *req_p,
                                         int *http_p, const char **param_p, char *err,
                                         size_t err_cap)
{
    return kvf_proxy_parse_body(ctx, body, len, true, req_p, http_p, param_p, err, err_cap);
}

void kvf_proxy_openai_req_cleanup(kvf_proxy_completion_req_t *req)
{
    for (int i = 0; i < KVF_PROXY_MAX_CHOICES; ++i) {
        free(req->prompts[i]);
        req->prompts[i] = NULL;
    }
    for (int i = 0; i < req->num_stop; ++i) {
        free(req->stop[i]);
        req->stop[i] = NULL;
    }
    req->num_stop = 0;
    kvf_proxy_lists_cleanup(req);
    req->num_prompts = 0;
    req->prompt_ids = NULL;
    req->num_prompt = 0;
}
