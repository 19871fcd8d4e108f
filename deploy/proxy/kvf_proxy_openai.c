/*
 * OpenAI /v1/completions request validation and response JSON.
 *
 * Validation is strict about types (a string max_tokens is an error, not
 * a number) because silently coercing is how clients end up with requests
 * that do something else than they asked. Parameters kvferry cannot honour
 * are refused with 400 instead of being ignored for the same reason.
 * Response objects follow OpenAI's text_completion shape; kvferry adds
 * kv_transfer (what moved between the instances), the two instances that
 * served the request and ttft_ms, which OpenAI clients ignore.
 */
#include "kvf_proxy_openai.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvf_status_t kvf_proxy_bad(int *http_p, const char **param_p, const char *param,
                                  int http, char *err, size_t cap, kvf_status_t status,
                                  const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

/* Record an error: its HTTP status, the offending field (NULL: none) and the message. */
static kvf_status_t kvf_proxy_bad(int *http_p, const char **param_p, const char *param,
                                  int http, char *err, size_t cap, kvf_status_t status,
                                  const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    *http_p = http;
    if (param_p != NULL) {
        *param_p = param;
    }
    return status;
}

/* An integral JSON number in [lo, hi]. */
static bool kvf_proxy_json_int(const cJSON *item, double lo, double hi, double *out)
{
    double v;

    if (!cJSON_IsNumber(item)) {
        return false;
    }
    v = item->valuedouble;
    if (!isfinite(v) || (floor(v) != v) || (v < lo) || (v > hi)) {
        return false;
    }
    *out = v;
    return true;
}

static kvf_status_t kvf_proxy_parse_prompt(const kvf_proxy_openai_ctx_t *ctx, const cJSON *prompt,
                                           kvf_proxy_completion_req_t *req, int *http_p,
                                           const char **param_p, char *err, size_t cap)
{
    int n = 0;

    if (prompt == NULL) {
        return kvf_proxy_bad(http_p, param_p, "prompt", 400, err, cap, KVF_ERR_INVALID_PARAM,
                             "'prompt' is required");
    }
    if (cJSON_IsString(prompt)) {
        size_t len = strlen(prompt->valuestring);
        /* at most one token per byte plus BOS, once each invalid UTF-8 byte has become
         * U+FFFD (3 bytes): a shorter capacity would call "a\xffb" too long */
        size_t most = 3 * len + 2;
        int capacity = (int)((most < (size_t)ctx->max_prompt_tokens + 1) ?
                             most : (size_t)ctx->max_prompt_tokens + 1);

        req->prompt_ids = malloc(sizeof(int32_t) * (size_t)(capacity > 0 ? capacity : 1));
        if (req->prompt_ids == NULL) {
            return kvf_proxy_bad(http_p, param_p, NULL,
                                 500, err, cap, KVF_ERR_NO_MEMORY, "out of memory");
        }
        n = kvf_tokenizer_encode(ctx->tok, prompt->valuestring, len, ctx->add_bos,
                                 req->prompt_ids, capacity);
        if (n < 0) {
            return kvf_proxy_bad(http_p, param_p, "prompt", 400, err, cap, KVF_ERR_OUT_OF_RANGE,
                                 "'prompt' is longer than %d tokens", ctx->max_prompt_tokens);
        }
    } else if (cJSON_IsArray(prompt)) {
        int size = cJSON_GetArraySize(prompt);
        const cJSON *item;

        if ((size > 0) && !cJSON_IsNumber(cJSON_GetArrayItem(prompt, 0))) {
            return kvf_proxy_bad(http_p, param_p, "prompt", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                 "'prompt' must be a string or an array of token ids "
                                 "(batched prompts are not supported)");
        }
        req->prompt_ids = malloc(sizeof(int32_t) * (size_t)(size > 0 ? size : 1));
        if (req->prompt_ids == NULL) {
            return kvf_proxy_bad(http_p, param_p, NULL,
                                 500, err, cap, KVF_ERR_NO_MEMORY, "out of memory");
        }
        cJSON_ArrayForEach(item, prompt) {
            double v;
            if (!kvf_proxy_json_int(item, 0, (double)ctx->tok->vocab_size - 1, &v)) {
                return kvf_proxy_bad(http_p, param_p, "prompt",
                                     400, err, cap, KVF_ERR_INVALID_PARAM,
                                     "'prompt'[%d] must be a token id in [0, %d)", n,
                                     ctx->tok->vocab_size);
            }
            req->prompt_ids[n++] = (int32_t)v;
        }
    } else {
        return kvf_proxy_bad(http_p, param_p, "prompt", 400, err, cap, KVF_ERR_INVALID_PARAM,
                             "'prompt' must be a string or an array of token ids");
    }
    if (n == 0) {
        return kvf_proxy_bad(http_p, param_p, "prompt",
                             400, err, cap, KVF_ERR_INVALID_PARAM, "'prompt' is empty");
    }
    if (n > ctx->max_prompt_tokens) {
        return kvf_proxy_bad(http_p, param_p, "prompt", 400, err, cap, KVF_ERR_OUT_OF_RANGE,
                             "'prompt' has %d tokens, more than the limit %d", n,
                             ctx->max_prompt_tokens);
    }
    req->num_prompt = n;
    return KVF_OK;
}

static kvf_status_t kvf_proxy_parse_fields(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                           kvf_proxy_completion_req_t *req, int *http_p,
                                           const char **param_p, char *err, size_t cap)
{
    static const char *const refused[] = {"stop", "logprobs", "echo", "suffix", "logit_bias",
                                          "tools"};
    const cJSON *it;
    double v;

    it = cJSON_GetObjectItemCaseSensitive(root, "model");
    if ((it != NULL) && !cJSON_IsNull(it)) {
        if (!cJSON_IsString(it)) {
            return kvf_proxy_bad(http_p, param_p, "model", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                 "'model' must be a string");
        }
        if (strcmp(it->valuestring, ctx->model_name) != 0) {
            return kvf_proxy_bad(http_p, param_p, "model", 404, err, cap, KVF_ERR_NOT_FOUND,
                                 "the model '%s' does not exist; this server serves '%s'",
                                 it->valuestring, ctx->model_name);
        }
    }

    req->max_tokens = ctx->default_max_tokens;
    it = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
    if ((it != NULL) && !cJSON_IsNull(it)) {
        if (!kvf_proxy_json_int(it, -1e18, 1e18, &v)) {
            return kvf_proxy_bad(http_p, param_p, "max_tokens",
                                 400, err, cap, KVF_ERR_INVALID_PARAM,
                                 "'max_tokens' must be an integer");
        }
        if ((v < 1) || (v > ctx->max_tokens_limit)) {
            return kvf_proxy_bad(http_p, param_p, "max_tokens",
                                 400, err, cap, KVF_ERR_INVALID_PARAM,
                                 "'max_tokens' = %.0f must be in [1, %u]", v,
                                 ctx->max_tokens_limit);
        }
        req->max_tokens = (uint32_t)v;
    }

    req->temperature = 1.0f;
    it = cJSON_GetObjectItemCaseSensitive(root, "temperature");
    if ((it != NULL) && !cJSON_IsNull(it)) {
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) {
            return kvf_proxy_bad(http_p, param_p, "temperature",
                                 400, err, cap, KVF_ERR_INVALID_PARAM,
                                 "'temperature' must be a number");
        }
        if ((it->valuedouble < 0) || (it->valuedouble > 100)) {
            return kvf_proxy_bad(http_p, param_p, "temperature",
                                 400, err, cap, KVF_ERR_INVALID_PARAM,
                                 "'temperature' = %g must be in [0, 100]", it->valuedouble);
        }
        req->temperature = (float)it->valuedouble;
    }

    it = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if ((it != NULL) && !cJSON_IsNull(it)) {
        if (!kvf_proxy_json_int(it, 0, 9007199254740991.0, &v)) {
            return kvf_proxy_bad(http_p, param_p, "seed", 400, err, cap, KVF_ERR_INVALID_PARAM,
                                 "'seed' must be a non-negative integer");
        }
        req->has_seed = true;
        req->seed = (uint64_t)v;
    }

    {
        static const char *const bools[] = {"stream", "ignore_eos", "return_token_ids"};
        bool *dst[] = {&req->stream, &req->ignore_eos, &req->return_token_ids};

        for (size_t i = 0; i < sizeof(bools) / sizeof(bools[0]); ++i) {
            it = cJSON_GetObjectItemCaseSensitive(root, bools[i]);
            if ((it == NULL) || cJSON_IsNull(it)) {
                continue;
            }
            if (!cJSON_IsBool(it)) {
                return kvf_proxy_bad(http_p, param_p, bools[i],
                                     400, err, cap, KVF_ERR_INVALID_PARAM,
                                     "'%s' must be a boolean", bools[i]);
            }
            *dst[i] = cJSON_IsTrue(it);
        }
    }

    static const char *const ones[] = {"n", "best_of"};
    for (size_t i = 0; i < sizeof(ones) / sizeof(ones[0]); ++i) {
        it = cJSON_GetObjectItemCaseSensitive(root, ones[i]);
        if ((it != NULL) && !cJSON_IsNull(it) &&
            (!kvf_proxy_json_int(it, 1, 1, &v))) {
            return kvf_proxy_bad(http_p, param_p, ones[i], 400, err, cap, KVF_ERR_INVALID_PARAM,
                                 "'%s' must be 1 (one completion per request)", ones[i]);
        }
    }
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); ++i) {
        it = cJSON_GetObjectItemCaseSensitive(root, refused[i]);
        if ((it != NULL) && !cJSON_IsNull(it) && !cJSON_IsFalse(it)) {
            return kvf_proxy_bad(http_p, param_p, refused[i], 400, err, cap, KVF_ERR_INVALID_PARAM,
                                 "'%s' is not supported", refused[i]);
        }
    }
    return kvf_proxy_parse_prompt(ctx, cJSON_GetObjectItemCaseSensitive(root, "prompt"), req,
                                  http_p, param_p, err, cap);
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

kvf_status_t kvf_proxy_openai_parse(const kvf_proxy_openai_ctx_t *ctx, const char *body,
                                    size_t len, kvf_proxy_completion_req_t *req_p, int *http_p,
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
        return kvf_proxy_bad(http_p, param_p, NULL, 400, err, err_cap, KVF_ERR_INVALID_PARAM,
                             "the request contains a NUL character (\\u0000), which kvferry "
                             "cannot pass on; remove it, or send the prompt as token ids");
    }
    {
        const char *end = NULL;

        root = cJSON_ParseWithLengthOpts(body, len, &end, false);
        if (root == NULL) {
            return kvf_proxy_bad(http_p, param_p, NULL, 400, err, err_cap, KVF_ERR_PARSE,
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
            return kvf_proxy_bad(http_p, param_p, NULL, 400, err, err_cap, KVF_ERR_PARSE,
                                 "request body has %zu bytes after its JSON value (at byte %zu):"
                                 " send exactly one JSON object", len - at, at);
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kvf_proxy_bad(http_p, param_p, NULL, 400, err, err_cap, KVF_ERR_INVALID_PARAM,
                             "request body must be a JSON object");
    }
    status = kvf_proxy_parse_fields(ctx, root, &req, http_p, param_p, err, err_cap);
    cJSON_Delete(root);
    if ((status == KVF_OK) && (ctx->max_model_len > 0) && (req.num_prompt > ctx->max_model_len)) {
        status = kvf_proxy_bad(http_p, param_p, "prompt", 400, err, err_cap,
                               KVF_ERR_OUT_OF_RANGE, "'prompt' is %d tokens, longer than the "
                               "model's max_position_embeddings (%d)", req.num_prompt,
                               ctx->max_model_len);
    } else if ((status == KVF_OK) && (ctx->max_model_len > 0) &&
               ((int64_t)req.num_prompt + req.max_tokens > ctx->max_model_len)) {
        status = kvf_proxy_bad(http_p, param_p, "max_tokens", 400, err, err_cap,
                               KVF_ERR_OUT_OF_RANGE, "'prompt' (%d tokens) plus 'max_tokens' (%u)"
                               " is longer than the model's max_position_embeddings (%d)",
                               req.num_prompt, req.max_tokens, ctx->max_model_len);
    }
    if ((status == KVF_OK) && !tok_ready) {
        /* checked with a stand-in, never sent: byte ids would give a wrong answer */
        status = kvf_proxy_bad(http_p, param_p, NULL, 503, err, err_cap, KVF_ERR_BUSY,
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

void kvf_proxy_openai_req_cleanup(kvf_proxy_completion_req_t *req)
{
    free(req->prompt_ids);
    req->prompt_ids = NULL;
    req->num_prompt = 0;
}

static char *kvf_proxy_print(cJSON *root)
{
    char *s = (root != NULL) ? cJSON_PrintUnformatted(root) : NULL;

    cJSON_Delete(root);
    return s;
}

char *kvf_proxy_openai_error_json(const char *message, const char *type, const char *param,
                                  int code)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    char code_s[16];

    if (e == NULL) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param != NULL) {
        cJSON_AddStringToObject(e, "param", param);
    } else {
        cJSON_AddNullToObject(e, "param");
    }
    /* OpenAI's code is a string (or null); kvferry's is the HTTP status. */
    snprintf(code_s, sizeof(code_s), "%d", code);
    cJSON_AddStringToObject(e, "code", code_s);
    return kvf_proxy_print(root);
}

static void kvf_proxy_add_ids(cJSON *o, const char *name, const int32_t *ids, int n)
{
    cJSON *arr = cJSON_AddArrayToObject(o, name);

    for (int i = 0; (arr != NULL) && (i < n); ++i) {
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    }
}

/* usage, kv_transfer, instances, ttft: the tail of a final object. */
static void kvf_proxy_add_summary(cJSON *root, const kvf_proxy_completion_req_t *req,
                                  const kvf_proxy_completion_t *c)
{
    cJSON *u = cJSON_AddObjectToObject(root, "usage");

    if (u != NULL) {
        cJSON_AddNumberToObject(u, "prompt_tokens", req->num_prompt);
        cJSON_AddNumberToObject(u, "completion_tokens", c->num_tokens);
        cJSON_AddNumberToObject(u, "total_tokens", req->num_prompt + c->num_tokens);
    }
    if (c->kv.valid) {
        cJSON *kv = cJSON_AddObjectToObject(root, "kv_transfer");
        if (kv != NULL) {
            cJSON_AddNumberToObject(kv, "bytes", (double)c->kv.bytes);
            cJSON_AddNumberToObject(kv, "descriptors", (double)c->kv.descriptors);
            cJSON_AddNumberToObject(kv, "reads", c->kv.reads);
            cJSON_AddNumberToObject(kv, "handshake_ms", c->kv.handshake_ms);
            cJSON_AddNumberToObject(kv, "transfer_ms", c->kv.transfer_ms);
            cJSON_AddBoolToObject(kv, "recomputed", c->kv.recomputed);
        }
    } else {
        cJSON_AddNullToObject(root, "kv_transfer");
    }
    if (c->prefill_instance != NULL) {
        cJSON_AddStringToObject(root, "prefill_instance", c->prefill_instance);
    }
    if (c->decode_instance != NULL) {
        cJSON_AddStringToObject(root, "decode_instance", c->decode_instance);
    }
    cJSON_AddNumberToObject(root, "ttft_ms", c->ttft_ms);
    cJSON_AddNumberToObject(root, "prefill_ms", c->prefill_ms);
    if (c->ttft_breakdown.valid) {
        const kvf_proxy_ttft_breakdown_t *bd = &c->ttft_breakdown;
        cJSON *o = cJSON_AddObjectToObject(root, "ttft_breakdown");
        char key[48];

        if (o != NULL) {
            cJSON_AddNumberToObject(o, "ttft_ms", bd->ttft_ms);
            cJSON_AddNumberToObject(o, "time_to_first_decode_token_ms", bd->first_decode_ms);
            for (int ph = 0; ph < KVF_PROXY_TTFT_PHASE_COUNT; ++ph) {
                snprintf(key, sizeof(key), "%s_ms", kvf_proxy_ttft_phase_name((kvf_proxy_ttft_phase_t)ph));
                cJSON_AddNumberToObject(o, key, bd->phase_ms[ph]);
            }
            cJSON_AddStringToObject(o, "tp_ranks", "max");
        }
    }
    if (req->return_token_ids) {
        kvf_proxy_add_ids(root, "prompt_token_ids", req->prompt_ids, req->num_prompt);
    }
}

static cJSON *kvf_proxy_object(const kvf_proxy_openai_ctx_t *ctx, const kvf_proxy_completion_t *c,
                               cJSON **choice_p)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *choices, *choice;

    if (root == NULL) {
        return NULL;
    }
    cJSON_AddStringToObject(root, "id", c->id);
    cJSON_AddStringToObject(root, "object", "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)c->created);
    cJSON_AddStringToObject(root, "model", ctx->model_name);
    choices = cJSON_AddArrayToObject(root, "choices");
    choice = cJSON_CreateObject();
    if ((choices == NULL) || (choice == NULL)) {
        cJSON_Delete(choice);
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddItemToArray(choices, choice);
    *choice_p = choice;
    return root;
}

char *kvf_proxy_openai_chunk_json(const kvf_proxy_openai_ctx_t *ctx,
                                  const kvf_proxy_completion_req_t *req,
                                  const kvf_proxy_completion_t *c, const char *text,
                                  const int32_t *ids, int num_ids, bool final)
{
    cJSON *choice;
    cJSON *root = kvf_proxy_object(ctx, c, &choice);

    if (root == NULL) {
        return NULL;
    }
    cJSON_AddStringToObject(choice, "text", text);
    cJSON_AddNumberToObject(choice, "index", 0);
    cJSON_AddNullToObject(choice, "logprobs");
    if (final) {
        cJSON_AddStringToObject(choice, "finish_reason",
                                (c->finish_reason[0] != '\0') ? c->finish_reason : "length");
    } else {
        cJSON_AddNullToObject(choice, "finish_reason");
    }
    if (req->return_token_ids) {
        kvf_proxy_add_ids(choice, "token_ids", ids, num_ids);
    }
    if (final) {
        kvf_proxy_add_summary(root, req, c);
    } else {
        /* Which instances serve the stream, known from the first chunk on. */
        if (c->prefill_instance != NULL) {
            cJSON_AddStringToObject(root, "prefill_instance", c->prefill_instance);
        }
        if (c->decode_instance != NULL) {
            cJSON_AddStringToObject(root, "decode_instance", c->decode_instance);
        }
    }
    return kvf_proxy_print(root);
}

/* A whole answer is its stream's final chunk carrying every token. */
char *kvf_proxy_openai_completion_json(const kvf_proxy_openai_ctx_t *ctx,
                                       const kvf_proxy_completion_req_t *req,
                                       const kvf_proxy_completion_t *c, const char *text)
{
    return kvf_proxy_openai_chunk_json(ctx, req, c, text, c->tokens, c->num_tokens, true);
}

char *kvf_proxy_openai_models_json(const kvf_proxy_openai_ctx_t *ctx, int64_t created)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();

    if ((data == NULL) || (m == NULL)) {
        cJSON_Delete(m);
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddStringToObject(m, "id", ctx->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "kvferry");
    cJSON_AddItemToArray(data, m);
    return kvf_proxy_print(root);
}
