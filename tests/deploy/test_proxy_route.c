/*
 * kvf-proxy routing and admission (deploy/proxy/kvf_proxy_route.h): the
 * arithmetic by hand, then the choice on a real pool whose instances are
 * marked healthy by hand (their endpoints are never connected; the health
 * interval is long, so nothing but the test changes their state), and the
 * outstanding load a call holds until it fails. Expected values are worked
 * out by hand in the comments.
 */
#include "kvf_proxy_metrics.h"
#include "kvf_proxy_pool_int.h"
#include "kvf_proxy_route.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

static void test_arithmetic(void **state)
{
    kvf_proxy_instance_info_t info;

    (void)state;
    /* (1000 queued + 500) tokens at 1500 tokens/s: 1 s */
    assert_true(kvf_proxy_route_wait_ms(1000, 500, 1500.0) == 1000.0);
    assert_true(kvf_proxy_route_wait_ms(1000, 500, 0.0) < 0);   /* no rate: unknown */
    /* EWMA: the first sample as is; then 100 + 0.3 x (200 - 100) = 130 */
    assert_true(kvf_proxy_route_ewma(0, 200, 0.3) == 200);
    assert_true(kvf_proxy_route_ewma(100, 200, 0.3) > 129.99);
    assert_true(kvf_proxy_route_ewma(100, 200, 0.3) < 130.01);
    /* Retry-After: the excess rounded up, 1..60 */
    assert_int_equal(kvf_proxy_route_retry_after_s(5000, 4000), 1);
    assert_int_equal(kvf_proxy_route_retry_after_s(10500, 4000), 7);
    assert_int_equal(kvf_proxy_route_retry_after_s(1e9, 4000), 60);
    assert_int_equal(kvf_proxy_route_retry_after_s(100, 4000), 1);
    memset(&info, 0, sizeof(info));
    info.prefill_tokens_per_s = 800;        /* lifetime average until a recent one exists */
    assert_true(kvf_proxy_route_rate(&info) == 800);
    info.prefill_rate_recent = 300;
    assert_true(kvf_proxy_route_rate(&info) == 300);
    info.outstanding_tokens = 40;
    info.foreign_tokens = 2;
    assert_int_equal(kvf_proxy_route_queued(&info), 42);
}

/* The rate EWMA from two probes' counters, and a restart's counters starting over. */
static void test_rate_from_probes(void **state)
{
    kvf_proxy_instance_t inst;
    Kvf__HealthReply h = KVF__HEALTH_REPLY__INIT;

    (void)state;
    memset(&inst, 0, sizeof(inst));
    h.has_prefill_tokens_total = h.has_prefill_seconds_total = 1;
    h.prefill_tokens_total = 1000;
    h.prefill_seconds_total = 2.0;
    kvf_proxy_route_on_health_locked(&inst, &h);     /* the base only */
    assert_true(inst.info.prefill_rate_recent == 0);
    h.prefill_tokens_total = 1030;                   /* 30 < KVF_PROXY_RATE_MIN_TOKENS: wait */
    h.prefill_seconds_total = 2.1;
    kvf_proxy_route_on_health_locked(&inst, &h);
    assert_true(inst.info.prefill_rate_recent == 0);
    h.prefill_tokens_total = 1400;                   /* 400 tokens in 0.5 s: 800 tokens/s */
    h.prefill_seconds_total = 2.5;
    kvf_proxy_route_on_health_locked(&inst, &h);
    assert_true((inst.info.prefill_rate_recent > 799.9) && (inst.info.prefill_rate_recent < 800.1));
    h.prefill_tokens_total = 1600;                   /* 200 in 1 s: 800 + 0.3 x (200 - 800) */
    h.prefill_seconds_total = 3.5;
    kvf_proxy_route_on_health_locked(&inst, &h);
    assert_true((inst.info.prefill_rate_recent > 619.9) && (inst.info.prefill_rate_recent < 620.1));
    h.prefill_tokens_total = 10;                     /* went back (a restart): a new base */
    h.prefill_seconds_total = 0.01;
    kvf_proxy_route_on_health_locked(&inst, &h);
    assert_int_equal(inst.rate_tokens, 10);
    /* foreign: the daemon reports 500 queued, 300 of them ours */
    inst.info.outstanding_tokens = 300;
    h.queued_prompt_tokens = 500;
    kvf_proxy_route_on_health_locked(&inst, &h);
    assert_int_equal(inst.info.foreign_tokens, 200);
}

/* Answered waits longer than predicted raise later predictions; shorter ones never lower them. */
static void test_calibration(void **state)
{
    kvf_proxy_instance_t inst;
    struct kvf_proxy_call c;

    (void)state;
    memset(&inst, 0, sizeof(inst));
    memset(&c, 0, sizeof(c));
    inst.info.prefill_rate_recent = 1000;
    inst.info.outstanding_tokens = 900;
    c.load_tokens = 100;
    kvf_proxy_route_on_send_locked(&inst, &c);          /* (900 + 100) / 1000 tokens/s */
    assert_true((c.load_predicted_ms > 999.9) && (c.load_predicted_ms < 1000.1));
    c.load_start_ms -= 2000;                             /* it took 2 s: ratio 2 */
    kvf_proxy_route_on_answer_locked(&inst, &c);
    assert_true((inst.info.wait_calibration > 1.99) && (inst.info.wait_calibration < 2.01));
    c.load_start_ms += 1000;                             /* then 1 s: 2 + 0.1 x (1 - 2) */
    kvf_proxy_route_on_answer_locked(&inst, &c);
    assert_true((inst.info.wait_calibration > 1.89) && (inst.info.wait_calibration < 1.91));
    c.load_start_ms -= 3000;                             /* then 4 s: 1.9 + 0.5 x (4 - 1.9) */
    kvf_proxy_route_on_answer_locked(&inst, &c);
    assert_true((inst.info.wait_calibration > 2.94) && (inst.info.wait_calibration < 2.96));
    inst.info.wait_calibration = 2.0;
    assert_true(kvf_proxy_route_calibrated(&inst.info, 1500) > 2999.0);
    assert_true(kvf_proxy_route_calibrated(&inst.info, -1) < 0);
    inst.info.wait_calibration = 0.5;                    /* faster than predicted: as is */
    assert_true(kvf_proxy_route_calibrated(&inst.info, 1500) == 1500);
    c.load_predicted_ms = 50;                            /* too short to say anything */
    kvf_proxy_route_on_answer_locked(&inst, &c);
    assert_true(inst.info.wait_calibration == 0.5);
}

static struct kvf_proxy_pool *test_pool(void)
{
    kvf_proxy_pool_params_t p = {
        /* ports nothing listens on: every probe fails to send and is not retried
         * within the test (health interval 60 s) */
        .prefill_urls = "tcp://127.0.0.1:9,tcp://127.0.0.1:11",
        .decode_urls = "tcp://127.0.0.1:13,tcp://127.0.0.1:15",
        .health_interval_ms = 60000,
        .health_timeout_ms = 60000,
        .max_outstanding = 4,
    };
    struct kvf_proxy_pool *pool = NULL;

    assert_int_equal(kvf_proxy_pool_create(&p, &pool), KVF_OK);
    usleep(200000);    /* the first probe round (failed sends) is over */
    pthread_mutex_lock(&pool->lock);
    for (int r = 0; r < KVF_PROXY_ROLE_COUNT; ++r) {
        for (int i = 0; i < 2; ++i) {
            kvf_proxy_instance_info_t *info = &pool->inst[r][i].info;
            info->healthy = true;
            info->connected = true;
            info->prefill_rate_recent = (r == KVF_PROXY_ROLE_PREFILL) ? 1000.0 : 0;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return pool;
}

static kvf_proxy_instance_info_t *info_of(struct kvf_proxy_pool *pool, int role, int i)
{
    return &pool->inst[role][i].info;
}

static void test_pick_and_admit(void **state)
{
    struct kvf_proxy_pool *pool = test_pool();
    kvf_proxy_route_req_t rq = {.num_tokens = 100, .budget_ms = 10000,
                                .prefill_timeout_ms = 10000};
    kvf_proxy_route_t rt;

    (void)state;
    /* prefill 0 has 5000 tokens queued (5.1 s at 1000/s with ours), prefill 1 none;
     * decode 0 has 3 outstanding, decode 1 none */
    pthread_mutex_lock(&pool->lock);
    info_of(pool, 0, 0)->outstanding = 1;
    info_of(pool, 0, 0)->outstanding_tokens = 5000;
    info_of(pool, 1, 0)->outstanding = 3;
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    assert_int_equal(rt.prefill_idx, 1);
    assert_int_equal(rt.decode_idx, 1);
    assert_true((rt.predicted_wait_ms > 99.9) && (rt.predicted_wait_ms < 100.1));

    /* prefill 1 draining, decode 1 unhealthy: the loaded ones, admitted (5.1 s <= 6.5 s) */
    pthread_mutex_lock(&pool->lock);
    info_of(pool, 0, 1)->draining = true;
    info_of(pool, 1, 1)->healthy = false;
    pthread_mutex_unlock(&pool->lock);
    assert_false(kvf_proxy_route_usable(pool, KVF_PROXY_ROLE_DECODE, 1));
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    assert_int_equal(rt.prefill_idx, 0);
    assert_int_equal(rt.decode_idx, 0);

    /* a 5 s budget: 5.1 s > 0.65 x 5 s = 3.25 s, refused at once; Retry-After ceil(1.85) = 2 */
    rq.budget_ms = 5000;
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_ERR_NO_RESOURCE);
    assert_int_equal(rt.http, 503);
    assert_int_equal(rt.reason, KVF_PROXY_REJECT_PREDICTED_WAIT);
    assert_int_equal(rt.retry_after_s, 2);
    assert_int_equal(rt.prefill_idx, -1);
    assert_non_null(strstr(rt.why, "tcp://127.0.0.1:9"));

    /* the head of the proxy's queue: the whole 5.5 s budget, no headroom (admitted at
     * 5.1 s); at 5 s still refused, and the refusal says it waited */
    rq.budget_ms = 5500;
    rq.queued_ms = 2000;
    pthread_mutex_lock(&pool->lock);
    info_of(pool, 1, 0)->reserved = 0;   /* the picks above reserved decode 0 */
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    assert_int_equal(rt.prefill_idx, 0);
    rq.budget_ms = 5000;
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_ERR_NO_RESOURCE);
    assert_int_equal(rt.reason, KVF_PROXY_REJECT_PREDICTED_WAIT);
    assert_non_null(strstr(rt.why, "after its wait in the proxy's queue"));
    rq.queued_ms = 0;

    /* a prompt that alone takes 20 s at 1000 tokens/s > --prefill-timeout 10 s: a 400 */
    rq.budget_ms = 10000;
    rq.num_tokens = 20000;
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_ERR_OUT_OF_RANGE);
    assert_int_equal(rt.http, 400);

    /* every routable prefill at --max-outstanding (4): queue_full */
    rq.num_tokens = 100;
    pthread_mutex_lock(&pool->lock);
    info_of(pool, 0, 0)->outstanding = 4;
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_ERR_NO_RESOURCE);
    assert_int_equal(rt.reason, KVF_PROXY_REJECT_QUEUE_FULL);

    /* the decode at its bound: queue_full too */
    pthread_mutex_lock(&pool->lock);
    info_of(pool, 0, 0)->outstanding = 0;
    info_of(pool, 1, 0)->outstanding = 4;
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_ERR_NO_RESOURCE);
    assert_int_equal(rt.reason, KVF_PROXY_REJECT_QUEUE_FULL);

    /* no routable prefill at all: no_instance */
    pthread_mutex_lock(&pool->lock);
    info_of(pool, 0, 0)->healthy = false;
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_ERR_NO_RESOURCE);
    assert_int_equal(rt.reason, KVF_PROXY_REJECT_NO_INSTANCE);
    kvf_proxy_pool_destroy(pool);
}

/* A prefill instance with no measured rate is taken as fast as the measured ones on average
 * and as far off their predictions (kvf_proxy_route_prefill_key): with a measured instance
 * calibrated up to 3, an idle-looking unmeasured one is not preferred for its raw queue. */
static void test_unmeasured_takes_pool_calibration(void **state)
{
    struct kvf_proxy_pool *pool = test_pool();
    kvf_proxy_route_req_t rq = {.num_tokens = 100, .budget_ms = 10000,
                                .prefill_timeout_ms = 10000};
    kvf_proxy_route_t rt;

    (void)state;
    /* prefill 0: 1000 tokens/s, calibration 3, 100 queued: (100 + 100) / 1000 x 3 = 0.6 s;
     * prefill 1: no rate, 150 queued: (150 + 100) / 1000 (the pool's mean) x 3 = 0.75 s
     * (taken alone, uncalibrated, 250 tokens at 1000/s would be 0.25 s and win) */
    pthread_mutex_lock(&pool->lock);
    info_of(pool, 0, 0)->wait_calibration = 3.0;
    info_of(pool, 0, 0)->outstanding_tokens = 100;
    info_of(pool, 0, 1)->prefill_rate_recent = 0;
    info_of(pool, 0, 1)->prefill_tokens_per_s = 0;
    info_of(pool, 0, 1)->outstanding_tokens = 150;
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    assert_int_equal(rt.prefill_idx, 0);
    assert_true((rt.predicted_wait_ms > 599.9) && (rt.predicted_wait_ms < 600.1));

    /* calibration 1.5: prefill 0 at 0.3 s, prefill 1 at 0.375 s: still 0; with 40 queued
     * on prefill 1 instead, (40 + 100) x 1.5 = 0.21 s < 0.3 s: the unmeasured one */
    pthread_mutex_lock(&pool->lock);
    info_of(pool, 1, 0)->reserved = 0;
    info_of(pool, 1, 1)->reserved = 0;
    info_of(pool, 0, 0)->wait_calibration = 1.5;
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    assert_int_equal(rt.prefill_idx, 0);
    pthread_mutex_lock(&pool->lock);
    info_of(pool, 1, 0)->reserved = 0;
    info_of(pool, 1, 1)->reserved = 0;
    info_of(pool, 0, 1)->outstanding_tokens = 40;
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    assert_int_equal(rt.prefill_idx, 1);
    kvf_proxy_pool_destroy(pool);
}

/* A PrefillRequest counts in its instance's load until its call fails (never sent here). */
static void test_call_load(void **state)
{
    struct kvf_proxy_pool *pool = test_pool();
    Kvf__PrefillRequest preq = KVF__PREFILL_REQUEST__INIT;
    Kvf__ServeRequest sreq = KVF__SERVE_REQUEST__INIT;
    int32_t ids[100] = {0};
    kvf_proxy_call_h call = NULL;
    Kvf__ServeReply *r = NULL;
    char msg[256];

    (void)state;
    preq.request_id = (char *)"load-1";
    preq.n_prompt_tokens = 100;
    preq.prompt_tokens = ids;
    sreq.body_case = KVF__SERVE_REQUEST__BODY_PREFILL;
    sreq.prefill = &preq;
    assert_int_equal(kvf_proxy_call_start(pool, KVF_PROXY_ROLE_PREFILL, 1, "load-1", &sreq, &call),
                     KVF_OK);
    /* not connected (ZMQ_IMMEDIATE): the send fails and so does the call */
    assert_int_equal(kvf_proxy_call_next(call, 5000, &r, msg, sizeof(msg)),
                     KVF_ERR_PEER_UNREACHABLE);
    pthread_mutex_lock(&pool->lock);
    assert_int_equal(info_of(pool, 0, 1)->outstanding, 0);
    assert_int_equal(info_of(pool, 0, 1)->outstanding_tokens, 0);
    pthread_mutex_unlock(&pool->lock);
    kvf_proxy_call_end(call);
    kvf_proxy_pool_destroy(pool);
}

/*
 * A decode pick holds a slot until the request's decode call takes it over: with one
 * routable decode instance and --max-outstanding 4, four requests still in prefill fill it
 * and the fifth waits (queue_full), though no decode call was sent yet; a reservation given
 * back lets the next in; a DecodeRequest call turns a reservation into outstanding load.
 */
static void test_decode_reservation(void **state)
{
    struct kvf_proxy_pool *pool = test_pool();
    kvf_proxy_route_req_t rq = {.num_tokens = 100, .budget_ms = 10000,
                                .prefill_timeout_ms = 10000};
    Kvf__DecodeRequest dreq = KVF__DECODE_REQUEST__INIT;
    Kvf__ServeRequest sreq = KVF__SERVE_REQUEST__INIT;
    int32_t ids[100] = {0};
    kvf_proxy_call_h call = NULL;
    Kvf__ServeReply *r = NULL;
    kvf_proxy_route_t rt;
    char msg[256];
    int idx = -1;

    (void)state;
    pthread_mutex_lock(&pool->lock);
    info_of(pool, 1, 1)->healthy = false;
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < 4; ++i) {
        assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
        assert_int_equal(rt.decode_idx, 0);
    }
    pthread_mutex_lock(&pool->lock);
    assert_int_equal(info_of(pool, 1, 0)->reserved, 4);
    assert_int_equal(info_of(pool, 1, 0)->outstanding, 0);
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_ERR_NO_RESOURCE);
    assert_int_equal(rt.reason, KVF_PROXY_REJECT_QUEUE_FULL);
    /* a look at the decode role (kvf_proxy_pool_pick) reserves nothing */
    assert_int_equal(kvf_proxy_pool_pick(pool, KVF_PROXY_ROLE_DECODE, &idx), KVF_ERR_BUSY);

    kvf_proxy_pool_unreserve(pool, 0);   /* one request failed in prefill */
    assert_int_equal(kvf_proxy_pool_pick(pool, KVF_PROXY_ROLE_DECODE, &idx), KVF_OK);
    pthread_mutex_lock(&pool->lock);
    assert_int_equal(info_of(pool, 1, 0)->reserved, 3);
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_ERR_NO_RESOURCE);

    /* a request's decode call: its reservation becomes outstanding load (4 in all still) */
    dreq.request_id = (char *)"dec-1";
    dreq.n_prompt_tokens = 100;
    dreq.prompt_tokens = ids;
    sreq.body_case = KVF__SERVE_REQUEST__BODY_DECODE;
    sreq.decode = &dreq;
    assert_int_equal(kvf_proxy_call_start(pool, KVF_PROXY_ROLE_DECODE, 0, "dec-1", &sreq, &call),
                     KVF_OK);
    pthread_mutex_lock(&pool->lock);
    assert_int_equal(info_of(pool, 1, 0)->reserved, 3);
    pthread_mutex_unlock(&pool->lock);
    /* not connected: the call fails and its load goes; three reservations stay */
    assert_int_equal(kvf_proxy_call_next(call, 5000, &r, msg, sizeof(msg)),
                     KVF_ERR_PEER_UNREACHABLE);
    pthread_mutex_lock(&pool->lock);
    assert_int_equal(info_of(pool, 1, 0)->outstanding, 0);
    assert_int_equal(info_of(pool, 1, 0)->reserved, 3);
    pthread_mutex_unlock(&pool->lock);
    kvf_proxy_call_end(call);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    kvf_proxy_pool_destroy(pool);
}

/* Decode's key in requests: load, the share of the prompt it pulls (the same weight x 1 on
 * each with nothing cached: events off here; the test pool's weight is 0), plus one when its
 * free pages lack the prompt's blocks. */
static void test_decode_pages(void **state)
{
    struct kvf_proxy_pool *pool = test_pool();
    kvf_proxy_route_req_t rq = {.num_tokens = 100, .budget_ms = 10000,
                                .prefill_timeout_ms = 10000};
    kvf_proxy_route_t rt;

    (void)state;
    pthread_mutex_lock(&pool->lock);
    for (int i = 0; i < 2; ++i) {   /* 100 tokens in blocks of 16 at TP 2: 7 x 2 = 14 pages */
        info_of(pool, 1, i)->block_size = 16;
        info_of(pool, 1, i)->tp_size = 2;
        info_of(pool, 1, i)->total_pages = 1000;
    }
    info_of(pool, 1, 0)->free_pages = 13;   /* one page short: key 0 + 1 = 1 */
    info_of(pool, 1, 1)->free_pages = 14;   /* key 0 */
    pool->rr[KVF_PROXY_ROLE_DECODE] = 0;    /* round robin would start at 0 */
    pthread_mutex_unlock(&pool->lock);
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    assert_int_equal(rt.decode_idx, 1);
    assert_int_equal(rt.decode_cached_tokens, 0);
    /* decode 1 now holds a reservation: 1 = decode 0's 1, a tie, round robin from the
     * instance after the last pick (0) */
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    assert_int_equal(rt.decode_idx, 0);
    /* one reservation each: decode 0 1 + 1 (still short) = 2, decode 1 1 */
    assert_int_equal(kvf_proxy_route_pick(pool, &rq, &rt), KVF_OK);
    assert_int_equal(rt.decode_idx, 1);
    kvf_proxy_pool_destroy(pool);
}

static void test_reject_metrics(void **state)
{
    kvf_proxy_metrics_h m = NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *f;

    (void)state;
    assert_int_equal(kvf_proxy_metrics_create(&m), KVF_OK);
    kvf_proxy_metrics_reject(m, KVF_PROXY_REJECT_PREDICTED_WAIT);
    kvf_proxy_metrics_reject(m, KVF_PROXY_REJECT_PREDICTED_WAIT);
    kvf_proxy_metrics_reject(m, KVF_PROXY_REJECT_QUEUE_FULL);
    kvf_proxy_metrics_reject(m, KVF_PROXY_REJECT_COUNT);    /* out of range: ignored */
    assert_int_equal(kvf_proxy_metrics_rejected(m, KVF_PROXY_REJECT_PREDICTED_WAIT), 2);
    f = open_memstream(&text, &len);
    kvf_proxy_metrics_render(m, f);
    fclose(f);
    assert_non_null(strstr(text, "kvf_proxy_rejected_total{reason=\"predicted_wait\"} 2\n"));
    assert_non_null(strstr(text, "kvf_proxy_rejected_total{reason=\"queue_full\"} 1\n"));
    assert_non_null(strstr(text, "kvf_proxy_rejected_total{reason=\"instance_busy\"} 0\n"));
    free(text);
    kvf_proxy_metrics_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arithmetic),     cmocka_unit_test(test_rate_from_probes),
        cmocka_unit_test(test_pick_and_admit), cmocka_unit_test(test_call_load),
        cmocka_unit_test(test_reject_metrics), cmocka_unit_test(test_calibration),
        cmocka_unit_test(test_decode_reservation),
        cmocka_unit_test(test_unmeasured_takes_pool_calibration), cmocka_unit_test(test_decode_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
