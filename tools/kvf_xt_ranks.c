/*
 * kvf xfer-test: setup shared by both sides: geometry and the request's
 * blocks per side, the connector, each rank's pool and the bench's raw agent.
 */
#include "kvf_xt_int.h"

#include "kvf_kern.h"

#include <unistd.h>

static uint64_t xt_rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/*
 * Geometry of every rank of one side, pool size and the request's block ids
 * (a seeded permutation, so ids are scattered and never contiguous by luck).
 */
kvf_status_t kvf_xt_side_init(xt_ctx_t *c, xt_side_t *side, bool prefill)
{
    const kvf_cache_layout_t *l = c->layout;
    int64_t need = 0, covered;
    int32_t *perm;
    uint64_t rng = prefill ? 0x1234567ull : 0x7654321ull;
    int64_t k = 0;
    kvf_status_t status;

    side->prefill = prefill;
    side->tp = prefill ? c->lay.prefill_tp : c->lay.decode_tp;
    snprintf(side->engine_id, sizeof(side->engine_id), "%s-%d",
             prefill ? "prefill" : "decode", (int)getpid());
    side->geom = calloc((size_t)side->tp, sizeof(*side->geom));
    if (side->geom == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int r = 0; r < side->tp; ++r) {
        status = kvf_rank_geometry_compute(&c->cfg, &side->params, side->tp, r, &side->geom[r]);
        if (status != KVF_OK) {
            kvf_error("%s rank %d: no valid geometry: %s", prefill ? "prefill" : "decode", r,
                      kvf_status_str(status));
            return status;
        }
    }
    /* decode allocates room for the first generated token too */
    covered = prefill ? c->o.tokens : (int64_t)c->o.tokens + 1;
    for (int gi = 0; gi < l->num_groups; ++gi) {
        side->num_ids[gi] = kvf_group_is_attention(l->groups[gi].kind) ?
            (int)((covered + side->geom[0].block_size - 1) / side->geom[0].block_size) : 1;
        need += side->num_ids[gi];
    }
    side->num_blocks = need + c->o.spare_blocks;
    perm = malloc(sizeof(*perm) * (size_t)side->num_blocks);
    if (perm == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int64_t i = 0; i < side->num_blocks; ++i) {
        perm[i] = (int32_t)i;
    }
    for (int64_t i = side->num_blocks - 1; i > 0; --i) {
        int64_t j = (int64_t)(xt_rng_next(&rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int gi = 0; gi < l->num_groups; ++gi) {
        side->ids[gi] = malloc(sizeof(int32_t) * (size_t)side->num_ids[gi]);
        if (side->ids[gi] == NULL) {
            free(perm);
            return KVF_ERR_NO_MEMORY;
        }
        for (int i = 0; i < side->num_ids[gi]; ++i) {
            side->ids[gi][i] = perm[k++];
        }
    }
    free(perm);
    return KVF_OK;
}

void kvf_xt_side_cleanup(xt_side_t *side)
{
    for (int gi = 0; gi < KVF_MAX_KV_GROUPS; ++gi) {
        free(side->ids[gi]);
    }
    free(side->geom);
}

/* ---- connector and ranks (both sides) ----------------------------------- */

kvf_status_t kvf_xt_conn_create(xt_ctx_t *c, const xt_side_t *side)
{
    kvf_connector_config_t cc;
    kvf_status_t status;

    c->xops = kvf_connector_ucx_ops();
    status = kvf_connector_ops_check(c->xops);
    if (status != KVF_OK) {
        return status;
    }
    memset(&cc, 0, sizeof(cc));
    cc.field_mask = KVF_CONNECTOR_CONFIG_FIELD_TIMEOUT_MS |
                    KVF_CONNECTOR_CONFIG_FIELD_BATCH_DESCS |
                    KVF_CONNECTOR_CONFIG_FIELD_PLAN_FLAGS | KVF_CONNECTOR_CONFIG_FIELD_PATH;
    cc.engine_id = side->engine_id;
    cc.role = side->prefill ? KVF_CONNECTOR_ROLE_PREFILL : KVF_CONNECTOR_ROLE_DECODE;
    cc.tp_size = side->tp;
    cc.cfg = &c->cfg;
    cc.timeout_ms = (uint32_t)c->o.timeout_ms;
    cc.batch_descs = (uint32_t)c->o.batch_descs;
    cc.plan_flags = c->o.no_coalesce ? KVF_XFER_PLAN_FLAG_NO_COALESCE : 0;
    cc.path = c->o.path_kind;
    return c->xops->create(&cc, &c->conn);
}

/* The raw reference's bare agent: the same pool registered a second time. */
static kvf_status_t xt_raw_setup(xt_rank_t *r)
{
    xt_ctx_t *c = r->ctx;
    kvf_ucx_agent_params_t ap;
    kvf_rank_meta_t *m = &r->raw_meta;
    char name[64];
    kvf_status_t status;

    snprintf(name, sizeof(name), "%s rank %d raw", r->side->prefill ? "prefill" : "decode",
             r->rank);
    memset(&ap, 0, sizeof(ap));
    ap.field_mask = KVF_UCX_AGENT_PARAM_FIELD_NAME | KVF_UCX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                    KVF_UCX_AGENT_PARAM_FIELD_MEM_TYPE;
    ap.name = name;
    ap.timeout_ms = (uint32_t)c->o.timeout_ms;
    ap.mem_type = (r->dev.kind == KVF_DEVICE_CUDA) ? KVF_XFER_MEM_CUDA : KVF_XFER_MEM_HOST;
    status = kvf_ucx_agent_create(&ap, &r->raw_agent);
    if (status == KVF_OK) {
        status = kvf_ucx_agent_mem_register_type(r->raw_agent, r->pool, r->pool_len,
                                                 (r->dev.kind == KVF_DEVICE_CUDA) ?
                                                 KVF_XFER_MEM_CUDA : KVF_XFER_MEM_HOST,
                                                 &r->raw_region);
    }
    if (status != KVF_OK) {
        return status;
    }
    memset(m, 0, sizeof(*m));
    snprintf(m->engine_id, sizeof(m->engine_id), "%s", r->side->engine_id);
    m->protocol_version = KVF_XFER_PROTOCOL_VERSION;
    m->tp_rank = r->rank;
    m->tp_size = r->side->tp;
    m->block_size = m->kernel_block_size = 16;
    m->page_size = r->pool_len;
    m->slots = 1;
    m->num_blocks = 1;
    snprintf(m->layout_tag, sizeof(m->layout_tag), "%s", KVF_LAYOUT_TAG_HND);
    m->num_regions = 1;
    status = kvf_ucx_agent_region_meta(r->raw_agent, r->raw_region, &m->regions[0]);
    if (status == KVF_OK) {
        status = kvf_ucx_agent_worker_address(r->raw_agent, m->worker_addr,
                                              sizeof(m->worker_addr), &m->worker_addr_len);
    }
    return status;
}

/* A device pool of r->pool_len bytes on --device and its host copy (rank thread). */
static kvf_status_t xt_device_pool(xt_rank_t *r)
{
    xt_ctx_t *c = r->ctx;
    void *p = NULL;
    int err;

    err = kvf_device_init(c->o.dev_kind, c->o.dev_ordinal, &r->dev);   /* binds this thread */
    if (err == KVF_KERN_OK) {
        err = kvf_device_alloc(&r->dev, r->pool_len, &p);
    }
    if (err != KVF_KERN_OK) {
        snprintf(r->err, sizeof(r->err), "%s rank %d: a %zu-byte pool on %.40s: %s",
                 r->side->prefill ? "prefill" : "decode", r->rank, r->pool_len, c->o.device,
                 kvf_kern_strerror(err));
        return kvf_status_from_kern(err);
    }
    r->pool = p;
    r->host = malloc(r->pool_len);
    return (r->host != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
}

kvf_status_t kvf_xt_pool_push(xt_rank_t *r)
{
    int err = KVF_KERN_OK;

    if (r->dev.kind != KVF_DEVICE_CPU) {
        err = kvf_device_memcpy(&r->dev, r->pool, r->host, r->pool_len, KVF_COPY_H2D);
        if (err == KVF_KERN_OK) {
            err = kvf_device_sync(&r->dev);   /* UCX reads the pool next, outside the stream */
        }
    }
    return kvf_status_from_kern(err);
}

kvf_status_t kvf_xt_pool_pull(xt_rank_t *r)
{
    int err = KVF_KERN_OK;

    if (r->dev.kind != KVF_DEVICE_CPU) {
        err = kvf_device_memcpy(&r->dev, r->host, r->pool, r->pool_len, KVF_COPY_D2H);
    }
    return kvf_status_from_kern(err);
}

void kvf_xt_pool_free(xt_rank_t *r)
{
    if (r->ctx == NULL) {
        return;                        /* the rank never started: nothing allocated */
    }
    if (r->dev.kind != KVF_DEVICE_CPU) {
        kvf_device_free(&r->dev, r->pool);
        free(r->host);
    } else if (!r->ctx->o.ucx_pools) {
        free(r->pool);
    }
    r->pool = r->host = NULL;
}

/* Pool, pattern and registration of one rank (runs on the rank's thread). */
kvf_status_t kvf_xt_rank_setup(xt_rank_t *r)
{
    xt_ctx_t *c = r->ctx;
    xt_side_t *side = r->side;
    const kvf_rank_geometry_t *g = &side->geom[r->rank];
    kvf_connector_pool_t cp;
    kvf_status_t status;

    r->pool_len = (size_t)side->num_blocks * (size_t)c->layout->slots * g->page_size;
    r->dev = kvf_device_cpu();
    memset(&cp, 0, sizeof(cp));
    cp.tp_rank = r->rank;
    cp.len = r->pool_len;
    cp.num_blocks = side->num_blocks;
    cp.params = side->params;
    if (c->o.dev_kind != KVF_DEVICE_CPU) {
        status = xt_device_pool(r);
        if (status != KVF_OK) {
            return status;
        }
        cp.base = r->pool;
        cp.device = r->dev;
        status = c->xops->register_pool(c->conn, &cp);
    } else if (c->o.ucx_pools) {
        void *base = NULL;
        status = c->xops->alloc_pool(c->conn, &cp, &base);
        r->pool = base;
    } else {
        r->pool = aligned_alloc(4096, (r->pool_len + 4095) & ~(size_t)4095);
        if (r->pool == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        cp.base = r->pool;
        status = c->xops->register_pool(c->conn, &cp);
    }
    if (r->host == NULL) {
        r->host = r->pool;   /* a host pool is written in place */
    }
    if (status != KVF_OK) {
        snprintf(r->err, sizeof(r->err), "%s rank %d: %s of a %.40s pool failed: %s",
                 side->prefill ? "prefill" : "decode", r->rank,
                 (c->o.ucx_pools && (r->dev.kind == KVF_DEVICE_CPU)) ? "alloc_pool" :
                 "register_pool", c->o.device, kvf_status_str(status));
        return status;
    }
    /* registered before it is written: the connector may own the memory */
    kvf_xt_poison(r->host, r->pool_len, side->prefill ? XT_POISON_PREFILL : XT_POISON_DECODE);
    if (side->prefill) {
        kvf_xt_prefill_fill(c, side, g, r->host);
    }
    status = kvf_xt_pool_push(r);
    if (status != KVF_OK) {
        snprintf(r->err, sizeof(r->err), "%s rank %d: copying the pattern to %.40s failed: %s",
                 side->prefill ? "prefill" : "decode", r->rank, c->o.device,
                 kvf_status_str(status));
        return status;
    }
    return c->bench ? xt_raw_setup(r) : KVF_OK;
}

/* The probe child's first CUDA failure, written to the pipe its parent reads. */
static int kvf_xt_probe_fd = -1;

static void kvf_xt_probe_report(const char *call, const char *error)
{
    char line[256];
    int n = snprintf(line, sizeof(line), "%s: %s", call, error);
    if ((kvf_xt_probe_fd >= 0) && (n > 0)) {
        size_t len = ((size_t)n < sizeof(line)) ? (size_t)n : sizeof(line) - 1;
        (void)!write(kvf_xt_probe_fd, line, len);   /* < PIPE_BUF: never blocks */
        close(kvf_xt_probe_fd);
        kvf_xt_probe_fd = -1;   /* the first failure only */
    }
}

int kvf_xt_device_probe(const xt_ctx_t *c, const char *prog)
{
    char why[256] = "";
    int fds[2], rc;
    ssize_t got;
    pid_t pid;

    fflush(NULL);
    if (pipe(fds) != 0) {
        kvf_error("%s: pipe failed: %m", prog);
        return 1;
    }
    pid = fork();
    if (pid < 0) {
        kvf_error("%s: fork failed: %m", prog);
        close(fds[0]);
        close(fds[1]);
        return 1;
    }
    if (pid == 0) {
        kvf_device_t dev;
        int err;
        close(fds[0]);
        kvf_xt_probe_fd = fds[1];
        kvf_kern_set_report_func(kvf_xt_probe_report);
        err = kvf_device_init(c->o.dev_kind, c->o.dev_ordinal, &dev);
        _exit((err == KVF_KERN_OK) ? 0 : (-err & 0x7f));
    }
    close(fds[1]);
    rc = kvf_xt_reap(pid, 30000);   /* a driver that hangs is no device either */
    got = (rc == 0) ? 0 : read(fds[0], why, sizeof(why) - 1);   /* the child has exited */
    close(fds[0]);
    why[(got > 0) ? got : 0] = '\0';
    if (rc == 0) {
        return 0;
    }
    printf("%s: --device %s: no usable CUDA device here: %s%s%s%s\n", prog, c->o.device,
           (rc == -KVF_KERN_EUNSUPPORTED) ?
           "this build has no CUDA (configure where nvcc exists, -DKVF_CUDA=ON)" :
           (rc == -KVF_KERN_ECUDA) ? "CUDA found no such device (no GPU, no driver, or "
           "ordinal past the last one)" :
           (rc == -KVF_KERN_EINVAL) ? "bad ordinal" : "the probe failed",
           (why[0] != '\0') ? " (" : "", why, (why[0] != '\0') ? ")" : "");
    return 1;
}

void kvf_xt_start_ranks(xt_ctx_t *c, xt_side_t *side, void *(*thread_fn)(void *))
{
    pthread_barrier_init(&c->barrier, NULL, (unsigned)side->tp + 1);
    for (int r = 0; r < side->tp; ++r) {
        c->ranks[r].ctx = c;
        c->ranks[r].side = side;
        c->ranks[r].rank = r;
        pthread_create(&c->ranks[r].thread, NULL, thread_fn, &c->ranks[r]);
    }
}

void kvf_xt_raw_teardown(xt_rank_t *r)
{
    if (r->raw_agent != NULL) {
        kvf_ucx_agent_destroy(r->raw_agent);   /* closes its peers, deregisters */
        r->raw_agent = NULL;
    }
}
