/*
 * Shared (CPU and CUDA) arithmetic of RMSNorm and the gated grouped RMSNorm
 * (kvf_norm.h): squares summed in double, the inverse RMS in double, and
 * the per-element gate and scale in fp32.
 *
 *   inv  = (float)(1 / sqrt(sumsq / n + eps))     (sumsq 0, eps 0: inf)
 *   gate = x * silu(z) = x * (z / (1 + exp(-z)))  (z -> -inf: -0 * x or 0)
 *   y    = v * inv * w
 *
 * The CPU sums a row left to right; a GPU block sums it as a tree, so the
 * sums differ by double rounding only (far below fp32 resolution).
 */
#ifndef KVF_NORM_MATH_H
#define KVF_NORM_MATH_H

#include "kvf_hd.h"

#include <math.h>

static inline KVF_HD double kvf_norm_sq_hd(float v)
{
    return (double)v * (double)v;
}

static inline KVF_HD float kvf_norm_inv_hd(double sumsq, double n, float eps)
{
    return (float)(1.0 / sqrt(sumsq / n + (double)eps));
}

static inline KVF_HD float kvf_norm_scale_hd(float v, float inv, float w)
{
    return v * inv * w;
}

static inline KVF_HD float kvf_norm_gate_hd(float x, float z)
{
    return x * (z / (1.0f + expf(-z)));
}

#endif
