/* dtype parsing and scalar conversions shared by kernels and geometry. */
#include "kvf_dtype.h"
#include "kvf_dtype_math.h"

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

/* The conversions are the shared host/device bodies (kvf_dtype_math.h), so
 * the CPU, the CUDA kernels and the cache layers round the same bits. */
_Static_assert((KVF_DTYPE_FP32 == KVF_HD_FP32) && (KVF_DTYPE_BF16 == KVF_HD_BF16) &&
               (KVF_DTYPE_FP16 == KVF_HD_FP16) && (KVF_DTYPE_FP8 == KVF_HD_FP8),
               "kvf_dtype_t codes differ from kvf_dtype_math.h's");

uint16_t kvf_fp32_to_fp16(float f)
{
    return kvf_hd_fp32_to_fp16(f);
}

float kvf_fp16_to_fp32(uint16_t h)
{
    return kvf_hd_fp16_to_fp32(h);
}

uint8_t kvf_fp32_to_fp8(float f)
{
    return kvf_hd_fp32_to_fp8(f);
}

float kvf_fp8_to_fp32(uint8_t b)
{
    return kvf_hd_fp8_to_fp32(b);
}

float kvf_dtype_load(const void *base, kvf_dtype_t dtype, size_t i)
{
    return kvf_hd_load(base, (int)dtype, i);
}

void kvf_dtype_store(void *base, kvf_dtype_t dtype, size_t i, float v)
{
    kvf_hd_store(base, (int)dtype, i, v);
}
