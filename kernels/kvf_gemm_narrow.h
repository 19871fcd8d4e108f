/*
 * Linear layers with 16-bit weights on tensor cores: y = x * W^T + bias with
 * W stored bf16 or fp16 (nn.Linear layout [out][in]) and x fp32, computed
 * as a GPU does it with 16-bit operands: x rounded to W's dtype (nearest
 * even), every product and sum in fp32 (cuBLASLt, 16-bit A and B, fp32 C,
 * CUBLAS_COMPUTE_32F: tensor cores, fp32 accumulation). On a GPU this is
 * the default GEMM of a checkpoint's bf16/fp16 matrices (KVF_GPU_WEIGHTS
 * unset or native, common/runtime/kvf_model_dev.c): half the memory of
 * widened weights and the tensor cores' speed, at the price of the
 * activations' rounding (not the CPU's arithmetic, which widens the weights
 * and keeps x fp32: kvf_gemm.h; KVF_GPU_WEIGHTS=exact reproduces it on a
 * GPU). Batch invariant on a GPU: one cuBLASLt algorithm per weight shape,
 * chosen once and pinned (no split-K, no stream-K, no workspace), passed to
 * every call whatever M (kvf_gemm_plan.h, kvf_gemm_lt_cuda.cu).
 *
 * The CPU version is the reference the GPU is checked against
 * (tests/gpu/gpu_vs_cpu.c): the same rounding, fp32 products summed in k
 * order (cuBLASLt's order differs: equal within fp32 rounding of the sums).
 * It is a plain loop, for tests, not for serving.
 *
 * Activations between layers stay fp32 (the forward's norms, residual adds,
 * attention and Mamba kernels all take fp32); only a GEMM's input is rounded
 * to 16 bits, where transformers' bf16 model has it bf16 too.
 * Rejected: widening a tile of W to fp32 on the GPU before cublasSgemm
 * (the CPU's arithmetic, but three times the weight traffic of a 16-bit
 * read at decode and no tensor cores); cublasGemmEx (what this was: cuBLAS
 * picks a kernel per call's shape, M included, so a row's bits changed with
 * the batch).
 */
#ifndef KVF_GEMM_NARROW_H
#define KVF_GEMM_NARROW_H

#include "kvf_device.h"
#include "kvf_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * y[M][N] (row stride ldy) = round(x)[M][K] * W[N][K]^T + bias[N].
 *
 * @param [in]  dev    NULL, the CPU or a CUDA device (then every array is
 *                     device memory).
 * @param [in]  M      Rows of x and y, >= 0 (0: no-op). N, K > 0.
 * @param [in]  x      fp32 [M][ldx], ldx >= K.
 * @param [in]  w      @a wdtype [N][ldw], ldw >= K.
 * @param [in]  wdtype KVF_DTYPE_BF16 or KVF_DTYPE_FP16.
 * @param [in]  bias   fp32 [N] or NULL.
 * @param [out] y      fp32 [M][ldy], ldy >= N; must not overlap x, w or xs.
 * @param [in]  xs     Scratch for x rounded: M * K elements of @a wdtype
 *                     (2 bytes each), memory of @a dev, owned by the caller
 *                     (a workspace sized once, so a step allocates nothing).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL pointers with M > 0, N or K
 *         < 1, a stride too small, another dtype); KVF_KERN_ECUDA /
 *         KVF_KERN_ENOMEM when cuBLAS fails; KVF_KERN_EUNSUPPORTED for a
 *         CUDA device in a build without CUDA.
 */
int kvf_gemm_narrow(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                    const void *w, kvf_dtype_t wdtype, int ldw, const float *bias, float *y,
                    int ldy, void *xs);

#ifdef __cplusplus
}
#endif

#endif
