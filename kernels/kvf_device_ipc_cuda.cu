/*
 * CUDA side of kvf_device_ipc.h: IPC handles of pool allocations and
 * completion events. Reached from kvf_device_ipc.c for CUDA devices only.
 *
 * Design: cudaIpcGetMemHandle names a whole allocation and
 * cudaIpcOpenMemHandle maps it from its first byte, so the owner also
 * publishes where its range starts inside the allocation, and the reader
 * learns how large the mapping is: both through cuMemGetAddressRange,
 * fetched with cudaGetDriverEntryPointByVersion (linking libcuda directly
 * would stop every binary of a CUDA build from starting on a machine
 * without the NVIDIA driver, the CPU-only CI). The size bounds what the
 * reader lets any descriptor touch: a peer claiming a longer region than
 * it shared is refused instead of faulting the reader's context.
 */
#include "kvf_ipc_cuda.h"
#include "kvf_cuda_check.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef CUresult (*kvf_cu_range_fn_t)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);

static kvf_cu_range_fn_t kvf_cuda_range_lookup(void)
{
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void *fn = NULL;
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                       cudaEnableDefault, &q);
    if ((err != cudaSuccess) || (q != cudaDriverEntryPointSuccess)) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (kvf_cu_range_fn_t)fn;
}

/* The allocation holding @a ptr: its start and size. */
static int kvf_cuda_range(const void *ptr, uintptr_t *base_p, size_t *size_p)
{
    static const kvf_cu_range_fn_t fn = kvf_cuda_range_lookup();   /* once, thread-safe */
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r;
    char msg[64];

    if (fn == NULL) {
        kvf_kern_report("cudaGetDriverEntryPointByVersion(\"cuMemGetAddressRange\")",
                        "the driver does not offer it");
        return KVF_KERN_ECUDA;
    }
    r = fn(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
    if (r != CUDA_SUCCESS) {
        snprintf(msg, sizeof(msg), "CUresult %d", (int)r);
        kvf_kern_report("cuMemGetAddressRange(ptr)", msg);
        return KVF_KERN_ECUDA;
    }
    *base_p = (uintptr_t)base;
    *size_p = size;
    return KVF_KERN_OK;
}

extern "C" int kvf_cuda_ipc_export(const kvf_device_t *dev, const void *ptr, size_t len,
                                   kvf_ipc_export_t *exp_p)
{
    cudaIpcMemHandle_t h;
    cudaDeviceProp prop;
    uintptr_t base = 0;
    size_t size = 0;
    int rc;

    static_assert(sizeof(h) == KVF_IPC_HANDLE_BYTES, "cudaIpcMemHandle_t is 64 bytes");
    static_assert(sizeof(prop.uuid) == KVF_DEVICE_UUID_BYTES, "cudaUUID_t is 16 bytes");
    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    rc = kvf_cuda_range(ptr, &base, &size);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    if (((uintptr_t)ptr - base > size) || (len > size - ((uintptr_t)ptr - base))) {
        return KVF_KERN_EINVAL;
    }
    KVF_CUDA_CHECK(cudaIpcGetMemHandle(&h, (void *)ptr));
    KVF_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev->ordinal));
    memcpy(exp_p->handle, &h, sizeof(h));
    exp_p->offset = (uint64_t)((uintptr_t)ptr - base);
    memcpy(exp_p->uuid, &prop.uuid, sizeof(prop.uuid));
    return KVF_KERN_OK;
}

extern "C" int kvf_cuda_ipc_open(const kvf_device_t *dev, const uint8_t *handle, void **base_p,
                                 size_t *len_p)
{
    cudaIpcMemHandle_t h;
    void *p = NULL;
    uintptr_t base = 0;
    size_t size = 0;
    int rc;

    memcpy(&h, handle, sizeof(h));
    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    KVF_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    rc = kvf_cuda_range(p, &base, &size);
    if ((rc == KVF_KERN_OK) && (base != (uintptr_t)p)) {
        kvf_kern_report("cudaIpcOpenMemHandle", "the mapping does not start its allocation");
        rc = KVF_KERN_ECUDA;
    }
    if (rc != KVF_KERN_OK) {
        KVF_CUDA_CHECK_IGNORE(cudaIpcCloseMemHandle(p));
        return rc;
    }
    *base_p = p;
    *len_p = size;
    return KVF_KERN_OK;
}

extern "C" void kvf_cuda_ipc_close(const kvf_device_t *dev, void *base)
{
    KVF_CUDA_CHECK_IGNORE(cudaSetDevice(dev->ordinal));
    KVF_CUDA_CHECK_IGNORE(cudaIpcCloseMemHandle(base));
}

extern "C" bool kvf_cuda_uuid_visible(const uint8_t *uuid)
{
    int count = 0;

    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    for (int d = 0; d < count; ++d) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        if (memcmp(&prop.uuid, uuid, KVF_DEVICE_UUID_BYTES) == 0) {
            return true;
        }
    }
    return false;
}

extern "C" int kvf_cuda_event_record(const kvf_device_t *dev, void **event_p)
{
    cudaEvent_t ev = NULL;

    KVF_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t err = cudaEventRecord(ev, (cudaStream_t)dev->stream);
    if (err != cudaSuccess) {
        (void)cudaEventDestroy(ev);
        return kvf_cuda_error(err, "cudaEventRecord(ev, stream)");
    }
    *event_p = (void *)ev;
    return KVF_KERN_OK;
}

extern "C" int kvf_cuda_event_query(void *event, bool *done_p)
{
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);

    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done_p = false;
        return KVF_KERN_OK;
    }
    KVF_CUDA_CHECK(err);
    *done_p = true;
    return KVF_KERN_OK;
}

extern "C" int kvf_cuda_host_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p)
{
    void *p = NULL;

    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    KVF_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    *ptr_p = p;
    return KVF_KERN_OK;
}

extern "C" void kvf_cuda_host_free(void *ptr)
{
    KVF_CUDA_CHECK_IGNORE(cudaFreeHost(ptr));
}

extern "C" void kvf_cuda_event_destroy(void *event)
{
    KVF_CUDA_CHECK_IGNORE(cudaEventDestroy((cudaEvent_t)event));
}
