/* RMSNorm and gated grouped RMSNorm against references, including the
 * two-phase TP form where a norm group spans two ranks. */
#include "kvf_norm.h"
#include "kvf_ops.h"
#include "kvf_kern_test.h"

#include <stdlib.h>
#include <string.h>

static void test_rmsnorm(void **state)
{
    enum { R = 3, D = 10 };
    kvf_test_rng_t rng = {42};
    float x[R * D], w[D], y[R * D];
    double ref[R * D];
    (void)state;

    kvf_test_fill(&rng, x, R * D, -3, 3);
    kvf_test_fill(&rng, w, D, 0.5f, 1.5f);
    for (int r = 0; r < R; ++r) {
        double s = 0;
        for (int c = 0; c < D; ++c) {
            s += (double)x[r * D + c] * x[r * D + c];
        }
        double inv = 1.0 / sqrt(s / D + 1e-5);
        for (int c = 0; c < D; ++c) {
            ref[r * D + c] = x[r * D + c] * inv * w[c];
        }
    }
    assert_int_equal(kvf_rmsnorm(NULL, x, w, y, R, D, 1e-5f), KVF_KERN_OK);
    kvf_test_assert_close(y, ref, R * D, 1e-6, 1e-5, "rmsnorm");
    assert_int_equal(kvf_rmsnorm(NULL, x, w, x, R, D, 1e-5f), KVF_KERN_OK);   /* in place */
    kvf_test_assert_close(x, ref, R * D, 1e-6, 1e-5, "rmsnorm in place");

    /* hand value: x = [3 4], w = 1, eps 0: rms = sqrt(12.5) */
    {
        float hx[2] = {3, 4}, hw[2] = {1, 1}, hy[2];
        assert_int_equal(kvf_rmsnorm(NULL, hx, hw, hy, 1, 2, 0.0f), KVF_KERN_OK);
        assert_float_equal(hy[0], 3.0 / sqrt(12.5), 1e-6);
        assert_float_equal(hy[1], 4.0 / sqrt(12.5), 1e-6);
    }
    assert_int_equal(kvf_rmsnorm(NULL, x, w, y, R, 0, 1e-5f), KVF_KERN_EINVAL);
}

/* reference MambaRMSNormGated over [rows][ld] inputs, groups of gsize */
static void ref_gated(const float *x, const float *z, int ld, const float *w, int rows, int dim,
                      int gsize, double eps, double *out)
{
    for (int r = 0; r < rows; ++r) {
        for (int k = 0; k < dim / gsize; ++k) {
            double g[64], s = 0;
            for (int i = 0; i < gsize; ++i) {
                int c = k * gsize + i;
                double zv = z[r * ld + c];
                g[i] = x[r * ld + c] * (zv / (1.0 + exp(-zv)));
                s += g[i] * g[i];
            }
            double inv = 1.0 / sqrt(s / gsize + eps);
            for (int i = 0; i < gsize; ++i) {
                out[r * dim + k * gsize + i] = g[i] * inv * w[k * gsize + i];
            }
        }
    }
}

/* The residual add fused with the next norm: h and y bit for bit those of kvf_add then
 * kvf_rmsnorm; aliased outputs refused (a fused pass would read what it wrote). */
static void test_add_rmsnorm(void **state)
{
    enum { R = 5, D = 96 };
    kvf_test_rng_t rng = {7};
    float h1[R * D], h2[R * D], d[R * D], w[D], y1[R * D], y2[R * D];
    (void)state;

    kvf_test_fill(&rng, h1, R * D, -3, 3);
    kvf_test_fill(&rng, d, R * D, -1, 1);
    kvf_test_fill(&rng, w, D, 0.5f, 1.5f);
    memcpy(h2, h1, sizeof(h1));
    assert_int_equal(kvf_add_rmsnorm(NULL, h1, d, w, y1, R, D, 1e-5f), KVF_KERN_OK);
    assert_int_equal(kvf_add(NULL, h2, d, R * D), KVF_KERN_OK);
    assert_int_equal(kvf_rmsnorm(NULL, h2, w, y2, R, D, 1e-5f), KVF_KERN_OK);
    assert_memory_equal(h1, h2, sizeof(h1));
    assert_memory_equal(y1, y2, sizeof(y1));
    assert_true(h1[0] != d[0]);   /* the add happened */
    assert_int_equal(kvf_add_rmsnorm(NULL, h1, d, w, h1, R, D, 1e-5f), KVF_KERN_EINVAL);
    assert_int_equal(kvf_add_rmsnorm(NULL, h1, h1, w, y1, R, D, 1e-5f), KVF_KERN_EINVAL);
    assert_int_equal(kvf_add_rmsnorm(NULL, h1, d, w, y1, -1, D, 1e-5f), KVF_KERN_EINVAL);
    assert_int_equal(kvf_add_rmsnorm(NULL, NULL, d, w, y1, 0, D, 1e-5f), KVF_KERN_OK);
}

/* Qwen3's per-head norms of many tokens in one call: each head's values are those of a
 * kvf_rmsnorm of the token's heads (bit for bit), against a double reference too; the gap
 * of each row past its heads is not touched; bad shapes refused. */
static void test_rmsnorm_heads(void **state)
{
    enum { T = 5, H = 3, HD = 8, LD = 40 };   /* heads at columns [0, 24), 16 floats past */
    kvf_test_rng_t rng = {9};
    float x[T * LD], y[T * LD], w[HD];
    double ref[T * H * HD];
    float got[T * H * HD];
    (void)state;

    kvf_test_fill(&rng, x, T * LD, -3, 3);
    kvf_test_fill(&rng, w, HD, 0.5f, 1.5f);
    memcpy(y, x, sizeof(x));
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < H; ++h) {
            const float *r = x + t * LD + h * HD;
            double s = 0;
            for (int c = 0; c < HD; ++c) {
                s += (double)r[c] * r[c];
            }
            for (int c = 0; c < HD; ++c) {
                ref[(t * H + h) * HD + c] = r[c] / sqrt(s / HD + 1e-6) * w[c];
            }
        }
    }
    assert_int_equal(kvf_rmsnorm_heads(NULL, y, LD, T, H, HD, w, 1e-6f), KVF_KERN_OK);
    for (int t = 0; t < T; ++t) {
        float one[H * HD];
        assert_int_equal(kvf_rmsnorm(NULL, x + t * LD, w, one, H, HD, 1e-6f), KVF_KERN_OK);
        assert_memory_equal(y + t * LD, one, sizeof(one));
        assert_memory_equal(y + t * LD + H * HD, x + t * LD + H * HD,
                            (LD - H * HD) * sizeof(float));   /* the gap */
        memcpy(got + t * H * HD, one, sizeof(one));
    }
    kvf_test_assert_close(got, ref, T * H * HD, 1e-6, 1e-5, "rmsnorm_heads");
    assert_int_equal(kvf_rmsnorm_heads(NULL, y, H * HD - 1, T, H, HD, w, 1e-6f),
                     KVF_KERN_EINVAL);   /* ld shorter than a token's heads */
    assert_int_equal(kvf_rmsnorm_heads(NULL, y, LD, -1, H, HD, w, 1e-6f), KVF_KERN_EINVAL);
    assert_int_equal(kvf_rmsnorm_heads(NULL, y, LD, T, 0, HD, w, 1e-6f), KVF_KERN_EINVAL);
    assert_int_equal(kvf_rmsnorm_heads(NULL, y, LD, T, H, HD, NULL, 1e-6f), KVF_KERN_EINVAL);
    assert_int_equal(kvf_rmsnorm_heads(NULL, NULL, LD, 0, H, HD, w, 1e-6f), KVF_KERN_OK);
}

static void test_gated_whole_groups(void **state)
{
    enum { R = 4, D = 16, G = 8, LD = 40 };
    kvf_test_rng_t rng = {7};
    float in[R * LD], w[D], y[R * D];
    double ref[R * D];
    (void)state;

    kvf_test_fill(&rng, in, R * LD, -2, 2);
    kvf_test_fill(&rng, w, D, 0.5f, 1.5f);
    /* z at column 0, x at column 20 of a wider projection row */
    ref_gated(in + 20, in, LD, w, R, D, G, 1e-5, ref);
    assert_int_equal(kvf_gated_rmsnorm(NULL, in + 20, in, LD, w, R, D, G, 1e-5f, y),
                     KVF_KERN_OK);
    kvf_test_assert_close(y, ref, R * D, 1e-6, 1e-5, "gated");
    assert_int_equal(kvf_gated_rmsnorm(NULL, in + 20, in, LD, w, R, D, 5, 1e-5f, y),
                     KVF_KERN_EINVAL);
}

/* 2 groups of 8 channels over TP 4: each rank holds 4 channels, half a group. */
static void test_gated_two_phase_tp(void **state)
{
    enum { R = 3, D = 16, G = 8, TP = 4, DL = D / TP };
    kvf_test_rng_t rng = {99};
    float x[R * D], z[R * D], w[D], out[R * D];
    float g[TP][R * DL], ss[TP][R], xl[R * DL], zl[R * DL], yl[R * DL];
    double ref[R * D];
    (void)state;

    kvf_test_fill(&rng, x, R * D, -2, 2);
    kvf_test_fill(&rng, z, R * D, -2, 2);
    kvf_test_fill(&rng, w, D, 0.5f, 1.5f);
    ref_gated(x, z, D, w, R, D, G, 1e-5, ref);
    for (int rank = 0; rank < TP; ++rank) {
        for (int r = 0; r < R; ++r) {
            memcpy(xl + r * DL, x + r * D + rank * DL, DL * sizeof(float));
            memcpy(zl + r * DL, z + r * D + rank * DL, DL * sizeof(float));
        }
        assert_int_equal(kvf_gated_rmsnorm_sumsq(NULL, xl, zl, DL, R, DL, DL, g[rank], ss[rank]),
                         KVF_KERN_OK);
    }
    /* all-reduce among the 2 ranks sharing each group */
    for (int rank = 0; rank < TP; rank += 2) {
        for (int r = 0; r < R; ++r) {
            float s = ss[rank][r] + ss[rank + 1][r];
            ss[rank][r] = ss[rank + 1][r] = s;
        }
    }
    for (int rank = 0; rank < TP; ++rank) {
        assert_int_equal(kvf_gated_rmsnorm_apply(NULL, g[rank], ss[rank], w + rank * DL, R, DL,
                                                 DL, G, 1e-5f, yl),
                         KVF_KERN_OK);
        for (int r = 0; r < R; ++r) {
            memcpy(out + r * D + rank * DL, yl + r * DL, DL * sizeof(float));
        }
    }
    kvf_test_assert_close(out, ref, R * D, 1e-6, 1e-5, "gated two-phase");
    assert_int_equal(kvf_gated_rmsnorm_apply(NULL, g[0], ss[0], w, R, DL, DL, DL - 1, 1e-5f, yl),
                     KVF_KERN_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_rmsnorm_heads),
        cmocka_unit_test(test_gated_whole_groups),
        cmocka_unit_test(test_gated_two_phase_tp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
