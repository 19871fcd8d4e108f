/*
 * CUDA greedy sampling (kvf_argmax.h): one block of KVF_CUDA_THREADS per
 * row; each thread folds its strided columns in index order, then a tree
 * reduction in shared memory merges the candidates (kvf_argmax_math.h: the
 * merge is order-independent, so the result is the serial scan's).
 */
#include "kvf_argmax_math.h"
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"

__global__ void __launch_bounds__(KVF_CUDA_THREADS)
kvf_argmax_rows_kernel(const float *x, int cols, size_t ldx, int32_t *out)
{
    __shared__ float sv[KVF_CUDA_THREADS];
    __shared__ int32_t si[KVF_CUDA_THREADS];
    const float *row = x + (size_t)blockIdx.x * ldx;
    kvf_argmax_cand_t c = {0.0f, -1};

    for (int i = (int)threadIdx.x; i < cols; i += (int)blockDim.x) {
        c = kvf_argmax_take(c, row[i], i);
    }
    sv[threadIdx.x] = c.v;
    si[threadIdx.x] = c.idx;
    __syncthreads();
    for (unsigned stride = KVF_CUDA_THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            kvf_argmax_cand_t a = {sv[threadIdx.x], si[threadIdx.x]};
            kvf_argmax_cand_t b = {sv[threadIdx.x + stride], si[threadIdx.x + stride]};
            a = kvf_argmax_merge(a, b);
            sv[threadIdx.x] = a.v;
            si[threadIdx.x] = a.idx;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        kvf_argmax_cand_t a = {sv[0], si[0]};
        out[blockIdx.x] = kvf_argmax_result(a, row[0]);
    }
}

extern "C" int kvf_cuda_argmax_rows(const kvf_device_t *dev, const float *x, int rows, int cols,
                                    int ldx, int32_t *out)
{
    kvf_argmax_rows_kernel<<<(unsigned)rows, KVF_CUDA_THREADS, 0, kvf_cuda_stream_of(dev)>>>(
        x, cols, (size_t)ldx, out);
    return kvf_cuda_launched("kvf_argmax_rows_kernel");
}
