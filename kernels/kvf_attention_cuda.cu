/*
 * CUDA paged attention: the K/V cache write (one thread per element) and
 * the causal GQA attention (one thread per (query token, query head),
 * walking that query's kernel blocks in order with the shared fold of
 * kvf_attention_math.h, so it has the CPU kernel's numerics, its masking
 * and its stale-NaN hazard). The HOST block table and positions are copied
 * into stream-ordered scratch first.
 *
 * This is the plain mapping of the shared body to threads, not a tuned
 * kernel: no shared-memory K/V tiles, no split-K. A FlashAttention-style
 * kernel would keep the same fold per (query, head) and share the tile
 * loads across a warp.
 */
#include "kvf_attention_math.h"
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"

/* the geometry a thread needs (kvf_paged_kv_t with the device block table) */
struct kvf_cuda_kv {
    char          *base;
    size_t         page_size, kbb, elt;
    int            slots, slot, dtype, kv_heads, head_dim, block_size, kbs;
    const int32_t *block_table;   /* device */
};

static kvf_cuda_kv kvf_cuda_kv_of(const kvf_paged_kv_t *kv, const int32_t *d_table)
{
    kvf_cuda_kv g;
    g.base = (char *)kv->base;
    g.page_size = kv->page_size;
    g.kbb = kvf_paged_kv_kernel_block_bytes(kv);
    g.elt = kvf_dtype_size(kv->dtype);
    g.slots = kv->slots;
    g.slot = kv->slot;
    g.dtype = (int)kv->dtype;
    g.kv_heads = kv->kv_heads;
    g.head_dim = kv->head_dim;
    g.block_size = kv->block_size;
    g.kbs = kv->kernel_block_size;
    g.block_table = d_table;
    return g;
}

static __device__ char *kvf_cuda_kblock(const kvf_cuda_kv &g, int pos)
{
    return g.base + kvf_attn_kblock_offset(g.block_table, g.block_size, g.kbs, g.slots, g.slot,
                                           g.page_size, g.kbb, pos);
}

__global__ void kvf_attn_write_kernel(kvf_cuda_kv g, const float *k, const float *v, int ld,
                                      const int32_t *positions, size_t n)
{
    const size_t hd = (size_t)g.head_dim, nkv = (size_t)g.kv_heads;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t d = i % hd, h = (i / hd) % nkv, t = i / (hd * nkv);
        int pos = positions[t];
        char *kblock = kvf_cuda_kblock(g, pos);
        size_t row = (size_t)(pos % g.kbs);
        size_t src = t * (size_t)ld + h * hd + d;
        kvf_hd_store(kblock, g.dtype, kvf_attn_row_first(nkv, (size_t)g.kbs, hd, h, row, 0) + d,
                     k[src]);
        kvf_hd_store(kblock, g.dtype, kvf_attn_row_first(nkv, (size_t)g.kbs, hd, h, row, 1) + d,
                     v[src]);
    }
}

__global__ void kvf_attn_paged_kernel(kvf_cuda_kv g, const float *q, int ldq,
                                      const int32_t *positions, int num_tokens, int q_heads,
                                      float scale, float *out)
{
    const size_t hd = (size_t)g.head_dim, kbs = (size_t)g.kbs, nkv = (size_t)g.kv_heads;
    const size_t group = (size_t)q_heads / nkv;
    float acc[KVF_ATTN_HD_MAX], s[KVF_ATTN_KBS_MAX];

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
         i < (size_t)num_tokens * (size_t)q_heads; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)q_heads, qh = i % (size_t)q_heads, kh = qh / group;
        const float *qv = q + t * (size_t)ldq + qh * hd;
        int limit = positions[t];
        float m = -INFINITY, l = 0.0f;
        for (size_t d = 0; d < hd; ++d) {
            acc[d] = 0.0f;
        }
        for (int kb = 0; kb <= limit / g.kbs; ++kb) {
            int token0 = kb * g.kbs;
            const char *kblock = kvf_cuda_kblock(g, token0);
            const char *kt = kblock + kh * kbs * hd * g.elt;
            const char *vt = kblock + (nkv + kh) * kbs * hd * g.elt;
            kvf_attn_fold_tile(qv, kt, vt, g.dtype, kbs, hd, token0, limit, scale, &m, &l, acc,
                               s);
        }
        kvf_attn_finish(acc, l, hd, out + t * (size_t)q_heads * hd + qh * hd);
    }
}

/* device copies of the block table and positions, one scratch buffer */
static int kvf_cuda_attn_tables(cudaStream_t stream, const kvf_paged_kv_t *kv,
                                const int32_t *positions, int num_tokens, int32_t **buf_p)
{
    size_t nb = (size_t)kv->num_blocks, nt = (size_t)num_tokens;
    void *buf = NULL;
    int rc = kvf_cuda_scratch(stream, (nb + nt) * sizeof(int32_t), NULL, &buf);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    int32_t *d = (int32_t *)buf;
    KVF_CUDA_CHECK_GOTO(cudaMemcpyAsync(d, kv->block_table, nb * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, stream), rc, out_free);
    KVF_CUDA_CHECK_GOTO(cudaMemcpyAsync(d + nb, positions, nt * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, stream), rc, out_free);
    *buf_p = d;
    return KVF_KERN_OK;
out_free:
    kvf_cuda_scratch_free(stream, buf);
    return rc;
}

extern "C" int kvf_cuda_attn_cache_write(const kvf_device_t *dev, const kvf_paged_kv_t *kv,
                                         const float *k, const float *v, int ld,
                                         const int32_t *positions, int num_tokens)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    int32_t *tables = NULL;
    size_t n = (size_t)num_tokens * (size_t)kv->kv_heads * (size_t)kv->head_dim;
    int rc = kvf_cuda_attn_tables(stream, kv, positions, num_tokens, &tables);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    kvf_attn_write_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, stream>>>(
        kvf_cuda_kv_of(kv, tables), k, v, ld, tables + kv->num_blocks, n);
    rc = kvf_cuda_launched("kvf_attn_write_kernel");
    kvf_cuda_scratch_free(stream, tables);
    return rc;
}

extern "C" int kvf_cuda_attn_paged(const kvf_device_t *dev, const kvf_paged_kv_t *kv,
                                   const float *q, int ldq, const int32_t *positions,
                                   int num_tokens, int q_heads, float scale, float *out)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    int32_t *tables = NULL;
    size_t n = (size_t)num_tokens * (size_t)q_heads;
    int rc;

    if ((kv->head_dim > KVF_ATTN_HD_MAX) || (kv->kernel_block_size > KVF_ATTN_KBS_MAX)) {
        return KVF_KERN_EINVAL;   /* the thread-local accumulator and score tile */
    }
    rc = kvf_cuda_attn_tables(stream, kv, positions, num_tokens, &tables);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    kvf_attn_paged_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS / 2, 0, stream>>>(
        kvf_cuda_kv_of(kv, tables), q, ldq, tables + kv->num_blocks, num_tokens, q_heads, scale,
        out);
    rc = kvf_cuda_launched("kvf_attn_paged_kernel");
    kvf_cuda_scratch_free(stream, tables);
    return rc;
}
