/*
 * CUDA element-wise kernels and MoE routing: activations and dtype
 * conversion (one thread per element, grid-stride), the router (one thread
 * per token, its scratch rows in stream-ordered global memory), all through
 * the shared bodies of kvf_act_math.h, kvf_dtype_math.h and kvf_moe_math.h.
 */
#include "kvf_act_math.h"
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_dtype_math.h"
#include "kvf_moe_math.h"

__global__ void kvf_act_kernel(int act, float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] = kvf_act_hd(act, x[i]);
    }
}

__global__ void kvf_convert_kernel(void *dst, int dst_dtype, const void *src, int src_dtype,
                                   size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        kvf_hd_store(dst, dst_dtype, i, kvf_hd_load(src, src_dtype, i));
    }
}

extern "C" int kvf_cuda_act(const kvf_device_t *dev, int act, float *x, size_t n)
{
    kvf_act_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(act, x,
                                                                                         n);
    return kvf_cuda_launched("kvf_act_kernel");
}

extern "C" int kvf_cuda_convert(const kvf_device_t *dev, void *dst, int dst_dtype,
                                const void *src, int src_dtype, size_t n)
{
    if (dst_dtype == src_dtype) {
        KVF_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * kvf_dtype_size((kvf_dtype_t)dst_dtype),
                                       cudaMemcpyDeviceToDevice, kvf_cuda_stream_of(dev)));
        return KVF_KERN_OK;
    }
    kvf_convert_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(
        dst, dst_dtype, src, src_dtype, n);
    return kvf_cuda_launched("kvf_convert_kernel");
}

/* scratch per token: choice[E], gsum[E] floats, then gkeep[E], taken[E] bools */
__global__ void kvf_moe_route_kernel(int E, int top_k, int ng, int topk_group, int norm,
                                     float scaling, int soft, int full, const float *bias,
                                     const float *logits,
                                     int T, float *scores, int32_t *idx, float *wt,
                                     float *fscratch, bool *bscratch)
{
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < (size_t)T;
         t += (size_t)gridDim.x * blockDim.x) {
        float *sc = scores + t * (size_t)E;
        float *choice = fscratch + t * 2u * (size_t)E;
        bool *gkeep = bscratch + t * 2u * (size_t)E;
        for (int e = 0; e < E; ++e) {
            sc[e] = kvf_moe_score_of_hd(logits[t * (size_t)E + (size_t)e], soft);
        }
        kvf_moe_route_token_hd(sc, bias, E, ng, topk_group, top_k, soft ? 0 : norm,
                               soft ? 1.0f : scaling, choice, choice + E, gkeep, gkeep + E,
                               idx + t * (size_t)top_k, wt + t * (size_t)top_k);
        if (soft) {
            kvf_moe_softmax_topk_hd(wt + t * (size_t)top_k, top_k, scaling, full ? sc : NULL,
                                    E);
        }
    }
}

extern "C" int kvf_cuda_moe_route(const kvf_device_t *dev, const kvf_moe_route_params_t *p,
                                  const float *logits, int T, float *scores, int32_t *idx,
                                  float *wt)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    size_t per = 2u * (size_t)p->experts;
    size_t fbytes = (size_t)T * per * sizeof(float);
    void *scratch = NULL;
    int rc = kvf_cuda_scratch(stream, fbytes + (size_t)T * per * sizeof(bool), NULL, &scratch);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    kvf_moe_route_kernel<<<kvf_cuda_blocks_for((size_t)T, KVF_CUDA_THREADS / 4),
                           KVF_CUDA_THREADS / 4, 0, stream>>>(
        p->experts, p->top_k, p->n_group, p->topk_group, p->norm_topk_prob, p->routed_scaling,
        p->softmax_topk, p->softmax_full, p->bias, logits, T, scores, idx, wt, (float *)scratch,
        (bool *)((char *)scratch + fbytes));
    rc = kvf_cuda_launched("kvf_moe_route_kernel");
    kvf_cuda_scratch_free(stream, scratch);
    return rc;
}
