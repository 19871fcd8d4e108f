/*
 * The GPU GEMM's plan: KVF_GPU_WEIGHTS, the path of a matrix, an algorithm's key and the
 * process's cache of chosen algorithms (kvf_gemm_plan.h says why each is so).
 */
#include "kvf_gemm_plan.h"

#include <string.h>

int kvf_gpu_weights_parse(const char *value, kvf_gpu_weights_t *mode)
{
    if ((value == NULL) || (value[0] == '\0') || (strcmp(value, "native") == 0)) {
        *mode = KVF_GPU_W_NATIVE;
    } else if (strcmp(value, "exact") == 0) {
        *mode = KVF_GPU_W_EXACT;
    } else if (strcmp(value, "fp32") == 0) {
        *mode = KVF_GPU_W_FP32;
    } else {
        return -1;
    }
    return 0;
}

const char *kvf_gpu_weights_help(void)
{
    return "native (the default: bf16/fp16 matrices kept, tensor-core GEMMs through cuBLASLt "
           "with one algorithm per weight shape, batch invariant), exact (debugging: bf16 kept "
           "and widened in the fixed-order kernel, the CPU's bits) or fp32 (every matrix "
           "widened at load, the CPU's bits)";
}

int kvf_gpu_weights_keeps(kvf_gpu_weights_t mode, kvf_dtype_t dtype)
{
    switch (dtype) {
    case KVF_DTYPE_FP32:
        return 1;
    case KVF_DTYPE_BF16:
        return mode != KVF_GPU_W_FP32;
    case KVF_DTYPE_FP16:
        return mode == KVF_GPU_W_NATIVE;
    default:
        return 0;
    }
}

kvf_gemm_path_t kvf_gpu_gemm_path(kvf_gpu_weights_t mode, kvf_dtype_t dtype)
{
    return ((mode == KVF_GPU_W_NATIVE) &&
            ((dtype == KVF_DTYPE_BF16) || (dtype == KVF_DTYPE_FP16))) ? KVF_GEMM_PATH_LT
                                                                      : KVF_GEMM_PATH_FIXED;
}

/* The largest power of two <= 16 dividing @a v (16 for 0). */
static int kvf_pow2_div(uintptr_t v)
{
    int a = 16;
    while ((a > 1) && ((v % (uintptr_t)a) != 0)) {
        a /= 2;
    }
    return a;
}

int kvf_gemm_lt_align(const void *w, int ldw, const void *xs, int K, const float *y, int ldy)
{
    const uintptr_t parts[6] = {(uintptr_t)w, (uintptr_t)xs, (uintptr_t)y,
                                (uintptr_t)ldw * 2u, (uintptr_t)K * 2u, (uintptr_t)ldy * 4u};
    int a = 16;

    for (int i = 0; i < 6; ++i) {
        int d = kvf_pow2_div(parts[i]);
        a = (d < a) ? d : a;
    }
    return (a >= 2) ? a : 0;
}

int kvf_gemm_lt_key(int ordinal, int N, int K, int ldw, kvf_dtype_t dtype, const void *w,
                    const void *xs, const float *y, int ldy, kvf_gemm_lt_key_t *key)
{
    int align;

    if ((N < 1) || (K < 1) || (ldw < K) || (ldy < N) || (ordinal < 0) ||
        ((dtype != KVF_DTYPE_BF16) && (dtype != KVF_DTYPE_FP16))) {
        return -1;
    }
    align = kvf_gemm_lt_align(w, ldw, xs, K, y, ldy);
    if (align == 0) {
        return -1;
    }
    memset(key, 0, sizeof(*key));
    key->ordinal = ordinal;
    key->n = N;
    key->k = K;
    key->ldw = ldw;
    key->ldy = ldy;
    key->dtype = (int32_t)dtype;
    key->align = align;
    return 0;
}

static kvf_gemm_lt_cache_t kvf_gemm_lt_cache_v = KVF_GEMM_LT_CACHE_INIT;

kvf_gemm_lt_cache_t *kvf_gemm_lt_cache_process(void)
{
    return &kvf_gemm_lt_cache_v;
}

static int kvf_lt_slot(const kvf_gemm_lt_cache_t *c, const kvf_gemm_lt_key_t *key)
{
    for (int i = 0; i < c->n; ++i) {
        if (memcmp(&c->keys[i], key, sizeof(*key)) == 0) {
            return i;
        }
    }
    return -1;
}

int kvf_gemm_lt_cache_find(kvf_gemm_lt_cache_t *c, const kvf_gemm_lt_key_t *key, void *algo)
{
    int i;

    pthread_mutex_lock(&c->lock);
    i = kvf_lt_slot(c, key);
    if (i >= 0) {
        memcpy(algo, c->algos[i], KVF_GEMM_LT_ALGO_BYTES);
    }
    pthread_mutex_unlock(&c->lock);
    return i >= 0;
}

int kvf_gemm_lt_cache_put(kvf_gemm_lt_cache_t *c, const kvf_gemm_lt_key_t *key, void *algo)
{
    int i, rc = 0;

    pthread_mutex_lock(&c->lock);
    i = kvf_lt_slot(c, key);
    if (i >= 0) {
        memcpy(algo, c->algos[i], KVF_GEMM_LT_ALGO_BYTES); /* the first choice stays */
    } else if (c->n >= KVF_GEMM_LT_CACHE_CAP) {
        rc = -1;
    } else {
        c->keys[c->n] = *key;
        memcpy(c->algos[c->n], algo, KVF_GEMM_LT_ALGO_BYTES);
        c->n++;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int kvf_gemm_lt_cache_count(kvf_gemm_lt_cache_t *c)
{
    int n;

    pthread_mutex_lock(&c->lock);
    n = c->n;
    pthread_mutex_unlock(&c->lock);
    return n;
}
