/*
 * CUDA GEMM for linear layers: y = beta * y + x W^T + bias. By default the
 * fixed-order kernel (kvf_gemm_fixed_cuda.cu: the CPU's bits, batch
 * invariant); with KVF_GPU_GEMM=cublas in the environment through
 * cublasSgemm (fp32, CUBLAS_DEFAULT_MATH: no TF32, so results stay within
 * fp32 rounding of the CPU, but a row's bits depend on the call's shape). Row-major y[M][N] = x[M][K] W[N][K]^T is the
 * column-major y^T (N x M) = op_T(W as K x N) * x^T (K x M), so no copy.
 * The bias is broadcast into y by a kernel first (then beta = 1), as the
 * CPU version does.
 *
 * 16-bit weights (kvf_gemm_narrow.h): x rounded to W's dtype by a kernel into
 * the caller's scratch, then cuBLASLt with 16-bit A and B, fp32 C and
 * CUBLAS_COMPUTE_32F (tensor cores, fp32 accumulation), same transposes, one pinned
 * algorithm per weight shape (kvf_gemm_lt_cuda.cu, kvf_gemm_plan.h: batch invariant).
 *
 * Handles: one cuBLAS handle per thread and device ordinal (TP ranks are
 * threads and a handle must not be shared by threads on different
 * streams), made on first use and kept until the process exits; its
 * stream is set to dev->stream before each call.
 */
#include "kvf_cuda_util.h"
#include "kvf_dtype_math.h"
#include "kvf_device_cuda.h"

#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#define KVF_CUDA_MAX_ORDINALS 64

static thread_local cublasHandle_t kvf_cublas_handles[KVF_CUDA_MAX_ORDINALS];

static int kvf_cublas_error(cublasStatus_t st, const char *call)
{
    kvf_kern_report(call, cublasGetStatusString(st));
    return (st == CUBLAS_STATUS_ALLOC_FAILED) ? KVF_KERN_ENOMEM : KVF_KERN_ECUDA;
}

static int kvf_cublas_handle(const kvf_device_t *dev, cublasHandle_t *h_p)
{
    cublasStatus_t st;
    if ((dev->ordinal < 0) || (dev->ordinal >= KVF_CUDA_MAX_ORDINALS)) {
        return KVF_KERN_EINVAL;
    }
    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    if (kvf_cublas_handles[dev->ordinal] == NULL) {
        st = cublasCreate(&kvf_cublas_handles[dev->ordinal]);
        if (st != CUBLAS_STATUS_SUCCESS) {
            kvf_cublas_handles[dev->ordinal] = NULL;
            return kvf_cublas_error(st, "cublasCreate(&handle)");
        }
    }
    st = cublasSetStream(kvf_cublas_handles[dev->ordinal], kvf_cuda_stream_of(dev));
    if (st != CUBLAS_STATUS_SUCCESS) {
        return kvf_cublas_error(st, "cublasSetStream(handle, stream)");
    }
    *h_p = kvf_cublas_handles[dev->ordinal];
    return KVF_KERN_OK;
}

__global__ void kvf_bias_rows_kernel(float *y, int ldy, const float *bias, size_t M, int N,
                                     float beta)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < M * (size_t)N;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t m = i / (size_t)N, n = i % (size_t)N;
        float *p = y + m * (size_t)ldy + n;
        *p = (beta == 0.0f) ? bias[n] : beta * *p + bias[n];
    }
}

static int kvf_cuda_gemm_cublas(const kvf_device_t *dev, int M, int N, int K, const float *x,
                                int ldx, const float *w, int ldw, const float *bias, float beta,
                                float *y, int ldy)
{
    const float alpha = 1.0f;
    cublasHandle_t h = NULL;
    cublasStatus_t st;
    int rc = kvf_cublas_handle(dev, &h);

    if (rc != KVF_KERN_OK) {
        return rc;
    }
    if (bias != NULL) {
        size_t n = (size_t)M * (size_t)N;
        kvf_bias_rows_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0,
                               kvf_cuda_stream_of(dev)>>>(y, ldy, bias, (size_t)M, N, beta);
        rc = kvf_cuda_launched("kvf_bias_rows_kernel");
        if (rc != KVF_KERN_OK) {
            return rc;
        }
        beta = 1.0f;
    }
    /* beta == 0: cuBLAS does not read y, so garbage (NaN) there is harmless */
    st = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, w, ldw, x, ldx, &beta, y, ldy);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return kvf_cublas_error(st, "cublasSgemm(W^T x)");
    }
    return KVF_KERN_OK;
}

/* KVF_GPU_GEMM, read once: 0 fixed (unset, empty or "fixed"), 1 cublas, -1 anything else (refused
 * by name at every call, so the first GEMM fails and says why). */
static int kvf_gpu_gemm_mode_v = -2;

static int kvf_gpu_gemm_mode(void)
{
    /* rank threads may race to the first read: each computes the same value */
    int mode = __atomic_load_n(&kvf_gpu_gemm_mode_v, __ATOMIC_RELAXED);
    if (mode == -2) {
        const char *env = getenv("KVF_GPU_GEMM");
        mode = ((env == NULL) || (env[0] == '\0') || (strcmp(env, "fixed") == 0)) ? 0
               : (strcmp(env, "cublas") == 0)                 ? 1
                                                               : -1;
        __atomic_store_n(&kvf_gpu_gemm_mode_v, mode, __ATOMIC_RELAXED);
    }
    return mode;
}

extern "C" int kvf_cuda_gemm(const kvf_device_t *dev, int M, int N, int K, const float *x,
                             int ldx, const float *w, int ldw, const float *bias, float beta,
                             float *y, int ldy)
{
    switch (kvf_gpu_gemm_mode()) {
    case 0:
        return kvf_cuda_gemm_fixed(dev, M, N, K, 1.0f, x, ldx, w, 0, ldw, bias, beta, -1, y,
                                   ldy);
    case 1:
        return kvf_cuda_gemm_cublas(dev, M, N, K, x, ldx, w, ldw, bias, beta, y, ldy);
    default:
        kvf_kern_report("KVF_GPU_GEMM", "bad value: fixed (the CPU's summation order, batch "
                        "invariant; the default) or cublas (cublasSgemm)");
        return KVF_KERN_EINVAL;
    }
}

/*
 * y = act(x * W^T + bias) (kvf_gemm_w_act): the fixed-order kernel applies the activation to
 * each value as it stores it (bf16 W always; fp32 W unless KVF_GPU_GEMM=cublas), else the
 * GEMM, then kvf_act_kernel over each row: the same bits either way as the two calls.
 */
extern "C" int kvf_cuda_gemm_act(const kvf_device_t *dev, int M, int N, int K, const float *x,
                                 int ldx, const void *w, int wbf, int ldw, const float *bias,
                                 int act, float *y, int ldy)
{
    int rc;

    if (wbf || (kvf_gpu_gemm_mode() == 0)) {
        return kvf_cuda_gemm_fixed(dev, M, N, K, 1.0f, x, ldx, w, wbf, ldw, bias, 0.0f, act, y,
                                   ldy);
    }
    rc = kvf_cuda_gemm(dev, M, N, K, x, ldx, (const float *)w, ldw, bias, 0.0f, y, ldy);
    for (int m = 0; (rc == KVF_KERN_OK) && (m < M); m += (ldy == N) ? M : 1) {
        /* contiguous rows: one launch; strided: a launch per row */
        rc = kvf_cuda_act(dev, act, y + (size_t)m * (size_t)ldy,
                          (size_t)N * (size_t)((ldy == N) ? M : 1));
    }
    return rc;
}

/* xs[m][k] = x[m][k] (ld ldx) rounded to bf16 or fp16, xs contiguous [M][K] */
__global__ void kvf_round_rows_kernel(const float *x, int ldx, size_t M, int K, int dtype,
                                      uint16_t *xs)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < M * (size_t)K;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t m = i / (size_t)K, k = i % (size_t)K;
        float v = x[m * (size_t)ldx + k];
        xs[i] = (dtype == (int)KVF_DTYPE_BF16) ? kvf_hd_fp32_to_bf16(v) : kvf_hd_fp32_to_fp16(v);
    }
}

extern "C" int kvf_cuda_gemm_narrow(const kvf_device_t *dev, int M, int N, int K,
                                    const float *x, int ldx, const void *w, int wdtype, int ldw,
                                    const float *bias, float *y, int ldy, void *xs)
{
    float beta = 0.0f;
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    size_t n = (size_t)M * (size_t)K;
    int rc;

    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    kvf_round_rows_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, stream>>>(
        x, ldx, (size_t)M, K, wdtype, (uint16_t *)xs);
    rc = kvf_cuda_launched("kvf_round_rows_kernel");
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    if (bias != NULL) {
        size_t ny = (size_t)M * (size_t)N;
        kvf_bias_rows_kernel<<<kvf_cuda_blocks(ny), KVF_CUDA_THREADS, 0, stream>>>(
            y, ldy, bias, (size_t)M, N, 0.0f);
        rc = kvf_cuda_launched("kvf_bias_rows_kernel");
        if (rc != KVF_KERN_OK) {
            return rc;
        }
        beta = 1.0f;
    }
    /* one pinned cuBLASLt algorithm per weight shape: a row's bits do not depend on M */
    return kvf_cuda_gemm_lt(dev, M, N, K, xs, w, wdtype, ldw, beta, y, ldy);
}
