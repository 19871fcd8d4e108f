/*
 * MoE routing (transformers' NemotronH top-k router) for T tokens, on the
 * CPU and on CUDA, through the shared body kvf_moe_route_token_hd()
 * (kvf_moe_math.h has the rule). A CUDA device runs one thread per token.
 */
#ifndef KVF_MOE_H
#define KVF_MOE_H

#include "kvf_device.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Router constants of one MoE layer (values; bias not owned). */
typedef struct kvf_moe_route_params {
    int          experts;        /* E, in [1, KVF_MOE_EXPERTS_MAX] */
    int          top_k;          /* experts per token, >= 1 */
    int          n_group;        /* divides E */
    int          topk_group;     /* [1, n_group], topk_group * E / n_group >= top_k */
    int          norm_topk_prob; /* non-zero: weights divided by their sum */
    float        routed_scaling; /* routed_scaling_factor */
    const float *bias;           /* fp32 [E] e_score_correction_bias (device memory on CUDA) */
    int          softmax_topk;   /* non-zero (Granite, Mixtral): scores are the logits
                                  * themselves and the top_k weights their softmax (then
                                  * norm_topk_prob is not applied; routed_scaling is) */
    int          softmax_full;   /* with softmax_topk (qwen3_next norm_topk_prob false): the
                                  * top_k weights are their entries of the softmax over all E
                                  * logits, not renormalised over the top_k */
} kvf_moe_route_params_t;

/**
 * scores[t][e] = sigmoid(logits[t][e]) (softmax_topk: the logits); then route each token.
 *
 * @param [in]  logits  fp32 [T][E] router outputs.
 * @param [in]  T       Tokens, >= 0 (0 is a no-op).
 * @param [out] scores  fp32 [T][E] (may equal logits).
 * @param [out] idx     int32 [T][top_k] chosen experts.
 * @param [out] wt      fp32 [T][top_k] their weights.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (bad params or NULL); KVF_KERN_ENOMEM
 *         (CUDA scratch); KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED.
 */
int kvf_moe_route(const kvf_device_t *dev, const kvf_moe_route_params_t *p, const float *logits,
                  int T, float *scores, int32_t *idx, float *wt);

/** KVF_KERN_OK when @a p is a valid router description, else KVF_KERN_EINVAL. */
int kvf_moe_route_check(const kvf_moe_route_params_t *p);

#ifdef __cplusplus
}
#endif

#endif
