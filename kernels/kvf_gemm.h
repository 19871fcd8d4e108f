/*
 * Dense fp32 matrix multiply for linear layers: y = x * W^T (+ bias), with W
 * stored as PyTorch nn.Linear stores it, [out_features][in_features].
 *
 * CPU: kvferry's own kernel (kvf_gemm_cpu.c), batch invariant by design:
 * every element y[m][n] is summed in one fixed order (16 FMA lanes over k,
 * then a fixed tree; kernels/kvf_kern_internal.h, kvf_gemm_cpu), so a row's
 * bits never depend on M, on the other rows, on tiling or on the thread
 * count (kvf_gemm_set_threads(): 1 unless an instance of TP 1 asks for more;
 * the columns are split over them). The same on AVX-512, AVX2 and plain C.
 * CUDA: the same order in a kernel of kvferry's own (kvf_gemm_fixed_cuda.cu;
 * the per-element arithmetic is kernels/kvf_gemm_math.h, shared with the
 * CPU), so a GPU row has the CPU's bits and is batch invariant too. With
 * KVF_GPU_GEMM=cublas in the environment: cublasSgemm in fp32
 * (CUBLAS_DEFAULT_MATH: no TF32) on dev->stream instead, one cuBLAS handle
 * per thread and device, bias broadcast by a kernel: within fp32 rounding
 * of the CPU, not batch invariant (cuBLAS picks kernels by shape); any other
 * value fails the call with KVF_KERN_EINVAL naming the variable. All pointers
 * are then device memory.
 */
#ifndef KVF_GEMM_H
#define KVF_GEMM_H

#include "kvf_device.h"
#include "kvf_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Threads of the CPU BLAS for every later GEMM of the process (default 1).
 * For an instance whose TP is 1 (one rank thread): the cores go to the BLAS
 * instead; with TP > 1 keep 1 (each rank is a thread already). The CPU
 * attention and Mamba2 scan split long chunks over as many threads of their
 * own. @a n < 1 counts as 1.
 */
void kvf_gemm_set_threads(int n);

/**
 * y[M][N] = x[M][K] * W[N][K]^T + bias[N] (bias broadcast over rows).
 *
 * @param [in]  dev   NULL, the CPU or a CUDA device.
 * @param [in]  M     Rows of x and y (tokens), >= 0; 0 is a no-op.
 * @param [in]  N     Output features (rows of W), > 0.
 * @param [in]  K     Input features (columns of W), > 0.
 * @param [in]  x     fp32 [M][K], contiguous.
 * @param [in]  w     fp32 [N][K], contiguous (nn.Linear weight layout).
 * @param [in]  bias  fp32 [N], or NULL for none.
 * @param [out] y     fp32 [M][N], contiguous; must not overlap x or w.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL for NULL pointers or negative sizes;
 *         KVF_KERN_ECUDA when a launch or cuBLAS fails (CUDA); KVF_KERN_EUNSUPPORTED
 *         for a CUDA device in a build without CUDA.
 */
int kvf_gemm(const kvf_device_t *dev, int M, int N, int K, const float *x, const float *w,
             const float *bias, float *y);

/**
 * General form: y[M][N] (row stride ldy) = beta * y + x * W^T + bias, with
 * row strides ldx >= K, ldw >= K, ldy >= N (elements). beta = 0 overwrites y
 * (y may then hold garbage, even NaN); beta = 1 accumulates (e.g. residual
 * add). Use it to read a column slice of a wider activation (x = base +
 * offset, ldx = full width) or to write into one. Errors as kvf_gemm().
 */
int kvf_gemm_ex(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                const float *w, int ldw, const float *bias, float beta, float *y, int ldy);

/**
 * y[M][N] (row stride ldy) = x[M][K] (stride ldx) * W^T + bias with W [N][K]
 * (stride ldw) stored as @a w_dtype: fp32, or bf16 widened exactly in the
 * kernel (no widened copy; the bits are those of kvf_gemm_ex() on the
 * widened matrix), on the CPU and on a CUDA device alike (the fixed-order
 * kernel; bf16 device matrices bypass KVF_GPU_GEMM=cublas). Errors as
 * kvf_gemm(); KVF_KERN_EUNSUPPORTED for another dtype.
 */
int kvf_gemm_w(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
               const void *w, kvf_dtype_t w_dtype, int ldw, const float *bias, float *y,
               int ldy);

/**
 * kvf_gemm_w() then an activation on every element of y: y = act(x * W^T + bias), the
 * same bits as kvf_gemm_w() followed by kvf_act() (kernels/kvf_act.h) on y's rows. On a
 * CUDA device the fixed-order kernel applies it to each value as it stores it (one launch
 * fewer: an MLP's up projection and its ReLU^2); with KVF_GPU_GEMM=cublas and fp32 W, the
 * GEMM then the activation kernel.
 *
 * @param act  an activation as kvf_act() takes it (KVF_KACT_* of kvf_act_math.h)
 * @return as kvf_gemm_w(); KVF_KERN_EINVAL for an unknown @a act.
 */
int kvf_gemm_w_act(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                   const void *w, kvf_dtype_t w_dtype, int ldw, const float *bias, int act,
                   float *y, int ldy);

#ifdef __cplusplus
}
#endif

#endif
