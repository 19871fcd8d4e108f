/*
 * The per-element arithmetic of kvferry's fixed-order GEMM, shared by the CPU
 * kernel (kvf_gemm_cpu.c) and the CUDA one (kvf_gemm_fixed_cuda.cu), so the
 * two devices compute the same bits (KVF_HD: plain C here, __host__
 * __device__ under nvcc).
 *
 * A dot of K terms is 16 lanes: lane l is the FMA chain of the terms
 * k = l, l + 16, ... in ascending k from +0, the K tail padded with zero terms
 * (fma(0, 0, a) = a); then the lanes are added as a fixed tree (l + l+8,
 * + l+4, + l+2, + l+1). The output is alpha * dot + (beta * y + bias), the
 * parenthesis first. Nothing in it depends on how many rows a call has, where
 * the row sits or how the work is tiled: the batch invariance of
 * common/engine/README.md rests on it.
 */
#ifndef KVF_GEMM_MATH_H
#define KVF_GEMM_MATH_H

#include "kvf_hd.h"

#include <stdint.h>
#include <string.h>

#define KVF_GEMM_LANES 16

/** The 16 lane sums of one dot added as the fixed tree; p: [16]. */
static inline KVF_HD float kvf_gemm_tree16(const float *p)
{
    float s8[8], s4[4], s2[2];
    for (int l = 0; l < 8; ++l) {
        s8[l] = p[l] + p[l + 8];
    }
    for (int l = 0; l < 4; ++l) {
        s4[l] = s8[l] + s8[l + 4];
    }
    s2[0] = s4[0] + s4[2];
    s2[1] = s4[1] + s4[3];
    return s2[0] + s2[1];
}

/** W element @a i as fp32: fp32 as is, bf16 (@a wbf) widened exactly (a shift). */
static inline KVF_HD float kvf_gemm_w_at(const void *w, int wbf, size_t i)
{
    if (wbf) {
        uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
        float f;
        memcpy(&f, &u, sizeof(f));
        return f;
    }
    return ((const float *)w)[i];
}

/**
 * One output element from its dot: alpha * dot + (beta * y_old + bias), with
 * beta = 0 never reading @a y_old's value (it may be garbage, even NaN) and a
 * NULL @a bias adding nothing; alpha 1 multiplies nothing.
 */
static inline KVF_HD float kvf_gemm_out(float dot, float alpha, float beta, float y_old,
                                        const float *bias)
{
#ifdef __CUDA_ARCH__
    /* no FMA contraction on the device: each product and sum rounds once, as written */
    float c = (beta != 0.0f) ? __fmul_rn(beta, y_old) : 0.0f;
    if (bias != NULL) {
        c = __fadd_rn(c, *bias);
    }
    return __fadd_rn((alpha != 1.0f) ? __fmul_rn(alpha, dot) : dot, c);
#else
    /* the forward calls with alpha 1 and beta 0 or 1, where a host compiler's contraction
     * of beta * y + bias into an FMA cannot change a bit (1 * y is exact) */
    float c = (beta != 0.0f) ? beta * y_old : 0.0f;
    if (bias != NULL) {
        c = c + *bias;
    }
    return ((alpha != 1.0f) ? alpha * dot : dot) + c;
#endif
}

#endif
