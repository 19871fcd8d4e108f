/*
 * Shared (CPU and CUDA) arithmetic of token sampling (common/engine/kvf_sampler.h):
 * the per-token bodies of the penalties, the temperature, the min-p test and
 * the request's random numbers. The CPU sampler calls them in loops over the
 * vocabulary; a device sampler calls them from threads, so both draw the same
 * token from the same logits and seed.
 *
 * Semantics are vLLM's (facts of its sampler, not its code):
 *   repetition penalty r (prompt and output tokens seen): l > 0 ? l / r : l * r
 *   frequency f, presence p (output tokens, count c):     l - f * c - p * (c > 0)
 *   temperature T: weights exp((l - max) / T); T below 1e-5 is greedy
 *   min-p m: keep a token whose probability is at least m times the largest
 *   top-k / top-p (nucleus) run on what min-p kept (kvf_sampler.c).
 * Source: vLLM SamplingParams documentation and its sampler's order (penalties,
 * temperature, min-p, top-k, top-p).
 */
#ifndef KVF_SAMPLE_MATH_H
#define KVF_SAMPLE_MATH_H

#include "kvf_hd.h"

#include <math.h>
#include <stdint.h>

/* Below this temperature a request samples greedily (vLLM's epsilon). */
#define KVF_SAMPLE_GREEDY_EPS 1e-5f

/* The penalised logit of one token: @a seen in the prompt or the output, @a count in
 * the output. rep 1, freq 0, pres 0 leave it as it is. */
static inline KVF_HD float kvf_sample_penalize_hd(float logit, int seen, int count, float rep,
                                                  float freq, float pres)
{
    if (seen && (rep != 1.0f)) {
        logit = (logit > 0.0f) ? logit / rep : logit * rep;
    }
    if (count > 0) {
        logit -= freq * (float)count + pres;
    }
    return logit;
}

/* The unnormalised probability of a logit: exp((l - max) / T), in double. -inf: 0. */
static inline KVF_HD double kvf_sample_weight_hd(float logit, float max, double inv_t)
{
    return exp(((double)logit - (double)max) * inv_t);
}

/* Whether min-p keeps a token: its weight (relative to the largest, which is 1) >= m. */
static inline KVF_HD int kvf_sample_min_p_keep_hd(double weight, float min_p)
{
    return weight >= (double)min_p;
}

/* The request's generator: splitmix64, one 64-bit draw per sampled token. */
static inline KVF_HD uint64_t kvf_sample_rng_next_hd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A draw as a double in [0, 1) (53 bits). */
static inline KVF_HD double kvf_sample_uniform_hd(uint64_t draw)
{
    return (double)(draw >> 11) * (1.0 / 9007199254740992.0);
}

/* The natural log-probability of a logit under log-softmax with max @a max and
 * sum of exp(l - max) @a sum. */
static inline KVF_HD float kvf_sample_logprob_hd(float logit, float max, double sum)
{
    return (float)(((double)logit - (double)max) - log(sum));
}

#endif
