/*
 * Device layer: CPU implementations and the dispatch to CUDA.
 *
 * Design: a device is a plain value and every call dispatches on its kind,
 * so the CPU path is a direct libc call and CUDA is never touched unless a
 * caller built a CUDA device with kvf_device_init(). Rejected alternative: a
 * process-global "current backend", which would make CPU tests depend on
 * whether the build happened to have CUDA and a GPU. The CUDA side lives in
 * kvf_device_cuda.cu (compiled only with CUDA enabled); here it is reached
 * through kvf_device_cuda.h, and a CPU-only build answers
 * KVF_KERN_EUNSUPPORTED for CUDA devices.
 */
#include "kvf_device.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <stdlib.h>
#include <string.h>

#define KVF_DEVICE_ALIGN 256

static inline bool kvf_device_is_cuda(const kvf_device_t *dev)
{
    return (dev != NULL) && (dev->kind == KVF_DEVICE_CUDA);
}

#ifdef KVF_HAVE_CUDA
#define KVF_DEVICE_CUDA_CALL(_call) return (_call)
#else
#define KVF_DEVICE_CUDA_CALL(_call) return KVF_KERN_EUNSUPPORTED
#endif

kvf_device_t kvf_device_cpu(void)
{
    kvf_device_t dev = {KVF_DEVICE_CPU, 0, NULL};
    return dev;
}

const char *kvf_device_kind_name(kvf_device_kind_t kind)
{
    switch (kind) {
    case KVF_DEVICE_CPU:  return "cpu";
    case KVF_DEVICE_CUDA: return "cuda";
    default:              return "invalid";
    }
}

bool kvf_device_cuda_available(void)
{
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_available();
#else
    return false;
#endif
}

int kvf_device_init(kvf_device_kind_t kind, int ordinal, kvf_device_t *dev_p)
{
    if (dev_p == NULL) {
        return KVF_KERN_EINVAL;
    }
    if (kind == KVF_DEVICE_CPU) {
        if (ordinal != 0) {
            return KVF_KERN_EINVAL;
        }
        *dev_p = kvf_device_cpu();
        return KVF_KERN_OK;
    }
    if (kind != KVF_DEVICE_CUDA || ordinal < 0) {
        return KVF_KERN_EINVAL;
    }
#ifdef KVF_HAVE_CUDA
    int err = kvf_cuda_init(ordinal);
    if (err != KVF_KERN_OK) {
        return err;
    }
    dev_p->kind = KVF_DEVICE_CUDA;
    dev_p->ordinal = ordinal;
    dev_p->stream = NULL;
    return KVF_KERN_OK;
#else
    return KVF_KERN_EUNSUPPORTED;
#endif
}

int kvf_device_bind(const kvf_device_t *dev)
{
    if (!kvf_device_is_cuda(dev)) {
        return KVF_KERN_OK;
    }
    KVF_DEVICE_CUDA_CALL(kvf_cuda_bind(dev));
}

int kvf_device_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p)
{
    void *ptr;

    if ((ptr_p == NULL) || (bytes == 0)) {
        return KVF_KERN_EINVAL;
    }
    if (kvf_device_is_cuda(dev)) {
        KVF_DEVICE_CUDA_CALL(kvf_cuda_alloc(dev, bytes, ptr_p));
    }
    if (bytes > SIZE_MAX - KVF_DEVICE_ALIGN) {
        return KVF_KERN_ENOMEM;
    }
    /* aligned_alloc needs a size that is a multiple of the alignment */
    ptr = aligned_alloc(KVF_DEVICE_ALIGN,
                        (bytes + KVF_DEVICE_ALIGN - 1) / KVF_DEVICE_ALIGN * KVF_DEVICE_ALIGN);
    if (ptr == NULL) {
        return KVF_KERN_ENOMEM;
    }
    *ptr_p = ptr;
    return KVF_KERN_OK;
}

void kvf_device_free(const kvf_device_t *dev, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    if (kvf_device_is_cuda(dev)) {
#ifdef KVF_HAVE_CUDA
        kvf_cuda_free(dev, ptr);
#endif
        return;
    }
    free(ptr);
}

int kvf_device_memset(const kvf_device_t *dev, void *ptr, int value, size_t bytes)
{
    if (bytes == 0) {
        return KVF_KERN_OK;
    }
    if (ptr == NULL) {
        return KVF_KERN_EINVAL;
    }
    if (kvf_device_is_cuda(dev)) {
        KVF_DEVICE_CUDA_CALL(kvf_cuda_memset(dev, ptr, value, bytes));
    }
    memset(ptr, value, bytes);
    return KVF_KERN_OK;
}

int kvf_device_memcpy(const kvf_device_t *dev, void *dst, const void *src, size_t bytes,
                      kvf_copy_kind_t kind)
{
    if (bytes == 0) {
        return KVF_KERN_OK;
    }
    if ((dst == NULL) || (src == NULL) || ((unsigned)kind > KVF_COPY_D2D)) {
        return KVF_KERN_EINVAL;
    }
    if (kvf_device_is_cuda(dev)) {
        KVF_DEVICE_CUDA_CALL(kvf_cuda_memcpy(dev, dst, src, bytes, kind));
    }
    memcpy(dst, src, bytes);
    return KVF_KERN_OK;
}

int kvf_device_sync(const kvf_device_t *dev)
{
    if (!kvf_device_is_cuda(dev)) {
        return KVF_KERN_OK;
    }
    KVF_DEVICE_CUDA_CALL(kvf_cuda_sync(dev));
}

int kvf_device_stream_create(const kvf_device_t *dev, kvf_device_t *dev_p)
{
    if (dev_p == NULL) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_device_is_cuda(dev)) {
        *dev_p = kvf_device_cpu();
        return KVF_KERN_OK;
    }
    KVF_DEVICE_CUDA_CALL(kvf_cuda_stream_create(dev, dev_p));
}

void kvf_device_stream_destroy(kvf_device_t *dev)
{
    if (!kvf_device_is_cuda(dev) || (dev->stream == NULL)) {
        return;
    }
#ifdef KVF_HAVE_CUDA
    kvf_cuda_stream_destroy(dev);
#endif
    dev->stream = NULL;
}

bool kvf_device_ptr_is_cuda(const void *ptr)
{
#ifdef KVF_HAVE_CUDA
    return (ptr != NULL) && kvf_cuda_ptr_is_device(ptr);
#else
    (void)ptr;
    return false;
#endif
}

int kvf_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                    const int64_t *page_ids, size_t n)
{
    if (n == 0) {
        return KVF_KERN_OK;
    }
    if ((base == NULL) || (page_ids == NULL) || (page_size == 0)) {
        return KVF_KERN_EINVAL;
    }
    for (size_t i = 0; i < n; ++i) {
        if (page_ids[i] < 0) {
            return KVF_KERN_EINVAL;
        }
    }
    if (kvf_device_is_cuda(dev)) {
        KVF_DEVICE_CUDA_CALL(kvf_cuda_blocks_zero(dev, base, page_size, page_ids, n));
    }
    for (size_t i = 0; i < n; ++i) {
        memset((char *)base + (size_t)page_ids[i] * page_size, 0, page_size);
    }
    return KVF_KERN_OK;
}

int kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                    const size_t *lens, size_t n)
{
    if (n == 0) {
        return KVF_KERN_OK;
    }
    if ((base == NULL) || (offsets == NULL) || (lens == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (kvf_device_is_cuda(dev)) {
        KVF_DEVICE_CUDA_CALL(kvf_cuda_zero_ranges(dev, base, offsets, lens, n));
    }
    for (size_t i = 0; i < n; ++i) {
        if (lens[i] != 0) {
            memset((char *)base + offsets[i], 0, lens[i]);
        }
    }
    return KVF_KERN_OK;
}

int kvf_device_workspace_reserve(const kvf_device_t *dev, size_t device_bytes,
                                 size_t staging_bytes)
{
    if (!kvf_device_is_cuda(dev)) {
        return KVF_KERN_OK;   /* the CPU kernels take no scratch from a workspace */
    }
    (void)device_bytes;       /* unused without CUDA */
    (void)staging_bytes;
    KVF_DEVICE_CUDA_CALL(kvf_cuda_ws_reserve(dev, device_bytes, staging_bytes));
}

void kvf_device_workspace_release(const kvf_device_t *dev)
{
    if (!kvf_device_is_cuda(dev)) {
        return;
    }
#ifdef KVF_HAVE_CUDA
    kvf_cuda_ws_release(dev);
#endif
}

int kvf_device_workspace_stats(const kvf_device_t *dev, kvf_device_ws_stats_t *stats_p)
{
    if (stats_p == NULL) {
        return KVF_KERN_EINVAL;
    }
    memset(stats_p, 0, sizeof(*stats_p));
    if (!kvf_device_is_cuda(dev)) {
        return KVF_KERN_OK;
    }
    KVF_DEVICE_CUDA_CALL(kvf_cuda_ws_stats(dev, stats_p));
}
