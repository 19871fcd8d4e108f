/*
 * CUDA side of the device layer: allocation, copies and zeroing (the
 * compute kernels are in the other *_cuda.cu files; the per-stream
 * workspaces in kvf_device_ws_cuda.cu). Compiled only when CUDA is
 * enabled; reached from kvf_device.c only for KVF_DEVICE_CUDA devices.
 *
 * Design: everything is enqueued on the device's stream (NULL = legacy
 * default stream) so zeroing fresh blocks orders before the kernels that
 * read them without a host sync. Copies: host->device and device->device
 * are only enqueued (stream order is all their users need; the host's
 * bytes go through the stream's pinned staging area when it has one, so
 * the driver does not stage pageable memory and block the host), while
 * device->host and host->host wait for the stream, since the caller reads
 * the result; that wait also lets the stream's staging area be reused
 * (kvf_cuda_ws_sync()). Rejected: a sync after every copy (what this did:
 * a host stall per upload inside a step, and the TP collectives' staging
 * copies each paid one).
 *
 * Zeroing is ONE kernel launch for a whole list, page ids
 * (kvf_blocks_zero(), vLLM's KVBlockZeroer) or byte ranges
 * (kvf_zero_ranges()): the list is uploaded through the stream's staging
 * area into its scratch arena (no allocation, no host block), grid.y walks
 * the list and grid.x strides over a range's units, 16-byte words where
 * aligned and bytes at the unaligned head and tail (kvf_zero_math.h: the
 * arithmetic of which bytes a thread writes, tested on the CPU). Rejected:
 * one cudaMemsetAsync per range (a launch each: what kvf_zero_ranges() did,
 * 16-64 per pull at 8k tokens) and a whole-page kernel with a byte loop
 * for pages that are not 16-byte aligned (the units cover both).
 */
#include "kvf_device_cuda.h"
#include "kvf_cuda_check.h"
#include "kvf_cuda_util.h"
#include "kvf_zero_math.h"

#include <cuda_runtime.h>
#include <stdint.h>

static cudaStream_t kvf_cuda_stream(const kvf_device_t *dev)
{
    return (cudaStream_t)dev->stream;
}

extern "C" bool kvf_cuda_available(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return count > 0;
}

extern "C" int kvf_cuda_init(int ordinal)
{
    int count = 0;
    KVF_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (ordinal >= count) {
        return KVF_KERN_ECUDA;
    }
    KVF_CUDA_CHECK(cudaSetDevice(ordinal));
    /* the kernels' stream-ordered scratch (cudaMallocAsync) comes from the default pool:
     * keep what it has grown to instead of handing it back at every synchronisation, so a
     * step's scratch is a sub-allocation, not a new mapping (best effort: an old driver
     * without pools only loses the caching) */
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, ordinal) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    (void)cudaGetLastError();
    return KVF_KERN_OK;
}

extern "C" int kvf_cuda_bind(const kvf_device_t *dev)
{
    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    return KVF_KERN_OK;
}

extern "C" int kvf_cuda_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p)
{
    void *ptr = NULL;
    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    KVF_CUDA_CHECK(cudaMalloc(&ptr, bytes));
    *ptr_p = ptr;
    return KVF_KERN_OK;
}

extern "C" void kvf_cuda_free(const kvf_device_t *dev, void *ptr)
{
    (void)dev;
    KVF_CUDA_CHECK_IGNORE(cudaFree(ptr));
}

extern "C" int kvf_cuda_memset(const kvf_device_t *dev, void *ptr, int value, size_t bytes)
{
    KVF_CUDA_CHECK(cudaMemsetAsync(ptr, value, bytes, kvf_cuda_stream(dev)));
    return KVF_KERN_OK;
}

extern "C" int kvf_cuda_memcpy(const kvf_device_t *dev, void *dst, const void *src,
                               size_t bytes, kvf_copy_kind_t kind)
{
    static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToHost, cudaMemcpyHostToDevice,
                                           cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
    cudaStream_t stream = kvf_cuda_stream(dev);

    if (kind == KVF_COPY_H2D) {
        return kvf_cuda_upload(stream, dst, src, bytes);   /* stream-ordered, src reusable */
    }
    KVF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kinds[kind], stream));
    if (kind == KVF_COPY_D2D) {
        return KVF_KERN_OK;   /* stream-ordered: later work on the stream sees it */
    }
    return kvf_cuda_ws_sync(stream, -1);   /* the caller reads the host copy on return */
}

extern "C" int kvf_cuda_sync(const kvf_device_t *dev)
{
    return kvf_cuda_ws_sync(kvf_cuda_stream(dev), -1);
}

extern "C" int kvf_cuda_stream_create(const kvf_device_t *dev, kvf_device_t *dev_p)
{
    cudaStream_t stream = NULL;
    KVF_CUDA_CHECK(cudaSetDevice(dev->ordinal));
    KVF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    *dev_p = *dev;
    dev_p->stream = (void *)stream;
    return KVF_KERN_OK;
}

extern "C" void kvf_cuda_stream_destroy(const kvf_device_t *dev)
{
    KVF_CUDA_CHECK_IGNORE(cudaStreamDestroy(kvf_cuda_stream(dev)));
}

extern "C" bool kvf_cuda_ptr_is_device(const void *ptr)
{
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        (void)cudaGetLastError();   /* no CUDA, or not a pointer CUDA knows: host */
        return false;
    }
    return (attr.type == cudaMemoryTypeDevice) || (attr.type == cudaMemoryTypeManaged);
}

/*
 * Zero a list of byte ranges of @a base: range r is [ids[r] * page, + page) when @a ids is
 * set (page ids), else [offs[r], + lens[r]). grid.y walks the ranges (strided when more than
 * 65535), grid.x strides over a range's units (kvf_zero_math.h).
 */
__global__ void kvf_zero_list_kernel(unsigned char *base, const int64_t *ids, size_t page,
                                     const size_t *offs, const size_t *lens, size_t n)
{
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;

    for (size_t r = blockIdx.y; r < n; r += gridDim.y) {
        unsigned char *p = base + ((ids != NULL) ? (size_t)ids[r] * page : offs[r]);
        const size_t len = (ids != NULL) ? page : lens[r];
        const size_t units = kvf_zero_units((uintptr_t)p, len);

        for (size_t u = x; u < units; u += stride) {
            size_t off;
            if (kvf_zero_unit((uintptr_t)p, len, u, &off) == 16u) {
                *(uint4 *)(p + off) = zero;
            } else {
                p[off] = 0;
            }
        }
    }
}

/* One launch over @a n ranges whose longest is @a most bytes (device arrays). */
static int kvf_zero_list_launch(cudaStream_t stream, void *base, const int64_t *d_ids,
                                size_t page, const size_t *d_offs, const size_t *d_lens,
                                size_t n, size_t most)
{
    size_t gx = (most / 16u + 32u + KVF_CUDA_THREADS - 1) / KVF_CUDA_THREADS;
    dim3 grid((unsigned)((gx > 1024) ? 1024 : gx), (unsigned)((n > 65535) ? 65535 : n));

    kvf_zero_list_kernel<<<grid, KVF_CUDA_THREADS, 0, stream>>>((unsigned char *)base, d_ids,
                                                                 page, d_offs, d_lens, n);
    return kvf_cuda_launched("kvf_zero_list_kernel");
}

extern "C" int kvf_cuda_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                                    const int64_t *page_ids, size_t n)
{
    cudaStream_t stream = kvf_cuda_stream(dev);
    void *d_ids = NULL;
    int rc = kvf_cuda_scratch(stream, n * sizeof(int64_t), page_ids, &d_ids);

    if (rc != KVF_KERN_OK) {
        return rc;
    }
    rc = kvf_zero_list_launch(stream, base, (const int64_t *)d_ids, page_size, NULL, NULL, n,
                              page_size);
    kvf_cuda_scratch_free(stream, d_ids);   /* stream-ordered: reused after the kernel */
    return rc;
}

extern "C" int kvf_cuda_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                                    const size_t *lens, size_t n)
{
    cudaStream_t stream = kvf_cuda_stream(dev);
    void *d_offs = NULL, *d_lens = NULL;
    size_t most = 0;
    int rc;

    for (size_t i = 0; i < n; ++i) {
        most = (lens[i] > most) ? lens[i] : most;
    }
    if (most == 0) {
        return KVF_KERN_OK;   /* only empty ranges */
    }
    rc = kvf_cuda_scratch(stream, n * sizeof(size_t), offsets, &d_offs);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    rc = kvf_cuda_scratch(stream, n * sizeof(size_t), lens, &d_lens);
    if (rc == KVF_KERN_OK) {
        rc = kvf_zero_list_launch(stream, base, NULL, 0, (const size_t *)d_offs,
                                  (const size_t *)d_lens, n, most);
    }
    kvf_cuda_scratch_free(stream, d_lens);
    kvf_cuda_scratch_free(stream, d_offs);
    return rc;
}
