/*
 * CUDA side of kvf_gather(): one kernel over an op list (kvf_gather.h).
 *
 * Design: the host op array goes to stream-ordered scratch (kvf_cuda_scratch():
 * the stream's workspace when it has one, else cudaMallocAsync and one
 * cudaMemcpyAsync, freed after the launch, as kvf_cuda_blocks_zero() does
 * with page ids), then one launch whose blocks
 * walk the ops (grid-stride). An op is at most KVF_GATHER_CHUNK bytes; its
 * block copies the bytes up to the destination's 16-byte boundary, then
 * 16-byte words four at a time per thread (four loads in flight before the
 * stores), then the rest, when source and destination share their
 * alignment mod 16; byte by byte otherwise. A source of 0 zeroes. The
 * same bytes as the CPU twin in kvf_gather.c. One block per op (see
 * kvf_gather_blocks()). kvf_cuda_gather_staged()
 * skips the allocation and the staging copy: the caller's pinned ops go to the
 * caller's device buffer by the copy engine. Rejected: one thread per op
 * (a 128 KiB op would be one thread's serial loop), a device-side
 * prefix sum over op lengths (the host already split the ranges).
 */
#include "kvf_ipc_cuda.h"
#include "kvf_gather_tmpl_cuda.h"
#include "kvf_cuda_check.h"
#include "kvf_cuda_util.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define KVF_GATHER_THREADS 512
#define KVF_GATHER_UNROLL  4

__device__ static void kvf_gather_bytes(unsigned char *d, const unsigned char *s, uint64_t n)
{
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
        d[i] = (s != NULL) ? s[i] : (unsigned char)0;
    }
}

/* One block copies [s, s + len) to d (s NULL: zeroes), every thread of it taking part. */
__device__ static void kvf_gather_range(unsigned char *d, const unsigned char *s, uint64_t len)
{
    const uint64_t da = (uint64_t)(uintptr_t)d, sa = (uint64_t)(uintptr_t)s;
    uint64_t head, words;

    if ((s != NULL) && (((sa ^ da) & 15u) != 0)) {
        kvf_gather_bytes(d, s, len);
        return;
    }
    head = (16u - (da & 15u)) & 15u;
    head = (head < len) ? head : len;
    words = (len - head) / 16u;
    kvf_gather_bytes(d, s, head);
    {
        uint4 *dw = (uint4 *)(d + head);
        const uint4 *sw = (s != NULL) ? (const uint4 *)(s + head) : NULL;
        const uint64_t step = (uint64_t)blockDim.x * KVF_GATHER_UNROLL;
        uint64_t w = threadIdx.x;
        for (; w + (KVF_GATHER_UNROLL - 1) * blockDim.x < words; w += step) {
            uint4 v[KVF_GATHER_UNROLL];
#pragma unroll
            for (int k = 0; k < KVF_GATHER_UNROLL; ++k) {
                v[k] = (sw != NULL) ? sw[w + (uint64_t)k * blockDim.x] : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int k = 0; k < KVF_GATHER_UNROLL; ++k) {
                dw[w + (uint64_t)k * blockDim.x] = v[k];
            }
        }
        for (; w < words; w += blockDim.x) {
            dw[w] = (sw != NULL) ? sw[w] : make_uint4(0, 0, 0, 0);
        }
    }
    kvf_gather_bytes(d + head + words * 16u, (s != NULL) ? s + head + words * 16u : NULL,
                     len - head - words * 16u);
}

__global__ void kvf_gather_kernel(const kvf_gather_op_t *ops, size_t n)
{
    for (size_t o = blockIdx.x; o < n; o += gridDim.x) {
        const kvf_gather_op_t op = ops[o];
        kvf_gather_range((unsigned char *)(uintptr_t)op.dst,
                         (const unsigned char *)(uintptr_t)op.src, op.len);
    }
}

/*
 * The template gather (kvf_gather_tmpl.h): op o of the pull is found by a binary search
 * over the jobs' first ops, expanded by kvf_gather_tmpl_op() (the CPU twin's function),
 * its copied part moved and the rest zeroed. The view travels by value in the launch's
 * parameters (under 300 bytes).
 */
__global__ void kvf_gather_tmpl_kernel(const kvf_gather_tmpl_view_t view,
                                       const kvf_gather_job_t *jobs, size_t n, size_t ops)
{
    for (size_t o = blockIdx.x; o < ops; o += gridDim.x) {
        const kvf_gather_job_t jb = jobs[kvf_gather_tmpl_job(jobs, n, o)];
        kvf_gather_op_t op;
        uint64_t copy;
        unsigned char *d;

        kvf_gather_tmpl_op(&view, &jb, (uint32_t)(o - jb.first_op), &op, &copy);
        d = (unsigned char *)(uintptr_t)op.dst;
        if (copy > 0) {
            kvf_gather_range(d, (const unsigned char *)(uintptr_t)op.src, copy);
        }
        if (op.len > copy) {
            kvf_gather_range(d + copy, NULL, op.len - copy);
        }
    }
}

/*
 * Blocks of one launch: one per op (the hardware hands a finished block's SM
 * the next op, so ops of unequal length balance themselves), past 2^20 ops
 * grid-stride. Measured on an H200 (Nemotron-Nano-9B-v2, 8k and 32k tokens):
 * 128 KiB ops and 512 threads beat 64 KiB / 256 and 256 KiB / 512 by 2-13 %,
 * and a grid capped at what the SMs hold (blocks grid-striding over a static
 * share of ops) lost 3-8 % to the tail of blocks holding one op more.
 */
static unsigned kvf_gather_blocks(size_t n)
{
    return (unsigned)((n < ((size_t)1 << 20)) ? n : ((size_t)1 << 20));
}

extern "C" int kvf_cuda_gather_staged(const kvf_device_t *dev, const kvf_gather_op_t *host_ops,
                                      kvf_gather_op_t *dev_ops, size_t n)
{
    cudaStream_t stream = (cudaStream_t)dev->stream;

    KVF_CUDA_CHECK(cudaMemcpyAsync(dev_ops, host_ops, n * sizeof(*dev_ops),
                                   cudaMemcpyHostToDevice, stream));
    kvf_gather_kernel<<<kvf_gather_blocks(n), KVF_GATHER_THREADS, 0, stream>>>(dev_ops,
                                                                                     n);
    KVF_CUDA_CHECK(cudaGetLastError());
    return KVF_KERN_OK;
}

extern "C" int kvf_cuda_gather(const kvf_device_t *dev, const kvf_gather_op_t *ops, size_t n)
{
    cudaStream_t stream = (cudaStream_t)dev->stream;
    void *d_ops = NULL;
    int rc = kvf_cuda_scratch(stream, n * sizeof(kvf_gather_op_t), ops, &d_ops);

    if (rc != KVF_KERN_OK) {
        return rc;
    }
    kvf_gather_kernel<<<kvf_gather_blocks(n), KVF_GATHER_THREADS, 0, stream>>>(
        (const kvf_gather_op_t *)d_ops, n);
    rc = kvf_cuda_launched("kvf_gather_kernel");
    /* the ops were copied (staged or pageable): @a ops may be reused on return */
    kvf_cuda_scratch_free(stream, d_ops);
    return rc;
}

extern "C" int kvf_cuda_gather_table_upload(const kvf_device_t *dev,
                                            const kvf_gather_piece_t *pieces, size_t num_pieces,
                                            const kvf_gather_tmpl_t *tmpls, size_t num_tmpls,
                                            kvf_gather_tmpl_view_t *view)
{
    void *dp = NULL, *dt = NULL;
    cudaError_t err;

    (void)dev;
    err = cudaMalloc(&dp, (num_pieces + 1) * sizeof(*pieces));
    if (err == cudaSuccess) {
        err = cudaMalloc(&dt, (num_tmpls + 1) * sizeof(*tmpls));
    }
    if (err == cudaSuccess) {
        err = cudaMemcpy(dp, pieces, num_pieces * sizeof(*pieces), cudaMemcpyHostToDevice);
    }
    if (err == cudaSuccess) {
        err = cudaMemcpy(dt, tmpls, num_tmpls * sizeof(*tmpls), cudaMemcpyHostToDevice);
    }
    if (err != cudaSuccess) {
        (void)cudaFree(dp);
        (void)cudaFree(dt);
        return kvf_cuda_error(err, "gather table upload");
    }
    view->pieces = (const kvf_gather_piece_t *)dp;
    view->tmpls = (const kvf_gather_tmpl_t *)dt;
    return KVF_KERN_OK;
}

extern "C" void kvf_cuda_gather_table_free(const kvf_device_t *dev, kvf_gather_tmpl_view_t *view)
{
    (void)dev;
    (void)cudaFree((void *)view->pieces);
    (void)cudaFree((void *)view->tmpls);
    view->pieces = NULL;
    view->tmpls = NULL;
}

extern "C" int kvf_cuda_gather_tmpl_run(const kvf_device_t *dev,
                                        const kvf_gather_tmpl_view_t *view,
                                        const kvf_gather_job_t *jobs, kvf_gather_job_t *dev_jobs,
                                        size_t n, size_t ops)
{
    cudaStream_t stream = (cudaStream_t)dev->stream;

    if (ops == 0) {
        return KVF_KERN_OK;
    }
    KVF_CUDA_CHECK(cudaMemcpyAsync(dev_jobs, jobs, n * sizeof(*dev_jobs),
                                   cudaMemcpyHostToDevice, stream));
    kvf_gather_tmpl_kernel<<<kvf_gather_blocks(ops), KVF_GATHER_THREADS, 0, stream>>>(
        *view, dev_jobs, n, ops);
    return kvf_cuda_launched("kvf_gather_tmpl_kernel");
}
