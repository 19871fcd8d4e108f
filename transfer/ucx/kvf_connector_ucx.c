/*
 * UCX KV connector: the ops table of transfer/ucx/kvf_connector.h over the UCX
 * agent, the side channel, the compatibility check and the planner.
 *
 * Design: the connector is per instance; per-rank state (agent, pool,
 * metadata, peers) lives in an array indexed by tp_rank and is touched only
 * by the thread that drives that rank (the daemons drive every rank from
 * their leader thread; a test may give each rank its own), so no UCX call
 * needs a lock. Debug builds check this (kvf_contract.h). What ranks share — the
 * table of handshaken remote engines — is guarded by one mutex that is never
 * held across a network call: the handshake fetches and checks the remote
 * metadata unlocked (the side-channel client is the leader's alone) and
 * takes the lock only to publish, so a rank thread's pull never waits
 * behind a stalled peer. An entry, once published, does not change while a
 * pull of it is in flight (each entry counts its pulls), so a rank thread
 * can read it without holding the lock. The table holds
 * KVF_CONN_MAX_ENGINES entries; a handshake with a new engine when it is
 * full evicts the least recently used entry that has no pull in flight
 * (refused only when every entry is busy). Each fill of a slot gets a new
 * generation; a rank closes endpoints of an older generation of the slot on
 * its own thread at its next pull from it. Peers are connected lazily on a rank's first pull from a remote rank
 * and cached per (engine, remote rank): the rkey is unpacked once per
 * endpoint. A request is one batch per prefill rank read (or, with
 * batch_descs, a window of that many descriptors per rank: poll() posts the
 * next window when one lands); poll() drives the worker and applies the
 * zero post-ops when the last batch lands.
 * Prefill progress (config progress_thread): shared-memory and TCP GETs
 * need the TARGET's worker progressed, and a prefill leader busy in an
 * engine step progressed nothing, so concurrent pulls timed out. From
 * serve() on, one thread per rank owns that rank's worker outright (the
 * worker stays UCS_THREAD_MODE_SINGLE: nobody else touches it after
 * registration): it spins (with sched_yield) while there was work in the
 * last few ms, then arms the worker and sleeps on its event fd, so an idle
 * instance costs no CPU and a busy one answers within microseconds.
 * Rejected: progress between engine layers (ties the engine to the
 * transport, and one layer can still take longer than a transfer timeout);
 * UCS_THREAD_MODE_MULTI with the leader also progressing (a lock on every
 * progress call, for nothing).
 */
#include "kvf_connector_ucx_int.h"

#include "kvf_compat.h"
#include "kvf_device.h"
#include "kvf_log.h"
#include "kvf_random.h"
#include "kvf_time.h"
#include "kvf_tp_map.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <time.h>

typedef struct {
    kvf_connector_h conn;
    int             rank;
} kvf_conn_progress_arg_t;

/* Owns rank @a rank's worker: progress it, drain notifications, sleep when idle. */
static void *kvf_conn_progress_main(void *arg)
{
    kvf_conn_progress_arg_t a = *(kvf_conn_progress_arg_t *)arg;
    kvf_conn_rank_t *rk = &a.conn->ranks[a.rank];
    uint64_t last_work = kvf_time_now_ns();
    uint8_t buf[4096];
    size_t len;
    int fd = -1;

    free(arg);
    if (kvf_ucx_agent_event_fd(rk->agent, &fd) != KVF_OK) {
        fd = -1;
    }
    while (!atomic_load(&a.conn->progress_stop)) {
        unsigned n = kvf_ucx_agent_progress(rk->agent);
        for (;;) {
            kvf_status_t st = kvf_ucx_notify_recv(rk->agent, buf, sizeof(buf), &len, 0);
            if (st == KVF_OK) {
                ++n;   /* UCX release notifications free nothing here: see the lease handler */
                continue;
            }
            n += (st == KVF_INPROGRESS);   /* its own progress served work: keep spinning */
            break;
        }
        if (n > 0) {
            last_work = kvf_time_now_ns();
            continue;
        }
        if ((fd < 0) || (kvf_time_now_ns() - last_work < KVF_CONNECTOR_SPIN_NS)) {
            sched_yield();
            continue;
        }
        if (kvf_ucx_agent_arm(rk->agent) != KVF_OK) {
            continue;   /* BUSY: work arrived meanwhile */
        }
        struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
        if (poll(&p, 1, 50) > 0) {   /* 50 ms: bounds how long stop takes */
            last_work = kvf_time_now_ns();
        }
    }
    return NULL;
}

static void kvf_conn_progress_stop(kvf_connector_h conn)
{
    if (conn->progress == NULL) {
        return;
    }
    atomic_store(&conn->progress_stop, true);
    for (int r = 0; r < conn->tp; ++r) {
        pthread_join(conn->progress[r], NULL);
    }
    free(conn->progress);
    conn->progress = NULL;
}

static kvf_status_t kvf_conn_progress_start(kvf_connector_h conn)
{
    conn->progress = calloc((size_t)conn->tp, sizeof(*conn->progress));
    if (conn->progress == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    atomic_store(&conn->progress_stop, false);
    for (int r = 0; r < conn->tp; ++r) {
        kvf_conn_progress_arg_t *a = malloc(sizeof(*a));
        if (a != NULL) {
            a->conn = conn;
            a->rank = r;
        }
        if ((a == NULL) ||
            (pthread_create(&conn->progress[r], NULL, kvf_conn_progress_main, a) != 0)) {
            free(a);
            kvf_error("ucx connector: cannot start the progress thread of rank %d", r);
            atomic_store(&conn->progress_stop, true);
            for (int j = 0; j < r; ++j) {
                pthread_join(conn->progress[j], NULL);
            }
            free(conn->progress);
            conn->progress = NULL;
            return KVF_ERR_NO_RESOURCE;
        }
    }
    kvf_log(KVF_LOG_INFO, KVF_SUB_XFER, "ucx connector %s: %d progress thread(s) serve GETs",
            conn->engine_id, conn->tp);
    return KVF_OK;
}

static void kvf_conn_destroy(kvf_connector_h conn)
{
    if (conn == NULL) {
        return;
    }
    KVF_CONN_CHECK_LEADER(conn, "destroy");
    kvf_conn_progress_stop(conn);   /* before the workers go */
    kvf_side_channel_server_stop(conn->server);
    kvf_side_channel_client_destroy(conn->client);
    for (int r = 0; (conn->ranks != NULL) && (r < conn->tp); ++r) {
        kvf_conn_rank_t *rk = &conn->ranks[r];
        kvf_conn_ipc_rank_destroy(rk);      /* same-node mappings, after the stream drained */
        kvf_ucx_agent_destroy(rk->agent);   /* closes the peers it connected */
        kvf_conn_pool_stream_destroy(rk);
        for (int e = 0; e < KVF_CONN_MAX_ENGINES; ++e) {
            free(rk->peers[e]);
        }
        free(rk->meta);
    }
    for (int e = 0; e < conn->num_engines; ++e) {
        kvf_conn_engine_pieces_free(conn, &conn->engines[e]);
        free(conn->engines[e].ranks);
        free(conn->engines[e].geoms);
        free(conn->engines[e].num_blocks);
    }
    pthread_mutex_destroy(&conn->lock);
    free(conn->ranks);
    free(conn->layout);
    free(conn);
}

static kvf_status_t kvf_conn_create(const kvf_connector_config_t *config,
                                    kvf_connector_h *conn_p)
{
    kvf_connector_h conn;
    kvf_status_t status;

    if ((config == NULL) || (config->field_mask & ~KVF_CONNECTOR_CONFIG_FIELDS_KNOWN) ||
        (config->engine_id == NULL) || (strlen(config->engine_id) >= KVF_ENGINE_ID_MAX) ||
        (config->cfg == NULL) || (config->tp_size < 1) || (config->tp_size > KVF_XFER_MAX_TP) ||
        (config->role > KVF_CONNECTOR_ROLE_DECODE) ||
        ((config->field_mask & KVF_CONNECTOR_CONFIG_FIELD_PATH) &&
         ((unsigned)config->path > KVF_CONNECTOR_PATH_IPC))) {
        kvf_error("ucx connector: invalid config");
        return KVF_ERR_INVALID_PARAM;
    }
    conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    KVF_OWNER_SET(&conn->leader);
    pthread_mutex_init(&conn->lock, NULL);
    snprintf(conn->engine_id, sizeof(conn->engine_id), "%s", config->engine_id);
    conn->role = config->role;
    conn->tp = config->tp_size;
    conn->cfg = *config->cfg;
    if ((config->field_mask & KVF_CONNECTOR_CONFIG_FIELD_MODEL_DIGEST) &&
        (config->model_digest != NULL)) {
        conn->model_digest = *config->model_digest;   /* into every rank's metadata */
    }
    conn->timeout_ms = (config->field_mask & KVF_CONNECTOR_CONFIG_FIELD_TIMEOUT_MS) ?
                       config->timeout_ms : 5000;
    conn->batch_descs = (config->field_mask & KVF_CONNECTOR_CONFIG_FIELD_BATCH_DESCS) ?
                        config->batch_descs : 0;
    conn->plan_flags = (config->field_mask & KVF_CONNECTOR_CONFIG_FIELD_PLAN_FLAGS) ?
                       config->plan_flags : 0;
    conn->path = (config->field_mask & KVF_CONNECTOR_CONFIG_FIELD_PATH) ? config->path :
                 KVF_CONNECTOR_PATH_AUTO;
    snprintf(conn->host, sizeof(conn->host), "%s",
             ((config->field_mask & KVF_CONNECTOR_CONFIG_FIELD_LISTEN) &&
              (config->listen_host != NULL)) ? config->listen_host : "127.0.0.1");
    conn->port = (config->field_mask & KVF_CONNECTOR_CONFIG_FIELD_LISTEN) ?
                 config->listen_port : 0;
    conn->progress_thread = (config->field_mask & KVF_CONNECTOR_CONFIG_FIELD_PROGRESS) &&
                            config->progress_thread &&
                            (config->role == KVF_CONNECTOR_ROLE_PREFILL);
    /* non-zero, from the kernel's CSPRNG: two processes, even started in the same
     * nanosecond with the same pid in two containers, draw different ones */
    status = kvf_random_nonzero_u64("ucx connector incarnation", &conn->incarnation);
    if (status != KVF_OK) {
        goto err;
    }
    conn->ranks = calloc((size_t)conn->tp, sizeof(*conn->ranks));
    conn->layout = malloc(sizeof(*conn->layout));
    if ((conn->ranks == NULL) || (conn->layout == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto err;
    }
    status = kvf_cache_layout_build(&conn->cfg, conn->layout);
    if (status != KVF_OK) {
        goto err;
    }
    if (conn->role == KVF_CONNECTOR_ROLE_DECODE) {
        status = kvf_side_channel_client_create(conn->engine_id, conn->timeout_ms,
                                                &conn->client);
        if (status != KVF_OK) {
            goto err;
        }
    }
    *conn_p = conn;
    return KVF_OK;

err:
    kvf_conn_destroy(conn);
    return status;
}

/* register_pool (@a alloc_p NULL: @a pool->base given) or alloc_pool (*alloc_p receives it) */
static kvf_status_t kvf_conn_add_pool(kvf_connector_h conn, const kvf_connector_pool_t *pool,
                                      void **alloc_p)
{
    void *base = (pool != NULL) ? pool->base : NULL;
    kvf_conn_rank_t *rk;
    kvf_ucx_agent_params_t ap;
    kvf_rank_meta_t *m;
    kvf_xfer_mem_type_t mem_type;
    char name[64];
    kvf_status_t status;

    if ((pool == NULL) || (pool->tp_rank < 0) || (pool->tp_rank >= conn->tp) ||
        ((base == NULL) == (alloc_p == NULL)) || (pool->num_blocks < 1) ||
        (kvf_conn_pool_device(conn, pool, &mem_type) != KVF_OK)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if ((alloc_p != NULL) && (pool->device.kind != KVF_DEVICE_CPU)) {
        kvf_error("ucx connector: alloc_pool allocates host memory, not on %s",
                  kvf_device_kind_name(pool->device.kind));
        return KVF_ERR_UNSUPPORTED;
    }
    KVF_CONN_CHECK_RANK(conn, pool->tp_rank, "register_pool");
    rk = &conn->ranks[pool->tp_rank];
    if (rk->registered) {
        return KVF_ERR_BUSY;
    }
    status = kvf_rank_geometry_compute(&conn->cfg, &pool->params, conn->tp, pool->tp_rank,
                                       &rk->geom);
    if (status != KVF_OK) {
        return status;
    }
    if ((uint64_t)pool->len != (uint64_t)pool->num_blocks * (uint64_t)conn->layout->slots *
                               rk->geom.page_size) {
        kvf_error("ucx connector: rank %d pool of %zu bytes is not num_blocks*slots*page_size "
                  "= %lld*%d*%zu", pool->tp_rank, pool->len, (long long)pool->num_blocks,
                  conn->layout->slots, rk->geom.page_size);
        return KVF_ERR_INVALID_PARAM;
    }
    rk->meta = calloc(1, sizeof(*rk->meta));
    if (rk->meta == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    snprintf(name, sizeof(name), "%s rank %d",
             (conn->role == KVF_CONNECTOR_ROLE_PREFILL) ? "prefill" : "decode", pool->tp_rank);
    memset(&ap, 0, sizeof(ap));
    ap.field_mask = KVF_UCX_AGENT_PARAM_FIELD_NAME | KVF_UCX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                    KVF_UCX_AGENT_PARAM_FIELD_ACCESS | KVF_UCX_AGENT_PARAM_FIELD_MEM_TYPE;
    ap.name = name;
    ap.mem_type = mem_type;   /* device pools: the agent sets what UCX needs for them */
    ap.timeout_ms = conn->timeout_ms;
    /* prefill pools are read by decode; decode pools by nobody (no rkey is packed) */
    ap.access = (conn->role == KVF_CONNECTOR_ROLE_PREFILL) ? KVF_UCX_ACCESS_REMOTE_READ :
                KVF_UCX_ACCESS_LOCAL;
    status = kvf_ucx_agent_create(&ap, &rk->agent);
    if (status != KVF_OK) {
        goto err_free_meta;
    }
    status = (alloc_p != NULL) ?
             kvf_ucx_agent_mem_alloc(rk->agent, pool->len, &base, &rk->region) :
             kvf_ucx_agent_mem_register_type(rk->agent, base, pool->len, mem_type, &rk->region);
    if (status != KVF_OK) {
        goto err_destroy_agent;
    }
    m = rk->meta;
    snprintf(m->engine_id, sizeof(m->engine_id), "%s", conn->engine_id);
    m->protocol_version = KVF_XFER_PROTOCOL_VERSION;
    m->model_fingerprint = kvf_model_config_fingerprint(&conn->cfg);
    kvf_rank_meta_set_window(m, &conn->cfg);
    m->tp_rank = pool->tp_rank;
    m->tp_size = conn->tp;
    m->block_size = rk->geom.block_size;
    m->kernel_block_size = rk->geom.kernel_block_size;
    m->page_size = rk->geom.page_size;
    m->slots = conn->layout->slots;
    m->num_blocks = pool->num_blocks;
    m->kv_dtype = rk->geom.kv_dtype;
    m->conv_dtype = rk->geom.conv_dtype;
    m->ssm_dtype = rk->geom.ssm_dtype;
    m->user_block_size = pool->params.user_block_size;
    m->align = pool->params.align;
    m->kv_layout = rk->geom.kv_layout;
    snprintf(m->layout_tag, sizeof(m->layout_tag), "%s", KVF_LAYOUT_TAG_HND);
    m->incarnation = conn->incarnation;
    snprintf(m->model_digest, sizeof(m->model_digest), "%s", conn->model_digest.hex);
    snprintf(m->model_path, sizeof(m->model_path), "%s", conn->model_digest.path);
    m->num_regions = 1;
    status = kvf_ucx_agent_region_meta(rk->agent, rk->region, &m->regions[0]);
    if (status == KVF_OK) {
        status = kvf_ucx_agent_worker_address(rk->agent, m->worker_addr, sizeof(m->worker_addr),
                                              &m->worker_addr_len);
    }
    if (status == KVF_OK) {
        status = kvf_conn_pool_stream(conn, rk, pool);   /* the pool's device, its stream */
    }
    if (status == KVF_OK) {
        kvf_conn_ipc_export(conn, rk, pool);   /* prefill CUDA pools: the same-node path */
    }
    if (status != KVF_OK) {
        goto err_destroy_agent;
    }
    rk->base = base;
    rk->len = pool->len;
    rk->num_blocks = pool->num_blocks;
    pthread_mutex_lock(&conn->lock);
    rk->registered = true;
    pthread_mutex_unlock(&conn->lock);
    if (alloc_p != NULL) {
        *alloc_p = base;
    }
    return KVF_OK;

err_destroy_agent:
    kvf_ucx_agent_destroy(rk->agent);
    rk->agent = NULL;
err_free_meta:
    free(rk->meta);
    rk->meta = NULL;
    return status;
}

static kvf_status_t kvf_conn_register_pool(kvf_connector_h conn, const kvf_connector_pool_t *pool)
{
    return kvf_conn_add_pool(conn, pool, NULL);
}

static kvf_status_t kvf_conn_alloc_pool(kvf_connector_h conn, const kvf_connector_pool_t *pool,
                                        void **base_p)
{
    return (base_p == NULL) ? KVF_ERR_INVALID_PARAM : kvf_conn_add_pool(conn, pool, base_p);
}

bool kvf_conn_all_registered(kvf_connector_h conn)
{
    bool all = true;
    pthread_mutex_lock(&conn->lock);
    for (int r = 0; r < conn->tp; ++r) {
        all = all && conn->ranks[r].registered;
    }
    pthread_mutex_unlock(&conn->lock);
    return all;
}

static kvf_status_t kvf_conn_get_metadata(kvf_connector_h conn, int tp_rank, void *buf,
                                          size_t cap, size_t *len_p)
{
    kvf_handshake_reply_t reply;
    uint8_t *packed;
    size_t len;
    kvf_status_t status;

    if ((tp_rank < 0) || (tp_rank >= conn->tp) || !conn->ranks[tp_rank].registered) {
        return KVF_ERR_INVALID_PARAM;
    }
    KVF_CONN_CHECK_RANK(conn, tp_rank, "get_metadata");
    memset(&reply, 0, sizeof(reply));
    reply.accepted = true;
    snprintf(reply.engine_id, sizeof(reply.engine_id), "%s", conn->engine_id);
    reply.num_ranks = 1;
    reply.ranks = conn->ranks[tp_rank].meta;
    status = kvf_handshake_reply_pack(&reply, &packed, &len);
    if (status != KVF_OK) {
        return status;
    }
    if (len > cap) {
        free(packed);
        return KVF_ERR_NO_RESOURCE;
    }
    memcpy(buf, packed, len);
    *len_p = len;
    free(packed);
    return KVF_OK;
}

static kvf_status_t kvf_conn_serve(kvf_connector_h conn, int *port_p)
{
    kvf_side_channel_params_t sp;
    kvf_rank_meta_t *metas;
    kvf_status_t status;

    KVF_CONN_CHECK_LEADER(conn, "serve");
    if ((conn->role != KVF_CONNECTOR_ROLE_PREFILL) || (conn->server != NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (!kvf_conn_all_registered(conn)) {
        kvf_error("ucx connector: serve before every rank registered its pool");
        return KVF_ERR_BUSY;
    }
    metas = calloc((size_t)conn->tp, sizeof(*metas));
    if (metas == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (int r = 0; r < conn->tp; ++r) {
        metas[r] = *conn->ranks[r].meta;
    }
    memset(&sp, 0, sizeof(sp));
    sp.field_mask = KVF_SIDE_CHANNEL_PARAM_FIELD_HOST | KVF_SIDE_CHANNEL_PARAM_FIELD_PORT;
    sp.host = conn->host;
    sp.port = conn->port;
    sp.engine_id = conn->engine_id;
    sp.ranks = metas;
    sp.num_ranks = conn->tp;
    sp.lease_func = (conn->lease_func != NULL) ? kvf_conn_lease_verify : NULL;
    sp.lease_arg = conn;
    status = kvf_side_channel_server_start(&sp, &conn->server);
    free(metas);
    if ((status == KVF_OK) && conn->progress_thread) {
        status = kvf_conn_progress_start(conn);
        if (status != KVF_OK) {
            kvf_side_channel_server_stop(conn->server);
            conn->server = NULL;
        }
    }
    if ((status == KVF_OK) && (port_p != NULL)) {
        *port_p = kvf_side_channel_server_port(conn->server);
    }
    return status;
}

/* ---- requests --------------------------------------------------------- */

static void kvf_conn_req_free(kvf_connector_h conn, kvf_connector_req_h req)
{
    if (req == NULL) {
        return;
    }
    kvf_conn_ipc_req_free(conn, req);   /* a same-node gather drained first */
    if (req->holds_peers) {
        conn->ranks[req->rank].peers_busy[req->engine]--;
        conn->ranks[req->rank].peers_used_ns[req->engine] = kvf_time_now_ns();
    }
    if (req->holds_engine) {
        pthread_mutex_lock(&conn->lock);
        conn->engines[req->engine].inflight--;   /* idle again: may be evicted */
        pthread_mutex_unlock(&conn->lock);
    }
    free(req->zero_off);
    free(req->zero_len);
    for (int i = 0; (req->digests != NULL) && (req->plan != NULL) &&
                    (i < req->plan->num_ranks); ++i) {
        free(req->digests[i].ranges);
    }
    free(req->digests);
    if ((req->plan != NULL) && (req->batches != NULL)) {   /* none: a template pull */
        for (int i = 0; i < req->plan->num_ranks; ++i) {
            kvf_ucx_batch_release(req->batches[i]);
        }
    }
    kvf_xfer_plan_destroy(req->plan);
    free(req->batches);
    free(req->posted);
    free(req->src);
    free(req->pull_copy);
    free(req);
}

static kvf_status_t kvf_conn_peer(kvf_connector_h conn, kvf_conn_rank_t *rk, int engine,
                                  int remote, kvf_ucx_peer_h *peer_p)
{
    const kvf_conn_engine_t *e = &conn->engines[engine];
    kvf_status_t status;

    if ((rk->peers[engine] != NULL) && (rk->peers_gen[engine] != e->gen)) {
        /* the slot was evicted and refilled since: those endpoints are another
         * engine's, maybe of a process that is gone: closed without a flush */
        for (int p = 0; p < rk->peers_tp[engine]; ++p) {
            kvf_ucx_peer_abort(rk->peers[engine][p]);
        }
        free(rk->peers[engine]);
        rk->peers[engine] = NULL;
    }
    if ((rk->peers[engine] != NULL) && (rk->peers_busy[engine] == 0) &&
        (kvf_time_now_ns() - rk->peers_used_ns[engine] > KVF_CONN_EP_IDLE_MS * 1000000ull)) {
        /* idle: maybe stale after a link outage (KVF_CONN_EP_IDLE_MS); nothing is
         * posted on them, so a forced close loses nothing */
        kvf_log(KVF_LOG_DEBUG, KVF_SUB_XFER, "ucx connector %s rank %d: endpoints to %s idle"
                " over %d ms: reconnecting", conn->engine_id, (int)(rk - conn->ranks),
                e->engine_id, KVF_CONN_EP_IDLE_MS);
        for (int p = 0; p < rk->peers_tp[engine]; ++p) {
            kvf_ucx_peer_abort(rk->peers[engine][p]);
        }
        free(rk->peers[engine]);
        rk->peers[engine] = NULL;
        rk->reconnects++;
    }
    if (rk->peers[engine] == NULL) {
        rk->peers[engine] = calloc((size_t)e->tp, sizeof(kvf_ucx_peer_h));
        if (rk->peers[engine] == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        rk->peers_tp[engine] = e->tp;
        rk->peers_gen[engine] = e->gen;
        rk->peers_used_ns[engine] = kvf_time_now_ns();   /* fresh: not idle */
    }
    if ((rk->peers[engine][remote] != NULL) &&
        (kvf_ucx_peer_status(rk->peers[engine][remote]) != KVF_OK)) {
        /* a failed endpoint stays failed: reconnect */
        kvf_ucx_peer_destroy(rk->peers[engine][remote]);
        rk->peers[engine][remote] = NULL;
    }
    if (rk->peers[engine][remote] == NULL) {
        status = kvf_ucx_peer_connect(rk->agent, &e->ranks[remote],
                                      &rk->peers[engine][remote]);
        if (status != KVF_OK) {
            return status;
        }
    }
    *peer_p = rk->peers[engine][remote];
    return KVF_OK;
}

/* Post the next window of prefill rank plan @a i (all of it without batch_descs). */
static kvf_status_t kvf_conn_post_next(kvf_connector_h conn, kvf_conn_rank_t *rk,
                                       kvf_connector_req_h req, int i)
{
    const kvf_xfer_rank_plan_t *rp = &req->plan->ranks[i];
    size_t left = rp->num_descs - req->posted[i];
    size_t n = ((conn->batch_descs > 0) && (left > conn->batch_descs)) ? conn->batch_descs : left;
    kvf_status_t status;

    kvf_ucx_batch_release(req->batches[i]);
    req->batches[i] = NULL;
    status = kvf_ucx_xfer_post(rk->agent, rk->peers[req->engine][rp->remote_rank],
                               KVF_UCX_OP_GET, rk->region, 0, rp->descs + req->posted[i], n,
                               &req->batches[i]);
    if (status == KVF_OK) {
        req->posted[i] += n;
    }
    return status;
}

/* The plan of @a pp into @a req: its zero ranges and source ranks, the GET bookkeeping. */
static kvf_status_t kvf_conn_plan_sources(kvf_connector_req_h req,
                                          const kvf_xfer_plan_params_t *pp)
{
    kvf_status_t status = kvf_xfer_plan_create(pp, &req->plan);   /* checks every id, range */

    if (status != KVF_OK) {
        return status;
    }
    req->batches = calloc((size_t)req->plan->num_ranks + 1, sizeof(*req->batches));
    req->posted = calloc((size_t)req->plan->num_ranks + 1, sizeof(*req->posted));
    req->src = calloc((size_t)req->plan->num_sources + 1, sizeof(*req->src));
    req->zero_off = calloc(req->plan->num_zero + 1, sizeof(*req->zero_off));
    req->zero_len = calloc(req->plan->num_zero + 1, sizeof(*req->zero_len));
    if ((req->batches == NULL) || (req->posted == NULL) || (req->src == NULL) ||
        (req->zero_off == NULL) || (req->zero_len == NULL)) {
        return KVF_ERR_NO_MEMORY;
    }
    for (size_t z = 0; z < req->plan->num_zero; ++z) {
        req->zero_off[z] = (size_t)req->plan->zero[z].off;
        req->zero_len[z] = (size_t)req->plan->zero[z].len;
    }
    /* the plan derived them (kvf_tp_source_ranks()); not derived again here */
    req->nsrc = req->plan->num_sources;
    memcpy(req->src, req->plan->sources, (size_t)req->nsrc * sizeof(*req->src));
    return KVF_OK;
}

static kvf_status_t kvf_conn_start_pull(kvf_connector_h conn, int tp_rank,
                                        const kvf_connector_pull_t *pull,
                                        kvf_connector_req_h *req_p)
{
    kvf_xfer_group_blocks_t groups[KVF_MAX_KV_GROUPS];
    kvf_xfer_plan_params_t pp;
    kvf_connector_req_h req;
    kvf_conn_rank_t *rk;
    const kvf_conn_engine_t *e;
    kvf_status_t status;
    uint64_t started_ns = kvf_time_now_ns();
    int engine;

    if ((conn->role != KVF_CONNECTOR_ROLE_DECODE) || (tp_rank < 0) || (tp_rank >= conn->tp) ||
        (pull == NULL) || (pull->engine_id == NULL) ||
        (pull->num_groups != conn->layout->num_groups) || !conn->ranks[tp_rank].registered) {
        return KVF_ERR_INVALID_PARAM;
    }
    KVF_CONN_CHECK_RANK(conn, tp_rank, "start_pull");
    if ((pull->plan_flags & ~(uint32_t)KVF_XFER_PLAN_FLAG_WINDOW) != 0) {
        kvf_error("ucx connector: pull plan_flags 0x%x has bits other than the window's (0x%x)",
                  (unsigned)pull->plan_flags, (unsigned)KVF_XFER_PLAN_FLAG_WINDOW);
        return KVF_ERR_INVALID_PARAM;
    }
    rk = &conn->ranks[tp_rank];
    req = calloc(1, sizeof(*req));
    if (req == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&conn->lock);
    engine = (pull->peer != NULL) ?
             kvf_conn_find_engine_locked(conn, pull->engine_id, pull->peer->host,
                                         pull->peer->port, pull->peer->incarnation) :
             kvf_conn_find_engine_locked(conn, pull->engine_id, NULL, 0, 0);
    if (engine >= 0) {
        /* in flight from here to req free: the entry is not evicted meanwhile */
        conn->engines[engine].inflight++;
        conn->engines[engine].last_used = ++conn->use_seq;
    }
    pthread_mutex_unlock(&conn->lock);
    if (engine < 0) {
        free(req);
        kvf_error("ucx connector: pull from engine %s before its handshake (or after it was "
                  "forgotten or evicted)", pull->engine_id);
        return KVF_ERR_NOT_FOUND;
    }
    e = &conn->engines[engine];
    req->holds_engine = true;
    req->started_ns = started_ns;
    req->rank = tp_rank;
    req->engine = engine;
    req->status = KVF_INPROGRESS;
    snprintf(req->request_id, sizeof(req->request_id), "%s",
             (pull->request_id != NULL) ? pull->request_id : "");

    kvf_conn_plan_params(conn, tp_rank, e, pull, &pp, groups);
    /* same node with templates: the request's jobs, no plan (kvf_connector_ipc.c) */
    status = kvf_conn_ipc_jobs(conn, rk, req, &pp, pull);
    if ((status == KVF_OK) && (req->ipc_jobs == 0)) {
        status = kvf_conn_plan_sources(req, &pp);
    }
    if (status != KVF_OK) {
        goto err;
    }
    for (int i = 0; (i < req->nsrc) && (status == KVF_OK); ++i) {
        kvf_ucx_peer_h peer;
        status = kvf_conn_peer(conn, rk, engine, req->src[i], &peer);
    }
    if (status != KVF_OK) {
        goto err;
    }
    rk->peers_busy[engine]++;
    rk->peers_used_ns[engine] = kvf_time_now_ns();
    req->holds_peers = true;
    req->planned_ns = kvf_time_now_ns();
    req->deadline_ns = req->planned_ns + (uint64_t)conn->timeout_ms * 1000000ull;
    /* same node: one gather (of the jobs, or of the plan's op list), no GETs */
    status = (req->ipc_jobs > 0) ? kvf_conn_ipc_run_jobs(conn, rk, req) :
             kvf_conn_ipc_start(conn, rk, req);
    if (status != KVF_OK) {
        goto err;
    }
    for (int i = 0; !req->ipc && (i < req->plan->num_ranks); ++i) {
        status = kvf_conn_post_next(conn, rk, req, i);
        if (status != KVF_OK) {
            /* earlier batches are in flight: report through poll, release drains them */
            req->status = status;
            break;
        }
    }
    req->posted_ns = kvf_time_now_ns();
    *req_p = req;
    return KVF_OK;

err:
    kvf_conn_req_free(conn, req);
    return status;
}

static kvf_status_t kvf_conn_poll(kvf_connector_h conn, int tp_rank, kvf_connector_req_h req)
{
    kvf_conn_rank_t *rk;
    bool pending = false;
    unsigned progressed;

    if ((req == NULL) || (req->rank != tp_rank)) {
        return KVF_ERR_INVALID_PARAM;
    }
    KVF_CONN_CHECK_RANK(conn, tp_rank, "poll");
    if (req->status != KVF_INPROGRESS) {
        return req->status;
    }
    if (req->ipc) {
        return kvf_conn_ipc_poll(conn, req);
    }
    rk = &conn->ranks[tp_rank];
    progressed = kvf_ucx_agent_progress(rk->agent);
    for (int i = 0; i < req->plan->num_ranks; ++i) {
        kvf_status_t s = kvf_ucx_batch_test(req->batches[i]);
        if ((s == KVF_OK) && (req->posted[i] < req->plan->ranks[i].num_descs)) {
            s = kvf_conn_post_next(conn, rk, req, i);   /* the next window */
            s = (s == KVF_OK) ? KVF_INPROGRESS : s;
        }
        if (s == KVF_INPROGRESS) {
            pending = true;
        } else if (s != KVF_OK) {
            req->status = s;
            return s;
        }
    }
    if (pending) {
        if (progressed == 0) {
            /* idle: let the peer's threads run. Without a one-sided transport
             * (GETs over shared-memory AM emulation, TCP) prefill must progress
             * to serve our GETs; a spinning poll starves it on few cores. */
            sched_yield();
        }
        if (kvf_time_now_ns() > req->deadline_ns) {
            kvf_error("ucx connector: request %s on rank %d timed out after %u ms",
                      req->request_id, tp_rank, conn->timeout_ms);
            req->status = KVF_ERR_PEER_TIMEOUT;
        }
        return req->status;
    }
    req->landed_ns = kvf_time_now_ns();
    /* the untransferred tails, on whatever device holds the pool (its stream); that device
     * current first: a kernel goes into a stream only from its device (decode's leader
     * polls every rank's pull, rank r's pool on cuda:N+r; the CPU: nothing to do) */
    req->status = (kvf_device_bind(&conn->ranks[req->rank].device) == KVF_KERN_OK) ?
                  kvf_conn_zero_tails(conn, req) : KVF_ERR_CUDA;
    if (req->status != KVF_OK) {
        return req->status;
    }
    req->done_ns = kvf_time_now_ns();
    req->status = KVF_OK;
    return KVF_OK;
}

static kvf_status_t kvf_conn_release_common(kvf_connector_h conn, int tp_rank,
                                            kvf_connector_req_h req, bool notify)
{
    kvf_conn_rank_t *rk;
    kvf_status_t status = KVF_OK;

    if ((req == NULL) || (req->rank != tp_rank)) {
        return KVF_ERR_INVALID_PARAM;
    }
    KVF_CONN_CHECK_RANK(conn, tp_rank, "notify_release");
    rk = &conn->ranks[tp_rank];
    /* drain: never release blocks a GET may still be reading (§9) */
    while (kvf_conn_poll(conn, tp_rank, req) == KVF_INPROGRESS) {
    }
    if (req->status != KVF_OK) {
        /* Failed or timed out with GETs possibly still posted: force-close
         * the endpoints so none can land after the caller reuses the local
         * blocks, and send no release (prefill may be dead or stuck; its
         * lease frees the blocks there). The next pull reconnects. */
        for (int i = 0; (rk->peers[req->engine] != NULL) && (i < req->nsrc); ++i) {
            kvf_ucx_peer_abort(rk->peers[req->engine][req->src[i]]);
            rk->peers[req->engine][req->src[i]] = NULL;
        }
        status = req->status;
        kvf_conn_req_free(conn, req);
        return status;
    }
    for (int i = 0; notify && (i < req->nsrc); ++i) {
        kvf_ucx_peer_h peer = rk->peers[req->engine][req->src[i]];
        kvf_xfer_notification_t n;
        uint8_t *buf;
        size_t len;
        kvf_status_t s;

        memset(&n, 0, sizeof(n));
        snprintf(n.request_id, sizeof(n.request_id), "%s", req->request_id);
        snprintf(n.engine_id, sizeof(n.engine_id), "%s", conn->engine_id);
        n.rank = tp_rank;
        n.status = req->status;
        s = kvf_xfer_notification_pack(&n, &buf, &len);
        if (s == KVF_OK) {
            s = kvf_ucx_notify_send(rk->agent, peer, buf, len);
            free(buf);
        }
        status = (status == KVF_OK) ? s : status;   /* the prefill lease covers a lost one */
    }
    kvf_conn_req_free(conn, req);
    return status;
}

static kvf_status_t kvf_conn_notify_release(kvf_connector_h conn, int tp_rank,
                                            kvf_connector_req_h req)
{
    return kvf_conn_release_common(conn, tp_rank, req, true);
}

static kvf_status_t kvf_conn_finish_pull(kvf_connector_h conn, int tp_rank,
                                         kvf_connector_req_h req)
{
    return kvf_conn_release_common(conn, tp_rank, req, false);
}

static kvf_status_t kvf_conn_poll_release(kvf_connector_h conn, int tp_rank, uint32_t timeout_ms,
                                          char *request_id, size_t id_len, int *decode_rank_p,
                                          kvf_status_t *status_p)
{
    uint8_t buf[4096];
    size_t len;
    kvf_xfer_notification_t n;
    kvf_status_t status;

    if ((tp_rank < 0) || (tp_rank >= conn->tp) || !conn->ranks[tp_rank].registered) {
        return KVF_ERR_INVALID_PARAM;
    }
    KVF_CONN_CHECK_RANK(conn, tp_rank, "poll_release");
    if (conn->progress != NULL) {
        return KVF_ERR_UNSUPPORTED;   /* the progress thread owns the worker */
    }
    status = kvf_ucx_notify_recv(conn->ranks[tp_rank].agent, buf, sizeof(buf), &len,
                                 timeout_ms);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_xfer_notification_unpack(buf, len, &n);
    if (status != KVF_OK) {
        kvf_warn("ucx connector: malformed release notification (%zu bytes) ignored", len);
        return status;
    }
    snprintf(request_id, id_len, "%s", n.request_id);
    *decode_rank_p = n.rank;
    *status_p = n.status;
    return KVF_OK;
}

static uint64_t kvf_conn_incarnation(kvf_connector_h conn)
{
    return conn->incarnation;
}

static kvf_status_t kvf_conn_wait_fds(kvf_connector_h conn, int *fds, int cap, int *n_p)
{
    int n = 0;

    KVF_CONN_CHECK_LEADER(conn, "wait_fds");
    kvf_conn_check_every_rank(conn, "connector wait_fds (arms every rank's worker: the leader "
                              "must drive every rank)");
    if (conn->progress != NULL) {
        return KVF_ERR_UNSUPPORTED;   /* the progress thread owns the workers */
    }
    for (int r = 0; r < conn->tp; ++r) {
        kvf_conn_rank_t *rk = &conn->ranks[r];
        kvf_status_t status;
        if (!rk->registered) {
            continue;
        }
        if (n == cap) {
            return KVF_ERR_NO_RESOURCE;
        }
        status = kvf_ucx_agent_event_fd(rk->agent, &fds[n]);
        if (status == KVF_OK) {
            status = kvf_ucx_agent_arm(rk->agent);
        }
        if (status != KVF_OK) {
            return status;      /* BUSY: work pending; other errors: caller spins */
        }
        ++n;
    }
    *n_p = n;
    return KVF_OK;
}

static kvf_status_t kvf_conn_req_stats(kvf_connector_h conn, int tp_rank,
                                       kvf_connector_req_h req, kvf_connector_stats_t *stats_p)
{
    if ((req == NULL) || (req->rank != tp_rank) || (stats_p == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    KVF_CONN_CHECK_RANK(conn, tp_rank, "req_stats");
    if (kvf_conn_req_plan(conn, req) == KVF_OK) {   /* a template pull's: built here */
        stats_p->bytes = req->plan->total_bytes;
        stats_p->descriptors = req->plan->total_descs;
        stats_p->remote_ranks = req->plan->num_ranks;
        stats_p->zero_bytes = req->plan->zero_bytes;
    }
    stats_p->posted_ns = req->posted_ns;
    stats_p->started_ns = req->started_ns;
    stats_p->planned_ns = req->planned_ns;
    stats_p->landed_ns = req->landed_ns;
    stats_p->done_ns = req->done_ns;
    kvf_conn_ipc_stats(conn, req, stats_p);
    return KVF_OK;
}

static const kvf_connector_ops_t kvf_connector_ucx = {
    .abi_version    = KVF_CONNECTOR_ABI,
    .name           = "ucx",
    .create         = kvf_conn_create,
    .destroy        = kvf_conn_destroy,
    .register_pool  = kvf_conn_register_pool,
    .get_metadata   = kvf_conn_get_metadata,
    .serve          = kvf_conn_serve,
    .handshake      = kvf_conn_handshake,
    .start_pull     = kvf_conn_start_pull,
    .poll           = kvf_conn_poll,
    .notify_release = kvf_conn_notify_release,
    .poll_release   = kvf_conn_poll_release,
    .req_stats      = kvf_conn_req_stats,
    .forget_engine  = kvf_conn_forget_engine,
    .incarnation    = kvf_conn_incarnation,
    .remote_incarnation = kvf_conn_remote_incarnation,
    .wait_fds       = kvf_conn_wait_fds,
    .set_lease_handler = kvf_conn_set_lease_handler,
    .lease          = kvf_conn_lease,
    .finish_pull    = kvf_conn_finish_pull,
    .alloc_pool     = kvf_conn_alloc_pool,
    .handshake_start = kvf_conn_handshake_start,
    .handshake_poll = kvf_conn_handshake_poll,
    .lease_start    = kvf_conn_lease_start,
    .lease_poll     = kvf_conn_lease_poll,
    .cancel         = kvf_conn_cancel,
    .side_wait      = kvf_conn_side_wait,
    .req_digests    = kvf_conn_req_digests,
};

const kvf_connector_ops_t *kvf_connector_ucx_ops(void)
{
    return &kvf_connector_ucx;
}
