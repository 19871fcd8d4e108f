/*
 * CUDA launchers of the model forward's small ops (kvf_ops.h): one thread
 * per output element (RoPE: per rotated pair), grid-stride, through the
 * shared bodies of kvf_ops_math.h and kvf_dtype_math.h. HOST index and
 * weight arrays are copied to stream-ordered scratch first (staged from
 * pageable memory, so the caller may reuse them on return) and freed on the
 * same stream after the launch.
 */
#include "kvf_cuda_util.h"
#include "kvf_dtype_math.h"
#include "kvf_ops_cuda.h"
#include "kvf_ops_math.h"

__global__ void kvf_add_kernel(float *y, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        y[i] += x[i];
    }
}

__global__ void kvf_scale_kernel(float *x, size_t n, float alpha)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] *= alpha;
    }
}

__global__ void kvf_gather_rows_kernel(const void *src, int src_dtype, size_t cols,
                                       const int32_t *ids, size_t n, float *dst)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n * cols;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / cols, c = e % cols;
        dst[e] = kvf_hd_load(src, src_dtype, (size_t)ids[i] * cols + c);
    }
}

__global__ void kvf_scatter_add_rows_kernel(float *y, size_t ldy, const int32_t *rows,
                                            const float *wt, size_t n, const float *x,
                                            size_t cols)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n * cols;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t j = e / cols, c = e % cols;
        float *dst = y + (size_t)rows[j] * ldy + c;
        *dst = kvf_add_scaled_hd(*dst, x[e], wt[j]);
    }
}

__global__ void kvf_act_mul_kernel(int act, const float *x, size_t M, size_t C, float *y)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < M * C;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t t = e / C, i = e % C;
        const float *gate = x + t * 2u * C;
        y[e] = kvf_act_mul_hd(act, gate[i], gate[C + i]);
    }
}

__global__ void kvf_swiglu_clamp_kernel(float alpha, float limit, const float *x, size_t M,
                                        size_t C, float *y)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < M * C;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t t = e / C, i = e % C;
        const float *gate = x + t * 2u * C;
        y[e] = kvf_swiglu_clamp_hd(gate[i], gate[C + i], alpha, limit);
    }
}

/* one thread per (token, head, pair i < half) */
__global__ void kvf_rope_kernel(const float *inv_freq, int head_dim, const int32_t *positions,
                                size_t T, float *x, size_t ldx, int heads)
{
    const size_t half = (size_t)head_dim / 2u, per_tok = (size_t)heads * half;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < T * per_tok;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t t = e / per_tok, r = e % per_tok, h = r / half, i = r % half;
        float *v = x + t * ldx + h * (size_t)head_dim;
        float c, s;
        kvf_rope_cos_sin_hd(kvf_rope_angle_hd(positions[t], inv_freq[i]), &c, &s);
        kvf_rope_rotate_hd(c, s, &v[i], &v[i + half]);
    }
}

extern "C" int kvf_cuda_add(const kvf_device_t *dev, float *y, const float *x, size_t n)
{
    kvf_add_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(y, x, n);
    return kvf_cuda_launched("kvf_add_kernel");
}

extern "C" int kvf_cuda_scale(const kvf_device_t *dev, float *x, size_t n, float alpha)
{
    kvf_scale_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(x, n,
                                                                                           alpha);
    return kvf_cuda_launched("kvf_scale_kernel");
}

extern "C" int kvf_cuda_gather_rows(const kvf_device_t *dev, const void *src, int src_dtype,
                                    int cols, const int32_t *ids, int n, float *dst)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    size_t total = (size_t)n * (size_t)cols;
    void *d_ids = NULL;
    int rc = kvf_cuda_scratch(stream, (size_t)n * sizeof(int32_t), ids, &d_ids);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    kvf_gather_rows_kernel<<<kvf_cuda_blocks(total), KVF_CUDA_THREADS, 0, stream>>>(
        src, src_dtype, (size_t)cols, (const int32_t *)d_ids, (size_t)n, dst);
    rc = kvf_cuda_launched("kvf_gather_rows_kernel");
    kvf_cuda_scratch_free(stream, d_ids);
    return rc;
}

extern "C" int kvf_cuda_scatter_add_rows(const kvf_device_t *dev, float *y, int ldy,
                                         const int32_t *rows, const float *wt, int n,
                                         const float *x, int cols)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    size_t total = (size_t)n * (size_t)cols;
    void *d_rows = NULL, *d_wt = NULL;
    int rc = kvf_cuda_scratch(stream, (size_t)n * sizeof(int32_t), rows, &d_rows);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    rc = kvf_cuda_scratch(stream, (size_t)n * sizeof(float), wt, &d_wt);
    if (rc != KVF_KERN_OK) {
        kvf_cuda_scratch_free(stream, d_rows);
        return rc;
    }
    kvf_scatter_add_rows_kernel<<<kvf_cuda_blocks(total), KVF_CUDA_THREADS, 0, stream>>>(
        y, (size_t)ldy, (const int32_t *)d_rows, (const float *)d_wt, (size_t)n, x,
        (size_t)cols);
    rc = kvf_cuda_launched("kvf_scatter_add_rows_kernel");
    kvf_cuda_scratch_free(stream, d_wt);
    kvf_cuda_scratch_free(stream, d_rows);
    return rc;
}

extern "C" int kvf_cuda_act_mul(const kvf_device_t *dev, int act, const float *x, int M, int C,
                                float *y)
{
    size_t total = (size_t)M * (size_t)C;
    kvf_act_mul_kernel<<<kvf_cuda_blocks(total), KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(
        act, x, (size_t)M, (size_t)C, y);
    return kvf_cuda_launched("kvf_act_mul_kernel");
}

extern "C" int kvf_cuda_swiglu_clamp(const kvf_device_t *dev, float alpha, float limit,
                                     const float *x, int M, int C, float *y)
{
    size_t total = (size_t)M * (size_t)C;
    kvf_swiglu_clamp_kernel<<<kvf_cuda_blocks(total), KVF_CUDA_THREADS, 0,
                              kvf_cuda_stream_of(dev)>>>(alpha, limit, x, (size_t)M, (size_t)C,
                                                         y);
    return kvf_cuda_launched("kvf_swiglu_clamp_kernel");
}

extern "C" int kvf_cuda_rope(const kvf_device_t *dev, const float *inv_freq, int head_dim,
                             const int32_t *positions, int T, float *x, int ldx, int heads)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    size_t total = (size_t)T * (size_t)heads * (size_t)(head_dim / 2);
    void *d_pos = NULL;
    int rc = kvf_cuda_scratch(stream, (size_t)T * sizeof(int32_t), positions, &d_pos);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    kvf_rope_kernel<<<kvf_cuda_blocks(total), KVF_CUDA_THREADS, 0, stream>>>(
        inv_freq, head_dim, (const int32_t *)d_pos, (size_t)T, x, (size_t)ldx, heads);
    rc = kvf_cuda_launched("kvf_rope_kernel");
    kvf_cuda_scratch_free(stream, d_pos);
    return rc;
}
