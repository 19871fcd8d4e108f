/*
 * The fixed-order GEMM on CUDA: y = alpha * x W^T + (beta * y + bias), every
 * element summed exactly as kvf_gemm_cpu sums it (kvf_gemm_math.h: 16 FMA
 * lanes over k, zero-padded tail, then the fixed tree), so a row's bits never
 * depend on M, on the other rows of the step or on the tiling (batch
 * invariance on the GPU) and equal the CPU's bits.
 *
 * Layout: a thread block is 16 groups of 16 threads; thread l of a group is
 * lane l of the dots of the group's 4 rows x 4 columns (16 dots in flight),
 * reading x[m][k0 + l] and W[n][k0 + l] (16 consecutive floats per group: one
 * 64-byte segment). The tree is __shfl_down_sync by 8, 4, 2, 1 inside the
 * group: lane l adds lane l + 8's sum (s8[l] = p[l] + p[l+8]), then l + 4's,
 * l + 2's, l + 1's, which is kvf_gemm_tree16() term for term (float addition
 * commutes bit for bit). Block tile: 16 groups as 4 row groups x 4 column
 * groups (16 rows x 16 columns: x and W tiles of equal size, each value read
 * by 4 groups through L1), or for M <= 4 (decode of few requests) one row
 * group x 16 (4 rows x 64 columns: W read once, no block computing rows
 * that repeat). The tile shape never changes an element's arithmetic, so
 * choosing it by M keeps the invariance. A row or column past the edge
 * repeats the last real one (reads stay in bounds) and its result is dropped.
 * Design: lanes over k rather than one thread per element, so the order is
 * the CPU's without 16 accumulators per element in registers.
 * Rejected: cublasSgemm as the default: it picks its kernel, tiling and
 * split-K by shape, so the same row summed in a step of 1 row and of 16 rows
 * can differ in the last bits (kept behind KVF_GPU_GEMM=cublas).
 */
#include "kvf_act_math.h"
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"
#include "kvf_gemm_math.h"

#define KVF_GF_RM 4                       /* rows per group */
#define KVF_GF_RN 4                       /* columns per group */
#define KVF_GF_GROUPS 16                  /* groups per block */
#define KVF_GF_THREADS (KVF_GF_GROUPS * KVF_GEMM_LANES)

/* GM row groups x (16 / GM) column groups per block; WBF: W is bf16 */
template <int GM, int WBF>
__global__ void __launch_bounds__(KVF_GF_THREADS)
kvf_gemm_fixed_kernel(int M, int N, int K, float alpha, const float *x, size_t ldx,
                      const void *w, size_t ldw, const float *bias, float beta, int act,
                      float *y, size_t ldy)
{
    constexpr int GN = KVF_GF_GROUPS / GM;
    const int lane = (int)(threadIdx.x % KVF_GEMM_LANES), g = (int)(threadIdx.x / KVF_GEMM_LANES);
    const int m0 = (int)blockIdx.y * (GM * KVF_GF_RM) + (g / GN) * KVF_GF_RM;
    const int n0 = (int)blockIdx.x * (GN * KVF_GF_RN) + (g % GN) * KVF_GF_RN;
    const float *xr[KVF_GF_RM];
    size_t wc[KVF_GF_RN];
    float acc[KVF_GF_RM][KVF_GF_RN];

#pragma unroll
    for (int a = 0; a < KVF_GF_RM; ++a) {
        xr[a] = x + (size_t)min(m0 + a, M - 1) * ldx;
#pragma unroll
        for (int b = 0; b < KVF_GF_RN; ++b) {
            acc[a][b] = 0.0f;
        }
    }
#pragma unroll
    for (int b = 0; b < KVF_GF_RN; ++b) {
        wc[b] = (size_t)min(n0 + b, N - 1) * ldw;
    }
    for (int k0 = 0; k0 < K; k0 += KVF_GEMM_LANES) {
        const int k = k0 + lane;
        float xv[KVF_GF_RM], wv[KVF_GF_RN];
#pragma unroll
        for (int a = 0; a < KVF_GF_RM; ++a) {
            xv[a] = (k < K) ? __ldg(xr[a] + k) : 0.0f;   /* the CPU's zero-padded tail */
        }
#pragma unroll
        for (int b = 0; b < KVF_GF_RN; ++b) {
            wv[b] = (k < K) ? kvf_gemm_w_at(w, WBF, wc[b] + (size_t)k) : 0.0f;
        }
#pragma unroll
        for (int a = 0; a < KVF_GF_RM; ++a) {
#pragma unroll
            for (int b = 0; b < KVF_GF_RN; ++b) {
                acc[a][b] = fmaf(xv[a], wv[b], acc[a][b]);
            }
        }
    }
#pragma unroll
    for (int a = 0; a < KVF_GF_RM; ++a) {
#pragma unroll
        for (int b = 0; b < KVF_GF_RN; ++b) {
            float v = acc[a][b];
            v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 8, KVF_GEMM_LANES));
            v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 4, KVF_GEMM_LANES));
            v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 2, KVF_GEMM_LANES));
            v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1, KVF_GEMM_LANES));
            const int m = m0 + a, n = n0 + b;
            if ((lane == 0) && (m < M) && (n < N)) {
                float *yp = y + (size_t)m * ldy + (size_t)n;
                float out = kvf_gemm_out(v, alpha, beta, (beta != 0.0f) ? *yp : 0.0f,
                                         (bias != NULL) ? bias + n : NULL);
                /* an activation after the GEMM applied to the value it would have stored:
                 * kvf_act_kernel's bits, one launch fewer (kvf_gemm_w_act) */
                *yp = (act >= 0) ? kvf_act_hd(act, out) : out;
            }
        }
    }
}

template <int GM>
static void kvf_gemm_fixed_launch(cudaStream_t stream, int M, int N, int K, float alpha,
                                  const float *x, int ldx, const void *w, int wbf, int ldw,
                                  const float *bias, float beta, int act, float *y, int ldy)
{
    constexpr int TM = GM * KVF_GF_RM, TN = (KVF_GF_GROUPS / GM) * KVF_GF_RN;
    const dim3 grid((unsigned)((N + TN - 1) / TN), (unsigned)((M + TM - 1) / TM));

    if (wbf) {
        kvf_gemm_fixed_kernel<GM, 1><<<grid, KVF_GF_THREADS, 0, stream>>>(
            M, N, K, alpha, x, (size_t)ldx, w, (size_t)ldw, bias, beta, act, y, (size_t)ldy);
    } else {
        kvf_gemm_fixed_kernel<GM, 0><<<grid, KVF_GF_THREADS, 0, stream>>>(
            M, N, K, alpha, x, (size_t)ldx, w, (size_t)ldw, bias, beta, act, y, (size_t)ldy);
    }
}

extern "C" int kvf_cuda_gemm_fixed(const kvf_device_t *dev, int M, int N, int K, float alpha,
                                   const float *x, int ldx, const void *w, int wbf, int ldw,
                                   const float *bias, float beta, int act, float *y, int ldy)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);

    if ((M <= 0) || (N <= 0) || (K <= 0)) {
        return (M == 0) ? KVF_KERN_OK : KVF_KERN_EINVAL;
    }
    if ((M + 4 * KVF_GF_RM - 1) / (4 * KVF_GF_RM) > 65535) {
        return KVF_KERN_EINVAL;   /* more than 1,048,560 rows in one call: the grid's y */
    }
    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    if (M <= KVF_GF_RM) {
        kvf_gemm_fixed_launch<1>(stream, M, N, K, alpha, x, ldx, w, wbf, ldw, bias, beta, act, y,
                                 ldy);
    } else {
        kvf_gemm_fixed_launch<4>(stream, M, N, K, alpha, x, ldx, w, wbf, ldw, bias, beta, act, y,
                                 ldy);
    }
    return kvf_cuda_launched("kvf_gemm_fixed_kernel");
}
