/*
 * Small ops of the model forward that would otherwise be host loops over
 * activations: residual add, row gather (embedding lookup, MoE token gather,
 * last-token pick), weighted scatter-add (MoE combine), gated activation
 * (SwiGLU) and RoPE. CPU loops and CUDA launchers (kvf_ops_cuda.cu) over
 * the shared bodies of kvf_ops_math.h; on a CUDA device one thread per
 * output element (RoPE: per rotated pair).
 *
 * Conventions of kernels/ (kvf_kern.h): device first (NULL = CPU), fp32
 * activations, row strides in elements; arrays documented HOST stay host
 * memory on every device (the CUDA launcher copies them to stream-ordered
 * scratch, so they may be reused on return).
 */
#ifndef KVF_OPS_H
#define KVF_OPS_H

#include "kvf_device.h"
#include "kvf_dtype.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * y[i] += x[i] for i < n (a residual add).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL with n > 0); KVF_KERN_ECUDA;
 *         KVF_KERN_EUNSUPPORTED (CUDA device, build without CUDA).
 */
int kvf_add(const kvf_device_t *dev, float *y, const float *x, size_t n);

/**
 * x[i] *= alpha for i < n (Granite's embedding, residual and logits multipliers).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL with n > 0); KVF_KERN_ECUDA;
 *         KVF_KERN_EUNSUPPORTED (CUDA device, build without CUDA).
 */
int kvf_scale(const kvf_device_t *dev, float *x, size_t n, float alpha);

/**
 * dst[i][c] = fp32(src[ids[i]][c]) for i < n, c < cols: rows of a typed
 * matrix [rows][cols] (fp32, bf16, fp16 or fp8) gathered into fp32 [n][cols]
 * (embedding lookup; fp32 rows are copied bit for bit).
 *
 * @param [in] ids  HOST int32 [n], each >= 0 and below the rows of @a src
 *                  (the caller knows the row count; only >= 0 is checked).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL with n > 0, cols < 1, bad dtype,
 *         a negative id); KVF_KERN_ENOMEM; KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED.
 */
int kvf_gather_rows(const kvf_device_t *dev, const void *src, kvf_dtype_t src_dtype, int cols,
                    const int32_t *ids, int n, float *dst);

/**
 * y[rows[j] * ldy + c] += x[j * cols + c] * wt[j] for j < n, c < cols (the
 * MoE combine: one expert's outputs weighted into their tokens' rows).
 *
 * @param [in] rows  HOST int32 [n], each >= 0, all DISTINCT (CUDA threads of
 *                   different j run concurrently).
 * @param [in] wt    HOST fp32 [n].
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL with n > 0, cols < 1, ldy < cols,
 *         a negative row); KVF_KERN_ENOMEM; KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED.
 */
int kvf_scatter_add_rows(const kvf_device_t *dev, float *y, int ldy, const int32_t *rows,
                         const float *wt, int n, const float *x, int cols);

/**
 * y[t][i] = act(x[t][i]) * x[t][C + i] for t < M, i < C: x holds the gate
 * rows' outputs then the up rows' ([M][2C]); y is [M][C], not overlapping x.
 * @param [in] act  A KVF_KACT_* code (kvf_act_math.h).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL with M > 0, C < 1, act out of
 *         range); KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED.
 */
int kvf_act_mul(const kvf_device_t *dev, int act, const float *x, int M, int C, float *y);

/**
 * gpt-oss's experts' activation: y[t][i] = kvf_swiglu_clamp_hd(x[t][i], x[t][C + i], alpha,
 * limit) (kvf_ops_math.h) for t < M, i < C; x holds the gate outputs then the up outputs
 * ([M][2C], de-interleaved at load); y is [M][C], not overlapping x.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL with M > 0, C < 1, M < 0, limit not positive);
 *         KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED.
 */
int kvf_swiglu_clamp(const kvf_device_t *dev, float alpha, float limit, const float *x, int M,
                     int C, float *y);

/**
 * RoPE in place on @a T tokens: the @a heads head vectors of token t start
 * at x + t * ldx, head h at + h * head_dim; each pair (i, i + head_dim/2)
 * is rotated by angle positions[t] * inv_freq[i] (cosf/sinf in fp32).
 *
 * @param [in] inv_freq   fp32 [head_dim / 2] (device memory on CUDA).
 * @param [in] positions  HOST int32 [T].
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL with T > 0, head_dim odd or < 2,
 *         heads < 1, ldx < heads * head_dim); KVF_KERN_ENOMEM; KVF_KERN_ECUDA;
 *         KVF_KERN_EUNSUPPORTED.
 */
int kvf_rope(const kvf_device_t *dev, const float *inv_freq, int head_dim,
             const int32_t *positions, int T, float *x, int ldx, int heads);

#ifdef __cplusplus
}
#endif

#endif
