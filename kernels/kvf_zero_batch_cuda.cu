/*
 * CUDA side of kvf_zero_ranges_batch() (kvf_zero_batch.h): one kernel launch
 * per KVF_ZERO_BATCH_MAX ranges, the range list passed by value in the
 * kernel's arguments. grid.y walks the ranges (one row of blocks per range),
 * grid.x strides over a range's 16-byte words; threads 0..15 of the first
 * block of a row write its unaligned head and tail bytes.
 */
#include "kvf_zero_batch.h"
#include "kvf_cuda_check.h"
#include "kvf_kern.h"

#include <cuda_runtime.h>
#include <stdint.h>

typedef struct kvf_zero_batch_args {
    unsigned long long off[KVF_ZERO_BATCH_MAX];
    unsigned long long len[KVF_ZERO_BATCH_MAX];
    unsigned           n;
} kvf_zero_batch_args_t;

__global__ void kvf_zero_ranges_batch_kernel(unsigned char *base, kvf_zero_batch_args_t a)
{
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;

    for (unsigned r = blockIdx.y; r < a.n; r += gridDim.y) {
        unsigned char *p = base + a.off[r];
        size_t head, words, tail;

        kvf_zero_batch_split((uintptr_t)p, (size_t)a.len[r], &head, &words, &tail);
        if (tid < head) {
            p[tid] = 0;
        }
        uint4 *w = (uint4 *)(p + head);
        for (size_t i = tid; i < words; i += stride) {
            w[i] = zero;
        }
        if (tid < tail) {
            p[head + words * 16u + tid] = 0;
        }
    }
}

extern "C" int kvf_cuda_zero_ranges_batch(const kvf_device_t *dev, void *base,
                                          const size_t *offsets, const size_t *lens, size_t n)
{
    cudaStream_t stream = (cudaStream_t)dev->stream;
    const unsigned threads = 256;

    size_t i = 0;

    while (i < n) {
        kvf_zero_batch_args_t a;
        size_t most = 0;

        a.n = 0;
        for (; (i < n) && (a.n < KVF_ZERO_BATCH_MAX); ++i) {
            if (lens[i] == 0) {
                continue;
            }
            a.off[a.n] = offsets[i];
            a.len[a.n] = lens[i];
            most = (lens[i] > most) ? lens[i] : most;
            a.n++;
        }
        if (a.n == 0) {
            break;   /* only empty ranges were left */
        }
        size_t gx = (most / 16u + threads - 1) / threads;
        dim3 grid((unsigned)((gx < 1) ? 1 : ((gx > 1024) ? 1024 : gx)), a.n);
        kvf_zero_ranges_batch_kernel<<<grid, threads, 0, stream>>>((unsigned char *)base, a);
        KVF_CUDA_CHECK(cudaGetLastError());
    }
    return KVF_KERN_OK;
}
