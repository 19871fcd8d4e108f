/*
 * Element types of cache memory and weights. Compute is fp32; caches may be
 * stored narrower. fp8 (e4m3fn) is known to geometry (1 byte per element, as
 * in the docs/ARCHITECTURE.md §1 and §6 worked numbers) and moves through transfers, but no
 * attention kernel reads or writes it yet, so the serving engine refuses it.
 */
#ifndef KVF_DTYPE_H
#define KVF_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    KVF_DTYPE_FP32 = 0,
    KVF_DTYPE_BF16 = 1,
    KVF_DTYPE_FP16 = 2,
    KVF_DTYPE_FP8  = 3,   /* e4m3fn (OCP): geometry and transfer; no kernel computes in it yet */
    KVF_DTYPE_COUNT
} kvf_dtype_t;

/** Bytes per element of @a dtype (4, 2, 2, 1); 0 for an invalid value. */
static inline size_t kvf_dtype_size(kvf_dtype_t dtype)
{
    static const size_t sizes[KVF_DTYPE_COUNT] = {4, 2, 2, 1};
    return ((unsigned)dtype < KVF_DTYPE_COUNT) ? sizes[dtype] : 0;
}

/** Canonical name: "fp32", "bf16", "fp16", "fp8"; "invalid" otherwise. */
static inline const char *kvf_dtype_name(kvf_dtype_t dtype)
{
    static const char *const names[KVF_DTYPE_COUNT] = {"fp32", "bf16", "fp16", "fp8"};
    return ((unsigned)dtype < KVF_DTYPE_COUNT) ? names[dtype] : "invalid";
}

/**
 * Parse a dtype name. Accepts the canonical names and Hugging Face spellings
 * ("float32", "bfloat16", "float16", "fp8_e4m3", "auto" is not accepted).
 * @return 0 and *dtype_p set, or -1 for an unknown name (*dtype_p untouched).
 */
int kvf_dtype_parse(const char *name, kvf_dtype_t *dtype_p);

/** bf16 <-> fp32, round to nearest even; NaN stays NaN. */
static inline uint16_t kvf_fp32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40u);   /* quiet NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float kvf_bf16_to_fp32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/** IEEE half <-> fp32 (F16C-free portable versions). */
uint16_t kvf_fp32_to_fp16(float f);
float    kvf_fp16_to_fp32(uint16_t h);

/**
 * fp32 <-> fp8 e4m3fn (OCP 8-bit floating point spec: bias 7, no infinity,
 * 0x7f/0xff NaN, max 448): round to nearest even, saturating at +-448.
 */
uint8_t kvf_fp32_to_fp8(float f);
float   kvf_fp8_to_fp32(uint8_t b);

/**
 * Load element @a i of a typed array as fp32, and store fp32 into one.
 * @a dtype must be fp32, bf16, fp16 or fp8; an invalid dtype loads 0 and
 * stores nothing.
 */
float kvf_dtype_load(const void *base, kvf_dtype_t dtype, size_t i);
void  kvf_dtype_store(void *base, kvf_dtype_t dtype, size_t i, float v);

#endif
