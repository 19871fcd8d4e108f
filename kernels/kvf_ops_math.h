/*
 * Shared (CPU and CUDA) bodies of the model forward's small ops (kvf_ops.h):
 * one element or one pair at a time. The CPU loops of kvf_ops.c and the
 * threads of kvf_ops_cuda.cu both call them, so the CPU suite runs the
 * arithmetic a GPU runs (tests/kernels/test_kern_ops.c pins each formula).
 */
#ifndef KVF_OPS_MATH_H
#define KVF_OPS_MATH_H

#include "kvf_act_math.h"
#include "kvf_hd.h"

#include <math.h>

/** y + x * w: a routed expert's output weighted into a token's sum. */
static inline KVF_HD float kvf_add_scaled_hd(float y, float x, float w)
{
    return y + x * w;
}

/** act(gate) * up: one element of a gated (SwiGLU-style) MLP. */
static inline KVF_HD float kvf_act_mul_hd(int act, float gate, float up)
{
    return kvf_act_hd(act, gate) * up;
}

/**
 * gpt-oss's clamped SwiGLU of one element (transformers' GptOssExperts._apply_gate, fp32):
 * g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) * (g * sigmoid(g * alpha)).
 */
static inline KVF_HD float kvf_swiglu_clamp_hd(float gate, float up, float alpha, float limit)
{
    const float g = (gate > limit) ? limit : gate;
    const float u = (up > limit) ? limit : (up < -limit) ? -limit : up;
    const float glu = g * (1.0f / (1.0f + expf(-(g * alpha))));
    return (u + 1.0f) * glu;
}

/** RoPE angle of frequency @a inv_freq at position @a pos (fp32, as transformers). */
static inline KVF_HD float kvf_rope_angle_hd(int pos, float inv_freq)
{
    return (float)pos * inv_freq;
}

/** Cosine and sine of a RoPE angle (libm's cosf / sinf; CUDA's on the device). */
static inline KVF_HD void kvf_rope_cos_sin_hd(float angle, float *c, float *s)
{
    *c = cosf(angle);
    *s = sinf(angle);
}

/**
 * Rotate the pair (x[i], x[i + half]) of one head by the angle whose cosine
 * and sine are @a c and @a s (transformers' rotate_half form).
 */
static inline KVF_HD void kvf_rope_rotate_hd(float c, float s, float *lo, float *hi)
{
    float a = *lo, b = *hi;
    *lo = a * c - b * s;
    *hi = b * c + a * s;
}

#endif
