/*
 * CUDA side of the device layer: allocation, copies and block zeroing
 * (the compute kernels are in the other *_cuda.cu files). Compiled only
 * when CUDA is enabled; reached from kvf_device.c only for KVF_DEVICE_CUDA
 * devices.
 *
 * Design: everything is enqueued on the device's stream (NULL = legacy
 * default stream) so zeroing fresh blocks orders before the kernels that
 * read them without a host sync. Block zeroing is one kernel launch for the
 * whole id list (vLLM's KVBlockZeroer): the host id array is copied into a
 * stream-ordered scratch buffer (cudaMallocAsync/cudaFreeAsync), and a 2-D
 * grid writes 16-byte words (y = page, x = chunks of the page). Pages whose
 * size or base is not 16-byte aligned fall back to a byte loop. Rejected
 * alternative: one cudaMemsetAsync per page, which is simple but costs one
 * launch per page (thousands per step at long prompts).
 */
#include "kvf_device_cuda.h"
#include "kvf_cuda_check.h"

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
    KVF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kinds[kind], kvf_cuda_stream(dev)));
    KVF_CUDA_CHECK(cudaStreamSynchronize(kvf_cuda_stream(dev)));
    return KVF_KERN_OK;
}

extern "C" int kvf_cuda_sync(const kvf_device_t *dev)
{
    KVF_CUDA_CHECK(cudaStreamSynchronize(kvf_cuda_stream(dev)));
    return KVF_KERN_OK;
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

/* grid.y walks pages (strided when more than 65535), grid.x covers a page */
__global__ void kvf_blocks_zero_vec_kernel(uint4 *base, size_t words_per_page,
                                           const int64_t *ids, size_t n)
{
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (size_t p = blockIdx.y; p < n; p += gridDim.y) {
        uint4 *page = base + (size_t)ids[p] * words_per_page;
        for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words_per_page;
             w += (size_t)gridDim.x * blockDim.x) {
            page[w] = zero;
        }
    }
}

__global__ void kvf_blocks_zero_byte_kernel(unsigned char *base, size_t page_size,
                                            const int64_t *ids, size_t n)
{
    for (size_t p = blockIdx.y; p < n; p += gridDim.y) {
        unsigned char *page = base + (size_t)ids[p] * page_size;
        for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < page_size;
             b += (size_t)gridDim.x * blockDim.x) {
            page[b] = 0;
        }
    }
}

extern "C" int kvf_cuda_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                                    const int64_t *page_ids, size_t n)
{
    cudaStream_t stream = kvf_cuda_stream(dev);
    const unsigned threads = 256;
    int64_t *d_ids = NULL;
    bool vec = ((page_size % 16) == 0) && ((((uintptr_t)base) % 16) == 0);
    size_t units = vec ? page_size / 16 : page_size;
    size_t gx = (units + threads - 1) / threads;
    dim3 grid((unsigned)(gx > 1024 ? 1024 : gx), (unsigned)(n > 65535 ? 65535 : n));
    int rc = KVF_KERN_OK;

    KVF_CUDA_CHECK(cudaMallocAsync((void **)&d_ids, n * sizeof(*d_ids), stream));
    KVF_CUDA_CHECK_GOTO(cudaMemcpyAsync(d_ids, page_ids, n * sizeof(*d_ids),
                                        cudaMemcpyHostToDevice, stream), rc, out_free);
    if (vec) {
        kvf_blocks_zero_vec_kernel<<<grid, threads, 0, stream>>>((uint4 *)base, units, d_ids, n);
    } else {
        kvf_blocks_zero_byte_kernel<<<grid, threads, 0, stream>>>((unsigned char *)base, units,
                                                                   d_ids, n);
    }
    KVF_CUDA_CHECK_GOTO(cudaGetLastError(), rc, out_free);
out_free:
    /* the copy above is from pageable memory, so page_ids may be reused on return */
    KVF_CUDA_CHECK_IGNORE(cudaFreeAsync(d_ids, stream));
    return rc;
}

extern "C" int kvf_cuda_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                                    const size_t *lens, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        if (lens[i] != 0) {
            KVF_CUDA_CHECK(cudaMemsetAsync((char *)base + offsets[i], 0, lens[i],
                                         kvf_cuda_stream(dev)));
        }
    }
    return KVF_KERN_OK;
}
