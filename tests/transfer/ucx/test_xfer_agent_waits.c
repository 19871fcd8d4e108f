/*
 * UCX agent waits and closes under the conditions that used to break them,
 * over TCP (a GET then needs the target to progress, so a target that is
 * never progressed is a stalled peer):
 * - a worker that is never idle: ucp_worker_progress() is wrapped
 *   (-Wl,--wrap) to report work on every call for a bounded budget of calls.
 *   batch wait, notify send and notify receive must still time out by their
 *   deadline, i.e. return while the budget is left. Before the fix they
 *   looked at the clock only when progress returned 0, so they spun until
 *   the budget ran out.
 * - an endpoint whose close times out is parked, not freed: its error
 *   callback then fires when the target goes away (ASan would see a
 *   use-after-free otherwise), and the peer is freed once its close request
 *   completed.
 */
#include "kvf_ucx_agent.h"

#include "kvf_log.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include <cmocka.h>

#define REGION    (256u << 10)
#define WAIT_MS   200
#define BUSY_CALLS 50000000L   /* far more rounds than WAIT_MS of spinning takes */

unsigned __real_ucp_worker_progress(ucp_worker_h worker);
unsigned __wrap_ucp_worker_progress(ucp_worker_h worker);

static atomic_long busy_left;   /* > 0: progress reports work, and counts down */

unsigned __wrap_ucp_worker_progress(ucp_worker_h worker)
{
    unsigned n = __real_ucp_worker_progress(worker);

    if ((atomic_load(&busy_left) > 0) && (atomic_fetch_sub(&busy_left, 1) > 0)) {
        return (n > 0) ? n : 1;
    }
    return n;
}

static kvf_ucx_agent_h make_agent(const char *name, uint32_t timeout_ms)
{
    kvf_ucx_agent_params_t p;
    kvf_ucx_agent_h a;

    memset(&p, 0, sizeof(p));
    p.field_mask = KVF_UCX_AGENT_PARAM_FIELD_NAME | KVF_UCX_AGENT_PARAM_FIELD_TIMEOUT_MS;
    p.name = name;
    p.timeout_ms = timeout_ms;
    assert_int_equal(kvf_ucx_agent_create(&p, &a), KVF_OK);
    return a;
}

static void meta_of(kvf_ucx_agent_h a, int region, kvf_rank_meta_t *m)
{
    memset(m, 0, sizeof(*m));
    snprintf(m->engine_id, sizeof(m->engine_id), "target");
    m->tp_size = 1;
    m->num_regions = 1;
    assert_int_equal(kvf_ucx_agent_region_meta(a, region, &m->regions[0]), KVF_OK);
    assert_int_equal(kvf_ucx_agent_worker_address(a, m->worker_addr, sizeof(m->worker_addr),
                                                  &m->worker_addr_len), KVF_OK);
}

typedef struct {
    kvf_ucx_agent_h agent;
    atomic_bool     stop;
} target_t;

static void *target_thread(void *arg)
{
    target_t *t = arg;
    while (!atomic_load(&t->stop)) {
        kvf_ucx_agent_progress(t->agent);
    }
    return NULL;
}

typedef struct {
    kvf_ucx_agent_h a, b;      /* initiator, stalled target */
    uint8_t        *la, *lb;
    int             ra, rb;
    kvf_rank_meta_t *mb;
} pair_t;

static void pair_init(pair_t *p, uint32_t timeout_ms)
{
    p->a = make_agent("initiator", timeout_ms);
    p->b = make_agent("stalled target", timeout_ms);
    p->la = calloc(1, REGION);
    p->lb = calloc(1, REGION);
    p->mb = calloc(1, sizeof(*p->mb));
    assert_non_null(p->la);
    assert_non_null(p->lb);
    assert_non_null(p->mb);
    assert_int_equal(kvf_ucx_agent_mem_register(p->a, p->la, REGION, &p->ra), KVF_OK);
    assert_int_equal(kvf_ucx_agent_mem_register(p->b, p->lb, REGION, &p->rb), KVF_OK);
    meta_of(p->b, p->rb, p->mb);
}

static void pair_cleanup(pair_t *p)
{
    kvf_ucx_agent_destroy(p->a);
    kvf_ucx_agent_destroy(p->b);
    free(p->la);
    free(p->lb);
    free(p->mb);
}

/* a: every wait returns by its deadline while the worker reports work on every round */
static void test_deadline_every_round(void **state)
{
    const kvf_xfer_desc_t d = {0, 0, 64 << 10};
    pair_t p;
    kvf_ucx_peer_h peer, peer2;
    kvf_ucx_batch_h batch;
    uint8_t buf[64];
    size_t len;
    long left;
    target_t t;
    pthread_t th;

    (void)state;
    pair_init(&p, WAIT_MS);
    assert_int_equal(kvf_ucx_peer_connect(p.a, p.mb, &peer), KVF_OK);
    assert_int_equal(kvf_ucx_xfer_post(p.a, peer, KVF_UCX_OP_GET, p.ra, 0, &d, 1, &batch),
                     KVF_OK);

    atomic_store(&busy_left, BUSY_CALLS);
    assert_int_equal(kvf_ucx_batch_wait(batch, WAIT_MS), KVF_ERR_PEER_TIMEOUT);
    left = atomic_load(&busy_left);
    assert_true(left > 0);          /* returned by the deadline, not when progress went idle */
    assert_int_equal(kvf_ucx_peer_status(peer), KVF_ERR_PEER_TIMEOUT);
    kvf_ucx_batch_release(batch);

    atomic_store(&busy_left, BUSY_CALLS);
    /* none arrived while the worker kept reporting work: "in progress", by the deadline */
    assert_int_equal(kvf_ucx_notify_recv(p.a, buf, sizeof(buf), &len, WAIT_MS),
                     KVF_INPROGRESS);
    assert_true(atomic_load(&busy_left) > 0);

    /* a notification to the stalled target: its wire-up never completes */
    assert_int_equal(kvf_ucx_peer_connect(p.a, p.mb, &peer2), KVF_OK);
    atomic_store(&busy_left, BUSY_CALLS);
    assert_int_equal(kvf_ucx_notify_send(p.a, peer2, "late", 5), KVF_ERR_PEER_TIMEOUT);
    assert_true(atomic_load(&busy_left) > 0);
    assert_int_equal(kvf_ucx_peer_status(peer2), KVF_ERR_PEER_TIMEOUT);

    /* arm gives up on a worker that never goes idle instead of spinning */
    atomic_store(&busy_left, BUSY_CALLS);
    assert_int_equal(kvf_ucx_agent_arm(p.a), KVF_ERR_BUSY);
    assert_true(atomic_load(&busy_left) > 0);
    atomic_store(&busy_left, 0);

    /* the target wakes up: the failed peers close (forced) and nothing is left parked */
    t.agent = p.b;
    atomic_init(&t.stop, false);
    assert_int_equal(pthread_create(&th, NULL, target_thread, &t), 0);
    kvf_ucx_peer_destroy(peer);
    kvf_ucx_peer_destroy(peer2);
    {
        uint64_t deadline = kvf_time_now_ns() + 10000000000ull;
        while ((kvf_ucx_agent_num_parked(p.a) > 0) && (kvf_time_now_ns() < deadline)) {
            kvf_ucx_agent_progress(p.a);
        }
    }
    assert_int_equal(kvf_ucx_agent_num_parked(p.a), 0);
    atomic_store(&t.stop, true);
    pthread_join(th, NULL);
    pair_cleanup(&p);
}

/* An idle worker (nothing connected, no busy wrapper): none arrived and no work -> timeout. */
static void test_idle_recv_times_out(void **state)
{
    kvf_ucx_agent_h a = make_agent("idle", WAIT_MS);
    uint8_t buf[64];
    size_t len;

    (void)state;
    atomic_store(&busy_left, 0);
    (void)kvf_ucx_agent_progress(a);   /* start-up work, if any, done first */
    assert_int_equal(kvf_ucx_notify_recv(a, buf, sizeof(buf), &len, 20), KVF_ERR_PEER_TIMEOUT);
    kvf_ucx_agent_destroy(a);
}

/* b: a close that times out parks the peer; its error callback fires later on live memory */
static void test_close_timeout_parks(void **state)
{
    const kvf_xfer_desc_t d = {0, 0, 64 << 10};
    pair_t p;
    kvf_ucx_peer_h peer;
    kvf_ucx_batch_h batch;

    (void)state;
    pair_init(&p, WAIT_MS);
    assert_int_equal(kvf_ucx_peer_connect(p.a, p.mb, &peer), KVF_OK);
    assert_int_equal(kvf_ucx_xfer_post(p.a, peer, KVF_UCX_OP_GET, p.ra, 0, &d, 1, &batch),
                     KVF_OK);
    kvf_ucx_batch_release(batch);   /* abandoned: the GET stays posted inside UCX */
    assert_int_equal(kvf_ucx_peer_status(peer), KVF_OK);

    /* a graceful close must flush the GET, which the stalled target never serves */
    kvf_ucx_peer_destroy(peer);
    assert_int_equal(kvf_ucx_agent_num_parked(p.a), 1);

    /* the target goes away: our endpoint fails, its error callback runs on the parked peer */
    kvf_ucx_agent_destroy(p.b);
    p.b = NULL;
    {
        uint64_t deadline = kvf_time_now_ns() + 20000000000ull;
        while ((kvf_ucx_agent_num_parked(p.a) > 0) && (kvf_time_now_ns() < deadline)) {
            kvf_ucx_agent_progress(p.a);
        }
    }
    assert_int_equal(kvf_ucx_agent_num_parked(p.a), 0);
    pair_cleanup(&p);
}

/* b: a peer still parked when its agent is destroyed is freed after the worker */
static void test_parked_at_destroy(void **state)
{
    const kvf_xfer_desc_t d = {0, 0, 4096};
    pair_t p;
    kvf_ucx_peer_h peer;
    kvf_ucx_batch_h batch;

    (void)state;
    pair_init(&p, WAIT_MS);
    assert_int_equal(kvf_ucx_peer_connect(p.a, p.mb, &peer), KVF_OK);
    assert_int_equal(kvf_ucx_xfer_post(p.a, peer, KVF_UCX_OP_GET, p.ra, 0, &d, 1, &batch),
                     KVF_OK);
    kvf_ucx_batch_release(batch);
    kvf_ucx_peer_destroy(peer);
    assert_int_equal(kvf_ucx_agent_num_parked(p.a), 1);
    pair_cleanup(&p);               /* LSan: nothing leaks, ASan: nothing used after free */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deadline_every_round),
        cmocka_unit_test(test_idle_recv_times_out),
        cmocka_unit_test(test_close_timeout_parks),
        cmocka_unit_test(test_parked_at_destroy),
    };
    /* TCP only: a GET needs the target's progress, so an unprogressed target stalls it */
    setenv("UCX_TLS", "tcp,self", 1);
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
