/* The GPU GEMM's plan (kernels/kvf_gemm_plan.h), on the CPU: KVF_GPU_WEIGHTS' values (native
 * the default, exact and fp32 the CPU's bits, anything else refused), which dtypes are kept
 * and which go to cuBLASLt under each; an algorithm's key (no M by construction: calls of
 * one weight shape with any M share a key, another N, K, stride, dtype, device or alignment
 * gets its own; bad shapes and odd addresses refused); the alignment class; and the cache:
 * the first algorithm kept for a key is the one every later caller (another thread
 * included) gets, a full cache refuses. */
#include "kvf_gemm_plan.h"
#include "kvf_kern_test.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

static void test_weights_parse(void **state)
{
    kvf_gpu_weights_t m = KVF_GPU_W_FP32;

    (void)state;
    assert_int_equal(kvf_gpu_weights_parse(NULL, &m), 0);
    assert_int_equal(m, KVF_GPU_W_NATIVE);
    m = KVF_GPU_W_FP32;
    assert_int_equal(kvf_gpu_weights_parse("", &m), 0);
    assert_int_equal(m, KVF_GPU_W_NATIVE);
    assert_int_equal(kvf_gpu_weights_parse("exact", &m), 0);
    assert_int_equal(m, KVF_GPU_W_EXACT);
    assert_int_equal(kvf_gpu_weights_parse("fp32", &m), 0);
    assert_int_equal(m, KVF_GPU_W_FP32);
    assert_int_equal(kvf_gpu_weights_parse("native", &m), 0);
    assert_int_equal(m, KVF_GPU_W_NATIVE);
    const char *bad[] = {"bf16", "Native", "native ", "cublas", "fixed", "1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        m = KVF_GPU_W_FP32;
        assert_int_equal(kvf_gpu_weights_parse(bad[i], &m), -1);
        assert_int_equal(m, KVF_GPU_W_FP32); /* untouched */
    }
    assert_non_null(strstr(kvf_gpu_weights_help(), "exact (debugging"));
}

static void test_paths(void **state)
{
    (void)state;
    /* native: 16-bit kept, on cuBLASLt; fp32 on the fixed kernel */
    assert_true(kvf_gpu_weights_keeps(KVF_GPU_W_NATIVE, KVF_DTYPE_BF16));
    assert_true(kvf_gpu_weights_keeps(KVF_GPU_W_NATIVE, KVF_DTYPE_FP16));
    assert_int_equal(kvf_gpu_gemm_path(KVF_GPU_W_NATIVE, KVF_DTYPE_BF16), KVF_GEMM_PATH_LT);
    assert_int_equal(kvf_gpu_gemm_path(KVF_GPU_W_NATIVE, KVF_DTYPE_FP16), KVF_GEMM_PATH_LT);
    assert_int_equal(kvf_gpu_gemm_path(KVF_GPU_W_NATIVE, KVF_DTYPE_FP32), KVF_GEMM_PATH_FIXED);
    /* exact: bf16 kept for the fixed kernel, fp16 widened; never cuBLASLt */
    assert_true(kvf_gpu_weights_keeps(KVF_GPU_W_EXACT, KVF_DTYPE_BF16));
    assert_false(kvf_gpu_weights_keeps(KVF_GPU_W_EXACT, KVF_DTYPE_FP16));
    assert_int_equal(kvf_gpu_gemm_path(KVF_GPU_W_EXACT, KVF_DTYPE_BF16), KVF_GEMM_PATH_FIXED);
    /* fp32: everything widened */
    assert_false(kvf_gpu_weights_keeps(KVF_GPU_W_FP32, KVF_DTYPE_BF16));
    assert_false(kvf_gpu_weights_keeps(KVF_GPU_W_FP32, KVF_DTYPE_FP16));
    assert_int_equal(kvf_gpu_gemm_path(KVF_GPU_W_FP32, KVF_DTYPE_FP16), KVF_GEMM_PATH_FIXED);
    for (int m = KVF_GPU_W_NATIVE; m <= KVF_GPU_W_FP32; ++m) {
        assert_true(kvf_gpu_weights_keeps((kvf_gpu_weights_t)m, KVF_DTYPE_FP32));
    }
}

static void test_align(void **state)
{
    uintptr_t base = 0x100000; /* 256-aligned, as the device allocator and arena give */
    const void *w = (const void *)base, *xs = (const void *)(base + 0x1000);
    const float *y = (const float *)(base + 0x2000);

    (void)state;
    assert_int_equal(kvf_gemm_lt_align(w, 4096, xs, 4096, y, 14336), 16);
    /* K = 4 (8-byte rows of xs) */
    assert_int_equal(kvf_gemm_lt_align(w, 4, xs, 4, y, 16), 8);
    /* a column slice of y at an offset of 1 float: 4 bytes */
    assert_int_equal(kvf_gemm_lt_align(w, 64, xs, 64, y + 1, 64), 4);
    /* odd K: 2-byte rows */
    assert_int_equal(kvf_gemm_lt_align(w, 33, xs, 33, y, 64), 2);
    /* a 16-bit array at an odd address */
    assert_int_equal(kvf_gemm_lt_align((const char *)w + 1, 64, xs, 64, y, 64), 0);
}

static void test_key(void **state)
{
    uintptr_t base = 0x100000;
    const void *w = (const void *)base, *xs = (const void *)(base + 0x1000);
    const float *y = (const float *)(base + 0x2000);
    kvf_gemm_lt_key_t a, b;

    (void)state;
    /* the key has no M: a call's key is the same whatever its batch (the same inputs twice
     * give the same bytes, padding included, so the cache's memcmp finds it) */
    assert_int_equal(kvf_gemm_lt_key(0, 14336, 4096, 4096, KVF_DTYPE_BF16, w, xs, y, 14336, &a), 0);
    assert_int_equal(kvf_gemm_lt_key(0, 14336, 4096, 4096, KVF_DTYPE_BF16, w, xs, y, 14336, &b), 0);
    assert_memory_equal(&a, &b, sizeof(a));
    assert_int_equal(a.align, 16);
    /* anything the choice may depend on makes another key */
    const struct { int ord, n, k, ldw, ldy; kvf_dtype_t dt; size_t yoff; } other[] = {
        {1, 14336, 4096, 4096, 14336, KVF_DTYPE_BF16, 0},
        {0, 4096, 4096, 4096, 14336, KVF_DTYPE_BF16, 0},
        {0, 14336, 2048, 4096, 14336, KVF_DTYPE_BF16, 0},
        {0, 14336, 4096, 8192, 14336, KVF_DTYPE_BF16, 0},
        {0, 14336, 4096, 4096, 28672, KVF_DTYPE_BF16, 0},
        {0, 14336, 4096, 4096, 14336, KVF_DTYPE_FP16, 0},
        {0, 14336, 4096, 4096, 14336, KVF_DTYPE_BF16, 1},
    };
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); ++i) {
        assert_int_equal(kvf_gemm_lt_key(other[i].ord, other[i].n, other[i].k, other[i].ldw,
                                         other[i].dt, w, xs, y + other[i].yoff, other[i].ldy,
                                         &b), 0);
        assert_memory_not_equal(&a, &b, sizeof(a));
    }
    /* refused: sizes, strides, dtypes, odd addresses, devices */
    assert_int_equal(kvf_gemm_lt_key(0, 0, 64, 64, KVF_DTYPE_BF16, w, xs, y, 64, &b), -1);
    assert_int_equal(kvf_gemm_lt_key(0, 64, 0, 64, KVF_DTYPE_BF16, w, xs, y, 64, &b), -1);
    assert_int_equal(kvf_gemm_lt_key(0, 64, 64, 32, KVF_DTYPE_BF16, w, xs, y, 64, &b), -1);
    assert_int_equal(kvf_gemm_lt_key(0, 64, 64, 64, KVF_DTYPE_BF16, w, xs, y, 32, &b), -1);
    assert_int_equal(kvf_gemm_lt_key(0, 64, 64, 64, KVF_DTYPE_FP32, w, xs, y, 64, &b), -1);
    assert_int_equal(kvf_gemm_lt_key(-1, 64, 64, 64, KVF_DTYPE_BF16, w, xs, y, 64, &b), -1);
    assert_int_equal(kvf_gemm_lt_key(0, 64, 64, 64, KVF_DTYPE_BF16, (const char *)w + 1, xs, y,
                                     64, &b), -1);
}

static kvf_gemm_lt_cache_t cache = KVF_GEMM_LT_CACHE_INIT;

static void *racer(void *arg)
{
    kvf_gemm_lt_key_t *key = arg;
    uint64_t algo[8];
    memset(algo, 0x77, sizeof(algo));
    if (kvf_gemm_lt_cache_put(&cache, key, algo) != 0) {
        return (void *)1;
    }
    return (algo[0] == 0x1111111111111111ull) ? NULL : (void *)1; /* got the first choice */
}

static void test_cache(void **state)
{
    uintptr_t base = 0x100000;
    const void *w = (const void *)base, *xs = (const void *)(base + 0x1000);
    const float *y = (const float *)(base + 0x2000);
    kvf_gemm_lt_key_t key;
    uint64_t algo[8], got[8];
    pthread_t th[4];

    (void)state;
    assert_int_equal(kvf_gemm_lt_key(0, 4096, 4096, 4096, KVF_DTYPE_BF16, w, xs, y, 4096, &key),
                     0);
    assert_false(kvf_gemm_lt_cache_find(&cache, &key, got));
    memset(algo, 0x11, sizeof(algo));
    assert_int_equal(kvf_gemm_lt_cache_put(&cache, &key, algo), 0);
    memset(got, 0, sizeof(got));
    assert_true(kvf_gemm_lt_cache_find(&cache, &key, got));
    assert_memory_equal(got, algo, sizeof(algo));
    /* racing rank threads putting another choice get the first one back */
    for (int i = 0; i < 4; ++i) {
        assert_int_equal(pthread_create(&th[i], NULL, racer, &key), 0);
    }
    for (int i = 0; i < 4; ++i) {
        void *r = (void *)1;
        pthread_join(th[i], &r);
        assert_null(r);
    }
    assert_int_equal(kvf_gemm_lt_cache_count(&cache), 1);
    /* fill it: one key per N; the next new key is refused, a known one still found */
    for (int n = 1; kvf_gemm_lt_cache_count(&cache) < KVF_GEMM_LT_CACHE_CAP; ++n) {
        kvf_gemm_lt_key_t k2;
        assert_int_equal(kvf_gemm_lt_key(0, n, 64, 64, KVF_DTYPE_FP16, w, xs, y, 8192, &k2), 0);
        assert_int_equal(kvf_gemm_lt_cache_put(&cache, &k2, algo), 0);
    }
    kvf_gemm_lt_key_t k3;
    assert_int_equal(kvf_gemm_lt_key(0, 8192, 64, 64, KVF_DTYPE_FP16, w, xs, y, 8192, &k3), 0);
    assert_int_equal(kvf_gemm_lt_cache_put(&cache, &k3, algo), -1);
    assert_true(kvf_gemm_lt_cache_find(&cache, &key, got));
    assert_int_equal(kvf_gemm_lt_cache_count(kvf_gemm_lt_cache_process()), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weights_parse), cmocka_unit_test(test_paths),
        cmocka_unit_test(test_align),         cmocka_unit_test(test_key),
        cmocka_unit_test(test_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
