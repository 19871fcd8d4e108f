/*
 * Disaggregated prefill/decode in one process, through the engine API the
 * role daemons use and the UCX KV connector: a prefill engine (TP P) runs
 * the prompt and keeps its blocks; a decode engine (TP D, its own leader
 * thread) handshakes, imports (allocate + zero), pulls every rank's share,
 * releases the prefill blocks, commits the first token and decodes.
 *
 * docs/ARCHITECTURE.md §3: at 1p1d the output equals a colocated run token for token
 * and logit for logit (same bytes); at other layouts the prefill state was
 * computed with another TP's reduction order, so logits agree within fp32
 * tolerance (1e-4 relative with fp32 KV; with bf16 KV such a difference can
 * flip the rounding of a cached element, 1e-3) and greedy tokens are equal.
 */
#include "kvf_model_test_util.h"
#include "kvf_connector.h"
#include "kvf_log.h"
#include "kvf_time.h"
#include "kvf_page_pool.h"
#include "kvf_connector_ucx.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GEN 10
#define PROMPT 120

static const kvf_connector_ops_t *ops;

typedef struct {
    kvf_connector_h  conn;
    kvf_engine_h     eng;
} kvf_reg_ctx_t;

static kvf_status_t kvf_register_rank(void *arg, int rank, kvf_page_pool_h pool)
{
    kvf_reg_ctx_t *c = arg;
    kvf_connector_pool_t p = {
        .tp_rank = rank,
        .base = kvf_page_pool_base(pool),
        .len = kvf_page_pool_bytes(pool),
        .num_blocks = kvf_page_pool_num_blocks(pool),
        .params = *kvf_tp_runner_cache_params(kvf_engine_runner(c->eng)),
    };
    return ops->register_pool(c->conn, &p);
}

/* prefill ranks: serve reads (progress) and collect releases until decode is done */
typedef struct {
    kvf_connector_h conn;
    atomic_int     *decode_done;
    atomic_int      releases;
    atomic_int      bad_status;
} kvf_serve_ctx_t;

static kvf_status_t kvf_serve_rank(void *arg, int rank, kvf_page_pool_h pool)
{
    kvf_serve_ctx_t *c = arg;
    double deadline = kvf_time_now_s() + 30.0;
    char id[64];
    int drank;
    kvf_status_t st;

    (void)pool;
    while (kvf_time_now_s() < deadline) {
        bool done = atomic_load(c->decode_done) != 0;
        if (ops->poll_release(c->conn, rank, 20, id, sizeof(id), &drank, &st) == KVF_OK) {
            atomic_fetch_add(&c->releases, 1);
            if ((st != KVF_OK) || (strcmp(id, "req-1") != 0)) {
                atomic_fetch_add(&c->bad_status, 1);
            }
        } else if (done) {
            break;
        }
    }
    return KVF_OK;
}

typedef struct {
    /* in */
    const char             *dir;
    int                     tp;
    int                     port;
    kvf_dtype_t             kv;
    kvf_kv_layout_t         layout;        /* decode's attention block layout */
    const int32_t          *prompt;
    int                     n;
    int32_t                 first;
    const kvf_req_blocks_t *remote;
    atomic_int             *done;
    /* out */
    int32_t                 tokens[GEN];
    float                   logits[GEN * 260];
    int                     num_logits;
    kvf_status_t            status;
    int                     blocks_back;   /* decode pool free count restored after release */
} kvf_decode_ctx_t;

typedef struct {
    kvf_connector_h             conn;
    const kvf_connector_pull_t *pull;
} kvf_pull_ctx_t;

static kvf_status_t kvf_pull_rank(void *arg, int rank, kvf_page_pool_h pool)
{
    kvf_pull_ctx_t *c = arg;
    kvf_connector_req_h req;
    kvf_status_t st;
    double deadline = kvf_time_now_s() + 20.0;

    (void)pool;
    st = ops->start_pull(c->conn, rank, c->pull, &req);
    if (st != KVF_OK) {
        return st;
    }
    while (((st = ops->poll(c->conn, rank, req)) == KVF_INPROGRESS) && (kvf_time_now_s() < deadline)) {
    }
    kvf_status_t rs = ops->notify_release(c->conn, rank, req);
    return (st != KVF_OK) ? st : rs;
}

static void *kvf_decode_main(void *arg)
{
    kvf_decode_ctx_t *d = arg;
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_connector_config_t cc = {0};
    kvf_connector_h conn = NULL;
    kvf_engine_h eng;
    kvf_req_params_t rp = {0};
    const kvf_req_blocks_t *local;
    kvf_connector_pull_t pull;
    kvf_engine_event_t ev[64];
    kvf_req_info_t info;
    char why[512];
    uint64_t id;
    int ne, nfree;

    o.tp = d->tp;
    o.kv_dtype = d->kv;
    o.kv_layout = d->layout;
    o.num_blocks = 64;
    eng = kvf_test_engine(d->dir, &o);
    nfree = kvf_block_manager_num_free(kvf_engine_block_manager(eng));
    cc.engine_id = "decode-0";
    cc.role = KVF_CONNECTOR_ROLE_DECODE;
    cc.tp_size = d->tp;
    cc.cfg = kvf_engine_model_config(eng);
    d->status = ops->create(&cc, &conn);
    if (d->status == KVF_OK) {
        kvf_reg_ctx_t rc = {conn, eng};
        d->status = kvf_engine_run_on_ranks(eng, kvf_register_rank, &rc);
    }
    if (d->status == KVF_OK) {
        d->status = ops->handshake(conn, "prefill-0", "127.0.0.1", d->port, why, sizeof(why));
        if (d->status != KVF_OK) {
            kvf_error("handshake: %s", why);
        }
    }
    rp.prompt = d->prompt;
    rp.prompt_len = d->n;
    rp.sampling.max_tokens = GEN;
    rp.sampling.ignore_eos = true;
    rp.record_logits = true;
    if (d->status == KVF_OK) {
        d->status = kvf_engine_import_begin(eng, &rp, &id, &local);
    }
    if (d->status == KVF_OK) {
        kvf_pull_ctx_t pc = {conn, &pull};
        memset(&pull, 0, sizeof(pull));
        pull.engine_id = "prefill-0";
        pull.request_id = "req-1";
        pull.num_tokens = d->n;
        pull.num_groups = local->num_groups;
        for (int g = 0; g < local->num_groups; ++g) {
            pull.remote_ids[g] = d->remote->blocks[g];
            pull.num_remote_ids[g] = d->remote->num_blocks[g];
            pull.local_ids[g] = local->blocks[g];
            pull.num_local_ids[g] = local->num_blocks[g];
        }
        d->status = kvf_engine_run_on_ranks(eng, kvf_pull_rank, &pc);
    }
    atomic_store(d->done, 1);
    if (d->status == KVF_OK) {
        d->status = kvf_engine_import_commit(eng, id, d->first);
    }
    while ((d->status == KVF_OK) && kvf_engine_has_work(eng)) {
        d->status = kvf_engine_step(eng, ev, 64, &ne);
    }
    if ((d->status == KVF_OK) && (kvf_engine_request_info(eng, id, &info) == KVF_OK)) {
        memcpy(d->tokens, info.tokens + d->n, sizeof(d->tokens));
        d->num_logits = info.num_logits;
        memcpy(d->logits, info.logits, (size_t)info.num_logits * 260 * sizeof(float));
        (void)kvf_engine_release(eng, id);
        d->blocks_back = (kvf_block_manager_num_free(kvf_engine_block_manager(eng)) == nfree);
    }
    ops->destroy(conn);
    kvf_engine_destroy(eng);
    return NULL;
}

/* Prefill at @a pl, decode at @a dl (attention block layouts); colocated at layer-major. */
static void kvf_disagg_kv(const char *dir, int ptp, int dtp, kvf_dtype_t kv, kvf_kv_layout_t pl,
                          kvf_kv_layout_t dl)
{
    kvf_test_engine_opts_t o = kvf_test_engine_defaults();
    kvf_connector_config_t cc = {0};
    kvf_connector_h pconn;
    kvf_engine_h pe, ce;
    kvf_req_params_t rp = {0};
    kvf_req_info_t pinfo;
    int32_t prompt[PROMPT], colo[GEN], first;
    float *colo_lg = malloc(GEN * 260 * sizeof(float));
    kvf_decode_ctx_t *d = calloc(1, sizeof(*d));
    atomic_int done = 0;
    kvf_serve_ctx_t sc;
    pthread_t th;
    uint64_t pid;
    int port, pfree;

    assert_non_null(colo_lg);
    assert_non_null(d);
    prompt[0] = 256;
    for (int i = 1; i < PROMPT; ++i) {
        prompt[i] = (int32_t)((i * 41 + 7) % 256);
    }
    o.kv_dtype = kv;
    o.num_blocks = 64;
    o.tp = dtp;
    ce = kvf_test_engine(dir, &o);
    kvf_test_greedy(ce, prompt, PROMPT, GEN, colo, colo_lg);
    kvf_engine_destroy(ce);

    /* prefill instance: run the prompt, hold the blocks */
    o.tp = ptp;
    o.kv_layout = pl;
    pe = kvf_test_engine(dir, &o);
    pfree = kvf_block_manager_num_free(kvf_engine_block_manager(pe));
    rp.prompt = prompt;
    rp.prompt_len = PROMPT;
    rp.sampling.max_tokens = GEN;
    assert_int_equal(kvf_engine_prefill(pe, &rp, &pid, &first), KVF_OK);
    assert_int_equal(first, colo[0]);
    assert_int_equal(kvf_engine_request_info(pe, pid, &pinfo), KVF_OK);
    cc.engine_id = "prefill-0";
    cc.role = KVF_CONNECTOR_ROLE_PREFILL;
    cc.tp_size = ptp;
    cc.cfg = kvf_engine_model_config(pe);
    assert_int_equal(ops->create(&cc, &pconn), KVF_OK);
    {
        kvf_reg_ctx_t rc = {pconn, pe};
        assert_int_equal(kvf_engine_run_on_ranks(pe, kvf_register_rank, &rc), KVF_OK);
    }
    assert_int_equal(ops->serve(pconn, &port), KVF_OK);

    /* decode instance on its own leader thread; prefill ranks serve meanwhile */
    *d = (kvf_decode_ctx_t){.dir = dir, .tp = dtp, .port = port, .kv = kv, .layout = dl,
                            .prompt = prompt,
                            .n = PROMPT,
                            .first = first, .remote = pinfo.blocks, .done = &done};
    sc = (kvf_serve_ctx_t){.conn = pconn, .decode_done = &done};
    assert_int_equal(pthread_create(&th, NULL, kvf_decode_main, d), 0);
    assert_int_equal(kvf_engine_run_on_ranks(pe, kvf_serve_rank, &sc), KVF_OK);
    pthread_join(th, NULL);

    assert_int_equal(d->status, KVF_OK);
    assert_true(atomic_load(&sc.releases) >= 1);
    assert_int_equal(atomic_load(&sc.bad_status), 0);
    assert_int_equal(kvf_engine_release(pe, pid), KVF_OK);   /* lease over */
    assert_int_equal(kvf_block_manager_num_free(kvf_engine_block_manager(pe)), pfree);
    assert_true(d->blocks_back);

    assert_memory_equal(d->tokens, colo, sizeof(colo));
    assert_int_equal(d->num_logits, GEN - 1);
    {
        double worst = 0.0;
        for (int s = 0; s < GEN - 1; ++s) {
            double r = kvf_test_rel_diff(d->logits + s * 260, colo_lg + (s + 1) * 260, 260);
            assert_false(isnan(r));
            worst = (r > worst) ? r : worst;
        }
        print_message("%dp%dd kv %s, prefill %s, decode %s: %d releases, max logit rel diff vs"
                      " colocated (layer-major) %.3g\n", ptp, dtp, kvf_dtype_name(kv),
                      kvf_kv_layout_name((int)pl), kvf_kv_layout_name((int)dl),
                      atomic_load(&sc.releases), worst);
        if (ptp == dtp) {
            assert_true(worst == 0.0);   /* same TP: the same bytes, the same logits */
        } else {
            assert_true(worst < ((kv == KVF_DTYPE_FP32) ? 1e-4 : 1e-3));
        }
    }
    ops->destroy(pconn);
    kvf_engine_destroy(pe);
    free(colo_lg);
    free(d);
}

static void kvf_disagg(const char *dir, int ptp, int dtp, kvf_dtype_t kv)
{
    kvf_disagg_kv(dir, ptp, dtp, kv, KVF_KV_LAYER_MAJOR, KVF_KV_LAYER_MAJOR);
}

/*
 * The head-major attention block layout (kernels/kvf_kv_layout.h): the same math at other
 * addresses, so at equal TP a prefill and a decode at head-major, and mixed pairs, give the
 * colocated layer-major run's tokens and logits bit for bit; at unequal TP within the
 * tolerance above (the prefill TP's reduction order), greedy tokens equal.
 */
static void test_disaggregated_kv_layouts(void **state)
{
    static const int layouts[][2] = {{1, 1}, {2, 2}, {4, 2}, {1, 4}, {4, 1}};
    char dir[256];

    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 17, dir);
    for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); ++i) {
        kvf_disagg_kv(dir, layouts[i][0], layouts[i][1], KVF_DTYPE_BF16, KVF_KV_HEAD_MAJOR,
                      KVF_KV_HEAD_MAJOR);
    }
    kvf_disagg_kv(dir, 1, 1, KVF_DTYPE_FP32, KVF_KV_HEAD_MAJOR, KVF_KV_LAYER_MAJOR);
    kvf_disagg_kv(dir, 2, 1, KVF_DTYPE_BF16, KVF_KV_LAYER_MAJOR, KVF_KV_HEAD_MAJOR);
    kvf_test_rmmodel(dir);
    kvf_test_mkmodel("tiny-dense", 17, dir);
    kvf_disagg_kv(dir, 1, 1, KVF_DTYPE_FP32, KVF_KV_HEAD_MAJOR, KVF_KV_HEAD_MAJOR);
    kvf_disagg_kv(dir, 4, 1, KVF_DTYPE_FP32, KVF_KV_HEAD_MAJOR, KVF_KV_LAYER_MAJOR);
    kvf_test_rmmodel(dir);
}

static void test_disaggregated_layouts(void **state)
{
    static const int layouts[][2] = {{1, 1}, {2, 1}, {1, 2}, {4, 2}, {2, 4}, {2, 2}};
    char dir[256];

    (void)state;
    kvf_test_mkmodel("tiny-hybrid", 17, dir);
    for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); ++i) {
        kvf_disagg(dir, layouts[i][0], layouts[i][1], KVF_DTYPE_BF16);
        kvf_disagg(dir, layouts[i][0], layouts[i][1], KVF_DTYPE_FP32);
    }
    kvf_test_rmmodel(dir);
}

static void test_disaggregated_dense(void **state)
{
    static const int layouts[][2] = {{1, 1}, {4, 1}, {1, 4}};
    char dir[256];

    (void)state;
    kvf_test_mkmodel("tiny-dense", 17, dir);
    for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); ++i) {
        kvf_disagg(dir, layouts[i][0], layouts[i][1], KVF_DTYPE_FP32);
    }
    kvf_test_rmmodel(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disaggregated_layouts),
        cmocka_unit_test(test_disaggregated_dense),
        cmocka_unit_test(test_disaggregated_kv_layouts),
    };
    kvf_log_init("test");
    ops = kvf_connector_ucx_ops();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
