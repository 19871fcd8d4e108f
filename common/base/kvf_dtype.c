/* dtype parsing and scalar conversions shared by kernels and geometry. */
#include "kvf_dtype.h"

#include <math.h>
#include <strings.h>

int kvf_dtype_parse(const char *name, kvf_dtype_t *dtype_p)
{
    static const struct { const char *name; kvf_dtype_t dtype; } names[] = {
        {"fp32", KVF_DTYPE_FP32}, {"float32", KVF_DTYPE_FP32}, {"float", KVF_DTYPE_FP32},
        {"bf16", KVF_DTYPE_BF16}, {"bfloat16", KVF_DTYPE_BF16},
        {"fp16", KVF_DTYPE_FP16}, {"float16", KVF_DTYPE_FP16}, {"half", KVF_DTYPE_FP16},
        {"fp8", KVF_DTYPE_FP8}, {"fp8_e4m3", KVF_DTYPE_FP8},
    };
    if (name == NULL) {
        return -1;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
        if (strcasecmp(name, names[i].name) == 0) {
            *dtype_p = names[i].dtype;
            return 0;
        }
    }
    return -1;
}

uint16_t kvf_fp32_to_fp16(float f)
{
    uint32_t u, sign, exp, mant;
    memcpy(&u, &f, sizeof(u));
    sign = (u >> 16) & 0x8000u;
    exp  = (u >> 23) & 0xffu;
    mant = u & 0x7fffffu;
    if (exp == 0xffu) {                           /* inf / NaN */
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
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
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if ((rem > mid) || ((rem == mid) && (half & 1u))) {
            half++;
        }
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if ((rem > 0x1000u) || ((rem == 0x1000u) && (half & 1u))) {
        half++;                                   /* may carry into exponent: correct */
    }
    return (uint16_t)half;
}

float kvf_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    float f;

    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    memcpy(&f, &u, sizeof(f));
    return f;
}

uint8_t kvf_fp32_to_fp8(float f)
{
    uint8_t sign = signbit(f) ? 0x80u : 0u;
    float a = fabsf(f);
    int e;

    if (isnan(f)) {
        return (uint8_t)(sign | 0x7fu);
    }
    if (a >= 448.0f) {
        return (uint8_t)(sign | 0x7eu);            /* saturate: e4m3fn has no infinity */
    }
    if (a == 0.0f) {
        return sign;                               /* frexpf(0) has no exponent to use */
    }
    (void)frexpf(a, &e);                           /* a = m * 2^e, m in [0.5, 1) */
    if (e - 1 < -6) {                              /* subnormal: M * 2^-9 */
        return (uint8_t)(sign | (uint8_t)rintf(ldexpf(a, 9)));   /* 8 carries into E=1 */
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

float kvf_fp8_to_fp32(uint8_t b)
{
    int exp = (b >> 3) & 0xf;
    int mant = b & 7;
    float v;

    if ((exp == 15) && (mant == 7)) {
        return NAN;
    }
    v = (exp == 0) ? ldexpf((float)mant, -9) : ldexpf((float)(8 + mant), exp - 10);
    return (b & 0x80u) ? -v : v;
}

float kvf_dtype_load(const void *base, kvf_dtype_t dtype, size_t i)
{
    switch (dtype) {
    case KVF_DTYPE_FP32: return ((const float *)base)[i];
    case KVF_DTYPE_BF16: return kvf_bf16_to_fp32(((const uint16_t *)base)[i]);
    case KVF_DTYPE_FP16: return kvf_fp16_to_fp32(((const uint16_t *)base)[i]);
    case KVF_DTYPE_FP8:  return kvf_fp8_to_fp32(((const uint8_t *)base)[i]);
    default:             return 0.0f;
    }
}

void kvf_dtype_store(void *base, kvf_dtype_t dtype, size_t i, float v)
{
    switch (dtype) {
    case KVF_DTYPE_FP32: ((float *)base)[i] = v; break;
    case KVF_DTYPE_BF16: ((uint16_t *)base)[i] = kvf_fp32_to_bf16(v); break;
    case KVF_DTYPE_FP16: ((uint16_t *)base)[i] = kvf_fp32_to_fp16(v); break;
    case KVF_DTYPE_FP8:  ((uint8_t *)base)[i] = kvf_fp32_to_fp8(v); break;
    default: break;
    }
}
