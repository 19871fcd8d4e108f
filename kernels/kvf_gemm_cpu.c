/*
 * The CPU GEMM: y = alpha * x W^T + c with every output element summed in
 * one fixed order (kvf_kern_internal.h, kvf_gemm_cpu), so a row's result
 * does not depend on how many rows the call has, where the row sits, how
 * the work is tiled or on how many threads: the batch invariance of
 * common/engine/README.md ("Batch invariance") rests on it.
 *
 * Design: each dot product of K terms is 16 lanes, lane l the FMA chain of
 * the terms k = l, l + 16, ... in ascending k from +0, then the lanes added
 * as a fixed tree (l + l+8, + l+4, + l+2, + l+1). That is one AVX-512
 * register or two AVX2 registers per dot, or a 16-float array with fmaf():
 * every path gives the same bits (FMA rounds once everywhere), so the ISA
 * picked at run time changes the speed, never the result. The K tail is
 * padded with zeros (fma(0, 0, acc) = acc). Register tiles of 4 rows x 4
 * columns (16 dots in flight: enough independent FMA chains to hide their
 * latency) over whole K; rows left over (and one-row decode products) go 1
 * row x 8 columns; a tile's missing columns repeat a real one and are
 * dropped, so they never change a kept result. bf16 weights are widened in
 * the register (a shift), never into a buffer. Columns are blocked so a
 * block of W stays in L2 while every row passes it; threads take whole
 * column blocks.
 * Rejected: OpenBLAS's sgemm. Its per-row result depends on M (different
 * kernels and small-matrix paths for different row counts: measured on
 * this tree's host, OpenBLAS 0.3.21, 256x256 weights, rows of an M >= 4
 * product differ from the same rows at M = 1 in up to 90 % of the elements
 * by up to 3.6e-6), and a bf16 cache rounding turns such an ulp into 2^-8.
 */
#include "kvf_gemm_math.h"
#include "kvf_kern_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KVF_GEMM_X86 1
#include <immintrin.h>
#endif

/* ---- the reference definition (any CPU): 16 lanes in a float array -------- */

static float kvf_gemm_dot_ref(size_t K, const float *x, const void *w, int wbf, size_t w0)
{
    float p[KVF_GEMM_LANES] = {0};
    for (size_t k = 0; k < K; ++k) {
        p[k % KVF_GEMM_LANES] = fmaf(x[k], kvf_gemm_w_at(w, wbf, w0 + k), p[k % KVF_GEMM_LANES]);
    }
    return kvf_gemm_tree16(p);
}

/* ---- what every path does with the dots -------------------------------------- */

typedef struct kvf_gemm_job {
    int          M, N;
    size_t       K, ldx, ldw, ldy;
    float        alpha, beta;
    const float *x, *bias;
    const void  *w;
    int          wbf;
    float       *y;
    int          nb;     /* columns per block */
} kvf_gemm_job_t;

/* y[m][n] = alpha * dot + (beta * y + bias), the parenthesis first (kvf_gemm_math.h). */
static inline void kvf_gemm_put(const kvf_gemm_job_t *j, int m, int n, float dot)
{
    float *yp = j->y + (size_t)m * j->ldy + (size_t)n;
    *yp = kvf_gemm_out(dot, j->alpha, j->beta, (j->beta != 0.0f) ? *yp : 0.0f,
                       (j->bias != NULL) ? j->bias + n : NULL);
}

static void kvf_gemm_block_ref(const kvf_gemm_job_t *j, int n0, int n1)
{
    for (int m = 0; m < j->M; ++m) {
        for (int n = n0; n < n1; ++n) {
            kvf_gemm_put(j, m, n, kvf_gemm_dot_ref(j->K, j->x + (size_t)m * j->ldx, j->w, j->wbf,
                                                   (size_t)n * j->ldw));
        }
    }
}

#ifdef KVF_GEMM_X86
/* ---- AVX-512: one register per dot ------------------------------------------ */
#pragma GCC push_options
#pragma GCC target("avx512f,fma")

static inline __m512 kvf_g512_w(const void *w, int wbf, size_t i)
{
    if (wbf) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float *)w + i);
}

static inline float kvf_g512_tree(__m512 a)
{
    __m256 lo = _mm512_castps512_ps256(a);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* The K tail (kr < 16 terms) as zero-padded registers. */
static inline __m512 kvf_g512_xtail(const float *x, size_t kr)
{
    float t[KVF_GEMM_LANES] = {0};
    memcpy(t, x, kr * sizeof(float));
    return _mm512_loadu_ps(t);
}

static inline __m512 kvf_g512_wtail(const void *w, int wbf, size_t i, size_t kr)
{
    float t[KVF_GEMM_LANES] = {0};
    for (size_t k = 0; k < kr; ++k) {
        t[k] = kvf_gemm_w_at(w, wbf, i + k);
    }
    return _mm512_loadu_ps(t);
}

/* 4 rows x 4 columns; xr/wc: row and column starts (a missing one repeats a real one). */
static inline __attribute__((always_inline)) void
kvf_g512_4x4(size_t K, const float *const xr[4], const void *w, int wbf, const size_t wc[4],
             float d[4][4])
{
    __m512 acc[4][4];
    size_t k = 0;

#pragma GCC unroll 4
    for (int a = 0; a < 4; ++a) {
#pragma GCC unroll 4
        for (int b = 0; b < 4; ++b) {
            acc[a][b] = _mm512_setzero_ps();
        }
    }
    for (; k + KVF_GEMM_LANES <= K; k += KVF_GEMM_LANES) {
        __m512 xv[4], wv[4];
#pragma GCC unroll 4
        for (int a = 0; a < 4; ++a) {
            xv[a] = _mm512_loadu_ps(xr[a] + k);
            wv[a] = kvf_g512_w(w, wbf, wc[a] + k);
        }
#pragma GCC unroll 4
        for (int a = 0; a < 4; ++a) {
#pragma GCC unroll 4
            for (int b = 0; b < 4; ++b) {
                acc[a][b] = _mm512_fmadd_ps(xv[a], wv[b], acc[a][b]);
            }
        }
    }
    if (k < K) {
        __m512 xv[4], wv[4];
        for (int a = 0; a < 4; ++a) {
            xv[a] = kvf_g512_xtail(xr[a] + k, K - k);
            wv[a] = kvf_g512_wtail(w, wbf, wc[a] + k, K - k);
        }
#pragma GCC unroll 4
        for (int a = 0; a < 4; ++a) {
#pragma GCC unroll 4
            for (int b = 0; b < 4; ++b) {
                acc[a][b] = _mm512_fmadd_ps(xv[a], wv[b], acc[a][b]);
            }
        }
    }
    for (int a = 0; a < 4; ++a) {
        for (int b = 0; b < 4; ++b) {
            d[a][b] = kvf_g512_tree(acc[a][b]);
        }
    }
}

/* 1 row x 8 columns. */
static inline __attribute__((always_inline)) void
kvf_g512_1x8(size_t K, const float *xr, const void *w, int wbf, const size_t wc[8], float d[8])
{
    __m512 acc[8];
    size_t k = 0;

#pragma GCC unroll 8
    for (int b = 0; b < 8; ++b) {
        acc[b] = _mm512_setzero_ps();
    }
    for (; k + KVF_GEMM_LANES <= K; k += KVF_GEMM_LANES) {
        const __m512 xv = _mm512_loadu_ps(xr + k);
#pragma GCC unroll 8
        for (int b = 0; b < 8; ++b) {
            acc[b] = _mm512_fmadd_ps(xv, kvf_g512_w(w, wbf, wc[b] + k), acc[b]);
        }
    }
    if (k < K) {
        const __m512 xv = kvf_g512_xtail(xr + k, K - k);
        for (int b = 0; b < 8; ++b) {
            acc[b] = _mm512_fmadd_ps(xv, kvf_g512_wtail(w, wbf, wc[b] + k, K - k), acc[b]);
        }
    }
    for (int b = 0; b < 8; ++b) {
        d[b] = kvf_g512_tree(acc[b]);
    }
}

#define KVF_GEMM_ISA 512
#include "kvf_gemm_cpu_block.h"
#undef KVF_GEMM_ISA
#pragma GCC pop_options

/* ---- AVX2: two registers per dot (lanes 0-7, 8-15) ------------------------- */
#pragma GCC push_options
#pragma GCC target("avx2,fma")

typedef struct {
    __m256 lo, hi;
} kvf_v2_t;

static inline kvf_v2_t kvf_g256_zero(void)
{
    return (kvf_v2_t){_mm256_setzero_ps(), _mm256_setzero_ps()};
}

static inline __m256 kvf_g256_w8(const void *w, int wbf, size_t i)
{
    if (wbf) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)w + i);
}

static inline kvf_v2_t kvf_g256_w(const void *w, int wbf, size_t i)
{
    return (kvf_v2_t){kvf_g256_w8(w, wbf, i), kvf_g256_w8(w, wbf, i + 8)};
}

static inline kvf_v2_t kvf_g256_x(const float *x)
{
    return (kvf_v2_t){_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)};
}

static inline kvf_v2_t kvf_g256_fma(kvf_v2_t a, kvf_v2_t b, kvf_v2_t c)
{
    return (kvf_v2_t){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}

static inline float kvf_g256_tree(kvf_v2_t a)
{
    __m256 s8 = _mm256_add_ps(a.lo, a.hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

static inline kvf_v2_t kvf_g256_xtail(const float *x, size_t kr)
{
    float t[KVF_GEMM_LANES] = {0};
    memcpy(t, x, kr * sizeof(float));
    return kvf_g256_x(t);
}

static inline kvf_v2_t kvf_g256_wtail(const void *w, int wbf, size_t i, size_t kr)
{
    float t[KVF_GEMM_LANES] = {0};
    for (size_t k = 0; k < kr; ++k) {
        t[k] = kvf_gemm_w_at(w, wbf, i + k);
    }
    return kvf_g256_x(t);
}

/* 16 registers hold 2 x 4 dots; AVX2 tiles are 2 rows x 4 columns. */
static inline __attribute__((always_inline)) void
kvf_g256_4x4(size_t K, const float *const xr[4], const void *w, int wbf, const size_t wc[4],
             float d[4][4])
{
    for (int half = 0; half < 2; ++half) {
        kvf_v2_t acc[2][4];
        size_t k = 0;
#pragma GCC unroll 2
        for (int a = 0; a < 2; ++a) {
#pragma GCC unroll 4
            for (int b = 0; b < 4; ++b) {
                acc[a][b] = kvf_g256_zero();
            }
        }
        for (; k + KVF_GEMM_LANES <= K; k += KVF_GEMM_LANES) {
            kvf_v2_t xv[2];
#pragma GCC unroll 2
            for (int a = 0; a < 2; ++a) {
                xv[a] = kvf_g256_x(xr[2 * half + a] + k);
            }
#pragma GCC unroll 4
            for (int b = 0; b < 4; ++b) {
                const kvf_v2_t wv = kvf_g256_w(w, wbf, wc[b] + k);
#pragma GCC unroll 2
                for (int a = 0; a < 2; ++a) {
                    acc[a][b] = kvf_g256_fma(xv[a], wv, acc[a][b]);
                }
            }
        }
        if (k < K) {
            for (int b = 0; b < 4; ++b) {
                const kvf_v2_t wv = kvf_g256_wtail(w, wbf, wc[b] + k, K - k);
                for (int a = 0; a < 2; ++a) {
                    acc[a][b] = kvf_g256_fma(kvf_g256_xtail(xr[2 * half + a] + k, K - k), wv,
                                             acc[a][b]);
                }
            }
        }
        for (int a = 0; a < 2; ++a) {
            for (int b = 0; b < 4; ++b) {
                d[2 * half + a][b] = kvf_g256_tree(acc[a][b]);
            }
        }
    }
}

static inline __attribute__((always_inline)) void
kvf_g256_1x8(size_t K, const float *xr, const void *w, int wbf, const size_t wc[8], float d[8])
{
    for (int half = 0; half < 2; ++half) {
        kvf_v2_t acc[4];
        size_t k = 0;
#pragma GCC unroll 4
        for (int b = 0; b < 4; ++b) {
            acc[b] = kvf_g256_zero();
        }
        for (; k + KVF_GEMM_LANES <= K; k += KVF_GEMM_LANES) {
            const kvf_v2_t xv = kvf_g256_x(xr + k);
#pragma GCC unroll 4
            for (int b = 0; b < 4; ++b) {
                acc[b] = kvf_g256_fma(xv, kvf_g256_w(w, wbf, wc[4 * half + b] + k), acc[b]);
            }
        }
        if (k < K) {
            const kvf_v2_t xv = kvf_g256_xtail(xr + k, K - k);
            for (int b = 0; b < 4; ++b) {
                acc[b] = kvf_g256_fma(xv, kvf_g256_wtail(w, wbf, wc[4 * half + b] + k, K - k),
                                      acc[b]);
            }
        }
        for (int b = 0; b < 4; ++b) {
            d[4 * half + b] = kvf_g256_tree(acc[b]);
        }
    }
}

#define KVF_GEMM_ISA 256
#include "kvf_gemm_cpu_block.h"
#undef KVF_GEMM_ISA
#pragma GCC pop_options
#endif /* KVF_GEMM_X86 */

/* ---- driver ------------------------------------------------------------------- */

typedef void (*kvf_gemm_block_fn_t)(const kvf_gemm_job_t *j, int n0, int n1);

#ifdef KVF_FAULT_INJECTION
static int kvf_gemm_isa_cap = 2;

void kvf_gemm_cpu_test_isa(int max_isa)
{
    __atomic_store_n(&kvf_gemm_isa_cap, max_isa, __ATOMIC_RELEASE);
}

int kvf_gemm_cpu_isa_cap(void)
{
    return __atomic_load_n(&kvf_gemm_isa_cap, __ATOMIC_ACQUIRE);
}
#define KVF_GEMM_CAP() kvf_gemm_cpu_isa_cap()
#else
#define KVF_GEMM_CAP() 2
#endif

static kvf_gemm_block_fn_t kvf_gemm_pick(void)
{
#ifdef KVF_GEMM_X86
    if ((KVF_GEMM_CAP() >= 2) && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("fma")) {
        return kvf_gemm_block_512;
    }
    if ((KVF_GEMM_CAP() >= 1) && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma")) {
        return kvf_gemm_block_256;
    }
#endif
    return kvf_gemm_block_ref;
}

typedef struct kvf_gemm_par {
    const kvf_gemm_job_t *j;
    kvf_gemm_block_fn_t   fn;
} kvf_gemm_par_t;

static int kvf_gemm_part(void *ctx, int part, int parts)
{
    const kvf_gemm_par_t *p = ctx;
    const int nb = p->j->nb;
    for (int n0 = part * nb; n0 < p->j->N; n0 += parts * nb) {
        p->fn(p->j, n0, (p->j->N - n0 < nb) ? p->j->N : n0 + nb);
    }
    return KVF_KERN_OK;
}

int kvf_gemm_cpu(int M, int N, int K, float alpha, const float *x, size_t ldx, const void *w,
                 kvf_dtype_t w_dtype, size_t ldw, const float *bias, float beta, float *y,
                 size_t ldy, int threads)
{
    static kvf_gemm_block_fn_t fn;   /* the same on every call: a CPU's features are fixed */
    kvf_gemm_block_fn_t call;
    const size_t wsize = (w_dtype == KVF_DTYPE_BF16) ? 2 : 4;
    kvf_gemm_job_t j;
    kvf_gemm_par_t par;
    size_t nb;
    int blocks, parts;

    if ((M < 0) || (N <= 0) || (K <= 0) || (ldx < (size_t)K) || (ldw < (size_t)K) ||
        (ldy < (size_t)N) || ((w_dtype != KVF_DTYPE_FP32) && (w_dtype != KVF_DTYPE_BF16))) {
        return KVF_KERN_EINVAL;
    }
    if (M == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (w == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    call = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
#ifdef KVF_FAULT_INJECTION
    call = NULL;   /* re-picked on every call: a test may change the ISA cap */
#endif
    if (call == NULL) {
        call = kvf_gemm_pick();
        __atomic_store_n(&fn, call, __ATOMIC_RELEASE);
    }
    /* a column block of W of about 192 KiB (in L2 while all rows pass), 8 columns at least */
    nb = ((size_t)192 * 1024 / ((size_t)K * wsize)) & ~(size_t)7;
    nb = (nb < 8) ? 8 : nb;
    j = (kvf_gemm_job_t){.M = M, .N = N, .K = (size_t)K, .ldx = ldx, .ldw = ldw, .ldy = ldy,
                         .alpha = alpha, .beta = beta, .x = x, .bias = bias, .w = w,
                         .wbf = (w_dtype == KVF_DTYPE_BF16), .y = y,
                         .nb = (nb > (size_t)N) ? N : (int)nb};
    par = (kvf_gemm_par_t){.j = &j, .fn = call};
    blocks = (N + j.nb - 1) / j.nb;
    /* threads only for products worth waking a worker (2^18 multiply-adds: a one-row
     * product of a 512 x 512 matrix; kvf_kern_pool.c) */
    parts = ((double)M * (double)N * (double)K >= (double)(1 << 18)) ? threads : 1;
    parts = (parts > blocks) ? blocks : (parts < 1) ? 1 : parts;
    return (parts > 1) ? kvf_kern_parallel(parts, kvf_gemm_part, &par)
                       : kvf_gemm_part(&par, 0, 1);
}
