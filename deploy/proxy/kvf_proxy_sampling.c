/* logit_bias, allowed_token_ids, bad_words of a request (kvf_proxy_sampling.h). */
#include "kvf_proxy_sampling.h"
#include "kvf_proxy_refuse.h"
#include "kvf_sampling_limits.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvf_status_t kvf_lists_nomem(int *http_p, char *err, size_t cap)
{
    snprintf(err, cap, "out of memory");
    *http_p = 500;
    return KVF_ERR_NO_MEMORY;
}

/* The field, or NULL when absent or null. */
static const cJSON *kvf_lists_get(const cJSON *root, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);

    return ((it == NULL) || cJSON_IsNull(it)) ? NULL : it;
}

/* A token id: an integral number in [0, vocab). */
static bool kvf_lists_id(double v, int vocab)
{
    return isfinite(v) && (floor(v) == v) && (v >= 0) && (v < (double)vocab);
}

/* logit_bias: {"<token id>": bias}; a key given twice keeps its last value (as a JSON
 * object read into a dict does); biases clamped to [-100, 100] as vLLM clamps them. */
static kvf_status_t kvf_parse_bias(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                   kvf_proxy_completion_req_t *req, int *http_p,
                                   const char **param_p, char *err, size_t cap)
{
    const cJSON *it = kvf_lists_get(root, "logit_bias"), *e;
    int n;

    if (it == NULL) {
        return KVF_OK;
    }
    n = cJSON_GetArraySize(it);
    if (!cJSON_IsObject(it) || (n > KVF_SAMPLING_MAX_BIAS)) {
        return kvf_proxy_invalid(http_p, param_p, "logit_bias", err, cap, "'logit_bias' must be "
                                 "an object of at most %d token ids to biases",
                                 KVF_SAMPLING_MAX_BIAS);
    }
    req->bias_ids = malloc((size_t)(n + 1) * sizeof(int32_t));
    req->bias_values = malloc((size_t)(n + 1) * sizeof(float));
    if ((req->bias_ids == NULL) || (req->bias_values == NULL)) {
        return kvf_lists_nomem(http_p, err, cap);
    }
    cJSON_ArrayForEach(e, it) {
        char *end = NULL;
        double id = strtod(e->string, &end);
        int at = req->num_bias;
        if ((strspn(e->string, "0123456789") != strlen(e->string)) || (*end != '\0') ||
            (e->string[0] == '\0') || !kvf_lists_id(id, ctx->tok->vocab_size)) {
            return kvf_proxy_invalid(http_p, param_p, "logit_bias", err, cap, "'logit_bias' key "
                                     "'%.32s' must be a token id in [0, %d)", e->string,
                                     ctx->tok->vocab_size);
        }
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble)) {
            return kvf_proxy_invalid(http_p, param_p, "logit_bias", err, cap, "'logit_bias' of "
                                     "token %s must be a number", e->string);
        }
        for (int j = 0; j < req->num_bias; ++j) {
            at = (req->bias_ids[j] == (int32_t)id) ? j : at;
        }
        req->bias_ids[at] = (int32_t)id;
        req->bias_values[at] = (float)fmin(100.0, fmax(-100.0, e->valuedouble));
        req->num_bias += (at == req->num_bias);
    }
    return KVF_OK;
}

/* allowed_token_ids: a non-empty array of ids in the vocabulary. */
static kvf_status_t kvf_parse_allowed(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                      kvf_proxy_completion_req_t *req, int *http_p,
                                      const char **param_p, char *err, size_t cap)
{
    const cJSON *it = kvf_lists_get(root, "allowed_token_ids"), *e;
    int n;

    if (it == NULL) {
        return KVF_OK;
    }
    n = cJSON_GetArraySize(it);
    if (!cJSON_IsArray(it) || (n < 1) || (n > KVF_SAMPLING_MAX_ALLOWED)) {
        return kvf_proxy_invalid(http_p, param_p, "allowed_token_ids", err, cap,
                                 "'allowed_token_ids' must be a non-empty array of at most %d "
                                 "token ids", KVF_SAMPLING_MAX_ALLOWED);
    }
    req->allowed_ids = malloc((size_t)n * sizeof(int32_t));
    if (req->allowed_ids == NULL) {
        return kvf_lists_nomem(http_p, err, cap);
    }
    cJSON_ArrayForEach(e, it) {
        if (!cJSON_IsNumber(e) || !kvf_lists_id(e->valuedouble, ctx->tok->vocab_size)) {
            return kvf_proxy_invalid(http_p, param_p, "allowed_token_ids", err, cap,
                                     "'allowed_token_ids'[%d] must be a token id in [0, %d)",
                                     req->num_allowed, ctx->tok->vocab_size);
        }
        req->allowed_ids[req->num_allowed++] = (int32_t)e->valuedouble;
    }
    return KVF_OK;
}

/* One token sequence appended to the request's bad words; false when over the caps. */
static bool kvf_bad_push(kvf_proxy_completion_req_t *req, const int32_t *ids, int n)
{
    if ((n < 1) || (req->num_bad_words >= KVF_SAMPLING_MAX_BAD_WORDS) ||
        (req->num_bad_tokens + n > KVF_SAMPLING_MAX_BAD_TOKENS)) {
        return false;
    }
    memcpy(req->bad_tokens + req->num_bad_tokens, ids, (size_t)n * sizeof(int32_t));
    req->num_bad_tokens += n;
    req->bad_ends[req->num_bad_words++] = (uint32_t)req->num_bad_tokens;
    return true;
}

/*
 * bad_words: strings, each tokenized (no BOS) as written without its leading whitespace,
 * and again after one space when that gives as many tokens and another first token (a
 * word inside a sentence): vLLM's rule. Only the token completing a sequence is masked.
 */
static kvf_status_t kvf_parse_bad_words(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                        kvf_proxy_completion_req_t *req, int *http_p,
                                        const char **param_p, char *err, size_t cap)
{
    const cJSON *it = kvf_lists_get(root, "bad_words"), *e;
    int32_t ids[2][KVF_SAMPLING_MAX_BAD_TOKENS];
    char text[1024];

    if (it == NULL) {
        return KVF_OK;
    }
    if (!cJSON_IsArray(it)) {
        return kvf_proxy_invalid(http_p, param_p, "bad_words", err, cap, "'bad_words' must be an "
                                 "array of strings");
    }
    req->bad_ends = malloc(KVF_SAMPLING_MAX_BAD_WORDS * sizeof(uint32_t));
    req->bad_tokens = malloc(KVF_SAMPLING_MAX_BAD_TOKENS * sizeof(int32_t));
    if ((req->bad_ends == NULL) || (req->bad_tokens == NULL)) {
        return kvf_lists_nomem(http_p, err, cap);
    }
    cJSON_ArrayForEach(e, it) {
        const char *w = cJSON_IsString(e) ? e->valuestring : NULL;
        int n0, n1;
        if ((w == NULL) || (strlen(w) + 2 > sizeof(text))) {
            return kvf_proxy_invalid(http_p, param_p, "bad_words", err, cap, "'bad_words' entries "
                                     "must be strings of at most %zu bytes", sizeof(text) - 2);
        }
        while ((*w == ' ') || (*w == '\t') || (*w == '\n') || (*w == '\r')) {
            ++w;
        }
        snprintf(text, sizeof(text), " %s", w);
        n0 = kvf_tokenizer_encode(ctx->tok, text + 1, strlen(text + 1), false, ids[0],
                                  KVF_SAMPLING_MAX_BAD_TOKENS);
        n1 = kvf_tokenizer_encode(ctx->tok, text, strlen(text), false, ids[1],
                                  KVF_SAMPLING_MAX_BAD_TOKENS);
        if ((n0 < 1) || !kvf_bad_push(req, ids[0], n0) ||
            ((n1 == n0) && (ids[1][0] != ids[0][0]) && !kvf_bad_push(req, ids[1], n1))) {
            return kvf_proxy_invalid(http_p, param_p, "bad_words", err, cap, "'bad_words': a word "
                                     "must be non-empty; at most %d token sequences of %d tokens "
                                     "in all (each word counts once, or twice with a leading space)",
                                     KVF_SAMPLING_MAX_BAD_WORDS, KVF_SAMPLING_MAX_BAD_TOKENS);
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_proxy_parse_lists(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                   kvf_proxy_completion_req_t *req, int *http_p,
                                   const char **param_p, char *err, size_t cap)
{
    kvf_status_t st = kvf_parse_bias(ctx, root, req, http_p, param_p, err, cap);

    if (st == KVF_OK) {
        st = kvf_parse_allowed(ctx, root, req, http_p, param_p, err, cap);
    }
    if (st == KVF_OK) {
        st = kvf_parse_bad_words(ctx, root, req, http_p, param_p, err, cap);
    }
    return st;
}

kvf_status_t kvf_proxy_parse_priority(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                      kvf_proxy_completion_req_t *req, int *http_p,
                                      const char **param_p, char *err, size_t cap)
{
    const cJSON *it = kvf_lists_get(root, "priority");
    double v;

    if (it == NULL) {
        return KVF_OK;
    }
    v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!isfinite(v) || (floor(v) != v) || (fabs(v) > 9007199254740992.0)) {
        return kvf_proxy_invalid(http_p, param_p, "priority", err, cap, "'priority' must be an "
                                 "integer (lower is served first)");
    }
    if ((v != 0.0) && !ctx->priority_scheduling) {
        return kvf_proxy_invalid(http_p, param_p, "priority", err, cap, "'priority' %.0f needs "
                                 "priority scheduling: start kvf-proxy with --scheduling-policy "
                                 "priority", v);
    }
    req->priority = (int64_t)v;
    return KVF_OK;
}

kvf_status_t kvf_proxy_parse_best_of(const cJSON *root, kvf_proxy_completion_req_t *req,
                                     int *http_p, const char **param_p, char *err, size_t cap)
{
    const cJSON *it = kvf_lists_get(root, "best_of");
    double v;

    if (it == NULL) {
        return KVF_OK;
    }
    v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!isfinite(v) || (floor(v) != v) || (v < req->n) || (v > KVF_PROXY_MAX_CHOICES)) {
        return kvf_proxy_invalid(http_p, param_p, "best_of", err, cap, "'best_of' must be an "
                                 "integer from 'n' (%d) to %d", req->n, KVF_PROXY_MAX_CHOICES);
    }
    if ((v > req->n) && req->stream) {
        return kvf_proxy_invalid(http_p, param_p, "best_of", err, cap, "'best_of' > 'n' cannot "
                                 "be streamed: the best are known when all are done");
    }
    req->best_of = (int)v;
    return KVF_OK;
}

kvf_status_t kvf_proxy_parse_prompt_logprobs(const cJSON *root, kvf_proxy_completion_req_t *req,
                                             int *http_p, const char **param_p, char *err,
                                             size_t cap)
{
    const cJSON *it = kvf_lists_get(root, "prompt_logprobs");
    double v;

    if (it == NULL) {
        return KVF_OK;
    }
    v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!isfinite(v) || (floor(v) != v) || (v < 0) || (v > KVF_SAMPLING_MAX_LOGPROBS)) {
        return kvf_proxy_invalid(http_p, param_p, "prompt_logprobs", err, cap, "'prompt_logprobs'"
                                 " must be an integer in [0, %d]", KVF_SAMPLING_MAX_LOGPROBS);
    }
    if (req->stream) {
        return kvf_proxy_invalid(http_p, param_p, "prompt_logprobs", err, cap, "'prompt_logprobs'"
                                 " is not supported with 'stream'");
    }
    req->want_prompt_logprobs = true;
    req->prompt_logprobs = (int)v;
    return KVF_OK;
}

kvf_status_t kvf_proxy_prompt_lp_take(kvf_proxy_completion_t *out, int num_prompt, int per,
                                      const Kvf__ServeReply *r)
{
    size_t n = r->n_prompt_token_logprobs;

    if ((n == 0) || (out->prompt_lp != NULL)) {
        return KVF_OK;
    }
    if ((r->n_prompt_ranks != n) || (n > (size_t)num_prompt) || (num_prompt < 1) ||
        (n + 1 > (size_t)num_prompt) || (r->prompt_top_per_token != (uint32_t)per) ||
        (r->n_prompt_top_ids != n * (size_t)per) || (r->n_prompt_top_logprobs != n * (size_t)per)) {
        return KVF_ERR_PARSE;
    }
    out->prompt_lp = malloc(n * sizeof(float));
    out->prompt_rank = malloc(n * sizeof(int32_t));
    out->prompt_top_ids = malloc((n * (size_t)per + 1) * sizeof(int32_t));
    out->prompt_top_lp = malloc((n * (size_t)per + 1) * sizeof(float));
    if ((out->prompt_lp == NULL) || (out->prompt_rank == NULL) || (out->prompt_top_ids == NULL) ||
        (out->prompt_top_lp == NULL)) {
        kvf_proxy_prompt_lp_free(out);
        return KVF_ERR_NO_MEMORY;
    }
    memcpy(out->prompt_lp, r->prompt_token_logprobs, n * sizeof(float));
    memcpy(out->prompt_rank, r->prompt_ranks, n * sizeof(int32_t));
    memcpy(out->prompt_top_ids, r->prompt_top_ids, n * (size_t)per * sizeof(int32_t));
    memcpy(out->prompt_top_lp, r->prompt_top_logprobs, n * (size_t)per * sizeof(float));
    out->num_prompt_lp = (int)n;
    out->prompt_per = per;
    return KVF_OK;
}

void kvf_proxy_prompt_lp_free(kvf_proxy_completion_t *out)
{
    free(out->prompt_lp);
    free(out->prompt_rank);
    free(out->prompt_top_ids);
    free(out->prompt_top_lp);
    out->prompt_lp = out->prompt_top_lp = NULL;
    out->prompt_rank = out->prompt_top_ids = NULL;
    out->num_prompt_lp = 0;
}

/* One {"logprob", "rank", "decoded_token"} entry under key @a id (not when already there). */
static void kvf_prompt_lp_entry(const kvf_proxy_openai_ctx_t *ctx, cJSON *pos, int32_t id,
                                float lp, int rank)
{
    char key[16], text[256];
    cJSON *e;

    snprintf(key, sizeof(key), "%d", id);
    if ((id < 0) || (cJSON_GetObjectItemCaseSensitive(pos, key) != NULL)) {
        return;
    }
    e = cJSON_AddObjectToObject(pos, key);
    if (e == NULL) {
        return;
    }
    (void)kvf_tokenizer_decode(ctx->tok, &id, 1, text, sizeof(text));
    cJSON_AddNumberToObject(e, "logprob", (double)lp);
    cJSON_AddNumberToObject(e, "rank", rank);
    cJSON_AddStringToObject(e, "decoded_token", text);
}

cJSON *kvf_proxy_prompt_lp_json(const kvf_proxy_openai_ctx_t *ctx,
                                const kvf_proxy_choice_out_t *ch)
{
    const kvf_proxy_completion_t *o = ch->flow_out;
    cJSON *list;

    if ((o == NULL) || (o->prompt_lp == NULL)) {
        return NULL;
    }
    list = cJSON_CreateArray();
    cJSON_AddItemToArray(list, cJSON_CreateNull());   /* the first token has none */
    for (int i = 0; (list != NULL) && (i < o->num_prompt_lp); ++i) {
        cJSON *pos = cJSON_CreateObject();
        size_t at = (size_t)i * (size_t)o->prompt_per;
        if (pos == NULL) {
            break;
        }
        kvf_prompt_lp_entry(ctx, pos, ch->prompt_ids[i + 1], o->prompt_lp[i], o->prompt_rank[i]);
        for (int k = 0; k < o->prompt_per; ++k) {
            kvf_prompt_lp_entry(ctx, pos, o->prompt_top_ids[at + (size_t)k],
                                o->prompt_top_lp[at + (size_t)k], k + 1);
        }
        cJSON_AddItemToArray(list, pos);
    }
    return list;
}

void kvf_proxy_lists_to_msg(const kvf_proxy_completion_req_t *req, Kvf__SamplingParams *sp)
{
    sp->n_bias_ids = sp->n_bias_values = (size_t)req->num_bias;
    sp->bias_ids = req->bias_ids;
    sp->bias_values = req->bias_values;
    sp->n_allowed_token_ids = (size_t)req->num_allowed;
    sp->allowed_token_ids = req->allowed_ids;
    sp->n_bad_ends = (size_t)req->num_bad_words;
    sp->bad_ends = req->bad_ends;
    sp->n_bad_tokens = (size_t)req->num_bad_tokens;
    sp->bad_tokens = req->bad_tokens;
    sp->has_prompt_logprobs = req->want_prompt_logprobs;
    sp->prompt_logprobs = (uint32_t)req->prompt_logprobs;
}

void kvf_proxy_lists_cleanup(kvf_proxy_completion_req_t *req)
{
    free(req->bias_ids);
    free(req->bias_values);
    free(req->allowed_ids);
    free(req->bad_ends);
    free(req->bad_tokens);
    req->bias_ids = req->allowed_ids = req->bad_tokens = NULL;
    req->bias_values = NULL;
    req->bad_ends = NULL;
    req->num_bias = req->num_allowed = req->num_bad_words = req->num_bad_tokens = 0;
}
