/*
 * Launch helpers shared by the *_cuda.cu files of kernels/ (C++ only): the
 * device's stream, 1-D grid sizing, stream-ordered scratch and staged
 * uploads (from the stream's workspace, kvf_device_ws_cuda.cu), and the
 * block-wide double sum the norms use.
 */
#ifndef KVF_CUDA_UTIL_H
#define KVF_CUDA_UTIL_H

#include "kvf_cuda_check.h"
#include "kvf_device.h"

#include <cuda_runtime.h>
#include <stddef.h>

#define KVF_CUDA_THREADS 256u   /* threads per block of every 1-D launch */

static inline cudaStream_t kvf_cuda_stream_of(const kvf_device_t *dev)
{
    return (cudaStream_t)dev->stream;
}

/** Blocks of @a threads threads for @a n threads in all, capped (kernels stride over the
 *  rest). A launch of fewer threads per block than KVF_CUDA_THREADS (register-heavy kernels)
 *  sizes its grid with this, not kvf_cuda_blocks(): that grid would hold only
 *  threads / KVF_CUDA_THREADS of the threads, each thread striding over several items. */
static inline unsigned kvf_cuda_blocks_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    if (b == 0) {
        b = 1;
    }
    return (unsigned)((b > 65535u * 16u) ? 65535u * 16u : b);
}

/** Blocks for @a n threads of KVF_CUDA_THREADS, capped (kernels stride over the rest). */
static inline unsigned kvf_cuda_blocks(size_t n)
{
    return kvf_cuda_blocks_for(n, KVF_CUDA_THREADS);
}

/* The device workspace of a stream (kvf_device_ws_cuda.cu, kvf_device_workspace_reserve()). */
extern "C" int  kvf_cuda_ws_scratch(cudaStream_t stream, size_t bytes, const void *host,
                                    void **ptr_p);
extern "C" void kvf_cuda_ws_scratch_free(cudaStream_t stream, void *p);
/* While a graph is captured on @a stream (kvf_device_graph.h): host inputs of its scratch
 * and uploads come from the published block [host, host + bytes) whose device copy is
 * @a dev, any other is refused by name; on = false ends it. KVF_KERN_EINVAL: no workspace. */
extern "C" int  kvf_cuda_ws_capture_inputs(cudaStream_t stream, const void *host,
                                           const void *dev, size_t bytes, bool on);
extern "C" int  kvf_cuda_ws_upload(cudaStream_t stream, void *dst, const void *host,
                                   size_t bytes);
extern "C" int  kvf_cuda_ws_sync(cudaStream_t stream, int ordinal);

/**
 * Stream-ordered device scratch of @a bytes, optionally filled from host
 * memory @a host (which may be reused on return). From the stream's
 * workspace when it has one (kvf_device_workspace_reserve(): no allocation,
 * the host bytes copied into pinned staging and from there asynchronously,
 * so the host does not block); otherwise, or when the workspace is too
 * small (counted, warned once), cudaMallocAsync and a pageable copy. Free
 * with kvf_cuda_scratch_free() on the same stream, best in LIFO order (the
 * arena is a stack: a piece freed out of order comes back when the pieces
 * above it are freed).
 */
static inline int kvf_cuda_scratch(cudaStream_t stream, size_t bytes, const void *host,
                                   void **ptr_p)
{
    return kvf_cuda_ws_scratch(stream, bytes, host, ptr_p);
}

static inline void kvf_cuda_scratch_free(cudaStream_t stream, void *p)
{
    kvf_cuda_ws_scratch_free(stream, p);
}

/**
 * Copy @a bytes of host memory @a host (reusable on return) to device memory
 * @a dst, ordered on @a stream: through the stream's pinned staging area
 * when it has one (no host block), else a pageable cudaMemcpyAsync.
 */
static inline int kvf_cuda_upload(cudaStream_t stream, void *dst, const void *host, size_t bytes)
{
    return kvf_cuda_ws_upload(stream, dst, host, bytes);
}

/** After a launch: the launch error, reported and mapped. */
static inline int kvf_cuda_launched(const char *what)
{
    cudaError_t err = cudaGetLastError();
    return (err == cudaSuccess) ? KVF_KERN_OK : kvf_cuda_error(err, what);
}

#ifdef __CUDACC__
/**
 * Sum of @a v over the block (blockDim.x == KVF_CUDA_THREADS), as a tree in
 * shared memory; every thread gets the total.
 */
static __device__ inline double kvf_cuda_block_sum(double v)
{
    __shared__ double part[KVF_CUDA_THREADS];
    part[threadIdx.x] = v;
    __syncthreads();
    for (unsigned stride = KVF_CUDA_THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            part[threadIdx.x] += part[threadIdx.x + stride];
        }
        __syncthreads();
    }
    double total = part[0];
    __syncthreads();   /* part may be reused by the next call */
    return total;
}
#endif

#endif
