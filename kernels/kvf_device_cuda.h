/*
 * Internal: the CUDA implementations behind kernels/kvf_device.h and the
 * kernels that have a CUDA version. Built only when CUDA is enabled
 * (KVF_HAVE_CUDA); kvf_device.c calls them only for KVF_DEVICE_CUDA
 * devices. Same contracts as the public functions of the same stem.
 */
#ifndef KVF_DEVICE_CUDA_H
#define KVF_DEVICE_CUDA_H

#include "kvf_device.h"

#ifdef __cplusplus
extern "C" {
#endif

bool kvf_cuda_available(void);
int  kvf_cuda_init(int ordinal);
int  kvf_cuda_bind(const kvf_device_t *dev);
int  kvf_cuda_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);
void kvf_cuda_free(const kvf_device_t *dev, void *ptr);
int  kvf_cuda_memset(const kvf_device_t *dev, void *ptr, int value, size_t bytes);
int  kvf_cuda_memcpy(const kvf_device_t *dev, void *dst, const void *src, size_t bytes,
                     kvf_copy_kind_t kind);
int  kvf_cuda_sync(const kvf_device_t *dev);
int  kvf_cuda_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                          const int64_t *page_ids, size_t n);
int  kvf_cuda_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                          const size_t *lens, size_t n);
int  kvf_cuda_rmsnorm(const kvf_device_t *dev, const float *x, const float *w, float *y,
                      int rows, int dim, float eps);

#ifdef __cplusplus
}
#endif

#endif
