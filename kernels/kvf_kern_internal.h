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
#include "kvf_gdn.h"

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
 * the others on the process's kernel workers (kvf_kern_pool.c: started on
 * first use, kept; the call returns when every part is done). A part without
 * a worker (one failed to start), or every part when another thread's job
 * has the workers, runs on the caller: the parts must give the same result
 * whoever runs them. parts is clamped to [1, 64]. @return the first failing
 * part's code, else KVF_KERN_OK.
 */
int kvf_kern_parallel(int parts, kvf_kern_par_fn_t fn, void *ctx);

/**
 * The CPU GEMM (kvf_gemm_cpu.c): y[m][n] = alpha * dot(x[m], W[n]) + (beta * y[m][n] +
 * bias[n]) for m < M, n < N, x fp32 [M][ldx], W [N][ldw] fp32 or bf16 (widened exactly),
 * y fp32 [M][ldy]; beta = 0 never reads y; bias may be NULL (0), alpha 1 multiplies
 * nothing. Every dot of K terms is summed in ONE fixed order: lane l = k mod 16 holds the
 * FMA chain of its terms in ascending k from +0, then the 16 lanes are added as the tree
 * (l + l+8), (+ l+4), (+ l+2), (+ l+1). So an element's bits depend on x[m], W[n], K,
 * alpha, beta, y and bias alone: never on M, N, the element's place, the ISA path taken or
 * @a threads (>= 1: column blocks over that many threads, for products worth it).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL for bad sizes, strides, dtype or NULL pointers
 *         (M = 0 is a no-op).
 */
int kvf_gemm_cpu(int M, int N, int K, float alpha, const float *x, size_t ldx, const void *w,
                 kvf_dtype_t w_dtype, size_t ldw, const float *bias, float beta, float *y,
                 size_t ldy, int threads);

/**
 * The attention's tile product (kvf_gemm_nn.c): y[m][n] = alpha * c_K for m < M, n < N,
 * c_0 = beta * y[m][n] (+0 when beta = 0: y not read), c_{k+1} = fma(x[m][k], b[k][n], c_k),
 * k ascending; x fp32 [M][ldx], b fp32 k-major [K][ldb], y [M][ldy]; alpha 1 multiplies
 * nothing. One FMA chain per element: its bits depend on x[m], b, y[m][n], K, alpha and
 * beta alone, never on M, N, the element's place or the ISA path (one thread).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL for bad sizes, strides or NULL pointers.
 */
int kvf_gemm_cpu_nn(int M, int N, int K, float alpha, const float *x, size_t ldx,
                    const float *b, size_t ldb, float beta, float *y, size_t ldy);

/**
 * Whether kvf_gdn_scan()'s arguments (kvf_gdn.h) are bad: sizes, strides, NULL pointers,
 * the state dtype (kvf_gdn.c; the chunked scan checks the same). T = 0 checks only @a p,
 * @a state and the dtype.
 */
bool kvf_gdn_args_bad(const kvf_gdn_params_t *p, int T, const float *xbc, int ldx,
                      const float *ba, int ldba, const void *state, kvf_dtype_t state_dtype,
                      const float *y, int ldy);

#ifdef KVF_FAULT_INJECTION
/**
 * TEST ONLY (fault-injection builds): the widest ISA path kvf_gemm_cpu() and
 * kvf_gemm_cpu_nn() may take from now on: 0 plain C, 1 AVX2, 2 AVX-512 (the default;
 * still only where the CPU has it), so a test can check that every path gives the
 * same bits. Not thread-safe against running products.
 */
void kvf_gemm_cpu_test_isa(int max_isa);
int kvf_gemm_cpu_isa_cap(void);
#endif

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

/**
 * v[i] = v[i] stored as @a dtype and loaded back (kvf_kern_store's rounding), i < n: what a
 * value kept in a narrow cache reads as. fp32 (or a dtype kvf_kern_store does not write)
 * leaves v unchanged. The rounding is kvf_hd_round (kvf_dtype_math.h), the body the CUDA
 * conv chunk and scan call; the dtype is picked outside the loop so it vectorises.
 */
static inline void kvf_kern_round(float *v, size_t n, kvf_dtype_t dtype)
{
    if (dtype == KVF_DTYPE_BF16) {
        for (size_t i = 0; i < n; ++i) {
            v[i] = kvf_hd_round(v[i], KVF_HD_BF16);
        }
    } else if (dtype == KVF_DTYPE_FP16) {
        for (size_t i = 0; i < n; ++i) {
            v[i] = kvf_hd_round(v[i], KVF_HD_FP16);
        }
    }
}

#endif
