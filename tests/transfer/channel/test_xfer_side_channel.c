/*
 * ZeroMQ side channel: metadata round trip, per-engine cache, garbage and
 * wrong-version requests answered with an error reply (and the server keeps
 * serving), wrong engine id refused, a bounded wait on a dead port, and the
 * asynchronous client's tickets on one persistent connection, and a connection
 * whose first SYN is lost, or that is refused for a moment, still answered.
 */
#include "kvf_side_channel.h"
#include "kvf_time.h"

#include "kvf_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>
#include <cmocka.h>

static kvf_rank_meta_t ranks[2];

static void fill_ranks(void)
{
    for (int r = 0; r < 2; ++r) {
        kvf_rank_meta_t *m = &ranks[r];
        memset(m, 0, sizeof(*m));
        snprintf(m->engine_id, sizeof(m->engine_id), "prefill-sc");
        m->protocol_version = KVF_XFER_PROTOCOL_VERSION;
        m->model_fingerprint = 0x1122334455667788ull;
        m->tp_rank = r;
        m->tp_size = 2;
        m->block_size = 32;
        m->kernel_block_size = 16;
        m->page_size = 4096;
        m->slots = 1;
        m->num_blocks = 10 + r;
        m->kv_dtype = KVF_DTYPE_BF16;
        m->conv_dtype = KVF_DTYPE_BF16;
        m->ssm_dtype = KVF_DTYPE_FP32;
        snprintf(m->layout_tag, sizeof(m->layout_tag), "HND");
        m->num_regions = 1;
        m->regions[0].addr = 0x1000;
        m->regions[0].length = 4096ull * (uint64_t)(10 + r);
        m->regions[0].rkey_len = 8;
        memset(m->regions[0].rkey, 0x55, 8);
        m->worker_addr_len = 5;
        memcpy(m->worker_addr, "abcde", 5);
    }
}

static kvf_side_channel_server_h start_server(void)
{
    kvf_side_channel_params_t p;
    kvf_side_channel_server_h s;

    memset(&p, 0, sizeof(p));
    p.engine_id = "prefill-sc";
    p.ranks = ranks;
    p.num_ranks = 2;
    assert_int_equal(kvf_side_channel_server_start(&p, &s), KVF_OK);
    assert_true(kvf_side_channel_server_port(s) > 0);
    return s;
}

static void test_fetch_and_cache(void **state)
{
    kvf_side_channel_server_h s = start_server();
    kvf_side_channel_client_h c;
    const kvf_handshake_reply_t *reply, *again;
    int port = kvf_side_channel_server_port(s);
    uint64_t served, malformed;

    (void)state;
    assert_int_equal(kvf_side_channel_client_create("decode-sc", 2000, &c), KVF_OK);
    assert_int_equal(kvf_side_channel_fetch(c, "prefill-sc", "127.0.0.1", port, &reply), KVF_OK);
    assert_int_equal(reply->num_ranks, 2);
    assert_int_equal(reply->ranks[1].num_blocks, 11);
    assert_int_equal(reply->ranks[1].regions[0].length, 4096 * 11);
    assert_memory_equal(reply->ranks[0].worker_addr, "abcde", 5);

    /* served from the cache: works with the server gone */
    kvf_side_channel_server_stats(s, &served, &malformed);
    assert_int_equal(served, 1);
    kvf_side_channel_server_stop(s);
    assert_int_equal(kvf_side_channel_fetch(c, "prefill-sc", "127.0.0.1", port, &again), KVF_OK);
    assert_ptr_equal(again, reply);

    /* forgotten: now the dead server's refused connection fails the fetch at once, long
     * before the 5 s timeout (a release to a killed prefill must not wait it out) */
    kvf_side_channel_forget(c, "prefill-sc");
    kvf_side_channel_client_destroy(c);
    assert_int_equal(kvf_side_channel_client_create("decode-sc", 5000, &c), KVF_OK);
    uint64_t t0 = kvf_time_now_ns();
    assert_int_equal(kvf_side_channel_fetch(c, "prefill-sc", "127.0.0.1", port, &again),
                     KVF_ERR_PEER_UNREACHABLE);
    assert_true(kvf_time_now_ns() - t0 < 1000000000ull);
    kvf_side_channel_client_destroy(c);
}

static void test_garbage_and_refusals(void **state)
{
    kvf_side_channel_server_h s = start_server();
    kvf_side_channel_client_h c;
    const kvf_handshake_reply_t *reply;
    int port = kvf_side_channel_server_port(s);
    uint64_t rng = 12345, served, malformed;
    uint8_t garbage[300], *rep;
    size_t rep_len;

    (void)state;
    /* random bytes, an empty message: each answered with a parseable error reply */
    for (int i = 0; i < 20; ++i) {
        kvf_handshake_reply_t out;
        size_t len = (i == 0) ? 0 : (size_t)(rng % sizeof(garbage));
        for (size_t k = 0; k < len; ++k) {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            garbage[k] = (uint8_t)rng;
        }
        assert_int_equal(kvf_side_channel_request_raw("127.0.0.1", port, garbage, len, 2000, &rep,
                                                      &rep_len), KVF_OK);
        /* random bytes can by chance be a valid request; then the reply is the metadata */
        assert_int_equal(kvf_handshake_reply_unpack(rep, rep_len, &out), KVF_OK);
        if (!out.accepted) {
            assert_true(strlen(out.error) > 0);
        }
        kvf_handshake_reply_cleanup(&out);
        free(rep);
    }
    kvf_side_channel_server_stats(s, &served, &malformed);
    assert_int_equal(served, 20);
    assert_true(malformed >= 1);

    /* the server still serves real clients */
    assert_int_equal(kvf_side_channel_client_create("decode-sc", 2000, &c), KVF_OK);
    assert_int_equal(kvf_side_channel_fetch(c, "prefill-sc", "127.0.0.1", port, &reply), KVF_OK);
    assert_int_equal(reply->num_ranks, 2);

    /* asking for another engine at this address: refused with the field */
    assert_int_equal(kvf_side_channel_fetch(c, "prefill-other", "127.0.0.1", port, &reply),
                     KVF_ERR_REFUSED);
    assert_int_equal(reply->num_refusals, 1);
    assert_string_equal(reply->refusals[0].field, "engine_id");
    assert_string_equal(reply->refusals[0].local, "prefill-sc");
    assert_string_equal(reply->refusals[0].remote, "prefill-other");
    kvf_side_channel_client_destroy(c);

    /* another protocol version: refused with both versions */
    {
        kvf_handshake_request_t req = {0};
        kvf_handshake_reply_t out;
        uint8_t *buf;
        size_t len;
        char v[16];

        snprintf(req.engine_id, sizeof(req.engine_id), "decode-x");
        req.protocol_version = KVF_XFER_PROTOCOL_VERSION + 5;
        assert_int_equal(kvf_handshake_request_pack(&req, &buf, &len), KVF_OK);
        assert_int_equal(kvf_side_channel_request_raw("127.0.0.1", port, buf, len, 2000, &rep,
                                                      &rep_len), KVF_OK);
        assert_int_equal(kvf_handshake_reply_unpack(rep, rep_len, &out), KVF_OK);
        assert_false(out.accepted);
        assert_int_equal(out.num_refusals, 1);
        assert_string_equal(out.refusals[0].field, "protocol_version");
        snprintf(v, sizeof(v), "%d", KVF_XFER_PROTOCOL_VERSION + 5);
        assert_string_equal(out.refusals[0].remote, v);
        kvf_handshake_reply_cleanup(&out);
        free(rep);
        free(buf);
    }
    kvf_side_channel_server_stop(s);
}

/* Forgetting one engine must leave every other engine's cached reply where it was. */
static void test_forget_keeps_other_engines(void **state)
{
    kvf_rank_meta_t ma, mb;
    kvf_side_channel_params_t p;
    kvf_side_channel_server_h sa, sb;
    kvf_side_channel_client_h c;
    const kvf_handshake_reply_t *ra, *rb, *ra2, *rb2;
    (void)state;

    fill_ranks();
    ma = ranks[0];
    mb = ranks[0];
    ma.tp_size = mb.tp_size = 1;
    snprintf(ma.engine_id, sizeof(ma.engine_id), "prefill-A");
    snprintf(mb.engine_id, sizeof(mb.engine_id), "prefill-B");
    ma.incarnation = 0xaaaa;
    mb.incarnation = 0xbbbb;
    memset(&p, 0, sizeof(p));
    p.num_ranks = 1;
    p.engine_id = "prefill-A";
    p.ranks = &ma;
    assert_int_equal(kvf_side_channel_server_start(&p, &sa), KVF_OK);
    p.engine_id = "prefill-B";
    p.ranks = &mb;
    assert_int_equal(kvf_side_channel_server_start(&p, &sb), KVF_OK);
    assert_int_equal(kvf_side_channel_client_create("decode-0", 2000, &c), KVF_OK);

    assert_int_equal(kvf_side_channel_fetch(c, "prefill-A", "127.0.0.1",
                                            kvf_side_channel_server_port(sa), &ra), KVF_OK);
    assert_int_equal(kvf_side_channel_fetch(c, "prefill-B", "127.0.0.1",
                                            kvf_side_channel_server_port(sb), &rb), KVF_OK);
    kvf_side_channel_forget(c, "prefill-A");       /* A restarted */
    assert_int_equal(kvf_side_channel_fetch(c, "prefill-A", "127.0.0.1",
                                            kvf_side_channel_server_port(sa), &ra2), KVF_OK);
    kvf_side_channel_forget(c, "prefill-A");       /* and again */
    /* B's pointer still shows B, and a cached fetch of B returns the same slot */
    assert_string_equal(rb->engine_id, "prefill-B");
    assert_non_null(rb->ranks);
    assert_true(rb->ranks[0].incarnation == 0xbbbb);
    assert_int_equal(kvf_side_channel_fetch(c, "prefill-B", "127.0.0.1",
                                            kvf_side_channel_server_port(sb), &rb2), KVF_OK);
    assert_ptr_equal(rb, rb2);
    (void)ra;
    kvf_side_channel_client_destroy(c);
    kvf_side_channel_server_stop(sa);
    kvf_side_channel_server_stop(sb);
}

/* Lease handler of the async test: answers every operation valid, ms_left = its nonce. */
static void echo_lease(void *arg, const char *requester, const kvf_lease_msg_t *msg,
                       uint32_t peer_timeout_ms, kvf_lease_answer_t *answer)
{
    (void)arg;
    (void)peer_timeout_ms;
    memset(answer, 0, sizeof(*answer));
    answer->verdict = KVF_LEASE_VALID;
    answer->ms_left = msg->nonce;
    snprintf(answer->why, sizeof(answer->why), "%s:%s", requester, msg->request_id);
}

/*
 * The asynchronous client: many requests in flight on one persistent
 * connection, each answer matched to its ticket; nothing waits (poll says
 * in progress until the answer came); a side channel that never answers
 * ends its tickets at the deadline, a port nobody listens on at once.
 */
static void test_async_tickets(void **state)
{
    enum { N = 16 };
    kvf_side_channel_params_t p;
    kvf_side_channel_server_h s;
    kvf_side_channel_client_h c;
    kvf_lease_answer_t a;
    uint64_t tickets[N], t0, hs;
    kvf_handshake_reply_t reply;
    void *ctx, *silent;
    char ep[64];
    size_t ep_len = sizeof(ep);
    int done = 0, port, silent_port;
    kvf_status_t st;
    (void)state;

    memset(&p, 0, sizeof(p));
    p.engine_id = "prefill-sc";
    p.ranks = ranks;
    p.num_ranks = 2;
    p.lease_func = echo_lease;
    assert_int_equal(kvf_side_channel_server_start(&p, &s), KVF_OK);
    port = kvf_side_channel_server_port(s);
    assert_int_equal(kvf_side_channel_client_create("decode-a", 3000, &c), KVF_OK);
    for (int i = 0; i < N; ++i) {
        kvf_lease_msg_t m;
        memset(&m, 0, sizeof(m));
        m.op = KVF_LEASE_OP_CLAIM;
        snprintf(m.request_id, sizeof(m.request_id), "req-%d", i);
        m.nonce = 1000 + (uint64_t)i;
        assert_int_equal(kvf_side_channel_lease_start(c, "prefill-sc", "127.0.0.1", port, &m,
                                                      &tickets[i]), KVF_OK);
    }
    assert_int_equal(kvf_side_channel_fetch_start(c, "prefill-sc", "127.0.0.1", port, &hs),
                     KVF_OK);
    assert_int_equal(kvf_side_channel_inflight(c), N + 1);
    t0 = kvf_time_now_ns();
    while (done < N) {
        assert_true(kvf_time_now_ns() - t0 < 3000000000ull);
        (void)kvf_side_channel_wait(c, 50);
        for (int i = 0; i < N; ++i) {
            char want[64];
            if (tickets[i] == 0) {
                continue;
            }
            st = kvf_side_channel_lease_poll(c, tickets[i], &a);
            if (st == KVF_INPROGRESS) {
                continue;
            }
            assert_int_equal(st, KVF_OK);
            assert_int_equal(a.verdict, KVF_LEASE_VALID);
            assert_true(a.ms_left == 1000 + (uint64_t)i);      /* its own answer */
            snprintf(want, sizeof(want), "decode-a:req-%d", i);
            assert_string_equal(a.why, want);
            tickets[i] = 0;
            ++done;
        }
    }
    while ((st = kvf_side_channel_fetch_poll(c, hs, &reply)) == KVF_INPROGRESS) {
        assert_true(kvf_time_now_ns() - t0 < 3000000000ull);
        (void)kvf_side_channel_wait(c, 50);
    }
    assert_int_equal(st, KVF_OK);
    assert_int_equal(reply.num_ranks, 2);
    kvf_handshake_reply_cleanup(&reply);
    assert_int_equal(kvf_side_channel_lease_poll(c, hs, &a), KVF_ERR_NOT_FOUND);   /* gone */
    assert_int_equal(kvf_side_channel_inflight(c), 0);
    kvf_side_channel_client_destroy(c);

    /* a ROUTER that never answers: in progress, then a timeout at the deadline */
    ctx = zmq_ctx_new();
    silent = zmq_socket(ctx, ZMQ_ROUTER);
    assert_int_equal(zmq_bind(silent, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(silent, ZMQ_LAST_ENDPOINT, ep, &ep_len), 0);
    silent_port = atoi(strrchr(ep, ':') + 1);
    assert_int_equal(kvf_side_channel_client_create("decode-a", 300, &c), KVF_OK);
    assert_int_equal(kvf_side_channel_fetch_start(c, "prefill-sc", "127.0.0.1", silent_port,
                                                  &hs), KVF_OK);
    t0 = kvf_time_now_ns();
    assert_int_equal(kvf_side_channel_fetch_poll(c, hs, &reply), KVF_INPROGRESS);
    while ((st = kvf_side_channel_fetch_poll(c, hs, &reply)) == KVF_INPROGRESS) {
        (void)kvf_side_channel_wait(c, 20);
        assert_true(kvf_time_now_ns() - t0 < 2000000000ull);
    }
    assert_int_equal(st, KVF_ERR_PEER_TIMEOUT);
    assert_true(kvf_time_now_ns() - t0 >= 250000000ull);
    /* nothing listens: refused at once, well before the deadline */
    zmq_close(silent);
    zmq_ctx_term(ctx);
    assert_int_equal(kvf_side_channel_fetch_start(c, "prefill-sc", "127.0.0.1", silent_port,
                                                  &hs), KVF_OK);
    t0 = kvf_time_now_ns();
    while ((st = kvf_side_channel_fetch_poll(c, hs, &reply)) == KVF_INPROGRESS) {
        (void)kvf_side_channel_wait(c, 20);
        assert_true(kvf_time_now_ns() - t0 < 2000000000ull);
    }
    assert_true((st == KVF_ERR_PEER_UNREACHABLE) || (st == KVF_ERR_PEER_RESET) ||
                (st == KVF_ERR_PEER_TIMEOUT));
    kvf_side_channel_client_destroy(c);
    kvf_side_channel_server_stop(s);
}

/*
 * A fetch to @a port, in progress for @a quiet_ms while something else holds
 * the port (the fds @a close_a / @a close_b, closed then; -1: none), then
 * answered by a side channel server started on that port.
 */
static void fetch_answered_later(int port, uint64_t quiet_ms, int close_a, int close_b)
{
    kvf_side_channel_params_t p;
    kvf_side_channel_server_h s;
    kvf_side_channel_client_h c;
    kvf_handshake_reply_t reply;
    uint64_t hs, t0;
    kvf_status_t st;

    assert_int_equal(kvf_side_channel_client_create("decode-late", 4000, &c), KVF_OK);
    assert_int_equal(kvf_side_channel_fetch_start(c, "prefill-sc", "127.0.0.1", port, &hs),
                     KVF_OK);
    t0 = kvf_time_now_ns();
    while (kvf_time_now_ns() - t0 < quiet_ms * 1000000ull) {
        assert_int_equal(kvf_side_channel_fetch_poll(c, hs, &reply), KVF_INPROGRESS);
        (void)kvf_side_channel_wait(c, 10);
    }
    if (close_a >= 0) {
        close(close_a);
    }
    if (close_b >= 0) {
        close(close_b);
    }
    memset(&p, 0, sizeof(p));
    p.field_mask = KVF_SIDE_CHANNEL_PARAM_FIELD_PORT;
    p.port = port;
    p.engine_id = "prefill-sc";
    p.ranks = ranks;
    p.num_ranks = 2;
    assert_int_equal(kvf_side_channel_server_start(&p, &s), KVF_OK);
    while ((st = kvf_side_channel_fetch_poll(c, hs, &reply)) == KVF_INPROGRESS) {
        assert_true(kvf_time_now_ns() - t0 < 4000000000ull);
        (void)kvf_side_channel_wait(c, 10);
    }
    assert_int_equal(st, KVF_OK);
    assert_int_equal(reply.num_ranks, 2);
    assert_int_equal(reply.ranks[1].num_blocks, 11);
    kvf_handshake_reply_cleanup(&reply);
    kvf_side_channel_client_destroy(c);
    kvf_side_channel_server_stop(s);
}

/* The first SYN of a fresh connection is lost (here: a listener with a full
 * accept queue holds the port and drops it; after a link outage, a SYN queued
 * behind an unresolved neighbour entry waits up to a second the same way). The
 * kernel retransmits the SYN after 1 s; by then the real server listens there,
 * and the fetch is answered: a lost SYN costs a second, not the request (the
 * decode's first claim after an outage in tests/multihost/test_mh_pool.py).
 * Waits past 500 ms, the connect timeout that lost that request. */
static void test_lost_first_syn(void **state)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    int one = 1, full, filler;

    (void)state;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    full = socket(AF_INET, SOCK_STREAM, 0);
    filler = socket(AF_INET, SOCK_STREAM, 0);
    assert_true((full >= 0) && (filler >= 0));
    assert_int_equal(setsockopt(full, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
    assert_int_equal(bind(full, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(full, 0), 0);   /* room for one queued connection */
    assert_int_equal(getsockname(full, (struct sockaddr *)&a, &alen), 0);
    assert_int_equal(connect(filler, (struct sockaddr *)&a, sizeof(a)), 0);   /* now full */
    fetch_answered_later(ntohs(a.sin_port), 650, filler, full);
}

/* Nothing listens for the first ~150 ms (the first SYN after a link outage can
 * also fail at once, EHOSTUNREACH behind a neighbour entry whose probes ran
 * out): ZeroMQ's retries reach the server and the request is answered; with
 * nothing listening at all the same request fails within a second
 * (test_fetch_and_cache). */
static void test_listener_late(void **state)
{
    kvf_side_channel_server_h s = start_server();
    int port = kvf_side_channel_server_port(s);

    (void)state;
    kvf_side_channel_server_stop(s);   /* its port, now refused */
    fetch_answered_later(port, 150, -1, -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fetch_and_cache),
        cmocka_unit_test(test_garbage_and_refusals),
        cmocka_unit_test(test_forget_keeps_other_engines),
        cmocka_unit_test(test_async_tickets),
        cmocka_unit_test(test_lost_first_syn),
        cmocka_unit_test(test_listener_late),
    };
    kvf_log_init("test");
    kvf_log_set_level(KVF_LOG_ERROR + 0);
    fill_ranks();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
