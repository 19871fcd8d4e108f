/*
 * RMSNorm and the gated, grouped RMSNorm of Mamba2 / NemotronH
 * (MambaRMSNormGated), in fp32.
 *
 *   rmsnorm:        y = x * rsqrt(mean(x^2) + eps) * w                (per row)
 *   gated rmsnorm:  g = x * silu(z);  per group of group_size elements:
 *                   y = g * rsqrt(mean_group(g^2) + eps) * w
 *
 * The gated norm is also offered in two phases for tensor parallelism: when
 * a norm group spans several ranks (n_groups < tp), each rank computes the
 * partial sum of squares of its slice of the group (phase 1), the caller
 * all-reduces the sums across the ranks sharing the group, and each rank
 * applies the norm with the total sum and the FULL group size (phase 2).
 * When each rank holds whole groups, phase 2 gets its own sums unchanged.
 *
 * CUDA (kvf_norm_cuda.cu): all four, one block per row (or row and group)
 * summing squares in double, the elementwise parts from kvf_norm_math.h.
 */
#ifndef KVF_NORM_H
#define KVF_NORM_H

#include "kvf_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * y[r][:] = x[r][:] * rsqrt(sum(x[r]^2) / dim + eps) * w[:] for r < rows.
 *
 * @param [in]  x     fp32 [rows][dim] contiguous.
 * @param [in]  w     fp32 [dim].
 * @param [out] y     fp32 [rows][dim]; may be the same pointer as x (in place).
 * @param [in]  rows  >= 0 (0 is a no-op); dim > 0; eps >= 0.
 * @return KVF_KERN_OK, KVF_KERN_EINVAL; CUDA: KVF_KERN_ECUDA (enqueued on
 *         dev->stream, all pointers device memory).
 */
int kvf_rmsnorm(const kvf_device_t *dev, const float *x, const float *w, float *y, int rows,
                int dim, float eps);

/**
 * Per-head RMSNorm in place over the heads of many tokens (Qwen3's q_norm / k_norm): for
 * t < tokens, h < heads, the head_dim values at x + t * ld + h * head_dim are normed with
 * @a w, as kvf_rmsnorm(x + t * ld, w, x + t * ld, heads, head_dim, eps) per token does (the
 * same bits: on the CPU those calls; on a CUDA device one launch of tokens x heads blocks,
 * each row kvf_rmsnorm's loop and tree, instead of a launch per token).
 *
 * @param [in,out] x         fp32; row t of @a ld floats holds heads * head_dim values.
 * @param [in]     ld        Floats between tokens, >= heads * head_dim.
 * @param [in]     tokens    >= 0 (0 is a no-op); heads, head_dim > 0; eps >= 0.
 * @param [in]     w         fp32 [head_dim].
 * @return KVF_KERN_OK, KVF_KERN_EINVAL; CUDA: KVF_KERN_ECUDA (enqueued on dev->stream,
 *         device pointers).
 */
int kvf_rmsnorm_heads(const kvf_device_t *dev, float *x, int ld, int tokens, int heads,
                      int head_dim, const float *w, float eps);

/**
 * The residual add and the next norm in one pass: h[r][:] += delta[r][:], then
 * y[r][:] = kvf_rmsnorm of the new h[r] (the same bits as kvf_add() then
 * kvf_rmsnorm() on the same device: on a CUDA device one launch instead of two,
 * each row's sum of squares in kvf_rmsnorm's order; on the CPU those two calls).
 *
 * @param [in,out] h      fp32 [rows][dim] contiguous: the residual stream.
 * @param [in]     delta  fp32 [rows][dim] contiguous (a layer's output); not h.
 * @param [in]     w      fp32 [dim].
 * @param [out]    y      fp32 [rows][dim]; neither h nor delta.
 * @param [in]     rows   >= 0 (0 is a no-op); dim > 0; eps >= 0.
 * @return KVF_KERN_OK, KVF_KERN_EINVAL; CUDA: KVF_KERN_ECUDA (enqueued on
 *         dev->stream, all pointers device memory).
 */
int kvf_add_rmsnorm(const kvf_device_t *dev, float *h, const float *delta, const float *w,
                    float *y, int rows, int dim, float eps);

/**
 * Phase 1 of the gated norm. For r < rows, c < dim:
 *   g[r][c] = x[r][c] * silu(z[r][c]),  silu(v) = v / (1 + exp(-v))
 *   sumsq[r][k] = sum over c in group k of g[r][c]^2, k < dim / group_size
 *
 * @param [in]  x, z        fp32 [rows][ld] (row stride ld >= dim elements),
 *                          e.g. slices of the in_proj output.
 * @param [in]  ld          Row stride of x and z, elements.
 * @param [in]  rows, dim   dim = this rank's channels; group_size must divide dim.
 * @param [in]  group_size  Elements of one group ON THIS RANK (the whole group
 *                          when the rank holds whole groups, else the slice).
 * @param [out] g           fp32 [rows][dim] contiguous; may equal x only when
 *                          ld == dim.
 * @param [out] sumsq       fp32 [rows][dim / group_size].
 * @return KVF_KERN_OK, KVF_KERN_EINVAL, KVF_KERN_ECUDA (CUDA).
 */
int kvf_gated_rmsnorm_sumsq(const kvf_device_t *dev, const float *x, const float *z, int ld,
                            int rows, int dim, int group_size, float *g, float *sumsq);

/**
 * Phase 2: y[r][c] = g[r][c] * rsqrt(sumsq[r][c / group_size] / norm_elems
 *                    + eps) * w[c].
 *
 * @param [in]  g, sumsq    From phase 1 (sumsq possibly all-reduced).
 * @param [in]  w           fp32 [dim], this rank's slice of the norm weight.
 * @param [in]  group_size  As in phase 1.
 * @param [in]  norm_elems  Elements of the FULL group across ranks (the mean's
 *                          divisor), >= group_size.
 * @param [out] y           fp32 [rows][dim]; may equal g.
 * @return KVF_KERN_OK, KVF_KERN_EINVAL, KVF_KERN_ECUDA (CUDA).
 */
int kvf_gated_rmsnorm_apply(const kvf_device_t *dev, const float *g, const float *sumsq,
                            const float *w, int rows, int dim, int group_size, int norm_elems,
                            float eps, float *y);

/**
 * One-shot gated norm for whole groups on this rank: phase 1 + phase 2 with
 * norm_elems = group_size. x, z: [rows][ld]; y: [rows][dim] contiguous (may
 * equal x when ld == dim). The same bits as the two phases. On a CUDA device
 * one kernel launch and no temporary; on the CPU a temporary of
 * rows * dim / group_size floats (KVF_KERN_ENOMEM if it cannot be allocated).
 */
int kvf_gated_rmsnorm(const kvf_device_t *dev, const float *x, const float *z, int ld,
                      const float *w, int rows, int dim, int group_size, float eps, float *y);

#ifdef __cplusplus
}
#endif

#endif
