/*
 * Limits of one request's sampling parameters: kvf-proxy refuses a request over
 * them by field name and the engine's scheduler sizes its per-request arrays by
 * them (common/engine/kvf_scheduler.h), so the two agree on one definition. Here
 * on the ground floor because the proxy links no engine.
 */
#ifndef KVF_SAMPLING_LIMITS_H
#define KVF_SAMPLING_LIMITS_H

#define KVF_SAMPLING_MAX_STOP_IDS 64   /* stop_token_ids per request */
#define KVF_SAMPLING_MAX_LOGPROBS 20   /* top logprobs per sampled token */
#define KVF_SAMPLING_MAX_BIAS     300  /* logit_bias entries per request */
#define KVF_SAMPLING_MAX_ALLOWED  1024 /* allowed_token_ids per request */
#define KVF_SAMPLING_MAX_BAD_WORDS 64  /* bad_words token sequences per request */
#define KVF_SAMPLING_MAX_BAD_TOKENS 512 /* their tokens, all sequences together */

#endif
