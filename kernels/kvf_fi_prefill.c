/*
 * kvf_fi_prefill(): argument checks and the dispatch to FlashInfer's prefill
 * (flashinfer/kvf_fi_prefill_cuda.cu, only in -DKVF_FLASHINFER=ON builds).
 */
#include "kvf_fi_prefill.h"
#include "kvf_kern_internal.h"

#ifdef KVF_HAVE_FLASHINFER
int kvf_cuda_fi_prefill(const kvf_device_t *dev, const kvf_fi_prefill_args_t *a);
#endif

int kvf_fi_prefill(const kvf_device_t *dev, const kvf_fi_prefill_args_t *a)
{
    if ((a == NULL) || kvf_kern_on_cpu(dev)) {
        return (a == NULL) ? KVF_KERN_EINVAL : KVF_KERN_EUNSUPPORTED;
    }
    if (!kvf_fi_built(KVF_DTYPE_BF16, a->head_dim)) {
        return KVF_KERN_EUNSUPPORTED;
    }
    if ((a->batch < 1) || (a->work < a->batch) || (a->kv_heads < 1) ||
        ((a->q_ld != 0) && (a->q_ld < a->q_heads * a->head_dim)) ||
        (a->q_heads % a->kv_heads != 0) || (a->q == NULL) || (a->pool == NULL) ||
        (a->indices == NULL) || (a->indptr == NULL) || (a->last_page_len == NULL) ||
        (a->q_indptr == NULL) || (a->request_indices == NULL) || (a->qo_tile_indices == NULL) ||
        (a->kv_tile_indices == NULL) || (a->kv_chunk_tokens == NULL) || (a->o == NULL) ||
        (a->lse == NULL)) {
        return KVF_KERN_EINVAL;
    }
#ifdef KVF_HAVE_FLASHINFER
    return kvf_cuda_fi_prefill(dev, a);
#else
    return KVF_KERN_EUNSUPPORTED;
#endif
}
