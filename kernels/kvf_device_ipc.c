/*
 * Device layer, CUDA IPC and events: argument checks and the dispatch to
 * kvf_device_ipc_cuda.cu. The CPU has no IPC handle (host pools on one node
 * are shared by UCX's shared-memory transports instead), so the CPU answers
 * unsupported and its events are always done.
 */
#include "kvf_device_ipc.h"

#include <stdlib.h>
#ifdef KVF_HAVE_CUDA
#include "kvf_ipc_cuda.h"
#endif

static inline bool kvf_ipc_is_cuda(const kvf_device_t *dev)
{
    return (dev != NULL) && (dev->kind == KVF_DEVICE_CUDA);
}

int kvf_device_ipc_export(const kvf_device_t *dev, const void *ptr, size_t len,
                          kvf_ipc_export_t *exp_p)
{
    if ((ptr == NULL) || (len == 0) || (exp_p == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_ipc_is_cuda(dev)) {
        return KVF_KERN_EUNSUPPORTED;
    }
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_ipc_export(dev, ptr, len, exp_p);
#else
    return KVF_KERN_EUNSUPPORTED;
#endif
}

int kvf_device_ipc_open(const kvf_device_t *dev, const uint8_t *handle, void **base_p,
                        size_t *len_p)
{
    if ((handle == NULL) || (base_p == NULL) || (len_p == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_ipc_is_cuda(dev)) {
        return KVF_KERN_EUNSUPPORTED;
    }
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_ipc_open(dev, handle, base_p, len_p);
#else
    return KVF_KERN_EUNSUPPORTED;
#endif
}

void kvf_device_ipc_close(const kvf_device_t *dev, void *base)
{
    if ((base == NULL) || !kvf_ipc_is_cuda(dev)) {
        return;
    }
#ifdef KVF_HAVE_CUDA
    kvf_cuda_ipc_close(dev, base);
#endif
}

bool kvf_device_uuid_visible(const uint8_t *uuid)
{
#ifdef KVF_HAVE_CUDA
    return (uuid != NULL) && kvf_cuda_uuid_visible(uuid);
#else
    (void)uuid;
    return false;
#endif
}

int kvf_device_event_record(const kvf_device_t *dev, void **event_p)
{
    if (event_p == NULL) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_ipc_is_cuda(dev)) {
        *event_p = NULL;
        return KVF_KERN_OK;
    }
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_event_record(dev, event_p);
#else
    return KVF_KERN_EUNSUPPORTED;
#endif
}

int kvf_device_event_query(const kvf_device_t *dev, void *event, bool *done_p)
{
    if (done_p == NULL) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_ipc_is_cuda(dev) || (event == NULL)) {
        *done_p = true;
        return KVF_KERN_OK;
    }
#ifdef KVF_HAVE_CUDA
    return kvf_cuda_event_query(event, done_p);
#else
    return KVF_KERN_EUNSUPPORTED;
#endif
}

int kvf_device_host_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p)
{
    void *p;

    if ((bytes == 0) || (ptr_p == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (kvf_ipc_is_cuda(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_host_alloc(dev, bytes, ptr_p);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    p = malloc(bytes);
    if (p == NULL) {
        return KVF_KERN_ENOMEM;
    }
    *ptr_p = p;
    return KVF_KERN_OK;
}

void kvf_device_host_free(const kvf_device_t *dev, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    if (kvf_ipc_is_cuda(dev)) {
#ifdef KVF_HAVE_CUDA
        kvf_cuda_host_free(ptr);
#endif
        return;
    }
    free(ptr);
}

void kvf_device_event_destroy(const kvf_device_t *dev, void *event)
{
    if ((event == NULL) || !kvf_ipc_is_cuda(dev)) {
        return;
    }
#ifdef KVF_HAVE_CUDA
    kvf_cuda_event_destroy(event);
#endif
}
