/*
 * Shared (CPU and CUDA) dtype conversion: fp32 <-> bf16, fp16 and fp8 e4m3fn,
 * and element load/store of a typed cache array: the one copy of these
 * algorithms (base/kvf_dtype.c calls them; round to nearest even; NaN
 * stays NaN; fp16 overflows to inf; fp8 saturates at +-448);
 * tests/kernels/test_kern_math.c checks them over every 16-bit pattern and a
 * sweep of floats.
 *
 * Dtype codes are kvf_dtype_t values (base/kvf_dtype.h): 0 fp32,
 * 1 bf16, 2 fp16, 3 fp8. An unknown code loads 0 and stores nothing.
 */
#ifndef KVF_DTYPE_MATH_H
#define KVF_DTYPE_MATH_H

#include "kvf_hd.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVF_HD_FP32 0
#define KVF_HD_BF16 1
#define KVF_HD_FP16 2
#define KVF_HD_FP8  3

static inline KVF_HD uint32_t kvf_hd_f2u(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
#endif
}

static inline KVF_HD float kvf_hd_u2f(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

static inline KVF_HD uint16_t kvf_hd_fp32_to_bf16(float f)
{
    uint32_t u = kvf_hd_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40u);   /* quiet NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline KVF_HD float kvf_hd_bf16_to_fp32(uint16_t h)
{
    return kvf_hd_u2f((uint32_t)h << 16);
}

static inline KVF_HD uint16_t kvf_hd_fp32_to_fp16(float f)
{
    uint32_t u = kvf_hd_f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t mant = u & 0x7fffffu;
    if (exp == 0xffu) {                           /* inf / NaN */
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0u));
    }
    int e = (int)exp - 127 + 15;
    if (e >= 31) {
        return (uint16_t)(sign | 0x7c00u);        /* overflow -> inf */
    }
    if (e <= 0) {                                 /* subnormal or zero */
        if (e < -10) {
            return (uint16_t)sign;
        }
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if ((rem > mid) || ((rem == mid) && (half & 1u))) {
            half++;
        }
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if ((rem > 0x1000u) || ((rem == 0x1000u) && (half & 1u))) {
        half++;                                   /* may carry into inf: correct */
    }
    return (uint16_t)half;
}

static inline KVF_HD float kvf_hd_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t mant = (uint32_t)h & 0x3ffu;

    if (exp == 0) {
        float f = (float)mant * 5.9604644775390625e-8f;   /* mant * 2^-24, exact */
        return sign ? -f : f;
    }
    if (exp == 31) {
        return kvf_hd_u2f(sign | 0x7f800000u | (mant << 13));
    }
    return kvf_hd_u2f(sign | ((exp - 15u + 127u) << 23) | (mant << 13));
}

static inline KVF_HD uint8_t kvf_hd_fp32_to_fp8(float f)
{
    uint8_t sign = (kvf_hd_f2u(f) >> 31) ? 0x80u : 0u;
    float a = fabsf(f);
    int e;

    if (f != f) {
        return (uint8_t)(sign | 0x7fu);
    }
    if (a >= 448.0f) {
        return (uint8_t)(sign | 0x7eu);            /* saturate: e4m3fn has no infinity */
    }
    if (a == 0.0f) {
        return sign;
    }
    (void)frexpf(a, &e);                           /* a = m * 2^e, m in [0.5, 1) */
    if (e - 1 < -6) {                              /* subnormal: M * 2^-9 */
        return (uint8_t)(sign | (uint8_t)rintf(ldexpf(a, 9)));
    }
    int exp = e - 1 + 7;
    int mant = (int)rintf((ldexpf(a, -(e - 1)) - 1.0f) * 8.0f);
    if (mant == 8) {
        mant = 0;
        ++exp;
    }
    if ((exp > 15) || ((exp == 15) && (mant == 7))) {
        return (uint8_t)(sign | 0x7eu);
    }
    return (uint8_t)(sign | (uint8_t)(exp << 3) | (uint8_t)mant);
}

static inline KVF_HD float kvf_hd_fp8_to_fp32(uint8_t b)
{
    int exp = (b >> 3) & 0xf;
    int mant = b & 7;
    float v;

    if ((exp == 15) && (mant == 7)) {
        return kvf_hd_u2f(0x7fc00000u);            /* NaN */
    }
    v = (exp == 0) ? ldexpf((float)mant, -9) : ldexpf((float)(8 + mant), exp - 10);
    return (b & 0x80u) ? -v : v;
}

/** Element @a i of the typed array @a base as fp32. */
static inline KVF_HD float kvf_hd_load(const void *base, int dtype, size_t i)
{
    switch (dtype) {
    case KVF_HD_FP32: return ((const float *)base)[i];
    case KVF_HD_BF16: return kvf_hd_bf16_to_fp32(((const uint16_t *)base)[i]);
    case KVF_HD_FP16: return kvf_hd_fp16_to_fp32(((const uint16_t *)base)[i]);
    case KVF_HD_FP8:  return kvf_hd_fp8_to_fp32(((const uint8_t *)base)[i]);
    default:          return 0.0f;
    }
}

/** Element @a i of the typed array @a base = @a v, rounded to nearest even. */
static inline KVF_HD void kvf_hd_store(void *base, int dtype, size_t i, float v)
{
    switch (dtype) {
    case KVF_HD_FP32: ((float *)base)[i] = v; break;
    case KVF_HD_BF16: ((uint16_t *)base)[i] = kvf_hd_fp32_to_bf16(v); break;
    case KVF_HD_FP16: ((uint16_t *)base)[i] = kvf_hd_fp32_to_fp16(v); break;
    case KVF_HD_FP8:  ((uint8_t *)base)[i] = kvf_hd_fp32_to_fp8(v); break;
    default:          break;
    }
}

/**
 * @a v as an array of @a dtype reads it back: kvf_hd_store() then kvf_hd_load() without
 * the memory (round to nearest even; NaN stays NaN). fp32 and an unknown code return @a v.
 * The one rounding rule of a narrow conv or SSM state kept in fp32 between tokens (the
 * CPU kernels' kvf_kern_round and the CUDA conv chunk and scan), so a chunk reads its
 * history as the decode step reads the stored state (batch invariance).
 */
static inline KVF_HD float kvf_hd_round(float v, int dtype)
{
    switch (dtype) {
    case KVF_HD_BF16: return kvf_hd_bf16_to_fp32(kvf_hd_fp32_to_bf16(v));
    case KVF_HD_FP16: return kvf_hd_fp16_to_fp32(kvf_hd_fp32_to_fp16(v));
    case KVF_HD_FP8:  return kvf_hd_fp8_to_fp32(kvf_hd_fp32_to_fp8(v));
    default:          return v;
    }
}

#endif
