/*
 * Internal helpers shared by the CPU kernels: vector load/store between fp32
 * and a cache dtype (through the shared conversions of kvf_dtype_math.h, the
 * same ones the CUDA kernels use), and the CPU-device test. Not part of the
 * public API.
 */
#ifndef KVF_KERN_INTERNAL_H
#define KVF_KERN_INTERNAL_H

#include "kvf_device.h"
#include "kvf_dtype.h"
#include "kvf_dtype_math.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline bool kvf_kern_on_cpu(const kvf_device_t *dev)
{
    return (dev == NULL) || (dev->kind == KVF_DEVICE_CPU);
}

/**
 * CPU threads a kernel may use (kvf_gemm_set_threads(); 1 unless an instance
 * of TP 1 gave the BLAS more). Defined in kvf_gemm.c.
 */
int kvf_kern_cpu_threads(void);

/** One part of a kvf_kern_parallel() job: part in [0, parts); returns a KVF_KERN_* code. */
typedef int (*kvf_kern_par_fn_t)(void *ctx, int part, int parts);

/**
 * Run fn(ctx, part, parts) for every part, part 0 on the calling thread and
 * the others on threads started for the call (joined before the return; a
 * part whose thread fails to start runs on the caller). parts is clamped to
 * [1, 64]. @return the first failing part's code, else KVF_KERN_OK.
 */
int kvf_kern_parallel(int parts, kvf_kern_par_fn_t fn, void *ctx);

/** True for the cache dtypes kernels can read and write: fp32, bf16, fp16. */
static inline bool kvf_kern_cache_dtype_ok(kvf_dtype_t dtype)
{
    return (dtype == KVF_DTYPE_FP32) || (dtype == KVF_DTYPE_BF16) || (dtype == KVF_DTYPE_FP16);
}

/** out[i] = element (first + i) of a typed array, as fp32, i < n. */
static inline void kvf_kern_load(const void *src, kvf_dtype_t dtype, size_t first, size_t n,
                                 float *out)
{
    switch (dtype) {
    case KVF_DTYPE_FP32:
        memcpy(out, (const float *)src + first, n * sizeof(float));
        break;
    case KVF_DTYPE_BF16: {
        const uint16_t *s = (const uint16_t *)src + first;
        for (size_t i = 0; i < n; ++i) {
            out[i] = kvf_hd_bf16_to_fp32(s[i]);
        }
        break;
    }
    case KVF_DTYPE_FP16: {
        const uint16_t *s = (const uint16_t *)src + first;
        for (size_t i = 0; i < n; ++i) {
            out[i] = kvf_hd_fp16_to_fp32(s[i]);
        }
        break;
    }
    default:
        memset(out, 0, n * sizeof(float));
        break;
    }
}

/** Element (first + i) of a typed array = in[i], rounded to nearest even, i < n. */
static inline void kvf_kern_store(void *dst, kvf_dtype_t dtype, size_t first, size_t n,
                                  const float *in)
{
    switch (dtype) {
    case KVF_DTYPE_FP32:
        memcpy((float *)dst + first, in, n * sizeof(float));
        break;
    case KVF_DTYPE_BF16: {
        uint16_t *d = (uint16_t *)dst + first;
        for (size_t i = 0; i < n; ++i) {
            d[i] = kvf_hd_fp32_to_bf16(in[i]);
        }
        break;
    }
    case KVF_DTYPE_FP16: {
        uint16_t *d = (uint16_t *)dst + first;
        for (size_t i = 0; i < n; ++i) {
            d[i] = kvf_hd_fp32_to_fp16(in[i]);
        }
        break;
    }
    default:
        break;
    }
}

#endif
