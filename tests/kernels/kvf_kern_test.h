/* Helpers for the kernel tests: deterministic random numbers, dtype
 * round trips for references, and tolerance checks. */
#ifndef KVF_KERN_TEST_H
#define KVF_KERN_TEST_H

#include "kvf_dtype.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

typedef struct {
    uint64_t s;
} kvf_test_rng_t;

/* xorshift64*: uniform in [lo, hi) */
static inline float kvf_test_rand(kvf_test_rng_t *r, float lo, float hi)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    uint64_t v = r->s * 2685821657736338717ull;
    return lo + (hi - lo) * (float)((double)(v >> 11) / 9007199254740992.0);
}

static inline void kvf_test_fill(kvf_test_rng_t *r, float *a, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; ++i) {
        a[i] = kvf_test_rand(r, lo, hi);
    }
}

/* The value a cache of @a dtype stores for v (round trip through the dtype). */
static inline float kvf_test_quant(kvf_dtype_t dtype, float v)
{
    switch (dtype) {
    case KVF_DTYPE_BF16: return kvf_bf16_to_fp32(kvf_fp32_to_bf16(v));
    case KVF_DTYPE_FP16: return kvf_fp16_to_fp32(kvf_fp32_to_fp16(v));
    default:             return v;
    }
}

/* Fail unless |a - b| <= atol + rtol * |b| for every element (NaN fails). */
static inline void kvf_test_assert_close(const float *a, const double *b, size_t n, double atol,
                                         double rtol, const char *what)
{
    for (size_t i = 0; i < n; ++i) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= atol + rtol * fabs(b[i]))) {
            fail_msg("%s: element %zu got %.9g expected %.9g (diff %.3g)", what, i, (double)a[i],
                     b[i], d);
        }
    }
}

static inline void kvf_test_assert_close_f(const float *a, const float *b, size_t n, double atol,
                                           double rtol, const char *what)
{
    for (size_t i = 0; i < n; ++i) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= atol + rtol * fabs((double)b[i]))) {
            fail_msg("%s: element %zu got %.9g expected %.9g (diff %.3g)", what, i, (double)a[i],
                     (double)b[i], d);
        }
    }
}

static inline size_t kvf_test_count_nan(const float *a, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; ++i) {
        k += isnan(a[i]) ? 1 : 0;
    }
    return k;
}

#endif
