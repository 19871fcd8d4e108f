/* dtype conversions: fp8 e4m3fn, fp16 and bf16 against hand-worked values. */
#include "kvf_dtype.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

static void test_fp8_known_values(void **state)
{
    (void)state;
    /* e4m3fn: sign | exponent (bias 7) | 3 mantissa bits */
    assert_int_equal(kvf_fp32_to_fp8(1.0f), 0x38);          /* E=7, M=0 */
    assert_int_equal(kvf_fp32_to_fp8(-2.0f), 0xc0);         /* sign, E=8 */
    assert_int_equal(kvf_fp32_to_fp8(448.0f), 0x7e);        /* max: E=15, M=6 */
    assert_int_equal(kvf_fp32_to_fp8(1e6f), 0x7e);          /* saturates, no infinity */
    assert_int_equal(kvf_fp32_to_fp8(-1e6f), 0xfe);
    assert_int_equal(kvf_fp32_to_fp8(ldexpf(1.0f, -9)), 0x01);   /* smallest subnormal */
    assert_int_equal(kvf_fp32_to_fp8(ldexpf(1.0f, -6)), 0x08);   /* smallest normal */
    assert_int_equal(kvf_fp32_to_fp8(0.0f), 0x00);
    assert_int_equal(kvf_fp32_to_fp8(NAN) & 0x7f, 0x7f);
    /* ties go to even: 1.0625 is halfway between 1.0 (M=0) and 1.125 (M=1) */
    assert_int_equal(kvf_fp32_to_fp8(1.0625f), 0x38);
    assert_int_equal(kvf_fp32_to_fp8(1.1875f), 0x3a);      /* halfway 1.125/1.25 -> M=2 */
    assert_true(kvf_fp8_to_fp32(0x7e) == 448.0f);
    assert_true(kvf_fp8_to_fp32(0x01) == ldexpf(1.0f, -9));
    assert_true(isnan(kvf_fp8_to_fp32(0xff)));
}

static void test_fp8_round_trip_all_codes(void **state)
{
    (void)state;
    for (int c = 0; c < 256; ++c) {
        float v = kvf_fp8_to_fp32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            assert_true(isnan(v));
            continue;
        }
        if (c == 0x80) {   /* -0 */
            assert_true(v == 0.0f && signbit(v));
        }
        assert_int_equal(kvf_fp32_to_fp8(v), c);
    }
}

static void test_dtype_load_store(void **state)
{
    uint8_t b8[4];
    uint16_t b16[4];
    (void)state;
    kvf_dtype_store(b8, KVF_DTYPE_FP8, 2, -0.5f);
    assert_true(kvf_dtype_load(b8, KVF_DTYPE_FP8, 2) == -0.5f);
    kvf_dtype_store(b16, KVF_DTYPE_FP16, 1, 65504.0f);
    assert_true(kvf_dtype_load(b16, KVF_DTYPE_FP16, 1) == 65504.0f);
    kvf_dtype_store(b16, KVF_DTYPE_BF16, 3, 1.0f + ldexpf(1.0f, -8));   /* tie -> even */
    assert_true(kvf_dtype_load(b16, KVF_DTYPE_BF16, 3) == 1.0f);
    assert_int_equal(kvf_dtype_size(KVF_DTYPE_FP8), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_known_values),
        cmocka_unit_test(test_fp8_round_trip_all_codes),
        cmocka_unit_test(test_dtype_load_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
