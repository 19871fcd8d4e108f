/*
 * The request fields that edit the logits in the engine (common/engine/kvf_sampler.h step
 * 0): logit_bias, allowed_token_ids, bad_words, parsed and checked as vLLM does (a bias is
 * clamped to [-100, 100]; ids must be in the vocabulary; allowed_token_ids must not be
 * empty; each bad word is tokenized as written and with a leading space), into the
 * request's owned arrays and from there into a SamplingParams message. Also "priority",
 * the other per-request scheduling knob of vLLM's SamplingParams neighbours: the order of
 * the proxy's admission queue (kvf_proxy_admit.h).
 */
#ifndef KVF_PROXY_SAMPLING_H
#define KVF_PROXY_SAMPLING_H

#include "kvf_proxy_openai.h"
#include "kvf_serve.pb-c.h"

#include <cjson/cJSON.h>

/**
 * Parse "logit_bias", "allowed_token_ids" and "bad_words" of @a root into @a req (its
 * lists; absent or null: none).
 *
 * @param [out] http_p, param_p, err  on error: 400 and the field's name, or 500 (memory)
 * @return KVF_OK; KVF_ERR_INVALID_PARAM; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_parse_lists(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                   kvf_proxy_completion_req_t *req, int *http_p,
                                   const char **param_p, char *err, size_t cap);

/**
 * Parse "priority": an integer (lower is served first); non-zero only with
 * --scheduling-policy priority (ctx->priority_scheduling), as vLLM refuses it under fcfs.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (400 naming "priority").
 */
kvf_status_t kvf_proxy_parse_priority(const kvf_proxy_openai_ctx_t *ctx, const cJSON *root,
                                      kvf_proxy_completion_req_t *req, int *http_p,
                                      const char **param_p, char *err, size_t cap);

/**
 * Parse "best_of" (after "n" and "stream"): an integer in [n, KVF_PROXY_MAX_CHOICES]; more
 * than n is not streamed (the best are known only at the end), as vLLM refuses it.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (400 naming "best_of").
 */
kvf_status_t kvf_proxy_parse_best_of(const cJSON *root, kvf_proxy_completion_req_t *req,
                                     int *http_p, const char **param_p, char *err, size_t cap);

/**
 * Parse "prompt_logprobs" (after "stream"): an integer in [0, 20], not with streaming.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (400 naming "prompt_logprobs").
 */
kvf_status_t kvf_proxy_parse_prompt_logprobs(const cJSON *root, kvf_proxy_completion_req_t *req,
                                             int *http_p, const char **param_p, char *err,
                                             size_t cap);

/**
 * A prefill reply's prompt logprobs into @a out (checked: as many ranks as logprobs, at
 * most the prompt's length - 1, top entries as the request asked).
 * @return KVF_OK (none in the reply: nothing); KVF_ERR_PARSE; KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_proxy_prompt_lp_take(kvf_proxy_completion_t *out, int num_prompt, int per,
                                      const Kvf__ServeReply *r);

/** Free the prompt logprobs of @a out. */
void kvf_proxy_prompt_lp_free(kvf_proxy_completion_t *out);

/**
 * vLLM's "prompt_logprobs" of a choice: [null, {"<id>": {"logprob", "rank",
 * "decoded_token"}, ...}, ...], the prompt token first, then the top ones (rank 1..k) not
 * already listed. NULL: no memory (or none taken: JSON null is the caller's).
 */
cJSON *kvf_proxy_prompt_lp_json(const kvf_proxy_openai_ctx_t *ctx,
                                const kvf_proxy_choice_out_t *ch);

/** The request's lists into @a sp (pointers into @a req, which must outlive @a sp). */
void kvf_proxy_lists_to_msg(const kvf_proxy_completion_req_t *req, Kvf__SamplingParams *sp);

/** Free the request's lists; safe on a zeroed request. */
void kvf_proxy_lists_cleanup(kvf_proxy_completion_req_t *req);

#endif
