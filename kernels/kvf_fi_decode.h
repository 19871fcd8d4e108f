/*
 * FlashInfer's paged decode attention over kvferry's KV pages (bf16 caches, head_dim 32, 64,
 * 128 and 256; its prefill twin is kvf_fi_prefill.h), built only with -DKVF_FLASHINFER=ON (the
 * GPU bundle, deploy/gpu-bundle.sh);
 * kvf_fi_plan.h has the geometry, the refusals and the fixed split-KV plan it runs. Every
 * pointer is device memory of @a dev; nothing is allocated or copied to the host. Compiled,
 * not yet run on a GPU; the forward's output tokens go to it under KVF_GPU_ATTN=flashinfer
 * (common/runtime/kvf_model_fi.c; kvferry's own attention kernels stay the default).
 */
#ifndef KVF_FI_DECODE_H
#define KVF_FI_DECODE_H

#include "kvf_device.h"
#include "kvf_fi_plan.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** One decode step's attention of one layer (one query token per request). */
typedef struct {
    kvf_fi_geom_t geom;            /* from kvf_fi_geometry() */
    int           head_dim;        /* 32, 64, 128 or 256 */
    int           q_heads, kv_heads;
    int           batch;           /* requests */
    int           work;            /* entries of the plan (kvf_fi_decode_plan()) */
    float         sm_scale;        /* softmax scale, usually 1 / sqrt(head_dim) */
    const void   *q;               /* bf16 [batch] rows of q_ld: [q_heads][head_dim] first */
    int           q_ld;            /* elements between q rows; 0: q_heads * head_dim */
    void         *pool;            /* the pool's base: page index 0 */
    int32_t      *indices;         /* [indptr[batch]] page indices (kvf_fi_pages()) */
    int32_t      *indptr;          /* [batch + 1] */
    int32_t      *last_page_len;   /* [batch] tokens in each request's last page, 1..kbs */
    int32_t      *request_indices; /* [work] the plan */
    int32_t      *kv_tile_indices; /* [work] */
    int32_t      *o_indptr;        /* [batch + 1] */
    int32_t      *chunk_tokens;    /* [1] geom.chunk_pages * geom.page_tokens */
    bool         *valid;           /* [work] all true */
    void         *tmp_v;           /* bf16 [work][q_heads][head_dim]: the chunks' partial outputs */
    float        *tmp_s;           /* [work][q_heads]: their log-sum-exps */
    void         *o;               /* bf16 [batch][q_heads][head_dim] */
    float        *lse;             /* [batch][q_heads] */
} kvf_fi_decode_args_t;

/**
 * Runs it on @a dev's stream: the chunks of the plan, then their merge in chunk order.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (a head_dim not instantiated, sizes); KVF_KERN_ECUDA
 *         (FlashInfer's launch failed, reported with CUDA's text); KVF_KERN_EUNSUPPORTED in a
 *         build without -DKVF_FLASHINFER=ON or for a CPU device.
 */
int kvf_fi_decode(const kvf_device_t *dev, const kvf_fi_decode_args_t *a);

#ifdef __cplusplus
}
#endif

#endif
