/*
 * CUDA Gated DeltaNet (kvf_gdn.h) through the shared bodies of kvf_gdn_math.h: the scan with
 * one thread per (value head, value dim) state row over all tokens in order, its fp32 row
 * interleaved in stream-ordered scratch (element i of row r at scratch[i * rows + r]: a
 * warp's loads are coalesced), each thread computing its key head's l2 factors per token
 * (the key dim loop is cheap beside the row's); a narrow state rounded after every token as
 * the CPU does. The gated norm: one thread per (token, head); the sigmoid gates: one thread
 * per element.
 */
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_dtype_math.h"
#include "kvf_gdn_math.h"

typedef struct {
    int          heads, head_dim, groups, key_dim;
    const float *dt_bias, *A_log;
} kvf_cuda_gdn;

__global__ void kvf_gdn_scan_kernel(kvf_cuda_gdn p, int T, const float *xbc, int ldx,
                                    const float *ba, int ldba, void *state, int dtype,
                                    int has_state, float *y, int ldy, float *scratch)
{
    const size_t dv = (size_t)p.head_dim, dk = (size_t)p.key_dim, rows = (size_t)p.heads * dv;
    const float qscale = 1.0f / sqrtf((float)p.key_dim);

    for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows;
         r += (size_t)gridDim.x * blockDim.x) {
        const size_t h = r / dv, g = h / (size_t)(p.heads / p.groups);   /* row r: v[r] */
        float *S = scratch + r;
        for (size_t i = 0; i < dk; ++i) {
            S[i * rows] = has_state ? kvf_hd_load(state, dtype, r * dk + i) : 0.0f;
        }
        for (int t = 0; t < T; ++t) {
            const float *row = xbc + (size_t)t * (size_t)ldx;
            const float *kin = row + rows + g * dk;
            const float *qin = row + rows + (size_t)p.groups * dk + g * dk;
            const float *brow = ba + (size_t)t * (size_t)ldba;
            const float decay = kvf_gdn_decay_hd(p.A_log[h], brow[p.heads + h], p.dt_bias[h]);
            const float beta = kvf_gdn_sigmoid_hd(brow[h]);
            y[(size_t)t * (size_t)ldy + r] =
                kvf_gdn_row_hd(S, rows, p.key_dim, qin, kvf_gdn_inv_l2_hd(qin, p.key_dim),
                               qscale, kin, kvf_gdn_inv_l2_hd(kin, p.key_dim), row[r], decay,
                               beta);
            for (size_t i = 0; (dtype != KVF_HD_FP32) && (i < dk); ++i) {
                S[i * rows] = kvf_hd_round(S[i * rows], dtype);
            }
        }
        for (size_t i = 0; i < dk; ++i) {
            kvf_hd_store(state, dtype, r * dk + i, S[i * rows]);
        }
    }
}

extern "C" int kvf_cuda_gdn_scan(const kvf_device_t *dev, const kvf_gdn_params_t *p, int T,
                                 const float *xbc, int ldx, const float *ba, int ldba,
                                 void *state, kvf_dtype_t state_dtype, int has_state, float *y,
                                 int ldy)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    const size_t rows = (size_t)p->heads * (size_t)p->head_dim;
    const kvf_cuda_gdn g = {p->heads, p->head_dim, p->groups, p->key_dim, p->dt_bias, p->A_log};
    void *scratch = NULL;
    int rc = kvf_cuda_scratch(stream, rows * (size_t)p->key_dim * sizeof(float), NULL,
                              &scratch);

    if (rc != KVF_KERN_OK) {
        return rc;
    }
    kvf_gdn_scan_kernel<<<kvf_cuda_blocks_for(rows, KVF_CUDA_THREADS / 4), KVF_CUDA_THREADS / 4,
                          0, stream>>>(g, T, xbc, ldx, ba, ldba, state, (int)state_dtype,
                                       has_state, y, ldy, (float *)scratch);
    rc = kvf_cuda_launched("kvf_gdn_scan_kernel");
    kvf_cuda_scratch_free(stream, scratch);
    return rc;
}

__global__ void kvf_gdn_gated_norm_kernel(const float *y, int ldy, const float *z, int ldz,
                                          const float *w, int T, int heads, int head_dim,
                                          float eps, float *out, int ldo)
{
    const size_t n = (size_t)T * (size_t)heads;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / (size_t)heads, c = (i % (size_t)heads) * (size_t)head_dim;
        kvf_gdn_gated_norm_row_hd(y + t * (size_t)ldy + c, z + t * (size_t)ldz + c, w, head_dim,
                                  eps, out + t * (size_t)ldo + c);
    }
}

extern "C" int kvf_cuda_gdn_gated_norm(const kvf_device_t *dev, const float *y, int ldy,
                                       const float *z, int ldz, const float *w, int T, int heads,
                                       int head_dim, float eps, float *out, int ldo)
{
    const size_t n = (size_t)T * (size_t)heads;
    if (n == 0) {
        return KVF_KERN_OK;
    }
    kvf_gdn_gated_norm_kernel<<<kvf_cuda_blocks_for(n, KVF_CUDA_THREADS), KVF_CUDA_THREADS, 0,
                                kvf_cuda_stream_of(dev)>>>(y, ldy, z, ldz, w, T, heads, head_dim,
                                                           eps, out, ldo);
    return kvf_cuda_launched("kvf_gdn_gated_norm_kernel");
}

/* x[t][i] *= sigmoid(g[t * gs + i * gi]): the elementwise gate (gs = ldg, gi = 1) or one
 * gate a row (gs = 1, gi = 0). */
__global__ void kvf_sigmoid_scale_kernel(float *x, int ldx, const float *g, int gs, int gi,
                                         int T, int n)
{
    const size_t total = (size_t)T * (size_t)n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / (size_t)n, i = e % (size_t)n;
        x[t * (size_t)ldx + i] *= kvf_gdn_sigmoid_hd(g[t * (size_t)gs + i * (size_t)gi]);
    }
}

static int kvf_cuda_sigmoid_scale(const kvf_device_t *dev, float *x, int ldx, const float *g,
                                  int gs, int gi, int T, int n)
{
    const size_t total = (size_t)T * (size_t)n;
    if (total == 0) {
        return KVF_KERN_OK;
    }
    kvf_sigmoid_scale_kernel<<<kvf_cuda_blocks_for(total, KVF_CUDA_THREADS), KVF_CUDA_THREADS, 0,
                               kvf_cuda_stream_of(dev)>>>(x, ldx, g, gs, gi, T, n);
    return kvf_cuda_launched("kvf_sigmoid_scale_kernel");
}

extern "C" int kvf_cuda_sigmoid_gate(const kvf_device_t *dev, float *x, int ldx,
                                     const float *gate, int ldg, int T, int n)
{
    return kvf_cuda_sigmoid_scale(dev, x, ldx, gate, ldg, 1, T, n);
}

extern "C" int kvf_cuda_sigmoid_row_scale(const kvf_device_t *dev, float *x, int ldx,
                                          const float *g, int T, int n)
{
    return kvf_cuda_sigmoid_scale(dev, x, ldx, g, 1, 0, T, n);
}
