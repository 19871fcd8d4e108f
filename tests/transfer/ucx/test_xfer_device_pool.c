/*
 * The connector's device-pool path, run on the CPU: a decode pool "in CUDA
 * memory" as far as kvferry can tell (link-time wraps: kvf_device_ptr_is_cuda
 * says yes for it, ucp_context_query lists UCS_MEMORY_TYPE_CUDA, and the
 * device layer's stream create / blocks_zero / zero_ranges / sync run their
 * CPU versions while recording what they were asked), pulling from a host
 * prefill. Checks: the pool is registered as cuda memory (its metadata says
 * so), a zeroing stream is made at registration and destroyed with the
 * connector, every GET names the pool's memory handle, CUDA memory and
 * UCP_OP_ATTR_FLAG_MULTI_SEND, after the GETs every untransferred range
 * (whole pages and partial tails alike) goes to ONE kvf_zero_ranges_batch
 * call on that stream (no per-range or per-page call), the stream is synced
 * before poll reports KVF_OK, and the pool holds the right bytes: pulled
 * pages the prefill's, zeroed tails zero, other pages untouched; the KV digest of
 * the device pool, read through device-to-host copies, equals prefill's. What it
 * cannot check: that UCX moves bytes into real device memory (UCX here has no
 * CUDA: ucp_mem_map and ucp_get_nbx are wrapped to take the CUDA memory type
 * off after recording it, so the bytes move as host copies on UCX 1.13 and
 * 1.22 alike), and the CUDA kernel itself (tests/kernels/test_kern_zero_batch
 * with a GPU).
 */
#include "kvf_connector_ucx.h"
#include "kvf_handshake.h"
#include "kvf_xfer.pb-c.h"

#include "kvf_log.h"
#include "kvf_time.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include <cmocka.h>

#include "xfer_test_pool.h"

#define P_BLOCKS 4
#define D_BLOCKS 6
#define TOKENS   40          /* tiny-dense, block 16: 3 blocks, the last one partial */
#define FAKE_STREAM ((void *)0x5eed)


/* ---- link-time wraps ---------------------------------------------------- */

bool __real_kvf_device_ptr_is_cuda(const void *ptr);
bool __wrap_kvf_device_ptr_is_cuda(const void *ptr);
ucs_status_t __real_ucp_context_query(ucp_context_h context, ucp_context_attr_t *attr);
ucs_status_t __wrap_ucp_context_query(ucp_context_h context, ucp_context_attr_t *attr);
int __wrap_kvf_device_stream_create(const kvf_device_t *dev, kvf_device_t *dev_p);
void __wrap_kvf_device_stream_destroy(kvf_device_t *dev);
int __wrap_kvf_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                           const int64_t *page_ids, size_t n);
int __wrap_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n);
int __real_kvf_zero_ranges_batch(const kvf_device_t *dev, void *base, const size_t *offsets,
                                 const size_t *lens, size_t n);
int __wrap_kvf_zero_ranges_batch(const kvf_device_t *dev, void *base, const size_t *offsets,
                                 const size_t *lens, size_t n);
ucs_status_t __real_ucp_mem_map(ucp_context_h context, const ucp_mem_map_params_t *mp,
                                ucp_mem_h *memh_p);
ucs_status_t __wrap_ucp_mem_map(ucp_context_h context, const ucp_mem_map_params_t *mp,
                                ucp_mem_h *memh_p);
ucs_status_ptr_t __real_ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t *param);
ucs_status_ptr_t __wrap_ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t *param);
int __wrap_kvf_device_sync(const kvf_device_t *dev);
int __real_kvf_device_memcpy(const kvf_device_t *dev, void *dst, const void *src, size_t bytes,
                             kvf_copy_kind_t kind);
int __wrap_kvf_device_memcpy(const kvf_device_t *dev, void *dst, const void *src, size_t bytes,
                             kvf_copy_kind_t kind);
int __wrap_kvf_device_bind(const kvf_device_t *dev);

static const uint8_t *dev_lo, *dev_hi;    /* the "device" pool */
static int streams_made, streams_destroyed, syncs, sync_after_zero;
static size_t batch_calls, ranges_zeroed, ranges_zero_bytes, gets_device, gets_memh;
static size_t old_zero_calls;              /* kvf_blocks_zero / kvf_zero_ranges: never */
static ucp_mem_h dev_memh;                 /* the "device" pool's registration */
static bool zero_since_sync;
static size_t d2h_bytes;
static int binds;

bool __wrap_kvf_device_ptr_is_cuda(const void *ptr)
{
    if ((dev_lo != NULL) && ((const uint8_t *)ptr >= dev_lo) && ((const uint8_t *)ptr < dev_hi)) {
        return true;
    }
    return __real_kvf_device_ptr_is_cuda(ptr);
}

ucs_status_t __wrap_ucp_context_query(ucp_context_h context, ucp_context_attr_t *attr)
{
    ucs_status_t s = __real_ucp_context_query(context, attr);
    if ((s == UCS_OK) && (attr->field_mask & UCP_ATTR_FIELD_MEMORY_TYPES)) {
        attr->memory_types |= UCS_BIT(UCS_MEMORY_TYPE_CUDA);   /* "a CUDA-built UCX" */
    }
    return s;
}

int __wrap_kvf_device_stream_create(const kvf_device_t *dev, kvf_device_t *dev_p)
{
    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    *dev_p = *dev;
    dev_p->stream = FAKE_STREAM;
    streams_made++;
    return KVF_KERN_OK;
}

void __wrap_kvf_device_stream_destroy(kvf_device_t *dev)
{
    if (dev->stream == FAKE_STREAM) {
        streams_destroyed++;
    }
    dev->stream = NULL;
}

int __wrap_kvf_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                           const int64_t *page_ids, size_t n)
{
    (void)dev, (void)base, (void)page_size, (void)page_ids, (void)n;
    old_zero_calls++;
    return KVF_KERN_EINVAL;
}

int __wrap_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n)
{
    (void)dev, (void)base, (void)offsets, (void)lens, (void)n;
    old_zero_calls++;
    return KVF_KERN_EINVAL;
}

int __wrap_kvf_zero_ranges_batch(const kvf_device_t *dev, void *base, const size_t *offsets,
                                 const size_t *lens, size_t n)
{
    kvf_device_t cpu = kvf_device_cpu();

    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    assert_ptr_equal(dev->stream, FAKE_STREAM);   /* on the pool's own stream */
    assert_ptr_equal(base, dev_lo);
    batch_calls++;
    ranges_zeroed += n;
    for (size_t i = 0; i < n; ++i) {
        ranges_zero_bytes += lens[i];
    }
    zero_since_sync = true;
    return __real_kvf_zero_ranges_batch(&cpu, base, offsets, lens, n);   /* the same split */
}

/* The "device" pool's registration: recorded, then mapped as the host memory it is. */
ucs_status_t __wrap_ucp_mem_map(ucp_context_h context, const ucp_mem_map_params_t *mp,
                                ucp_mem_h *memh_p)
{
    ucp_mem_map_params_t p = *mp;
    bool dev = (mp->field_mask & UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE) &&
               (mp->memory_type == UCS_MEMORY_TYPE_CUDA);
    ucs_status_t s;

    if (dev) {
        assert_ptr_equal(mp->address, dev_lo);
        p.field_mask &= ~(uint64_t)UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    }
    s = __real_ucp_mem_map(context, &p, memh_p);
    if (dev && (s == UCS_OK)) {
        dev_memh = *memh_p;
    }
    return s;
}

/* GETs into the "device" pool: what they name is recorded, the CUDA type taken off. */
ucs_status_ptr_t __wrap_ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t *param)
{
    ucp_request_param_t p = *param;

    if ((dev_lo != NULL) && ((uint8_t *)buffer >= dev_lo) && ((uint8_t *)buffer < dev_hi)) {
        if ((param->op_attr_mask & UCP_OP_ATTR_FIELD_MEMORY_TYPE) &&
            (param->memory_type == UCS_MEMORY_TYPE_CUDA)) {
            gets_device++;
            p.op_attr_mask &= ~(uint32_t)UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        }
        if ((param->op_attr_mask & UCP_OP_ATTR_FIELD_MEMH) && (param->memh == dev_memh) &&
            (param->op_attr_mask & UCP_OP_ATTR_FLAG_MULTI_SEND)) {
            gets_memh++;
        }
    }
    return __real_ucp_get_nbx(ep, buffer, count, remote_addr, rkey, &p);
}

int __wrap_kvf_device_sync(const kvf_device_t *dev)
{
    assert_ptr_equal(dev->stream, FAKE_STREAM);
    syncs++;
    sync_after_zero += zero_since_sync;
    zero_since_sync = false;
    return KVF_KERN_OK;
}

/* the zeroing kernel's and the digest's device made current first: "cuda:0" */
int __wrap_kvf_device_bind(const kvf_device_t *dev)
{
    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    assert_int_equal(dev->ordinal, 0);
    binds++;
    return KVF_KERN_OK;
}

int __wrap_kvf_device_memcpy(const kvf_device_t *dev, void *dst, const void *src, size_t bytes,
                             kvf_copy_kind_t kind)
{
    kvf_device_t cpu = kvf_device_cpu();

    if (dev->kind == KVF_DEVICE_CUDA) {
        assert_int_equal(kind, KVF_COPY_D2H);             /* the KV digest's reads */
        assert_true(((const uint8_t *)src >= dev_lo) && ((const uint8_t *)src < dev_hi));
        d2h_bytes += bytes;
    }
    return __real_kvf_device_memcpy(&cpu, dst, src, bytes, kind);
}

/* ---- the test ------------------------------------------------------------- */

/* 48 tokens: three whole blocks, and a fourth local block for the first generated token,
 * never pulled: its pages are zeroed whole, by the same single launch. */
static void pull_48_tokens(kvf_connector_h dec, kvf_connector_pull_t *pull, const uint8_t *ppool,
                           const uint8_t *dpool, size_t page, const int32_t *rids,
                           uint64_t deadline)
{
    kvf_connector_req_h req;
    kvf_connector_stats_t st;
    kvf_status_t s;
    static const int32_t lids2[4] = {0, 2, 5, 3};

    batch_calls = ranges_zeroed = ranges_zero_bytes = 0;
    sync_after_zero = 0;
    pull->num_tokens = 48;
    pull->local_ids[0] = lids2;
    pull->num_local_ids[0] = 4;
    assert_int_equal(ops->start_pull(dec, 0, pull, &req), KVF_OK);
    while (((s = ops->poll(dec, 0, req)) == KVF_INPROGRESS) &&
           (kvf_time_now_ns() < deadline)) {
    }
    print_message("pull of 48: %s; zero_ranges_batch %zu call(s), %zu bytes\n",
                  kvf_status_str(s), batch_calls, ranges_zero_bytes);
    assert_int_equal(s, KVF_OK);
    assert_int_equal(ops->req_stats(dec, 0, req, &st), KVF_OK);
    assert_int_equal(ops->finish_pull(dec, 0, req), KVF_OK);
    assert_int_equal(batch_calls, 1);
    assert_int_equal(ranges_zero_bytes, page);          /* block 3, whole */
    assert_int_equal(old_zero_calls, 0);
    assert_int_equal(st.zero_bytes, page);
    assert_int_equal(sync_after_zero, 1);
    for (int i = 0; i < 3; ++i) {
        assert_memory_equal(dpool + (size_t)lids2[i] * page, ppool + (size_t)rids[i] * page,
                            page);
    }
    for (size_t k = 0; k < page; ++k) {
        assert_int_equal(dpool[3 * page + k], 0);
    }
}

/* The KV digest of a device pool: the landed bytes copied to the host (device-to-host
 * copies, here the CPU's), equal to the digest of the same ranges of prefill's pool. */
static void check_device_digest(kvf_connector_h dec, kvf_connector_req_h req,
                                const uint8_t *ppool, size_t pulled_bytes)
{
    const kvf_kv_digest_t *dg;
    size_t bytes = 0;
    int ndg;
    assert_int_equal(ops->req_digests(dec, 0, req, &dg, &ndg), KVF_OK);
    assert_int_equal(ndg, 1);
    for (size_t k = 0; k < dg[0].num_ranges; ++k) {
        bytes += dg[0].ranges[2 * k + 1];
    }
    assert_int_equal(bytes, pulled_bytes);
    assert_int_equal(d2h_bytes, pulled_bytes);        /* each pulled byte copied once */
    assert_true(dg[0].digest == kvf_kv_digest_ranges(ppool, dg[0].ranges, dg[0].num_ranges));
}

static void test_device_pool_zeroing(void **state)
{
    size_t psz, page = xt_pool_bytes(1, &psz);   /* "page" below: one block, slots pages */
    size_t plen = P_BLOCKS * page, dlen = D_BLOCKS * page;
    uint8_t *ppool = malloc(plen), *dpool = malloc(dlen);
    kvf_connector_h pre = conn_make("prefill-d", KVF_CONNECTOR_ROLE_PREFILL);
    kvf_connector_h dec = conn_make("decode-d", KVF_CONNECTOR_ROLE_DECODE);
    static const int32_t rids[3] = {0, 1, 2};
    static const int32_t lids[3] = {4, 1, 3};
    kvf_connector_pull_t pull;
    kvf_connector_req_h req;
    kvf_connector_stats_t st;
    Kvf__HandshakeReply *md;
    static uint8_t mbuf[64 * 1024];
    uint64_t deadline = kvf_time_now_ns() + 20000000000ull;
    size_t mlen;
    char why[512];
    int port = 0;
    kvf_status_t s;

    (void)state;
    assert_non_null(ppool);
    assert_non_null(dpool);
    for (size_t i = 0; i < plen; ++i) {
        ppool[i] = (uint8_t)(1 + (i % 251));      /* never 0: a zeroed byte shows */
    }
    memset(dpool, 0xee, dlen);
    dev_lo = dpool;
    dev_hi = dpool + dlen;
    {
        kvf_connector_pool_t pp = {0, ppool, plen, P_BLOCKS, params, kvf_device_cpu()};
        kvf_connector_pool_t dp = {0, dpool, dlen, D_BLOCKS, params, kvf_device_cpu()};
        dp.device.kind = KVF_DEVICE_CUDA;
        assert_int_equal(ops->register_pool(pre, &pp), KVF_OK);
        assert_int_equal(ops->register_pool(dec, &dp), KVF_OK);
    }
    assert_int_equal(streams_made, 1);                /* decode's pool only */
    assert_int_equal(ops->get_metadata(dec, 0, mbuf, sizeof(mbuf), &mlen), KVF_OK);
    /* a decode pool publishes no key, so the checked unpack refuses it: read the wire */
    md = kvf__handshake_reply__unpack(NULL, mlen, mbuf);
    assert_non_null(md);
    assert_true(md->ranks[0]->regions[0]->has_memory_type);
    assert_int_equal(md->ranks[0]->regions[0]->memory_type, KVF_XFER_MEM_CUDA);
    kvf__handshake_reply__free_unpacked(md, NULL);
    assert_int_equal(ops->serve(pre, &port), KVF_OK);
    assert_int_equal(ops->handshake(dec, "prefill-d", "127.0.0.1", port, why, sizeof(why)),
                     KVF_OK);

    memset(&pull, 0, sizeof(pull));
    pull.engine_id = "prefill-d";
    pull.request_id = "r";
    pull.num_tokens = TOKENS;
    pull.num_groups = 1;
    pull.remote_ids[0] = rids;
    pull.num_remote_ids[0] = 3;
    pull.local_ids[0] = lids;
    pull.num_local_ids[0] = 3;
    assert_int_equal(ops->start_pull(dec, 0, &pull, &req), KVF_OK);
    while (((s = ops->poll(dec, 0, req)) == KVF_INPROGRESS) && (kvf_time_now_ns() < deadline)) {
    }
    print_message("pull: %s; zero_ranges_batch %zu call(s), %zu range(s), %zu bytes; %d "
                  "sync(s); %zu GETs named cuda, %zu the pool's memh\n", kvf_status_str(s),
                  batch_calls, ranges_zeroed, ranges_zero_bytes, syncs, gets_device, gets_memh);
    assert_int_equal(s, KVF_OK);
    assert_int_equal(ops->req_stats(dec, 0, req, &st), KVF_OK);
    assert_int_equal(batch_calls, 1);                 /* every range, one launch */
    assert_int_equal(old_zero_calls, 0);
    assert_int_equal(ranges_zero_bytes, st.zero_bytes);
    assert_true(ranges_zeroed >= 1);                  /* block 2 is partial: a tail */
    assert_true(st.descriptors >= 1);
    assert_int_equal(gets_device, st.descriptors);    /* every GET: cuda, memh, multi-send */
    assert_int_equal(gets_memh, st.descriptors);
    assert_int_equal(sync_after_zero, 1);             /* synced once, after the zeroing */
    assert_false(zero_since_sync);
    assert_true(binds >= 1);                          /* the pool's device made current */
    check_device_digest(dec, req, ppool, st.bytes);
    assert_int_equal(ops->finish_pull(dec, 0, req), KVF_OK);

    /* bytes: local blocks 4, 1, 3 hold remote 0, 1, 2 up to the tokens; the tail of the
     * last one is zero; blocks 0, 2, 5 were never written */
    for (int i = 0; i < 3; ++i) {
        const uint8_t *d = dpool + (size_t)lids[i] * page, *p = ppool + (size_t)rids[i] * page;
        size_t same = 0, zero = 0;
        for (size_t b = 0; b < page; ++b) {
            same += (d[b] == p[b]);
            zero += (d[b] == 0);
        }
        assert_int_equal(same + zero, page);          /* every byte: pulled or zeroed */
        if (i < 2) {
            assert_int_equal(same, page);             /* whole blocks */
        } else {
            assert_true(zero > 0);
        }
    }
    for (int b = 0; b < D_BLOCKS; b += (b == 0) ? 2 : 3) {   /* 0, 2, 5 */
        for (size_t k = 0; k < page; ++k) {
            assert_int_equal(dpool[(size_t)b * page + k], 0xee);
        }
    }

    pull_48_tokens(dec, &pull, ppool, dpool, page, rids, deadline);
    ops->destroy(dec);
    ops->destroy(pre);
    assert_int_equal(streams_destroyed, 1);
    dev_lo = dev_hi = NULL;
    free(ppool);
    free(dpool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_pool_zeroing),
    };
    kvf_log_init("test");
    if (xt_setup() != 0) {
        return 1;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
