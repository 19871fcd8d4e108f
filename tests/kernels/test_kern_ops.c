/*
 * kernels/kvf_ops.h on the CPU against references written here (the loops
 * the model forward had before it called these ops), bit for bit; the
 * argument checks; and a CUDA device refused or run as the build allows
 * (no GPU here: a CUDA device value without CUDA built in is
 * KVF_KERN_EUNSUPPORTED).
 */
#include "kvf_act.h"
#include "kvf_dtype_math.h"
#include "kvf_kern_test.h"
#include "kvf_ops.h"
#include "kvf_ops_math.h"

#include <stdlib.h>
#include <string.h>

static void assert_bits_equal(const float *a, const float *b, size_t n)
{
    assert_memory_equal(a, b, n * sizeof(float));
}

static void test_add(void **state)
{
    kvf_test_rng_t r = {11};
    float y[300], x[300], ref[300];
    (void)state;
    kvf_test_fill(&r, y, 300, -4.0f, 4.0f);
    kvf_test_fill(&r, x, 300, -4.0f, 4.0f);
    for (int i = 0; i < 300; ++i) {
        ref[i] = y[i] + x[i];
    }
    assert_int_equal(kvf_add(NULL, y, x, 300), KVF_KERN_OK);
    assert_bits_equal(y, ref, 300);
    assert_int_equal(kvf_add(NULL, NULL, x, 1), KVF_KERN_EINVAL);
    assert_int_equal(kvf_add(NULL, NULL, NULL, 0), KVF_KERN_OK);
}

/* fp32 rows copied bit for bit (NaN payloads too); bf16/fp16 widened as kvf_dtype_load */
static void test_gather_rows(void **state)
{
    enum { ROWS = 9, COLS = 13 };
    kvf_test_rng_t r = {12};
    float src[ROWS * COLS], out[4 * COLS], ref[4 * COLS];
    uint16_t b16[ROWS * COLS], h16[ROWS * COLS];
    const int32_t ids[4] = {8, 0, 3, 8};
    const uint32_t nan_bits = 0x7fc01234u;
    (void)state;
    kvf_test_fill(&r, src, ROWS * COLS, -3.0f, 3.0f);
    memcpy(&src[3 * COLS + 2], &nan_bits, sizeof(nan_bits));
    for (int i = 0; i < ROWS * COLS; ++i) {
        b16[i] = kvf_hd_fp32_to_bf16(src[i]);
        h16[i] = kvf_hd_fp32_to_fp16(src[i]);
    }
    assert_int_equal(kvf_gather_rows(NULL, src, KVF_DTYPE_FP32, COLS, ids, 4, out), KVF_KERN_OK);
    for (int i = 0; i < 4; ++i) {
        memcpy(ref + i * COLS, src + ids[i] * COLS, COLS * sizeof(float));
    }
    assert_bits_equal(out, ref, 4 * COLS);
    assert_int_equal(kvf_gather_rows(NULL, b16, KVF_DTYPE_BF16, COLS, ids, 4, out), KVF_KERN_OK);
    for (int i = 0; i < 4 * COLS; ++i) {
        ref[i] = kvf_dtype_load(b16, KVF_DTYPE_BF16, (size_t)ids[i / COLS] * COLS + i % COLS);
    }
    assert_bits_equal(out, ref, 4 * COLS);
    assert_int_equal(kvf_gather_rows(NULL, h16, KVF_DTYPE_FP16, COLS, ids, 4, out), KVF_KERN_OK);
    for (int i = 0; i < 4 * COLS; ++i) {
        ref[i] = kvf_dtype_load(h16, KVF_DTYPE_FP16, (size_t)ids[i / COLS] * COLS + i % COLS);
    }
    assert_bits_equal(out, ref, 4 * COLS);
    {
        const int32_t bad[2] = {1, -1};
        assert_int_equal(kvf_gather_rows(NULL, src, KVF_DTYPE_FP32, COLS, bad, 2, out),
                         KVF_KERN_EINVAL);
        assert_int_equal(kvf_gather_rows(NULL, src, KVF_DTYPE_COUNT, COLS, ids, 1, out),
                         KVF_KERN_EINVAL);
        assert_int_equal(kvf_gather_rows(NULL, src, KVF_DTYPE_FP32, 0, ids, 1, out),
                         KVF_KERN_EINVAL);
        assert_int_equal(kvf_gather_rows(NULL, NULL, KVF_DTYPE_FP32, COLS, NULL, 0, NULL),
                         KVF_KERN_OK);
    }
}

/* y[rows[j]] += x[j] * wt[j] into a strided y; other rows untouched */
static void test_scatter_add_rows(void **state)
{
    enum { T = 7, H = 10, LD = 12, N = 3 };
    kvf_test_rng_t r = {13};
    float y[T * LD], ref[T * LD], x[N * H];
    const int32_t rows[N] = {5, 0, 2};
    const float wt[N] = {0.25f, -1.5f, 0.7f};
    (void)state;
    kvf_test_fill(&r, y, T * LD, -2.0f, 2.0f);
    kvf_test_fill(&r, x, N * H, -2.0f, 2.0f);
    memcpy(ref, y, sizeof(y));
    for (int j = 0; j < N; ++j) {
        for (int c = 0; c < H; ++c) {
            ref[rows[j] * LD + c] += x[j * H + c] * wt[j];
        }
    }
    assert_int_equal(kvf_scatter_add_rows(NULL, y, LD, rows, wt, N, x, H), KVF_KERN_OK);
    assert_bits_equal(y, ref, T * LD);
    assert_int_equal(kvf_scatter_add_rows(NULL, y, H - 1, rows, wt, N, x, H), KVF_KERN_EINVAL);
    {
        const int32_t bad[1] = {-2};
        assert_int_equal(kvf_scatter_add_rows(NULL, y, LD, bad, wt, 1, x, H), KVF_KERN_EINVAL);
    }
}

/* act(gate) * up for every activation, as kvf_act then a product */
static void test_act_mul(void **state)
{
    enum { M = 3, C = 17 };
    kvf_test_rng_t r = {14};
    float x[M * 2 * C], gate[M * C], y[M * C], ref[M * C];
    (void)state;
    kvf_test_fill(&r, x, M * 2 * C, -5.0f, 5.0f);
    for (int act = 0; act < KVF_KACT_COUNT; ++act) {
        for (int t = 0; t < M; ++t) {
            memcpy(gate + t * C, x + t * 2 * C, C * sizeof(float));
        }
        assert_int_equal(kvf_act(NULL, act, gate, M * C), KVF_KERN_OK);
        for (int t = 0; t < M; ++t) {
            for (int i = 0; i < C; ++i) {
                ref[t * C + i] = gate[t * C + i] * x[t * 2 * C + C + i];
            }
        }
        assert_int_equal(kvf_act_mul(NULL, act, x, M, C, y), KVF_KERN_OK);
        assert_bits_equal(y, ref, M * C);
    }
    assert_int_equal(kvf_act_mul(NULL, KVF_KACT_COUNT, x, M, C, y), KVF_KERN_EINVAL);
    assert_int_equal(kvf_act_mul(NULL, 0, x, M, 0, y), KVF_KERN_EINVAL);
}

/* gpt-oss's clamped SwiGLU against its definition in double (transformers' _apply_gate):
 * both clamps bind on inputs in [-5, 5] with limit 2 */
static void test_swiglu_clamp(void **state)
{
    enum { M = 3, C = 17 };
    const double alpha = 1.702, limit = 2.0;
    kvf_test_rng_t r = {16};
    float x[M * 2 * C], y[M * C];
    int clamped_g = 0, clamped_u = 0;
    (void)state;
    kvf_test_fill(&r, x, M * 2 * C, -5.0f, 5.0f);
    assert_int_equal(kvf_swiglu_clamp(NULL, (float)alpha, (float)limit, x, M, C, y),
                     KVF_KERN_OK);
    for (int t = 0; t < M; ++t) {
        for (int i = 0; i < C; ++i) {
            double g = x[t * 2 * C + i], u = x[t * 2 * C + C + i];
            clamped_g += (g > limit);
            clamped_u += (u > limit) || (u < -limit);
            g = (g > limit) ? limit : g;
            u = (u > limit) ? limit : (u < -limit) ? -limit : u;
            const double want = (u + 1.0) * g / (1.0 + exp(-alpha * g));
            assert_true(fabs((double)y[t * C + i] - want) <= 1e-6 * (1.0 + fabs(want)));
        }
    }
    assert_true((clamped_g > 0) && (clamped_u > 0));
    assert_int_equal(kvf_swiglu_clamp(NULL, 1.0f, 0.0f, x, M, C, y), KVF_KERN_EINVAL);
    assert_int_equal(kvf_swiglu_clamp(NULL, 1.0f, 1.0f, x, M, 0, y), KVF_KERN_EINVAL);
    assert_int_equal(kvf_swiglu_clamp(NULL, 1.0f, 1.0f, NULL, M, C, y), KVF_KERN_EINVAL);
    assert_int_equal(kvf_swiglu_clamp(NULL, 1.0f, 1.0f, NULL, 0, C, NULL), KVF_KERN_OK);
}

/* transformers' rotate_half RoPE of strided token rows, as the forward computed it */
static void test_rope(void **state)
{
    enum { T = 4, HEADS = 3, HD = 8, LD = HEADS * HD + 5 };
    kvf_test_rng_t r = {15};
    float x[T * LD], ref[T * LD], inv[HD / 2];
    const int32_t pos[T] = {0, 1, 77, 4095};
    (void)state;
    kvf_test_fill(&r, x, T * LD, -1.0f, 1.0f);
    for (int i = 0; i < HD / 2; ++i) {
        inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)HD);
    }
    memcpy(ref, x, sizeof(x));
    for (int t = 0; t < T; ++t) {
        for (int i = 0; i < HD / 2; ++i) {
            float f = (float)pos[t] * inv[i], c = cosf(f), s = sinf(f);
            for (int h = 0; h < HEADS; ++h) {
                float *v = ref + t * LD + h * HD, a = v[i], b = v[i + HD / 2];
                v[i] = a * c - b * s;
                v[i + HD / 2] = b * c + a * s;
            }
        }
    }
    assert_int_equal(kvf_rope(NULL, inv, HD, pos, T, x, LD, HEADS), KVF_KERN_OK);
    assert_bits_equal(x, ref, T * LD);   /* the 5 padding floats of each row too */
    assert_int_equal(kvf_rope(NULL, inv, 7, pos, T, x, LD, HEADS), KVF_KERN_EINVAL);
    assert_int_equal(kvf_rope(NULL, inv, HD, pos, T, x, HEADS * HD - 1, HEADS), KVF_KERN_EINVAL);
    {
        /* angle 0 is the identity; a quarter turn swaps the halves with a sign */
        float c, s, lo = 2.0f, hi = 3.0f;
        kvf_rope_cos_sin_hd(kvf_rope_angle_hd(0, 0.5f), &c, &s);
        kvf_rope_rotate_hd(c, s, &lo, &hi);
        assert_true((lo == 2.0f) && (hi == 3.0f));
        lo = 2.0f;
        hi = 3.0f;
        kvf_rope_rotate_hd(0.0f, 1.0f, &lo, &hi);
        assert_true((lo == -3.0f) && (hi == 2.0f));
    }
}

/* a CUDA device value: run by CUDA when built in, else refused */
static void test_cuda_value(void **state)
{
    const kvf_device_t cuda = {KVF_DEVICE_CUDA, 0, NULL};
    float y[2] = {1.0f, 2.0f};
    (void)state;
#ifndef KVF_HAVE_CUDA
    assert_int_equal(kvf_add(&cuda, y, y, 2), KVF_KERN_EUNSUPPORTED);
#else
    if (!kvf_device_cuda_available()) {
        skip();
    }
    (void)cuda;
    (void)y;
#endif
    assert_int_equal(kvf_add(&cuda, y, y, 0), KVF_KERN_OK);   /* nothing to do: no launch */
}

/* kvf_scale: x *= alpha, the same product as the scalar loop; bad input refused. */
static void test_scale(void **state)
{
    float x[5] = {1.0f, -2.5f, 0.1f, 3.0e30f, 0.0f};
    const float ref[5] = {1.0f, -2.5f, 0.1f, 3.0e30f, 0.0f};
    (void)state;

    assert_int_equal(kvf_scale(NULL, x, 5, 0.22f), KVF_KERN_OK);
    for (int i = 0; i < 5; ++i) {
        assert_true(x[i] == ref[i] * 0.22f);
    }
    assert_int_equal(kvf_scale(NULL, NULL, 0, 2.0f), KVF_KERN_OK);
    assert_int_equal(kvf_scale(NULL, NULL, 3, 2.0f), KVF_KERN_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_gather_rows),
        cmocka_unit_test(test_scatter_add_rows),
        cmocka_unit_test(test_act_mul),
        cmocka_unit_test(test_swiglu_clamp),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_cuda_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
