/* Lease table: release, expiry order, duplicates, late notifications. */
#include "kvf_lease.h"
#include "kvf_log.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

static void test_release_and_expire(void **state)
{
    kvf_lease_table_h t;
    int a = 1, b = 2, c = 3;
    void *out[4];
    (void)state;

    assert_int_equal(kvf_lease_table_create(&t), KVF_OK);
    assert_true(kvf_lease_table_next_expiry(t) == UINT64_MAX);
    assert_int_equal(kvf_lease_table_add(t, "r1", 100, &a), KVF_OK);
    assert_int_equal(kvf_lease_table_add(t, "r2", 50, &b), KVF_OK);
    assert_int_equal(kvf_lease_table_add(t, "r3", 200, &c), KVF_OK);
    assert_int_equal(kvf_lease_table_add(t, "r2", 999, &c), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_lease_table_add(t, "", 1, &c), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_lease_table_count(t), 3);
    assert_true(kvf_lease_table_next_expiry(t) == 50);

    assert_true(kvf_lease_table_shorten(t, "r3", 500));    /* later: no change */
    assert_true(kvf_lease_table_next_expiry(t) == 50);
    assert_true(kvf_lease_table_shorten(t, "r1", 40));     /* earlier: moves */
    assert_true(kvf_lease_table_next_expiry(t) == 40);
    assert_false(kvf_lease_table_shorten(t, "nope", 1));
    assert_ptr_equal(kvf_lease_table_release(t, "r1"), &a);
    assert_null(kvf_lease_table_release(t, "r1"));       /* duplicate notification */
    assert_int_equal(kvf_lease_table_expire(t, 49, out, 4), 0);
    assert_int_equal(kvf_lease_table_expire(t, 200, out, 1), 1);   /* cap respected */
    assert_int_equal(kvf_lease_table_expire(t, 200, out + 1, 3), 1);
    assert_true(((out[0] == &b) && (out[1] == &c)) || ((out[0] == &c) && (out[1] == &b)));
    assert_int_equal(kvf_lease_table_count(t), 0);
    assert_null(kvf_lease_table_release(t, "r2"));       /* release after expiry */
    kvf_lease_table_destroy(t);
}

static void test_many(void **state)
{
    kvf_lease_table_h t;
    void *out[1000];
    char id[32];
    (void)state;

    assert_int_equal(kvf_lease_table_create(&t), KVF_OK);
    for (int i = 0; i < 1000; ++i) {
        snprintf(id, sizeof(id), "req-%d", i);
        assert_int_equal(kvf_lease_table_add(t, id, (uint64_t)(i % 10), (void *)(intptr_t)(i + 1)),
                         KVF_OK);
    }
    for (int i = 0; i < 1000; i += 2) {
        snprintf(id, sizeof(id), "req-%d", i);
        assert_true(kvf_lease_table_release(t, id) == (void *)(intptr_t)(i + 1));
    }
    assert_int_equal(kvf_lease_table_expire(t, 4, out, 1000), 200);   /* odd i with i%10 in {1,3} */
    assert_int_equal(kvf_lease_table_count(t), 300);
    kvf_lease_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_release_and_expire),
        cmocka_unit_test(test_many),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
