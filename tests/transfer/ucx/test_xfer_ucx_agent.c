/*
 * UCX agent in one process: agent A (initiator, this thread) and agent B
 * (target, progressed by its own thread, as a prefill rank thread would).
 * Batched GET and PUT over scattered descriptor lists land byte-exact;
 * descriptors leaving either region are refused before anything is posted;
 * notifications arrive in order; status mapping puts peer failures in the
 * KVF_ERR_PEER_* range.
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
#include <unistd.h>
#include <ucp/api/ucp.h>
#include <cmocka.h>

#define REGION (1u << 20)

typedef struct {
    kvf_ucx_agent_h agent;
    atomic_bool     stop;
    atomic_int      notes;         /* notifications received */
    char            last[256];
} target_t;

static void *target_thread(void *arg)
{
    target_t *t = arg;
    while (!atomic_load(&t->stop)) {
        uint8_t buf[256];
        size_t len;
        if (kvf_ucx_notify_recv(t->agent, buf, sizeof(buf) - 1, &len, 20) == KVF_OK) {
            buf[len] = '\0';
            snprintf(t->last, sizeof(t->last), "%s", (char *)buf);
            atomic_fetch_add(&t->notes, 1);
        }
    }
    return NULL;
}

static kvf_ucx_agent_h make_agent_access(const char *name, kvf_ucx_access_t access)
{
    kvf_ucx_agent_params_t p;
    kvf_ucx_agent_h a;

    memset(&p, 0, sizeof(p));
    p.field_mask = KVF_UCX_AGENT_PARAM_FIELD_NAME | KVF_UCX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                   KVF_UCX_AGENT_PARAM_FIELD_ACCESS;
    p.name = name;
    p.timeout_ms = 2000;
    p.access = access;
    assert_int_equal(kvf_ucx_agent_create(&p, &a), KVF_OK);
    return a;
}

/* the default: regions peers may read (a prefill pool) */
static kvf_ucx_agent_h make_agent(const char *name)
{
    return make_agent_access(name, KVF_UCX_ACCESS_REMOTE_READ);
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

static void test_get_put_notify(void **state)
{
    kvf_ucx_agent_h a = make_agent("initiator");
    target_t t;
    uint8_t *la = malloc(REGION), *lb = malloc(REGION);
    kvf_rank_meta_t *mb = calloc(1, sizeof(*mb));
    kvf_ucx_peer_h peer;
    kvf_ucx_batch_h batch;
    int ra, rb;
    pthread_t th;
    /* scattered, odd sizes and offsets, out of order */
    const kvf_xfer_desc_t descs[] = {
        {4096, 900000, 1},      {0, 3, 4093},          {700001, 12345, 65536},
        {200000, 1, 100000},    {REGION - 7, 77, 7},   {500000, REGION - 4096, 4096},
    };
    const size_t n = sizeof(descs) / sizeof(descs[0]);

    (void)state;
    memset(&t, 0, sizeof(t));
    atomic_init(&t.notes, 0);
    t.agent = make_agent_access("target", KVF_UCX_ACCESS_REMOTE_RW);   /* it is PUT into */
    assert_non_null(la);
    assert_non_null(lb);
    for (size_t i = 0; i < REGION; ++i) {
        la[i] = 0xee;
        lb[i] = (uint8_t)((i * 131u) ^ (i >> 9));
    }
    assert_int_equal(kvf_ucx_agent_mem_register(a, la, REGION, &ra), KVF_OK);
    assert_int_equal(kvf_ucx_agent_mem_register(t.agent, lb, REGION, &rb), KVF_OK);
    meta_of(t.agent, rb, mb);
    atomic_init(&t.stop, false);
    /* the target's worker is driven by its own thread from here on */
    assert_int_equal(pthread_create(&th, NULL, target_thread, &t), 0);
    assert_int_equal(kvf_ucx_peer_connect(a, mb, &peer), KVF_OK);
    assert_non_null(strstr(kvf_ucx_agent_transports(a), "ep lanes: "));

    /* GET: every descriptor's bytes land at local_off, nothing else changes */
    assert_int_equal(kvf_ucx_xfer_post(a, peer, KVF_UCX_OP_GET, ra, 0, descs, n, &batch), KVF_OK);
    assert_int_equal(kvf_ucx_batch_wait(batch, 5000), KVF_OK);
    kvf_ucx_batch_release(batch);
    assert_int_equal(kvf_ucx_agent_ops_posted(a), n);
    {
        uint8_t *expect = malloc(REGION);
        assert_non_null(expect);
        memset(expect, 0xee, REGION);
        for (size_t i = 0; i < n; ++i) {
            memcpy(expect + descs[i].local_off, lb + descs[i].remote_off, descs[i].len);
        }
        assert_memory_equal(la, expect, REGION);
        free(expect);
    }

    /* out of range on either side: refused, nothing posted */
    {
        const kvf_xfer_desc_t bad_remote[] = {{0, 0, 16}, {0, REGION - 8, 9}};
        const kvf_xfer_desc_t bad_local[] = {{REGION, 0, 1}};
        const kvf_xfer_desc_t wrap[] = {{8, 8, UINT64_MAX - 4}};
        assert_int_equal(kvf_ucx_xfer_post(a, peer, KVF_UCX_OP_GET, ra, 0, bad_remote, 2, &batch),
                         KVF_ERR_OUT_OF_RANGE);
        assert_int_equal(kvf_ucx_xfer_post(a, peer, KVF_UCX_OP_GET, ra, 0, bad_local, 1, &batch),
                         KVF_ERR_OUT_OF_RANGE);
        assert_int_equal(kvf_ucx_xfer_post(a, peer, KVF_UCX_OP_PUT, ra, 0, wrap, 1, &batch),
                         KVF_ERR_OUT_OF_RANGE);
        assert_int_equal(kvf_ucx_agent_ops_posted(a), n);
    }

    /* PUT 64 KiB back to the target at offset 128 */
    {
        const kvf_xfer_desc_t put = {700001, 128, 65536};
        assert_int_equal(kvf_ucx_xfer_post(a, peer, KVF_UCX_OP_PUT, ra, 0, &put, 1, &batch),
                         KVF_OK);
        assert_int_equal(kvf_ucx_batch_wait(batch, 5000), KVF_OK);
        kvf_ucx_batch_release(batch);
        /* la[700001..] holds lb[12345..] from the GET above */
        for (size_t i = 0; i < 65536; ++i) {
            uint8_t want = (uint8_t)(((12345 + i) * 131u) ^ ((12345 + i) >> 9));
            if (lb[128 + i] != want) {
                fail_msg("put byte %zu: 0x%02x != 0x%02x", i, lb[128 + i], want);
            }
        }
    }

    /* notifications, in order */
    assert_int_equal(kvf_ucx_notify_send(a, peer, "first", 6), KVF_OK);
    assert_int_equal(kvf_ucx_notify_send(a, peer, "second", 7), KVF_OK);
    {
        uint64_t deadline = kvf_time_now_ns() + 5000000000ull;
        while ((atomic_load(&t.notes) < 2) && (kvf_time_now_ns() < deadline)) {
            kvf_ucx_agent_progress(a);
        }
    }
    atomic_store(&t.stop, true);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&t.notes), 2);
    assert_string_equal(t.last, "second");
    assert_int_equal(kvf_ucx_peer_status(peer), KVF_OK);

    kvf_ucx_peer_destroy(peer);
    kvf_ucx_agent_destroy(a);
    kvf_ucx_agent_destroy(t.agent);
    free(mb);
    free(la);
    free(lb);
}

/*
 * A region UCX allocated (shared memory, a --pool-alloc ucx pool) read by a peer on this
 * node while the target's worker is never progressed (a prefill that is busy, stopped or
 * killed): over shared memory the GETs complete anyway (the region is mapped into the
 * reader: ucp_rkey_ptr, a copy each), with every byte; UCX 1.22 alone would emulate them
 * through the target's worker and time out. Over TCP (test_xfer_ucx_agent_tcp) they
 * need the target's worker: its thread serves them and they complete too.
 */
static void test_shm_read_one_sided(void **state)
{
    const char *tls = getenv("UCX_TLS");
    bool shm = (tls == NULL) || (strstr(tls, "tcp") == NULL);
    kvf_ucx_agent_h a = make_agent_access("reader", KVF_UCX_ACCESS_LOCAL);
    target_t t;
    kvf_rank_meta_t *mb = calloc(1, sizeof(*mb));
    uint8_t *la = malloc(REGION), *lb = NULL;
    const kvf_xfer_desc_t descs[] = {{0, 4096, 65536}, {100000, 3, 5}, {REGION - 64, 0, 64}};
    kvf_ucx_peer_h peer;
    kvf_ucx_batch_h batch;
    pthread_t th;
    int ra, rb;

    (void)state;
    memset(&t, 0, sizeof(t));
    atomic_init(&t.notes, 0);
    atomic_init(&t.stop, false);
    t.agent = make_agent("target");
    assert_non_null(la);
    assert_non_null(mb);
    memset(la, 0xee, REGION);
    assert_int_equal(kvf_ucx_agent_mem_register(a, la, REGION, &ra), KVF_OK);
    assert_int_equal(kvf_ucx_agent_mem_alloc(t.agent, REGION, (void **)&lb, &rb), KVF_OK);
    for (size_t i = 0; i < REGION; ++i) {
        lb[i] = (uint8_t)(1 + ((i * 7) % 251));
    }
    meta_of(t.agent, rb, mb);
    if (!shm) {
        assert_int_equal(pthread_create(&th, NULL, target_thread, &t), 0);
    }
    assert_int_equal(kvf_ucx_peer_connect(a, mb, &peer), KVF_OK);
    assert_int_equal(kvf_ucx_xfer_post(a, peer, KVF_UCX_OP_GET, ra, 0, descs, 3, &batch),
                     KVF_OK);
    print_message("GET from a UCX-allocated region (%s): %s\n", shm ? "shared memory, target "
                  "never progressed" : "TCP, target progressed",
                  kvf_status_str(kvf_ucx_batch_wait(batch, 1000)));
    assert_int_equal(kvf_ucx_batch_test(batch), KVF_OK);
    kvf_ucx_batch_release(batch);
    for (size_t d = 0; d < 3; ++d) {
        assert_memory_equal(la + descs[d].local_off, lb + descs[d].remote_off, descs[d].len);
    }
    assert_int_equal(la[65536], 0xee);                       /* nothing else written */
    assert_int_equal(kvf_ucx_agent_ops_posted(a), 3);
    if (!shm) {
        atomic_store(&t.stop, true);
        pthread_join(th, NULL);
    }
    kvf_ucx_peer_destroy(peer);
    kvf_ucx_agent_destroy(a);
    kvf_ucx_agent_destroy(t.agent);
    free(mb);
    free(la);
}

/*
 * The UCX this program loads is the one it was built against (pkg-config's
 * version, KVF_UCX_BUILT_VERSION): a CUDA build against the libucx-cu13 wheel
 * (1.22) must not run on Debian's 1.13 through a stray library path, nor the
 * other way round (tests/run.sh builds the transfer tests against both).
 */
static void test_ucx_version(void **state)
{
    unsigned major, minor, release;
    char v[32];

    (void)state;
    ucp_get_version(&major, &minor, &release);
    snprintf(v, sizeof(v), "%u.%u.%u", major, minor, release);
    assert_string_equal(v, KVF_UCX_BUILT_VERSION);
    assert_string_equal(ucp_get_version_string(), KVF_UCX_BUILT_VERSION);
    assert_int_equal(major, UCP_API_MAJOR);
    assert_int_equal(minor, UCP_API_MINOR);
}

static void test_status_map(void **state)
{
    (void)state;
    assert_int_equal(kvf_ucx_status(UCS_OK), KVF_OK);
    assert_int_equal(kvf_ucx_status(UCS_INPROGRESS), KVF_INPROGRESS);
    assert_int_equal(kvf_ucx_status(UCS_ERR_CONNECTION_RESET), KVF_ERR_PEER_RESET);
    assert_int_equal(kvf_ucx_status(UCS_ERR_ENDPOINT_TIMEOUT), KVF_ERR_PEER_TIMEOUT);
    assert_int_equal(kvf_ucx_status(UCS_ERR_UNREACHABLE), KVF_ERR_PEER_UNREACHABLE);
    assert_true(KVF_IS_PEER_ERROR(kvf_ucx_status(UCS_ERR_IO_ERROR)));
    assert_int_equal(kvf_ucx_status(UCS_ERR_NO_MEMORY), KVF_ERR_NO_MEMORY);
    assert_int_equal(kvf_ucx_status(UCS_ERR_BUSY), KVF_ERR_UCX);
}

static void test_bad_params(void **state)
{
    kvf_ucx_agent_params_t p;
    kvf_ucx_agent_h a;
    kvf_rank_meta_t *m = calloc(1, sizeof(*m));
    kvf_ucx_peer_h peer;

    (void)state;
    memset(&p, 0, sizeof(p));
    p.field_mask = KVF_BIT(40);
    assert_int_equal(kvf_ucx_agent_create(&p, &a), KVF_ERR_INVALID_PARAM);
    a = make_agent("bad");
    /* metadata the agent can reject without asking UCX (UCX itself does not
     * validate packed rkeys: who may send one is the guard, the side channel's
     * CURVE authentication; kvf_ucx_rkey_check() bounds the length; test_rkey_check) */
    m->num_regions = KVF_XFER_MAX_REGIONS + 1;
    m->worker_addr_len = 8;
    assert_int_equal(kvf_ucx_peer_connect(a, m, &peer), KVF_ERR_INVALID_PARAM);
    m->num_regions = 1;
    m->worker_addr_len = 0;
    assert_int_equal(kvf_ucx_peer_connect(a, m, &peer), KVF_ERR_INVALID_PARAM);
    /* registering nothing */
    {
        int region;
        assert_int_equal(kvf_ucx_agent_mem_register(a, NULL, 16, &region), KVF_ERR_INVALID_PARAM);
        assert_int_equal(kvf_ucx_agent_mem_register(a, m, 0, &region), KVF_ERR_INVALID_PARAM);
    }
    kvf_ucx_agent_destroy(a);
    free(m);
}

/*
 * ucp_ep_rkey_unpack wrapped at link time: passes through, except while
 * unpack_refuse is set, when it says no as UCX's own checks would.
 */
ucs_status_t __real_ucp_ep_rkey_unpack(ucp_ep_h ep, const void *rkey_buffer,
                                       ucp_rkey_h *rkey_p);
ucs_status_t __wrap_ucp_ep_rkey_unpack(ucp_ep_h ep, const void *rkey_buffer,
                                       ucp_rkey_h *rkey_p);
static bool unpack_refuse;
static int unpack_calls;

ucs_status_t __wrap_ucp_ep_rkey_unpack(ucp_ep_h ep, const void *rkey_buffer,
                                       ucp_rkey_h *rkey_p)
{
    unpack_calls++;
    if (unpack_refuse) {
        return UCS_ERR_INVALID_PARAM;
    }
    return __real_ucp_ep_rkey_unpack(ep, rkey_buffer, rkey_p);
}

/* Run kvf_ucx_peer_connect() with stderr captured into @a log (the agent's log lines). */
static kvf_status_t connect_logged(kvf_ucx_agent_h a, const kvf_rank_meta_t *m,
                                   kvf_ucx_peer_h *peer_p, char *log, size_t cap)
{
    FILE *tmp = tmpfile();
    int saved = dup(2);
    kvf_status_t status;
    size_t n;

    assert_non_null(tmp);
    assert_true(saved >= 0);
    fflush(stderr);
    assert_true(dup2(fileno(tmp), 2) >= 0);
    status = kvf_ucx_peer_connect(a, m, peer_p);
    fflush(stderr);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    rewind(tmp);
    n = fread(log, 1, cap - 1, tmp);
    log[n] = '\0';
    fclose(tmp);
    fputs(log, stderr);   /* still in the test's output */
    return status;
}

/* GET all of a 64 KiB pool through @a peer and check every byte (pattern @a seed). */
static void get_all_checked(kvf_ucx_agent_h a, kvf_ucx_agent_h b, kvf_ucx_peer_h peer,
                            int local_region, uint8_t *local, uint8_t seed)
{
    const kvf_xfer_desc_t desc = {0, 0, 1 << 16};
    kvf_ucx_batch_h batch;
    uint64_t deadline = kvf_time_now_ns() + 5000000000ull;

    memset(local, 0, 1 << 16);
    assert_int_equal(kvf_ucx_xfer_post(a, peer, KVF_UCX_OP_GET, local_region, 0, &desc, 1,
                                       &batch), KVF_OK);
    while (kvf_ucx_batch_test(batch) == KVF_INPROGRESS) {   /* this thread drives both */
        assert_true(kvf_time_now_ns() < deadline);
        kvf_ucx_agent_progress(b);
        kvf_ucx_agent_progress(a);
    }
    assert_int_equal(kvf_ucx_batch_test(batch), KVF_OK);
    kvf_ucx_batch_release(batch);
    for (size_t i = 0; i < (1 << 16); ++i) {
        if (local[i] != (uint8_t)(i * 7u + seed)) {
            fail_msg("byte %zu: 0x%02x, want 0x%02x", i, local[i], (uint8_t)(i * 7u + seed));
        }
    }
}

/*
 * A peer's key is opaque: bounded (1..KVF_RKEY_MAX), then handed to UCX as
 * it came. A key with bytes a newer UCX might append is accepted and reads
 * the pool; empty and oversized keys are refused by name before UCX sees
 * them; what ucp_ep_rkey_unpack refuses is a refusal naming region and rank.
 */
static void test_rkey_check(void **state)
{
    kvf_ucx_agent_h a = make_agent_access("rkey", KVF_UCX_ACCESS_LOCAL);   /* as decode */
    kvf_ucx_agent_h b = make_agent("rkey-peer");
    kvf_rank_meta_t *m = calloc(1, sizeof(*m));
    static uint8_t pool[1 << 16], local[1 << 16];
    kvf_xfer_region_meta_t good;
    kvf_ucx_peer_h peer = NULL;
    char why[128], log[4096];
    int region, lregion, calls;

    (void)state;
    assert_non_null(m);
    for (size_t i = 0; i < sizeof(pool); ++i) {
        pool[i] = (uint8_t)(i * 7u + 3);
    }
    assert_int_equal(kvf_ucx_agent_mem_register(b, pool, sizeof(pool), &region), KVF_OK);
    assert_int_equal(kvf_ucx_agent_mem_register(a, local, sizeof(local), &lregion), KVF_OK);
    meta_of(b, region, m);
    good = m->regions[0];
    assert_true(good.rkey_len >= 1);
    assert_int_equal(kvf_ucx_rkey_check(good.rkey, good.rkey_len, why, sizeof(why)), KVF_OK);
    /* any length in bounds passes: the bytes are UCX's to judge, not ours */
    assert_int_equal(kvf_ucx_rkey_check(good.rkey, 1, why, sizeof(why)), KVF_OK);
    assert_int_equal(kvf_ucx_rkey_check(good.rkey, KVF_RKEY_MAX, why, sizeof(why)), KVF_OK);
    /* empty, oversized, missing: refused, named with the value */
    assert_int_equal(kvf_ucx_rkey_check(good.rkey, 0, why, sizeof(why)), KVF_ERR_PARSE);
    assert_non_null(strstr(why, "rkey_len 0 is outside 1..2048"));
    assert_int_equal(kvf_ucx_rkey_check(good.rkey, KVF_RKEY_MAX + 1, why, sizeof(why)),
                     KVF_ERR_PARSE);
    assert_non_null(strstr(why, "rkey_len 2049 is outside 1..2048"));
    assert_int_equal(kvf_ucx_rkey_check(NULL, 8, why, sizeof(why)), KVF_ERR_PARSE);

    /* trailing bytes a newer UCX may append (UCX 1.22 appends to CUDA keys): the
     * check passes them, UCX unpacks the key, the GET reads prefill's bytes */
    m->regions[0].rkey_len = good.rkey_len + 5;
    memset(m->regions[0].rkey + good.rkey_len, 0xa5, 5);
    assert_int_equal(kvf_ucx_rkey_check(m->regions[0].rkey, m->regions[0].rkey_len, why,
                                        sizeof(why)), KVF_OK);
    calls = unpack_calls;
    assert_int_equal(kvf_ucx_peer_connect(a, m, &peer), KVF_OK);
    assert_int_equal(unpack_calls, calls + 1);
    get_all_checked(a, b, peer, lregion, local, 3);
    kvf_ucx_peer_destroy(peer);
    peer = NULL;

    /* an empty key never reaches UCX: refused naming region, rank and length */
    m->regions[0].rkey_len = 0;
    calls = unpack_calls;
    assert_int_equal(connect_logged(a, m, &peer, log, sizeof(log)), KVF_ERR_PARSE);
    assert_null(peer);
    assert_int_equal(unpack_calls, calls);
    assert_non_null(strstr(log, "remote key of region 0 of rank 0 of target refused: "
                                "rkey_len 0 is outside 1..2048"));
    m->regions[0].rkey_len = KVF_RKEY_MAX + 1;
    assert_int_equal(connect_logged(a, m, &peer, log, sizeof(log)), KVF_ERR_PARSE);
    assert_non_null(strstr(log, "rkey_len 2049 is outside 1..2048"));
    assert_int_equal(unpack_calls, calls);

    /* what UCX's own checks refuse is a refusal of that key, named; nothing connected */
    m->regions[0] = good;
    m->tp_rank = 3;
    unpack_refuse = true;
    assert_int_equal(connect_logged(a, m, &peer, log, sizeof(log)), KVF_ERR_REFUSED);
    unpack_refuse = false;
    assert_null(peer);
    assert_non_null(strstr(log, "remote key of region 0 of rank 3 of target"));
    assert_non_null(strstr(log, "refused by ucp_ep_rkey_unpack"));

    /* and the real key still connects and reads */
    assert_int_equal(kvf_ucx_peer_connect(a, m, &peer), KVF_OK);
    get_all_checked(a, b, peer, lregion, local, 3);
    kvf_ucx_peer_destroy(peer);
    kvf_ucx_agent_destroy(a);
    kvf_ucx_agent_destroy(b);
    free(m);
}

/* Create an agent with stderr captured into @a log; @a mem_type -1: the field unset. */
static kvf_status_t create_logged(const char *name, int mem_type, kvf_ucx_agent_h *a_p,
                                  char *log, size_t cap)
{
    kvf_ucx_agent_params_t p;
    FILE *tmp = tmpfile();
    int saved = dup(2);
    kvf_status_t status;
    size_t n;

    memset(&p, 0, sizeof(p));
    p.field_mask = KVF_UCX_AGENT_PARAM_FIELD_NAME;
    p.name = name;
    if (mem_type >= 0) {
        p.field_mask |= KVF_UCX_AGENT_PARAM_FIELD_MEM_TYPE;
        p.mem_type = (kvf_xfer_mem_type_t)mem_type;
    }
    assert_non_null(tmp);
    fflush(stderr);
    assert_true(dup2(fileno(tmp), 2) >= 0);
    status = kvf_ucx_agent_create(&p, a_p);
    fflush(stderr);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    rewind(tmp);
    n = fread(log, 1, cap - 1, tmp);
    log[n] = '\0';
    fclose(tmp);
    fputs(log, stderr);
    return status;
}

/*
 * An agent of device memory asks its own UCX config for cuda_ipc GET
 * zero-copy and names the outcome in the line that describes it; the
 * operator's UCX_CUDA_IPC_ENABLE_GET_ZCOPY stands; host agents set nothing.
 * Which outcome a UCX gives: the variable is known where UCX loaded its CUDA
 * module (1.22 on a GPU machine); 1.22 without it refuses the name; 1.13
 * takes any name into its config.
 */
static void test_device_config(void **state)
{
    kvf_ucx_agent_h a = NULL;
    char log[4096];

    (void)state;
    kvf_log_set_level(KVF_LOG_INFO);
    unsetenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY");
    assert_int_equal(create_logged("host-agent", KVF_XFER_MEM_HOST, &a, log, sizeof(log)),
                     KVF_OK);
    assert_string_equal(kvf_ucx_agent_device_config(a), "");
    assert_non_null(strstr(log, "host-agent: ucx "));
    assert_null(strstr(log, "CUDA_IPC"));
    kvf_ucx_agent_destroy(a);

    assert_int_equal(create_logged("cuda-agent", KVF_XFER_MEM_CUDA, &a, log, sizeof(log)),
                     KVF_OK);
    if (strcmp(ucp_get_version_string(), "1.13.1") == 0) {
        assert_string_equal(kvf_ucx_agent_device_config(a),
                            "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y (cuda_ipc GET zero-copy, set by "
                            "kvferry)");
    } else {
        assert_true((strstr(kvf_ucx_agent_device_config(a), "=y (cuda_ipc GET zero-copy, set "
                                                            "by kvferry)") != NULL) ||
                    (strstr(kvf_ucx_agent_device_config(a), " not set: this UCX does not "
                                                            "know it") != NULL));
    }
    assert_non_null(strstr(log, "cuda-agent: ucx "));
    assert_non_null(strstr(log, ", device memory: UCX_CUDA_IPC_ENABLE_GET_ZCOPY"));
    assert_non_null(strstr(log, kvf_ucx_agent_device_config(a)));
    kvf_ucx_agent_destroy(a);

    setenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "n", 1);
    assert_int_equal(create_logged("cuda-own", KVF_XFER_MEM_CUDA, &a, log, sizeof(log)),
                     KVF_OK);
    unsetenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY");
    assert_string_equal(kvf_ucx_agent_device_config(a),
                        "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n (the operator's)");
    assert_non_null(strstr(log, "device memory: UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n (the "
                                "operator's)"));
    kvf_ucx_agent_destroy(a);

    /* a memory type outside the enum: refused by name, nothing created */
    a = NULL;
    assert_int_equal(create_logged("bad", 9, &a, log, sizeof(log)), KVF_ERR_INVALID_PARAM);
    assert_null(a);
    assert_non_null(strstr(log, "mem_type 9 is not one of host (0), cuda (1)"));
    kvf_log_set_level(KVF_LOG_WARN);
}

/* A LOCAL region (a decode pool) is published without a key; nobody can connect to it. */
static void test_local_regions(void **state)
{
    kvf_ucx_agent_h a = make_agent("reader");
    kvf_ucx_agent_h d = make_agent_access("decode", KVF_UCX_ACCESS_LOCAL);
    kvf_rank_meta_t *m = calloc(1, sizeof(*m));
    static uint8_t pool[1 << 16];
    kvf_ucx_agent_params_t p;
    kvf_ucx_agent_h bad = NULL;
    kvf_ucx_peer_h peer = NULL;
    int region;

    (void)state;
    assert_non_null(m);
    assert_int_equal(kvf_ucx_agent_mem_register(d, pool, sizeof(pool), &region), KVF_OK);
    meta_of(d, region, m);
    assert_int_equal(m->regions[0].rkey_len, 0);
    assert_int_equal(m->regions[0].addr, (uint64_t)(uintptr_t)pool);
    assert_int_equal(m->regions[0].length, sizeof(pool));
    /* an outsider given this metadata gets no endpoint, so no PUT or GET */
    assert_int_equal(kvf_ucx_peer_connect(a, m, &peer), KVF_ERR_PARSE);
    assert_null(peer);
    /* a LOCAL region is still a fine local end of a transfer (decode's GET target) */
    {
        kvf_ucx_agent_h src = make_agent("source");
        static uint8_t spool[4096];
        kvf_rank_meta_t *sm = calloc(1, sizeof(*sm));
        kvf_ucx_batch_h batch;
        const kvf_xfer_desc_t desc = {100, 0, sizeof(spool)};
        int sregion;

        assert_non_null(sm);
        memset(spool, 0x5c, sizeof(spool));
        assert_int_equal(kvf_ucx_agent_mem_register(src, spool, sizeof(spool), &sregion),
                         KVF_OK);
        meta_of(src, sregion, sm);
        assert_int_equal(kvf_ucx_peer_connect(d, sm, &peer), KVF_OK);
        assert_int_equal(kvf_ucx_xfer_post(d, peer, KVF_UCX_OP_GET, region, 0, &desc, 1, &batch),
                         KVF_OK);
        {
            uint64_t deadline = kvf_time_now_ns() + 5000000000ull;
            while (kvf_ucx_batch_test(batch) == KVF_INPROGRESS) {   /* this thread drives both */
                assert_true(kvf_time_now_ns() < deadline);
                kvf_ucx_agent_progress(src);
                kvf_ucx_agent_progress(d);
            }
        }
        assert_int_equal(kvf_ucx_batch_test(batch), KVF_OK);
        kvf_ucx_batch_release(batch);
        assert_int_equal(pool[100], 0x5c);
        assert_int_equal(pool[100 + sizeof(spool) - 1], 0x5c);
        kvf_ucx_peer_destroy(peer);
        kvf_ucx_agent_destroy(src);
        free(sm);
    }
    /* an access outside the enum is refused by name */
    memset(&p, 0, sizeof(p));
    p.field_mask = KVF_UCX_AGENT_PARAM_FIELD_ACCESS;
    p.access = (kvf_ucx_access_t)7;
    assert_int_equal(kvf_ucx_agent_create(&p, &bad), KVF_ERR_INVALID_PARAM);
    assert_null(bad);
    kvf_ucx_agent_destroy(d);
    kvf_ucx_agent_destroy(a);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ucx_version),
        cmocka_unit_test(test_status_map),
        cmocka_unit_test(test_get_put_notify),
        cmocka_unit_test(test_shm_read_one_sided),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_rkey_check),
        cmocka_unit_test(test_local_regions),
        cmocka_unit_test(test_device_config),
    };
    kvf_log_init("test");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
