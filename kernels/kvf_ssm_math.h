/*
 * Shared (CPU and CUDA) arithmetic of the Mamba2 mixer's state kernels:
 * the causal depthwise conv1d tap sum (kvf_conv1d.h) and the selective-scan
 * recurrence with its dt clamp (kvf_mamba2.h).
 *
 *   conv:  y = act(bias + sum_{i<kernel} w[i] * win[i]), win oldest first
 *   dt   = clamp(softplus(raw + bias), dt_min, dt_max),
 *          softplus(v) = v > 20 ? v : log1p(exp(v))  (torch threshold 20);
 *          a NaN raw stays NaN (neither clamp bound catches it)
 *   A    = -exp(A_log);  dA = exp(dt * A)
 *   S[n] = dA * S[n] + (dt * x) * B[n];  y = sum_n S[n] * C[n] + D * x
 *
 * The CPU kernels loop these over channels / heads / head dims; a GPU
 * thread runs one channel or one (head, head-dim) row over all tokens, in
 * the same order, so the two differ only by libm ulps and FMA contraction.
 *
 * A narrow (bf16/fp16) conv or SSM state is read at its precision by every
 * token, inside a chunk as in the decode step (batch invariance, issue 33):
 * the conv history taps and the SSM state are rounded by kvf_hd_round after
 * each token, as a store and a load would (kvf_conv_chunk_channel_hd,
 * kvf_mamba2_row_scan_hd: the CUDA chunk kernels' bodies; the CPU kernels
 * round whole windows and head states with the same rule, kvf_kern_round).
 */
#ifndef KVF_SSM_MATH_H
#define KVF_SSM_MATH_H

#include "kvf_dtype_math.h"
#include "kvf_hd.h"

#include <math.h>
#include <stddef.h>

/* the conv history a GPU thread keeps (kernel <= 64, as the CPU step) */
#define KVF_CONV_KERNEL_MAX 64

static inline KVF_HD float kvf_silu_hd(float v)
{
    return v / (1.0f + expf(-v));
}

/** One conv output: act(bias + sum_{i < kernel} filt[i] * win[i]). */
static inline KVF_HD float kvf_conv_tap_sum(const float *filt, const float *win, int kernel,
                                            float bias, int silu)
{
    float acc = bias;
    for (int i = 0; i < kernel; ++i) {
        acc += filt[i] * win[i];
    }
    return silu ? kvf_silu_hd(acc) : acc;
}

/**
 * One channel of a conv chunk: T inputs x[t * ldx] through the window
 * win[kernel] (win[0, kernel - 1): the history, oldest first, already at the
 * state's precision), y[t * ldy] = kvf_conv_tap_sum(filt, win, ...) with the
 * token's own tap exact; then the input joins the history rounded to
 * @a state_dtype (kvf_hd_round: what the decode step's stored state reads
 * back as) and the window shifts. On return win[0, kernel - 1) is the new
 * history (every value representable in @a state_dtype). y may alias x
 * (each x[t * ldx] is read before y[t * ldy] is written).
 */
static inline KVF_HD void kvf_conv_chunk_channel_hd(const float *filt, float *win, int kernel,
                                                    float bias, int silu, const float *x,
                                                    size_t ldx, size_t T, float *y, size_t ldy,
                                                    int state_dtype)
{
    const int taps = kernel - 1;
    for (size_t t = 0; t < T; ++t) {
        win[taps] = x[t * ldx];
        y[t * ldy] = kvf_conv_tap_sum(filt, win, kernel, bias, silu);
        win[taps] = kvf_hd_round(win[taps], state_dtype);
        for (int i = 0; i < taps; ++i) {
            win[i] = win[i + 1];
        }
    }
}

/**
 * Position @a s of a chunk's sequence "history, then inputs" for one channel: s >= 0 is
 * input s (x[s * ldx]) rounded to @a state_dtype, as it joins the history in
 * kvf_conv_chunk_channel_hd; s in [-taps, 0) is the stored history's entry taps + s (the
 * state [channels][taps], channel @a c) when @a has_state, else 0.
 */
static inline KVF_HD float kvf_conv_hist_hd(const float *x, size_t ldx, long s,
                                            const void *state, size_t c, int taps,
                                            int has_state, int state_dtype)
{
    if (s >= 0) {
        return kvf_hd_round(x[(size_t)s * ldx], state_dtype);
    }
    return has_state ? kvf_hd_load(state, state_dtype, c * (size_t)taps + (size_t)(taps + s))
                     : 0.0f;
}

/**
 * Output @a t of one channel of a conv chunk computed alone (the CUDA chunk kernel's body:
 * one thread per (token, channel), so a prompt's tokens run in parallel): the window the
 * serial loop kvf_conv_chunk_channel_hd holds at token t (history taps by
 * kvf_conv_hist_hd, the token's own tap exact) through kvf_conv_tap_sum, so the same bits
 * as that loop's y[t]. @a x is the channel's first input (x[t * ldx]); the state is read,
 * never written (kvf_conv_chunk_tail_hd stores the new history once every output is done).
 */
static inline KVF_HD float kvf_conv_chunk_token_hd(const float *filt, int kernel, float bias,
                                                   int silu, const float *x, size_t ldx,
                                                   size_t t, const void *state, size_t c,
                                                   int has_state, int state_dtype)
{
    float win[KVF_CONV_KERNEL_MAX];
    const int taps = kernel - 1;

    for (int i = 0; i < taps; ++i) {
        win[i] = kvf_conv_hist_hd(x, ldx, (long)t - taps + i, state, c, taps, has_state,
                                  state_dtype);
    }
    win[taps] = x[t * ldx];
    return kvf_conv_tap_sum(filt, win, kernel, bias, silu);
}

/**
 * The history one channel keeps after a chunk of @a T inputs (what
 * kvf_conv_chunk_channel_hd leaves in win[0, taps)), stored into the state: entry j is
 * position T - taps + j of the history-then-inputs sequence. Reads the old history first,
 * so it may run in place; every output of the chunk must be computed before (they read it).
 */
static inline KVF_HD void kvf_conv_chunk_tail_hd(const float *x, size_t ldx, size_t T,
                                                 void *state, size_t c, int taps, int has_state,
                                                 int state_dtype)
{
    float h[KVF_CONV_KERNEL_MAX];

    for (int j = 0; j < taps; ++j) {
        h[j] = kvf_conv_hist_hd(x, ldx, (long)T - taps + j, state, c, taps, has_state,
                                state_dtype);
    }
    for (int j = 0; j < taps; ++j) {
        kvf_hd_store(state, state_dtype, c * (size_t)taps + (size_t)j, h[j]);
    }
}

/** dt of one head and token: clamp(softplus(raw + bias), dt_min, dt_max). */
static inline KVF_HD float kvf_mamba2_dt_hd(float raw, float bias, float dt_min, float dt_max)
{
    float v = raw + bias;
    float dt = (v > 20.0f) ? v : log1pf(expf(v));
    if (dt < dt_min) {
        dt = dt_min;
    }
    if (dt > dt_max) {
        dt = dt_max;
    }
    return dt;
}

/** A = -exp(A_log). */
static inline KVF_HD float kvf_mamba2_A_hd(float A_log)
{
    return -expf(A_log);
}

/** The decay of one step: exp(dt * A). */
static inline KVF_HD float kvf_mamba2_dA_hd(float dt, float A)
{
    return expf(dt * A);
}

/**
 * One token through one (head, head-dim) row of the state S[ns] (fp32, in
 * place): S[n] = dA * S[n] + dtx * B[n]; returns sum_n S[n] * C[n]
 * (dtx = dt * x).
 */
static inline KVF_HD float kvf_mamba2_row_hd(float *S, size_t ns, float dA, float dtx,
                                             const float *Bg, const float *Cg)
{
    float acc = 0.0f;
    for (size_t n = 0; n < ns; ++n) {
        S[n] = dA * S[n] + dtx * Bg[n];
        acc += S[n] * Cg[n];
    }
    return acc;
}

/**
 * kvf_mamba2_row_hd() on a state row whose element n is at S[n * stride]
 * (the same arithmetic in the same order): a GPU keeps the rows of a block's
 * threads interleaved, so a warp's loads of element n are one coalesced line
 * instead of 32.
 */
static inline KVF_HD float kvf_mamba2_row_strided_hd(float *S, size_t stride, size_t ns,
                                                     float dA, float dtx, const float *Bg,
                                                     const float *Cg)
{
    float acc = 0.0f;
    for (size_t n = 0; n < ns; ++n) {
        float *sn = S + n * stride;
        *sn = dA * *sn + dtx * Bg[n];
        acc += *sn * Cg[n];
    }
    return acc;
}

/**
 * kvf_mamba2_row_strided_hd() with the state kept at @a state_dtype: each
 * element's new value enters the output sum exact and is then kept rounded
 * (kvf_hd_round), so the next token reads what the decode step's store and
 * load give; the CPU scan's order (kvf_mamba2.c: the sum over the fp32
 * values, the head's state rounded after the token). fp32: the same bits as
 * kvf_mamba2_row_strided_hd().
 */
static inline KVF_HD float kvf_mamba2_row_strided_round_hd(float *S, size_t stride, size_t ns,
                                                           float dA, float dtx, const float *Bg,
                                                           const float *Cg, int state_dtype)
{
    float acc = 0.0f;
    for (size_t n = 0; n < ns; ++n) {
        float *sn = S + n * stride;
        float v = dA * *sn + dtx * Bg[n];
        acc += v * Cg[n];
        *sn = kvf_hd_round(v, state_dtype);
    }
    return acc;
}

/**
 * One token on a state row kept in memory at @a state_dtype (element n at state[base + n]):
 * each element loaded, updated, its new value entering the output sum exact and stored
 * rounded (kvf_hd_store), with no fp32 copy of the row. The same bits as loading the row,
 * kvf_mamba2_row_strided_round_hd() (kvf_mamba2_row_strided_hd() for fp32) and storing it
 * back, as the one-request kernel does: the batched decode step's body for a 16-bit state.
 */
static inline KVF_HD float kvf_mamba2_row_state_hd(void *state, int state_dtype, size_t base,
                                                   size_t ns, float dA, float dtx,
                                                   const float *Bg, const float *Cg)
{
    float acc = 0.0f;
    for (size_t n = 0; n < ns; ++n) {
        float v = dA * kvf_hd_load(state, state_dtype, base + n) + dtx * Bg[n];
        acc += v * Cg[n];
        kvf_hd_store(state, state_dtype, base + n, v);
    }
    return acc;
}

/** y of one row: acc + D * x. */
static inline KVF_HD float kvf_mamba2_out_hd(float acc, float D, float x)
{
    return acc + D * x;
}

/**
 * One (head, head-dim) row of a Mamba2 chunk over T tokens: the fp32 state
 * row S (element n at S[n * stride], loaded by the caller) advanced token by
 * token, y[t * ldy] = kvf_mamba2_out_hd(...). Per token: dt =
 * kvf_mamba2_dt_hd(dt_raw[t * lddt], dt_bias, dt_min, dt_max), dA, then the
 * row update; a narrow @a state_dtype rounds the row after every token
 * (kvf_mamba2_row_strided_round_hd), fp32 keeps it exact
 * (kvf_mamba2_row_strided_hd). x, dt_raw, B, C and y point at this row's
 * column / head / group of token 0. The CUDA scan kernel's body.
 */
static inline KVF_HD void kvf_mamba2_row_scan_hd(float *S, size_t stride, size_t ns, size_t T,
                                                 const float *dt_raw, size_t lddt, float dt_bias,
                                                 float dt_min, float dt_max, float A, float Dh,
                                                 const float *x, size_t ldx, const float *B,
                                                 const float *C, size_t ldbc, float *y,
                                                 size_t ldy, int state_dtype)
{
    for (size_t t = 0; t < T; ++t) {
        float dth = kvf_mamba2_dt_hd(dt_raw[t * lddt], dt_bias, dt_min, dt_max);
        float dA = kvf_mamba2_dA_hd(dth, A);
        float xv = x[t * ldx];
        const float *Bg = B + t * ldbc;
        const float *Cg = C + t * ldbc;
        float acc = (state_dtype == KVF_HD_FP32)
                        ? kvf_mamba2_row_strided_hd(S, stride, ns, dA, dth * xv, Bg, Cg)
                        : kvf_mamba2_row_strided_round_hd(S, stride, ns, dA, dth * xv, Bg, Cg,
                                                          state_dtype);
        y[t * ldy] = kvf_mamba2_out_hd(acc, Dh, xv);
    }
}

#endif
