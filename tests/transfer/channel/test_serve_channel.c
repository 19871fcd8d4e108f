/*
 * The serving control channel answers health probes from its own thread:
 * while the leader is "inside an engine step" (it never calls recv), a
 * probe is answered at once with the published snapshot and the age of
 * the step in progress; other requests wait for the leader and its replies
 * reach the peer; malformed messages are answered with an error.
 */
#include "kvf_serve_channel.h"
#include "kvf_zmq.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include <cmocka.h>

static char endpoint[64];

static void *dealer(void *ctx)
{
    const kvf_zmq_opt_t opts[] = {
        {ZMQ_LINGER, 0},
        {ZMQ_RCVTIMEO, 5000},      /* every wait is bounded */
    };
    void *s = NULL;

    assert_int_equal(kvf_zmq_socket_open(ctx, ZMQ_DEALER, opts, 2, &s), KVF_OK);
    assert_int_equal(zmq_connect(s, endpoint), 0);
    return s;
}

static void send_req(void *s, const Kvf__ServeRequest *req)
{
    uint8_t buf[256];
    size_t len = kvf__serve_request__pack(req, buf);

    assert_true(zmq_send(s, buf, len, 0) == (int)len);
}

static Kvf__ServeReply *recv_reply(void *s)
{
    uint8_t buf[4096];
    int n = zmq_recv(s, buf, sizeof(buf), 0);

    assert_true(n > 0);   /* -1: nothing within RCVTIMEO */
    return kvf__serve_reply__unpack(NULL, (size_t)n, buf);
}

static void send_health(void *s)
{
    static Kvf__HealthRequest hr = KVF__HEALTH_REQUEST__INIT;
    Kvf__ServeRequest req = KVF__SERVE_REQUEST__INIT;

    req.body_case = KVF__SERVE_REQUEST__BODY_HEALTH;
    req.health = &hr;
    send_req(s, &req);
}

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void test_health_during_step(void **state)
{
    Kvf__HealthReply h = KVF__HEALTH_REPLY__INIT;
    Kvf__AbortRequest ar = KVF__ABORT_REQUEST__INIT;
    Kvf__ServeRequest req = KVF__SERVE_REQUEST__INIT;
    kvf_serve_server_h srv;
    kvf_serve_peer_t peer;
    Kvf__ServeRequest *got;
    Kvf__ServeReply *r;
    void *ctx = zmq_ctx_new();
    void *s;
    double t0;
    (void)state;

    snprintf(endpoint, sizeof(endpoint), "ipc:///tmp/kvf-serve-test-%d", (int)getpid());
    assert_int_equal(kvf_serve_server_create(endpoint, &srv), KVF_OK);
    s = dealer(ctx);

    /* before a snapshot: the probe goes to the leader like any request */
    send_health(s);
    assert_int_equal(kvf_serve_server_recv(srv, 5000, &peer, &got), KVF_OK);
    assert_int_equal(got->body_case, KVF__SERVE_REQUEST__BODY_HEALTH);
    kvf__serve_request__free_unpacked(got, NULL);
    assert_int_equal(kvf_serve_server_reply_error(srv, &peer, "health", KVF_OK, NULL), KVF_OK);
    r = recv_reply(s);
    assert_string_equal(r->request_id, "health");
    kvf__serve_reply__free_unpacked(r, NULL);

    /* publish, then "run a step" that never returns to recv() */
    h.role = (char *)"decode";
    h.engine_id = (char *)"decode-7";
    h.has_free_pages = h.has_total_pages = h.has_queue_depth = 1;
    h.free_pages = 40;
    h.total_pages = 64;
    h.queue_depth = 3;
    assert_int_equal(kvf_serve_server_set_health(srv, &h), KVF_OK);
    kvf_serve_server_step_begin(srv);
    t0 = now_ms();
    usleep(50000);   /* the step's age the probe must report (>= 50 ms) */
    send_health(s);
    r = recv_reply(s);
    assert_true(now_ms() - t0 < 4000);
    assert_string_equal(r->request_id, "health");
    assert_non_null(r->health);
    assert_string_equal(r->health->engine_id, "decode-7");
    assert_int_equal(r->health->free_pages, 40);
    assert_int_equal(r->health->total_pages, 64);
    assert_int_equal(r->health->queue_depth, 3);
    assert_true(r->health->step_running_ms >= 50.0);
    kvf__serve_reply__free_unpacked(r, NULL);
    assert_int_equal(kvf_serve_server_health_answered(srv), 1);

    /* a request for the leader waits for it, even while probes are answered */
    ar.request_id = (char *)"r9";
    req.body_case = KVF__SERVE_REQUEST__BODY_ABORT;
    req.abort = &ar;
    send_req(s, &req);
    send_health(s);
    r = recv_reply(s);
    assert_non_null(r->health);
    kvf__serve_reply__free_unpacked(r, NULL);
    kvf_serve_server_step_end(srv);
    assert_int_equal(kvf_serve_server_recv(srv, 5000, &peer, &got), KVF_OK);
    assert_int_equal(got->body_case, KVF__SERVE_REQUEST__BODY_ABORT);
    assert_string_equal(got->abort->request_id, "r9");
    kvf__serve_request__free_unpacked(got, NULL);
    assert_int_equal(kvf_serve_server_reply_error(srv, &peer, "r9", KVF_ERR_CANCELED, "aborted"),
                     KVF_OK);
    r = recv_reply(s);
    assert_string_equal(r->request_id, "r9");
    assert_int_equal(r->status, KVF_ERR_CANCELED);
    kvf__serve_reply__free_unpacked(r, NULL);

    /* after the step: the last step's duration, nothing running */
    send_health(s);
    r = recv_reply(s);
    assert_true(r->health->step_ms >= 50.0);
    assert_true(r->health->step_running_ms == 0.0);
    kvf__serve_reply__free_unpacked(r, NULL);

    /* garbage: answered with an error by the channel, the leader sees nothing */
    assert_int_equal(zmq_send(s, "\xff\xff\xff", 3, 0), 3);
    r = recv_reply(s);
    assert_true(r->status == KVF_ERR_PARSE);
    assert_non_null(strstr(r->error, "malformed"));
    kvf__serve_reply__free_unpacked(r, NULL);
    assert_int_equal(kvf_serve_server_recv(srv, 50, &peer, &got), KVF_ERR_TIMED_OUT);

    zmq_close(s);
    kvf_serve_server_destroy(srv);
    zmq_ctx_term(ctx);
    unlink(endpoint + strlen("ipc://"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_during_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
