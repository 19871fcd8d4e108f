/*
 * The UCX connector ops table end to end in one process: a prefill instance
 * (TP 2, a thread per rank) and a decode instance (TP 1) of tiny-hybrid.
 * The decode pool after start_pull/poll must equal what the planner's
 * memcpy reference (kvf_xfer_plan_apply_local) produces from the same
 * pools; each prefill rank receives the release; incompatible dtypes are
 * refused with the field and both values; bad ids and unknown engines are
 * refused before any RDMA; stubs answer KVF_ERR_UNSUPPORTED. Prefill rank 1
 * lets the connector allocate its pool (alloc_pool: UCX-mapped shared memory),
 * rank 0 registers its own: both are read byte-exact.
 */
#include "kvf_connector_ucx.h"
#include "kvf_ucx_agent.h"
#include "kvf_xfer_plan.h"
#include "kvf_xfer.pb-c.h"

#include "kvf_log.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define TOKENS 150
#define P_BLOCKS 6
#define D_BLOCKS 7

static kvf_model_config_t cfg;
static kvf_cache_layout_t layout;
static const kvf_connector_ops_t *ops;

/* request block ids per group (tiny-hybrid: one attention group, two Mamba groups) */
static const int32_t p_ids0[2] = {4, 1}, p_ids1[1] = {0}, p_ids2[1] = {5};
static const int32_t d_ids0[2] = {6, 2}, d_ids1[1] = {3}, d_ids2[1] = {0};

typedef struct {
    kvf_connector_h   conn;
    int               rank;
    uint8_t          *pool;         /* rank 1: the connector's (alloc_pool) */
    size_t            len;
    uint64_t          seed;
    kvf_cache_params_t params;
    pthread_barrier_t *ready;
    int               releases;
    char              last_id[64];
    kvf_status_t      last_status;
} prank_t;

static size_t pool_bytes(const kvf_cache_params_t *p, int tp, int rank, int64_t blocks)
{
    kvf_rank_geometry_t g;
    assert_int_equal(kvf_rank_geometry_compute(&cfg, p, tp, rank, &g), KVF_OK);
    return (size_t)blocks * (size_t)layout.slots * g.page_size;
}

static void *prefill_rank(void *arg)
{
    prank_t *r = arg;
    kvf_connector_pool_t pool = {r->rank, r->pool, r->len, P_BLOCKS, r->params, kvf_device_cpu()};
    uint64_t deadline, rng = r->seed;

    if (r->rank == 1) {
        void *base = NULL;
        /* a given base or no out pointer is refused; then the connector allocates */
        pool.base = &base;
        if ((ops->alloc_pool(r->conn, &pool, &base) != KVF_ERR_INVALID_PARAM) ||
            (ops->alloc_pool(r->conn, &pool, NULL) != KVF_ERR_INVALID_PARAM)) {
            r->last_status = KVF_ERR_IO;
        }
        pool.base = NULL;
        if ((ops->alloc_pool(r->conn, &pool, &base) != KVF_OK) || (base == NULL) ||
            (((uintptr_t)base & 4095u) != 0) ||
            (ops->alloc_pool(r->conn, &pool, &base) != KVF_ERR_BUSY)) {
            r->last_status = KVF_ERR_IO;
        }
        r->pool = base;
    } else if (ops->register_pool(r->conn, &pool) != KVF_OK) {
        r->last_status = KVF_ERR_IO;
    }
    for (size_t i = 0; (r->pool != NULL) && (i < r->len); ++i) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        r->pool[i] = (uint8_t)rng;
    }
    pthread_barrier_wait(r->ready);
    deadline = kvf_time_now_ns() + 20000000000ull;
    while ((r->releases < 1) && (kvf_time_now_ns() < deadline)) {
        int drank;
        kvf_status_t st;
        if (ops->poll_release(r->conn, r->rank, 50, r->last_id, sizeof(r->last_id), &drank,
                              &st) == KVF_OK) {
            r->releases++;
            r->last_status = st;
        }
    }
    return NULL;
}

/* The decode pool registered; its metadata holds one region and, not being remotely
 * accessible, no key. */
static void register_decode_pool(kvf_connector_h dconn, uint8_t *dpool, size_t dlen,
                                 kvf_cache_params_t params)
{
    kvf_connector_pool_t pool = {0, dpool, dlen, D_BLOCKS, params, kvf_device_cpu()};
    uint8_t meta[32768];
    size_t mlen = 0;
    assert_int_equal(ops->register_pool(dconn, &pool), KVF_OK);
    assert_int_equal(ops->get_metadata(dconn, 0, meta, sizeof(meta), &mlen), KVF_OK);
    assert_true(mlen > 0);
    {   /* decode's pool is not remotely accessible: its metadata holds no key */
        Kvf__HandshakeReply *r = kvf__handshake_reply__unpack(NULL, mlen, meta);
        assert_non_null(r);
        assert_int_equal(r->n_ranks, 1);
        assert_int_equal(r->ranks[0]->n_regions, 1);
        assert_int_equal(r->ranks[0]->regions[0]->rkey.len, 0);
        assert_true(r->ranks[0]->regions[0]->length > 0);
        kvf__handshake_reply__free_unpacked(r, NULL);
    }
}

/* What the pull must have written: the same plan applied to @ref with memcpy from the two
 * prefill ranks' pools. */
static void pull_reference(const kvf_cache_params_t *params, const prank_t *pr, uint8_t *ref,
                           size_t dlen)
{
    kvf_rank_geometry_t lg, rg[2];
    int64_t rnb[2] = {P_BLOCKS, P_BLOCKS};
    kvf_xfer_group_blocks_t groups[3] = {
        {d_ids0, 2, p_ids0, 2}, {d_ids1, 1, p_ids1, 1}, {d_ids2, 1, p_ids2, 1}};
    kvf_xfer_plan_params_t pp;
    kvf_xfer_plan_t *plan;
    const void *bases[2] = {pr[0].pool, pr[1].pool};
    size_t lens[2] = {pr[0].len, pr[1].len};

    assert_int_equal(kvf_rank_geometry_compute(&cfg, params, 1, 0, &lg), KVF_OK);
    for (int r = 0; r < 2; ++r) {
        assert_int_equal(kvf_rank_geometry_compute(&cfg, params, 2, r, &rg[r]), KVF_OK);
    }
    memset(&pp, 0, sizeof(pp));
    pp.cfg = &cfg;
    pp.layout = &layout;
    pp.local_tp = 1;
    pp.local_rank = 0;
    pp.local_geom = &lg;
    pp.local_num_blocks = D_BLOCKS;
    pp.remote_tp = 2;
    pp.remote_geoms = rg;
    pp.remote_num_blocks = rnb;
    pp.num_groups = 3;
    pp.groups = groups;
    pp.num_tokens = TOKENS;
    assert_int_equal(kvf_xfer_plan_create(&pp, &plan), KVF_OK);
    assert_int_equal(kvf_xfer_plan_apply_local(plan, ref, dlen, bases, lens), KVF_OK);
    assert_true(plan->total_bytes > 0);
    kvf_xfer_plan_destroy(plan);
}

/* A decode instance with fp16 KV is refused by the bf16 prefill at @port, naming the field
 * and both values. */
static void check_fp16_refused(kvf_connector_config_t dc, kvf_cache_params_t params, int port)
{
    kvf_connector_h bad;
    char why[512];
    kvf_cache_params_t p16 = params;
    uint8_t *pool16;
    size_t len16;

    dc.engine_id = "decode-fp16";
    p16.kv_dtype = KVF_DTYPE_FP16;
    len16 = pool_bytes(&p16, 1, 0, D_BLOCKS);
    pool16 = malloc(len16);
    assert_non_null(pool16);
    assert_int_equal(ops->create(&dc, &bad), KVF_OK);
    kvf_connector_pool_t pool = {0, pool16, len16, D_BLOCKS, p16, kvf_device_cpu()};
    assert_int_equal(ops->register_pool(bad, &pool), KVF_OK);
    assert_int_equal(ops->handshake(bad, "prefill-c", "127.0.0.1", port, why, sizeof(why)),
                     KVF_ERR_REFUSED);
    assert_memory_equal(why, "handshake refused: kv_dtype prefill=bf16 decode=fp16: ",
                        strlen("handshake refused: kv_dtype prefill=bf16 decode=fp16: "));
    ops->destroy(bad);
    free(pool16);
}

/* Bad pulls are refused before anything is posted: an out-of-range prefill id, and (ABI 14)
 * a plan flag other than the window's (refused, not ignored). */
static void refuses_bad_pulls(kvf_connector_h dconn, const kvf_connector_pull_t *pull)
{
    const int32_t oob[2] = {4, P_BLOCKS};
    kvf_connector_pull_t bad_pull = *pull;
    kvf_connector_req_h req;

    bad_pull.remote_ids[0] = oob;
    assert_int_equal(ops->start_pull(dconn, 0, &bad_pull, &req), KVF_ERR_OUT_OF_RANGE);
    bad_pull = *pull;
    bad_pull.plan_flags = KVF_XFER_PLAN_FLAG_NO_COALESCE;
    assert_int_equal(ops->start_pull(dconn, 0, &bad_pull, &req), KVF_ERR_INVALID_PARAM);
}

static void test_ucx_connector(void **state)
{
    kvf_connector_config_t pc = {0}, dc = {0};
    kvf_connector_h pconn, dconn;
    kvf_cache_params_t params;
    prank_t pr[2];
    pthread_t th[2];
    pthread_barrier_t ready;
    uint8_t *dpool, *ref;
    size_t dlen;
    int port;
    char why[512];
    kvf_connector_pull_t pull;
    kvf_connector_req_h req;
    kvf_status_t st;
    uint64_t rng = 77;

    (void)state;
    kvf_cache_params_default(&cfg, &params);
    assert_int_equal(kvf_connector_ops_check(ops), KVF_OK);

    pc.engine_id = "prefill-c";
    pc.role = KVF_CONNECTOR_ROLE_PREFILL;
    pc.tp_size = 2;
    pc.cfg = &cfg;
    assert_int_equal(ops->create(&pc, &pconn), KVF_OK);
    pthread_barrier_init(&ready, NULL, 3);
    for (int r = 0; r < 2; ++r) {
        memset(&pr[r], 0, sizeof(pr[r]));
        pr[r].conn = pconn;
        pr[r].rank = r;
        pr[r].params = params;
        pr[r].len = pool_bytes(&params, 2, r, P_BLOCKS);
        pr[r].pool = (r == 0) ? malloc(pr[r].len) : NULL;
        assert_true((r == 1) || (pr[r].pool != NULL));
        pr[r].seed = rng + (uint64_t)r;
        pr[r].ready = &ready;
        pthread_create(&th[r], NULL, prefill_rank, &pr[r]);
    }
    pthread_barrier_wait(&ready);
    assert_non_null(pr[1].pool);
    assert_int_equal(pr[0].last_status, KVF_OK);
    assert_int_equal(pr[1].last_status, KVF_OK);
    assert_int_equal(ops->serve(pconn, &port), KVF_OK);

    /* decode instance, this thread is its rank 0 and its leader */
    dc.engine_id = "decode-c";
    dc.role = KVF_CONNECTOR_ROLE_DECODE;
    dc.tp_size = 1;
    dc.cfg = &cfg;
    assert_int_equal(ops->create(&dc, &dconn), KVF_OK);
    dlen = pool_bytes(&params, 1, 0, D_BLOCKS);
    dpool = malloc(dlen);
    ref = malloc(dlen);
    assert_non_null(dpool);
    assert_non_null(ref);
    memset(dpool, 0xab, dlen);
    memset(ref, 0xab, dlen);
    register_decode_pool(dconn, dpool, dlen, params);

    /* pull before the handshake: unknown engine */
    memset(&pull, 0, sizeof(pull));
    pull.engine_id = "prefill-c";
    pull.request_id = "r1";
    pull.num_tokens = TOKENS;
    pull.num_groups = 3;
    pull.remote_ids[0] = p_ids0; pull.num_remote_ids[0] = 2;
    pull.remote_ids[1] = p_ids1; pull.num_remote_ids[1] = 1;
    pull.remote_ids[2] = p_ids2; pull.num_remote_ids[2] = 1;
    pull.local_ids[0] = d_ids0; pull.num_local_ids[0] = 2;
    pull.local_ids[1] = d_ids1; pull.num_local_ids[1] = 1;
    pull.local_ids[2] = d_ids2; pull.num_local_ids[2] = 1;
    assert_int_equal(layout.num_groups, 3);
    assert_int_equal(ops->start_pull(dconn, 0, &pull, &req), KVF_ERR_NOT_FOUND);

    assert_int_equal(ops->handshake(dconn, "prefill-c", "127.0.0.1", port, why, sizeof(why)),
                     KVF_OK);
    assert_int_equal(ops->handshake(dconn, "prefill-c", "127.0.0.1", port, why, sizeof(why)),
                     KVF_OK);   /* cached */

    refuses_bad_pulls(dconn, &pull);

    /* the real pull */
    assert_int_equal(ops->start_pull(dconn, 0, &pull, &req), KVF_OK);
    {
        uint64_t deadline = kvf_time_now_ns() + 10000000000ull;
        while (((st = ops->poll(dconn, 0, req)) == KVF_INPROGRESS) &&
               (kvf_time_now_ns() < deadline)) {
        }
    }
    assert_int_equal(st, KVF_OK);

    /* reference: the same plan applied with memcpy */
    pull_reference(&params, pr, ref, dlen);
    assert_memory_equal(dpool, ref, dlen);

    assert_int_equal(ops->notify_release(dconn, 0, req), KVF_OK);
    for (int r = 0; r < 2; ++r) {
        pthread_join(th[r], NULL);
        assert_int_equal(pr[r].releases, 1);
        assert_string_equal(pr[r].last_id, "r1");
        assert_int_equal(pr[r].last_status, KVF_OK);
    }

    /* a decode instance with fp16 KV is refused, naming the field and both values */
    check_fp16_refused(dc, params, port);

    ops->destroy(dconn);
    ops->destroy(pconn);
    pthread_barrier_destroy(&ready);
    free(pr[0].pool);   /* pr[1].pool went with pconn */
    free(dpool);
    free(ref);
}

static void test_stubs(void **state)
{
    kvf_connector_ops_t empty;
    kvf_connector_h conn = NULL;
    char id[8];
    int rank;
    kvf_status_t st;

    (void)state;
    memset(&empty, 0, sizeof(empty));
    empty.abi_version = KVF_CONNECTOR_ABI;
    empty.name = "empty";
    assert_int_equal(kvf_connector_ops_check(&empty), KVF_ERR_UNSUPPORTED);
    kvf_connector_ops_fill_stubs(&empty);
    assert_int_equal(kvf_connector_ops_check(&empty), KVF_OK);
    assert_int_equal(empty.create(NULL, &conn), KVF_ERR_UNSUPPORTED);
    assert_int_equal(empty.serve(NULL, NULL), KVF_ERR_UNSUPPORTED);
    assert_int_equal(empty.poll(NULL, 0, NULL), KVF_ERR_UNSUPPORTED);
    assert_int_equal(empty.alloc_pool(NULL, NULL, NULL), KVF_ERR_UNSUPPORTED);
    assert_int_equal(empty.poll_release(NULL, 0, 0, id, sizeof(id), &rank, &st),
                     KVF_ERR_UNSUPPORTED);
    empty.destroy(NULL);
    empty.abi_version = KVF_CONNECTOR_ABI + 1;
    assert_int_equal(kvf_connector_ops_check(&empty), KVF_ERR_UNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stubs),
        cmocka_unit_test(test_ucx_connector),
    };
    kvf_log_init("test");
    if ((kvf_model_config_load(KVF_SOURCE_DIR "/tests/data/models/tiny-hybrid.config.json",
                               &cfg) != KVF_OK) ||
        (kvf_cache_layout_build(&cfg, &layout) != KVF_OK)) {
        return 1;
    }
    ops = kvf_connector_ucx_ops();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
