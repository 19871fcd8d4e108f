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
 */
#ifndef KVF_SSM_MATH_H
#define KVF_SSM_MATH_H

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

/** y of one row: acc + D * x. */
static inline KVF_HD float kvf_mamba2_out_hd(float acc, float D, float x)
{
    return acc + D * x;
}

#endif
