/*
 * The same-node pull path (transfer/ucx/kvf_connector_ipc.c) run on the CPU
 * through the connector, with the device layer wrapped at link time: pools
 * in host memory that kvferry takes for CUDA memory (kvf_device_ptr_is_cuda,
 * ucp_context_query), IPC "handles" that name a range of this process and
 * open to its own pointers, kvf_gather() and the completion events run by
 * their CPU twins on the CPU device while the wraps record what they were
 * asked (device, stream, ops, bytes), and kvf_node_id() answering what each
 * case sets. Checks: prefill shares its pool (a 64-byte handle and the node
 * on the wire); a pull of the same node moves every byte by one gather of
 * the copies and one of the zero ranges on the pool's stream, polls the
 * event, posts no GET, opens the handle once for every pull of that engine
 * and closes it at destroy; the bytes equal what a UCX pull of the same
 * request gives (2p1d: two prefill ranks mapped, read by one decode rank);
 * another node, a GPU not visible, a failed open or a mapping shorter than
 * the region claimed fall back to UCX with the reason (and the right bytes),
 * and path ipc refuses such a pull. Every pool is registered with UCX as cuda
 * memory and the UCX pull's GETs name it so (ucp_mem_map, ucp_get_nbx wrapped:
 * counted, then UCX is told the host memory it is, on UCX 1.13 and 1.22 alike).
 * What it cannot check: cudaIpc* and the CUDA kernel themselves (tests/gpu:
 * kvf bench --device cuda --path ipc).
 */
#include "kvf_connector_ucx_int.h"
#include "kvf_device_ipc.h"
#include "kvf_gather.h"
#include "kvf_gather_tmpl.h"
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

#define FAKE_STREAM ((void *)0x5eed)
#define TOKENS      40     /* tiny-dense, block 16: blocks 0, 1 whole, block 2 partial */
#define P_BLOCKS    4
#define D_BLOCKS    6
#define MAX_RANGES  16

static kvf_model_config_t cfg;
static const kvf_connector_ops_t *ops;

/* ---- link-time wraps ---------------------------------------------------- */

bool __real_kvf_device_ptr_is_cuda(const void *ptr);
bool __wrap_kvf_device_ptr_is_cuda(const void *ptr);
ucs_status_t __real_ucp_context_query(ucp_context_h context, ucp_context_attr_t *attr);
ucs_status_t __wrap_ucp_context_query(ucp_context_h context, ucp_context_attr_t *attr);
int __wrap_kvf_device_stream_create(const kvf_device_t *dev, kvf_device_t *dev_p);
void __wrap_kvf_device_stream_destroy(kvf_device_t *dev);
int __real_kvf_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                           const int64_t *page_ids, size_t n);
int __wrap_kvf_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                           const int64_t *page_ids, size_t n);
int __real_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n);
int __wrap_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n);
int __wrap_kvf_device_sync(const kvf_device_t *dev);
int __wrap_kvf_device_bind(const kvf_device_t *dev);
/* the UCX path's zeroing in one launch (where kernels/ has it); zeroed here on the CPU */
int __wrap_kvf_zero_ranges_batch(const kvf_device_t *dev, void *base, const size_t *offsets,
                                 const size_t *lens, size_t n);
int __wrap_kvf_device_ipc_export(const kvf_device_t *dev, const void *ptr, size_t len,
                                 kvf_ipc_export_t *exp_p);
int __wrap_kvf_device_ipc_open(const kvf_device_t *dev, const uint8_t *handle, void **base_p,
                               size_t *len_p);
void __wrap_kvf_device_ipc_close(const kvf_device_t *dev, void *base);
bool __wrap_kvf_device_uuid_visible(const uint8_t *uuid);
int __real_kvf_gather(const kvf_device_t *dev, const kvf_gather_op_t *o, size_t n);
int __wrap_kvf_gather(const kvf_device_t *dev, const kvf_gather_op_t *o, size_t n);
int __real_kvf_gather_staged(const kvf_device_t *dev, const kvf_gather_op_t *host_ops,
                             kvf_gather_op_t *dev_ops, size_t n);
int __wrap_kvf_gather_staged(const kvf_device_t *dev, const kvf_gather_op_t *host_ops,
                             kvf_gather_op_t *dev_ops, size_t n);
int __wrap_kvf_device_host_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);
void __wrap_kvf_device_host_free(const kvf_device_t *dev, void *ptr);
int __real_kvf_device_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);
int __wrap_kvf_device_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);
void __real_kvf_device_free(const kvf_device_t *dev, void *ptr);
void __wrap_kvf_device_free(const kvf_device_t *dev, void *ptr);
int __wrap_kvf_device_event_record(const kvf_device_t *dev, void **event_p);
int __wrap_kvf_device_event_query(const kvf_device_t *dev, void *event, bool *done_p);
void __wrap_kvf_device_event_destroy(const kvf_device_t *dev, void *event);
kvf_status_t __wrap_kvf_node_id(char *buf, size_t len);
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

static const uint8_t *dev_lo[MAX_RANGES], *dev_hi[MAX_RANGES];   /* "device memory" */
static int num_dev;
static const uint8_t test_uuid[16] = "kvf-test-gpu-00";
static const char magic[12] = "kvf-test-ipc";
static const char *node_now = "node-a";      /* what kvf_node_id() says now */
static bool uuid_visible = true, open_fails;
static size_t open_short_by;                 /* the mapping is this much shorter */
static int opens, closes, streams_made, streams_destroyed, events, events_destroyed;
static int gathers, staged, syncs, host_allocs, host_frees, dev_allocs, dev_frees;
static bool staging_fails;                   /* kvf_device_host_alloc() says no */
static size_t copy_ops, zero_ops;
static uint64_t copy_bytes, zero_bytes;
static int pending;                          /* queries left answering "not done" */
static int not_done_seen;
static int maps_cuda, gets_cuda;             /* UCX told "cuda" (then told host) */

static void dev_add(const uint8_t *p, size_t len)
{
    assert_true(num_dev < MAX_RANGES);
    dev_lo[num_dev] = p;
    dev_hi[num_dev++] = p + len;
}

static int dev_find(const void *ptr)
{
    for (int i = 0; i < num_dev; ++i) {
        if (((const uint8_t *)ptr >= dev_lo[i]) && ((const uint8_t *)ptr < dev_hi[i])) {
            return i;
        }
    }
    return -1;
}

bool __wrap_kvf_device_ptr_is_cuda(const void *ptr)
{
    return (dev_find(ptr) >= 0) || __real_kvf_device_ptr_is_cuda(ptr);
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
    streams_destroyed += (dev->stream == FAKE_STREAM);
    dev->stream = NULL;
}

int __wrap_kvf_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                           const int64_t *page_ids, size_t n)
{
    kvf_device_t cpu = kvf_device_cpu();
    assert_ptr_equal(dev->stream, FAKE_STREAM);
    return __real_kvf_blocks_zero(&cpu, base, page_size, page_ids, n);
}

int __wrap_kvf_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                           const size_t *lens, size_t n)
{
    kvf_device_t cpu = kvf_device_cpu();
    assert_ptr_equal(dev->stream, FAKE_STREAM);
    return __real_kvf_zero_ranges(&cpu, base, offsets, lens, n);
}

int __wrap_kvf_zero_ranges_batch(const kvf_device_t *dev, void *base, const size_t *offsets,
                                 const size_t *lens, size_t n)
{
    kvf_device_t cpu = kvf_device_cpu();
    assert_ptr_equal(dev->stream, FAKE_STREAM);
    return __real_kvf_zero_ranges(&cpu, base, offsets, lens, n);
}

int __wrap_kvf_device_sync(const kvf_device_t *dev)
{
    (void)dev;
    syncs++;
    return KVF_KERN_OK;
}

/* the connector makes a pool's GPU current before its zeroing: nothing to make current here */
int __wrap_kvf_device_bind(const kvf_device_t *dev)
{
    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    return KVF_KERN_OK;
}

/* A handle: the magic, then the allocation's (the "device" range's) first and last byte. */
int __wrap_kvf_device_ipc_export(const kvf_device_t *dev, const void *ptr, size_t len,
                                 kvf_ipc_export_t *exp_p)
{
    int i = dev_find(ptr);
    uint64_t lo, hi;

    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    assert_true(i >= 0);
    assert_true((const uint8_t *)ptr + len <= dev_hi[i]);
    lo = (uint64_t)(uintptr_t)dev_lo[i];
    hi = (uint64_t)(uintptr_t)dev_hi[i];
    memset(exp_p, 0, sizeof(*exp_p));
    memcpy(exp_p->handle, magic, sizeof(magic));
    memcpy(exp_p->handle + 16, &lo, 8);
    memcpy(exp_p->handle + 24, &hi, 8);
    exp_p->offset = (uint64_t)((const uint8_t *)ptr - dev_lo[i]);
    memcpy(exp_p->uuid, test_uuid, sizeof(test_uuid));
    return KVF_KERN_OK;
}

int __wrap_kvf_device_ipc_open(const kvf_device_t *dev, const uint8_t *handle, void **base_p,
                               size_t *len_p)
{
    uint64_t lo, hi;

    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    assert_memory_equal(handle, magic, sizeof(magic));
    if (open_fails) {
        return KVF_KERN_ECUDA;
    }
    memcpy(&lo, handle + 16, 8);
    memcpy(&hi, handle + 24, 8);
    opens++;
    *base_p = (void *)(uintptr_t)lo;
    *len_p = (size_t)(hi - lo) - open_short_by;
    return KVF_KERN_OK;
}

void __wrap_kvf_device_ipc_close(const kvf_device_t *dev, void *base)
{
    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    closes += (base != NULL);
}

bool __wrap_kvf_device_uuid_visible(const uint8_t *uuid)
{
    assert_memory_equal(uuid, test_uuid, sizeof(test_uuid));
    return uuid_visible;
}

/* What one gather was asked: ops within the chunk, copies and zero ranges counted. */
static void gather_seen(const kvf_device_t *dev, const kvf_gather_op_t *o, size_t n)
{
    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    assert_ptr_equal(dev->stream, FAKE_STREAM);      /* the pool's own stream */
    gathers++;
    for (size_t i = 0; i < n; ++i) {
        assert_true((o[i].len > 0) && (o[i].len <= KVF_GATHER_CHUNK));
        if (o[i].src == 0) {
            zero_bytes += o[i].len;
            zero_ops++;
        } else {
            copy_bytes += o[i].len;
            copy_ops++;
        }
    }
}

int __wrap_kvf_gather(const kvf_device_t *dev, const kvf_gather_op_t *o, size_t n)
{
    kvf_device_t cpu = kvf_device_cpu();

    gather_seen(dev, o, n);
    return __real_kvf_gather(&cpu, o, n);
}

/* The staged form: the ops must be in a buffer of kvf_device_host_alloc(), "uploaded" to
 * the device buffer (here: copied, then executed from there, as the kernel would) */
int __wrap_kvf_gather_staged(const kvf_device_t *dev, const kvf_gather_op_t *host_ops,
                             kvf_gather_op_t *dev_ops, size_t n)
{
    kvf_device_t cpu = kvf_device_cpu();

    gather_seen(dev, host_ops, n);
    staged++;
    assert_non_null(dev_ops);
    memcpy(dev_ops, host_ops, n * sizeof(*dev_ops));
    return __real_kvf_gather_staged(&cpu, dev_ops, NULL, n);
}

/*
 * The template path (kernels/kvf_gather_tmpl.h): off (no table: the op list, which the tests
 * above count) unless tmpl_on; then the table holds host arrays and the gather runs the CPU
 * twin from the "uploaded" jobs. Never the real CUDA table: the pools here are host memory.
 */
static bool tmpl_on;
static int tmpl_runs;

int __real_kvf_gather_table_create(const kvf_device_t *dev, const kvf_gather_table_desc_t *desc,
                                   kvf_gather_table_t **table_p);
int __wrap_kvf_gather_table_create(const kvf_device_t *dev, const kvf_gather_table_desc_t *desc,
                                   kvf_gather_table_t **table_p);
int __wrap_kvf_gather_table_create(const kvf_device_t *dev, const kvf_gather_table_desc_t *desc,
                                   kvf_gather_table_t **table_p)
{
    kvf_device_t cpu = kvf_device_cpu();

    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    return tmpl_on ? __real_kvf_gather_table_create(&cpu, desc, table_p) : KVF_KERN_EUNSUPPORTED;
}

int __real_kvf_gather_tmpl_run(const kvf_device_t *dev, const kvf_gather_table_t *table,
                               kvf_gather_job_t *jobs, kvf_gather_job_t *dev_jobs, size_t n);
int __wrap_kvf_gather_tmpl_run(const kvf_device_t *dev, const kvf_gather_table_t *table,
                               kvf_gather_job_t *jobs, kvf_gather_job_t *dev_jobs, size_t n);
int __wrap_kvf_gather_tmpl_run(const kvf_device_t *dev, const kvf_gather_table_t *table,
                               kvf_gather_job_t *jobs, kvf_gather_job_t *dev_jobs, size_t n)
{
    kvf_device_t cpu = kvf_device_cpu();

    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    assert_ptr_equal(dev->stream, FAKE_STREAM);      /* the pool's own stream */
    assert_non_null(dev_jobs);                       /* the slot's device buffer */
    tmpl_runs++;
    memcpy(dev_jobs, jobs, n * sizeof(*jobs));
    return __real_kvf_gather_tmpl_run(&cpu, table, dev_jobs, NULL, n);
}

int __wrap_kvf_device_host_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p)
{
    assert_int_equal(dev->kind, KVF_DEVICE_CUDA);
    if (staging_fails) {
        return KVF_KERN_ENOMEM;
    }
    *ptr_p = malloc(bytes);
    host_allocs++;
    return (*ptr_p != NULL) ? KVF_KERN_OK : KVF_KERN_ENOMEM;
}

void __wrap_kvf_device_host_free(const kvf_device_t *dev, void *ptr)
{
    (void)dev;
    host_frees += (ptr != NULL);
    free(ptr);
}

int __wrap_kvf_device_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p)
{
    kvf_device_t cpu = kvf_device_cpu();
    dev_allocs += (dev != NULL) && (dev->kind == KVF_DEVICE_CUDA);
    return __real_kvf_device_alloc(&cpu, bytes, ptr_p);
}

void __wrap_kvf_device_free(const kvf_device_t *dev, void *ptr)
{
    kvf_device_t cpu = kvf_device_cpu();
    dev_frees += (dev != NULL) && (dev->kind == KVF_DEVICE_CUDA) && (ptr != NULL);
    __real_kvf_device_free(&cpu, ptr);
}

int __wrap_kvf_device_event_record(const kvf_device_t *dev, void **event_p)
{
    assert_ptr_equal(dev->stream, FAKE_STREAM);
    *event_p = (void *)(uintptr_t)(0xe0000 + (++events));
    pending = 2;   /* a GPU still copying: the first polls see it running */
    return KVF_KERN_OK;
}

int __wrap_kvf_device_event_query(const kvf_device_t *dev, void *event, bool *done_p)
{
    assert_ptr_equal(dev->stream, FAKE_STREAM);
    assert_non_null(event);
    *done_p = (pending == 0);
    not_done_seen += (pending > 0);
    pending -= (pending > 0);
    return KVF_KERN_OK;
}

void __wrap_kvf_device_event_destroy(const kvf_device_t *dev, void *event)
{
    (void)dev;
    events_destroyed += (event != NULL);
}

kvf_status_t __wrap_kvf_node_id(char *buf, size_t len)
{
    snprintf(buf, len, "%s", node_now);
    return KVF_OK;
}

/*
 * The "device" pools' registrations and the GETs into them: kvferry names CUDA memory
 * (counted), UCX is told the host memory it really is. UCX 1.22 registers a cuda region as
 * its whole allocation (UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES defaults to cuda) and asks its
 * CUDA memory detection for that allocation's extent; with no CUDA here the answer is
 * "host, extent unknown" and ucp_mem_map fails ("failed to insert region [0x0..0x0]").
 * UCX 1.13 took the claim without looking. Same wraps as test_xfer_device_pool and devsim.
 */
ucs_status_t __wrap_ucp_mem_map(ucp_context_h context, const ucp_mem_map_params_t *mp,
                                ucp_mem_h *memh_p)
{
    ucp_mem_map_params_t p = *mp;

    if ((mp->field_mask & UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE) &&
        (mp->memory_type == UCS_MEMORY_TYPE_CUDA)) {
        int i = dev_find(mp->address);
        assert_true(i >= 0);                             /* only a "device" pool */
        assert_true((const uint8_t *)mp->address + mp->length <= dev_hi[i]);
        p.memory_type = UCS_MEMORY_TYPE_HOST;
        maps_cuda++;
    }
    return __real_ucp_mem_map(context, &p, memh_p);
}

ucs_status_ptr_t __wrap_ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t *param)
{
    ucp_request_param_t p = *param;

    if ((param->op_attr_mask & UCP_OP_ATTR_FIELD_MEMORY_TYPE) &&
        (param->memory_type == UCS_MEMORY_TYPE_CUDA)) {
        assert_true(dev_find(buffer) >= 0);
        p.memory_type = UCS_MEMORY_TYPE_HOST;
        gets_cuda++;
    }
    return __real_ucp_get_nbx(ep, buffer, count, remote_addr, rkey, &p);
}

/* ---- helpers ------------------------------------------------------------- */

static void counters_reset(void)
{
    gathers = staged = tmpl_runs = 0;
    copy_ops = zero_ops = 0;
    copy_bytes = zero_bytes = 0;
    not_done_seen = 0;
    gets_cuda = 0;
}

static kvf_connector_h conn_make(const char *id, kvf_connector_role_t role, int tp,
                                 kvf_connector_path_t path)
{
    kvf_connector_config_t cc;
    kvf_connector_h conn;

    memset(&cc, 0, sizeof(cc));
    cc.field_mask = KVF_CONNECTOR_CONFIG_FIELD_TIMEOUT_MS | KVF_CONNECTOR_CONFIG_FIELD_PATH;
    if (role == KVF_CONNECTOR_ROLE_PREFILL) {
        cc.field_mask |= KVF_CONNECTOR_CONFIG_FIELD_PROGRESS;
    }
    cc.engine_id = id;
    cc.role = role;
    cc.tp_size = tp;
    cc.cfg = &cfg;
    cc.timeout_ms = 5000;
    cc.progress_thread = true;
    cc.path = path;
    assert_int_equal(ops->create(&cc, &conn), KVF_OK);
    return conn;
}

/* Bytes of @a blocks blocks of rank @a rank of @a tp; *page_p: one page. */
static size_t pool_bytes(int tp, int rank, int64_t blocks, size_t *page_p)
{
    kvf_cache_params_t params;
    kvf_rank_geometry_t g;
    kvf_cache_layout_t layout;

    kvf_cache_params_default(&cfg, &params);
    assert_int_equal(kvf_cache_layout_build(&cfg, &layout), KVF_OK);
    assert_int_equal(kvf_rank_geometry_compute(&cfg, &params, tp, rank, &g), KVF_OK);
    if (page_p != NULL) {
        *page_p = g.page_size;
    }
    return (size_t)blocks * (size_t)layout.slots * g.page_size;
}

/* A pool "in CUDA memory" of rank @a rank registered with @a conn. */
static uint8_t *pool_add(kvf_connector_h conn, int tp, int rank, int64_t blocks, bool prefill)
{
    size_t len = pool_bytes(tp, rank, blocks, NULL);
    uint8_t *p = aligned_alloc(256, (len + 255) / 256 * 256);
    kvf_connector_pool_t cp;

    assert_non_null(p);
    for (size_t i = 0; i < len; ++i) {
        /* never 0 (a zeroed byte shows), and different per rank */
        p[i] = prefill ? (uint8_t)(1 + ((i * 7 + (size_t)rank * 13) % 251)) : 0xee;
    }
    dev_add(p, len);
    memset(&cp, 0, sizeof(cp));
    cp.tp_rank = rank;
    cp.base = p;
    cp.len = len;
    cp.num_blocks = blocks;
    kvf_cache_params_default(&cfg, &cp.params);
    cp.device.kind = KVF_DEVICE_CUDA;
    {
        int maps = maps_cuda;
        assert_int_equal(ops->register_pool(conn, &cp), KVF_OK);
        assert_int_equal(maps_cuda, maps + 1);           /* registered as cuda memory */
    }
    return p;
}

static const int32_t rids[3] = {0, 1, 2};
static const int32_t lids[3] = {4, 1, 3};

/* Pull the request into rank 0 of @a dec; returns start_pull's status, *st_p the stats. */
static kvf_status_t pull(kvf_connector_h dec, const char *engine, kvf_connector_stats_t *st_p,
                         kvf_status_t *end_p)
{
    uint64_t deadline = kvf_time_now_ns() + 20000000000ull;
    kvf_connector_pull_t pl;
    kvf_connector_req_h req;
    kvf_status_t s;

    memset(&pl, 0, sizeof(pl));
    pl.engine_id = engine;
    pl.request_id = "r";
    pl.num_tokens = TOKENS;
    pl.num_groups = 1;
    pl.remote_ids[0] = rids;
    pl.num_remote_ids[0] = 3;
    pl.local_ids[0] = lids;
    pl.num_local_ids[0] = 3;
    s = ops->start_pull(dec, 0, &pl, &req);
    if (s != KVF_OK) {
        return s;
    }
    while (((s = ops->poll(dec, 0, req)) == KVF_INPROGRESS) && (kvf_time_now_ns() < deadline)) {
    }
    *end_p = s;
    assert_int_equal(ops->req_stats(dec, 0, req, st_p), KVF_OK);
    assert_int_equal(ops->finish_pull(dec, 0, req), KVF_OK);
    return KVF_OK;
}

/* 1p1d: local blocks 4, 1, 3 hold remote 0, 1, 2, the partial one with a zero tail; 0, 2, 5
 * untouched */
static void check_1p1d(const uint8_t *d, const uint8_t *p)
{
    size_t psz, page = pool_bytes(1, 0, 1, &psz);

    for (int i = 0; i < 3; ++i) {
        const uint8_t *db = d + (size_t)lids[i] * page, *pb = p + (size_t)rids[i] * page;
        size_t same = 0, zero = 0;
        for (size_t b = 0; b < page; ++b) {
            same += (db[b] == pb[b]);
            zero += (db[b] == 0);
        }
        assert_int_equal(same + zero, page);          /* every byte: pulled or zeroed */
        if (i < 2) {
            assert_int_equal(same, page);
        } else {
            assert_true((zero > 0) && (same > 0));
        }
    }
    for (int b = 0; b < D_BLOCKS; b += (b == 0) ? 2 : 3) {   /* 0, 2, 5 */
        for (size_t k = 0; k < page; ++k) {
            assert_int_equal(d[(size_t)b * page + k], 0xee);
        }
    }
}

static int serve_prefill(kvf_connector_h pre)
{
    int port = 0;
    assert_int_equal(ops->serve(pre, &port), KVF_OK);
    return port;
}

/* ---- tests --------------------------------------------------------------- */

/* Two pulls in flight take a second staging slot; with staging refused, pageable ops; a
 * slot freed is taken again. */
static void pulls_in_flight(kvf_connector_h dec, const uint8_t *dpool, const uint8_t *ppool)
{
    kvf_connector_pull_t pl;
    kvf_connector_req_h r1, r2, r3;
    kvf_status_t s1, s2, s3;
    memset(&pl, 0, sizeof(pl));
    pl.engine_id = "prefill-i";
    pl.request_id = "r2";
    pl.num_tokens = TOKENS;
    pl.num_groups = 1;
    pl.remote_ids[0] = rids;
    pl.num_remote_ids[0] = 3;
    pl.local_ids[0] = lids;
    pl.num_local_ids[0] = 3;
    counters_reset();
    assert_int_equal(ops->start_pull(dec, 0, &pl, &r1), KVF_OK);
    assert_int_equal(ops->start_pull(dec, 0, &pl, &r2), KVF_OK);
    assert_int_equal(host_allocs, 2);
    staging_fails = true;
    for (int i = 0; i < 3; ++i) {                /* the third waits for neither */
        assert_int_equal(ops->start_pull(dec, 0, &pl, &r3), KVF_OK);
        assert_int_equal(ops->finish_pull(dec, 0, r3), KVF_OK);
    }
    staging_fails = false;
    assert_int_equal(host_allocs, 2);
    assert_int_equal(staged, 2);                 /* r1, r2 staged; r3 three times not */
    assert_int_equal(gathers, 5);
    while ((s1 = ops->poll(dec, 0, r1)) == KVF_INPROGRESS) {
    }
    while ((s2 = ops->poll(dec, 0, r2)) == KVF_INPROGRESS) {
    }
    assert_int_equal(s1, KVF_OK);
    assert_int_equal(s2, KVF_OK);
    assert_int_equal(ops->finish_pull(dec, 0, r1), KVF_OK);
    assert_int_equal(ops->finish_pull(dec, 0, r2), KVF_OK);
    assert_int_equal(ops->start_pull(dec, 0, &pl, &r3), KVF_OK);   /* a free slot again */
    while ((s3 = ops->poll(dec, 0, r3)) == KVF_INPROGRESS) {
    }
    assert_int_equal(s3, KVF_OK);
    assert_int_equal(ops->finish_pull(dec, 0, r3), KVF_OK);
    assert_int_equal(host_allocs, 2);
    assert_int_equal(staged, 3);
    check_1p1d(dpool, ppool);
}

static void test_ipc_pull_1p1d(void **state)
{
    kvf_connector_h pre, dec;
    uint8_t *ppool, *dpool;
    static uint8_t mbuf[64 * 1024];
    Kvf__HandshakeReply *md;
    kvf_connector_stats_t st;
    kvf_status_t end = KVF_ERR_BUSY;
    size_t mlen;
    char why[512];
    int port;

    (void)state;
    node_now = "node-a";
    pre = conn_make("prefill-i", KVF_CONNECTOR_ROLE_PREFILL, 1, KVF_CONNECTOR_PATH_AUTO);
    dec = conn_make("decode-i", KVF_CONNECTOR_ROLE_DECODE, 1, KVF_CONNECTOR_PATH_AUTO);
    ppool = pool_add(pre, 1, 0, P_BLOCKS, true);
    dpool = pool_add(dec, 1, 0, D_BLOCKS, false);
    /* prefill's published region carries the share: a 64-byte handle, node, GPU */
    assert_int_equal(ops->get_metadata(pre, 0, mbuf, sizeof(mbuf), &mlen), KVF_OK);
    md = kvf__handshake_reply__unpack(NULL, mlen, mbuf);
    assert_non_null(md);
    assert_non_null(md->ranks[0]->regions[0]->ipc);
    assert_int_equal(md->ranks[0]->regions[0]->ipc->handle.len, 64);
    assert_string_equal(md->ranks[0]->regions[0]->ipc->node, "node-a");
    assert_int_equal(md->ranks[0]->regions[0]->ipc->offset, 0);
    kvf__handshake_reply__free_unpacked(md, NULL);
    /* a decode pool is read by nobody: it shares nothing */
    assert_int_equal(ops->get_metadata(dec, 0, mbuf, sizeof(mbuf), &mlen), KVF_OK);
    md = kvf__handshake_reply__unpack(NULL, mlen, mbuf);
    assert_non_null(md);
    assert_null(md->ranks[0]->regions[0]->ipc);
    kvf__handshake_reply__free_unpacked(md, NULL);

    port = serve_prefill(pre);
    assert_int_equal(ops->handshake(dec, "prefill-i", "127.0.0.1", port, why, sizeof(why)),
                     KVF_OK);
    counters_reset();
    assert_int_equal(pull(dec, "prefill-i", &st, &end), KVF_OK);
    print_message("ipc pull: %s, path %s, %d gather(s), %zu copy op(s) %llu bytes, %zu zero "
                  "op(s) %llu bytes, %d poll(s) saw it running\n", kvf_status_str(end),
                  kvf_connector_path_name(st.path), gathers, copy_ops,
                  (unsigned long long)copy_bytes, zero_ops, (unsigned long long)zero_bytes,
                  not_done_seen);
    assert_int_equal(end, KVF_OK);
    assert_int_equal(st.path, KVF_CONNECTOR_PATH_IPC);
    assert_int_equal(gathers, 1);                    /* the copies and the zero ranges */
    assert_int_equal(staged, 1);                     /* from the rank's pinned staging */
    assert_int_equal(host_allocs, 1);
    assert_int_equal(dev_allocs, 1);
    assert_int_equal(copy_bytes, st.bytes);
    assert_int_equal(zero_bytes, st.zero_bytes);
    assert_true(zero_bytes > 0);                     /* block 2 is partial */
    assert_int_equal(st.gather_ops, copy_ops + zero_ops);
    assert_int_equal(not_done_seen, 2);              /* poll waited for the event */
    assert_int_equal(opens, 1);
    assert_int_equal(kvf_ucx_agent_ops_posted(dec->ranks[0].agent), 0);   /* no GET */
    check_1p1d(dpool, ppool);

    /* the next pull reuses the mapping; a poisoned pool is filled again */
    memset(dpool, 0xee, pool_bytes(1, 0, D_BLOCKS, NULL));
    counters_reset();
    assert_int_equal(pull(dec, "prefill-i", &st, &end), KVF_OK);
    assert_int_equal(end, KVF_OK);
    assert_int_equal(st.path, KVF_CONNECTOR_PATH_IPC);
    assert_int_equal(opens, 1);
    assert_int_equal(gathers, 1);
    assert_int_equal(host_allocs, 1);                /* the staging buffers are reused */
    check_1p1d(dpool, ppool);
    assert_int_equal(events_destroyed, events);      /* every event dropped with its request */

    pulls_in_flight(dec, dpool, ppool);

    /* the engine forgotten (a restart, an eviction): its mapping is closed at the next pull,
     * a fresh handshake maps it again */
    assert_int_equal(ops->forget_engine(dec, "prefill-i"), KVF_OK);
    assert_int_equal(ops->handshake(dec, "prefill-i", "127.0.0.1", port, why, sizeof(why)),
                     KVF_OK);
    assert_int_equal(closes, 0);
    assert_int_equal(pull(dec, "prefill-i", &st, &end), KVF_OK);
    assert_int_equal(end, KVF_OK);
    assert_int_equal(st.path, KVF_CONNECTOR_PATH_IPC);
    assert_int_equal(opens, 2);
    assert_int_equal(closes, 1);
    ops->destroy(dec);
    assert_int_equal(closes, 2);                     /* the live mapping, at destroy */
    assert_int_equal(host_frees, host_allocs);       /* staging freed with the connector */
    assert_int_equal(dev_frees, dev_allocs);
    ops->destroy(pre);
    assert_int_equal(streams_destroyed, streams_made);
    free(ppool);
    free(dpool);
    num_dev = 0;
    opens = closes = 0;
}

/*
 * 2p1d: the decode rank reads both prefill ranks (one KV head each). The
 * same request pulled over UCX into a second decode pool gives the
 * reference: both pools must be equal in every byte. @a tmpl: by the pair's
 * block templates (one job per block, no plan on the pull's path), else by
 * the plan's op list.
 */
static void ipc_equals_ucx_2p1d(bool tmpl)
{
    kvf_connector_h pre, dec_ipc, dec_ucx;
    uint8_t *pp[2], *d_ipc, *d_ucx;
    kvf_connector_stats_t st;
    kvf_status_t end = KVF_ERR_BUSY;
    size_t dlen = pool_bytes(1, 0, D_BLOCKS, NULL);
    char why[512];
    int port;

    node_now = "node-a";
    tmpl_on = tmpl;
    pre = conn_make("prefill-2", KVF_CONNECTOR_ROLE_PREFILL, 2, KVF_CONNECTOR_PATH_AUTO);
    dec_ipc = conn_make("decode-a", KVF_CONNECTOR_ROLE_DECODE, 1, KVF_CONNECTOR_PATH_AUTO);
    dec_ucx = conn_make("decode-u", KVF_CONNECTOR_ROLE_DECODE, 1, KVF_CONNECTOR_PATH_UCX);
    pp[0] = pool_add(pre, 2, 0, P_BLOCKS, true);
    pp[1] = pool_add(pre, 2, 1, P_BLOCKS, true);
    d_ipc = pool_add(dec_ipc, 1, 0, D_BLOCKS, false);
    d_ucx = pool_add(dec_ucx, 1, 0, D_BLOCKS, false);
    port = serve_prefill(pre);
    assert_int_equal(ops->handshake(dec_ipc, "prefill-2", "127.0.0.1", port, why, sizeof(why)),
                     KVF_OK);
    assert_int_equal(ops->handshake(dec_ucx, "prefill-2", "127.0.0.1", port, why, sizeof(why)),
                     KVF_OK);
    counters_reset();
    assert_int_equal(pull(dec_ipc, "prefill-2", &st, &end), KVF_OK);
    assert_int_equal(end, KVF_OK);
    assert_int_equal(st.path, KVF_CONNECTOR_PATH_IPC);
    assert_int_equal(st.remote_ranks, 2);
    assert_int_equal(opens, 2);                      /* both prefill ranks mapped */
    assert_int_equal(tmpl_runs, tmpl ? 1 : 0);
    assert_int_equal(gathers, tmpl ? 0 : 1);
    assert_int_equal(copy_bytes, tmpl ? 0 : st.bytes);
    assert_int_equal(gets_cuda, 0);
    assert_int_equal(pull(dec_ucx, "prefill-2", &st, &end), KVF_OK);
    assert_int_equal(end, KVF_OK);
    assert_int_equal(st.path, KVF_CONNECTOR_PATH_UCX);
    assert_string_equal(st.path_why, "path ucx chosen by configuration");
    assert_true(kvf_ucx_agent_ops_posted(dec_ucx->ranks[0].agent) > 0);
    assert_true(gets_cuda > 0);                      /* into the pool named as cuda memory */
    assert_int_equal(opens, 2);
    print_message("2p1d (%s): %llu bytes, %llu zeroed; ipc pool == ucx pool: %s\n",
                  tmpl ? "templates" : "op list", (unsigned long long)st.bytes, (unsigned long long)st.zero_bytes,
                  (memcmp(d_ipc, d_ucx, dlen) == 0) ? "yes" : "NO");
    assert_memory_equal(d_ipc, d_ucx, dlen);
    {   /* and something landed from each prefill rank (the bytes differ per rank) */
        size_t changed = 0;
        for (size_t i = 0; i < dlen; ++i) {
            changed += (d_ipc[i] != 0xee);
        }
        assert_true(changed >= st.bytes);
    }
    ops->destroy(dec_ipc);
    ops->destroy(dec_ucx);
    ops->destroy(pre);
    assert_int_equal(closes, 2);
    free(pp[0]);
    free(pp[1]);
    free(d_ipc);
    free(d_ucx);
    num_dev = 0;
    opens = closes = 0;
    tmpl_on = false;
}

static void test_ipc_equals_ucx_2p1d(void **state)
{
    (void)state;
    ipc_equals_ucx_2p1d(false);
}

static void test_ipc_tmpl_equals_ucx_2p1d(void **state)
{
    (void)state;
    ipc_equals_ucx_2p1d(true);
}

/* One decode connector pulling under the wraps' current answers: path and why. */
static void fallback_case(int port, const char *expect_why, kvf_connector_path_t path,
                          const uint8_t *ppool)
{
    kvf_connector_h dec = conn_make("decode-f", KVF_CONNECTOR_ROLE_DECODE, 1, path);
    uint8_t *dpool = pool_add(dec, 1, 0, D_BLOCKS, false);
    kvf_connector_stats_t st;
    kvf_status_t end = KVF_ERR_BUSY, s;
    char why[512];

    assert_int_equal(ops->handshake(dec, "prefill-f", "127.0.0.1", port, why, sizeof(why)),
                     KVF_OK);
    counters_reset();
    s = pull(dec, "prefill-f", &st, &end);
    if (path == KVF_CONNECTOR_PATH_IPC) {
        print_message("path ipc, %s: start_pull %s\n", expect_why, kvf_status_str(s));
        assert_int_equal(s, KVF_ERR_UNSUPPORTED);   /* refused, not silently UCX */
        assert_int_equal(gathers, 0);
        assert_int_equal(kvf_ucx_agent_ops_posted(dec->ranks[0].agent), 0);
    } else {
        print_message("fallback: path %s (%s)\n", kvf_connector_path_name(st.path), st.path_why);
        assert_int_equal(s, KVF_OK);
        assert_int_equal(end, KVF_OK);
        assert_int_equal(st.path, KVF_CONNECTOR_PATH_UCX);
        assert_non_null(strstr(st.path_why, expect_why));
        assert_int_equal(gathers, 0);
        assert_true(kvf_ucx_agent_ops_posted(dec->ranks[0].agent) > 0);
        assert_int_equal(closes, opens);             /* nothing stays mapped for a "no" */
        check_1p1d(dpool, ppool);
    }
    ops->destroy(dec);
    free(dpool);
    num_dev = 1;   /* the prefill pool stays */
}

static void test_ipc_fallbacks(void **state)
{
    kvf_connector_h pre;
    uint8_t *ppool;
    int port;

    (void)state;
    node_now = "node-a";
    pre = conn_make("prefill-f", KVF_CONNECTOR_ROLE_PREFILL, 1, KVF_CONNECTOR_PATH_AUTO);
    ppool = pool_add(pre, 1, 0, P_BLOCKS, true);
    port = serve_prefill(pre);

    node_now = "node-b";                               /* decode runs elsewhere */
    fallback_case(port, "another node (prefill rank 0 boot id node-a, here node-b)",
                  KVF_CONNECTOR_PATH_AUTO, ppool);
    fallback_case(port, "another node", KVF_CONNECTOR_PATH_IPC, ppool);
    assert_int_equal(opens, 0);                        /* never tried to map */
    node_now = "node-a";
    uuid_visible = false;
    fallback_case(port, "prefill rank 0's GPU is not visible", KVF_CONNECTOR_PATH_AUTO, ppool);
    uuid_visible = true;
    open_fails = true;
    fallback_case(port, "opening prefill rank 0's handle failed", KVF_CONNECTOR_PATH_AUTO,
                  ppool);
    open_fails = false;
    open_short_by = 4096;                              /* the peer claims more than it shares */
    fallback_case(port, "claims", KVF_CONNECTOR_PATH_AUTO, ppool);
    open_short_by = 0;
    assert_int_equal(opens, 1);
    assert_int_equal(closes, opens);                   /* a refused mapping is closed too */
    ops->destroy(pre);

    /* a prefill told path ucx shares nothing; decode says so */
    pre = conn_make("prefill-f", KVF_CONNECTOR_ROLE_PREFILL, 1, KVF_CONNECTOR_PATH_UCX);
    num_dev = 0;
    free(ppool);
    ppool = pool_add(pre, 1, 0, P_BLOCKS, true);
    port = serve_prefill(pre);
    fallback_case(port, "shares no CUDA IPC handle", KVF_CONNECTOR_PATH_AUTO, ppool);
    ops->destroy(pre);
    free(ppool);
    num_dev = 0;
    opens = closes = 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipc_pull_1p1d),
        cmocka_unit_test(test_ipc_equals_ucx_2p1d),
        cmocka_unit_test(test_ipc_tmpl_equals_ucx_2p1d),
        cmocka_unit_test(test_ipc_fallbacks),
    };
    kvf_log_init("test");
    if (kvf_model_config_load(KVF_SOURCE_DIR "/tests/data/models/tiny-dense.config.json",
                              &cfg) != KVF_OK) {
        return 1;
    }
    ops = kvf_connector_ucx_ops();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
