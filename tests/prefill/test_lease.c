/*
 * Lease table: claims bind and extend, releases per decode rank, verdicts
 * (valid / expired / refused), quarantine of expired and aborted leases,
 * tombstones for late and replayed releases, and the counters /metrics shows.
 */
#include "kvf_lease.h"
#include "kvf_log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#define NONCE 0x1234abcdull

static int g_a = 1, g_b = 2;

static size_t collect(kvf_lease_table_h t, uint64_t now, void **out)
{
    return kvf_lease_table_collect(t, now, out, 8, NULL);
}

static void test_released_by_every_rank(void **state)
{
    kvf_lease_table_h t;
    kvf_lease_answer_t a;
    kvf_lease_stats_t st;
    void *out[8];
    (void)state;

    assert_int_equal(kvf_lease_table_create(&t), KVF_OK);
    kvf_lease_table_set_quarantine(t, 1000);
    assert_true(kvf_lease_table_next_event(t) == UINT64_MAX);
    assert_int_equal(kvf_lease_table_add(t, "r1", NONCE, 0, 100, 3, &g_a), KVF_OK);
    assert_int_equal(kvf_lease_table_add(t, "r1", NONCE, 0, 100, 3, &g_b), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_lease_table_add(t, "", NONCE, 0, 100, 3, &g_b), KVF_ERR_INVALID_PARAM);
    assert_true(kvf_lease_table_next_event(t) == 100);

    /* claim at 60: bound to decode-0, extended to 60 + 100 */
    kvf_lease_table_claim(t, "r1", NONCE, "decode-0", 60, 100, &a);
    assert_int_equal(a.verdict, KVF_LEASE_VALID);
    assert_int_equal(a.ms_left, 100);
    assert_true(kvf_lease_table_next_event(t) == 160);

    /* rank 0 of 2 released: still pinned; rank 1 ends it */
    kvf_lease_table_release(t, "r1", NONCE, "decode-0", 0, 2, 120, &a);
    assert_int_equal(a.verdict, KVF_LEASE_VALID);
    assert_int_equal(collect(t, 121, out), 0);
    assert_int_equal(kvf_lease_table_count(t), 1);
    kvf_lease_table_release(t, "r1", NONCE, "decode-0", 1, 2, 130, &a);
    assert_int_equal(a.verdict, KVF_LEASE_VALID);
    assert_int_equal(collect(t, 131, out), 1);
    assert_ptr_equal(out[0], &g_a);
    assert_int_equal(kvf_lease_table_count(t), 0);
    assert_int_equal(kvf_lease_table_pinned(t), 0);

    /* a replayed release of the ended lease is refused, not "unknown" */
    kvf_lease_table_release(t, "r1", NONCE, "decode-0", 1, 2, 140, &a);
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    assert_non_null(strstr(a.why, "already released"));
    kvf_lease_table_stats(t, &st);
    assert_int_equal(st.released, 1);
    assert_int_equal(st.refused, 1);
    assert_int_equal(st.expired, 0);
    assert_int_equal(st.quarantined_blocks, 0);
    kvf_lease_table_destroy(t);
}

static void test_refused_operations(void **state)
{
    kvf_lease_table_h t;
    kvf_lease_answer_t a;
    kvf_lease_stats_t st;
    void *out[8];
    (void)state;

    assert_int_equal(kvf_lease_table_create(&t), KVF_OK);
    assert_int_equal(kvf_lease_table_add(t, "r1", NONCE, 0, 1000, 2, &g_a), KVF_OK);
    kvf_lease_table_claim(t, "r1", NONCE + 1, "decode-0", 1, 1000, &a);       /* wrong nonce */
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    assert_non_null(strstr(a.why, "wrong nonce"));
    kvf_lease_table_claim(t, "nope", NONCE, "decode-0", 1, 1000, &a);         /* unknown */
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    kvf_lease_table_claim(t, "r1", NONCE, "decode-0", 2, 1000, &a);
    assert_int_equal(a.verdict, KVF_LEASE_VALID);
    kvf_lease_table_release(t, "r1", NONCE, "decode-1", 0, 1, 3, &a);        /* other engine */
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    assert_non_null(strstr(a.why, "belongs to decode engine decode-0"));
    kvf_lease_table_release(t, "r1", NONCE, "decode-0", 0, 2, 4, &a);
    assert_int_equal(a.verdict, KVF_LEASE_VALID);
    kvf_lease_table_release(t, "r1", NONCE, "decode-0", 0, 2, 5, &a);        /* replayed rank */
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    kvf_lease_table_release(t, "r1", NONCE, "decode-0", 1, 4, 6, &a);        /* tp changed */
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    kvf_lease_table_claim(t, "r1", NONCE, "decode-0", 7, 1000, &a);          /* claim after release */
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    /* none of that freed anything; the real last release still works */
    assert_int_equal(collect(t, 8, out), 0);
    kvf_lease_table_release(t, "r1", NONCE, "decode-0", 1, 2, 9, &a);
    assert_int_equal(a.verdict, KVF_LEASE_VALID);
    assert_int_equal(collect(t, 10, out), 1);
    kvf_lease_table_stats(t, &st);
    assert_int_equal(st.refused, 6);
    assert_int_equal(st.released, 1);
    kvf_lease_table_destroy(t);
}

static void test_expiry_quarantine_and_late_release(void **state)
{
    kvf_lease_table_h t;
    kvf_lease_answer_t a;
    kvf_lease_stats_t st;
    size_t expired = 0;
    void *out[8];
    (void)state;

    assert_int_equal(kvf_lease_table_create(&t), KVF_OK);
    kvf_lease_table_set_quarantine(t, 500);
    assert_int_equal(kvf_lease_table_add(t, "r1", NONCE, 0, 100, 3, &g_a), KVF_OK);
    kvf_lease_table_claim(t, "r1", NONCE, "decode-0", 10, 100, &a);   /* until 110 */
    assert_int_equal(kvf_lease_table_collect(t, 109, out, 8, &expired), 0);
    assert_int_equal(expired, 0);
    /* expired at 110: quarantined until 610, not freed */
    assert_int_equal(kvf_lease_table_collect(t, 110, out, 8, &expired), 0);
    assert_int_equal(expired, 1);
    assert_int_equal(kvf_lease_table_count(t), 0);
    assert_int_equal(kvf_lease_table_pinned(t), 1);
    kvf_lease_table_stats(t, &st);
    assert_int_equal(st.quarantined_now, 3);
    assert_int_equal(st.quarantined_blocks, 3);
    /* the late read's release: expired, so decode must not use the bytes */
    kvf_lease_table_release(t, "r1", NONCE, "decode-0", 0, 1, 300, &a);
    assert_int_equal(a.verdict, KVF_LEASE_EXPIRED);
    assert_non_null(strstr(a.why, "expired before the read finished"));
    assert_int_equal(collect(t, 609, out), 0);
    assert_int_equal(collect(t, 610, out), 1);
    kvf_lease_table_stats(t, &st);
    assert_int_equal(st.quarantined_now, 0);
    /* even after the quarantine, a late release of it is answered expired */
    kvf_lease_table_claim(t, "r1", NONCE, "decode-0", 700, 100, &a);
    assert_int_equal(a.verdict, KVF_LEASE_EXPIRED);
    kvf_lease_table_stats(t, &st);
    assert_int_equal(st.expired, 1);
    assert_int_equal(st.expired_answers, 2);
    /* the tombstone goes eventually; then the id is unknown */
    assert_int_equal(collect(t, 610 + KVF_LEASE_TOMBSTONE_MS, out), 0);
    kvf_lease_table_claim(t, "r1", NONCE, "decode-0", 700 + KVF_LEASE_TOMBSTONE_MS, 100, &a);
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    kvf_lease_table_destroy(t);
}

static void test_expired_detected_at_release(void **state)
{
    kvf_lease_table_h t;
    kvf_lease_answer_t a;
    void *out[8];
    (void)state;

    /* the release arrives after the expiry but before the leader collected */
    assert_int_equal(kvf_lease_table_create(&t), KVF_OK);
    kvf_lease_table_set_quarantine(t, 200);
    assert_int_equal(kvf_lease_table_add(t, "r1", NONCE, 0, 100, 1, &g_a), KVF_OK);
    kvf_lease_table_release(t, "r1", NONCE, "decode-0", 0, 1, 150, &a);
    assert_int_equal(a.verdict, KVF_LEASE_EXPIRED);
    assert_int_equal(collect(t, 349, out), 0);     /* quarantined from 150 */
    assert_int_equal(collect(t, 350, out), 1);
    kvf_lease_table_destroy(t);
}

static void test_abort_quarantines(void **state)
{
    kvf_lease_table_h t;
    kvf_lease_answer_t a;
    void *out[8];
    (void)state;

    assert_int_equal(kvf_lease_table_create(&t), KVF_OK);
    kvf_lease_table_set_quarantine(t, 300);
    assert_int_equal(kvf_lease_table_add(t, "r1", NONCE, 0, 10000, 2, &g_a), KVF_OK);
    assert_int_equal(kvf_lease_table_add(t, "r2", NONCE, 0, 10000, 2, &g_b), KVF_OK);
    assert_true(kvf_lease_table_abort(t, "r1", 50));
    assert_false(kvf_lease_table_abort(t, "r1", 60));   /* not held any more */
    assert_false(kvf_lease_table_abort(t, "zz", 60));
    kvf_lease_table_release(t, "r1", NONCE, "decode-0", 0, 1, 100, &a);
    assert_int_equal(a.verdict, KVF_LEASE_EXPIRED);
    assert_int_equal(collect(t, 349, out), 0);
    assert_true(kvf_lease_table_next_event(t) == 350);
    assert_int_equal(collect(t, 350, out), 1);
    assert_ptr_equal(out[0], &g_a);
    assert_int_equal(kvf_lease_table_count(t), 1);
    kvf_lease_table_destroy(t);
}

/* The side-channel thread answers while the leader adds and collects. */
typedef struct {
    kvf_lease_table_h t;
    int               n;
} race_t;

static void *race_releaser(void *arg)
{
    race_t *r = arg;
    kvf_lease_answer_t a;
    char id[32];
    for (int i = 0; i < r->n; ++i) {
        snprintf(id, sizeof(id), "q%d", i);
        do {
            kvf_lease_table_release(r->t, id, NONCE, "decode-0", 0, 1, 1, &a);
        } while (a.verdict == KVF_LEASE_REFUSED && strstr(a.why, "no lease") != NULL);
        assert_int_equal(a.verdict, KVF_LEASE_VALID);
    }
    return NULL;
}

static void test_threads(void **state)
{
    race_t r;
    pthread_t th;
    size_t freed = 0;
    void *out[8];
    (void)state;

    assert_int_equal(kvf_lease_table_create(&r.t), KVF_OK);
    r.n = 2000;
    assert_int_equal(pthread_create(&th, NULL, race_releaser, &r), 0);
    for (int i = 0; i < r.n; ++i) {
        char id[32];
        snprintf(id, sizeof(id), "q%d", i);
        assert_int_equal(kvf_lease_table_add(r.t, id, NONCE, 0, 1000000, 1, &g_a), KVF_OK);
        freed += collect(r.t, 1, out);
    }
    pthread_join(th, NULL);
    while (freed < (size_t)r.n) {
        size_t n = collect(r.t, 1, out);
        assert_true(n > 0);
        freed += n;
    }
    assert_int_equal(kvf_lease_table_pinned(r.t), 0);
    kvf_lease_table_destroy(r.t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_released_by_every_rank),
        cmocka_unit_test(test_refused_operations),
        cmocka_unit_test(test_expiry_quarantine_and_late_release),
        cmocka_unit_test(test_expired_detected_at_release),
        cmocka_unit_test(test_abort_quarantines),
        cmocka_unit_test(test_threads),
    };
    kvf_log_set_level(KVF_LOG_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
