/*
 * MoE routing on the CPU: a loop over tokens of the shared body
 * (kvf_moe_math.h); CUDA in kvf_elem_cuda.cu.
 */
#include "kvf_moe.h"
#include "kvf_kern_internal.h"
#include "kvf_moe_math.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

int kvf_moe_route_check(const kvf_moe_route_params_t *p)
{
    if ((p == NULL) || (p->experts < 1) || (p->experts > KVF_MOE_EXPERTS_MAX) ||
        (p->top_k < 1) || (p->n_group < 1) || ((p->experts % p->n_group) != 0) ||
        (p->topk_group < 1) || (p->topk_group > p->n_group) ||
        (p->topk_group * (p->experts / p->n_group) < p->top_k) || (p->bias == NULL)) {
        return KVF_KERN_EINVAL;
    }
    return KVF_KERN_OK;
}

int kvf_moe_route(const kvf_device_t *dev, const kvf_moe_route_params_t *p, const float *logits,
                  int T, float *scores, int32_t *idx, float *wt)
{
    float choice[KVF_MOE_EXPERTS_MAX], gsum[KVF_MOE_EXPERTS_MAX];
    bool gkeep[KVF_MOE_EXPERTS_MAX], taken[KVF_MOE_EXPERTS_MAX];
    size_t E;

    if ((kvf_moe_route_check(p) != KVF_KERN_OK) || (T < 0)) {
        return KVF_KERN_EINVAL;
    }
    if (T == 0) {
        return KVF_KERN_OK;
    }
    if ((logits == NULL) || (scores == NULL) || (idx == NULL) || (wt == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_moe_route(dev, p, logits, T, scores, idx, wt);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    E = (size_t)p->experts;
    for (size_t t = 0; t < (size_t)T; ++t) {
        float *sc = scores + t * E;
        for (size_t e = 0; e < E; ++e) {
            sc[e] = kvf_moe_score_of_hd(logits[t * E + e], p->softmax_topk);
        }
        kvf_moe_route_token_hd(sc, p->bias, p->experts, p->n_group, p->topk_group, p->top_k,
                               p->softmax_topk ? 0 : p->norm_topk_prob,
                               p->softmax_topk ? 1.0f : p->routed_scaling, choice, gsum, gkeep,
                               taken, idx + t * (size_t)p->top_k, wt + t * (size_t)p->top_k);
        if (p->softmax_topk) {
            kvf_moe_softmax_topk_hd(wt + t * (size_t)p->top_k, p->top_k, p->routed_scaling,
                                    p->softmax_full ? sc : NULL, p->experts);
        }
    }
    return KVF_KERN_OK;
}
