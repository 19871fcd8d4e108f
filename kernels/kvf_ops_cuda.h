/*
 * Internal: the CUDA launchers behind kvf_ops.h (kvf_ops_cuda.cu), built
 * only with KVF_HAVE_CUDA. Same contracts as the public functions of the
 * same stem, which have already checked the arguments (HOST arrays
 * included), so these only copy the HOST arrays to stream-ordered scratch
 * and launch on dev->stream.
 */
#ifndef KVF_OPS_CUDA_H
#define KVF_OPS_CUDA_H

#include "kvf_device.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int kvf_cuda_add(const kvf_device_t *dev, float *y, const float *x, size_t n);
int kvf_cuda_scale(const kvf_device_t *dev, float *x, size_t n, float alpha);
int kvf_cuda_gather_rows(const kvf_device_t *dev, const void *src, int src_dtype, int cols,
                         const int32_t *ids, int n, float *dst);
int kvf_cuda_scatter_add_rows(const kvf_device_t *dev, float *y, int ldy, const int32_t *rows,
                              const float *wt, int n, const float *x, int cols);
int kvf_cuda_act_mul(const kvf_device_t *dev, int act, const float *x, int M, int C, float *y);
int kvf_cuda_swiglu_clamp(const kvf_device_t *dev, float alpha, float limit, const float *x,
                          int M, int C, float *y);
int kvf_cuda_rope(const kvf_device_t *dev, const float *inv_freq, int head_dim,
                  const int32_t *positions, int T, float *x, int ldx, int heads);

#ifdef __cplusplus
}
#endif

#endif
