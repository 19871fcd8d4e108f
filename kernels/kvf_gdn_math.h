/*
 * Gated DeltaNet's shared bodies (kvf_gdn.h), host and device alike (KVF_HD): the CPU
 * kernels (kvf_gdn.c) and the CUDA ones (kvf_gdn_cuda.cu) run these, in the same order per
 * row. A state row is read with a stride (1 on the CPU; the head count times the value head
 * dim on CUDA, where a warp's rows interleave for coalesced loads).
 */
#ifndef KVF_GDN_MATH_H
#define KVF_GDN_MATH_H

#include "kvf_dtype_math.h"
#include "kvf_hd.h"

#include <math.h>
#include <stddef.h>

/* torch's softplus (beta 1, threshold 20). */
static inline KVF_HD float kvf_gdn_softplus_hd(float v)
{
    return (v > 20.0f) ? v : log1pf(expf(v));
}

/* 1 / sqrt(sum x^2 + 1e-6): FLA's l2norm factor, as transformers. */
static inline KVF_HD float kvf_gdn_inv_l2_hd(const float *x, int n)
{
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) {
        ss += x[i] * x[i];
    }
    return 1.0f / sqrtf(ss + 1e-6f);
}

/* A value head's per-token decay exp(-exp(A_log) softplus(a + dt_bias)). */
static inline KVF_HD float kvf_gdn_decay_hd(float A_log, float a, float dt_bias)
{
    return expf(-expf(A_log) * kvf_gdn_softplus_hd(a + dt_bias));
}

/* sigmoid(v). */
static inline KVF_HD float kvf_gdn_sigmoid_hd(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

/*
 * One token on one state row j (dk elements at row[i * stride]): decay it, the delta rule's
 * update with key k = kin * kinv and value v, and the output against query
 * q = kin... (qin * qinv) * qscale. Returns y[j].
 */
static inline KVF_HD float kvf_gdn_row_hd(float *row, size_t stride, int dk, const float *qin,
                                          float qinv, float qscale, const float *kin, float kinv,
                                          float v, float decay, float beta)
{
    float mem = 0.0f, out = 0.0f, delta;

    for (int i = 0; i < dk; ++i) {
        const float r = row[(size_t)i * stride] * decay;
        row[(size_t)i * stride] = r;
        mem += r * (kin[i] * kinv);
    }
    delta = (v - mem) * beta;
    for (int i = 0; i < dk; ++i) {
        const float r = row[(size_t)i * stride] + (kin[i] * kinv) * delta;
        row[(size_t)i * stride] = r;
        out += r * ((qin[i] * qinv) * qscale);
    }
    return out;
}

/* a * b rounded once and never fused into a neighbouring add (the product the token
 * kernels store before adding to it; kvf_gdn_row_state_hd) */
static inline KVF_HD float kvf_gdn_mul_rn_hd(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/*
 * kvf_gdn_row_hd on a row kept in a state of @a dtype (elements off .. off + dk - 1),
 * updated in place: each element loaded, decayed (the product rounded as the fp32 row's
 * stored one is), updated and stored rounded to the dtype, the output from the unrounded
 * values. The bits of the token scan (kvf_gdn_row_hd on an fp32 copy, then rounded and
 * stored), without an fp32 copy of the row. Returns y[j].
 */
static inline KVF_HD float kvf_gdn_row_state_hd(void *st, int dtype, size_t off, int dk,
                                                const float *qin, float qinv, float qscale,
                                                const float *kin, float kinv, float v,
                                                float decay, float beta)
{
    float mem = 0.0f, out = 0.0f, delta;

    for (int i = 0; i < dk; ++i) {
        const float r = kvf_gdn_mul_rn_hd(kvf_hd_load(st, dtype, off + (size_t)i), decay);
        mem += r * (kin[i] * kinv);
    }
    delta = (v - mem) * beta;
    for (int i = 0; i < dk; ++i) {
        const float r = kvf_gdn_mul_rn_hd(kvf_hd_load(st, dtype, off + (size_t)i), decay) +
                        (kin[i] * kinv) * delta;
        kvf_hd_store(st, dtype, off + (size_t)i, r);
        out += r * ((qin[i] * qinv) * qscale);
    }
    return out;
}

/* Qwen3NextRMSNormGated of one head: o = y * rsqrt(mean(y^2) + eps) * w * silu(z). */
static inline KVF_HD void kvf_gdn_gated_norm_row_hd(const float *y, const float *z,
                                                    const float *w, int n, float eps, float *o)
{
    float ss = 0.0f;
    for (int j = 0; j < n; ++j) {
        ss += y[j] * y[j];
    }
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int j = 0; j < n; ++j) {
        const float zs = z[j] / (1.0f + expf(-z[j]));
        o[j] = w[j] * (y[j] * inv) * zs;
    }
}

#endif
