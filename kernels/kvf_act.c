/*
 * Activations and dtype conversion on the CPU: loops over the shared bodies
 * (kvf_act_math.h, kvf_dtype_math.h); CUDA in kvf_elem_cuda.cu.
 */
#include "kvf_act.h"
#include "kvf_dtype_math.h"
#include "kvf_kern_internal.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

int kvf_act(const kvf_device_t *dev, int act, float *x, size_t n)
{
    if ((act < 0) || (act >= KVF_KACT_COUNT)) {
        return KVF_KERN_EINVAL;
    }
    if (n == 0) {
        return KVF_KERN_OK;
    }
    if (x == NULL) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_act(dev, act, x, n);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    for (size_t i = 0; i < n; ++i) {
        x[i] = kvf_act_hd(act, x[i]);
    }
    return KVF_KERN_OK;
}

int kvf_convert(const kvf_device_t *dev, void *dst, kvf_dtype_t dst_dtype, const void *src,
                kvf_dtype_t src_dtype, size_t n)
{
    if (((unsigned)dst_dtype >= KVF_DTYPE_COUNT) || ((unsigned)src_dtype >= KVF_DTYPE_COUNT)) {
        return KVF_KERN_EINVAL;
    }
    if (n == 0) {
        return KVF_KERN_OK;
    }
    if ((dst == NULL) || (src == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_convert(dev, dst, (int)dst_dtype, src, (int)src_dtype, n);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    if (dst_dtype == src_dtype) {
        memcpy(dst, src, n * kvf_dtype_size(dst_dtype));
        return KVF_KERN_OK;
    }
    for (size_t i = 0; i < n; ++i) {
        kvf_hd_store(dst, (int)dst_dtype, i, kvf_hd_load(src, (int)src_dtype, i));
    }
    return KVF_KERN_OK;
}
