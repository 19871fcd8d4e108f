/*
 * kvf-proxy's send queue to an instance under a burst: every admitted request's
 * PrefillRequest is sent at once, and the instance may be slow to read. The
 * instance here is a ZeroMQ ROUTER that accepts the connection and never reads;
 * 30000 calls are started together. Each must be sent (queued on the
 * connection), none failed: at ZeroMQ's default send queue (1000 messages) the
 * sends past what the queue and the TCP buffers held got EAGAIN and their calls
 * failed as if the instance were gone (a 502 in test_proxy_many under load).
 * 30000 is well past what the TCP buffers hold and below the queue's
 * KVF_ZMQ_SERVE_HWM (100000).
 */
#include "kvf_proxy_pool_int.h"
#include "kvf_zmq.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <zmq.h>

#define BURST 30000

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Calls neither sent nor failed yet (pool->lock taken here). */
static int unsettled(struct kvf_proxy_pool *pool, kvf_proxy_call_h *calls, int *failed)
{
    int n = 0;

    *failed = 0;
    pthread_mutex_lock(&pool->lock);
    for (int i = 0; i < BURST; ++i) {
        n += (calls[i]->sent_epoch < 0) && (calls[i]->failed == KVF_OK);
        *failed += (calls[i]->failed != KVF_OK);
    }
    pthread_mutex_unlock(&pool->lock);
    return n;
}

static void test_burst_is_queued(void **state)
{
    void *ctx = zmq_ctx_new(), *peer = NULL;
    char ep[64], urls[96], msg[256];
    size_t ep_len = sizeof(ep);
    kvf_proxy_pool_params_t p = {
        .decode_urls = "tcp://127.0.0.1:9",
        .health_interval_ms = 60000,
        .health_timeout_ms = 60000,
        .max_outstanding = BURST,
    };
    struct kvf_proxy_pool *pool = NULL;
    kvf_proxy_call_h *calls = calloc(BURST, sizeof(*calls));
    Kvf__PrefillRequest preq = KVF__PREFILL_REQUEST__INIT;
    Kvf__ServeRequest sreq = KVF__SERVE_REQUEST__INIT;
    int32_t ids[4] = {1, 2, 3, 4};
    int failed = 0, left;
    int64_t end;

    (void)state;
    assert_non_null(calls);
    assert_int_equal(kvf_zmq_socket_open(ctx, ZMQ_ROUTER, NULL, 0, &peer), KVF_OK);
    assert_int_equal(zmq_bind(peer, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(peer, ZMQ_LAST_ENDPOINT, ep, &ep_len), 0);
    snprintf(urls, sizeof(urls), "%s", ep);
    p.prefill_urls = urls;
    assert_int_equal(kvf_proxy_pool_create(&p, &pool), KVF_OK);
    end = now_ms() + 10000;   /* the connection is up: the monitor says so */
    for (bool up = false; !up && (now_ms() < end); usleep(10000)) {
        pthread_mutex_lock(&pool->lock);
        up = pool->inst[KVF_PROXY_ROLE_PREFILL][0].info.connected;
        pthread_mutex_unlock(&pool->lock);
    }
    preq.n_prompt_tokens = 4;
    preq.prompt_tokens = ids;
    sreq.body_case = KVF__SERVE_REQUEST__BODY_PREFILL;
    sreq.prefill = &preq;
    for (int i = 0; i < BURST; ++i) {
        char rid[32];

        snprintf(rid, sizeof(rid), "burst-%d", i);
        preq.request_id = rid;
        assert_int_equal(kvf_proxy_call_start(pool, KVF_PROXY_ROLE_PREFILL, 0, rid, &sreq,
                                              &calls[i]), KVF_OK);
    }
    end = now_ms() + 20000;
    while (((left = unsettled(pool, calls, &failed)) > 0) && (now_ms() < end)) {
        usleep(20000);
    }
    if (failed > 0) {
        for (int i = 0; i < BURST; ++i) {
            if (kvf_proxy_call_next(calls[i], 0, &(Kvf__ServeReply *){NULL}, msg,
                                    sizeof(msg)) != KVF_ERR_PEER_TIMEOUT) {
                fprintf(stderr, "call %d of %d failed: %s\n", i, BURST, msg);
                break;
            }
        }
    }
    fprintf(stderr, "%d calls: %d sent, %d failed, %d neither\n", BURST, BURST - failed - left,
            failed, left);
    assert_int_equal(failed, 0);
    assert_int_equal(left, 0);
    for (int i = BURST - 1; i >= 0; --i) {   /* newest first: each is the list's head */
        kvf_proxy_call_end(calls[i]);
    }
    kvf_proxy_pool_destroy(pool);
    free(calls);
    zmq_close(peer);
    zmq_ctx_term(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_is_queued),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
