/* GEMM against a triple loop: bias, strides, beta accumulate, NaN in y with beta 0; the
 * 16-bit-weight reference (kvf_gemm_narrow) against the same loop on rounded x. */
#include "kvf_gemm.h"
#include "kvf_gemm_narrow.h"
#include "kvf_kern_test.h"

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

/* kvf_gemm_narrow's CPU reference: x rounded to W's dtype, fp32 products and sums, bias */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_plain_and_bias),
        cmocka_unit_test(test_gemm_strided_accumulate),
        cmocka_unit_test(test_gemm_narrow_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
