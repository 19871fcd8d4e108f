/* The chunked (SSD) Mamba2 prompt scan's CPU reference (kernels/kvf_ssd.h):
 * - the chunk list: cut at absolute multiples of the grid whatever the call's first
 *   position, bad arguments refused;
 * - against the token-by-token scan (kvf_mamba2_scan) with an fp32 state: y and the final
 *   state within fp32 rounding, over several grids, from zero and from a stored state;
 *   with a bf16 state within bf16 rounding;
 * - the grid rule: a prompt cut into calls at any grid multiple gives the uncut call's y and
 *   state bit for bit (fp32, bf16 and fp16 states), and the decode step continues from it;
 *   a cut off the grid still agrees within rounding;
 * - bad arguments refused (grid 0 or above KVF_SSD_MAX_GRID, negative position). */
#include "kvf_mamba2.h"
#include "kvf_ssd.h"
#include "kvf_ssd_math.h"
#include "kvf_kern_test.h"

#include <stdlib.h>
#include <string.h>

enum { H = 4, P = 6, G = 2, N = 8, T = 150 };
#define LDXBC (H * P + 2 * G * N + 3)
#define LDDT (H + 1)
#define LDY (H * P + 1)
#define SN (H * P * N)

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
    kvf_test_fill(&rng, in->dt, T * LDDT, -4, 0.5f);
    kvf_test_fill(&rng, in->dt_bias, H, -1, 1);
    kvf_test_fill(&rng, in->A_log, H, -1, 1.0f);
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

/* Tokens [t0, t0 + n) of the inputs through the chunked scan (absolute position t0) */
static int chunked(const inputs_t *in, int t0, int n, int grid, void *state, kvf_dtype_t sdt,
                   int has_state, float *y)
{
    const float *x = in->xbc + (size_t)t0 * LDXBC;
    return kvf_mamba2_scan_chunked(NULL, &in->p, n, t0, grid, x, LDXBC, in->dt + t0 * LDDT,
                                   LDDT, x + H * P, x + H * P + G * N, LDXBC, state, sdt,
                                   has_state, y + (size_t)t0 * LDY, LDY);
}

static int serial(const inputs_t *in, int t0, int n, void *state, kvf_dtype_t sdt,
                  int has_state, float *y)
{
    const float *x = in->xbc + (size_t)t0 * LDXBC;
    return kvf_mamba2_scan(NULL, &in->p, n, x, LDXBC, in->dt + t0 * LDDT, LDDT, x + H * P,
                           x + H * P + G * N, LDXBC, state, sdt, has_state,
                           y + (size_t)t0 * LDY, LDY);
}

static void test_chunks(void **state)
{
    long long st[8];
    int len[8];

    (void)state;
    assert_int_equal(kvf_ssd_chunks(0, 150, 64, st, len, 8), 3);
    assert_true((st[0] == 0) && (len[0] == 64) && (st[1] == 64) && (len[1] == 64) &&
                (st[2] == 128) && (len[2] == 22));
    /* a call from position 100: its first chunk ends at the grid's 128, not at 164 */
    assert_int_equal(kvf_ssd_chunks(100, 100, 64, st, len, 8), 3);
    assert_true((st[0] == 100) && (len[0] == 28) && (st[1] == 128) && (len[1] == 64) &&
                (st[2] == 192) && (len[2] == 8));
    /* from a grid multiple: full chunks */
    assert_int_equal(kvf_ssd_chunks(128, 128, 64, st, len, 8), 2);
    assert_true((st[0] == 128) && (len[0] == 64) && (st[1] == 192) && (len[1] == 64));
    assert_int_equal(kvf_ssd_chunks(5, 0, 64, st, len, 8), 0);
    assert_int_equal(kvf_ssd_chunks(0, 1000, 1, NULL, NULL, 0), 1000);
    /* the CUDA kernels' per-chunk lookup gives the same list */
    const int cases[][3] = {{0, 150, 64}, {100, 100, 64}, {128, 128, 64}, {7, 1, 16},
                            {63, 200, 64}, {0, 37, 1}, {1000, 513, 256}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); ++c) {
        long long s2[600];
        int l2[600], n = kvf_ssd_chunks(cases[c][0], cases[c][1], cases[c][2], s2, l2, 600);
        for (int k = 0; k <= n; ++k) {
            int s, l;
            kvf_ssd_chunk_at_hd(cases[c][0], cases[c][1], cases[c][2], k, &s, &l);
            if (k == n) {
                assert_int_equal(l, 0);
            } else {
                assert_int_equal(s, (int)(s2[k] - cases[c][0]));
                assert_int_equal(l, l2[k]);
            }
        }
    }
    assert_int_equal(kvf_ssd_chunks(0, 10, 0, st, len, 8), -1);
    assert_int_equal(kvf_ssd_chunks(-1, 10, 4, st, len, 8), -1);
    assert_int_equal(kvf_ssd_chunks(0, -1, 4, st, len, 8), -1);
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
    const int grids[] = {1, 7, 32, 64, 256};
    uint16_t n1[SN], n2[SN];
    void *a = (sdt == KVF_DTYPE_FP32) ? (void *)s1 : (void *)n1;
    void *b = (sdt == KVF_DTYPE_FP32) ? (void *)s2 : (void *)n2;

    inputs_init(&in, 11);
    for (size_t gi = 0; gi < sizeof(grids) / sizeof(grids[0]); ++gi) {
        float maxd = 0.0f;
        assert_int_equal(serial(&in, 0, 90, a, sdt, 0, y1), KVF_KERN_OK);
        assert_int_equal(serial(&in, 90, T - 90, a, sdt, 1, y1), KVF_KERN_OK);
        assert_int_equal(chunked(&in, 0, 90, grids[gi], b, sdt, 0, y2), KVF_KERN_OK);
        assert_int_equal(chunked(&in, 90, T - 90, grids[gi], b, sdt, 1, y2), KVF_KERN_OK);
        for (int t = 0; t < T; ++t) {
            for (int i = 0; i < H * P; ++i) {
                float d = rel(y2[t * LDY + i], y1[t * LDY + i]);
                maxd = (d > maxd) ? d : maxd;
            }
        }
        for (int i = 0; i < SN; ++i) {
            float u = (sdt == KVF_DTYPE_FP32) ? s1[i] : kvf_dtype_load(n1, sdt, (size_t)i);
            float v = (sdt == KVF_DTYPE_FP32) ? s2[i] : kvf_dtype_load(n2, sdt, (size_t)i);
            float d = rel(v, u);
            maxd = (d > maxd) ? d : maxd;
        }
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
    const int cuts[][4] = {{16, 0}, {32, 0}, {48, 96}, {16, 32}, {144, 0}, {64, 128}};

    inputs_init(&in, 5);
    memset(y1, 0, sizeof(y1));
    assert_int_equal(chunked(&in, 0, T, GRID, st1, sdt, 0, y1), KVF_KERN_OK);
    for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); ++c) {
        int at[4] = {0}, n = 0;
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
            assert_memory_equal(y1 + t * LDY, y2 + t * LDY, H * P * sizeof(float));
        }
        assert_memory_equal(st1, st2, sbytes);
    }
    /* off the grid (a cut at 40): not the same operations, the same values within rounding */
    memset(st2, 0, sizeof(st2));
    assert_int_equal(chunked(&in, 0, 40, GRID, st2, sdt, 0, y2), KVF_KERN_OK);
    assert_int_equal(chunked(&in, 40, T - 40, GRID, st2, sdt, 1, y2), KVF_KERN_OK);
    int differ = 0;
    for (int t = 0; t < T; ++t) {
        for (int i = 0; i < H * P; ++i) {
            assert_true(rel(y2[t * LDY + i], y1[t * LDY + i]) <
                        ((sdt == KVF_DTYPE_FP32) ? 1e-5f : 3e-2f));
            differ += memcmp(&y2[t * LDY + i], &y1[t * LDY + i], sizeof(float)) != 0;
        }
    }
    assert_true(differ > 0); /* the grid is what makes the cuts above bitwise equal */
    /* the decode step continues from the chunked scan's state: T - 1 tokens chunked, then
     * one step, gives the whole chunked call's last output and state within rounding */
    {
        const float *x = in.xbc + (size_t)(T - 1) * LDXBC;
        const float tol = (sdt == KVF_DTYPE_FP32) ? 1e-5f : 3e-2f;
        float ys[H * P];
        assert_int_equal(chunked(&in, 0, T - 1, GRID, st2, sdt, 0, y2), KVF_KERN_OK);
        assert_int_equal(kvf_mamba2_step(NULL, &in.p, x, in.dt + (T - 1) * LDDT, x + H * P,
                                         x + H * P + G * N, st2, sdt, ys), KVF_KERN_OK);
        for (int i = 0; i < H * P; ++i) {
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

/* The scratch a call takes (what the CUDA launcher allocates from the arena) against the
 * worst case the workspace is sized by (pos0 < 0): never above it, reached by some pos0,
 * and the formula's value for one case worked by hand. */
static void test_scratch_bytes(void **state)
{
    const kvf_mamba2_params_t p = {.heads = 4, .head_dim = 8, .groups = 2, .state_size = 16};
    const int Ts[] = {1, 7, 64, 100, 1000, 5000}, grids[] = {1, 16, 64, 256};

    (void)state;
    for (size_t i = 0; i < sizeof(Ts) / sizeof(Ts[0]); ++i) {
        for (size_t j = 0; j < sizeof(grids) / sizeof(grids[0]); ++j) {
            const int nt = Ts[i], grid = grids[j];
            const size_t worst = kvf_ssd_scratch_bytes(&p, nt, -1, grid);
            size_t most = 0;
            for (long long pos0 = 0; pos0 <= grid; ++pos0) {
                const size_t b = kvf_ssd_scratch_bytes(&p, nt, pos0, grid);
                assert_true(b > 0);
                assert_true(b <= worst);
                most = (b > most) ? b : most;
            }
            assert_int_equal(most, worst);
        }
    }
    /* T 100 from position 10 on grid 64: chunks [10,64) [64,110) -> W 2;
     * 4 * (2*4*100 + 2*2*64*64 + 3*4*8*16) = 4 * (800 + 16384 + 1536) */
    assert_int_equal(kvf_ssd_scratch_bytes(&p, 100, 10, 64), 4u * (800 + 16384 + 1536));
    assert_int_equal(kvf_ssd_scratch_bytes(&p, 0, 0, 64), 0);
    assert_int_equal(kvf_ssd_scratch_bytes(&p, 10, 0, 0), 0);
    assert_int_equal(kvf_ssd_scratch_bytes(NULL, 10, 0, 16), 0);
}

static void test_refused(void **state)
{
    static inputs_t in;
    static float y[T * LDY];
    float st[SN];

    (void)state;
    inputs_init(&in, 3);
    assert_int_equal(chunked(&in, 0, 8, 0, st, KVF_DTYPE_FP32, 0, y), KVF_KERN_EINVAL);
    assert_int_equal(chunked(&in, 0, 8, KVF_SSD_MAX_GRID + 1, st, KVF_DTYPE_FP32, 0, y),
                     KVF_KERN_EINVAL);
    assert_int_equal(kvf_mamba2_scan_chunked(NULL, &in.p, 8, -1, 16, in.xbc, LDXBC, in.dt,
                                             LDDT, in.xbc + H * P, in.xbc + H * P + G * N,
                                             LDXBC, st, KVF_DTYPE_FP32, 0, y, LDY),
                     KVF_KERN_EINVAL);
    assert_int_equal(kvf_mamba2_scan_chunked(NULL, &in.p, 8, 0, 16, in.xbc, H * P - 1, in.dt,
                                             LDDT, in.xbc + H * P, in.xbc + H * P + G * N,
                                             LDXBC, st, KVF_DTYPE_FP32, 0, y, LDY),
                     KVF_KERN_EINVAL);
    assert_int_equal(chunked(&in, 0, 0, 16, st, KVF_DTYPE_FP32, 0, y), KVF_KERN_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunks),         cmocka_unit_test(test_vs_serial_fp32),
        cmocka_unit_test(test_vs_serial_bf16), cmocka_unit_test(test_grid_cuts_fp32),
        cmocka_unit_test(test_grid_cuts_bf16), cmocka_unit_test(test_grid_cuts_fp16),
        cmocka_unit_test(test_refused),        cmocka_unit_test(test_scratch_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
