/* SamplingParams to kvf_sampling_t, checked; logprobs into replies (kvf_sampling_msg.h). */
#include "kvf_sampling_msg.h"
#include "kvf_array.h"
#include "kvf_sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* memcpy of @a n bytes; none when @a n is 0 (protobuf-c leaves an empty list NULL, and a
 * NULL source is undefined behaviour even for 0 bytes: UBSan stops the daemon there). */
static void kvf_sampling_copy(void *dst, const void *src, size_t n)
{
    if (n > 0) {
        memcpy(dst, src, n);
    }
}

/* logit_bias, allowed_token_ids, bad_words: the counts (what fits the engine's arrays);
 * kvf_sampling_check() then checks the values. */
static kvf_status_t kvf_sampling_lists_from_msg(const Kvf__SamplingParams *msg,
                                                kvf_sampling_t *out, char *err, size_t cap)
{
    if ((msg->n_bias_ids != msg->n_bias_values) || (msg->n_bias_ids > KVF_SAMPLING_MAX_BIAS)) {
        snprintf(err, cap, "logit_bias has %zu ids and %zu values: at most %d of each, as "
                 "many", msg->n_bias_ids, msg->n_bias_values, KVF_SAMPLING_MAX_BIAS);
        return KVF_ERR_INVALID_PARAM;
    }
    out->num_logit_bias = (int)msg->n_bias_ids;
    kvf_sampling_copy(out->bias_ids, msg->bias_ids, msg->n_bias_ids * sizeof(int32_t));
    kvf_sampling_copy(out->bias_values, msg->bias_values, msg->n_bias_values * sizeof(float));
    if (msg->n_allowed_token_ids > KVF_SAMPLING_MAX_ALLOWED) {
        snprintf(err, cap, "allowed_token_ids has %zu entries, more than %d",
                 msg->n_allowed_token_ids, KVF_SAMPLING_MAX_ALLOWED);
        return KVF_ERR_INVALID_PARAM;
    }
    out->num_allowed = (int)msg->n_allowed_token_ids;
    kvf_sampling_copy(out->allowed_ids, msg->allowed_token_ids,
                      msg->n_allowed_token_ids * sizeof(int32_t));
    if ((msg->n_bad_ends > KVF_SAMPLING_MAX_BAD_WORDS) ||
        (msg->n_bad_tokens > KVF_SAMPLING_MAX_BAD_TOKENS) ||
        ((msg->n_bad_ends > 0) && (msg->bad_ends[msg->n_bad_ends - 1] != msg->n_bad_tokens))) {
        snprintf(err, cap, "bad_words: %zu sequences of %zu tokens in all (at most %d and %d; "
                 "the last must end at the last token)", msg->n_bad_ends, msg->n_bad_tokens,
                 KVF_SAMPLING_MAX_BAD_WORDS, KVF_SAMPLING_MAX_BAD_TOKENS);
        return KVF_ERR_INVALID_PARAM;
    }
    out->num_bad_words = (int)msg->n_bad_ends;
    for (size_t w = 0; w < msg->n_bad_ends; ++w) {
        out->bad_ends[w] = (int)msg->bad_ends[w];   /* <= n_bad_tokens checked below */
        if (msg->bad_ends[w] > msg->n_bad_tokens) {
            snprintf(err, cap, "bad_words sequence %zu ends at %u, past its %zu tokens", w,
                     msg->bad_ends[w], msg->n_bad_tokens);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    kvf_sampling_copy(out->bad_tokens, msg->bad_tokens, msg->n_bad_tokens * sizeof(int32_t));
    return KVF_OK;
}

kvf_status_t kvf_sampling_from_msg(const Kvf__SamplingParams *msg, int default_max, int vocab,
                                   kvf_sampling_t *out, char *err, size_t cap)
{
    memset(out, 0, sizeof(*out));
    out->max_tokens = default_max;
    if (msg == NULL) {
        return kvf_sampling_check(out, vocab, err, cap);
    }
    out->temperature = msg->temperature;
    out->seed = msg->seed;
    out->ignore_eos = msg->ignore_eos;
    if (msg->has_max_tokens) {
        /* (decode also checks max_tokens + prompt length against an int) */
        if ((msg->max_tokens < 1) || (msg->max_tokens > (uint32_t)INT32_MAX)) {
            snprintf(err, cap, "max_tokens %u must be in [1, %d]", msg->max_tokens, INT32_MAX);
            return KVF_ERR_INVALID_PARAM;
        }
        out->max_tokens = (int)msg->max_tokens;
    }
    out->top_p = msg->has_top_p ? msg->top_p : 0.0f;
    if (msg->has_top_p && !(msg->top_p > 0.0f)) {
        snprintf(err, cap, "top_p %g must be in (0, 1]", (double)msg->top_p);
        return KVF_ERR_INVALID_PARAM;
    }
    out->top_k = msg->top_k;
    out->min_p = msg->min_p;
    out->presence_penalty = msg->presence_penalty;
    out->frequency_penalty = msg->frequency_penalty;
    out->repetition_penalty = msg->has_repetition_penalty ? msg->repetition_penalty : 1.0f;
    if (msg->has_repetition_penalty && !(msg->repetition_penalty > 0.0f)) {
        snprintf(err, cap, "repetition_penalty %g must be > 0", (double)msg->repetition_penalty);
        return KVF_ERR_INVALID_PARAM;
    }
    if (msg->min_tokens > (uint32_t)out->max_tokens) {
        snprintf(err, cap, "min_tokens %u must be in [0, max_tokens = %d]", msg->min_tokens,
                 out->max_tokens);
        return KVF_ERR_INVALID_PARAM;
    }
    out->min_tokens = (int)msg->min_tokens;
    if (msg->n_stop_token_ids > KVF_SAMPLING_MAX_STOP_IDS) {
        snprintf(err, cap, "stop_token_ids has %zu entries, more than %d",
                 msg->n_stop_token_ids, KVF_SAMPLING_MAX_STOP_IDS);
        return KVF_ERR_INVALID_PARAM;
    }
    out->num_stop_token_ids = (int)msg->n_stop_token_ids;
    kvf_sampling_copy(out->stop_token_ids, msg->stop_token_ids,
                      msg->n_stop_token_ids * sizeof(int32_t));
    if (msg->has_logprobs) {
        if (msg->logprobs > KVF_SAMPLING_MAX_LOGPROBS) {
            snprintf(err, cap, "logprobs %u must be in [0, %d]", msg->logprobs,
                     KVF_SAMPLING_MAX_LOGPROBS);
            return KVF_ERR_INVALID_PARAM;
        }
        out->want_logprobs = true;
        out->logprobs = (int)msg->logprobs;
    }
    if (msg->has_prompt_logprobs) {
        if (msg->prompt_logprobs > KVF_SAMPLING_MAX_LOGPROBS) {
            snprintf(err, cap, "prompt_logprobs %u must be in [0, %d]", msg->prompt_logprobs,
                     KVF_SAMPLING_MAX_LOGPROBS);
            return KVF_ERR_INVALID_PARAM;
        }
        out->want_prompt_logprobs = true;
        out->prompt_logprobs = (int)msg->prompt_logprobs;
    }
    if (kvf_sampling_lists_from_msg(msg, out, err, cap) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_sampling_check(out, vocab, err, cap);
}

kvf_status_t kvf_logprob_buf_push(kvf_logprob_buf_t *b, int per_token,
                                  const kvf_engine_event_t *ev)
{
    if (b->cap <= b->n) {
        int cap = (b->cap > 0) ? 2 * b->cap : 16;
        float *tl = realloc(b->token_logprobs, (size_t)cap * sizeof(float));
        if (tl != NULL) {
            b->token_logprobs = tl;
        }
        int32_t *ti = realloc(b->top_ids, (size_t)cap * KVF_SAMPLING_MAX_LOGPROBS *
                                          sizeof(int32_t));
        if (ti != NULL) {
            b->top_ids = ti;
        }
        float *tp = realloc(b->top_logprobs, (size_t)cap * KVF_SAMPLING_MAX_LOGPROBS *
                                             sizeof(float));
        if (tp != NULL) {
            b->top_logprobs = tp;
        }
        if ((tl == NULL) || (ti == NULL) || (tp == NULL)) {
            return KVF_ERR_NO_MEMORY;
        }
        b->cap = cap;
    }
    b->per_token = per_token;
    b->token_logprobs[b->n] = ev->logprob;
    for (int j = 0; j < per_token; ++j) {
        /* fewer than asked only when the vocabulary is smaller: id -1 */
        bool have = (j < ev->num_top);
        b->top_ids[(size_t)b->n * (size_t)per_token + (size_t)j] = have ? ev->top_ids[j] : -1;
        b->top_logprobs[(size_t)b->n * (size_t)per_token + (size_t)j] =
            have ? ev->top_logprobs[j] : 0.0f;
    }
    b->n++;
    return KVF_OK;
}

void kvf_logprob_buf_attach(const kvf_logprob_buf_t *b, Kvf__ServeReply *reply)
{
    if (b->n == 0) {
        return;
    }
    reply->n_token_logprobs = (size_t)b->n;
    reply->token_logprobs = b->token_logprobs;
    reply->has_top_per_token = 1;
    reply->top_per_token = (uint32_t)b->per_token;
    reply->n_top_ids = (size_t)b->n * (size_t)b->per_token;
    reply->top_ids = b->top_ids;
    reply->n_top_logprobs = reply->n_top_ids;
    reply->top_logprobs = b->top_logprobs;
}

void kvf_logprob_buf_clear(kvf_logprob_buf_t *b)
{
    b->n = 0;
}

void kvf_logprob_buf_free(kvf_logprob_buf_t *b)
{
    free(b->token_logprobs);
    free(b->top_ids);
    free(b->top_logprobs);
    memset(b, 0, sizeof(*b));
}
