/*
 * fp32 GEMM for linear layers, and the CPU thread count of the kernels.
 *
 * Design: y = x * W^T; on the CPU kvferry's own fixed-order kernel
 * (kvf_gemm_cpu.c: each element's summation order is fixed, so a request's
 * rows do not change with the batch around them), on a CUDA device cuBLAS
 * (kvf_gemm_cuda.cu). OpenBLAS is still pinned to one thread on first use
 * (pthread_once), for any other BLAS call in the process: TP ranks are
 * threads, and each rank calling a BLAS that spawns its own pool
 * oversubscribes the cores. An instance of one rank may give its kernels
 * more threads (kvf_gemm_set_threads): the GEMM splits columns over them,
 * the CPU attention and scan split heads and rows (kvf_kern_parallel,
 * kvf_kern_pool.c).
 */
#include "kvf_gemm.h"
#include "kvf_act.h"
#include "kvf_kern_internal.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <cblas.h>
#include <pthread.h>
#include <string.h>

static pthread_once_t kvf_gemm_once = PTHREAD_ONCE_INIT;
static int kvf_gemm_threads = 1;        /* kvf_gemm_set_threads() */

static void kvf_gemm_init_once(void)
{
    openblas_set_num_threads(1);
}

void kvf_gemm_set_threads(int n)
{
    n = (n < 1) ? 1 : n;
    __atomic_store_n(&kvf_gemm_threads, n, __ATOMIC_RELEASE);
    pthread_once(&kvf_gemm_once, kvf_gemm_init_once);
}

int kvf_kern_cpu_threads(void)
{
    return __atomic_load_n(&kvf_gemm_threads, __ATOMIC_ACQUIRE);
}

/* The shape and pointer checks of a GEMM call: KVF_KERN_EINVAL, 1 when there are no rows
 * (nothing to do), else 0. */
static int kvf_gemm_check(int M, int N, int K, const void *x, int ldx, const void *w, int ldw,
                          const void *y, int ldy)
{
    if ((M < 0) || (N <= 0) || (K <= 0) || (ldx < K) || (ldw < K) || (ldy < N)) {
        return KVF_KERN_EINVAL;
    }
    if (M == 0) {
        return 1;
    }
    return ((x == NULL) || (w == NULL) || (y == NULL)) ? KVF_KERN_EINVAL : 0;
}

int kvf_gemm_ex(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                const float *w, int ldw, const float *bias, float beta, float *y, int ldy)
{
    int c = kvf_gemm_check(M, N, K, x, ldx, w, ldw, y, ldy);

    if (c != 0) {
        return (c > 0) ? KVF_KERN_OK : c;
    }
    if ((dev != NULL) && (dev->kind != KVF_DEVICE_CPU)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gemm(dev, M, N, K, x, ldx, w, ldw, bias, beta, y, ldy);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    /* one fixed summation order per element (kvf_gemm_cpu): batch invariant */
    return kvf_gemm_cpu(M, N, K, 1.0f, x, (size_t)ldx, w, KVF_DTYPE_FP32, (size_t)ldw, bias, beta,
                        y, (size_t)ldy, kvf_kern_cpu_threads());
}

int kvf_gemm(const kvf_device_t *dev, int M, int N, int K, const float *x, const float *w,
             const float *bias, float *y)
{
    return kvf_gemm_ex(dev, M, N, K, x, K, w, K, bias, 0.0f, y, N);
}

int kvf_gemm_w(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
               const void *w, kvf_dtype_t w_dtype, int ldw, const float *bias, float *y, int ldy)
{
    if (w_dtype == KVF_DTYPE_FP32) {
        return kvf_gemm_ex(dev, M, N, K, x, ldx, (const float *)w, ldw, bias, 0.0f, y, ldy);
    }
    if (w_dtype != KVF_DTYPE_BF16) {
        return KVF_KERN_EUNSUPPORTED;
    }
    if ((M < 0) || (N <= 0) || (K <= 0) || (ldx < K) || (ldw < K) || (ldy < N)) {
        return KVF_KERN_EINVAL;
    }
    if ((dev != NULL) && (dev->kind != KVF_DEVICE_CPU)) {
#ifdef KVF_HAVE_CUDA
        /* bf16 W widened in the register, the CPU's order (kvf_gemm_fixed_cuda.cu) */
        return kvf_cuda_gemm_fixed(dev, M, N, K, 1.0f, x, ldx, w, 1, ldw, bias, 0.0f, -1, y,
                                   ldy);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    return kvf_gemm_cpu(M, N, K, 1.0f, x, (size_t)ldx, w, KVF_DTYPE_BF16, (size_t)ldw, bias, 0.0f,
                        y, (size_t)ldy, kvf_kern_cpu_threads());
}

int kvf_gemm_w_act(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                   const void *w, kvf_dtype_t w_dtype, int ldw, const float *bias, int act,
                   float *y, int ldy)
{
    int e;

    if ((act < 0) || (act >= KVF_KACT_COUNT)) {
        return KVF_KERN_EINVAL;
    }
    if ((dev != NULL) && (dev->kind != KVF_DEVICE_CPU) &&
        ((w_dtype == KVF_DTYPE_FP32) || (w_dtype == KVF_DTYPE_BF16))) {
        e = kvf_gemm_check(M, N, K, x, ldx, w, ldw, y, ldy);
        if (e != 0) {
            return (e > 0) ? KVF_KERN_OK : e;
        }
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gemm_act(dev, M, N, K, x, ldx, w, (w_dtype == KVF_DTYPE_BF16) ? 1 : 0,
                                 ldw, bias, act, y, ldy);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    e = kvf_gemm_w(dev, M, N, K, x, ldx, w, w_dtype, ldw, bias, y, ldy);
    for (int m = 0; (e == KVF_KERN_OK) && (m < M); m += (ldy == N) ? M : 1) {
        /* contiguous rows: one call; strided: one a row */
        e = kvf_act(dev, act, y + (size_t)m * (size_t)ldy, (size_t)N * ((ldy == N) ? M : 1));
    }
    return e;
}
