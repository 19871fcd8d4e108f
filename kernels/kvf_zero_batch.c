/*
 * kvf_zero_ranges_batch(): argument checks and the CPU path; the CUDA
 * kernel is in kvf_zero_batch_cuda.cu.
 */
#include "kvf_zero_batch.h"

#include "kvf_kern.h"

#include <string.h>

int kvf_zero_ranges_batch(const kvf_device_t *dev, void *base, const size_t *offsets,
                          const size_t *lens, size_t n)
{
    if (n == 0) {
        return KVF_KERN_OK;
    }
    if ((base == NULL) || (offsets == NULL) || (lens == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if ((dev != NULL) && (dev->kind == KVF_DEVICE_CUDA)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_zero_ranges_batch(dev, base, offsets, lens, n);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    for (size_t i = 0; i < n; ++i) {   /* the kernel's split, so both paths cut alike */
        unsigned char *p = (unsigned char *)base + offsets[i];
        size_t head, words, tail;

        kvf_zero_batch_split((uintptr_t)p, lens[i], &head, &words, &tail);
        memset(p, 0, head);
        memset(p + head, 0, words * 16u);
        memset(p + head + words * 16u, 0, tail);
    }
    return KVF_KERN_OK;
}
