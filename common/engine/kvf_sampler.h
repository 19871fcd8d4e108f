/*
 * Token sampling of one request with vLLM's sampling parameters: logit_bias,
 * allowed_token_ids, bad_words, penalties, temperature, min-p, top-k, top-p (nucleus),
 * min_tokens, stop token ids and logprobs. The per-token arithmetic and the one summation order are
 * kernels/kvf_sample_math.h, shared with the device sampler (kernels/kvf_sample.h),
 * which gives the same tokens and logprobs bit for bit from the same logits and draw
 * (tests/common/engine/test_sample_twin.c); this file runs it on the CPU (the engine
 * uses it when the model is on the CPU; on a GPU it samples there, through
 * kvf_sampler_device_row() / kvf_sampler_device_out()).
 *
 * Order, as vLLM's sampler (source: vLLM sampling parameters documentation):
 *   0. allowed_token_ids: every other token gets -inf; bad_words: a sequence's last
 *      token gets -inf when the outputs end with the rest of it (a one-token word:
 *      always); logit_bias is added to the listed tokens' logits
 *   1. min_tokens: while fewer outputs than min_tokens, EOS (unless ignore_eos)
 *      and stop_token_ids get -inf
 *   2. penalties on the (biased) logits: repetition over prompt and output tokens,
 *      frequency and presence over output tokens
 *   3. greedy (temperature < 1e-5): argmax, lowest id on ties
 *   4. weights exp((l - max) / T) (kvf_sample_exp_hd: + - * only; NaN: no mass);
 *      min-p drops weights below min_p (the largest is 1); top-k keeps the k
 *      largest logits (ties at the k-th all kept); top-p keeps, largest first
 *      (lowest id first on ties), each token whose predecessors' mass over the
 *      mass top-k kept is below top_p (both masses summed in the fixed order)
 *   5. one draw u in [0, 1) from the request's generator (one per token, so a
 *      seed gives the same tokens wherever the first token was sampled),
 *      inverse CDF over the kept tokens in the fixed order: u times the kept
 *      mass descends the tree of lane sums to a lane (ids t, t + 512, ...),
 *      whose ids are scanned in ascending order (kvf_sample_math.h); an exact
 *      inverse CDF over a fixed permutation of the ids.
 * Every sum over the vocabulary is in kvf_sample_math.h's order (strided
 * lanes, then a fixed tree), never a serial running sum, so a GPU block
 * computes the same bits.
 * Logprobs are of the raw logits (before bias, masks, penalties and temperature), as
 * vLLM reports them by default.
 * Steps 0-2 are one list of per-token entries (kvf_sampler_device_row()'s), which the
 * CPU path applies the way the device sampler does, so both edit the same logits.
 *
 * Design: one draw per token whatever the parameters (rng_skip stays one draw).
 * Rejected: vLLM's exponential-race draw; its numbers cannot be matched anyway
 * (another generator). A serial running sum for top-p and the inverse CDF (what
 * this file did before the device sampler): a GPU cannot reproduce its rounding.
 */
#ifndef KVF_SAMPLER_H
#define KVF_SAMPLER_H

#include "kvf_sample.h"
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

/**
 * The logprob of @a token and the top @a n (<= KVF_SAMPLING_MAX_LOGPROBS) of raw @a logits
 * [vocab], as kvf_sampler_sample() reports a sampled token's; *rank_p: 1 + the tokens of a
 * larger logit (vLLM's rank). For prompt logprobs.
 */
void kvf_sampler_score(const float *logits, int vocab, int32_t token, int n,
                       kvf_sample_out_t *out, int32_t *rank_p);

/** Advance @a rng past the one draw kvf_sampler_sample() makes for @a s (none when greedy). */
void kvf_sampler_skip(const kvf_sampling_t *s, uint64_t *rng);

/** Entries kvf_sampler_device_row() may write for a request of @a num_tokens tokens. */
int kvf_sampler_device_pen_max(const kvf_sampling_t *s, int num_tokens, int num_eos);

/**
 * The device sampler's row for the request kvf_sampler_sample() would sample with the same
 * arguments (kernels/kvf_sample.h): its parameters, its one draw from @a rng (advanced
 * unless greedy, as kvf_sampler_sample() advances it), and its penalty and mask entries
 * (distinct ids: the history's tokens while penalties are on, EOS and stop ids while below
 * min_tokens, logit_bias and allowed_token_ids, the bad word ends due now) appended at pen[*num_pen], row->pen_start = *num_pen on entry.
 *
 * @param [in,out] num_pen  entries used in @a pen; room for
 *                          kvf_sampler_device_pen_max() more is the caller's.
 * @return KVF_OK; KVF_ERR_NO_MEMORY (the per-thread scratch).
 */
kvf_status_t kvf_sampler_device_row(const kvf_sampling_t *s, uint64_t *rng,
                                    const int32_t *tokens, int prompt_len, int num_tokens,
                                    int vocab, const int *eos, int num_eos,
                                    kvf_sample_row_t *row, kvf_sample_pen_t *pen, int *num_pen);

/** kvf_sampler_sample()'s output from a device result of a row built for @a s. */
void kvf_sampler_device_out(const kvf_sampling_t *s, const kvf_sample_res_t *res,
                            kvf_sample_out_t *out);

/** True when @a tok is one of @a s's stop_token_ids. */
bool kvf_sampling_is_stop_id(const kvf_sampling_t *s, int32_t tok);

#endif
