/*
 * Paged causal GQA attention over the kernel blocks of a page pool.
 *
 * Cache layout (the same as common/geometry/kvf_geometry.h, restated here because
 * kernels/ cannot include common/): the pool is num_blocks blocks of `slots`
 * pages of page_size bytes; with kv->layout KVF_KV_LAYER_MAJOR (0) layer slot j
 * of logical block b is the page
 *
 *     page(b, j) = base + (b * slots + j) * page_size
 *
 * and a page holds ppl = block_size / kernel_block_size kernel blocks of
 * kernel_block_bytes = 2 * kv_heads * kernel_block_size * head_dim * elt
 * bytes each, HND:  [K|V][kv_heads][kernel_block_size][head_dim]. With
 * KVF_KV_HEAD_MAJOR the block is [kv head][slot][kernel block][K|V][tokens][head_dim]
 * (kvf_kv_layout.h: the strides every address here is computed with).
 * Token t of a request lives in logical block block_table[t / block_size],
 * kernel block (t % block_size) / kernel_block_size, row
 * t % kernel_block_size. page_size may exceed ppl * kernel_block_bytes (the
 * rest is never touched).
 *
 * Numerics (deliberately GPU-like, see docs/ARCHITECTURE.md §1): the score pass reads
 * every slot of every kernel block up to the one holding the query position,
 * as one tile, and masks slots past the causal limit by giving them
 * probability 0 (selected, as a GPU kernel selects -inf for a masked score):
 * p = mask ? exp(s - m) : 0,  out = sum(p * V) / sum(p), m = max over
 * unmasked scores. Masked slots still enter the weighted sum as 0 * V, so
 * stale NaN/Inf bytes in never-written V slots of a recycled, unzeroed block
 * poison the output. This is intended; the fix is zeroing fresh blocks
 * (kvf_blocks_zero), never the kernel. (Multiplying exp(s - m) by 0 instead
 * would also turn a correct zeroed slot into 0 * inf = NaN whenever every
 * real score is more than ~88 below 0.)
 *
 * Positional encoding: none (NemotronH attention has no RoPE). Scores are
 * q.k * scale with scale = 1/sqrt(head_dim) by default.
 *
 * CUDA (kvf_attention_cuda.cu): the same fold (kvf_attention_math.h), one
 * thread block per (query token, query head) sharing each tile's loads, and
 * for decode (few queries, long context) split-K over the kernel blocks
 * merged by kvf_attn_merge; q, k, v, out and the pool are device
 * memory, block_table and positions stay HOST arrays (copied to scratch on
 * dev->stream); head_dim <= 256 and kernel_block_size <= 8192 (else
 * KVF_KERN_EINVAL). KVF_GPU_ATTN=tiled in the environment runs instead one
 * thread block per tile of queries sharing a KV head (kvf_attention_cuda.h),
 * with each query's arithmetic unchanged; an unknown value fails every call
 * with KVF_KERN_EINVAL, reported by name.
 */
#ifndef KVF_ATTENTION_H
#define KVF_ATTENTION_H

#include "kvf_device.h"
#include "kvf_dtype.h"
#include "kvf_kv_layout.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Where one layer's paged K/V lives for one request (all values, no ownership). */
typedef struct kvf_paged_kv {
    void          *base;              /* pool base (memory of the device) */
    size_t         page_size;         /* bytes per page */
    int            slots;             /* pages per block (layers per KV cache group) */
    int            slot;              /* this layer's slot, [0, slots) */
    kvf_dtype_t    dtype;             /* fp32, bf16 or fp16 */
    int            kv_heads;          /* KV heads on this rank, > 0 */
    int            head_dim;          /* > 0 */
    int            block_size;        /* logical block, tokens */
    int            kernel_block_size; /* divides block_size */
    const int32_t *block_table;       /* HOST int32[num_blocks]: logical block ids */
    int            num_blocks;        /* entries in block_table; covers
                                         num_blocks * block_size token positions */
    int            window;            /* sliding window, tokens: a query at position p
                                         attends to [max(0, p - window + 1), p]
                                         (transformers' sliding_window); 0: full causal.
                                         Kernel blocks wholly before the window are never
                                         read, so their table entries may be stale */
    const float   *sinks;             /* NULL, or fp32 [q_heads] (memory of the device):
                                         each query head's attention sink (gpt-oss), a
                                         logit that joins the softmax's denominator and
                                         has no value (kvf_attn_sink_factor) */
    float          softcap;           /* > 0: each scaled score s becomes softcap *
                                         tanh(s / softcap) before the softmax (gemma2's
                                         attn_logit_softcapping, kvf_attn_softcap); 0: none */
    int            layout;            /* kvf_kv_layout_t (kvf_kv_layout.h): the block's
                                         strides; 0: layer-major */
} kvf_paged_kv_t;

/**
 * Check the fields of @a kv: pointers set, sizes positive, kernel block size
 * divides block size, dtype fp32/bf16/fp16, a known layout, and ppl *
 * kernel_block_bytes <= page_size. @return KVF_KERN_OK or KVF_KERN_EINVAL.
 */
int kvf_paged_kv_check(const kvf_paged_kv_t *kv);

/** Bytes of one kernel block: 2 * kv_heads * kernel_block_size * head_dim * elt. */
size_t kvf_paged_kv_kernel_block_bytes(const kvf_paged_kv_t *kv);

/** The byte strides of @a kv's blocks (kvf_kv_strides_make of its fields). */
kvf_kv_strides_t kvf_paged_kv_strides(const kvf_paged_kv_t *kv);

/**
 * Store K and V of new tokens into their cache slots (converted to kv->dtype).
 *
 * @param [in] kv         Cache description; not retained.
 * @param [in] k, v       fp32 [num_tokens][ld] where head h, dim d is at
 *                        [t][h * head_dim + d]; ld >= kv_heads * head_dim
 *                        (elements), e.g. slices of a fused QKV projection.
 * @param [in] ld         Row stride of k and v, elements.
 * @param [in] positions  HOST int32[num_tokens]: absolute token index of each
 *                        row in the request, in [0, num_blocks * block_size).
 * @param [in] num_tokens >= 0 (0 is a no-op).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (bad kv, position out of range or a
 *         negative block id; nothing written for an invalid argument found
 *         before the first store — positions are all checked first);
 *         KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED for CUDA in a build without it.
 */
int kvf_attn_cache_write(const kvf_device_t *dev, const kvf_paged_kv_t *kv, const float *k,
                         const float *v, int ld, const int32_t *positions, int num_tokens);

/**
 * Causal attention of query tokens against the paged cache: query row t at
 * absolute position positions[t] attends to cache positions [0, positions[t]]
 * (with kv->window > 0: [kvf_attn_window_lo(positions[t], window), positions[t]])
 * (which the caller has written, typically by kvf_attn_cache_write() of the
 * same chunk first). Query head h uses KV head h / (q_heads / kv_heads).
 *
 * @param [in]  kv          Cache description.
 * @param [in]  q           fp32 [num_tokens][ldq], head h dim d at [t][h * head_dim + d];
 *                          ldq >= q_heads * head_dim.
 * @param [in]  ldq         Row stride of q, elements.
 * @param [in]  positions   HOST int32[num_tokens], each in [0, num_blocks * block_size).
 * @param [in]  num_tokens  >= 0 (0 is a no-op).
 * @param [in]  q_heads     Query heads on this rank; a multiple of kv->kv_heads.
 * @param [in]  scale       Score scale; <= 0 selects 1/sqrt(head_dim).
 * @param [out] out         fp32 [num_tokens][q_heads * head_dim] contiguous;
 *                          must not overlap q.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL; KVF_KERN_ENOMEM (CPU scratch of
 *         about (2 * (max position + kernel_block_size) + num_tokens *
 *         q_heads / kv_heads) * head_dim + threads * 128 * (max(64,
 *         kernel_block_size) + head_dim + 2) floats at most; threads:
 *         kvf_gemm_set_threads(), used for calls of at least two query blocks);
 *         KVF_KERN_ECUDA;
 *         KVF_KERN_EUNSUPPORTED (CUDA in a build without it).
 */
int kvf_attn_paged(const kvf_device_t *dev, const kvf_paged_kv_t *kv, const float *q, int ldq,
                   const int32_t *positions, int num_tokens, int q_heads, float scale,
                   float *out);

#ifdef __cplusplus
}
#endif

#endif
