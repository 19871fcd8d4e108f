/* Mamba2 scan: one chunk, split chunks and repeated single steps against a
 * naive recurrence in double; fresh requests ignore stale state; a hand
 * example. */
#include "kvf_gemm.h"
#include "kvf_mamba2.h"
#include "kvf_kern_test.h"

#include <stdlib.h>
#include <string.h>

enum { H = 4, P = 3, G = 2, N = 5, T = 13 };
#define LDXBC (H * P + 2 * G * N + 3)
#define LDDT (H + 1)

typedef struct {
    float xbc[T * LDXBC];
    float dt[T * LDDT];
    float dt_bias[H], A_log[H], D[H];
    kvf_mamba2_params_t p;
} inputs_t;

static void inputs_init(inputs_t *in, uint64_t seed)
{
    kvf_test_rng_t rng = {seed};
    kvf_test_fill(&rng, in->xbc, T * LDXBC, -1, 1);
    kvf_test_fill(&rng, in->dt, T * LDDT, -3, 1);
    kvf_test_fill(&rng, in->dt_bias, H, -1, 1);
    kvf_test_fill(&rng, in->A_log, H, -1, 1.5f);
    kvf_test_fill(&rng, in->D, H, 0, 1);
    memset(&in->p, 0, sizeof(in->p));
    in->p.heads = H;
    in->p.head_dim = P;
    in->p.groups = G;
    in->p.state_size = N;
    in->p.dt_bias = in->dt_bias;
    in->p.A_log = in->A_log;
    in->p.D = in->D;
    in->p.dt_min = 0.0f;
    in->p.dt_max = INFINITY;
}

/* HF torch_forward recurrence, double precision, from S = 0 */
static void ref_scan(const inputs_t *in, double *y, double *S_out)
{
    double S[H][P][N] = {{{0}}};
    for (int t = 0; t < T; ++t) {
        const float *x = in->xbc + t * LDXBC;
        const float *B = x + H * P;
        const float *C = B + G * N;
        for (int h = 0; h < H; ++h) {
            int g = h / (H / G);
            double v = (double)in->dt[t * LDDT + h] + in->dt_bias[h];
            double dt = (v > 20) ? v : log1p(exp(v));
            double dA = exp(dt * -exp((double)in->A_log[h]));
            for (int d = 0; d < P; ++d) {
                double acc = 0;
                for (int n = 0; n < N; ++n) {
                    S[h][d][n] = dA * S[h][d][n] + dt * x[h * P + d] * B[g * N + n];
                    acc += S[h][d][n] * C[g * N + n];
                }
                y[t * H * P + h * P + d] = acc + in->D[h] * x[h * P + d];
            }
        }
    }
    memcpy(S_out, S, sizeof(S));
}

static void run_split(const inputs_t *in, kvf_dtype_t dtype, const int *chunks, int nchunks,
                      const double *ref, const double *Sref, double tol, float *y)
{
    float state[H * P * N];
    int t = 0;

    memset(state, 0xff, sizeof(state));   /* stale NaN: a fresh request must not read it */
    for (int k = 0; k < nchunks; ++k) {
        const float *x = in->xbc + t * LDXBC;
        if (chunks[k] == 0) {   /* 0 marks one decode step */
            assert_int_equal(kvf_mamba2_step(NULL, &in->p, x, in->dt + t * LDDT, x + H * P,
                                             x + H * P + G * N, state, dtype, y + t * H * P),
                             KVF_KERN_OK);
            t += 1;
            continue;
        }
        assert_int_equal(kvf_mamba2_scan(NULL, &in->p, chunks[k], x, LDXBC, in->dt + t * LDDT,
                                         LDDT, x + H * P, x + H * P + G * N, LDXBC, state, dtype,
                                         k > 0, y + t * H * P, H * P),
                         KVF_KERN_OK);
        t += chunks[k];
    }
    assert_int_equal(t, T);
    kvf_test_assert_close(y, ref, T * H * P, tol, tol, kvf_dtype_name(dtype));
    for (int i = 0; i < H * P * N; ++i) {
        float got = kvf_dtype_load(state, dtype, (size_t)i);
        float want[1] = {got};
        kvf_test_assert_close(want, &Sref[i], 1, tol, tol, "final state");
    }
}

static void test_scan_splits(void **state)
{
    inputs_t *in = malloc(sizeof(*in));
    double ref[T * H * P], Sref[H * P * N];
    (void)state;

    assert_non_null(in);
    inputs_init(in, 2024);
    ref_scan(in, ref, Sref);
    {
        const int whole[] = {T};
        const int split[] = {4, 1, 6, 2};
        const int steps[] = {3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};   /* prefill 3, decode 10 */
        const int all_steps[] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        float y0[T * H * P], y1[T * H * P];
        run_split(in, KVF_DTYPE_FP32, whole, 1, ref, Sref, 1e-5, y0);
        run_split(in, KVF_DTYPE_FP32, split, 4, ref, Sref, 1e-5, y1);
        assert_memory_equal(y0, y1, sizeof(y0));
        run_split(in, KVF_DTYPE_FP32, steps, 11, ref, Sref, 1e-5, y1);
        assert_memory_equal(y0, y1, sizeof(y0));
        run_split(in, KVF_DTYPE_FP32, all_steps, 13, ref, Sref, 1e-5, y1);
        assert_memory_equal(y0, y1, sizeof(y0));
        /* narrow state: rounded after every token, in a chunk as in a step, so every split
         * gives the same bits (batch invariance: where a prompt is cut changes nothing) */
        for (int di = 0; di < 2; ++di) {
            const kvf_dtype_t dt = di ? KVF_DTYPE_FP16 : KVF_DTYPE_BF16;
            const double tol = di ? 5e-3 : 3e-2;
            run_split(in, dt, whole, 1, ref, Sref, tol, y0);
            run_split(in, dt, split, 4, ref, Sref, tol, y1);
            assert_memory_equal(y0, y1, sizeof(y0));
            run_split(in, dt, steps, 11, ref, Sref, tol, y1);
            assert_memory_equal(y0, y1, sizeof(y0));
            run_split(in, dt, all_steps, 13, ref, Sref, tol, y1);
            assert_memory_equal(y0, y1, sizeof(y0));
        }
    }
    free(in);
}

/* The chunk scan vectorises over head dims (blocks of 32, 8 and 1) on a
 * transposed state, keeping each element's operations in the decode step's
 * order: a chunk and the same tokens as decode steps agree bit for bit in y
 * and in the fp32 state. Head dim 43 takes every block width. */
static void test_scan_equals_steps(void **state)
{
    enum { SH = 2, SP = 43, SG = 1, SN = 24, ST = 9, SLD = SH * SP + 2 * SG * SN };
    float *xbc = malloc(ST * SLD * sizeof(float)), dt[ST * SH], A_log[SH], D[SH];
    float *S1 = malloc(SH * SP * SN * sizeof(float)), *S2 = malloc(SH * SP * SN * sizeof(float));
    float y1[ST * SH * SP], y2[ST * SH * SP];
    kvf_test_rng_t rng = {77};
    kvf_mamba2_params_t p = {SH, SP, SG, SN, NULL, A_log, D, 0.0f, INFINITY};
    (void)state;

    assert_non_null(xbc);
    assert_non_null(S1);
    assert_non_null(S2);
    kvf_test_fill(&rng, xbc, ST * SLD, -1, 1);
    kvf_test_fill(&rng, dt, ST * SH, -3, 1);
    kvf_test_fill(&rng, A_log, SH, -1, 1.5f);
    kvf_test_fill(&rng, D, SH, 0, 1);
    kvf_test_fill(&rng, S1, SH * SP * SN, -1, 1);
    memcpy(S2, S1, SH * SP * SN * sizeof(float));
    assert_int_equal(kvf_mamba2_scan(NULL, &p, ST, xbc, SLD, dt, SH, xbc + SH * SP,
                                     xbc + SH * SP + SG * SN, SLD, S1, KVF_DTYPE_FP32, 1, y1,
                                     SH * SP),
                     KVF_KERN_OK);
    for (int t = 0; t < ST; ++t) {
        const float *x = xbc + t * SLD;
        assert_int_equal(kvf_mamba2_step(NULL, &p, x, dt + t * SH, x + SH * SP,
                                         x + SH * SP + SG * SN, S2, KVF_DTYPE_FP32,
                                         y2 + t * SH * SP),
                         KVF_KERN_OK);
    }
    assert_memory_equal(y1, y2, sizeof(y1));
    assert_memory_equal(S1, S2, SH * SP * SN * sizeof(float));
    free(S2);
    free(S1);
    free(xbc);
}

/* A chunk split over two CPU threads (heads dealt out; kvf_gemm_set_threads,
 * as an instance of TP 1 does) gives the one thread's bits, y and state. */
static void test_scan_threads(void **state)
{
    enum { SH = 6, SP = 16, SG = 2, SN = 8, ST = 96, SLD = SH * SP + 2 * SG * SN };
    float *xbc = malloc(ST * SLD * sizeof(float)), dt[ST * SH], A_log[SH], D[SH];
    float S1[SH * SP * SN], S2[SH * SP * SN];
    float *y1 = malloc(ST * SH * SP * sizeof(float)), *y2 = malloc(ST * SH * SP * sizeof(float));
    kvf_test_rng_t rng = {78};
    kvf_mamba2_params_t p = {SH, SP, SG, SN, NULL, A_log, D, 0.01f, INFINITY};
    (void)state;

    assert_non_null(xbc);
    assert_non_null(y1);
    assert_non_null(y2);
    kvf_test_fill(&rng, xbc, ST * SLD, -1, 1);
    kvf_test_fill(&rng, dt, ST * SH, -3, 1);
    kvf_test_fill(&rng, A_log, SH, -1, 1.5f);
    kvf_test_fill(&rng, D, SH, 0, 1);
    kvf_test_fill(&rng, S1, SH * SP * SN, -1, 1);
    memcpy(S2, S1, sizeof(S1));
    assert_int_equal(kvf_mamba2_scan(NULL, &p, ST, xbc, SLD, dt, SH, xbc + SH * SP,
                                     xbc + SH * SP + SG * SN, SLD, S1, KVF_DTYPE_FP32, 1, y1,
                                     SH * SP),
                     KVF_KERN_OK);
    kvf_gemm_set_threads(2);
    assert_int_equal(kvf_mamba2_scan(NULL, &p, ST, xbc, SLD, dt, SH, xbc + SH * SP,
                                     xbc + SH * SP + SG * SN, SLD, S2, KVF_DTYPE_FP32, 1, y2,
                                     SH * SP),
                     KVF_KERN_OK);
    kvf_gemm_set_threads(1);
    assert_memory_equal(y1, y2, ST * SH * SP * sizeof(float));
    assert_memory_equal(S1, S2, sizeof(S1));
    free(y2);
    free(y1);
    free(xbc);
}

/* 1 head, dim 1, state 1: A_log 0 -> A = -1; dt raw 0, bias 0 -> dt = ln 2;
 * dA = 1/2. x = B = C = 1, D = 0.5: S1 = ln2, y1 = ln2 + 0.5;
 * S2 = ln2/2 + ln2, y2 = 1.5 ln2 + 0.5. */
static void test_scan_hand(void **state)
{
    float A_log = 0, D = 0.5f, x[2] = {1, 1}, dt[2] = {0, 0}, B[2] = {1, 1}, C[2] = {1, 1};
    float S = 123.0f, y[2];
    kvf_mamba2_params_t p = {1, 1, 1, 1, NULL, &A_log, &D, 0.0f, INFINITY};
    (void)state;

    assert_int_equal(kvf_mamba2_scan(NULL, &p, 2, x, 1, dt, 1, B, C, 1, &S, KVF_DTYPE_FP32, 0, y,
                                     1),
                     KVF_KERN_OK);
    assert_float_equal(y[0], log(2.0) + 0.5, 1e-6);
    assert_float_equal(y[1], 1.5 * log(2.0) + 0.5, 1e-6);
    assert_float_equal(S, 1.5 * log(2.0), 1e-6);
    /* dt clamp: dt_max 0.1 -> dA = exp(-0.1), S = e^-0.1 * S + 0.1 */
    p.dt_max = 0.1f;
    assert_int_equal(kvf_mamba2_step(NULL, &p, x, dt, B, C, &S, KVF_DTYPE_FP32, y), KVF_KERN_OK);
    assert_float_equal(S, exp(-0.1) * 1.5 * log(2.0) + 0.1, 1e-6);
    p.groups = 2;   /* does not divide 1 head */
    assert_int_equal(kvf_mamba2_step(NULL, &p, x, dt, B, C, &S, KVF_DTYPE_FP32, y),
                     KVF_KERN_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scan_splits),
        cmocka_unit_test(test_scan_equals_steps),
        cmocka_unit_test(test_scan_threads),
        cmocka_unit_test(test_scan_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
