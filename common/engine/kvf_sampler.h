/*
 * Token sampling of one request with vLLM's sampling parameters: penalties,
 * temperature, min-p, top-k, top-p (nucleus), min_tokens, stop token ids and
 * logprobs. The per-token arithmetic is kernels/kvf_sample_math.h, shared with
 * a device sampler; this file runs it over the vocabulary on the CPU (the
 * engine copies the logits to the host for sampling).
 *
 * Order, as vLLM's sampler (source: vLLM sampling parameters documentation):
 *   1. min_tokens: while fewer outputs than min_tokens, EOS (unless ignore_eos)
 *      and stop_token_ids get -inf
 *   2. penalties on the logits: repetition over prompt and output tokens,
 *      frequency and presence over output tokens
 *   3. greedy (temperature < 1e-5): argmax, lowest id on ties
 *   4. weights exp((l - max) / T); min-p drops weights below min_p (the
 *      largest is 1); top-k keeps the k largest logits (ties at the k-th all
 *      kept); top-p keeps, largest first, each token whose predecessors' mass
 *      (renormalised over what is left) is below top_p
 *   5. one draw u in [0, 1) from the request's generator (one per token, so a
 *      seed gives the same tokens wherever the first token was sampled),
 *      inverse CDF over the kept tokens in id order.
 * Logprobs are of the raw logits (before penalties and temperature), as vLLM
 * reports them by default.
 *
 * Design: one draw per token whatever the parameters (rng_skip stays one draw).
 * Rejected: vLLM's exponential-race draw; its numbers cannot be matched anyway
 * (another generator), and the inverse CDF keeps seeded outputs of requests
 * without the new fields unchanged.
 */
#ifndef KVF_SAMPLER_H
#define KVF_SAMPLER_H

#include "kvf_scheduler.h"
#include "kvf_status.h"

#include <stddef.h>
#include <stdint.h>

/** What one sampling call produced. */
typedef struct kvf_sample_out {
    int32_t token;
    float   logprob;                               /* want_logprobs: of token, raw logits */
    int     num_top;                               /* entries below (<= sampling.logprobs) */
    int32_t top_ids[KVF_SAMPLING_MAX_LOGPROBS];    /* most likely first, lowest id on ties */
    float   top_logprobs[KVF_SAMPLING_MAX_LOGPROBS];
} kvf_sample_out_t;

/**
 * Check @a s against vLLM's ranges (temperature >= 0, top_p in (0, 1], top_k
 * -1, 0 or >= 1, min_p in [0, 1], presence and frequency penalties in [-2, 2],
 * repetition_penalty > 0, 0 <= min_tokens <= max_tokens, stop ids in the
 * vocabulary, logprobs in [0, KVF_SAMPLING_MAX_LOGPROBS], finite numbers).
 * Used by the daemons on what arrives over a socket.
 *
 * @param vocab  the model's vocabulary size (stop ids must be below it)
 * @param [out] err  on failure: one line naming the field and the value
 * @return KVF_OK; KVF_ERR_INVALID_PARAM.
 */
kvf_status_t kvf_sampling_check(const kvf_sampling_t *s, int vocab, char *err, size_t cap);

/**
 * Sample the next token of a request.
 *
 * @param s        its parameters (checked with kvf_sampling_check())
 * @param rng      its generator state, advanced by one draw unless greedy
 * @param tokens   prompt then outputs so far, @a num_tokens in all, the first
 *                 @a prompt_len the prompt (for penalties and min_tokens)
 * @param logits   [vocab] fp32, not modified
 * @param eos, num_eos  the model's stop tokens (masked while below min_tokens)
 * @param [out] out  the token and, with want_logprobs, its logprobs
 * @return KVF_OK; KVF_ERR_NO_MEMORY (the per-thread scratch of vocab floats).
 *         Thread safety: each thread has its own scratch.
 */
kvf_status_t kvf_sampler_sample(const kvf_sampling_t *s, uint64_t *rng, const int32_t *tokens,
                                int prompt_len, int num_tokens, const float *logits, int vocab,
                                const int *eos, int num_eos, kvf_sample_out_t *out);

/** Advance @a rng past the one draw kvf_sampler_sample() makes for @a s (none when greedy). */
void kvf_sampler_skip(const kvf_sampling_t *s, uint64_t *rng);

/** True when @a tok is one of @a s's stop_token_ids. */
bool kvf_sampling_is_stop_id(const kvf_sampling_t *s, int32_t tok);

#endif
