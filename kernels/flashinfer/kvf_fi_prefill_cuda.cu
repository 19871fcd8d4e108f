/*
 * FlashInfer's paged prefill instantiated for kvferry (kvf_fi_prefill.h): bf16 query, cache
 * and output, head_dim 32, 64, 128, 256, causal mask, no positional encoding in the kernel (kvferry
 * applies RoPE before the cache write), one fixed query tile (KVF_FI_PREFILL_TILE_Q packed
 * rows) and no split-KV, so a row's arithmetic does not depend on the batch. kvferry fills
 * the parameter block and the plan itself (kvf_fi_plan.h). Built only with -DKVF_FLASHINFER=ON.
 */
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>

#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_fi_prefill.h"

namespace {

/* The members FlashInfer's paged prefill kernel and its DefaultAttention read. */
struct kvf_fi_prefill_params {
    using DTypeQ = __nv_bfloat16;
    using DTypeKV = __nv_bfloat16;
    using DTypeO = __nv_bfloat16;
    using IdType = int32_t;

    DTypeQ *q;
    flashinfer::paged_kv_t<DTypeKV, IdType> paged_kv;
    IdType *q_indptr;
    DTypeO *o;
    float *lse;
    flashinfer::uint_fastdiv group_size;
    uint8_t *maybe_custom_mask;
    int32_t *maybe_mask_indptr;
    float *maybe_alibi_slopes;
    uint32_t *maybe_prefix_len_ptr;
    uint16_t *maybe_token_pos_in_items_ptr;
    uint16_t *maybe_max_item_len_ptr;
    uint8_t *maybe_k_cache_sf;
    uint8_t *maybe_v_cache_sf;
    double logits_soft_cap;
    double sm_scale;
    double rope_rcp_scale;
    double rope_rcp_theta;
    int64_t token_pos_in_items_len;
    uint32_t num_qo_heads;
    IdType q_stride_n;
    IdType q_stride_h;
    uint32_t k_sf_stride_page, k_sf_stride_n, k_sf_stride_h;
    uint32_t v_sf_stride_page, v_sf_stride_n, v_sf_stride_h;
    int32_t window_left;
    IdType *request_indices;
    IdType *qo_tile_indices;
    IdType *kv_tile_indices;
    IdType *merge_indptr;
    IdType *o_indptr;
    bool *block_valid_mask;
    IdType *kv_chunk_size_ptr;
    uint32_t max_total_num_rows;
    uint32_t *total_num_rows;
    uint32_t padded_batch_size;
    bool partition_kv;

    __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t b) const
    {
        return (uint32_t)(q_indptr[b + 1] - q_indptr[b]);
    }
    __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t b) const
    {
        return paged_kv.get_length(b);
    }
};

using kvf_fi_prefill_variant = flashinfer::DefaultAttention<false, false, false, false>;

template <uint32_t HD>
cudaError_t kvf_fi_prefill_run(const kvf_fi_prefill_params &p, cudaStream_t st)
{
    return flashinfer::BatchPrefillWithPagedKVCacheDispatched<
        false, KVF_FI_PREFILL_TILE_Q, HD, HD, flashinfer::PosEncodingMode::kNone, false,
        flashinfer::MaskMode::kCausal, false, kvf_fi_prefill_variant, kvf_fi_prefill_params>(
        p, nullptr, nullptr, false, st);
}

kvf_fi_prefill_params kvf_fi_prefill_fill(const kvf_fi_prefill_args_t *a)
{
    kvf_fi_prefill_params p;
    auto *base = static_cast<__nv_bfloat16 *>(a->pool);

    memset(static_cast<void *>(&p), 0, sizeof(p));
    p.paged_kv.page_size = flashinfer::uint_fastdiv((uint32_t)a->geom.page_tokens);
    p.paged_kv.num_heads = (uint32_t)a->kv_heads;
    p.paged_kv.head_dim = (uint32_t)a->head_dim;
    p.paged_kv.batch_size = (uint32_t)a->batch;
    p.paged_kv.stride_page = p.paged_kv.v_stride_page = a->geom.stride_page;
    p.paged_kv.stride_n = p.paged_kv.v_stride_n = a->geom.stride_n;
    p.paged_kv.stride_h = p.paged_kv.v_stride_h = a->geom.stride_h;
    p.paged_kv.k_data = base;
    p.paged_kv.v_data = base + a->geom.v_offset;
    p.paged_kv.indices = a->indices;
    p.paged_kv.indptr = a->indptr;
    p.paged_kv.last_page_len = a->last_page_len;
    p.paged_kv.rope_pos_offset = nullptr;
    p.q = static_cast<__nv_bfloat16 *>(const_cast<void *>(a->q));
    p.q_indptr = a->q_indptr;
    p.o = static_cast<__nv_bfloat16 *>(a->o);
    p.lse = a->lse;
    p.group_size = flashinfer::uint_fastdiv((uint32_t)(a->q_heads / a->kv_heads));
    p.sm_scale = a->sm_scale;
    p.rope_rcp_scale = 1.0;
    p.rope_rcp_theta = 1.0;
    p.num_qo_heads = (uint32_t)a->q_heads;
    p.q_stride_n = (a->q_ld > 0) ? a->q_ld : a->q_heads * a->head_dim;
    p.q_stride_h = a->head_dim;
    p.window_left = -1;
    p.request_indices = a->request_indices;
    p.qo_tile_indices = a->qo_tile_indices;
    p.kv_tile_indices = a->kv_tile_indices;
    p.o_indptr = a->q_indptr;
    p.kv_chunk_size_ptr = a->kv_chunk_tokens;
    p.padded_batch_size = (uint32_t)a->work;
    p.partition_kv = false;
    return p;
}

} // namespace

extern "C" int kvf_cuda_fi_prefill(const kvf_device_t *dev, const kvf_fi_prefill_args_t *a)
{
    cudaStream_t st = kvf_cuda_stream_of(dev);
    const kvf_fi_prefill_params p = kvf_fi_prefill_fill(a);
    cudaError_t err;

    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    switch (a->head_dim) {
    case 32:
        err = kvf_fi_prefill_run<32>(p, st);
        break;
    case 64:
        err = kvf_fi_prefill_run<64>(p, st);
        break;
    case 128:
        err = kvf_fi_prefill_run<128>(p, st);
        break;
    case 256:
        err = kvf_fi_prefill_run<256>(p, st);
        break;
    default:
        return KVF_KERN_EINVAL;
    }
    if (err != cudaSuccess) {
        kvf_kern_report("flashinfer::BatchPrefillWithPagedKVCacheDispatched",
                        cudaGetErrorString(err));
        return KVF_KERN_ECUDA;
    }
    return KVF_KERN_OK;
}
