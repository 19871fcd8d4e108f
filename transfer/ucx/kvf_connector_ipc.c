/*
 * UCX connector, the same-node pull path: when a decode rank and the
 * prefill ranks it reads share a node and both pools are CUDA memory, the
 * prefill pools are mapped into decode once (CUDA IPC) and a whole pull is
 * ONE gather kernel over the request's descriptor list and its zero ranges
 * (the untransferred tails), on the pool's stream; across nodes, for host
 * pools, or when anything here says no, the pull stays UCX.
 *
 * Design. Prefill shares each CUDA pool at registration: the allocation's
 * IPC handle, where the pool starts in it, this node's boot id and the GPU's
 * UUID ride in the rank's published region (XferRegion.ipc), so they travel
 * only in handshake replies, which the side channel sends only to
 * authenticated decode members (docs/SECURITY.md). Decode decides once per
 * (engine slot generation, rank): config path, its pool on CUDA, every
 * source region shared, CUDA memory, the same boot id, the GPU visible, and
 * every source allocation opened (cudaIpcOpenMemHandle), its mapping at
 * least as long as the region the peer claims. The mappings are cached with
 * the decision; a new generation of the slot (eviction, a restarted prefill
 * with a new incarnation: a new handshake entry) closes them and decides
 * again, and connector destroy closes them after the pool's stream drained.
 * A pull then builds its op list (descriptors cut into 128 KiB ops, then the
 * zero ranges; kvf_gather.h) straight into a pinned staging buffer of the rank
 * (up to KVF_CONN_IPC_SLOTS pulls in flight have one each, reused, so no
 * allocation or staging copy per pull), one kvf_gather_staged() of it, one
 * event; poll() queries the event, so completion goes through the existing
 * poll/notify_release path, and the release notifications still go over the
 * UCX endpoints (connected as for a UCX pull; no GET is posted on them).
 * Rejected: cudaMemcpyBatchAsync (no zeroing, and a copy attribute per
 * range); one cudaMemcpyAsync per descriptor (a launch each); letting UCX's
 * cuda_ipc transport do it (one GET per descriptor, host cost per range:
 * the cost this path removes); mapping per pull (cudaIpcOpenMemHandle costs
 * milliseconds).
 */
#include "kvf_connector_ucx_int.h"

#include "kvf_device.h"
#include "kvf_device_ipc.h"
#include "kvf_gather.h"
#include "kvf_gather_tmpl.h"
#include "kvf_tp_map.h"
#include "kvf_xfer_tmpl.h"
#include "kvf_kern_status.h"
#include "kvf_log.h"
#include "kvf_time.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kvf_conn_ipc_map {
    void   *base;       /* the source allocation mapped here; NULL: not mapped */
    size_t  len;        /* its size */
} kvf_conn_ipc_map_t;

/* What one rank decided for one engine slot generation. */
typedef struct kvf_conn_ipc_engine {
    uint64_t            gen;       /* the slot generation decided for; 0: none */
    bool                ok;        /* pulls take the same-node path */
    int                 tp;        /* length of maps */
    kvf_conn_ipc_map_t *maps;      /* [remote tp] */
    char                why[192];  /* why not (ok false) */
    /* the template path (kvf_xfer_tmpl.h): the pair's table over the mappings, made at its
     * first pull with them; NULL with tmpl_why when it has none (the op list then) */
    bool                tmpl_tried;
    kvf_gather_table_t *table;
    kvf_xfer_tmpls_t    tmpls;
    char                tmpl_why[160];
    /* the decode pool the table was made for: a rank that re-registered gets a new one */
    uint8_t            *tmpl_base;
    int64_t             tmpl_blocks;
    kvf_rank_geometry_t tmpl_geom;
} kvf_conn_ipc_engine_t;

/*
 * Staging buffers of one pull in flight: its ops in pinned host memory and a
 * device copy of them, reused by the next pull once this one is freed.
 */
typedef struct kvf_conn_ipc_slot {
    void   *host;     /* kvf_device_host_alloc(): ops or jobs (24 bytes each) */
    void   *dev;      /* kvf_device_alloc() */
    size_t  cap;      /* bytes each holds */
    bool    busy;     /* a request in flight owns it */
} kvf_conn_ipc_slot_t;

#define KVF_CONN_IPC_SLOTS   4        /* pulls in flight per rank with staged ops; more:
                                       * pageable ops, one allocation each */
#define KVF_CONN_IPC_MIN_BYTES (4096u * sizeof(kvf_gather_op_t))   /* first capacity (96 KiB):
                                                                   * an 8k-token pull fits */

struct kvf_conn_ipc_rank {
    kvf_conn_ipc_engine_t engines[KVF_CONN_MAX_ENGINES];
    char                  node[KVF_XFER_NODE_MAX];   /* "" until read */
    kvf_conn_ipc_slot_t   slots[KVF_CONN_IPC_SLOTS];
};

const char *kvf_connector_path_name(kvf_connector_path_t path)
{
    switch (path) {
    case KVF_CONNECTOR_PATH_AUTO: return "auto";
    case KVF_CONNECTOR_PATH_UCX:  return "ucx";
    case KVF_CONNECTOR_PATH_IPC:  return "cuda-ipc";
    }
    return "unknown";
}

void kvf_conn_ipc_export(kvf_connector_h conn, kvf_conn_rank_t *rk,
                         const kvf_connector_pool_t *pool)
{
    kvf_xfer_region_meta_t *reg = &rk->meta->regions[0];
    kvf_ipc_export_t exp;
    int err;

    if ((conn->role != KVF_CONNECTOR_ROLE_PREFILL) || (pool->device.kind != KVF_DEVICE_CUDA) ||
        (conn->path == KVF_CONNECTOR_PATH_UCX)) {
        return;
    }
    if (kvf_node_id(reg->ipc.node, sizeof(reg->ipc.node)) != KVF_OK) {
        return;   /* logged */
    }
    err = kvf_device_ipc_export(&pool->device, pool->base, pool->len, &exp);
    if (err != KVF_KERN_OK) {
        kvf_warn("ucx connector %s: rank %d pool not shared for same-node pulls (%s): decode "
                 "reads it over UCX", conn->engine_id, pool->tp_rank, kvf_kern_strerror(err));
        return;
    }
    memcpy(reg->ipc.handle, exp.handle, sizeof(reg->ipc.handle));
    memcpy(reg->ipc.uuid, exp.uuid, sizeof(reg->ipc.uuid));
    reg->ipc.offset = exp.offset;
    reg->has_ipc = true;
    kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "ucx connector %s: rank %d pool shared for same-node "
            "pulls (CUDA IPC, node %s)", conn->engine_id, pool->tp_rank, reg->ipc.node);
}

static kvf_status_t kvf_conn_ipc_state(kvf_conn_rank_t *rk)
{
    if (rk->ipc == NULL) {
        rk->ipc = calloc(1, sizeof(*rk->ipc));
    }
    return (rk->ipc != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
}

/* Close what @a ie mapped (no gather of it may be in flight) and forget the decision. */
static void kvf_conn_ipc_forget(kvf_conn_rank_t *rk, kvf_conn_ipc_engine_t *ie)
{
    kvf_gather_table_destroy(&rk->device, ie->table);
    kvf_xfer_tmpls_free(&ie->tmpls);
    for (int p = 0; (ie->maps != NULL) && (p < ie->tp); ++p) {
        kvf_device_ipc_close(&rk->device, ie->maps[p].base);
    }
    free(ie->maps);
    memset(ie, 0, sizeof(*ie));
}

/*
 * Close the mappings of engines that left the table (forgotten, evicted, or
 * dropped when their prefill restarted under a new incarnation): a slot is
 * cleared only with no pull of it in flight, so nothing reads them. Without
 * this a restarted prefill's old allocation would stay mapped, and held in
 * GPU memory, until its slot was reused.
 */
static void kvf_conn_ipc_sweep(kvf_connector_h conn, kvf_conn_rank_t *rk)
{
    bool gone[KVF_CONN_MAX_ENGINES] = {false};

    pthread_mutex_lock(&conn->lock);
    for (int e = 0; e < KVF_CONN_MAX_ENGINES; ++e) {
        const kvf_conn_ipc_engine_t *ie = &rk->ipc->engines[e];
        gone[e] = (ie->maps != NULL) &&
                  ((e >= conn->num_engines) || conn->engines[e].forgotten ||
                   (conn->engines[e].gen != ie->gen));
    }
    pthread_mutex_unlock(&conn->lock);
    for (int e = 0; e < KVF_CONN_MAX_ENGINES; ++e) {
        if (gone[e]) {
            kvf_conn_ipc_forget(rk, &rk->ipc->engines[e]);   /* decided again if it returns */
        }
    }
}

/* A "no" keeps its reason but none of the mappings made on the way to it. */
static void kvf_conn_ipc_unmap(kvf_conn_rank_t *rk, kvf_conn_ipc_engine_t *ie)
{
    for (int p = 0; (ie->maps != NULL) && (p < ie->tp); ++p) {
        kvf_device_ipc_close(&rk->device, ie->maps[p].base);
    }
    free(ie->maps);
    ie->maps = NULL;
    ie->tp = 0;
}

/*
 * Decide whether rank @a rk pulls from engine slot @a engine by CUDA IPC,
 * mapping every source rank @a src[0..nsrc) (ie->ok, or ie->why).
 */
static void kvf_conn_ipc_decide(kvf_connector_h conn, kvf_conn_rank_t *rk, int engine,
                                const int *src, int nsrc, kvf_conn_ipc_engine_t *ie)
{
    const kvf_conn_engine_t *e = &conn->engines[engine];

    ie->gen = e->gen;
    if (conn->path == KVF_CONNECTOR_PATH_UCX) {
        snprintf(ie->why, sizeof(ie->why), "path ucx chosen by configuration");
        return;
    }
    if (rk->device.kind != KVF_DEVICE_CUDA) {
        snprintf(ie->why, sizeof(ie->why), "the decode pool is %s memory (CUDA IPC maps "
                 "device memory only)", kvf_device_kind_name(rk->device.kind));
        return;
    }
    if ((rk->ipc->node[0] == '\0') && (kvf_node_id(rk->ipc->node, sizeof(rk->ipc->node)) !=
                                       KVF_OK)) {
        snprintf(ie->why, sizeof(ie->why), "this node has no readable boot id");
        return;
    }
    ie->maps = calloc((size_t)e->tp, sizeof(*ie->maps));
    if (ie->maps == NULL) {
        snprintf(ie->why, sizeof(ie->why), "out of memory");
        return;
    }
    ie->tp = e->tp;
    for (int i = 0; i < nsrc; ++i) {
        const kvf_xfer_region_meta_t *reg = &e->ranks[src[i]].regions[0];
        kvf_conn_ipc_map_t *m = &ie->maps[src[i]];
        int err;

        if (reg->mem_type != KVF_XFER_MEM_CUDA) {
            snprintf(ie->why, sizeof(ie->why), "prefill rank %d's pool is %s memory", src[i],
                     kvf_xfer_mem_type_name(reg->mem_type));
            return;
        }
        if (!reg->has_ipc) {
            snprintf(ie->why, sizeof(ie->why), "prefill rank %d shares no CUDA IPC handle "
                     "(an older peer, path ucx there, or its export failed)", src[i]);
            return;
        }
        if (strcmp(reg->ipc.node, rk->ipc->node) != 0) {
            snprintf(ie->why, sizeof(ie->why), "another node (prefill rank %d boot id %.40s, "
                     "here %.40s)", src[i], reg->ipc.node, rk->ipc->node);
            return;
        }
        if (!kvf_device_uuid_visible(reg->ipc.uuid)) {
            snprintf(ie->why, sizeof(ie->why), "prefill rank %d's GPU is not visible to this "
                     "process", src[i]);
            return;
        }
        err = kvf_device_ipc_open(&rk->device, reg->ipc.handle, &m->base, &m->len);
        if (err != KVF_KERN_OK) {
            m->base = NULL;
            snprintf(ie->why, sizeof(ie->why), "opening prefill rank %d's handle failed: %s "
                     "(logged above)", src[i], kvf_kern_strerror(err));
            return;
        }
        if ((reg->ipc.offset > m->len) || (reg->length > m->len - reg->ipc.offset)) {
            snprintf(ie->why, sizeof(ie->why), "prefill rank %d claims %" PRIu64 " bytes at "
                     "offset %" PRIu64 " of a %zu-byte allocation", src[i], reg->length,
                     reg->ipc.offset, m->len);
            kvf_error("ucx connector %s: %s: refused", conn->engine_id, ie->why);
            return;
        }
    }
    ie->ok = true;
}

/*
 * Fill @a ops with the request's copies, then its zero ranges: one op list,
 * one kernel. They never overlap (the planner's zero ranges are exactly what
 * the descriptors leave untouched), so their order inside the kernel does not
 * matter.
 */
static kvf_status_t kvf_conn_ipc_ops(kvf_connector_h conn, kvf_conn_rank_t *rk,
                                     kvf_connector_req_h req, const kvf_conn_ipc_engine_t *ie,
                                     kvf_gather_op_t *ops, size_t *n_p)
{
    const kvf_conn_engine_t *e = &conn->engines[req->engine];
    uint64_t dst = (uint64_t)(uintptr_t)rk->base;
    size_t n = 0;

    for (int i = 0; i < req->plan->num_ranks; ++i) {
        const kvf_xfer_rank_plan_t *rp = &req->plan->ranks[i];
        const kvf_xfer_region_meta_t *reg = &e->ranks[rp->remote_rank].regions[0];
        uint64_t src = (uint64_t)(uintptr_t)ie->maps[rp->remote_rank].base + reg->ipc.offset;
        for (size_t k = 0; k < rp->num_descs; ++k) {
            const kvf_xfer_desc_t *d = &rp->descs[k];
            if ((d->len == 0) || (d->local_off > rk->len) || (d->len > rk->len - d->local_off) ||
                (d->remote_off > reg->length) || (d->len > reg->length - d->remote_off)) {
                kvf_error("ucx connector %s rank %d: descriptor %zu of prefill rank %d "
                          "{local %" PRIu64 ", remote %" PRIu64 ", len %" PRIu64 "} leaves a "
                          "region (local %zu, remote %" PRIu64 " bytes)", conn->engine_id,
                          req->rank, k, rp->remote_rank, d->local_off, d->remote_off, d->len,
                          rk->len, reg->length);
                return KVF_ERR_OUT_OF_RANGE;
            }
            n += kvf_gather_split(src + d->remote_off, dst + d->local_off, d->len, ops + n);
        }
    }
    for (size_t z = 0; z < req->plan->num_zero; ++z) {
        if (req->zero_len[z] > 0) {
            n += kvf_gather_split(0, dst + req->zero_off[z], req->zero_len[z], ops + n);
        }
    }
    *n_p = n;
    return KVF_OK;
}

/* A free staging slot of room for @a cap bytes (grown as needed), or NULL: pageable ops. */
static kvf_conn_ipc_slot_t *kvf_conn_ipc_slot(kvf_conn_rank_t *rk, size_t cap)
{
    for (int i = 0; i < KVF_CONN_IPC_SLOTS; ++i) {
        kvf_conn_ipc_slot_t *sl = &rk->ipc->slots[i];
        size_t want;
        int err;

        if (sl->busy) {
            continue;
        }
        if (sl->cap >= cap) {
            return sl;
        }
        want = (cap > KVF_CONN_IPC_MIN_BYTES) ? cap + cap / 2 : KVF_CONN_IPC_MIN_BYTES;
        kvf_device_host_free(&rk->device, sl->host);
        kvf_device_free(&rk->device, sl->dev);
        memset(sl, 0, sizeof(*sl));
        err = kvf_device_host_alloc(&rk->device, want, &sl->host);
        if (err == KVF_KERN_OK) {
            err = kvf_device_alloc(&rk->device, want, &sl->dev);
        }
        if (err != KVF_KERN_OK) {
            kvf_device_host_free(&rk->device, sl->host);
            memset(sl, 0, sizeof(*sl));
            return NULL;   /* logged by the device layer; the pageable way still works */
        }
        sl->cap = want;
        return sl;
    }
    return NULL;
}

/*
 * Rank @a rk's decision for engine slot @a engine, made (mappings opened, logged) when the
 * slot holds another generation than the one decided for; engines that left are swept first.
 */
static kvf_conn_ipc_engine_t *kvf_conn_ipc_ensure(kvf_connector_h conn, kvf_conn_rank_t *rk,
                                                  int engine, int rank, const int *src,
                                                  int nsrc)
{
    kvf_conn_ipc_engine_t *ie;

    kvf_conn_ipc_sweep(conn, rk);
    ie = &rk->ipc->engines[engine];
    if (ie->gen != conn->engines[engine].gen) {
        /* a new engine in the slot (or a restarted one): no pull of the old one is in
         * flight (the slot was idle when it was refilled), so its mappings can go */
        kvf_conn_ipc_forget(rk, ie);
        kvf_conn_ipc_decide(conn, rk, engine, src, nsrc, ie);
        if (!ie->ok) {
            kvf_conn_ipc_unmap(rk, ie);
        }
        if (!ie->ok && (conn->path != KVF_CONNECTOR_PATH_IPC)) {
            kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "ucx connector %s rank %d: pulls from %s go "
                    "over UCX: %s", conn->engine_id, rank, conn->engines[engine].engine_id,
                    ie->why);
        } else if (ie->ok) {
            kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "ucx connector %s rank %d: pulls from %s take "
                    "the same-node path (CUDA IPC, %d prefill rank(s) mapped)", conn->engine_id,
                    rank, conn->engines[engine].engine_id, nsrc);
        }
    }
    return ie;
}

kvf_status_t kvf_conn_ipc_start(kvf_connector_h conn, kvf_conn_rank_t *rk,
                                kvf_connector_req_h req)
{
    kvf_conn_ipc_engine_t *ie;
    kvf_conn_ipc_slot_t *sl;
    kvf_gather_op_t *ops;
    size_t cap = 0, n = 0;
    kvf_status_t status;
    int err;

    if ((conn->path == KVF_CONNECTOR_PATH_UCX) && (rk->ipc == NULL)) {
        return KVF_OK;   /* nothing to decide or report beyond the path */
    }
    status = kvf_conn_ipc_state(rk);
    if (status != KVF_OK) {
        return status;
    }
    ie = kvf_conn_ipc_ensure(conn, rk, req->engine, req->rank, req->src, req->nsrc);
    if (!ie->ok) {
        if (conn->path == KVF_CONNECTOR_PATH_IPC) {
            kvf_error("ucx connector %s rank %d: path cuda-ipc is not possible for %s: %s",
                      conn->engine_id, req->rank, conn->engines[req->engine].engine_id,
                      ie->why);
            return KVF_ERR_UNSUPPORTED;
        }
        return KVF_OK;
    }
    for (int i = 0; i < req->plan->num_ranks; ++i) {
        for (size_t k = 0; k < req->plan->ranks[i].num_descs; ++k) {
            cap += kvf_gather_ops_for(req->plan->ranks[i].descs[k].len);
        }
    }
    for (size_t z = 0; z < req->plan->num_zero; ++z) {
        cap += kvf_gather_ops_for(req->zero_len[z]);
    }
    sl = kvf_conn_ipc_slot(rk, cap * sizeof(*ops));
    ops = (sl != NULL) ? sl->host : malloc((cap + 1) * sizeof(*ops));
    if (ops == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_conn_ipc_ops(conn, rk, req, ie, ops, &n);
    if (status != KVF_OK) {
        if (sl == NULL) {
            free(ops);
        }
        return status;
    }
    /* the copies and the zero ranges: one upload, one kernel, on the pool's stream */
    err = (sl != NULL) ? kvf_gather_staged(&rk->device, ops, sl->dev, n) :
          kvf_gather(&rk->device, ops, n);
    if (err == KVF_KERN_OK) {
        err = kvf_device_event_record(&rk->device, &req->ipc_event);
    }
    if (sl != NULL) {
        sl->busy = true;   /* until the request is freed, after its event */
        req->ipc_slot = (int)(sl - rk->ipc->slots) + 1;
    } else {
        free(ops);         /* kvf_gather() copied it */
    }
    if (err != KVF_KERN_OK) {
        kvf_error("ucx connector %s rank %d: same-node gather of request %s (%zu ops) failed: "
                  "%s", conn->engine_id, req->rank, req->request_id, n, kvf_kern_strerror(err));
        /* what was enqueued may still run: drain it before the caller frees anything */
        (void)kvf_device_sync(&rk->device);
        return kvf_status_from_kern(err);
    }
    req->ipc = true;
    req->ipc_ops = n;
    return KVF_OK;
}

/*
 * The pair's gather table, made once with its mappings (the first pull of the engine
 * generation): the templates of its pieces over the mapped source pools and this rank's
 * pool. None (tmpl_why) when the pieces are missing or have no templates, or the table
 * cannot be made: the pulls then take the op list.
 */
static void kvf_conn_ipc_table(kvf_connector_h conn, kvf_conn_rank_t *rk,
                               kvf_conn_ipc_engine_t *ie, int engine,
                               const kvf_xfer_plan_params_t *pp)
{
    const kvf_conn_engine_t *e = &conn->engines[engine];
    kvf_gather_table_desc_t d;
    int err;

    ie->tmpl_tried = true;
    ie->tmpl_base = rk->base;
    ie->tmpl_blocks = rk->num_blocks;
    ie->tmpl_geom = rk->geom;
    if (!(pp->field_mask & KVF_XFER_PLAN_PARAM_FIELD_PIECES)) {
        snprintf(ie->tmpl_why, sizeof(ie->tmpl_why), "the pair's pieces could not be built");
        return;
    }
    if (kvf_xfer_tmpls_build(pp->pieces, &ie->tmpls, ie->tmpl_why, sizeof(ie->tmpl_why)) !=
        KVF_OK) {
        return;
    }
    memset(&d, 0, sizeof(d));
    d.dst_base = (uint64_t)(uintptr_t)rk->base;
    d.dst_page = rk->geom.page_size;
    d.dst_blocks = rk->num_blocks;
    d.slots = (uint32_t)conn->layout->slots;
    d.num_src = (uint32_t)e->tp;
    for (int i = 0; i < ie->tmpls.num_sources; ++i) {
        int r = ie->tmpls.sources[i];
        d.src_base[r] = (uint64_t)(uintptr_t)ie->maps[r].base + e->ranks[r].regions[0].ipc.offset;
        d.src_page[r] = e->geoms[r].page_size;
        d.src_blocks[r] = e->num_blocks[r];
    }
    d.pieces = ie->tmpls.pieces;
    d.num_pieces = ie->tmpls.num_pieces;
    d.tmpls = ie->tmpls.tmpls;
    d.num_tmpls = KVF_XFER_TMPL_COUNT;
    err = kvf_gather_table_create(&rk->device, &d, &ie->table);
    if (err != KVF_KERN_OK) {
        ie->table = NULL;
        snprintf(ie->tmpl_why, sizeof(ie->tmpl_why), "the gather table was not made: %s",
                 kvf_kern_strerror(err));
    }
    kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "ucx connector %s rank %d: pulls from %s %s%s",
            conn->engine_id, (int)(rk - conn->ranks), e->engine_id,
            (ie->table != NULL) ? "by block templates (jobs per pull, no plan)" :
            "by the plan's op list: ", (ie->table != NULL) ? "" : ie->tmpl_why);
}

/* Keep @a pull's ids in @a req (one allocation) for a plan built later (kvf_conn_req_plan). */
static kvf_status_t kvf_conn_ipc_keep_pull(kvf_connector_req_h req,
                                           const kvf_connector_pull_t *pull)
{
    size_t ids = 0;
    kvf_connector_pull_t *c;
    int32_t *at;

    for (int g = 0; g < pull->num_groups; ++g) {
        ids += (size_t)pull->num_local_ids[g] + (size_t)pull->num_remote_ids[g];
    }
    c = malloc(sizeof(*c) + ids * sizeof(int32_t));
    if (c == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    *c = *pull;
    at = (int32_t *)(c + 1);
    for (int g = 0; g < pull->num_groups; ++g) {
        memcpy(at, pull->local_ids[g], (size_t)pull->num_local_ids[g] * sizeof(*at));
        c->local_ids[g] = at;
        at += pull->num_local_ids[g];
        memcpy(at, pull->remote_ids[g], (size_t)pull->num_remote_ids[g] * sizeof(*at));
        c->remote_ids[g] = at;
        at += pull->num_remote_ids[g];
    }
    c->engine_id = c->request_id = NULL;   /* borrowed strings: not kept */
    c->peer = NULL;
    req->pull_copy = c;
    return KVF_OK;
}

kvf_status_t kvf_conn_ipc_jobs(kvf_connector_h conn, kvf_conn_rank_t *rk,
                               kvf_connector_req_h req, const kvf_xfer_plan_params_t *pp,
                               const kvf_connector_pull_t *pull)
{
    const kvf_conn_engine_t *e = &conn->engines[req->engine];
    int src[KVF_GATHER_TMPL_MAX_SRC], nsrc = 0;
    kvf_conn_ipc_engine_t *ie;
    kvf_conn_ipc_slot_t *sl;
    uint64_t bytes = 0, zero = 0;
    size_t n = 0;
    kvf_status_t status;

    if ((conn->path == KVF_CONNECTOR_PATH_UCX) || (rk->device.kind != KVF_DEVICE_CUDA) ||
        (e->tp > KVF_GATHER_TMPL_MAX_SRC) || (kvf_conn_ipc_state(rk) != KVF_OK)) {
        return KVF_OK;   /* the plan path decides and reports */
    }
    ie = &rk->ipc->engines[req->engine];
    if ((ie->gen != e->gen) &&
        (kvf_tp_source_ranks(&conn->cfg, e->tp, conn->tp, req->rank, src, &nsrc) == KVF_OK)) {
        ie = kvf_conn_ipc_ensure(conn, rk, req->engine, req->rank, src, nsrc);
    }
    if (!ie->ok || (ie->gen != e->gen)) {
        return KVF_OK;
    }
    if (ie->tmpl_tried && ((ie->tmpl_base != rk->base) || (ie->tmpl_blocks != rk->num_blocks) ||
                           (memcmp(&ie->tmpl_geom, &rk->geom, sizeof(rk->geom)) != 0))) {
        /* the rank re-registered its pool: a table of the old one must go (after the
         * stream passed any gather that reads it) */
        (void)kvf_device_sync(&rk->device);
        kvf_gather_table_destroy(&rk->device, ie->table);
        kvf_xfer_tmpls_free(&ie->tmpls);
        ie->table = NULL;
        ie->tmpl_tried = false;
    }
    if (!ie->tmpl_tried) {
        kvf_conn_ipc_table(conn, rk, ie, req->engine, pp);
    }
    if ((ie->table == NULL) || !(pp->field_mask & KVF_XFER_PLAN_PARAM_FIELD_PIECES)) {
        return KVF_OK;
    }
    sl = kvf_conn_ipc_slot(rk, kvf_xfer_tmpl_jobs_max(pp) * sizeof(kvf_gather_job_t));
    if (sl == NULL) {
        return KVF_OK;   /* every slot busy: the op list (pageable) */
    }
    status = kvf_xfer_tmpl_jobs(pp, (kvf_gather_job_t *)sl->host, &n, &bytes, &zero);
    if (status == KVF_ERR_UNSUPPORTED) {
        return KVF_OK;
    }
    if (status != KVF_OK) {
        return status;   /* the plan would refuse it the same way (logged) */
    }
    if (n == 0) {
        return KVF_OK;   /* nothing to move (a whole-prompt prefix hit, no Mamba): the plan */
    }
    req->src = malloc((size_t)ie->tmpls.num_sources * sizeof(*req->src) + 1);
    if ((req->src == NULL) || (kvf_conn_ipc_keep_pull(req, pull) != KVF_OK)) {
        return KVF_ERR_NO_MEMORY;   /* freed with the request */
    }
    req->nsrc = ie->tmpls.num_sources;
    memcpy(req->src, ie->tmpls.sources, (size_t)req->nsrc * sizeof(*req->src));
    sl->busy = true;   /* until the request is freed, after its event */
    req->ipc_slot = (int)(sl - rk->ipc->slots) + 1;
    req->ipc_jobs = n;
    return KVF_OK;
}

kvf_status_t kvf_conn_ipc_run_jobs(kvf_connector_h conn, kvf_conn_rank_t *rk,
                                   kvf_connector_req_h req)
{
    kvf_conn_ipc_engine_t *ie = &rk->ipc->engines[req->engine];
    kvf_conn_ipc_slot_t *sl = &rk->ipc->slots[req->ipc_slot - 1];
    kvf_gather_job_t *jobs = (kvf_gather_job_t *)sl->host;
    int err = kvf_gather_tmpl_run(&rk->device, ie->table, jobs, (kvf_gather_job_t *)sl->dev,
                                  req->ipc_jobs);

    if (err == KVF_KERN_OK) {
        err = kvf_device_event_record(&rk->device, &req->ipc_event);
    }
    if (err != KVF_KERN_OK) {
        kvf_error("ucx connector %s rank %d: same-node gather of request %s (%zu block jobs) "
                  "failed: %s", conn->engine_id, req->rank, req->request_id, req->ipc_jobs,
                  kvf_kern_strerror(err));
        (void)kvf_device_sync(&rk->device);   /* what was enqueued may still run */
        return kvf_status_from_kern(err);
    }
    req->ipc = true;
    req->ipc_ops = kvf_gather_tmpl_ops(ie->table, jobs, req->ipc_jobs);
    return KVF_OK;
}

kvf_status_t kvf_conn_ipc_poll(kvf_connector_h conn, kvf_connector_req_h req)
{
    kvf_conn_rank_t *rk = &conn->ranks[req->rank];
    bool done = false;
    int err = kvf_device_event_query(&rk->device, req->ipc_event, &done);

    if (err != KVF_KERN_OK) {
        kvf_error("ucx connector %s rank %d: same-node gather of request %s failed: %s",
                  conn->engine_id, req->rank, req->request_id, kvf_kern_strerror(err));
        req->status = kvf_status_from_kern(err);
        return req->status;
    }
    if (!done) {
        if (kvf_time_now_ns() > req->deadline_ns) {
            kvf_error("ucx connector: request %s on rank %d timed out after %u ms (same-node "
                      "gather still running)", req->request_id, req->rank, conn->timeout_ms);
            req->status = KVF_ERR_PEER_TIMEOUT;
        }
        return req->status;
    }
    req->landed_ns = req->done_ns = kvf_time_now_ns();   /* the zeroing ran in the stream */
    req->status = KVF_OK;
    return KVF_OK;
}

void kvf_conn_ipc_req_free(kvf_connector_h conn, kvf_connector_req_h req)
{
    kvf_conn_rank_t *rk = &conn->ranks[req->rank];
    bool done = true;

    if ((req->ipc_event == NULL) && (req->ipc_slot == 0)) {
        return;
    }
    if ((req->ipc_event == NULL) ||
        (kvf_device_event_query(&rk->device, req->ipc_event, &done) != KVF_KERN_OK) || !done) {
        (void)kvf_device_sync(&rk->device);   /* it writes the pool the caller reuses */
    }
    kvf_device_event_destroy(&rk->device, req->ipc_event);
    req->ipc_event = NULL;
    if (req->ipc_slot > 0) {
        rk->ipc->slots[req->ipc_slot - 1].busy = false;   /* its ops were read */
        req->ipc_slot = 0;
    }
}

void kvf_conn_ipc_stats(kvf_connector_h conn, const struct kvf_connector_req *req,
                        kvf_connector_stats_t *stats)
{
    const kvf_conn_rank_t *rk = &conn->ranks[req->rank];

    stats->path = req->ipc ? KVF_CONNECTOR_PATH_IPC : KVF_CONNECTOR_PATH_UCX;
    stats->gather_ops = req->ipc_ops;
    stats->path_why = req->ipc ? "" : (conn->path == KVF_CONNECTOR_PATH_UCX) ?
                      "path ucx chosen by configuration" :
                      ((rk->ipc != NULL) && (rk->ipc->engines[req->engine].why[0] != '\0')) ?
                      rk->ipc->engines[req->engine].why : "not decided";
}

void kvf_conn_ipc_rank_destroy(kvf_conn_rank_t *rk)
{
    if (rk->ipc == NULL) {
        return;
    }
    (void)kvf_device_sync(&rk->device);   /* no gather reads a mapping being closed */
    for (int e = 0; e < KVF_CONN_MAX_ENGINES; ++e) {
        kvf_conn_ipc_forget(rk, &rk->ipc->engines[e]);
    }
    for (int i = 0; i < KVF_CONN_IPC_SLOTS; ++i) {
        kvf_device_host_free(&rk->device, rk->ipc->slots[i].host);
        kvf_device_free(&rk->device, rk->ipc->slots[i].dev);
    }
    free(rk->ipc);
    rk->ipc = NULL;
}
