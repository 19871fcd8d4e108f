/*
 * CUDA RMSNorm and gated grouped RMSNorm: one block per row (or per row and
 * group) sums squares in double as a tree (kvf_cuda_block_sum), then every
 * thread scales its elements with the shared bodies of kvf_norm_math.h. The
 * gated norm of whole groups is one launch (kvf_gated_fused_kernel); two
 * phases (sums, then scaling) when the sums are all-reduced across ranks first.
 */
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_norm_math.h"

/* One row's norm by the block: the body of kvf_rmsnorm_kernel and kvf_rmsnorm_heads_kernel,
 * so both give a row the same bits. */
static __device__ void kvf_rmsnorm_row(const float *xr, const float *w, float *yr, int dim,
                                       float eps)
{
    double s = 0.0;

    for (int c = (int)threadIdx.x; c < dim; c += (int)blockDim.x) {
        s += kvf_norm_sq_hd(xr[c]);
    }
    s = kvf_cuda_block_sum(s);
    float inv = kvf_norm_inv_hd(s, (double)dim, eps);
    for (int c = (int)threadIdx.x; c < dim; c += (int)blockDim.x) {
        yr[c] = kvf_norm_scale_hd(xr[c], inv, w[c]);
    }
}

__global__ void kvf_rmsnorm_kernel(const float *x, const float *w, float *y, int dim, float eps)
{
    kvf_rmsnorm_row(x + (size_t)blockIdx.x * (size_t)dim, w,
                    y + (size_t)blockIdx.x * (size_t)dim, dim, eps);
}

/* block b: head b % heads of token b / heads, in place */
__global__ void kvf_rmsnorm_heads_kernel(float *x, int ld, int heads, int hd, const float *w,
                                         float eps)
{
    float *r = x + (size_t)(blockIdx.x / (unsigned)heads) * (size_t)ld +
               (size_t)(blockIdx.x % (unsigned)heads) * (size_t)hd;
    kvf_rmsnorm_row(r, w, r, hd, eps);
}

/* kvf_add_rmsnorm: row blockIdx.x of h gets its delta (kvf_add_kernel's y += x), and y its
 * norm, with kvf_rmsnorm_kernel's loop and tree over the new values: the same bits as the
 * two launches; each element is added and read back by one thread */
__global__ void kvf_add_rmsnorm_kernel(float *h, const float *delta, const float *w, float *y,
                                       int dim, float eps)
{
    float *hr = h + (size_t)blockIdx.x * (size_t)dim;
    const float *dr = delta + (size_t)blockIdx.x * (size_t)dim;
    float *yr = y + (size_t)blockIdx.x * (size_t)dim;
    double s = 0.0;

    for (int c = (int)threadIdx.x; c < dim; c += (int)blockDim.x) {
        hr[c] += dr[c];
        s += kvf_norm_sq_hd(hr[c]);
    }
    s = kvf_cuda_block_sum(s);
    float inv = kvf_norm_inv_hd(s, (double)dim, eps);
    for (int c = (int)threadIdx.x; c < dim; c += (int)blockDim.x) {
        yr[c] = kvf_norm_scale_hd(hr[c], inv, w[c]);
    }
}

/* The block's sum of squares of group k of row r's gated values (each thread its strided
 * elements, then the tree), written to gr when not NULL; every thread gets the sum. One
 * body for the two-phase and the fused kernel, so both sum the same values the same way. */
static __device__ double kvf_gated_group_sumsq(const float *xr, const float *zr, size_t k,
                                               int group_size, float *gr)
{
    double s = 0.0;

    for (int i = (int)threadIdx.x; i < group_size; i += (int)blockDim.x) {
        size_t c = k * (size_t)group_size + (size_t)i;
        float v = kvf_norm_gate_hd(xr[c], zr[c]);
        if (gr != NULL) {
            gr[c] = v;
        }
        s += kvf_norm_sq_hd(v);
    }
    return kvf_cuda_block_sum(s);
}

/* grid (rows, groups): g = gate(x, z) of the group, sumsq[row][group] */
__global__ void kvf_gated_sumsq_kernel(const float *x, const float *z, int ld, int dim,
                                       int group_size, float *g, float *sumsq)
{
    const size_t r = blockIdx.x, k = blockIdx.y;
    double s = kvf_gated_group_sumsq(x + r * (size_t)ld, z + r * (size_t)ld, k, group_size,
                                     g + r * (size_t)dim);
    if (threadIdx.x == 0) {
        sumsq[r * gridDim.y + k] = (float)s;
    }
}

/*
 * grid (rows, groups): both phases for whole groups in one launch (kvf_gated_rmsnorm): the
 * group's sum of squares as phase 1 computes it, rounded to fp32 as phase 1 stores it, then
 * each thread scales its own elements as phase 2 does, their gated values computed again
 * (the same function of the same inputs: the same bits; an element is read and written by
 * one thread, so y may equal x when ld == dim). No scratch, one launch instead of two.
 */
__global__ void kvf_gated_fused_kernel(const float *x, const float *z, int ld, const float *w,
                                       int dim, int group_size, float eps, float *y)
{
    const size_t r = blockIdx.x, k = blockIdx.y;
    const float *xr = x + r * (size_t)ld, *zr = z + r * (size_t)ld;
    float *yr = y + r * (size_t)dim;
    const float sumsq = (float)kvf_gated_group_sumsq(xr, zr, k, group_size, NULL);
    const float inv = kvf_norm_inv_hd((double)sumsq, (double)group_size, eps);

    for (int i = (int)threadIdx.x; i < group_size; i += (int)blockDim.x) {
        size_t c = k * (size_t)group_size + (size_t)i;
        yr[c] = kvf_norm_scale_hd(kvf_norm_gate_hd(xr[c], zr[c]), inv, w[c]);
    }
}

__global__ void kvf_gated_apply_kernel(const float *g, const float *sumsq, const float *w,
                                       size_t rows, int dim, int group_size, int norm_elems,
                                       float eps, float *y)
{
    const size_t n = rows * (size_t)dim, ngroups = (size_t)(dim / group_size);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)dim, c = i % (size_t)dim;
        float inv = kvf_norm_inv_hd((double)sumsq[r * ngroups + c / (size_t)group_size],
                                    (double)norm_elems, eps);
        y[i] = kvf_norm_scale_hd(g[i], inv, w[c]);
    }
}

extern "C" int kvf_cuda_rmsnorm(const kvf_device_t *dev, const float *x, const float *w,
                                float *y, int rows, int dim, float eps)
{
    kvf_rmsnorm_kernel<<<(unsigned)rows, KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(
        x, w, y, dim, eps);
    return kvf_cuda_launched("kvf_rmsnorm_kernel");
}

extern "C" int kvf_cuda_rmsnorm_heads(const kvf_device_t *dev, float *x, int ld, int tokens,
                                      int heads, int head_dim, const float *w, float eps)
{
    const size_t rows = (size_t)tokens * (size_t)heads;
    if (rows > 0x7fffffffu) {
        return KVF_KERN_EINVAL;   /* the grid's x */
    }
    kvf_rmsnorm_heads_kernel<<<(unsigned)rows, KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(
        x, ld, heads, head_dim, w, eps);
    return kvf_cuda_launched("kvf_rmsnorm_heads_kernel");
}

extern "C" int kvf_cuda_add_rmsnorm(const kvf_device_t *dev, float *h, const float *delta,
                                    const float *w, float *y, int rows, int dim, float eps)
{
    kvf_add_rmsnorm_kernel<<<(unsigned)rows, KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(
        h, delta, w, y, dim, eps);
    return kvf_cuda_launched("kvf_add_rmsnorm_kernel");
}

extern "C" int kvf_cuda_gated_rmsnorm_sumsq(const kvf_device_t *dev, const float *x,
                                            const float *z, int ld, int rows, int dim,
                                            int group_size, float *g, float *sumsq)
{
    dim3 grid((unsigned)rows, (unsigned)(dim / group_size));
    kvf_gated_sumsq_kernel<<<grid, KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(
        x, z, ld, dim, group_size, g, sumsq);
    return kvf_cuda_launched("kvf_gated_sumsq_kernel");
}

extern "C" int kvf_cuda_gated_rmsnorm_apply(const kvf_device_t *dev, const float *g,
                                            const float *sumsq, const float *w, int rows,
                                            int dim, int group_size, int norm_elems, float eps,
                                            float *y)
{
    size_t n = (size_t)rows * (size_t)dim;
    kvf_gated_apply_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0,
                             kvf_cuda_stream_of(dev)>>>(g, sumsq, w, (size_t)rows, dim,
                                                        group_size, norm_elems, eps, y);
    return kvf_cuda_launched("kvf_gated_apply_kernel");
}

extern "C" int kvf_cuda_gated_rmsnorm(const kvf_device_t *dev, const float *x, const float *z,
                                      int ld, const float *w, int rows, int dim,
                                      int group_size, float eps, float *y)
{
    dim3 grid((unsigned)rows, (unsigned)(dim / group_size));
    kvf_gated_fused_kernel<<<grid, KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(
        x, z, ld, w, dim, group_size, eps, y);
    return kvf_cuda_launched("kvf_gated_fused_kernel");
}
