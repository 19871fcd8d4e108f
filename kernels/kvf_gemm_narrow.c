/*
 * kvf_gemm_narrow(): argument checks, the CPU reference loop, and the
 * dispatch to cuBLAS (kvf_gemm_cuda.cu). kvf_gemm_narrow.h says why.
 */
#include "kvf_gemm_narrow.h"
#include "kvf_kern_internal.h"

#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

int kvf_gemm_narrow(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                    const void *w, kvf_dtype_t wdtype, int ldw, const float *bias, float *y,
                    int ldy, void *xs)
{
    if ((M < 0) || (N < 1) || (K < 1) || (ldx < K) || (ldw < K) || (ldy < N) ||
        ((wdtype != KVF_DTYPE_BF16) && (wdtype != KVF_DTYPE_FP16))) {
        return KVF_KERN_EINVAL;
    }
    if (M == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (w == NULL) || (y == NULL) || (xs == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gemm_narrow(dev, M, N, K, x, ldx, w, (int)wdtype, ldw, bias, y, ldy, xs);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    uint16_t *xr = (uint16_t *)xs;
    const uint16_t *wr = (const uint16_t *)w;
    for (int m = 0; m < M; ++m) {
        for (int k = 0; k < K; ++k) {
            float v = x[(size_t)m * (size_t)ldx + (size_t)k];
            xr[(size_t)m * (size_t)K + (size_t)k] = (wdtype == KVF_DTYPE_BF16) ?
                kvf_hd_fp32_to_bf16(v) : kvf_hd_fp32_to_fp16(v);
        }
    }
    for (int m = 0; m < M; ++m) {
        for (int n = 0; n < N; ++n) {
            float s = 0.0f;
            for (int k = 0; k < K; ++k) {
                size_t xi = (size_t)m * (size_t)K + (size_t)k;
                size_t wi = (size_t)n * (size_t)ldw + (size_t)k;
                float a = (wdtype == KVF_DTYPE_BF16) ? kvf_hd_bf16_to_fp32(xr[xi]) :
                                                       kvf_hd_fp16_to_fp32(xr[xi]);
                float b = (wdtype == KVF_DTYPE_BF16) ? kvf_hd_bf16_to_fp32(wr[wi]) :
                                                       kvf_hd_fp16_to_fp32(wr[wi]);
                s += a * b;
            }
            y[(size_t)m * (size_t)ldy + (size_t)n] = s + ((bias != NULL) ? bias[n] : 0.0f);
        }
    }
    return KVF_KERN_OK;
}
