/*
 * Memory types of transfer regions, on a machine without a GPU:
 * - what the agent's UCX reaches (ucp_context_query): host always; cuda
 *   exactly when UCX lists UCS_MEMORY_TYPE_CUDA (Debian 12's 1.13.1: no);
 *   the description names the UCX version, the types and UCX_TLS.
 * - a handshake reply claiming cuda memory (a lying side channel serving a
 *   real prefill's metadata with regions[0].memory_type = cuda) is refused
 *   by a decode whose UCX cannot reach it, by name with both values, before
 *   any endpoint; the honest reply of the same prefill is accepted and a
 *   pull through it lands. With a CUDA-built UCX the cuda reply is accepted.
 * - a pool that claims to be device memory (kvf_device_ptr_is_cuda()
 *   wrapped at link time to say yes) is refused at registration by a UCX
 *   without CUDA, naming the memory type; a pool declared cuda whose memory
 *   CUDA does not know is refused as an invalid parameter; a peer whose
 *   region is cuda is refused at connect.
 */
#include "kvf_connector_ucx_int.h"
#include "xfer_test_pool.h"
#include "kvf_side_channel.h"
#include "kvf_ucx_agent.h"

#include "kvf_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include <cmocka.h>

#define P_BLOCKS 4
#define D_BLOCKS 4
#define TOKENS   40


/* ---- link-time wrap: which pointers "are" device memory ------------------ */

bool __real_kvf_device_ptr_is_cuda(const void *ptr);
bool __wrap_kvf_device_ptr_is_cuda(const void *ptr);

static const void *fake_cuda_lo, *fake_cuda_hi;   /* [lo, hi) claims to be device memory */
static atomic_int ptr_queries;

bool __wrap_kvf_device_ptr_is_cuda(const void *ptr)
{
    atomic_fetch_add(&ptr_queries, 1);
    if ((fake_cuda_lo != NULL) && ((const char *)ptr >= (const char *)fake_cuda_lo) &&
        ((const char *)ptr < (const char *)fake_cuda_hi)) {
        return true;
    }
    return __real_kvf_device_ptr_is_cuda(ptr);
}

/* Whether this UCX lists CUDA among its memory types (ucp_context_query). */
static bool ucx_has_cuda(kvf_ucx_agent_h agent)
{
    char what[256];
    return kvf_ucx_agent_mem_reach(agent, KVF_XFER_MEM_CUDA, what, sizeof(what)) == KVF_OK;
}

static kvf_ucx_agent_h agent_make(void)
{
    kvf_ucx_agent_h agent;
    kvf_ucx_agent_params_t ap;

    memset(&ap, 0, sizeof(ap));
    ap.field_mask = KVF_UCX_AGENT_PARAM_FIELD_NAME;
    ap.name = "mem-type test";
    assert_int_equal(kvf_ucx_agent_create(&ap, &agent), KVF_OK);
    return agent;
}

static void test_agent_reach(void **state)
{
    kvf_ucx_agent_h agent = agent_make();
    char what[256], expect[64];
    ucp_context_attr_t attr;
    ucp_params_t up;
    ucp_config_t *uc;
    ucp_context_h ctx;
    bool cuda_listed;

    (void)state;
    /* the ground truth, asked of UCX directly */
    assert_int_equal(ucp_config_read(NULL, NULL, &uc), UCS_OK);
    memset(&up, 0, sizeof(up));
    up.field_mask = UCP_PARAM_FIELD_FEATURES;
    up.features = UCP_FEATURE_RMA;
    assert_int_equal(ucp_init(&up, uc, &ctx), UCS_OK);
    ucp_config_release(uc);
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    assert_int_equal(ucp_context_query(ctx, &attr), UCS_OK);
    cuda_listed = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    ucp_cleanup(ctx);

    assert_int_equal(kvf_ucx_agent_mem_reach(agent, KVF_XFER_MEM_HOST, what, sizeof(what)),
                     KVF_OK);
    snprintf(expect, sizeof(expect), "UCX %s reaching host", ucp_get_version_string());
    assert_non_null(strstr(what, expect));
    assert_non_null(strstr(what, "UCX_TLS="));
    assert_int_equal(ucx_has_cuda(agent), cuda_listed);
    assert_int_equal(kvf_ucx_agent_mem_reach(agent, (kvf_xfer_mem_type_t)KVF_XFER_MEM_TYPES,
                                             what, sizeof(what)), KVF_ERR_INVALID_PARAM);
    print_message("this UCX: %s (cuda %s)\n", what, cuda_listed ? "listed" : "not listed");
    kvf_ucx_agent_destroy(agent);
}

/* ---- instances ------------------------------------------------------------ */

/*
 * A prefill whose regions[0] claims @a type: the real connector's metadata
 * (get_metadata), altered, served on a side channel of the test's own.
 */
static kvf_side_channel_server_h serve_claiming(kvf_connector_h pre, kvf_xfer_mem_type_t type,
                                                int *port_p)
{
    kvf_side_channel_server_h server;
    kvf_side_channel_params_t sp;
    kvf_handshake_reply_t reply;
    static uint8_t buf[64 * 1024];
    size_t len;

    assert_int_equal(ops->get_metadata(pre, 0, buf, sizeof(buf), &len), KVF_OK);
    assert_int_equal(kvf_handshake_reply_unpack(buf, len, &reply), KVF_OK);
    assert_int_equal(reply.ranks[0].regions[0].mem_type, KVF_XFER_MEM_HOST);   /* a heap pool */
    reply.ranks[0].regions[0].mem_type = type;
    memset(&sp, 0, sizeof(sp));
    sp.engine_id = "prefill-m";
    sp.ranks = reply.ranks;
    sp.num_ranks = 1;
    assert_int_equal(kvf_side_channel_server_start(&sp, &server), KVF_OK);
    *port_p = kvf_side_channel_server_port(server);
    kvf_handshake_reply_cleanup(&reply);
    return server;
}

static void test_handshake_refuses_unreachable_type(void **state)
{
    kvf_connector_h pre = conn_make("prefill-m", KVF_CONNECTOR_ROLE_PREFILL);
    kvf_connector_h dec = conn_make("decode-m", KVF_CONNECTOR_ROLE_DECODE);
    size_t plen = xt_pool_bytes(P_BLOCKS, NULL), dlen = xt_pool_bytes(D_BLOCKS, NULL);
    uint8_t *ppool = malloc(plen), *dpool = malloc(dlen);
    kvf_side_channel_server_h liar;
    int port = 0, liar_port = 0, queries0;
    char why[1024], expect[512], what[256];
    kvf_ucx_agent_h probe = agent_make();
    bool cuda = ucx_has_cuda(probe);
    kvf_status_t st;

    (void)state;
    kvf_ucx_agent_describe(probe, what, sizeof(what));
    kvf_ucx_agent_destroy(probe);
    assert_non_null(ppool);
    assert_non_null(dpool);
    memset(ppool, 0x3c, plen);
    {
        kvf_connector_pool_t pp = {0, ppool, plen, P_BLOCKS, params, kvf_device_cpu()};
        kvf_connector_pool_t dp = {0, dpool, dlen, D_BLOCKS, params, kvf_device_cpu()};
        queries0 = atomic_load(&ptr_queries);
        assert_int_equal(ops->register_pool(pre, &pp), KVF_OK);
        assert_int_equal(ops->register_pool(dec, &dp), KVF_OK);
        /* the CPU path asks CUDA nothing (no runtime, no context started) */
        assert_int_equal(atomic_load(&ptr_queries), queries0);
    }
    assert_int_equal(ops->serve(pre, &port), KVF_OK);
    liar = serve_claiming(pre, KVF_XFER_MEM_CUDA, &liar_port);

    st = ops->handshake(dec, "prefill-m", "127.0.0.1", liar_port, why, sizeof(why));
    print_message("cuda claim: %s: %s\n", kvf_status_str(st), why);
    if (!cuda) {
        assert_int_equal(st, KVF_ERR_REFUSED);
        snprintf(expect, sizeof(expect), "handshake refused: regions[0].memory_type "
                 "prefill=cuda (rank 0) decode=host pool (%s): decode's UCX cannot reach "
                 "cuda memory", what);
        assert_non_null(strstr(why, expect));
    } else {
        assert_int_equal(st, KVF_OK);    /* a CUDA UCX reaches it */
        assert_int_equal(ops->forget_engine(dec, "prefill-m"), KVF_OK);
    }
    kvf_side_channel_server_stop(liar);

    /* the same prefill, honest: accepted, and a pull lands its bytes */
    assert_int_equal(ops->handshake(dec, "prefill-m", "127.0.0.1", port, why, sizeof(why)),
                     KVF_OK);
    {
        static const int32_t rids[3] = {0, 1, 2};
        static const int32_t lids[3] = {3, 2, 1};
        kvf_connector_pull_t pull;
        kvf_connector_req_h req;
        uint64_t deadline = kvf_time_now_ns() + 20000000000ull;

        memset(dpool, 0xee, dlen);
        memset(&pull, 0, sizeof(pull));
        pull.engine_id = "prefill-m";
        pull.request_id = "r";
        pull.num_tokens = TOKENS;
        pull.num_groups = 1;
        pull.remote_ids[0] = rids;
        pull.num_remote_ids[0] = 3;
        pull.local_ids[0] = lids;
        pull.num_local_ids[0] = 3;
        assert_int_equal(ops->start_pull(dec, 0, &pull, &req), KVF_OK);
        while (((st = ops->poll(dec, 0, req)) == KVF_INPROGRESS) &&
               (kvf_time_now_ns() < deadline)) {
        }
        assert_int_equal(st, KVF_OK);
        assert_int_equal(dpool[3 * (dlen / D_BLOCKS)], 0x3c);
        assert_int_equal(dpool[0], 0xee);            /* block 0 was not pulled into */
        assert_int_equal(ops->finish_pull(dec, 0, req), KVF_OK);
    }
    ops->destroy(dec);
    ops->destroy(pre);
    free(ppool);
    free(dpool);
}

static void test_register_and_connect_refuse_cuda(void **state)
{
    size_t len = xt_pool_bytes(P_BLOCKS, NULL);
    uint8_t *mem = malloc(len);
    kvf_ucx_agent_h agent = agent_make(), other = agent_make();
    kvf_connector_h conn = conn_make("decode-c", KVF_CONNECTOR_ROLE_DECODE);
    kvf_rank_meta_t meta;
    kvf_ucx_peer_h peer = NULL;
    int region = -1;

    (void)state;
    assert_non_null(mem);
    if (ucx_has_cuda(agent)) {
        print_message("skipped: this UCX reaches cuda memory (the refusals need one that "
                      "does not)\n");
        goto out;
    }
    /* detected as device memory: refused, nothing mapped */
    fake_cuda_lo = mem;
    fake_cuda_hi = mem + len;
    assert_int_equal(kvf_ucx_agent_mem_register(agent, mem, len, &region), KVF_ERR_UNSUPPORTED);
    assert_int_equal(region, -1);
    /* declared by the connector's pool device: the same refusal */
    {
        kvf_connector_pool_t cp = {0, mem, len, P_BLOCKS, params, kvf_device_cpu()};
        cp.device.kind = KVF_DEVICE_CUDA;
        assert_int_equal(ops->register_pool(conn, &cp), KVF_ERR_UNSUPPORTED);
        /* not device memory at all, declared cuda: an invalid pool */
        fake_cuda_lo = fake_cuda_hi = NULL;
        assert_int_equal(kvf_ucx_agent_mem_register_type(agent, mem, len, KVF_XFER_MEM_CUDA,
                                                         &region), KVF_ERR_INVALID_PARAM);
        assert_int_equal(ops->register_pool(conn, &cp), KVF_ERR_INVALID_PARAM);
        cp.device.kind = (kvf_device_kind_t)5;
        assert_int_equal(ops->register_pool(conn, &cp), KVF_ERR_INVALID_PARAM);
    }
    /* a peer whose region is cuda: refused at connect, before any key is unpacked */
    assert_int_equal(kvf_ucx_agent_mem_register(other, mem, len, &region), KVF_OK);
    memset(&meta, 0, sizeof(meta));
    snprintf(meta.engine_id, sizeof(meta.engine_id), "other");
    meta.num_regions = 1;
    assert_int_equal(kvf_ucx_agent_region_meta(other, region, &meta.regions[0]), KVF_OK);
    assert_int_equal(meta.regions[0].mem_type, KVF_XFER_MEM_HOST);
    assert_int_equal(kvf_ucx_agent_worker_address(other, meta.worker_addr,
                                                  sizeof(meta.worker_addr),
                                                  &meta.worker_addr_len), KVF_OK);
    meta.regions[0].mem_type = KVF_XFER_MEM_CUDA;
    assert_int_equal(kvf_ucx_peer_connect(agent, &meta, &peer), KVF_ERR_UNSUPPORTED);
    assert_null(peer);
    meta.regions[0].mem_type = KVF_XFER_MEM_HOST;
    assert_int_equal(kvf_ucx_peer_connect(agent, &meta, &peer), KVF_OK);
    kvf_ucx_peer_abort(peer);   /* forced: the other worker is never progressed */
out:
    fake_cuda_lo = fake_cuda_hi = NULL;
    ops->destroy(conn);
    kvf_ucx_agent_destroy(agent);
    kvf_ucx_agent_destroy(other);
    free(mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agent_reach),
        cmocka_unit_test(test_handshake_refuses_unreachable_type),
        cmocka_unit_test(test_register_and_connect_refuse_cuda),
    };
    kvf_log_init("test");
    if (xt_setup() != 0) {
        return 1;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
