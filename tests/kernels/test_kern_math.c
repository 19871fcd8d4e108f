/*
 * The shared CPU/CUDA kernel bodies (kernels/kvf_*_math.h) checked directly:
 * the arithmetic a GPU thread runs is the arithmetic tested here.
 * dtype conversions bit for bit against base, the dt clamp, the
 * gated-norm edge cases, the attention fold's masking, the conv tap sum,
 * the activations, MoE routing; and the CPU entry points built on them
 * (kvf_act, kvf_convert, kvf_moe_route).
 */
#include "kvf_act.h"
#include "kvf_act_math.h"
#include "kvf_argmax.h"
#include "kvf_argmax_math.h"
#include "kvf_attention_math.h"
#include "kvf_conv1d.h"
#include "kvf_dtype_math.h"
#include "kvf_kern_test.h"
#include "kvf_mamba2.h"
#include "kvf_moe.h"
#include "kvf_moe_math.h"
#include "kvf_norm_math.h"
#include "kvf_ssm_math.h"
#include "kvf_ssm_seqs.h"

#include <string.h>

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* every 16-bit and 8-bit code, and a sweep of fp32 patterns, equal to base */
static void test_dtype_bits_equal_base(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536u; ++h) {
        assert_int_equal(bits(kvf_hd_fp16_to_fp32((uint16_t)h)), bits(kvf_fp16_to_fp32((uint16_t)h)));
        assert_int_equal(bits(kvf_hd_bf16_to_fp32((uint16_t)h)), bits(kvf_bf16_to_fp32((uint16_t)h)));
    }
    for (uint32_t b = 0; b < 256u; ++b) {
        float a = kvf_hd_fp8_to_fp32((uint8_t)b), r = kvf_fp8_to_fp32((uint8_t)b);
        assert_true((isnan(a) && isnan(r)) || (bits(a) == bits(r)));
    }
    /* 2^32 / 1021 patterns (every exponent, both signs, NaN payloads) + ties */
    for (uint64_t u = 0; u < (1ull << 32); u += 1021u) {
        float f = from_bits((uint32_t)u);
        assert_int_equal(kvf_hd_fp32_to_fp16(f), kvf_fp32_to_fp16(f));
        assert_int_equal(kvf_hd_fp32_to_bf16(f), kvf_fp32_to_bf16(f));
        assert_int_equal(kvf_hd_fp32_to_fp8(f), kvf_fp32_to_fp8(f));
    }
    static const float ties[] = {1.0625f, 1.1875f, 65520.0f, 65504.0f, 5.96046448e-8f,
                                 2.98023224e-8f, 448.0f, 464.0f, -0.0f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof(ties) / sizeof(ties[0]); ++i) {
        assert_int_equal(kvf_hd_fp32_to_fp16(ties[i]), kvf_fp32_to_fp16(ties[i]));
        assert_int_equal(kvf_hd_fp32_to_bf16(ties[i]), kvf_fp32_to_bf16(ties[i]));
        assert_int_equal(kvf_hd_fp32_to_fp8(ties[i]), kvf_fp32_to_fp8(ties[i]));
    }
    /* typed load/store */
    {
        uint16_t h[2];
        kvf_hd_store(h, KVF_HD_BF16, 1, 1.00390625f);   /* halfway 1 and 1+2^-7: even -> 1 */
        assert_true(kvf_hd_load(h, KVF_HD_BF16, 1) == 1.0f);
        kvf_hd_store(h, KVF_HD_FP16, 0, 70000.0f);      /* fp16 overflows to inf */
        assert_true(isinf(kvf_hd_load(h, KVF_HD_FP16, 0)));
        assert_true(kvf_hd_load(h, 99, 0) == 0.0f);     /* unknown dtype loads 0 */
    }
}

/* dt = clamp(softplus(raw + bias), dt_min, dt_max), torch threshold 20 */
static void test_mamba2_dt_clamp(void **state)
{
    (void)state;
    assert_true(kvf_mamba2_dt_hd(20.5f, 0.0f, 0.0f, INFINITY) == 20.5f);      /* > 20: v itself */
    assert_true(kvf_mamba2_dt_hd(19.0f, 1.0f, 0.0f, INFINITY) == log1pf(expf(20.0f)));
    assert_float_equal(kvf_mamba2_dt_hd(0.0f, 0.0f, 0.0f, INFINITY), logf(2.0f), 1e-7);
    assert_float_equal(kvf_mamba2_dt_hd(1.0f, -1.5f, 0.0f, INFINITY), log1pf(expf(-0.5f)), 1e-7);
    assert_true(kvf_mamba2_dt_hd(-100.0f, 0.0f, 1e-3f, INFINITY) == 1e-3f);   /* dt_min */
    assert_true(kvf_mamba2_dt_hd(100.0f, 0.0f, 0.0f, 5.0f) == 5.0f);          /* dt_max */
    assert_true(kvf_mamba2_dt_hd(1e30f, 0.0f, 0.0f, INFINITY) == 1e30f);      /* no overflow */
    assert_true(kvf_mamba2_dt_hd(-200.0f, 0.0f, 0.0f, INFINITY) == 0.0f);     /* exp underflows */
    assert_true(isnan(kvf_mamba2_dt_hd(NAN, 0.0f, 1e-3f, 5.0f)));             /* NaN not clamped */
    assert_true(kvf_mamba2_dt_hd(3.0f, 0.0f, 2.0f, 2.0f) == 2.0f);            /* min == max */
    /* A and the decay */
    assert_true(kvf_mamba2_A_hd(0.0f) == -1.0f);
    assert_true(kvf_mamba2_dA_hd(0.0f, -3.0f) == 1.0f);
    assert_true(kvf_mamba2_dA_hd(INFINITY, -1.0f) == 0.0f);
}

static void test_mamba2_row(void **state)
{
    float S[3] = {1.0f, 2.0f, -1.0f};
    const float B[3] = {1.0f, 0.0f, 2.0f}, C[3] = {1.0f, 1.0f, 1.0f};
    (void)state;
    /* S = 0.5 S + 2 B = {2.5, 1, 3.5}; y = sum S*C = 7 */
    assert_true(kvf_mamba2_row_hd(S, 3, 0.5f, 2.0f, B, C) == 7.0f);
    assert_true(S[0] == 2.5f && S[1] == 1.0f && S[2] == 3.5f);
    /* dA 0 forgets the state */
    assert_true(kvf_mamba2_row_hd(S, 3, 0.0f, 1.0f, B, C) == 3.0f);
    assert_true(S[0] == 1.0f && S[1] == 0.0f && S[2] == 2.0f);
    assert_true(kvf_mamba2_out_hd(3.0f, 0.5f, 4.0f) == 5.0f);
    /* the strided row (the CUDA scan's interleaved scratch) has the contiguous row's bits,
     * state and output, over many tokens of awkward values */
    {
        enum { NS = 37, STRIDE = 5 };
        float a[NS], b[NS * STRIDE], Bv[NS], Cv[NS];
        uint32_t r = 7u;
        for (int n = 0; n < NS; ++n) {
            r = r * 1664525u + 1013904223u;
            a[n] = b[n * STRIDE] = (float)(r >> 8) / 1677721.6f - 5.0f;
            r = r * 1664525u + 1013904223u;
            Bv[n] = (float)(r >> 8) / 16777216.0f - 0.3f;
            Cv[n] = 1.0f / (float)(n + 3);
        }
        for (int t = 0; t < 50; ++t) {
            float dA = 0.9f + 0.001f * (float)t, dtx = 0.37f - 0.01f * (float)t;
            float ya = kvf_mamba2_row_hd(a, NS, dA, dtx, Bv, Cv);
            float yb = kvf_mamba2_row_strided_hd(b, STRIDE, NS, dA, dtx, Bv, Cv);
            assert_int_equal(bits(ya), bits(yb));
        }
        for (int n = 0; n < NS; ++n) {
            assert_int_equal(bits(a[n]), bits(b[n * STRIDE]));
        }
    }
}

static void test_conv_tap_sum(void **state)
{
    const float filt[4] = {1.0f, -1.0f, 0.5f, 2.0f}, win[4] = {1.0f, 2.0f, 4.0f, -1.0f};
    (void)state;
    /* 0.25 + 1 - 2 + 2 - 2 = -0.75 */
    assert_true(kvf_conv_tap_sum(filt, win, 4, 0.25f, 0) == -0.75f);
    assert_true(kvf_conv_tap_sum(filt, win, 4, 0.25f, 1) == -0.75f / (1.0f + expf(0.75f)));
    assert_true(kvf_conv_tap_sum(filt, win, 1, 0.0f, 0) == 1.0f);   /* only the first tap */
}

/* kvf_hd_round is a store and a load without the memory, in every dtype */
static void test_hd_round(void **state)
{
    (void)state;
    for (uint64_t u = 0; u < (1ull << 32); u += 4093u) {
        float f = from_bits((uint32_t)u);
        uint16_t h;
        uint8_t b;
        kvf_hd_store(&h, KVF_HD_BF16, 0, f);
        assert_int_equal(bits(kvf_hd_round(f, KVF_HD_BF16)), bits(kvf_hd_load(&h, KVF_HD_BF16, 0)));
        kvf_hd_store(&h, KVF_HD_FP16, 0, f);
        assert_int_equal(bits(kvf_hd_round(f, KVF_HD_FP16)), bits(kvf_hd_load(&h, KVF_HD_FP16, 0)));
        kvf_hd_store(&b, KVF_HD_FP8, 0, f);
        assert_int_equal(bits(kvf_hd_round(f, KVF_HD_FP8)), bits(kvf_hd_load(&b, KVF_HD_FP8, 0)));
        assert_int_equal(bits(kvf_hd_round(f, KVF_HD_FP32)), bits(f));
        assert_int_equal(bits(kvf_hd_round(f, 99)), bits(f));   /* unknown code: unchanged */
    }
    assert_true(kvf_hd_round(1.00390625f, KVF_HD_BF16) == 1.0f);   /* tie to even */
    assert_true(kvf_hd_round(1.0f + 0x1p-10f, KVF_HD_FP16) == 1.0f + 0x1p-10f);
    assert_true(kvf_hd_round(1.0f + 0x1p-10f, KVF_HD_BF16) == 1.0f);
    assert_true(isinf(kvf_hd_round(70000.0f, KVF_HD_FP16)));
}

static const kvf_dtype_t state_dtypes[] = {KVF_DTYPE_FP32, KVF_DTYPE_BF16, KVF_DTYPE_FP16};

/*
 * The CUDA conv chunk kernel's body (kvf_conv_chunk_channel_hd, one channel a thread), run
 * here over every channel, against the CPU kernel: y and the stored state bit for bit, a
 * fresh chunk, a continued chunk shorter than the history and a longer one, in fp32, bf16
 * and fp16 state. With a narrow state the history taps read the rounded inputs inside the
 * chunk (batch invariance); the same body without the rounding (fp32 rule on the narrow
 * state) gives other y, so the comparison sees the rule.
 */
static void test_conv_chunk_body(void **state)
{
    enum { CH = 37, KW = 4, TAPS = KW - 1, T = 13, LDX = 41 };
    kvf_test_rng_t r = {0x5eed1234u};
    float x[T * LDX], w[CH * KW], b[CH], yc[T * CH], yb[T * CH], win[KVF_CONV_KERNEL_MAX];
    float sc[CH * TAPS], sb[CH * TAPS];   /* states, room for fp32 */
    (void)state;

    kvf_test_fill(&r, x, T * LDX, -3.0f, 3.0f);
    kvf_test_fill(&r, w, CH * KW, -1.0f, 1.0f);
    kvf_test_fill(&r, b, CH, -1.0f, 1.0f);
    for (size_t k = 0; k < sizeof(state_dtypes) / sizeof(state_dtypes[0]); ++k) {
        const kvf_dtype_t dt = state_dtypes[k];
        const size_t sbytes = (size_t)CH * TAPS * kvf_dtype_size(dt);
        memset(sc, 0x7f, sizeof(sc));   /* stale bytes: a fresh chunk must not read them */
        memset(sb, 0x7f, sizeof(sb));
        for (int step = 0; step < 3; ++step) {
            const int n = (step == 0) ? T : (step == 1) ? 2 : 7, has = (step > 0);
            const float *xs = x + (size_t)step * LDX;
            assert_int_equal(kvf_conv1d_chunk(NULL, xs, LDX, n, CH, KW, w, b, 1, sc, dt, has,
                                              yc, CH),
                             KVF_KERN_OK);
            for (size_t c = 0; c < CH; ++c) {
                for (size_t i = 0; i < TAPS; ++i) {
                    win[i] = has ? kvf_hd_load(sb, (int)dt, c * TAPS + i) : 0.0f;
                }
                kvf_conv_chunk_channel_hd(w + c * KW, win, KW, b[c], 1, xs + c, LDX, (size_t)n,
                                          yb + c, CH, (int)dt);
                for (size_t i = 0; i < TAPS; ++i) {
                    kvf_hd_store(sb, (int)dt, c * TAPS + i, win[i]);
                }
            }
            for (size_t i = 0; i < (size_t)n * CH; ++i) {
                if (bits(yb[i]) != bits(yc[i])) {
                    fail_msg("conv %s step %d: y[%zu] %.9g, CPU %.9g", kvf_dtype_name(dt), step,
                             i, (double)yb[i], (double)yc[i]);
                }
            }
            assert_memory_equal(sb, sc, sbytes);
        }
        if (dt != KVF_DTYPE_FP32) {
            int differ = 0;
            for (size_t c = 0; c < CH; ++c) {
                memset(win, 0, sizeof(win));
                kvf_conv_chunk_channel_hd(w + c * KW, win, KW, b[c], 1, x + c, LDX, T, yb + c, CH,
                                          KVF_HD_FP32);
            }
            assert_int_equal(kvf_conv1d_chunk(NULL, x, LDX, T, CH, KW, w, b, 1, sc, dt, 0, yc,
                                              CH),
                             KVF_KERN_OK);
            for (size_t i = 0; i < (size_t)T * CH; ++i) {
                differ += (bits(yb[i]) != bits(yc[i]));
            }
            assert_true(differ > 0);
        }
    }
}

/*
 * The CUDA conv chunk kernel's token-parallel body (kvf_conv_chunk_token_hd, one (token,
 * channel) a thread, every output from the state as it was before the chunk; then
 * kvf_conv_chunk_tail_hd, one channel a thread, the new history), run here over every
 * (token, channel) in reverse order (any order must do), against the CPU kernel: y and
 * the stored state bit for bit over fresh and continued chunks, chunks shorter than the
 * history, kernel widths 2 to 6, fp32, bf16 and fp16 state.
 */
static void test_conv_chunk_token_body(void **state)
{
    enum { CH = 29, T = 11, LDX = 33, KMAX = 6 };
    kvf_test_rng_t r = {0x70c3a11u};
    float x[4 * T * LDX], w[CH * KMAX], b[CH], yc[T * CH], yb[T * CH];
    float sc[CH * (KMAX - 1)], sb[CH * (KMAX - 1)];
    (void)state;

    kvf_test_fill(&r, x, 4 * T * LDX, -3.0f, 3.0f);
    kvf_test_fill(&r, w, CH * KMAX, -1.0f, 1.0f);
    kvf_test_fill(&r, b, CH, -1.0f, 1.0f);
    for (int kw = 2; kw <= KMAX; ++kw) {
        const int taps = kw - 1;
        for (size_t k = 0; k < sizeof(state_dtypes) / sizeof(state_dtypes[0]); ++k) {
            const kvf_dtype_t dt = state_dtypes[k];
            const size_t sbytes = (size_t)CH * (size_t)taps * kvf_dtype_size(dt);
            memset(sc, 0x7f, sizeof(sc));   /* stale bytes: a fresh chunk must not read them */
            memset(sb, 0x7f, sizeof(sb));
            for (int step = 0; step < 4; ++step) {
                const int n = (step == 0) ? T : (step == 1) ? 1 : (step == 2) ? taps + 1 : 2;
                const int has = (step > 0);
                const float *xs = x + (size_t)step * T * LDX;
                assert_int_equal(kvf_conv1d_chunk(NULL, xs, LDX, n, CH, kw, w, b, 1, sc, dt, has,
                                                  yc, CH),
                                 KVF_KERN_OK);
                for (size_t i = (size_t)n * CH; i-- > 0;) {
                    const size_t t = i / CH, c = i % CH;
                    yb[t * CH + c] = kvf_conv_chunk_token_hd(w + c * (size_t)kw, kw, b[c], 1,
                                                             xs + c, LDX, t, sb, c, has, (int)dt);
                }
                for (size_t c = 0; c < CH; ++c) {
                    kvf_conv_chunk_tail_hd(xs + c, LDX, (size_t)n, sb, c, taps, has, (int)dt);
                }
                for (size_t i = 0; i < (size_t)n * CH; ++i) {
                    if (bits(yb[i]) != bits(yc[i])) {
                        fail_msg("conv kernel %d %s step %d: y[%zu] %.9g, CPU %.9g", kw,
                                 kvf_dtype_name(dt), step, i, (double)yb[i], (double)yc[i]);
                    }
                }
                assert_memory_equal(sb, sc, sbytes);
            }
        }
    }
}

/*
 * The CUDA scan kernel's body (kvf_mamba2_row_scan_hd, one (head, head-dim) row a thread,
 * rows interleaved in the scratch as on the GPU), run here over every row, against the CPU
 * scan: y and the stored state bit for bit, fresh and continued chunks and a one-token
 * chunk, in fp32, bf16 and fp16 state. A narrow state rounds after every token (as the
 * decode step stores it); the body without that rounding gives other y.
 */
static void test_mamba2_scan_body(void **state)
{
    enum { H = 4, P = 8, G = 2, N = 16, T = 20, HP = H * P, BC = G * N };
    kvf_test_rng_t r = {0x5eed4321u};
    float x[T * HP], dtr[T * H], B[T * BC], C[T * BC], dtb[H], al[H], D[H];
    float yc[T * HP], yb[T * HP], S[HP * N], sc[HP * N], sb[HP * N];
    const kvf_mamba2_params_t p = {H, P, G, N, dtb, al, D, 1e-3f, 8.0f};
    (void)state;

    kvf_test_fill(&r, x, T * HP, -2.0f, 2.0f);
    kvf_test_fill(&r, dtr, T * H, -6.0f, 6.0f);
    kvf_test_fill(&r, B, T * BC, -1.0f, 1.0f);
    kvf_test_fill(&r, C, T * BC, -1.0f, 1.0f);
    kvf_test_fill(&r, dtb, H, -1.0f, 1.0f);
    kvf_test_fill(&r, al, H, -2.0f, 1.0f);
    kvf_test_fill(&r, D, H, -1.0f, 1.0f);
    for (size_t k = 0; k < sizeof(state_dtypes) / sizeof(state_dtypes[0]); ++k) {
        const kvf_dtype_t dt = state_dtypes[k];
        const size_t sbytes = (size_t)HP * N * kvf_dtype_size(dt);
        memset(sc, 0xff, sizeof(sc));   /* NaN bytes: a fresh scan must not read them */
        memset(sb, 0xff, sizeof(sb));
        for (int step = 0; step < 4; ++step) {
            const int n = (step == 0) ? T : (step == 1) ? 3 : (step == 2) ? 1 : 9;
            const int has = (step > 0);
            const int rough = (step == 3) && (dt != KVF_DTYPE_FP32);   /* rounding left out */
            assert_int_equal(kvf_mamba2_scan(NULL, &p, n, x, HP, dtr, H, B, C, BC, sc, dt, has,
                                             yc, HP),
                             KVF_KERN_OK);
            for (size_t i = 0; i < HP; ++i) {
                const size_t h = i / P, d = i % P, g = h / (H / G);
                for (size_t e = 0; e < N; ++e) {
                    S[e * HP + i] = has ? kvf_hd_load(sb, (int)dt, i * N + e) : 0.0f;
                }
                kvf_mamba2_row_scan_hd(S + i, HP, N, (size_t)n, dtr + h, H, dtb[h], p.dt_min,
                                       p.dt_max, kvf_mamba2_A_hd(al[h]), D[h], x + h * P + d,
                                       HP, B + g * N, C + g * N, BC, yb + h * P + d, HP,
                                       rough ? KVF_HD_FP32 : (int)dt);
                for (size_t e = 0; e < N; ++e) {
                    kvf_hd_store(sb, (int)dt, i * N + e, S[e * HP + i]);
                }
            }
            int differ = 0;
            for (size_t i = 0; i < (size_t)n * HP; ++i) {
                differ += (bits(yb[i]) != bits(yc[i]));
                if (!rough && (bits(yb[i]) != bits(yc[i]))) {
                    fail_msg("scan %s step %d: y[%zu] %.9g, CPU %.9g", kvf_dtype_name(dt), step,
                             i, (double)yb[i], (double)yc[i]);
                }
            }
            if (rough) {
                assert_true(differ > 0);
            } else {
                assert_memory_equal(sb, sc, sbytes);
            }
        }
    }
}

/*
 * The batched CUDA decode step's body (kvf_ssm_seqs_cuda.cu: one (request, head, head-dim)
 * row a thread, each state row updated in place, a narrow one element by element through
 * kvf_mamba2_row_state_hd), run here over every row of 3 requests, against the per-request
 * CPU path of kvf_ssm_decode_seqs (the unbatched arithmetic; test_mamba2_scan_body has the
 * one-request CUDA body equal to it): y and the stored states bit for bit, fp32, bf16 and
 * fp16 states, with per-request dt clamps, over 3 tokens.
 */
static void test_mamba2_decode_seqs_body(void **state)
{
    enum { S = 3, H = 4, P = 8, G = 2, N = 16, HP = H * P, BC = G * N, CD = HP + 2 * BC,
           K = 4, R = HP + CD + H };
    kvf_test_rng_t r = {0x5eed7777u};
    float xin[S * R], cw[CD * K], cb[CD], dtb[H], al[H], D[H], xc[S * CD];
    float yc[S * HP], yb[S * HP], conv[S][CD * (K - 1)];
    float dmin[S] = {0.0f, 1e-3f, 0.0f}, dmax[S] = {INFINITY, 8.0f, 0.5f};
    uint8_t sc[S][HP * N * 4], sb[S][HP * N * 4];
    const int rows[S] = {2, 0, 1};
    const kvf_mamba2_params_t p = {H, P, G, N, dtb, al, D, 0.0f, INFINITY};
    (void)state;

    kvf_test_fill(&r, cw, CD * K, -0.5f, 0.5f);
    kvf_test_fill(&r, cb, CD, -0.2f, 0.2f);
    kvf_test_fill(&r, dtb, H, -1.0f, 1.0f);
    kvf_test_fill(&r, al, H, -2.0f, 1.0f);
    kvf_test_fill(&r, D, H, -1.0f, 1.0f);
    for (size_t k = 0; k < sizeof(state_dtypes) / sizeof(state_dtypes[0]); ++k) {
        const kvf_dtype_t dt = state_dtypes[k];
        const size_t sbytes = (size_t)HP * N * kvf_dtype_size(dt);
        void *convp[S], *ssmc[S];
        for (int q = 0; q < S; ++q) {
            float init[HP * N];
            kvf_test_fill(&r, init, HP * N, -1.0f, 1.0f);
            for (size_t e = 0; e < (size_t)HP * N; ++e) {
                kvf_hd_store(sc[q], (int)dt, e, init[e]);
            }
            memcpy(sb[q], sc[q], sbytes);
            memset(conv[q], 0, sizeof(conv[q]));
            convp[q] = conv[q];
            ssmc[q] = sc[q];
        }
        const kvf_ssm_seqs_t qs = {.num_seqs = S, .rows = rows, .conv_states = convp,
                                   .ssm_states = ssmc, .dt_min = dmin, .dt_max = dmax};
        for (int tok = 0; tok < 3; ++tok) {
            kvf_test_fill(&r, xin, S * R, -2.0f, 2.0f);
            assert_int_equal(kvf_ssm_decode_seqs(NULL, &qs, xin + HP, R, CD, K, cw, cb,
                                                 KVF_DTYPE_FP32, xc, CD, &p, xin + HP + CD, R,
                                                 dt, yc, HP),
                             KVF_KERN_OK);
            for (int q = 0; q < S; ++q) {   /* the kernel's rows, on the CPU's conv output */
                const size_t rr = (size_t)rows[q];
                const float *xr = xc + rr * CD;
                for (size_t j = 0; j < HP; ++j) {
                    const size_t h = j / P, g = h / (H / G);
                    float dth = kvf_mamba2_dt_hd(xin[rr * R + HP + CD + h], dtb[h], dmin[q],
                                                 dmax[q]);
                    float dA = kvf_mamba2_dA_hd(dth, kvf_mamba2_A_hd(al[h]));
                    float acc = kvf_mamba2_row_state_hd(sb[q], (int)dt, j * N, N, dA,
                                                        dth * xr[j], xr + HP + g * N,
                                                        xr + HP + BC + g * N);
                    yb[rr * HP + j] = kvf_mamba2_out_hd(acc, D[h], xr[j]);
                }
            }
            for (size_t i = 0; i < (size_t)S * HP; ++i) {
                if (bits(yb[i]) != bits(yc[i])) {
                    fail_msg("decode seqs %s token %d: y[%zu] %.9g, per request %.9g",
                             kvf_dtype_name(dt), tok, i, (double)yb[i], (double)yc[i]);
                }
            }
            for (int q = 0; q < S; ++q) {
                assert_memory_equal(sb[q], sc[q], sbytes);
            }
        }
    }
}

/* gated RMSNorm: the gate, the inverse RMS and their edge cases */
static void test_gated_norm_edges(void **state)
{
    (void)state;
    assert_true(kvf_norm_gate_hd(3.0f, 0.0f) == 0.0f);                 /* silu(0) = 0 */
    assert_true(kvf_norm_gate_hd(2.0f, 100.0f) == 200.0f);             /* silu(z) = z for big z */
    float g = kvf_norm_gate_hd(2.0f, -100.0f);                         /* exp(100) = inf: -0 */
    assert_true((g == 0.0f) && !isnan(g));
    assert_true(isnan(kvf_norm_gate_hd(2.0f, -INFINITY)));             /* -inf / inf, as torch */
    assert_true(isnan(kvf_norm_gate_hd(2.0f, NAN)));
    assert_float_equal(kvf_norm_gate_hd(1.0f, 1.0f), 1.0f / (1.0f + expf(-1.0f)), 1e-7);
    /* inverse RMS in double: sumsq 4 over 1 element -> 1/2 */
    assert_true(kvf_norm_inv_hd(4.0, 1.0, 0.0f) == 0.5f);
    assert_true(kvf_norm_inv_hd(8.0, 2.0, 0.0f) == 0.5f);
    /* an all-zero group (z = 0 everywhere) with eps > 0 gives y = 0, not NaN */
    float inv = kvf_norm_inv_hd(0.0, 64.0, 1e-5f);
    assert_true(isfinite(inv));
    assert_true(kvf_norm_scale_hd(0.0f, inv, 1.5f) == 0.0f);
    /* ... and with eps = 0 it is 0 * inf = NaN: eps must be > 0 for gated groups */
    assert_true(isinf(kvf_norm_inv_hd(0.0, 64.0, 0.0f)));
    assert_true(isnan(kvf_norm_scale_hd(0.0f, kvf_norm_inv_hd(0.0, 64.0, 0.0f), 1.0f)));
    /* the norm divisor: the FULL group (TP split) */
    assert_true(kvf_norm_inv_hd(16.0, 4.0, 0.0f) == 0.5f);
    assert_true(kvf_norm_sq_hd(3.0f) == 9.0);
    assert_true(isfinite(kvf_norm_sq_hd(1e30f)) && (kvf_norm_sq_hd(1e30f) > 1e59)); /* no fp32 overflow */
}

/* the fold: masking selects 0, masked stale NaN still poisons, online = one shot */
static void test_attn_fold(void **state)
{
    enum { HD = 2, KBS = 4 };
    const float q[HD] = {1.0f, 0.0f};
    float k[KBS * HD] = {1, 0, 2, 0, 0, 0, 100, 0};   /* slot 3: a huge masked score */
    float v[KBS * HD] = {1, 10, 3, 20, 5, 30, NAN, NAN};
    float s[KBS], acc[HD] = {0, 0}, m = -INFINITY, l = 0.0f, o[HD];
    (void)state;

    /* limit 1: slots 0, 1 unmasked; slot 3's NaN V enters as 0 * NaN */
    kvf_attn_fold_tile(q, k, v, KVF_HD_FP32, KBS, HD, 0, 0, 1, 1.0f, 0.0f, &m, &l, acc, s);
    assert_true(m == 2.0f);                         /* the max ignores the masked 100 */
    assert_true(isnan(acc[0]) && isnan(acc[1]));    /* the hazard kvf_blocks_zero fixes */

    /* zeroed V: the same fold is finite and the softmax of {1, 2} */
    v[6] = v[7] = 0.0f;
    m = -INFINITY;
    l = 0.0f;
    acc[0] = acc[1] = 0.0f;
    kvf_attn_fold_tile(q, k, v, KVF_HD_FP32, KBS, HD, 0, 0, 1, 1.0f, 0.0f, &m, &l, acc, s);
    kvf_attn_finish(acc, l, HD, o);
    double p0 = 1.0 / (1.0 + exp(1.0)), p1 = 1.0 - p0;
    assert_float_equal(o[0], p0 * 1 + p1 * 3, 1e-6);
    assert_float_equal(o[1], p0 * 10 + p1 * 20, 1e-5);

    /* every real score ~ -200 below a masked slot's 0: selection, not 0 * exp(200) = NaN */
    {
        float kk[KBS * HD] = {-200, 0, -201, 0, 0, 0, 0, 0}, vv[KBS * HD] = {1, 1, 1, 1, 0, 0, 0, 0};
        m = -INFINITY;
        l = 0.0f;
        acc[0] = acc[1] = 0.0f;
        kvf_attn_fold_tile(q, kk, vv, KVF_HD_FP32, KBS, HD, 0, 0, 1, 1.0f, 0.0f, &m, &l, acc, s);
        kvf_attn_finish(acc, l, HD, o);
        assert_float_equal(o[0], 1.0f, 1e-6);
        assert_float_equal(o[1], 1.0f, 1e-6);
    }

    /* two tiles of 2 folded online equal one tile of 4 (all unmasked) */
    {
        float k4[4 * HD] = {0.5f, 0, -1, 0, 3, 0, 1, 0}, v4[4 * HD] = {1, 2, 3, 4, 5, 6, 7, 8};
        float a1[HD] = {0, 0}, a2[HD] = {0, 0}, o1[HD], o2[HD];
        float m1 = -INFINITY, l1 = 0, m2 = -INFINITY, l2 = 0;
        kvf_attn_fold_tile(q, k4, v4, KVF_HD_FP32, 4, HD, 0, 0, 3, 0.7f, 0.0f, &m1, &l1, a1, s);
        kvf_attn_fold_tile(q, k4, v4, KVF_HD_FP32, 2, HD, 0, 0, 3, 0.7f, 0.0f, &m2, &l2, a2, s);
        kvf_attn_fold_tile(q, k4 + 2 * HD, v4 + 2 * HD, KVF_HD_FP32, 2, HD, 2, 0, 3, 0.7f, 0.0f,
                           &m2, &l2, a2, s);
        kvf_attn_finish(a1, l1, HD, o1);
        kvf_attn_finish(a2, l2, HD, o2);
        kvf_test_assert_close_f(o2, o1, HD, 1e-6, 1e-6, "online vs one-shot softmax");
    }
    /* a bf16 tile read through the dtype equals its fp32 conversion */
    {
        uint16_t kb[KBS * HD], vb[KBS * HD];
        float kf[KBS * HD], vf[KBS * HD], a1[HD] = {0, 0}, a2[HD] = {0, 0};
        float m1 = -INFINITY, l1 = 0, m2 = -INFINITY, l2 = 0;
        for (int i = 0; i < KBS * HD; ++i) {
            kb[i] = kvf_hd_fp32_to_bf16(0.3f * (float)i - 1.0f);
            vb[i] = kvf_hd_fp32_to_bf16(1.7f - 0.2f * (float)i);
            kf[i] = kvf_hd_bf16_to_fp32(kb[i]);
            vf[i] = kvf_hd_bf16_to_fp32(vb[i]);
        }
        kvf_attn_fold_tile(q, kb, vb, KVF_HD_BF16, KBS, HD, 0, 0, 2, 1.0f, 0.0f, &m1, &l1, a1, s);
        kvf_attn_fold_tile(q, kf, vf, KVF_HD_FP32, KBS, HD, 0, 0, 2, 1.0f, 0.0f, &m2, &l2, a2, s);
        assert_true((bits(a1[0]) == bits(a2[0])) && (bits(a1[1]) == bits(a2[1])) && (l1 == l2));
    }
}

/* A query in [-0.5, 0.5) and tiles of keys in [-2, 2) and values in [-0.5, 0.5) (n floats
 * each, k and v interleaved draws) from the LCG state *x. */
static void lcg_qkv(uint32_t *x, float *q, int hd, float *k, float *v, size_t n)
{
    for (int d = 0; d < hd; ++d) {
        *x = *x * 1664525u + 1013904223u;
        q[d] = (float)(*x >> 8) / 16777216.0f - 0.5f;
    }
    for (size_t i = 0; i < n; ++i) {
        *x = *x * 1664525u + 1013904223u;
        k[i] = 4.0f * ((float)(*x >> 8) / 16777216.0f - 0.5f);
        *x = *x * 1664525u + 1013904223u;
        v[i] = (float)(*x >> 8) / 16777216.0f - 0.5f;
    }
}

/* Split-K decode: the kernel blocks of one query folded in ranges (one empty) and merged
 * (kvf_attn_merge, the CUDA decode's merge) equal the one-range fold within fp32 rounding;
 * a stale NaN in a masked V slot of the last tile still poisons the merged output. */
static void test_attn_split_merge(void **state)
{
    enum { KBS = 8, HD = 16, TILES = 10, N = 4 };
    static const int bounds[N + 1] = {0, 3, 3, 7, TILES};   /* range 1 is empty */
    const int limit = (TILES - 1) * KBS + 2;                  /* 5 masked slots at the end */
    float q[HD], k[TILES][KBS * HD], v[TILES][KBS * HD], s[KBS];
    float one[HD], acc1[HD] = {0}, m1 = -INFINITY, l1 = 0.0f;
    float pm[N], pl[N], pacc[N][HD];
    uint32_t x = 12345u;

    (void)state;
    for (int round = 0; round < 2; ++round) {
        lcg_qkv(&x, q, HD, &k[0][0], &v[0][0], (size_t)TILES * KBS * HD);
        if (round == 1) {
            v[TILES - 1][(KBS - 1) * HD + 3] = NAN;   /* an unwritten, unzeroed slot */
        }
        memset(acc1, 0, sizeof(acc1));
        m1 = -INFINITY;
        l1 = 0.0f;
        for (int t = 0; t < TILES; ++t) {
            kvf_attn_fold_tile(q, k[t], v[t], KVF_HD_FP32, KBS, HD, t * KBS, 0, limit, 0.25f,
                               0.0f, &m1, &l1, acc1, s);
        }
        kvf_attn_finish(acc1, l1, HD, one);
        for (int r = 0; r < N; ++r) {
            pm[r] = -INFINITY;
            pl[r] = 0.0f;
            memset(pacc[r], 0, sizeof(pacc[r]));
            for (int t = bounds[r]; t < bounds[r + 1]; ++t) {
                kvf_attn_fold_tile(q, k[t], v[t], KVF_HD_FP32, KBS, HD, t * KBS, 0, limit, 0.25f,
                                   0.0f, &pm[r], &pl[r], pacc[r], s);
            }
        }
        for (int d = 0; d < HD; ++d) {
            float merged = kvf_attn_merge(pm, pl, &pacc[0][0], HD, N, (size_t)d, -INFINITY);
            if (round == 0) {
                assert_false(isnan(one[d]));
                assert_true(fabsf(merged - one[d]) <= 1e-5f * (1.0f + fabsf(one[d])));
            } else {
                assert_true(isnan(one[d]) == isnan(merged));
            }
        }
        if (round == 1) {
            assert_true(isnan(kvf_attn_merge(pm, pl, &pacc[0][0], HD, N, 3, -INFINITY)));
        }
        /* gpt-oss's attention sink, below the scores' max and far above it: the merge
         * with it is the one-range fold's acc * kvf_attn_sink_factor */
        for (int si = 0; (round == 0) && (si < 2); ++si) {
            const float sink = si ? m1 + 40.0f : m1 - 1.0f;
            const float f = kvf_attn_sink_factor(m1, l1, sink);
            assert_true((f > 0.0f) && (f < 1.0f / l1));
            for (int d = 0; d < HD; ++d) {
                const float want = acc1[d] * f;
                const float merged = kvf_attn_merge(pm, pl, &pacc[0][0], HD, N, (size_t)d, sink);
                assert_true(fabsf(merged - want) <= 1e-5f * fabsf(want) + 1e-30f);
            }
        }
    }
}

/* the engine's greedy scan (common/engine kvf_sample_token at temperature 0) */
static int32_t serial_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; ++i) {
        if (x[i] > x[best]) {
            best = i;
        }
    }
    return best;
}

/* The device argmax's reduction (threads striding over the row, then a tree merge, as
 * kvf_argmax_cuda.cu) and kvf_argmax_rows on the CPU pick the serial scan's index: ties,
 * NaNs anywhere (first element included), -0 and +0, all NaN, infinities. */
/* Split-K ranges follow the query alone (kvf_attn_split_per), and a launch with more ranges
 * than a query needs (another query of the batch is longer) merges its empty ones without
 * changing a bit: the CUDA attention's batch invariance, emulated here with the shared math
 * (kvf_attention_cuda.cu folds range y = [y * per, (y + 1) * per) clipped to nkb). */
static void test_attn_split_invariant(void **state)
{
    enum { KBS = 512, HD = 4, TILES = 9, GMAX = 7 };
    const int limit = (TILES - 1) * KBS + 100, nkb = limit / KBS + 1;
    const int per = kvf_attn_split_per(nkb, KBS), own = (nkb + per - 1) / per;
    static float k[TILES][KBS * HD], v[TILES][KBS * HD];
    float q[HD], s[KBS], pm[GMAX], pl[GMAX], pacc[GMAX][HD], first[HD];
    uint32_t x = 777u;

    (void)state;
    /* the rules: ranges of at least 2048 tokens, at most 64, every query within the grid */
    assert_int_equal(per, 4);
    assert_int_equal(own, 3);
    for (int kbs = 16; kbs <= 8192; kbs *= 4) {
        for (int n = 1; n <= 20000; n += 7) {
            int p = kvf_attn_split_per(n, kbs), c = (n + p - 1) / p;
            assert_true((p * kbs >= KVF_ATTN_SPLIT_TOKENS) || (p >= n));
            assert_true((c >= 1) && (c <= KVF_ATTN_SPLITS_MAX));
            assert_true(c <= kvf_attn_split_count(n, kbs));
            assert_true(c <= kvf_attn_split_count(n + 5000, kbs));
        }
    }
    lcg_qkv(&x, q, HD, &k[0][0], &v[0][0], (size_t)TILES * KBS * HD);
    for (int y = 0; y < GMAX; ++y) {
        int kb0 = y * per, kb1 = (kb0 + per < nkb) ? kb0 + per : nkb;
        pm[y] = -INFINITY;
        pl[y] = 0.0f;
        memset(pacc[y], 0, sizeof(pacc[y]));
        for (int t = kb0; t < kb1; ++t) {
            kvf_attn_fold_tile(q, k[t], v[t], KVF_HD_FP32, KBS, HD, t * KBS, 0, limit, 0.25f,
                               0.0f, &pm[y], &pl[y], pacc[y], s);
        }
    }
    for (int g = own; g <= GMAX; ++g) {        /* launches of own .. own + 4 ranges */
        for (int d = 0; d < HD; ++d) {
            float o = kvf_attn_merge(pm, pl, &pacc[0][0], HD, g, (size_t)d, -INFINITY);
            if (g == own) {
                first[d] = o;
                assert_false(isnan(o));
            }
            assert_true(bits(o) == bits(first[d]));
        }
    }
}

static void test_argmax(void **state)
{
    enum { N = 300, THREADS = 256, ROWS = 9 };
    float x[ROWS][N];
    int32_t got[ROWS];
    uint32_t r = 99u;

    (void)state;
    for (int row = 0; row < ROWS; ++row) {
        for (int i = 0; i < N; ++i) {
            r = r * 1664525u + 1013904223u;
            x[row][i] = (float)((r >> 8) % 7u) - 3.0f;   /* many ties */
        }
    }
    x[1][0] = NAN;                    /* NaN first: 0 */
    x[2][5] = NAN;                    /* NaN elsewhere: skipped */
    x[2][200] = INFINITY;
    for (int i = 0; i < N; ++i) {
        x[3][i] = NAN;                /* all NaN: 0 */
        x[4][i] = (i % 2) ? -0.0f : 0.0f;
        x[5][i] = -INFINITY;
    }
    x[6][N - 1] = 100.0f;             /* the max in the last column */
    x[7][0] = 100.0f;
    x[7][N - 1] = 100.0f;             /* tie at both ends: 0 */
    x[8][3] = NAN;
    x[8][0] = -5.0f;
    assert_int_equal(kvf_argmax_rows(NULL, &x[0][0], ROWS, N, N, got), KVF_KERN_OK);
    for (int row = 0; row < ROWS; ++row) {
        kvf_argmax_cand_t part[THREADS];
        for (int t = 0; t < THREADS; ++t) {
            part[t] = (kvf_argmax_cand_t){0.0f, -1};
            for (int i = t; i < N; i += THREADS) {
                part[t] = kvf_argmax_take(part[t], x[row][i], i);
            }
        }
        for (int stride = THREADS / 2; stride > 0; stride /= 2) {
            for (int t = 0; t < stride; ++t) {
                part[t] = kvf_argmax_merge(part[t], part[t + stride]);
            }
        }
        int32_t want = serial_argmax(x[row], N);
        assert_int_equal(kvf_argmax_result(part[0], x[row][0]), want);
        assert_int_equal(got[row], want);
    }
    assert_int_equal(got[1], 0);
    assert_int_equal(got[2], 200);
    assert_int_equal(got[3], 0);
    assert_int_equal(got[6], N - 1);
    assert_int_equal(got[7], 0);
    /* strided rows, refusals, no-op */
    assert_int_equal(kvf_argmax_rows(NULL, &x[6][0], 2, N - 1, N, got), KVF_KERN_OK);
    assert_int_equal(got[0], serial_argmax(x[6], N - 1));
    assert_int_equal(got[1], 0);
    assert_int_equal(kvf_argmax_rows(NULL, &x[0][0], 1, N, N - 1, got), KVF_KERN_EINVAL);
    assert_int_equal(kvf_argmax_rows(NULL, &x[0][0], 1, 0, N, got), KVF_KERN_EINVAL);
    assert_int_equal(kvf_argmax_rows(NULL, NULL, 1, N, N, got), KVF_KERN_EINVAL);
    assert_int_equal(kvf_argmax_rows(NULL, NULL, 0, N, N, NULL), KVF_KERN_OK);
}

static void test_attn_offsets(void **state)
{
    const int32_t table[3] = {7, 2, 5};
    (void)state;
    /* pos 40, block 32, kbs 16: logical block 1 -> block 2, kernel block 0; slots 3, slot 1 */
    assert_int_equal(kvf_attn_kblock_offset(table, 32, 16, 3, 1, 1000, 100, 40),
                     (2 * 3 + 1) * 1000 + 0 * 100);
    /* pos 95: logical 2 -> block 5, kernel block 1 */
    assert_int_equal(kvf_attn_kblock_offset(table, 32, 16, 3, 0, 1000, 100, 95),
                     (5 * 3 + 0) * 1000 + 1 * 100);
    /* HND rows: K head 1 row 3 of (2 heads, 16 rows, 8 dims); V after all K heads */
    assert_int_equal(kvf_attn_row_first(2, 16, 8, 1, 3, 0), (1 * 16 + 3) * 8);
    assert_int_equal(kvf_attn_row_first(2, 16, 8, 1, 3, 1), (3 * 16 + 3) * 8);
}

static void test_activations(void **state)
{
    static const float xs[] = {-30.0f, -2.5f, -1.0f, -0.1f, 0.0f, 0.3f, 1.0f, 4.0f, 30.0f};
    (void)state;
    for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); ++i) {
        float x = xs[i], r = (x > 0.0f) ? x : 0.0f;
        assert_true(kvf_act_hd(KVF_KACT_SILU, x) == x / (1.0f + expf(-x)));
        assert_true(kvf_act_hd(KVF_KACT_RELU2, x) == r * r);
        assert_true(kvf_act_hd(KVF_KACT_RELU, x) == r);
        assert_float_equal(kvf_act_hd(KVF_KACT_GELU, x), 0.5 * x * (1.0 + erf(x / sqrt(2.0))),
                           1e-5);
        assert_float_equal(kvf_act_hd(KVF_KACT_GELU_TANH, x),
                           0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))),
                           1e-5);
        assert_float_equal(kvf_act_hd(KVF_KACT_QUICK_GELU, x), x / (1.0 + exp(-1.702 * x)), 1e-5);
        assert_float_equal(kvf_act_hd(KVF_KACT_SIGMOID, x), 1.0 / (1.0 + exp(-x)), 1e-6);
        assert_float_equal(kvf_act_hd(KVF_KACT_TANH, x), tanh(x), 1e-6);
        assert_true(kvf_act_hd(KVF_KACT_COUNT, x) == x);          /* unknown: identity */
    }
    assert_true(kvf_act_hd(KVF_KACT_RELU, NAN) == 0.0f);
    assert_true(kvf_act_hd(KVF_KACT_RELU2, NAN) == 0.0f);
    /* the CPU kernel is the loop */
    {
        float a[9], b[9];
        memcpy(a, xs, sizeof(a));
        assert_int_equal(kvf_act(NULL, KVF_KACT_GELU, a, 9), KVF_KERN_OK);
        for (int i = 0; i < 9; ++i) {
            b[i] = kvf_act_hd(KVF_KACT_GELU, xs[i]);
        }
        assert_memory_equal(a, b, sizeof(a));
        assert_int_equal(kvf_act(NULL, KVF_KACT_COUNT, a, 9), KVF_KERN_EINVAL);
        assert_int_equal(kvf_act(NULL, -1, a, 9), KVF_KERN_EINVAL);
        assert_int_equal(kvf_act(NULL, 0, NULL, 1), KVF_KERN_EINVAL);
        assert_int_equal(kvf_act(NULL, 0, NULL, 0), KVF_KERN_OK);
    }
}

static void test_convert(void **state)
{
    float f[5] = {1.0f, -2.5f, 1.00390625f, 1e6f, NAN}, back[5];
    uint16_t h[5];
    uint8_t e[5];
    (void)state;
    assert_int_equal(kvf_convert(NULL, h, KVF_DTYPE_BF16, f, KVF_DTYPE_FP32, 5), KVF_KERN_OK);
    for (int i = 0; i < 5; ++i) {
        assert_int_equal(h[i], kvf_fp32_to_bf16(f[i]));
    }
    assert_int_equal(kvf_convert(NULL, e, KVF_DTYPE_FP8, h, KVF_DTYPE_BF16, 5), KVF_KERN_OK);
    assert_int_equal(e[3], 0x7e);                                   /* saturated */
    assert_int_equal(kvf_convert(NULL, back, KVF_DTYPE_FP32, e, KVF_DTYPE_FP8, 5), KVF_KERN_OK);
    assert_true(back[0] == 1.0f && back[1] == -2.5f && back[3] == 448.0f && isnan(back[4]));
    assert_int_equal(kvf_convert(NULL, back, KVF_DTYPE_FP32, f, KVF_DTYPE_FP32, 5), KVF_KERN_OK);
    assert_memory_equal(back, f, 4 * sizeof(float));
    assert_int_equal(kvf_convert(NULL, back, KVF_DTYPE_COUNT, f, KVF_DTYPE_FP32, 5),
                     KVF_KERN_EINVAL);
    assert_int_equal(kvf_convert(NULL, NULL, KVF_DTYPE_FP32, f, KVF_DTYPE_FP32, 5), KVF_KERN_EINVAL);
}

/* NemotronH routing by hand: group choice, top-k within kept groups, ties, norm, scale */
static void test_moe_route(void **state)
{
    enum { E = 8, K = 2, T = 2 };
    /* token 0: group 1 (experts 4..7) has the best two (0.9 + 0.8 logits order) */
    float logits[T * E] = {0.1f, 0.2f, 0.3f, 0.0f, 2.0f, 1.5f, -1.0f, 0.0f,
                           /* token 1: equal scores everywhere: ties to the lower index */
                           0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    float bias[E] = {0};
    float scores[T * E], wt[T * K];
    int32_t idx[T * K];
    kvf_moe_route_params_t p = {E, K, 2, 1, 1, 2.5f, bias, 0, 0};
    (void)state;

    assert_int_equal(kvf_moe_route(NULL, &p, logits, T, scores, idx, wt), KVF_KERN_OK);
    for (int i = 0; i < T * E; ++i) {
        assert_true(scores[i] == kvf_moe_score_hd(logits[i]));
    }
    assert_int_equal(idx[0], 4);
    assert_int_equal(idx[1], 5);
    double s4 = 1.0 / (1.0 + exp(-2.0)), s5 = 1.0 / (1.0 + exp(-1.5));
    assert_float_equal(wt[0], 2.5 * s4 / (s4 + s5), 1e-6);
    assert_float_equal(wt[1], 2.5 * s5 / (s4 + s5), 1e-6);
    assert_int_equal(idx[2], 0);
    assert_int_equal(idx[3], 1);
    assert_float_equal(wt[2], 1.25f, 1e-6);

    /* the bias moves the choice, not the weight */
    bias[0] = 10.0f;
    p.norm_topk_prob = 0;
    p.routed_scaling = 1.0f;
    assert_int_equal(kvf_moe_route(NULL, &p, logits, 1, scores, idx, wt), KVF_KERN_OK);
    assert_int_equal(idx[0], 0);                 /* group 0 now wins, expert 0 first */
    assert_true(wt[0] == scores[0]);             /* the plain score, not score + bias */

    /* the shared body directly, with its own scratch */
    {
        float choice[E], gsum[E], w2[K];
        bool gkeep[E], taken[E];
        int32_t i2[K];
        kvf_moe_route_token_hd(scores, bias, E, 2, 1, K, 0, 1.0f, choice, gsum, gkeep, taken, i2,
                               w2);
        assert_int_equal(i2[0], idx[0]);
        assert_int_equal(i2[1], idx[1]);
    }
    /* refused descriptions */
    p.n_group = 3;
    assert_int_equal(kvf_moe_route(NULL, &p, logits, 1, scores, idx, wt), KVF_KERN_EINVAL);
    p.n_group = 4;
    p.topk_group = 1;
    p.top_k = 3;                                 /* 1 group of 2 cannot hold 3 */
    assert_int_equal(kvf_moe_route(NULL, &p, logits, 1, scores, idx, wt), KVF_KERN_EINVAL);
    p.top_k = 2;
    p.bias = NULL;
    assert_int_equal(kvf_moe_route(NULL, &p, logits, 1, scores, idx, wt), KVF_KERN_EINVAL);
}

/* Granite's router (softmax_topk): the top-k logits, weighted by their softmax. */
static void test_moe_route_softmax(void **state)
{
    enum { E = 4, K = 2 };
    const float logits[E] = {0.3f, 2.0f, -1.0f, 1.25f};
    float bias[E] = {0}, scores[E], wt[K];
    int32_t idx[K];
    kvf_moe_route_params_t p = {E, K, 1, 1, 1, 1.0f, bias, 1, 0};
    const double e0 = 1.0, e1 = exp(1.25 - 2.0);
    (void)state;

    assert_int_equal(kvf_moe_route(NULL, &p, logits, 1, scores, idx, wt), KVF_KERN_OK);
    for (int e = 0; e < E; ++e) {
        assert_true(scores[e] == logits[e]);   /* no sigmoid */
    }
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 3);
    assert_float_equal(wt[0], e0 / (e0 + e1), 1e-6);   /* norm_topk_prob not applied */
    assert_float_equal(wt[1], e1 / (e0 + e1), 1e-6);
    p.routed_scaling = 2.0f;
    assert_int_equal(kvf_moe_route(NULL, &p, logits, 1, scores, idx, wt), KVF_KERN_OK);
    assert_float_equal(wt[0] + wt[1], 2.0, 1e-6);
    /* softmax_full (qwen3_next, norm_topk_prob false): the same experts, weighted by their
     * entries of the softmax over all four logits, not renormalised */
    {
        const double all = e0 + e1 + exp(0.3 - 2.0) + exp(-1.0 - 2.0);
        p.routed_scaling = 1.0f;
        p.softmax_full = 1;
        assert_int_equal(kvf_moe_route(NULL, &p, logits, 1, scores, idx, wt), KVF_KERN_OK);
        assert_int_equal(idx[0], 1);
        assert_int_equal(idx[1], 3);
        assert_float_equal(wt[0], e0 / all, 1e-6);
        assert_float_equal(wt[1], e1 / all, 1e-6);
        assert_true(wt[0] + wt[1] < 0.95f);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_route_softmax),
        cmocka_unit_test(test_dtype_bits_equal_base),
        cmocka_unit_test(test_mamba2_dt_clamp),
        cmocka_unit_test(test_mamba2_row),
        cmocka_unit_test(test_conv_tap_sum),
        cmocka_unit_test(test_hd_round),
        cmocka_unit_test(test_conv_chunk_body),
        cmocka_unit_test(test_conv_chunk_token_body),
        cmocka_unit_test(test_mamba2_scan_body),
        cmocka_unit_test(test_mamba2_decode_seqs_body),
        cmocka_unit_test(test_gated_norm_edges),
        cmocka_unit_test(test_attn_fold),
        cmocka_unit_test(test_attn_split_merge),
        cmocka_unit_test(test_attn_split_invariant),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_attn_offsets),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_moe_route),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
