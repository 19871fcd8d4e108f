/*
 * The CPU product of the attention's tiles: y = alpha * (beta * y + x B)
 * with B stored k-major ([K][N], as V is, and K once transposed), every
 * element ONE FMA chain over k in ascending order (kvf_kern_internal.h,
 * kvf_gemm_cpu_nn). A row's bits depend on its own x row, B and y alone:
 * never on how many rows the call has, the row's place, or the ISA path.
 *
 * Design: the outer-product form. Registers hold 16 consecutive columns of
 * an output row; per k one x value is broadcast and multiplied into B's row
 * k, so no horizontal sum is needed: with head_dim or tile widths of 64 the
 * reduction length is short, and kvf_gemm_cpu's 16-lane dot would spend
 * more on its final tree than on the products. Tiles of 4 rows x 64 columns
 * (16 chains in flight), then 1 row, then 16-column and masked (AVX-512) or
 * scalar (AVX2) tails; each lane is an independent chain, so the vector
 * width never changes a result, and a scalar fmaf() chain gives the same
 * bits on any CPU.
 * Rejected: the 16-lane dot (kvf_gemm_cpu) for these products: 2-3x the
 * instructions per element at reduction length 64.
 */
#include "kvf_kern_internal.h"

#include <math.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KVF_NN_X86 1
#include <immintrin.h>
#endif

typedef struct kvf_nn_job {
    int          M, N, K;
    float        alpha, beta;
    const float *x, *b;
    size_t       ldx, ldb, ldy;
    float       *y;
} kvf_nn_job_t;

/* Columns [n0, n1) of row m, one scalar chain each. */
static void kvf_nn_row_ref(const kvf_nn_job_t *j, int m, int n0, int n1)
{
    const float *xr = j->x + (size_t)m * j->ldx;
    float *yr = j->y + (size_t)m * j->ldy;
    for (int n = n0; n < n1; ++n) {
        float acc = (j->beta != 0.0f) ? j->beta * yr[n] : 0.0f;
        for (int k = 0; k < j->K; ++k) {
            acc = fmaf(xr[k], j->b[(size_t)k * j->ldb + (size_t)n], acc);
        }
        yr[n] = (j->alpha != 1.0f) ? j->alpha * acc : acc;
    }
}

static void kvf_nn_ref(const kvf_nn_job_t *j)
{
    for (int m = 0; m < j->M; ++m) {
        kvf_nn_row_ref(j, m, 0, j->N);
    }
}

#ifdef KVF_NN_X86
#pragma GCC push_options
#pragma GCC target("avx512f,fma")

/* MR rows x NV vectors of 16 columns from column n; the last vector masked by lm. */
static inline __attribute__((always_inline)) void
kvf_nn512_tile(const kvf_nn_job_t *j, int m, int n, int MR, int NV, __mmask16 lm)
{
    __m512 acc[4][4];
    const __m512 beta = _mm512_set1_ps(j->beta), alpha = _mm512_set1_ps(j->alpha);

#pragma GCC unroll 4
    for (int a = 0; a < MR; ++a) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            const __mmask16 mk = (v == NV - 1) ? lm : (__mmask16)0xffff;
            float *yp = j->y + (size_t)(m + a) * j->ldy + (size_t)n + 16 * (size_t)v;
            acc[a][v] = (j->beta != 0.0f) ?
                        _mm512_mul_ps(beta, _mm512_maskz_loadu_ps(mk, yp)) : _mm512_setzero_ps();
        }
    }
    for (int k = 0; k < j->K; ++k) {
        const float *br = j->b + (size_t)k * j->ldb + (size_t)n;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            bv[v] = _mm512_maskz_loadu_ps((v == NV - 1) ? lm : (__mmask16)0xffff, br + 16 * v);
        }
#pragma GCC unroll 4
        for (int a = 0; a < MR; ++a) {
            const __m512 xv = _mm512_set1_ps(j->x[(size_t)(m + a) * j->ldx + (size_t)k]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
                acc[a][v] = _mm512_fmadd_ps(xv, bv[v], acc[a][v]);
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < MR; ++a) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            float *yp = j->y + (size_t)(m + a) * j->ldy + (size_t)n + 16 * (size_t)v;
            const __m512 r = (j->alpha != 1.0f) ? _mm512_mul_ps(alpha, acc[a][v]) : acc[a][v];
            _mm512_mask_storeu_ps(yp, (v == NV - 1) ? lm : (__mmask16)0xffff, r);
        }
    }
}

static void kvf_nn512(const kvf_nn_job_t *j)
{
    int m = 0;
    for (; m < j->M; m += 4) {
        const int four = (j->M - m >= 4);
        int n = 0;
        for (; n + 64 <= j->N; n += 64) {
            if (four) {
                kvf_nn512_tile(j, m, n, 4, 4, 0xffff);
            } else {
                for (int a = m; a < j->M; ++a) {
                    kvf_nn512_tile(j, a, n, 1, 4, 0xffff);
                }
            }
        }
        for (; n < j->N; n += 16) {
            const int left = j->N - n;
            const __mmask16 lm = (left >= 16) ? (__mmask16)0xffff :
                                 (__mmask16)((1u << left) - 1u);
            if (four) {
                kvf_nn512_tile(j, m, n, 4, 1, lm);
            } else {
                for (int a = m; a < j->M; ++a) {
                    kvf_nn512_tile(j, a, n, 1, 1, lm);
                }
            }
        }
    }
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")

/* MR rows x NV vectors of 8 columns from column n (no masks: tails go scalar). */
static inline __attribute__((always_inline)) void
kvf_nn256_tile(const kvf_nn_job_t *j, int m, int n, int MR, int NV)
{
    __m256 acc[4][2];
    const __m256 beta = _mm256_set1_ps(j->beta), alpha = _mm256_set1_ps(j->alpha);

#pragma GCC unroll 4
    for (int a = 0; a < MR; ++a) {
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) {
            float *yp = j->y + (size_t)(m + a) * j->ldy + (size_t)n + 8 * (size_t)v;
            acc[a][v] = (j->beta != 0.0f) ? _mm256_mul_ps(beta, _mm256_loadu_ps(yp)) :
                                            _mm256_setzero_ps();
        }
    }
    for (int k = 0; k < j->K; ++k) {
        const float *br = j->b + (size_t)k * j->ldb + (size_t)n;
        __m256 bv[2];
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) {
            bv[v] = _mm256_loadu_ps(br + 8 * v);
        }
#pragma GCC unroll 4
        for (int a = 0; a < MR; ++a) {
            const __m256 xv = _mm256_set1_ps(j->x[(size_t)(m + a) * j->ldx + (size_t)k]);
#pragma GCC unroll 2
            for (int v = 0; v < NV; ++v) {
                acc[a][v] = _mm256_fmadd_ps(xv, bv[v], acc[a][v]);
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < MR; ++a) {
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) {
            float *yp = j->y + (size_t)(m + a) * j->ldy + (size_t)n + 8 * (size_t)v;
            _mm256_storeu_ps(yp, (j->alpha != 1.0f) ? _mm256_mul_ps(alpha, acc[a][v]) :
                                                      acc[a][v]);
        }
    }
}

static void kvf_nn256(const kvf_nn_job_t *j)
{
    const int nfull = j->N & ~15;
    int m = 0;
    for (; m + 4 <= j->M; m += 4) {
        for (int n = 0; n < nfull; n += 16) {
            kvf_nn256_tile(j, m, n, 4, 2);
        }
    }
    for (; m < j->M; ++m) {
        for (int n = 0; n < nfull; n += 16) {
            kvf_nn256_tile(j, m, n, 1, 2);
        }
    }
    for (m = 0; m < j->M; ++m) {
        kvf_nn_row_ref(j, m, nfull, j->N);
    }
}
#pragma GCC pop_options
#endif /* KVF_NN_X86 */

int kvf_gemm_cpu_nn(int M, int N, int K, float alpha, const float *x, size_t ldx,
                    const float *b, size_t ldb, float beta, float *y, size_t ldy)
{
    static void (*fn)(const kvf_nn_job_t *j);
    kvf_nn_job_t j;

    if ((M < 0) || (N <= 0) || (K < 0) || (ldx < (size_t)K) || (ldb < (size_t)N) ||
        (ldy < (size_t)N)) {
        return KVF_KERN_EINVAL;
    }
    if (M == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || ((b == NULL) && (K > 0)) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    void (*call)(const kvf_nn_job_t *j) = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
#ifdef KVF_FAULT_INJECTION
    const int cap = kvf_gemm_cpu_isa_cap();   /* a test may change it between calls */
    call = NULL;
#else
    const int cap = 2;
#endif
    if (call == NULL) {
        call = kvf_nn_ref;
#ifdef KVF_NN_X86
        if ((cap >= 2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) {
            call = kvf_nn512;
        } else if ((cap >= 1) && __builtin_cpu_supports("avx2") &&
                   __builtin_cpu_supports("fma")) {
            call = kvf_nn256;
        }
#endif
        (void)cap;
        __atomic_store_n(&fn, call, __ATOMIC_RELEASE);
    }
    j = (kvf_nn_job_t){.M = M, .N = N, .K = K, .alpha = alpha, .beta = beta, .x = x, .b = b,
                       .ldx = ldx, .ldb = ldb, .ldy = ldy, .y = y};
    call(&j);
    return KVF_KERN_OK;
}
