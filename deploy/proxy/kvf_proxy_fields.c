/*
 * The fields of vLLM's completion and chat requests (kvf_proxy_fields.h): the table of every
 * field, honoured or refused by name unless it holds its "off" value, and the typed getters
 * the request parsers share, each refusing a bad value by the field's name.
 */
#include "kvf_proxy_fields.h"
#include "kvf_proxy_refuse.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* An integral JSON number in [lo, hi]. */
bool kvf_proxy_json_int(const cJSON *item, double lo, double hi, double *out)
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

/* ---- the fields of vLLM's requests --------------------------------------------- */

typedef enum {
    KVF_F_HONOURED = 0,    /* parsed below */
    KVF_F_NULL_FALSE,      /* refused unless null or false (off) */
    KVF_F_NULL_TRUE,       /* refused unless null or true (vLLM's default) */
    KVF_F_NULL_ONE,        /* refused unless null or 1 */
    KVF_F_NULL_ZERO,       /* refused unless null or 0 */
    KVF_F_NULL_EMPTY,      /* refused unless null or an empty object / array */
    KVF_F_NULL,            /* refused unless null */
} kvf_field_kind_t;

typedef struct {
    const char      *name;
    unsigned         where;   /* KVF_F_CMPL | KVF_F_CHAT */
    kvf_field_kind_t kind;
    const char      *why;     /* for a refusal */
} kvf_field_t;

/*
 * Every field of vLLM's CompletionRequest and ChatCompletionRequest: honoured,
 * or refused by name unless it holds its "off" value. README's table follows it.
 */
static const kvf_field_t kvf_proxy_fields[] = {
    {"model", 3, KVF_F_HONOURED, NULL},
    {"prompt", 1, KVF_F_HONOURED, NULL},
    {"messages", 2, KVF_F_HONOURED, NULL},
    {"max_tokens", 3, KVF_F_HONOURED, NULL},
    {"max_completion_tokens", 2, KVF_F_HONOURED, NULL},
    {"temperature", 3, KVF_F_HONOURED, NULL},
    {"top_p", 3, KVF_F_HONOURED, NULL},
    {"top_k", 3, KVF_F_HONOURED, NULL},
    {"min_p", 3, KVF_F_HONOURED, NULL},
    {"seed", 3, KVF_F_HONOURED, NULL},
    {"presence_penalty", 3, KVF_F_HONOURED, NULL},
    {"frequency_penalty", 3, KVF_F_HONOURED, NULL},
    {"repetition_penalty", 3, KVF_F_HONOURED, NULL},
    {"min_tokens", 3, KVF_F_HONOURED, NULL},
    {"stop", 3, KVF_F_HONOURED, NULL},
    {"stop_token_ids", 3, KVF_F_HONOURED, NULL},
    {"include_stop_str_in_output", 3, KVF_F_HONOURED, NULL},
    {"ignore_eos", 3, KVF_F_HONOURED, NULL},
    {"logprobs", 3, KVF_F_HONOURED, NULL},
    {"top_logprobs", 2, KVF_F_HONOURED, NULL},
    {"echo", 3, KVF_F_HONOURED, NULL},
    {"n", 3, KVF_F_HONOURED, NULL},
    {"stream", 3, KVF_F_HONOURED, NULL},
    {"stream_options", 3, KVF_F_HONOURED, NULL},
    {"user", 3, KVF_F_HONOURED, NULL},
    {"request_id", 3, KVF_F_HONOURED, NULL},
    {"return_token_ids", 3, KVF_F_HONOURED, NULL},
    {"add_special_tokens", 3, KVF_F_HONOURED, NULL},
    {"truncate_prompt_tokens", 3, KVF_F_HONOURED, NULL},
    {"add_generation_prompt", 2, KVF_F_HONOURED, NULL},
    {"skip_special_tokens", 3, KVF_F_NULL_TRUE, "special tokens are always skipped in text"},
    {"spaces_between_special_tokens", 3, KVF_F_NULL_TRUE, "special tokens are never shown"},
    {"best_of", 3, KVF_F_HONOURED, NULL},
    {"use_beam_search", 3, KVF_F_NULL_FALSE, "beam search is not supported"},
    {"length_penalty", 3, KVF_F_NULL_ONE, "beam search is not supported"},
    {"priority", 3, KVF_F_HONOURED, NULL},
    {"return_tokens_as_token_ids", 3, KVF_F_NULL_FALSE, "not supported"},
    {"suffix", 1, KVF_F_NULL, "insertion (suffix) is not supported"},
    {"logit_bias", 3, KVF_F_HONOURED, NULL},
    {"allowed_token_ids", 3, KVF_F_HONOURED, NULL},
    {"bad_words", 3, KVF_F_HONOURED, NULL},
    {"prompt_logprobs", 3, KVF_F_HONOURED, NULL},
    {"prompt_embeds", 1, KVF_F_NULL, "prompt embeddings are not supported"},
    {"response_format", 3, KVF_F_NULL, "structured output is not supported"},
    {"structured_outputs", 3, KVF_F_NULL, "structured output is not supported"},
    {"guided_json", 3, KVF_F_NULL, "guided decoding is not supported"},
    {"guided_regex", 3, KVF_F_NULL, "guided decoding is not supported"},
    {"guided_choice", 3, KVF_F_NULL, "guided decoding is not supported"},
    {"guided_grammar", 3, KVF_F_NULL, "guided decoding is not supported"},
    {"guided_decoding_backend", 3, KVF_F_NULL, "guided decoding is not supported"},
    {"guided_whitespace_pattern", 3, KVF_F_NULL, "guided decoding is not supported"},
    {"logits_processors", 3, KVF_F_NULL, "custom logits processors are not supported"},
    {"cache_salt", 3, KVF_F_HONOURED, NULL},
    {"kv_transfer_params", 3, KVF_F_NULL, "kvferry moves the KV itself"},
    {"vllm_xargs", 3, KVF_F_NULL, "extra engine arguments are not supported"},
    {"tools", 2, KVF_F_HONOURED, NULL},
    {"tool_choice", 2, KVF_F_HONOURED, NULL},
    {"parallel_tool_calls", 2, KVF_F_HONOURED, NULL},
    {"functions", 2, KVF_F_NULL, "function calling is not supported"},
    {"function_call", 2, KVF_F_NULL, "function calling is not supported"},
    {"reasoning_effort", 2, KVF_F_NULL, "reasoning effort is not supported"},
    {"include_reasoning", 2, KVF_F_HONOURED, NULL},
    {"continue_final_message", 2, KVF_F_HONOURED, NULL},
    {"documents", 2, KVF_F_HONOURED, NULL},
    {"chat_template", 2, KVF_F_NULL, "only the checkpoint's chat template is used"},
    {"chat_template_kwargs", 2, KVF_F_HONOURED, NULL},
    {"mm_processor_kwargs", 2, KVF_F_NULL, "multimodal input is not supported"},
    {"media_io_kwargs", 2, KVF_F_NULL, "multimodal input is not supported"},
    {"modalities", 2, KVF_F_NULL, "multimodal output is not supported"},
    {"audio", 2, KVF_F_NULL, "audio output is not supported"},
    {"prediction", 2, KVF_F_NULL, "predicted outputs are not supported"},
    {"store", 2, KVF_F_NULL_FALSE, "stored completions are not supported"},
    {"metadata", 2, KVF_F_NULL, "stored completions are not supported"},
    {"service_tier", 2, KVF_F_NULL, "service tiers are not supported"},
    {"web_search_options", 2, KVF_F_NULL, "web search is not supported"},
    {"thinking_token_budget", 3, KVF_F_NULL, "thinking budgets are not supported"},
};

/* A default-only field holds its "off" value. */
static bool kvf_field_is_off(const cJSON *it, kvf_field_kind_t kind)
{
    if (cJSON_IsNull(it)) {
        return true;
    }
    switch (kind) {
    case KVF_F_NULL_FALSE: return cJSON_IsFalse(it);
    case KVF_F_NULL_TRUE:  return cJSON_IsTrue(it);
    case KVF_F_NULL_ONE:   return cJSON_IsNumber(it) && (it->valuedouble == 1.0);
    case KVF_F_NULL_ZERO:  return cJSON_IsNumber(it) && (it->valuedouble == 0.0);
    case KVF_F_NULL_EMPTY: return (cJSON_IsObject(it) || cJSON_IsArray(it)) &&
                                  (it->child == NULL);
    default:               return false;
    }
}

/* Unknown keys and refused fields, by name. */
kvf_status_t kvf_proxy_check_keys(const cJSON *root, unsigned where, int *http_p,
                                  const char **param_p, char *err, size_t cap)
{
    const cJSON *it;

    cJSON_ArrayForEach(it, root) {
        const kvf_field_t *f = NULL;

        for (size_t i = 0; i < sizeof(kvf_proxy_fields) / sizeof(kvf_proxy_fields[0]); ++i) {
            if ((kvf_proxy_fields[i].where & where) &&
                (strcmp(kvf_proxy_fields[i].name, it->string) == 0)) {
                f = &kvf_proxy_fields[i];
                break;
            }
        }
        if (f == NULL) {
            /* param names the key: a copy that lives until this thread's next parse */
            static _Thread_local char key[72];
            snprintf(key, sizeof(key), "%.64s", it->string);
            return kvf_proxy_invalid(http_p, param_p, key, err, cap, "unknown field '%.64s': "
                                     "not a field of this endpoint (deploy/README.md lists the "
                                     "fields)", it->string);
        }
        if ((f->kind != KVF_F_HONOURED) && !kvf_field_is_off(it, f->kind)) {
            return kvf_proxy_refuse(http_p, param_p, f->name, 400, err, cap, KVF_ERR_INVALID_PARAM,
                                    "'%s' is not supported: %s", f->name, f->why);
        }
    }
    return KVF_OK;
}

/* The field, or NULL when absent or null. */
const cJSON *kvf_proxy_get(const cJSON *root, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);

    return ((it == NULL) || cJSON_IsNull(it)) ? NULL : it;
}

/* A number field in [lo, hi] (finite); absent leaves *out. */
kvf_status_t kvf_proxy_num(const cJSON *root, const char *name, double lo, double hi,
                           const char *range, float *out, int *http_p,
                           const char **param_p, char *err, size_t cap)
{
    const cJSON *it = kvf_proxy_get(root, name);

    if (it == NULL) {
        return KVF_OK;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) {
        return kvf_proxy_refuse(http_p, param_p, name, 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'%s' must be a number", name);
    }
    if ((it->valuedouble < lo) || (it->valuedouble > hi)) {
        return kvf_proxy_refuse(http_p, param_p, name, 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'%s' = %g must be in %s", name, it->valuedouble, range);
    }
    *out = (float)it->valuedouble;
    return KVF_OK;
}

/* An integer field in [lo, hi]; absent leaves *out. */
kvf_status_t kvf_proxy_intf(const cJSON *root, const char *name, double lo, double hi,
                            double *out, int *http_p, const char **param_p, char *err,
                            size_t cap)
{
    const cJSON *it = kvf_proxy_get(root, name);
    double v;

    if (it == NULL) {
        return KVF_OK;
    }
    if (!kvf_proxy_json_int(it, -1e18, 1e18, &v)) {
        return kvf_proxy_refuse(http_p, param_p, name, 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'%s' must be an integer", name);
    }
    if ((v < lo) || (v > hi)) {
        return kvf_proxy_refuse(http_p, param_p, name, 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'%s' = %.0f must be in [%.0f, %.0f]", name, v, lo, hi);
    }
    *out = v;
    return KVF_OK;
}

/* A boolean field; absent leaves *out. */
kvf_status_t kvf_proxy_boolf(const cJSON *root, const char *name, bool *out, int *http_p,
                             const char **param_p, char *err, size_t cap)
{
    const cJSON *it = kvf_proxy_get(root, name);

    if (it == NULL) {
        return KVF_OK;
    }
    if (!cJSON_IsBool(it)) {
        return kvf_proxy_refuse(http_p, param_p, name, 400, err, cap, KVF_ERR_INVALID_PARAM,
                                "'%s' must be a boolean", name);
    }
    *out = cJSON_IsTrue(it);
    return KVF_OK;
}
