/* The chunked Gated DeltaNet prompt scan's CPU reference (kernels/kvf_gdn.h,
 * kvf_gdn_scan_chunked; the CUDA kernels run the same per-element functions):
 * - against the token-by-token scan (kvf_gdn_scan) with an fp32 state: y and the final
 *   state within fp32 rounding (the max abs difference printed), over several grids
 *   (1, a grid not dividing the prompt, 64, 256), from zero and continuing from a stored
 *   state at a position off the grid; with a bf16 state within bf16 rounding;
 * - the grid rule: a prompt cut into calls at grid multiples gives the uncut call's y and
 *   state bit for bit (fp32, bf16, fp16 states); a cut off the grid agrees within rounding
 *   but not bitwise; the token step (kvf_gdn_scan of one token) continues from it;
 * - the scratch the CUDA launcher takes: the formula, never below what a call needs;
 * - bad arguments refused (grid 0 or above KVF_GDN_MAX_GRID, negative position). */
#include "kvf_gdn.h"
#include "kvf_kern_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H = 4, DV = 6, G = 2, DK = 8, T = 150 };
#define LDX (H * DV + 2 * G * DK + 3)
#define LDBA (2 * H + 1)
#define LDY (H * DV + 1)
#define SN (H * DV * DK)

typedef struct {
    float xbc[T * LDX];
    float ba[T * LDBA];
    float dt_bias[H], A_log[H];
    kvf_gdn_params_t p;
} inputs_t;

static void inputs_init(inputs_t *in, uint64_t seed)
{
    kvf_test_rng_t rng = {seed};
    kvf_test_fill(&rng, in->xbc, T * LDX, -1, 1);
    kvf_test_fill(&rng, in->ba, T * LDBA, -3, 3);
    kvf_test_fill(&rng, in->dt_bias, H, -1, 1);
    kvf_test_fill(&rng, in->A_log, H, -2, 0.5f);
    in->p = (kvf_gdn_params_t){.heads = H, .head_dim = DV, .groups = G, .key_dim = DK,
                               .dt_bias = in->dt_bias, .A_log = in->A_log};
}

static int chunked(const inputs_t *in, int t0, int n, int grid, void *state, kvf_dtype_t sdt,
                   int has_state, float *y)
{
    return kvf_gdn_scan_chunked(NULL, &in->p, n, t0, grid, in->xbc + (size_t)t0 * LDX, LDX,
                                in->ba + (size_t)t0 * LDBA, LDBA, state, sdt, has_state,
                                y + (size_t)t0 * LDY, LDY);
}

static int serial(const inputs_t *in, int t0, int n, void *state, kvf_dtype_t sdt,
                  int has_state, float *y)
{
    return kvf_gdn_scan(NULL, &in->p, n, in->xbc + (size_t)t0 * LDX, LDX,
                        in->ba + (size_t)t0 * LDBA, LDBA, state, sdt, has_state,
                        y + (size_t)t0 * LDY, LDY);
}

static float rel(float a, float b)
{
    return fabsf(a - b) / (1.0f + fabsf(b));
}

/* chunked vs token by token, from zero and then continuing from the stored state */
static void vs_serial(kvf_dtype_t sdt, float tol)
{
    static inputs_t in;
    static float y1[T * LDY], y2[T * LDY];
    float s1[SN], s2[SN];
    const int grids[] = {1, 7, 16, 64, 256};
    uint16_t n1[SN], n2[SN];
    void *a = (sdt == KVF_DTYPE_FP32) ? (void *)s1 : (void *)n1;
    void *b = (sdt == KVF_DTYPE_FP32) ? (void *)s2 : (void *)n2;

    inputs_init(&in, 11);
    for (size_t gi = 0; gi < sizeof(grids) / sizeof(grids[0]); ++gi) {
        float maxd = 0.0f, maxabs = 0.0f;
        assert_int_equal(serial(&in, 0, 90, a, sdt, 0, y1), KVF_KERN_OK);
        assert_int_equal(serial(&in, 90, T - 90, a, sdt, 1, y1), KVF_KERN_OK);
        assert_int_equal(chunked(&in, 0, 90, grids[gi], b, sdt, 0, y2), KVF_KERN_OK);
        assert_int_equal(chunked(&in, 90, T - 90, grids[gi], b, sdt, 1, y2), KVF_KERN_OK);
        for (int t = 0; t < T; ++t) {
            for (int i = 0; i < H * DV; ++i) {
                float d = rel(y2[t * LDY + i], y1[t * LDY + i]);
                float ad = fabsf(y2[t * LDY + i] - y1[t * LDY + i]);
                maxd = (d > maxd) ? d : maxd;
                maxabs = (ad > maxabs) ? ad : maxabs;
            }
        }
        for (int i = 0; i < SN; ++i) {
            float u = (sdt == KVF_DTYPE_FP32) ? s1[i] : kvf_dtype_load(n1, sdt, (size_t)i);
            float v = (sdt == KVF_DTYPE_FP32) ? s2[i] : kvf_dtype_load(n2, sdt, (size_t)i);
            float d = rel(v, u);
            maxd = (d > maxd) ? d : maxd;
        }
        printf("gdn chunked vs token, grid %d, state dtype %d: max abs diff of y %g, "
               "max rel diff (y, state) %g\n", grids[gi], (int)sdt, (double)maxabs,
               (double)maxd);
        if (maxd > tol) {
            fail_msg("grid %d dtype %d: max relative difference %g > %g", grids[gi], (int)sdt,
                     (double)maxd, (double)tol);
        }
    }
}

static void test_vs_serial_fp32(void **state)
{
    (void)state;
    vs_serial(KVF_DTYPE_FP32, 2e-5f);
}

static void test_vs_serial_bf16(void **state)
{
    (void)state;
    vs_serial(KVF_DTYPE_BF16, 3e-2f);
}

/* uncut vs cut at grid multiples (bitwise); cut off the grid (within rounding) */
static void grid_cuts(kvf_dtype_t sdt)
{
    enum { GRID = 16 };
    static inputs_t in;
    static float y1[T * LDY], y2[T * LDY];
    float st1[SN], st2[SN]; /* large enough for every dtype */
    const size_t sbytes = (size_t)SN * kvf_dtype_size(sdt);
    const int cuts[][2] = {{16, 0}, {32, 0}, {48, 96}, {16, 32}, {144, 0}, {64, 128}};
    const float tol = (sdt == KVF_DTYPE_FP32) ? 1e-5f : 3e-2f;

    inputs_init(&in, 5);
    memset(y1, 0, sizeof(y1));
    assert_int_equal(chunked(&in, 0, T, GRID, st1, sdt, 0, y1), KVF_KERN_OK);
    for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); ++c) {
        int at[3] = {0}, n = 0;
        for (int k = 0; (k < 2) && (cuts[c][k] > 0); ++k) {
            at[n++] = cuts[c][k];
        }
        at[n] = T;
        memset(y2, 0xff, sizeof(y2));
        memset(st2, 0xff, sizeof(st2));
        for (int k = 0, t0 = 0; k <= n; t0 = at[k], ++k) {
            assert_int_equal(chunked(&in, t0, at[k] - t0, GRID, st2, sdt, k > 0, y2),
                             KVF_KERN_OK);
        }
        for (int t = 0; t < T; ++t) {
            assert_memory_equal(y1 + t * LDY, y2 + t * LDY, H * DV * sizeof(float));
        }
        assert_memory_equal(st1, st2, sbytes);
    }
    /* off the grid (a cut at 40): not the same operations, the same values within rounding */
    assert_int_equal(chunked(&in, 0, 40, GRID, st2, sdt, 0, y2), KVF_KERN_OK);
    assert_int_equal(chunked(&in, 40, T - 40, GRID, st2, sdt, 1, y2), KVF_KERN_OK);
    int differ = 0;
    for (int t = 0; t < T; ++t) {
        for (int i = 0; i < H * DV; ++i) {
            assert_true(rel(y2[t * LDY + i], y1[t * LDY + i]) < tol);
            differ += memcmp(&y2[t * LDY + i], &y1[t * LDY + i], sizeof(float)) != 0;
        }
    }
    assert_true(differ > 0); /* the grid is what makes the cuts above bitwise equal */
    /* the token step continues from the chunked scan's state */
    {
        float ys[LDY];
        assert_int_equal(chunked(&in, 0, T - 1, GRID, st2, sdt, 0, y2), KVF_KERN_OK);
        assert_int_equal(kvf_gdn_scan(NULL, &in.p, 1, in.xbc + (size_t)(T - 1) * LDX, LDX,
                                      in.ba + (size_t)(T - 1) * LDBA, LDBA, st2, sdt, 1, ys,
                                      LDY), KVF_KERN_OK);
        for (int i = 0; i < H * DV; ++i) {
            assert_true(rel(ys[i], y1[(T - 1) * LDY + i]) < tol);
        }
        for (int i = 0; i < SN; ++i) {
            assert_true(rel(kvf_dtype_load(st2, sdt, (size_t)i),
                            kvf_dtype_load(st1, sdt, (size_t)i)) < tol);
        }
    }
}

static void test_grid_cuts_fp32(void **state)
{
    (void)state;
    grid_cuts(KVF_DTYPE_FP32);
}

static void test_grid_cuts_bf16(void **state)
{
    (void)state;
    grid_cuts(KVF_DTYPE_BF16);
}

static void test_grid_cuts_fp16(void **state)
{
    (void)state;
    grid_cuts(KVF_DTYPE_FP16);
}

/* the formula worked by hand, monotone in T, 0 for nothing */
static void test_scratch_bytes(void **state)
{
    const kvf_gdn_params_t p = {.heads = 4, .head_dim = 8, .groups = 2, .key_dim = 16};

    (void)state;
    /* T 100 on grid 64: at worst 3 chunks (1 + 64 + 35), W = min(3, 1024 / 64) = 3, Lw 192:
     * 4 * (4*8*16 + 192 * (2*2*16 + 3*4) + 3*4 * (2*64*64 + 64 * (16 + 8))) */
    assert_int_equal(kvf_gdn_scratch_bytes(&p, 100, 64),
                     4 * (512 + 192 * (64 + 12) + 12 * (8192 + 1536)));
    /* a long call: the window caps W at 1024 / 64 = 16 chunks */
    assert_int_equal(kvf_gdn_scratch_bytes(&p, 100000, 64),
                     4 * (512 + 1024 * (64 + 12) + 64 * (8192 + 1536)));
    /* a grid above the window: one chunk a window */
    assert_int_equal(kvf_gdn_scratch_bytes(&p, 5000, 256) >= kvf_gdn_scratch_bytes(&p, 1, 256),
                     1);
    assert_true(kvf_gdn_scratch_bytes(&p, 10, 64) <= kvf_gdn_scratch_bytes(&p, 100, 64));
    assert_int_equal(kvf_gdn_scratch_bytes(&p, 0, 64), 0);
    assert_int_equal(kvf_gdn_scratch_bytes(&p, 10, 0), 0);
    assert_int_equal(kvf_gdn_scratch_bytes(NULL, 10, 64), 0);
}

static void test_refusals(void **state)
{
    static inputs_t in;
    static float y[T * LDY];
    float st[SN];

    (void)state;
    inputs_init(&in, 3);
    assert_int_equal(chunked(&in, 0, 10, 0, st, KVF_DTYPE_FP32, 0, y), KVF_KERN_EINVAL);
    assert_int_equal(chunked(&in, 0, 10, KVF_GDN_MAX_GRID + 1, st, KVF_DTYPE_FP32, 0, y),
                     KVF_KERN_EINVAL);
    assert_int_equal(kvf_gdn_scan_chunked(NULL, &in.p, 10, -1, 16, in.xbc, LDX, in.ba, LDBA,
                                          st, KVF_DTYPE_FP32, 0, y, LDY), KVF_KERN_EINVAL);
    assert_int_equal(kvf_gdn_scan_chunked(NULL, &in.p, 10, 0, 16, in.xbc, LDX, in.ba, LDBA,
                                          st, KVF_DTYPE_FP8, 0, y, LDY), KVF_KERN_EINVAL);
    assert_int_equal(kvf_gdn_scan_chunked(NULL, &in.p, 10, 0, 16, in.xbc, 3, in.ba, LDBA, st,
                                          KVF_DTYPE_FP32, 0, y, LDY), KVF_KERN_EINVAL);
    assert_int_equal(chunked(&in, 0, 0, 16, st, KVF_DTYPE_FP32, 0, y), KVF_KERN_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_serial_fp32),  cmocka_unit_test(test_vs_serial_bf16),
        cmocka_unit_test(test_grid_cuts_fp32),  cmocka_unit_test(test_grid_cuts_bf16),
        cmocka_unit_test(test_grid_cuts_fp16),  cmocka_unit_test(test_scratch_bytes),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
