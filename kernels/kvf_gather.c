/*
 * kvf_gather(): the CPU twin (one memcpy or memset per op, the bytes the
 * CUDA kernel of kvf_gather_cuda.cu writes) and the dispatch to CUDA. The
 * splitting of ranges into ops is shared by both devices.
 */
#include "kvf_gather.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_ipc_cuda.h"
#endif

#include <string.h>

size_t kvf_gather_split(uint64_t src, uint64_t dst, uint64_t len, kvf_gather_op_t *ops)
{
    size_t n = 0;

    for (uint64_t done = 0; done < len; done += KVF_GATHER_CHUNK) {
        uint64_t l = (len - done < KVF_GATHER_CHUNK) ? len - done : KVF_GATHER_CHUNK;
        ops[n].src = (src != 0) ? src + done : 0;
        ops[n].dst = dst + done;
        ops[n].len = l;
        ++n;
    }
    return n;
}

/* Every op has a length and a destination. */
static bool kvf_gather_ops_ok(const kvf_gather_op_t *ops, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        if ((ops[i].len == 0) || (ops[i].dst == 0)) {
            return false;
        }
    }
    return true;
}

/* The CPU twin: what the CUDA kernel writes, op by op. */
static void kvf_gather_cpu(const kvf_gather_op_t *ops, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        void *dst = (void *)(uintptr_t)ops[i].dst;
        if (ops[i].src == 0) {
            memset(dst, 0, (size_t)ops[i].len);
        } else {
            memcpy(dst, (const void *)(uintptr_t)ops[i].src, (size_t)ops[i].len);
        }
    }
}

int kvf_gather_staged(const kvf_device_t *dev, const kvf_gather_op_t *host_ops,
                      kvf_gather_op_t *dev_ops, size_t n)
{
    bool cuda = (dev != NULL) && (dev->kind == KVF_DEVICE_CUDA);

    if (n == 0) {
        return KVF_KERN_OK;
    }
    if ((host_ops == NULL) || (cuda && (dev_ops == NULL)) || !kvf_gather_ops_ok(host_ops, n)) {
        return KVF_KERN_EINVAL;
    }
    if (cuda) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gather_staged(dev, host_ops, dev_ops, n);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    kvf_gather_cpu(host_ops, n);
    return KVF_KERN_OK;
}

int kvf_gather(const kvf_device_t *dev, const kvf_gather_op_t *ops, size_t n)
{
    if (n == 0) {
        return KVF_KERN_OK;
    }
    if (ops == NULL) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_gather_ops_ok(ops, n)) {
        return KVF_KERN_EINVAL;
    }
    if ((dev != NULL) && (dev->kind == KVF_DEVICE_CUDA)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_gather(dev, ops, n);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    kvf_gather_cpu(ops, n);
    return KVF_KERN_OK;
}
