/* GEMM against a triple loop: bias, strides, beta accumulate, NaN in y with beta 0; batch
 * invariance: every row of an M-row product, on any thread count and with fp32 or bf16
 * weights, has the bits of the same row alone and of the documented summation order. */
#include "kvf_act.h"
#include "kvf_act_math.h"
#include "kvf_dtype_math.h"
#include "kvf_gemm.h"
#include "kvf_gemm_math.h"
#include "kvf_gemm_narrow.h"
#include "kvf_kern_internal.h"
#include "kvf_kern_test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void ref_gemm(int M, int N, int K, const float *x, int ldx, const float *w, int ldw,
                     const float *bias, double beta, const float *y0, int ldy, double *out)
{
    for (int m = 0; m < M; ++m) {
        for (int n = 0; n < N; ++n) {
            double acc = (bias != NULL) ? bias[n] : 0.0;
            for (int k = 0; k < K; ++k) {
                acc += (double)x[m * ldx + k] * (double)w[n * ldw + k];
            }
            if (beta != 0.0) {
                acc += beta * y0[m * ldy + n];
            }
            out[m * N + n] = acc;
        }
    }
}

static void test_gemm_plain_and_bias(void **state)
{
    enum { M = 7, N = 5, K = 9 };
    kvf_test_rng_t rng = {12345};
    float x[M * K], w[N * K], b[N], y[M * N];
    double ref[M * N];
    (void)state;

    kvf_test_fill(&rng, x, M * K, -1, 1);
    kvf_test_fill(&rng, w, N * K, -1, 1);
    kvf_test_fill(&rng, b, N, -1, 1);
    for (int i = 0; i < M * N; ++i) {
        y[i] = NAN;   /* beta 0 must overwrite garbage */
    }
    assert_int_equal(kvf_gemm(NULL, M, N, K, x, w, NULL, y), KVF_KERN_OK);
    ref_gemm(M, N, K, x, K, w, K, NULL, 0, NULL, N, ref);
    kvf_test_assert_close(y, ref, M * N, 1e-5, 1e-5, "gemm");

    assert_int_equal(kvf_gemm(NULL, M, N, K, x, w, b, y), KVF_KERN_OK);
    ref_gemm(M, N, K, x, K, w, K, b, 0, NULL, N, ref);
    kvf_test_assert_close(y, ref, M * N, 1e-5, 1e-5, "gemm+bias");

    /* hand value: [1 2] . [[3 4], [5 6]]^T = [11 17] */
    {
        float hx[2] = {1, 2}, hw[4] = {3, 4, 5, 6}, hy[2];
        assert_int_equal(kvf_gemm(NULL, 1, 2, 2, hx, hw, NULL, hy), KVF_KERN_OK);
        assert_float_equal(hy[0], 11.0f, 1e-6);
        assert_float_equal(hy[1], 17.0f, 1e-6);
    }
    assert_int_equal(kvf_gemm(NULL, 0, N, K, NULL, NULL, NULL, NULL), KVF_KERN_OK);
    assert_int_equal(kvf_gemm(NULL, M, 0, K, x, w, NULL, y), KVF_KERN_EINVAL);
#ifndef KVF_HAVE_CUDA
    {   /* a build without CUDA refuses a CUDA device (with CUDA it is cuBLAS: tests/gpu) */
        kvf_device_t cuda = {KVF_DEVICE_CUDA, 0, NULL};
        assert_int_equal(kvf_gemm(&cuda, M, N, K, x, w, NULL, y), KVF_KERN_EUNSUPPORTED);
    }
#endif
}

static void test_gemm_strided_accumulate(void **state)
{
    enum { M = 6, N = 4, K = 8, LDX = 13, LDW = 11, LDY = 7 };
    kvf_test_rng_t rng = {777};
    float x[M * LDX], w[N * LDW], b[N], y[M * LDY], y0[M * LDY], got[M * N];
    double ref[M * N];
    (void)state;

    kvf_test_fill(&rng, x, M * LDX, -2, 2);
    kvf_test_fill(&rng, w, N * LDW, -2, 2);
    kvf_test_fill(&rng, b, N, -1, 1);
    kvf_test_fill(&rng, y0, M * LDY, -1, 1);
    memcpy(y, y0, sizeof(y));
    assert_int_equal(kvf_gemm_ex(NULL, M, N, K, x + 2, LDX, w, LDW, b, 1.0f, y, LDY),
                     KVF_KERN_OK);
    ref_gemm(M, N, K, x + 2, LDX, w, LDW, b, 1.0, y0, LDY, ref);
    for (int m = 0; m < M; ++m) {
        for (int n = 0; n < N; ++n) {
            got[m * N + n] = y[m * LDY + n];
        }
        /* columns past N untouched */
        for (int n = N; n < LDY; ++n) {
            assert_true(y[m * LDY + n] == y0[m * LDY + n]);
        }
    }
    kvf_test_assert_close(got, ref, M * N, 1e-5, 1e-5, "gemm_ex");
    assert_int_equal(kvf_gemm_ex(NULL, M, N, K, x, K - 1, w, LDW, NULL, 0, y, LDY),
                     KVF_KERN_EINVAL);
}

/* The order kvf_gemm.h documents, written out: lane k % 16 an FMA chain in ascending k
 * from +0, then (l + l+8), (+ l+4), (+ l+2), (+ l+1); then + bias. */
static float order_dot(int K, const float *x, const float *w, float bias)
{
    float p[16] = {0}, s8[8], s4[4];
    for (int k = 0; k < K; ++k) {
        p[k % 16] = fmaf(x[k], w[k], p[k % 16]);
    }
    for (int l = 0; l < 8; ++l) {
        s8[l] = p[l] + p[l + 8];
    }
    for (int l = 0; l < 4; ++l) {
        s4[l] = s8[l] + s8[l + 4];
    }
    return ((s4[0] + s4[2]) + (s4[1] + s4[3])) + bias;
}

static void test_gemm_rows_invariant(void **state)
{
    static const int Ks[] = {1, 15, 16, 17, 100, 256};
    static const int Ms[] = {1, 2, 3, 4, 5, 8, 13, 64};
    enum { N = 400, MMAX = 64, KMAX = 256 };   /* 256 x 400 x 64: threads split columns */
    kvf_test_rng_t rng = {777};
    float *x = malloc(sizeof(float) * (MMAX + 1) * KMAX), *w = malloc(sizeof(float) * N * KMAX);
    float *wb = malloc(sizeof(float) * N * KMAX), *y = malloc(sizeof(float) * MMAX * N);
    uint16_t *w16 = malloc(sizeof(uint16_t) * N * KMAX);
    float b[N], one[N];
    (void)state;

    assert_non_null(x);
    assert_non_null(w);
    assert_non_null(wb);
    assert_non_null(y);
    assert_non_null(w16);
    kvf_test_fill(&rng, x, (MMAX + 1) * KMAX, -1, 1);
    kvf_test_fill(&rng, w, N * KMAX, -1, 1);
    kvf_test_fill(&rng, b, N, -1, 1);
    for (int i = 0; i < N * KMAX; ++i) {       /* bf16 weights and their exact widening */
        uint32_t u;
        memcpy(&u, &w[i], sizeof(u));
        w16[i] = (uint16_t)(u >> 16);
        u = (uint32_t)w16[i] << 16;
        memcpy(&wb[i], &u, sizeof(u));
    }
    for (size_t ki = 0; ki < sizeof(Ks) / sizeof(Ks[0]); ++ki) {
        const int K = Ks[ki];
        for (size_t mi = 0; mi < sizeof(Ms) / sizeof(Ms[0]); ++mi) {
            const int M = Ms[mi];
            for (int threads = 1; threads <= 2; ++threads) {
                kvf_gemm_set_threads(threads);
                for (int bf = 0; bf < 2; ++bf) {
                    /* rows [1, 1 + M) of x: row 0 of the product is not row 0 of x */
                    assert_int_equal(kvf_gemm_w(NULL, M, N, K, x + KMAX, KMAX,
                                                bf ? (const void *)w16 : (const void *)w,
                                                bf ? KVF_DTYPE_BF16 : KVF_DTYPE_FP32, KMAX, b,
                                                y, N),
                                     KVF_KERN_OK);
                    for (int m = 0; m < M; ++m) {
                        const float *xr = x + (size_t)(1 + m) * KMAX;
                        assert_int_equal(kvf_gemm_ex(NULL, 1, N, K, xr, KMAX, bf ? wb : w, KMAX,
                                                     b, 0.0f, one, N),
                                         KVF_KERN_OK);
                        assert_memory_equal(y + (size_t)m * N, one, sizeof(one));
                        for (int n = 0; n < N; ++n) {
                            float want = order_dot(K, xr, (bf ? wb : w) + (size_t)n * KMAX, b[n]);
                            assert_memory_equal(&one[n], &want, sizeof(float));
                        }
                    }
                }
            }
        }
    }
    kvf_gemm_set_threads(1);
    free(x);
    free(w);
    free(wb);
    free(y);
    free(w16);
}

#ifdef KVF_FAULT_INJECTION
/* Every ISA path (plain C, AVX2, AVX-512, those this CPU has) gives the same bits, for the
 * GEMM and for the attention's outer-product form, whose element is one FMA chain over k
 * from beta * y (checked written out). */
static void test_gemm_isa_paths_agree(void **state)
{
    enum { M = 9, N = 75, K = 83 };
    kvf_test_rng_t rng = {99};
    float x[M * K], w[N * K], b[N], y[3][M * N], kb[K * N], z0[M * N], z[3][M * N];
    (void)state;

    kvf_test_fill(&rng, x, M * K, -1, 1);
    kvf_test_fill(&rng, w, N * K, -1, 1);
    kvf_test_fill(&rng, kb, K * N, -1, 1);
    kvf_test_fill(&rng, b, N, -1, 1);
    kvf_test_fill(&rng, z0, M * N, -1, 1);
    for (int isa = 0; isa < 3; ++isa) {
        kvf_gemm_cpu_test_isa(isa);
        assert_int_equal(kvf_gemm_ex(NULL, M, N, K, x, K, w, K, b, 0.0f, y[isa], N),
                         KVF_KERN_OK);
        memcpy(z[isa], z0, sizeof(z0));
        assert_int_equal(kvf_gemm_cpu_nn(M, N, K, 0.5f, x, K, kb, N, 1.0f, z[isa], N),
                         KVF_KERN_OK);
    }
    kvf_gemm_cpu_test_isa(2);
    assert_memory_equal(y[0], y[1], sizeof(y[0]));
    assert_memory_equal(y[0], y[2], sizeof(y[0]));
    assert_memory_equal(z[0], z[1], sizeof(z[0]));
    assert_memory_equal(z[0], z[2], sizeof(z[0]));
    for (int m = 0; m < M; ++m) {
        for (int n = 0; n < N; ++n) {
            float c = 1.0f * z0[m * N + n];
            for (int k = 0; k < K; ++k) {
                c = fmaf(x[m * K + k], kb[k * N + n], c);
            }
            c = 0.5f * c;
            assert_memory_equal(&z[0][m * N + n], &c, sizeof(c));
            assert_memory_equal(&y[0][m * N + n], &(float){order_dot(K, x + m * K, w + n * K,
                                                                      b[n])}, sizeof(float));
        }
    }
}
#endif

/* kvf_gemm_narrow's CPU reference: x rounded to W's dtype, fp32 products and sums, bias */
/* The CUDA kernel's tree (kvf_gemm_fixed_cuda.cu: lane l adds __shfl_down_sync(v, o, 16)
 * for o = 8, 4, 2, 1, i.e. lane l + o's value, or its own past the 16-lane segment) emulated
 * on 16 lanes: lane 0 ends with kvf_gemm_tree16()'s bits, the CPU's order. */
static void test_gemm_shuffle_tree_is_cpu_tree(void **state)
{
    uint32_t x = 99u;

    (void)state;
    for (int round = 0; round < 2000; ++round) {
        float p[KVF_GEMM_LANES], v[KVF_GEMM_LANES], next[KVF_GEMM_LANES];
        for (int l = 0; l < KVF_GEMM_LANES; ++l) {
            x = x * 1664525u + 1013904223u;
            /* mixed magnitudes and signs, so a different order shows in the last bits */
            p[l] = ldexpf((float)(x >> 8) / 16777216.0f - 0.5f, (int)(x % 40u) - 20);
            v[l] = p[l];
        }
        for (int o = 8; o >= 1; o /= 2) {
            for (int l = 0; l < KVF_GEMM_LANES; ++l) {
                next[l] = v[l] + ((l + o < KVF_GEMM_LANES) ? v[l + o] : v[l]);
            }
            memcpy(v, next, sizeof(v));
        }
        float want = kvf_gemm_tree16(p);
        assert_memory_equal(&v[0], &want, sizeof(float));
    }
}

static void test_gemm_narrow_reference(void **state)
{
    enum { M = 5, N = 6, K = 11, LDX = 13, LDY = 8 };
    static const kvf_dtype_t dts[2] = {KVF_DTYPE_BF16, KVF_DTYPE_FP16};
    kvf_test_rng_t rng = {777};
    float x[M * LDX], xr[M * K], wf[N * K], b[N], y[M * LDY], yc[M * N];
    uint16_t w[N * K], xs[M * K];
    double ref[M * N];
    (void)state;

    for (int d = 0; d < 2; ++d) {
        kvf_test_fill(&rng, x, M * LDX, -3, 3);
        kvf_test_fill(&rng, wf, N * K, -1, 1);
        kvf_test_fill(&rng, b, N, -1, 1);
        for (int i = 0; i < N * K; ++i) {
            wf[i] = kvf_test_quant(dts[d], wf[i]);
            w[i] = (dts[d] == KVF_DTYPE_BF16) ? kvf_fp32_to_bf16(wf[i]) : kvf_fp32_to_fp16(wf[i]);
        }
        for (int m = 0; m < M; ++m) {
            for (int k = 0; k < K; ++k) {
                xr[m * K + k] = kvf_test_quant(dts[d], x[m * LDX + k]);
            }
        }
        for (int i = 0; i < M * LDY; ++i) {
            y[i] = NAN;
        }
        assert_int_equal(kvf_gemm_narrow(NULL, M, N, K, x, LDX, w, dts[d], K, b, y, LDY, xs),
                         KVF_KERN_OK);
        ref_gemm(M, N, K, xr, K, wf, K, b, 0, NULL, N, ref);
        for (int m = 0; m < M; ++m) {
            memcpy(yc + m * N, y + m * LDY, N * sizeof(float));
            assert_true(isnan(y[m * LDY + N]));   /* past N: untouched */
        }
        kvf_test_assert_close(yc, ref, M * N, 1e-5, 1e-5, "gemm_narrow");
    }
    /* refusals: fp32 or fp8 weights, no scratch, small strides; M = 0 is a no-op */
    assert_int_equal(kvf_gemm_narrow(NULL, M, N, K, x, LDX, w, KVF_DTYPE_FP32, K, b, y, LDY, xs),
                     KVF_KERN_EINVAL);
    assert_int_equal(kvf_gemm_narrow(NULL, M, N, K, x, LDX, w, KVF_DTYPE_FP8, K, b, y, LDY, xs),
                     KVF_KERN_EINVAL);
    assert_int_equal(kvf_gemm_narrow(NULL, M, N, K, x, LDX, w, KVF_DTYPE_BF16, K, b, y, LDY,
                                     NULL), KVF_KERN_EINVAL);
    assert_int_equal(kvf_gemm_narrow(NULL, M, N, K, x, K - 1, w, KVF_DTYPE_BF16, K, b, y, LDY,
                                     xs), KVF_KERN_EINVAL);
    assert_int_equal(kvf_gemm_narrow(NULL, 0, N, K, NULL, LDX, NULL, KVF_DTYPE_BF16, K, NULL,
                                     NULL, LDY, NULL), KVF_KERN_OK);
#ifndef KVF_HAVE_CUDA
    {
        kvf_device_t cuda = {KVF_DEVICE_CUDA, 0, NULL};
        assert_int_equal(kvf_gemm_narrow(&cuda, M, N, K, x, LDX, w, KVF_DTYPE_BF16, K, b, y,
                                         LDY, xs), KVF_KERN_EUNSUPPORTED);
    }
#endif
}

/*
 * kvf_gemm_w_act: y = act(x * W^T + bias) with y's bits those of kvf_gemm_w then kvf_act on
 * its rows, for fp32 and bf16 W, strided y (the columns past N untouched), every activation;
 * an unknown activation refused before anything is written.
 */
static void test_gemm_w_act(void **state)
{
    enum { M = 5, N = 33, K = 70, LDY = 40 };
    kvf_test_rng_t r = {0xac7u};
    float x[M * K], w[N * K], b[N], y1[M * LDY], y2[M * LDY];
    uint16_t wb[N * K];
    (void)state;

    kvf_test_fill(&r, x, M * K, -2.0f, 2.0f);
    kvf_test_fill(&r, w, N * K, -1.0f, 1.0f);
    kvf_test_fill(&r, b, N, -1.0f, 1.0f);
    for (size_t i = 0; i < N * K; ++i) {
        wb[i] = kvf_hd_fp32_to_bf16(w[i]);
    }
    for (int bf = 0; bf < 2; ++bf) {
        const void *wp = bf ? (const void *)wb : (const void *)w;
        const kvf_dtype_t dt = bf ? KVF_DTYPE_BF16 : KVF_DTYPE_FP32;
        for (int act = 0; act < KVF_KACT_COUNT; ++act) {
            for (size_t i = 0; i < M * LDY; ++i) {
                y1[i] = y2[i] = -7.0f;   /* the gap past N must stay */
            }
            assert_int_equal(kvf_gemm_w_act(NULL, M, N, K, x, K, wp, dt, K, b, act, y1, LDY),
                             KVF_KERN_OK);
            assert_int_equal(kvf_gemm_w(NULL, M, N, K, x, K, wp, dt, K, b, y2, LDY),
                             KVF_KERN_OK);
            for (int m = 0; m < M; ++m) {
                assert_int_equal(kvf_act(NULL, act, y2 + m * LDY, N), KVF_KERN_OK);
            }
            assert_memory_equal(y1, y2, sizeof(y1));
        }
    }
    y1[0] = 3.0f;
    assert_int_equal(kvf_gemm_w_act(NULL, M, N, K, x, K, w, KVF_DTYPE_FP32, K, b, KVF_KACT_COUNT,
                                    y1, LDY), KVF_KERN_EINVAL);
    assert_int_equal(kvf_gemm_w_act(NULL, M, N, K, x, K, w, KVF_DTYPE_FP32, K, b, -1, y1, LDY),
                     KVF_KERN_EINVAL);
    assert_true(y1[0] == 3.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_plain_and_bias),
        cmocka_unit_test(test_gemm_strided_accumulate),
        cmocka_unit_test(test_gemm_rows_invariant),
#ifdef KVF_FAULT_INJECTION
        cmocka_unit_test(test_gemm_isa_paths_agree),
#endif
        cmocka_unit_test(test_gemm_shuffle_tree_is_cpu_tree),
        cmocka_unit_test(test_gemm_narrow_reference),
        cmocka_unit_test(test_gemm_w_act),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
