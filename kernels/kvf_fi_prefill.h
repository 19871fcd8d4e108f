/*
 * FlashInfer's paged prefill attention (causal) over kvferry's KV pages, bf16 caches, head_dim
 * 32, 64, 128 and 256, built only with -DKVF_FLASHINFER=ON (kvf_fi_decode.h has the why; the
 * pages' geometry and the work plan are kvf_fi_plan.h's: query tiles of KVF_FI_PREFILL_TILE_Q packed
 * rows, each over its request's whole KV, no split-KV). The query tokens of a request are
 * the last qo_len of its KV (written before). Every pointer is device memory. Compiled, not
 * yet run on a GPU; the forward's prompt tokens go to it under KVF_GPU_ATTN=flashinfer
 * (common/runtime/kvf_model_fi.c).
 */
#ifndef KVF_FI_PREFILL_H
#define KVF_FI_PREFILL_H

#include "kvf_device.h"
#include "kvf_fi_plan.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    kvf_fi_geom_t geom;            /* from kvf_fi_geometry() */
    int           head_dim;        /* 32, 64, 128 or 256 */
    int           q_heads, kv_heads;
    int           batch;           /* requests */
    int           work;            /* entries of kvf_fi_prefill_plan() */
    float         sm_scale;
    const void   *q;               /* bf16 [q_indptr[batch]] rows of q_ld: [q_heads][head_dim] */
    int           q_ld;            /* elements between q rows; 0: q_heads * head_dim */
    void         *pool;            /* the pool's base: page index 0 */
    int32_t      *indices;         /* page indices (kvf_fi_pages()) */
    int32_t      *indptr;          /* [batch + 1] into indices */
    int32_t      *last_page_len;   /* [batch] */
    int32_t      *q_indptr;        /* [batch + 1] (the plan's) */
    int32_t      *request_indices; /* [work] the plan */
    int32_t      *qo_tile_indices; /* [work] */
    int32_t      *kv_tile_indices; /* [work] */
    int32_t      *kv_chunk_tokens; /* [1] unused without split-KV: any value */
    void         *o;               /* bf16 [q_indptr[batch]][q_heads][head_dim] */
    float        *lse;             /* [q_indptr[batch]][q_heads] */
} kvf_fi_prefill_args_t;

/**
 * Runs it on @a dev's stream.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL; KVF_KERN_ECUDA (reported); KVF_KERN_EUNSUPPORTED in
 *         a build without -DKVF_FLASHINFER=ON, for a CPU device or a head_dim not built.
 */
int kvf_fi_prefill(const kvf_device_t *dev, const kvf_fi_prefill_args_t *a);

#ifdef __cplusplus
}
#endif

#endif
