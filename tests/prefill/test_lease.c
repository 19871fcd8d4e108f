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
    assert_non_null(strstr(a.why, "no lease matches request r1"));
    kvf_lease_table_claim(t, "nope", NONCE, "decode-0", 1, 1000, &a);         /* unknown */
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    kvf_lease_table_claim(t, "r1", NONCE, "decode-0", 2, 1000, &a);
    assert_int_equal(a.verdict, KVF_LEASE_VALID);
    kvf_lease_table_release(t, "r1", NONCE, "decode-1", 0, 1, 3, &a);        /* other engine */
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    assert_non_null(strstr(a.why, "no lease matches request r1"));
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

/* A probe cannot tell an unknown request from a wrong nonce or another owner. */
static void test_refusals_reveal_nothing(void **state)
{
    kvf_lease_table_h t, empty;
    kvf_lease_answer_t wrong_nonce, unknown, other_owner;
    (void)state;

    assert_int_equal(kvf_lease_table_create(&t), KVF_OK);
    assert_int_equal(kvf_lease_table_create(&empty), KVF_OK);
    assert_int_equal(kvf_lease_table_add(t, "r1", NONCE, 0, 1000, 2, &g_a), KVF_OK);
    kvf_lease_table_claim(t, "r1", NONCE + 1, "decode-0", 1, 1000, &wrong_nonce);
    kvf_lease_table_claim(empty, "r1", NONCE, "decode-0", 1, 1000, &unknown);
    kvf_lease_table_claim(t, "r1", NONCE, "decode-0", 2, 1000, &other_owner);
    assert_int_equal(other_owner.verdict, KVF_LEASE_VALID);
    kvf_lease_table_claim(t, "r1", NONCE, "decode-9", 3, 1000, &other_owner);
    assert_int_equal(wrong_nonce.verdict, KVF_LEASE_REFUSED);
    assert_int_equal(unknown.verdict, wrong_nonce.verdict);
    assert_int_equal(other_owner.verdict, wrong_nonce.verdict);
    assert_true(unknown.ms_left == wrong_nonce.ms_left);
    assert_true(other_owner.ms_left == wrong_nonce.ms_left);
    assert_string_equal(unknown.why, wrong_nonce.why);
    assert_string_equal(other_owner.why, wrong_nonce.why);
    kvf_lease_table_destroy(empty);
    kvf_lease_table_destroy(t);
}

/* The nonce binds the block lists: a claim or release for other blocks is refused. */
static void test_ids_bound(void **state)
{
    kvf_lease_table_h t;
    kvf_lease_answer_t a;
    kvf_lease_msg_t m;
    void *out[8];
    int32_t ids0[3] = {4, 5, 6}, ids1[3] = {4, 5, 7};
    int32_t *lists[1] = {ids0};
    int n[1] = {3};
    uint64_t leased = kvf_xfer_ids_digest(lists, n, 1);
    (void)state;

    lists[0] = ids1;
    assert_true(kvf_xfer_ids_digest(lists, n, 1) != leased);
    assert_int_equal(kvf_lease_table_create(&t), KVF_OK);
    assert_int_equal(kvf_lease_table_add(t, "r1", NONCE, 0, 1000, 3, &g_a), KVF_OK);
    assert_int_equal(kvf_lease_table_bind_ids(t, "r1", leased), KVF_OK);
    assert_int_equal(kvf_lease_table_bind_ids(t, "nope", leased), KVF_ERR_NOT_FOUND);
    memset(&m, 0, sizeof(m));
    m.op = KVF_LEASE_OP_CLAIM;
    snprintf(m.request_id, sizeof(m.request_id), "r1");
    m.nonce = NONCE;
    kvf_lease_table_answer(t, "decode-0", &m, 1, 1000, &a);     /* no digest: refused */
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    m.has_ids_digest = true;
    m.ids_digest = kvf_xfer_ids_digest(lists, n, 1);             /* other blocks: refused */
    kvf_lease_table_answer(t, "decode-0", &m, 2, 1000, &a);
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    m.ids_digest = leased;
    kvf_lease_table_answer(t, "decode-0", &m, 3, 1000, &a);
    assert_int_equal(a.verdict, KVF_LEASE_VALID);
    /* one release for every decode rank (tp 4) frees the blocks */
    m.op = KVF_LEASE_OP_RELEASE;
    m.all_ranks = true;
    m.decode_tp = 4;
    kvf_lease_table_answer(t, "decode-0", &m, 4, 1000, &a);
    assert_int_equal(a.verdict, KVF_LEASE_VALID);
    assert_int_equal(collect(t, 5, out), 1);
    kvf_lease_table_answer(t, "decode-0", &m, 6, 1000, &a);     /* a replay of it */
    assert_int_equal(a.verdict, KVF_LEASE_REFUSED);
    kvf_lease_table_destroy(t);
}

/* A failed or abandoned pull's release gives the blocks back at once, quarantined or not. */
static void test_abandon_frees_at_once(void **state)
{
    kvf_lease_table_h t;
    kvf_lease_answer_t a;
    kvf_lease_stats_t st;
    kvf_lease_msg_t m;
    void *out[8];
    (void)state;

    assert_int_equal(kvf_lease_table_create(&t), KVF_OK);
    kvf_lease_table_set_quarantine(t, 10000);
    assert_int_equal(kvf_lease_table_add(t, "r1", NONCE, 0, 30000, 2, &g_a), KVF_OK);
    assert_int_equal(kvf_lease_table_add(t, "r2", NONCE, 0, 30000, 2, &g_b), KVF_OK);
    memset(&m, 0, sizeof(m));
    m.op = KVF_LEASE_OP_RELEASE;
    m.nonce = NONCE;
    m.all_ranks = true;
    m.decode_tp = 2;
    m.status = KVF_ERR_PEER_TIMEOUT;
    snprintf(m.request_id, sizeof(m.request_id), "r1");          /* held: freed at once */
    kvf_lease_table_answer(t, "decode-0", &m, 10, 30000, &a);
    assert_int_equal(a.verdict, KVF_LEASE_EXPIRED);
    assert_int_equal(collect(t, 11, out), 1);
    assert_ptr_equal(out[0], &g_a);
    assert_true(kvf_lease_table_abort(t, "r2", 20));             /* quarantined until 10020 */
    assert_int_equal(collect(t, 21, out), 0);
    snprintf(m.request_id, sizeof(m.request_id), "r2");
    kvf_lease_table_answer(t, "decode-0", &m, 30, 30000, &a);    /* the reader says it is done */
    assert_int_equal(collect(t, 31, out), 1);
    assert_ptr_equal(out[0], &g_b);
    kvf_lease_table_stats(t, &st);
    assert_int_equal(st.abandoned, 2);
    assert_int_equal(st.quarantined_now, 0);
    assert_int_equal(st.quarantined_blocks, 2);      /* r2's, by the abort */
    assert_int_equal(st.quarantine_cut_blocks, 2);   /* ... and cut short by its release */
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
        } while (a.verdict == KVF_LEASE_REFUSED && strstr(a.why, "no lease matches") != NULL);
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
        cmocka_unit_test(test_refusals_reveal_nothing),
        cmocka_unit_test(test_ids_bound),
        cmocka_unit_test(test_abandon_frees_at_once),
    };
    kvf_log_set_level(KVF_LOG_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
