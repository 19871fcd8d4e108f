/*
 * Shared (CPU and CUDA) MoE routing of one token, transformers' NemotronH
 * top-k router: scores s = sigmoid(logits); choice = s + bias
 * (e_score_correction_bias); per group of experts / n_group experts the sum
 * of its two best choice scores; the topk_group groups with the largest
 * sums stay; the top_k experts by choice score among them are taken
 * (ties to the lower index), weighted by their plain scores, divided by
 * their sum (+1e-20, in double) when norm_topk_prob, times routed_scaling.
 *
 * Limits (scratch sized by the caller): experts <= KVF_MOE_EXPERTS_MAX.
 */
#ifndef KVF_MOE_MATH_H
#define KVF_MOE_MATH_H

#include "kvf_hd.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#define KVF_MOE_EXPERTS_MAX 1024

/** The router's sigmoid of one logit. */
static inline KVF_HD float kvf_moe_score_hd(float logit)
{
    return 1.0f / (1.0f + expf(-logit));
}

/** The router's score of one logit: sigmoid, or the logit itself under softmax_topk. */
static inline KVF_HD float kvf_moe_score_of_hd(float logit, int softmax_topk)
{
    return softmax_topk ? logit : kvf_moe_score_hd(logit);
}

/**
 * softmax_topk routing's weights: the k chosen logits (wt, the best first) ->
 * exp(wt[r] - wt[0]) / their sum, as torch.softmax in fp32, times scaling. With @a all
 * (the token's E logits; wt[0] is their maximum) the sum runs over all E instead: the
 * chosen entries of the full softmax, not renormalised (transformers' qwen3_next router
 * with norm_topk_prob false).
 */
static inline KVF_HD void kvf_moe_softmax_topk_hd(float *wt, int k, float scaling,
                                                  const float *all, int E)
{
    const float mx = wt[0];
    float sum = 0.0f;

    for (int r = 0; r < k; ++r) {
        wt[r] = expf(wt[r] - mx);
        sum += (all == NULL) ? wt[r] : 0.0f;
    }
    for (int e = 0; (all != NULL) && (e < E); ++e) {
        sum += expf(all[e] - mx);
    }
    for (int r = 0; r < k; ++r) {
        wt[r] = wt[r] / sum * scaling;
    }
}

/**
 * Route one token. @a sc: its E scores (after sigmoid); @a bias: E floats;
 * scratch: choice[E], gsum[n_group], gkeep[n_group], taken[E]. Writes
 * idx[top_k] and wt[top_k]. Arguments checked by the caller: E % ng == 0,
 * 1 <= topk_group <= ng, top_k <= topk_group * E / ng.
 */
static inline KVF_HD void kvf_moe_route_token_hd(const float *sc, const float *bias, int E,
                                                 int ng, int topk_group, int k, int norm,
                                                 float scaling, float *choice, float *gsum,
                                                 bool *gkeep, bool *taken, int32_t *idx,
                                                 float *wt)
{
    const int per = E / ng;
    double sum = 0.0;

    for (int e = 0; e < E; ++e) {
        choice[e] = sc[e] + bias[e];
        taken[e] = false;
    }
    for (int gi = 0; gi < ng; ++gi) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int e = gi * per; e < (gi + 1) * per; ++e) {
            if (choice[e] > b1) {
                b2 = b1;
                b1 = choice[e];
            } else if (choice[e] > b2) {
                b2 = choice[e];
            }
        }
        gsum[gi] = b1 + b2;
        gkeep[gi] = false;
    }
    for (int r = 0; r < topk_group; ++r) {
        int best = -1;
        for (int gi = 0; gi < ng; ++gi) {
            if (!gkeep[gi] && ((best < 0) || (gsum[gi] > gsum[best]))) {
                best = gi;
            }
        }
        gkeep[best] = true;
    }
    for (int r = 0; r < k; ++r) {
        int best = -1;
        for (int e = 0; e < E; ++e) {
            if (!taken[e] && gkeep[e / per] && ((best < 0) || (choice[e] > choice[best]))) {
                best = e;
            }
        }
        taken[best] = true;
        idx[r] = best;
        wt[r] = sc[best];
        sum += sc[best];
    }
    for (int r = 0; r < k; ++r) {
        if (norm) {
            wt[r] = wt[r] / (float)(sum + 1e-20);
        }
        wt[r] = wt[r] * scaling;
    }
}

#endif
