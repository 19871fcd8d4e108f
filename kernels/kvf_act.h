/*
 * Element-wise kernels: activations and dtype conversion, on the CPU and on
 * CUDA, both through the shared bodies of kvf_act_math.h and
 * kvf_dtype_math.h (one thread per element on the GPU).
 */
#ifndef KVF_ACT_H
#define KVF_ACT_H

#include "kvf_act_math.h"
#include "kvf_device.h"
#include "kvf_dtype.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * x[i] = act(x[i]) for i < n, in place.
 * @param [in] act  A KVF_KACT_* code (the same values as common/model's kvf_act_t).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL x with n > 0, act out of
 *         range); KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED (CUDA without CUDA build).
 */
int kvf_act(const kvf_device_t *dev, int act, float *x, size_t n);

/**
 * dst[i] = src[i] converted from @a src_dtype to @a dst_dtype (fp32, bf16,
 * fp16, fp8 e4m3fn), i < n, through fp32 (round to nearest even; fp8
 * saturates). Same-dtype is a copy. Must not overlap.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (NULL with n > 0, bad dtype);
 *         KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED.
 */
int kvf_convert(const kvf_device_t *dev, void *dst, kvf_dtype_t dst_dtype, const void *src,
                kvf_dtype_t src_dtype, size_t n);

#ifdef __cplusplus
}
#endif

#endif
