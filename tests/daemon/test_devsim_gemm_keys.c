/*
 * The simulated GPU's check of the tensor-core GEMM's keys (devsim/kvf_devsim_gemm.c): a weight
 * matrix that gets another algorithm key is reported, and a freed allocation's keys are
 * dropped, so another matrix on its reused addresses (the next engine of one process) is
 * not compared with the freed one's key.
 */
#include "devsim/kvf_devsim_gemm.h"
#include "kvf_dtype.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

/* The errors counted so far, from the report line. */
static unsigned long long key_errors(void)
{
    char line[512] = {0};
    FILE *f = tmpfile();
    const char *at;

    assert_non_null(f);
    devsim_gemm_lt_report(f);
    rewind(f);
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    at = strstr(line, "gemm_lt_key_errors ");
    assert_non_null(at);
    return strtoull(at + strlen("gemm_lt_key_errors "), NULL, 10);
}

/* One call of a bf16 N x K matrix at @a w with row stride @a ldw; what it printed. */
static void call(const void *w, int ldw, char *said, size_t cap)
{
    static float y[64 * 64] __attribute__((aligned(256)));
    static uint16_t xs[64 * 64] __attribute__((aligned(256)));
    FILE *err = tmpfile();
    int keep = dup(2);
    size_t n;

    assert_non_null(err);
    fflush(stderr);
    dup2(fileno(err), 2);
    devsim_gemm_lt_check(0, 32, 64, w, KVF_DTYPE_BF16, ldw, xs, y, 64);
    fflush(stderr);
    dup2(keep, 2);
    close(keep);
    rewind(err);
    n = fread(said, 1, cap - 1, err);
    said[n] = '\0';
    fclose(err);
}

static void test_keys(void **state)
{
    uint16_t *a = aligned_alloc(256, 32 * 128 * sizeof(uint16_t));
    char said[512];

    (void)state;
    assert_non_null(a);
    call(a, 64, said, sizeof(said));
    call(a, 64, said, sizeof(said));
    assert_int_equal(key_errors(), 0);
    assert_string_equal(said, "");
    /* a real conflict: the same live matrix with another stride, so another key */
    call(a, 128, said, sizeof(said));
    assert_int_equal(key_errors(), 1);
    assert_non_null(strstr(said, "another algorithm key"));
    /* a free elsewhere keeps its key: still a conflict */
    devsim_gemm_lt_forget((uintptr_t)a + 32 * 128 * sizeof(uint16_t),
                          (uintptr_t)a + 64 * 128 * sizeof(uint16_t));
    call(a, 128, said, sizeof(said));
    assert_int_equal(key_errors(), 2);
    /* its allocation freed: the same address is a new matrix (the next engine's) */
    devsim_gemm_lt_forget((uintptr_t)a, (uintptr_t)a + 32 * 128 * sizeof(uint16_t));
    call(a, 128, said, sizeof(said));
    call(a + 8, 128, said, sizeof(said));
    assert_int_equal(key_errors(), 2);
    assert_string_equal(said, "");
    /* and that new matrix is held to its own key */
    call(a, 64, said, sizeof(said));
    assert_int_equal(key_errors(), 3);
    assert_non_null(strstr(said, "another algorithm key"));
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
