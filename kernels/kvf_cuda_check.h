/*
 * CUDA error domain (docs/CODE_RULES.md §5), for the *.cu files of
 * kernels/. A failed CUDA runtime call is reported where it is first seen,
 * with the call and cudaGetErrorString(), through kvf_kern_report() (the
 * layer above installs its logger there; kernels/ itself never prints), then
 * cleared with cudaGetLastError() so the next call starts clean, and mapped to
 * a kernels/ code: cudaErrorMemoryAllocation -> KVF_KERN_ENOMEM, anything
 * else -> KVF_KERN_ECUDA (which common/ maps to KVF_ERR_NO_MEMORY and
 * KVF_ERR_CUDA). A sticky error (illegal address) cannot be cleared: every
 * later call on that context fails the same way.
 */
#ifndef KVF_CUDA_CHECK_H
#define KVF_CUDA_CHECK_H

#include "kvf_kern.h"

#include <cuda_runtime.h>

static inline int kvf_cuda_error(cudaError_t err, const char *call)
{
    kvf_kern_report(call, cudaGetErrorString(err));
    (void)cudaGetLastError();
    return (err == cudaErrorMemoryAllocation) ? KVF_KERN_ENOMEM : KVF_KERN_ECUDA;
}

/** Return the mapped KVF_KERN_* code from the enclosing function when @a _call fails. */
#define KVF_CUDA_CHECK(_call)                                                 \
    do {                                                                      \
        cudaError_t _err = (_call);                                           \
        if (_err != cudaSuccess) {                                            \
            return kvf_cuda_error(_err, #_call);                              \
        }                                                                     \
    } while (0)

/** Set @a _rc to the mapped KVF_KERN_* code and jump to @a _label when @a _call fails. */
#define KVF_CUDA_CHECK_GOTO(_call, _rc, _label)                               \
    do {                                                                      \
        cudaError_t _err = (_call);                                           \
        if (_err != cudaSuccess) {                                            \
            (_rc) = kvf_cuda_error(_err, #_call);                             \
            goto _label;                                                      \
        }                                                                     \
    } while (0)

/** Report and clear a failure of @a _call (teardown paths) and carry on. */
#define KVF_CUDA_CHECK_IGNORE(_call)                                          \
    do {                                                                      \
        cudaError_t _err = (_call);                                           \
        if (_err != cudaSuccess) {                                            \
            (void)kvf_cuda_error(_err, #_call);                               \
        }                                                                     \
    } while (0)

#endif
