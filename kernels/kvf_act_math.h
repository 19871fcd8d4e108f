/*
 * Shared (CPU and CUDA) activation functions, one element at a time. The
 * codes are those of common/model's kvf_act_t, in the same order (kernels/
 * cannot include common/model; tests/kernels/test_kern_math.c pins each
 * formula):
 *
 *   0 silu        x / (1 + exp(-x))
 *   1 relu2       relu(x)^2
 *   2 relu        max(x, 0)  (NaN -> 0)
 *   3 gelu        0.5 x (1 + erf(x / sqrt 2))
 *   4 gelu_tanh   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *   5 quick_gelu  x / (1 + exp(-1.702 x))
 *   6 sigmoid     1 / (1 + exp(-x))
 *   7 tanh        tanh(x)
 * An unknown code returns x unchanged.
 */
#ifndef KVF_ACT_MATH_H
#define KVF_ACT_MATH_H

#include "kvf_hd.h"

#include <math.h>

#define KVF_KACT_SILU       0
#define KVF_KACT_RELU2      1
#define KVF_KACT_RELU       2
#define KVF_KACT_GELU       3
#define KVF_KACT_GELU_TANH  4
#define KVF_KACT_QUICK_GELU 5
#define KVF_KACT_SIGMOID    6
#define KVF_KACT_TANH       7
#define KVF_KACT_COUNT      8

static inline KVF_HD float kvf_act_hd(int act, float x)
{
    switch (act) {
    case KVF_KACT_SILU:
        return x / (1.0f + expf(-x));
    case KVF_KACT_RELU2: {
        float v = (x > 0.0f) ? x : 0.0f;
        return v * v;
    }
    case KVF_KACT_RELU:
        return (x > 0.0f) ? x : 0.0f;
    case KVF_KACT_GELU:
        return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case KVF_KACT_GELU_TANH:
        return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case KVF_KACT_QUICK_GELU:
        return x / (1.0f + expf(-1.702f * x));
    case KVF_KACT_SIGMOID:
        return 1.0f / (1.0f + expf(-x));
    case KVF_KACT_TANH:
        return tanhf(x);
    default:
        return x;
    }
}

#endif
