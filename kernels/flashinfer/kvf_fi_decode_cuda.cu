/*
 * FlashInfer's paged decode instantiated for kvferry (kvf_fi_decode.h): bf16 query, cache and
 * output, head_dim 32, 64, 128, 256, no positional encoding in the kernel (kvferry applies RoPE
 * before the cache write), no sliding window, soft cap or ALiBi. kvferry fills FlashInfer's
 * parameter block itself, plan arrays included (kvf_fi_plan.h: a fixed split-KV size, always
 * partitioned), so FlashInfer's own batch-dependent planner never runs. Built only with
 * -DKVF_FLASHINFER=ON; the headers come from the flashinfer-python wheel (KVF_FLASHINFER_DIR).
 */
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/variants.cuh>

#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_fi_decode.h"

namespace {

/* The members FlashInfer's decode kernel and its DefaultAttention read (a duck-typed block). */
struct kvf_fi_params {
    using DTypeQ = __nv_bfloat16;
    using DTypeKV = __nv_bfloat16;
    using DTypeO = __nv_bfloat16;
    using IdType = int32_t;

    DTypeQ *q;
    flashinfer::paged_kv_t<DTypeKV, IdType> paged_kv;
    DTypeO *o;
    float *lse;
    float *maybe_alibi_slopes;
    double logits_soft_cap;
    double sm_scale;
    double rope_rcp_scale;
    double rope_rcp_theta;
    uint32_t padded_batch_size;
    uint32_t num_qo_heads;
    IdType q_stride_n;
    IdType q_stride_h;
    int32_t window_left;
    bool enable_pdl;
    IdType *request_indices;
    IdType *kv_tile_indices;
    IdType *o_indptr;
    IdType *kv_chunk_size_ptr;
    bool *block_valid_mask;
    bool partition_kv;

    __host__ __device__ __forceinline__ int32_t get_qo_len(int32_t) const { return 1; }
    __host__ __device__ __forceinline__ int32_t get_kv_len(int32_t b) const
    {
        return (int32_t)paged_kv.get_length((uint32_t)b);
    }
};

using kvf_fi_variant = flashinfer::DefaultAttention<false, false, false, false>;

template <uint32_t HD>
cudaError_t kvf_fi_run(const kvf_fi_params &p, __nv_bfloat16 *tmp_v, float *tmp_s,
                       cudaStream_t st)
{
    return flashinfer::BatchDecodeWithPagedKVCacheDispatched<
        HD, flashinfer::PosEncodingMode::kNone, kvf_fi_variant, kvf_fi_params>(p, tmp_v, tmp_s,
                                                                              false, st);
}

kvf_fi_params kvf_fi_fill(const kvf_fi_decode_args_t *a)
{
    kvf_fi_params p;
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
    p.o = static_cast<__nv_bfloat16 *>(a->o);
    p.lse = a->lse;
    p.sm_scale = a->sm_scale;
    p.rope_rcp_scale = 1.0;
    p.rope_rcp_theta = 1.0;
    p.padded_batch_size = (uint32_t)a->work;
    p.num_qo_heads = (uint32_t)a->q_heads;
    p.q_stride_n = (a->q_ld > 0) ? a->q_ld : a->q_heads * a->head_dim;
    p.q_stride_h = a->head_dim;
    p.window_left = -1;
    p.request_indices = a->request_indices;
    p.kv_tile_indices = a->kv_tile_indices;
    p.o_indptr = a->o_indptr;
    p.kv_chunk_size_ptr = a->chunk_tokens;
    p.block_valid_mask = a->valid;
    p.partition_kv = true;
    return p;
}

} // namespace

extern "C" int kvf_cuda_fi_decode(const kvf_device_t *dev, const kvf_fi_decode_args_t *a)
{
    cudaStream_t st = kvf_cuda_stream_of(dev);
    const kvf_fi_params p = kvf_fi_fill(a);
    auto *tmp_v = static_cast<__nv_bfloat16 *>(a->tmp_v);
    cudaError_t err;

    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    switch (a->head_dim) {
    case 32:
        err = kvf_fi_run<32>(p, tmp_v, a->tmp_s, st);
        break;
    case 64:
        err = kvf_fi_run<64>(p, tmp_v, a->tmp_s, st);
        break;
    case 128:
        err = kvf_fi_run<128>(p, tmp_v, a->tmp_s, st);
        break;
    case 256:
        err = kvf_fi_run<256>(p, tmp_v, a->tmp_s, st);
        break;
    default:
        return KVF_KERN_EINVAL;
    }
    if (err != cudaSuccess) {
        kvf_kern_report("flashinfer::BatchDecodeWithPagedKVCacheDispatched",
                        cudaGetErrorString(err));
        return KVF_KERN_ECUDA;
    }
    return KVF_KERN_OK;
}
