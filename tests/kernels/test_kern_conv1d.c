/* Causal depthwise conv1d + SiLU: one chunk, chunked continuation and
 * step-by-step decode against a naive full-sequence reference and against
 * each other bit for bit, in every state dtype (batch invariance: where a
 * prompt is cut never changes a bit); fresh requests ignore stale state
 * bytes; state contents after a chunk. */
#include "kvf_conv1d.h"
#include "kvf_kern_test.h"

#include <stdlib.h>
#include <string.h>

enum { CH = 12, KW = 4, T = 23, LDX = 20 };

/* y[t][c] = silu(b[c] + sum_i w[c][i] * x[t - 3 + i]), x[<0] = 0 */
static void ref_conv(const float *x, const float *w, const float *b, double *y)
{
    for (int t = 0; t < T; ++t) {
        for (int c = 0; c < CH; ++c) {
            double acc = b[c];
            for (int i = 0; i < KW; ++i) {
                int tt = t - (KW - 1) + i;
                if (tt >= 0) {
                    acc += (double)w[c * KW + i] * x[tt * LDX + c];
                }
            }
            y[t * CH + c] = acc / (1.0 + exp(-acc));
        }
    }
}

static void run_split(kvf_dtype_t dtype, const int *chunks, int nchunks, int steps_after,
                      const float *x, const float *w, const float *b, const double *ref,
                      double tol, float *y)
{
    unsigned char state[CH * (KW - 1) * 4];
    int t = 0;

    memset(state, 0xff, sizeof(state));   /* stale NaN bytes: must not be read when fresh */
    for (int k = 0; k < nchunks; ++k) {
        assert_int_equal(kvf_conv1d_chunk(NULL, x + t * LDX, LDX, chunks[k], CH, KW, w, b, 1,
                                          state, dtype, k > 0, y + t * CH, CH),
                         KVF_KERN_OK);
        t += chunks[k];
    }
    for (int s = 0; s < steps_after; ++s, ++t) {
        assert_int_equal(kvf_conv1d_step(NULL, x + t * LDX, CH, KW, w, b, 1, state, dtype,
                                         y + t * CH),
                         KVF_KERN_OK);
    }
    assert_int_equal(t, T);
    kvf_test_assert_close(y, ref, T * CH, tol, tol, kvf_dtype_name(dtype));
    /* state = last 3 inputs, oldest first, in the state dtype */
    for (int c = 0; c < CH; ++c) {
        for (int j = 0; j < KW - 1; ++j) {
            float want = kvf_test_quant(dtype, x[(T - (KW - 1) + j) * LDX + c]);
            assert_true(kvf_dtype_load(state, dtype, (size_t)c * (KW - 1) + j) == want);
        }
    }
}

static void test_conv_splits(void **state)
{
    static const kvf_dtype_t dtypes[] = {KVF_DTYPE_FP32, KVF_DTYPE_BF16, KVF_DTYPE_FP16};
    kvf_test_rng_t rng = {31337};
    float x[T * LDX], w[CH * KW], b[CH];
    double ref[T * CH];
    (void)state;

    kvf_test_fill(&rng, x, T * LDX, -2, 2);
    kvf_test_fill(&rng, w, CH * KW, -1, 1);
    kvf_test_fill(&rng, b, CH, -0.5f, 0.5f);
    ref_conv(x, w, b, ref);
    for (size_t di = 0; di < 3; ++di) {
        /* bf16/fp16: every history tap reads the input at the state's precision */
        double tol = (dtypes[di] == KVF_DTYPE_FP32) ? 1e-5 : 3e-2;
        const int whole[] = {T};
        const int split[] = {5, 1, 2, 9};          /* 2 < kernel-1: shifts old history */
        const int prefill[] = {7};
        const int ones[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
        float y0[T * CH], y1[T * CH];
        run_split(dtypes[di], whole, 1, 0, x, w, b, ref, tol, y0);
        run_split(dtypes[di], split, 4, 6, x, w, b, ref, tol, y1);
        assert_memory_equal(y0, y1, sizeof(y0));
        run_split(dtypes[di], prefill, 1, T - 7, x, w, b, ref, tol, y1);
        assert_memory_equal(y0, y1, sizeof(y0));
        run_split(dtypes[di], ones, 11, T - 11, x, w, b, ref, tol, y1);   /* one-token chunks */
        assert_memory_equal(y0, y1, sizeof(y0));
    }
}

/* The chunk (time-major, vectorised over channels) computed IN PLACE (y = x,
 * same stride) equals the same tokens as decode steps bit for bit: every
 * input is read before a row is written, and each output sums its taps in
 * the step's order. */
static void test_conv_in_place_equals_steps(void **state)
{
    kvf_test_rng_t rng = {4711};
    float x[T * LDX], io[T * LDX], w[CH * KW], b[CH], ys[T * CH];
    float st1[CH * (KW - 1)], st2[CH * (KW - 1)];
    (void)state;

    kvf_test_fill(&rng, x, T * LDX, -2, 2);
    kvf_test_fill(&rng, w, CH * KW, -1, 1);
    kvf_test_fill(&rng, b, CH, -0.5f, 0.5f);
    kvf_test_fill(&rng, st1, CH * (KW - 1), -1, 1);
    memcpy(st2, st1, sizeof(st1));
    memcpy(io, x, sizeof(x));
    assert_int_equal(kvf_conv1d_chunk(NULL, io, LDX, T, CH, KW, w, b, 1, st1, KVF_DTYPE_FP32, 1,
                                      io, LDX),
                     KVF_KERN_OK);
    for (int t = 0; t < T; ++t) {
        assert_int_equal(kvf_conv1d_step(NULL, x + t * LDX, CH, KW, w, b, 1, st2,
                                         KVF_DTYPE_FP32, ys + t * CH),
                         KVF_KERN_OK);
        assert_memory_equal(io + t * LDX, ys + t * CH, CH * sizeof(float));
    }
    assert_memory_equal(st1, st2, sizeof(st1));
}

/* hand value: one channel, w = [1 2 3 4], bias 0, no SiLU, x = 1, 1, 1 */
static void test_conv_hand(void **state)
{
    float w[4] = {1, 2, 3, 4}, x[3] = {1, 1, 1}, y[3];
    float st[3];
    (void)state;

    assert_int_equal(kvf_conv1d_chunk(NULL, x, 1, 3, 1, 4, w, NULL, 0, st, KVF_DTYPE_FP32, 0,
                                      y, 1),
                     KVF_KERN_OK);
    assert_float_equal(y[0], 4.0f, 0);    /* 4*1 */
    assert_float_equal(y[1], 7.0f, 0);    /* 3 + 4 */
    assert_float_equal(y[2], 9.0f, 0);    /* 2 + 3 + 4 */
    x[0] = 2;
    assert_int_equal(kvf_conv1d_step(NULL, x, 1, 4, w, NULL, 0, st, KVF_DTYPE_FP32, y),
                     KVF_KERN_OK);
    assert_float_equal(y[0], 1 + 2 + 3 + 8.0f, 0);
    assert_int_equal(kvf_conv1d_step(NULL, x, 1, 1, w, NULL, 0, st, KVF_DTYPE_FP32, y),
                     KVF_KERN_EINVAL);
    assert_int_equal(kvf_conv1d_chunk(NULL, x, 1, 1, 1, 4, w, NULL, 0, st, KVF_DTYPE_FP8, 0, y,
                                      1),
                     KVF_KERN_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_splits),
        cmocka_unit_test(test_conv_in_place_equals_steps),
        cmocka_unit_test(test_conv_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
