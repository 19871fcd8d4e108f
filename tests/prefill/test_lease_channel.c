/*
 * Lease operations over a real side channel (ZeroMQ, protobuf), answered by
 * the lease table the way kvf-prefill answers them: only the decode that was
 * given a lease can end it. Rows of the fault matrix (issue 9):
 *   - a release with a wrong nonce, from another engine, or replayed is
 *     refused and counted, and the real release still works;
 *   - stale transfer params replayed after the lease ended are refused at
 *     the claim, i.e. before any GET;
 *   - a late release of an expired lease is answered "expired".
 * Also: the handshake announces the client's transfer timeout, which the
 * handler sees as the peers' largest.
 */
#include "kvf_lease.h"
#include "kvf_side_channel.h"

#include "kvf_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define NONCE 0x5eed5eed5eedull

static kvf_lease_table_h g_table;
/* atomics: the side-channel thread reads and writes them, and the hand-off through
 * ZeroMQ is invisible to ThreadSanitizer (tests/run.sh runs this test under it) */
static _Atomic uint64_t g_now = 1000;
static _Atomic uint32_t g_peer_timeout;
static int g_owner = 7;

static void lease_func(void *arg, const char *requester, const kvf_lease_msg_t *msg,
                       uint32_t peer_timeout_ms, kvf_lease_answer_t *answer)
{
    (void)arg;
    g_peer_timeout = peer_timeout_ms;
    kvf_lease_table_answer(g_table, requester, msg, g_now, 500, answer);
}

static kvf_side_channel_server_h start(void)
{
    static kvf_rank_meta_t meta;
    kvf_side_channel_params_t p;
    kvf_side_channel_server_h s;

    memset(&meta, 0, sizeof(meta));
    snprintf(meta.engine_id, sizeof(meta.engine_id), "prefill-lc");
    meta.protocol_version = KVF_XFER_PROTOCOL_VERSION;
    meta.tp_size = 1;
    memset(&p, 0, sizeof(p));
    p.engine_id = "prefill-lc";
    p.ranks = &meta;
    p.num_ranks = 1;
    p.lease_func = lease_func;
    assert_int_equal(kvf_side_channel_server_start(&p, &s), KVF_OK);
    return s;
}

static kvf_lease_verdict_t op(kvf_side_channel_client_h c, int port, kvf_lease_op_t o,
                              uint64_t nonce, int rank, int tp, kvf_lease_answer_t *a)
{
    kvf_lease_msg_t m;
    memset(&m, 0, sizeof(m));
    m.op = o;
    snprintf(m.request_id, sizeof(m.request_id), "req-1");
    m.nonce = nonce;
    m.decode_rank = rank;
    m.decode_tp = tp;
    assert_int_equal(kvf_side_channel_lease(c, "prefill-lc", "127.0.0.1", port, &m, a), KVF_OK);
    return a->verdict;
}

static void test_only_the_lease_holder_ends_it(void **state)
{
    kvf_side_channel_server_h s;
    kvf_side_channel_client_h dec, other;
    kvf_lease_answer_t a;
    kvf_lease_stats_t st;
    void *out[4];
    int port;
    (void)state;

    assert_int_equal(kvf_lease_table_create(&g_table), KVF_OK);
    kvf_lease_table_set_quarantine(g_table, 300);
    s = start();
    port = kvf_side_channel_server_port(s);
    /* client timeouts are generous: tests/run.sh runs this under TSan on a loaded host */
    assert_int_equal(kvf_side_channel_client_create("decode-a", 5000, &dec), KVF_OK);
    assert_int_equal(kvf_side_channel_client_create("decode-b", 3000, &other), KVF_OK);
    assert_int_equal(kvf_lease_table_add(g_table, "req-1", NONCE, g_now, 500, 2, &g_owner),
                     KVF_OK);

    /* wrong nonce: refused before the claim binds anything */
    assert_int_equal(op(dec, port, KVF_LEASE_OP_CLAIM, NONCE ^ 1, 0, 0, &a), KVF_LEASE_REFUSED);
    assert_non_null(strstr(a.why, "no lease matches"));
    /* the real claim: valid, with the time left as a duration */
    assert_int_equal(op(dec, port, KVF_LEASE_OP_CLAIM, NONCE, 0, 0, &a), KVF_LEASE_VALID);
    assert_int_equal(a.ms_left, 500);
    assert_int_equal(g_peer_timeout, 5000);          /* announced in every request */
    /* another engine with the right nonce */
    assert_int_equal(op(other, port, KVF_LEASE_OP_RELEASE, NONCE, 0, 2, &a), KVF_LEASE_REFUSED);
    assert_non_null(strstr(a.why, "no lease matches"));   /* as for a wrong nonce */
    assert_int_equal(g_peer_timeout, 3000);          /* what this request announced */
    /* rank 0 releases; its replay is refused; rank 1 ends the lease */
    assert_int_equal(op(dec, port, KVF_LEASE_OP_RELEASE, NONCE, 0, 2, &a), KVF_LEASE_VALID);
    assert_int_equal(op(dec, port, KVF_LEASE_OP_RELEASE, NONCE, 0, 2, &a), KVF_LEASE_REFUSED);
    assert_int_equal(kvf_lease_table_collect(g_table, g_now, out, 4, NULL), 0);
    assert_int_equal(op(dec, port, KVF_LEASE_OP_RELEASE, NONCE, 1, 2, &a), KVF_LEASE_VALID);
    assert_int_equal(kvf_lease_table_collect(g_table, g_now, out, 4, NULL), 1);
    assert_ptr_equal(out[0], &g_owner);
    /* stale transfer params replayed after the lease ended: refused at the claim */
    assert_int_equal(op(dec, port, KVF_LEASE_OP_CLAIM, NONCE, 0, 0, &a), KVF_LEASE_REFUSED);
    kvf_lease_table_stats(g_table, &st);
    assert_int_equal(st.refused, 4);
    assert_int_equal(st.released, 1);

    /* a late release of an expired lease: expired, and the blocks were quarantined */
    assert_int_equal(kvf_lease_table_add(g_table, "req-1", NONCE + 2, g_now, 500, 2, &g_owner),
                     KVF_OK);
    assert_int_equal(op(dec, port, KVF_LEASE_OP_CLAIM, NONCE + 2, 0, 0, &a), KVF_LEASE_VALID);
    g_now += 600;
    assert_int_equal(op(dec, port, KVF_LEASE_OP_RELEASE, NONCE + 2, 0, 1, &a),
                     KVF_LEASE_EXPIRED);
    assert_non_null(strstr(a.why, "expired before the read finished"));
    kvf_lease_table_stats(g_table, &st);
    assert_int_equal(st.expired_answers, 1);
    assert_int_equal(st.quarantined_blocks, 2);

    kvf_side_channel_client_destroy(other);
    kvf_side_channel_client_destroy(dec);
    kvf_side_channel_server_stop(s);
    kvf_lease_table_destroy(g_table);
}

static void test_no_handler_refuses(void **state)
{
    kvf_rank_meta_t meta;
    kvf_side_channel_params_t p;
    kvf_side_channel_server_h s;
    kvf_side_channel_client_h c;
    kvf_lease_answer_t a;
    (void)state;

    memset(&meta, 0, sizeof(meta));
    meta.tp_size = 1;
    memset(&p, 0, sizeof(p));
    p.engine_id = "prefill-lc";
    p.ranks = &meta;
    p.num_ranks = 1;
    assert_int_equal(kvf_side_channel_server_start(&p, &s), KVF_OK);
    assert_int_equal(kvf_side_channel_client_create("decode-a", 1000, &c), KVF_OK);
    assert_int_equal(op(c, kvf_side_channel_server_port(s), KVF_LEASE_OP_CLAIM, NONCE, 0, 0, &a),
                     KVF_LEASE_REFUSED);
    assert_non_null(strstr(a.why, "holds no leases"));
    kvf_side_channel_client_destroy(c);
    kvf_side_channel_server_stop(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_only_the_lease_holder_ends_it),
        cmocka_unit_test(test_no_handler_refuses),
    };
    kvf_log_set_level(KVF_LOG_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
