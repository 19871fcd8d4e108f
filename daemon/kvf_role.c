/*
 * Shared setup of the role daemons. Kept to what is truly identical in
 * both roles; request handling stays in prefill/ and decode/.
 *
 * Design (--device cuda[:N]): the device is opened before anything else, so
 * a missing GPU fails in milliseconds with the CUDA error; the engine then
 * puts the weights and each rank's pool on cuda:N+r (kvf_device_alloc, the
 * TP runner's own allocation) and the pools are handed to the connector with
 * register_pool and their device, which maps them as CUDA memory. Rejected:
 * letting UCX allocate GPU pools (alloc_pool, as for host pools): the runner
 * takes foreign memory only on the CPU, and cudaMalloc'd memory is what UCX's
 * cuda_ipc and CUDA IPC handles are made for. Two instances on one GPU need
 * nothing special: each process has its own pools there.
 */
#include "kvf_role.h"
#include "kvf_daemon_http.h"
#include "kvf_log.h"
#include "kvf_time.h"
#include "kvf_fault.h"
#include "kvf_connector_ucx.h"
#include "kvf_fingerprint.h"
#include "kvf_tok_digest.h"
#include "kvf_zmq_auth.h"
#include "kvf_model.h"
#include "kvf_kern_status.h"
#include "kvf_kv_events.h"

#include <stdlib.h>
#include <string.h>

/* --device's syntax: "cpu", "cuda" (= cuda:0) or "cuda:N" (opened by kvf_role_start). */
static bool kvf_role_device_parse(const char *value)
{
    char *end = NULL;
    long n = 0;

    if (strcmp(value, "cpu") == 0) {
        return true;
    }
    if ((strncmp(value, "cuda", 4) != 0) || ((value[4] != '\0') && (value[4] != ':'))) {
        return false;
    }
    if (value[4] == ':') {
        if ((value[5] < '0') || (value[5] > '9')) {
            return false;
        }
        n = strtol(value + 5, &end, 10);
        if ((*end != '\0') || (n > 1023)) {
            return false;
        }
    }
    return true;
}

/* The KV event flags parse (each error logged, naming the flag and key). */
static bool kvf_role_events_flags_ok(const kvf_role_config_t *params)
{
    kvf_kv_events_config_t kc;

    return kvf_kv_events_config_parse(params->kv_events_config, params->kv_events_endpoint,
                                      params->kv_events_replay, params->kv_events_format,
                                      &kc) == KVF_OK;
}

kvf_status_t kvf_role_check_flags(const kvf_role_config_t *params)
{
    if (params->model[0] == '\0') {
        kvf_error("--model is required: a folder with config.json and model.safetensors");
    } else if ((params->tp < 1) || (params->tp > KVF_ROLE_MAX_TP)) {
        kvf_error("--tp %d must be in 1..%d", params->tp, KVF_ROLE_MAX_TP);
    } else if (params->num_blocks < 1) {
        kvf_error("--num-blocks %d must be at least 1", params->num_blocks);
    } else if (kvf_engine_opts_block_sizes(params->block_size, 0) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;   /* logged */
    } else if (params->max_batch_tokens < 1) {
        kvf_error("--max-batch-tokens %d must be at least 1", params->max_batch_tokens);
    } else if ((params->engine_id[0] == '\0') || (strlen(params->engine_id) >= 64)) {
        kvf_error("--engine-id '%s' must be 1..63 bytes", params->engine_id);
    } else if (params->xfer_timeout_ms <= 0) {
        kvf_error("--xfer-timeout must be positive");
    } else if (params->drain_timeout_ms < 0) {
        kvf_error("--drain-timeout must not be negative");
    } else if ((strcmp(params->pool_alloc, "ucx") != 0) &&
               (strcmp(params->pool_alloc, "heap") != 0)) {
        kvf_error("--pool-alloc must be ucx or heap, not '%s'", params->pool_alloc);
    } else if ((params->prefix_state_grid < 1) || (params->prefix_state_grid > 1 << 20)) {
        kvf_error("--prefix-state-grid %d must be in 1..%d tokens", params->prefix_state_grid,
                  1 << 20);
    } else if (!kvf_role_events_flags_ok(params)) {
        /* logged naming the flag and key */
    } else if (!kvf_role_device_parse(params->device)) {
        kvf_error("bad value '%s' for --device: cpu, cuda or cuda:N (N in 0..1023)",
                  params->device);
    } else {
        return KVF_OK;
    }
    return KVF_ERR_INVALID_PARAM;
}

kvf_status_t kvf_role_check_not_shorter(const char *a_flag, int64_t a_ms, const char *b_flag,
                                        int64_t b_ms, const char *consequence)
{
    if (a_ms >= b_ms) {
        return KVF_OK;
    }
    kvf_error("%s %lld ms is shorter than %s %lld ms: %s", a_flag, (long long)a_ms, b_flag,
              (long long)b_ms, consequence);
    return KVF_ERR_INVALID_PARAM;
}

kvf_status_t kvf_role_kv_dtype(const char *text, kvf_dtype_t *dtype_p)
{
    return kvf_engine_opts_dtype("kv-dtype", text, KVF_DTYPE_BF16, true, dtype_p);
}

/* The cache parameters both the engine and the connector derive the geometry from. */
static kvf_status_t kvf_role_cache_params(const kvf_role_config_t *params,
                                          const kvf_model_config_t *mc,
                                          kvf_cache_params_t *cache_p)
{
    kvf_cache_params_default(mc, cache_p);
    if (kvf_role_kv_dtype(params->kv_dtype, &cache_p->kv_dtype) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    cache_p->user_block_size = params->block_size;
    if (kvf_engine_opts_kv_layout(params->kv_layout, &cache_p->kv_layout) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    kvf_info("kv layout %s (attention blocks)", kvf_kv_layout_name((int)cache_p->kv_layout));
    return KVF_OK;
}

/* POOL_ALLOC ucx: each rank's page pool is the connector's (alloc_pool). */
typedef struct {
    const kvf_connector_ops_t *ops;
    kvf_connector_h            conn;
    kvf_cache_params_t         cache;
} kvf_role_pool_alloc_t;

static kvf_status_t kvf_role_pool_alloc(void *ctx, int rank, int num_blocks, size_t bytes,
                                        void **base_p)
{
    kvf_role_pool_alloc_t *a = ctx;
    kvf_connector_pool_t cp = {
        .tp_rank = rank, .base = NULL, .len = bytes, .num_blocks = num_blocks,
        .params = a->cache, .device = kvf_device_cpu(),
    };
    kvf_status_t status = a->ops->alloc_pool(a->conn, &cp, base_p);

    if (status != KVF_OK) {
        kvf_error("--pool-alloc ucx: the connector could not allocate rank %d's pool of %zu "
                  "bytes (%s); --pool-alloc heap uses malloc'd memory instead", rank, bytes,
                  kvf_status_str(status));
    }
    return status;
}

/* vLLM's KV events (kvf_kv_events.h): started with the engine, stopped after it. */
static kvf_kv_events_h kvf_role_events;

/* Start the publisher of @a params' KV event flags into @a ep (nothing when off). */
static kvf_status_t kvf_role_events_start(const kvf_role_config_t *params,
                                          const kvf_device_t *dev, kvf_engine_params_t *ep)
{
    kvf_kv_events_config_t kc;
    kvf_status_t status;

    status = kvf_kv_events_config_parse(params->kv_events_config, params->kv_events_endpoint,
                                        params->kv_events_replay, params->kv_events_format,
                                        &kc);
    if ((status != KVF_OK) || !kc.enabled) {
        return status;
    }
    if (!params->prefix_caching) {
        kvf_warn("KV events with --prefix-caching off: no block is ever cached, so only "
                 "AllBlocksCleared is published");
    }
    status = kvf_kv_events_create(&kc, (dev->kind == KVF_DEVICE_CPU) ? "CPU" : "GPU",
                                  &kvf_role_events);
    ep->prefix.event_fn = kvf_kv_events_push;
    ep->prefix.event_ctx = kvf_role_events;
    return status;
}

void kvf_role_events_stop(void)
{
    kvf_kv_events_destroy(kvf_role_events);
    kvf_role_events = NULL;
}

/* The model digest served (set at start, before the engine: it keys the prefix cache). */
static kvf_model_digest_t kvf_role_digest;

/* The engine, then its Mamba2 prompt scan on the engine's state grid: one value for the
 * scheduler's chunks, the prefix cache's checkpoints and the scan's rounding points
 * (kvf_model_set_state_grid: a cached state is the recompute's bits). */
static kvf_status_t kvf_role_engine_grid(const kvf_engine_params_t *ep, kvf_engine_h *engine_p)
{
    kvf_status_t status = kvf_engine_create(ep, engine_p);

    if (status == KVF_OK) {
        status = kvf_model_set_state_grid(kvf_tp_runner_model(kvf_engine_runner(*engine_p)),
                                          ep->prefix.state_grid);
        if (status != KVF_OK) {
            kvf_engine_destroy(*engine_p);
            *engine_p = NULL;
        }
    }
    return status;
}

static kvf_status_t kvf_role_engine_create(const kvf_role_config_t *params,
                                           const kvf_cache_params_t *cache,
                                           const kvf_device_t *dev,
                                           kvf_role_pool_alloc_t *alloc, kvf_engine_h *engine_p)
{
    kvf_engine_params_t ep;
    uint8_t digest[16];

    memset(&ep, 0, sizeof(ep));
    ep.field_mask = KVF_ENGINE_PARAM_FIELD_NUM_BLOCKS | KVF_ENGINE_PARAM_FIELD_CACHE |
                    KVF_ENGINE_PARAM_FIELD_MAX_BATCH_TOKENS | KVF_ENGINE_PARAM_FIELD_DEVICE;
    ep.device = *dev;   /* CUDA: weights and pools on cuda:N+r (kvf_model_load_device) */
    ep.model_dir = params->model;
    ep.tp_size = params->tp;
    ep.num_blocks = params->num_blocks;
    ep.cache = *cache;
    ep.max_batch_tokens = params->max_batch_tokens;
    if (alloc != NULL) {
        ep.field_mask |= KVF_ENGINE_PARAM_FIELD_POOL_ALLOC;
        ep.pool_alloc = kvf_role_pool_alloc;
        ep.pool_alloc_ctx = alloc;
    }
    ep.field_mask |= KVF_ENGINE_PARAM_FIELD_PREFIX;
    ep.prefix.enabled = params->prefix_caching;
    ep.prefix.state_grid = params->prefix_state_grid;
    ep.prefix.state_bytes = params->prefix_state_bytes;
    if (kvf_block_hash_digest_from_hex(kvf_role_digest.hex, digest) == KVF_OK) {
        ep.prefix.digest = digest;   /* the handshake's digest keys the cache too */
    }
    if (kvf_role_events_start(params, dev, &ep) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (params->test_no_block_zero) {
        ep.field_mask |= KVF_ENGINE_PARAM_FIELD_NO_ZERO;   /* the pool warns at create */
        ep.disable_zeroing = true;
    }
    return kvf_role_engine_grid(&ep, engine_p);
}

/* POOL_ALLOC heap, or a device: give the connector each rank's pool, once, at start-up (a
 * device pool is registered as CUDA memory: kvf_connector_pool_t.device). */
static kvf_status_t kvf_role_register_pools(kvf_engine_h engine, const kvf_cache_params_t *cache,
                                            const kvf_connector_ops_t *ops, kvf_connector_h conn)
{
    kvf_tp_runner_h runner = kvf_engine_runner(engine);

    for (int r = 0; r < kvf_tp_runner_tp_size(runner); ++r) {
        kvf_page_pool_h pool = kvf_tp_runner_pool(runner, r);
        kvf_connector_pool_t cp = {
            .tp_rank = r,
            .base = kvf_page_pool_base(pool),
            .len = kvf_page_pool_bytes(pool),
            .num_blocks = kvf_page_pool_num_blocks(pool),
            .params = *cache,
            .device = *kvf_page_pool_device(pool),
        };
        kvf_status_t status = ops->register_pool(conn, &cp);

        if (status != KVF_OK) {
            return status;
        }
    }
    return KVF_OK;
}

/* What this process serves, for its health replies (one model per process, set at start). */
static char kvf_role_tok_hex[KVF_TOK_DIGEST_HEX + 1];
static char kvf_role_device_names[KVF_ROLE_DEVICE_NAMES_MAX];

/* "cpu", or every rank's GPU in rank order: "cuda:0", "cuda:2,cuda:3" (as pools were placed). */
static void kvf_role_name_devices(kvf_engine_h engine, char *buf, size_t cap)
{
    kvf_tp_runner_h runner = kvf_engine_runner(engine);
    size_t len = 0;

    snprintf(buf, cap, "cpu");
    for (int r = 0; r < kvf_tp_runner_tp_size(runner); ++r) {
        const kvf_device_t *d = kvf_page_pool_device(kvf_tp_runner_pool(runner, r));
        int n;

        if (d->kind == KVF_DEVICE_CPU) {
            return;   /* one model: every rank alike */
        }
        n = snprintf(buf + len, cap - len, "%scuda:%d", (r == 0) ? "" : ",", d->ordinal);
        if ((n < 0) || ((size_t)n >= cap - len)) {
            return;   /* cut at the last whole name that fits */
        }
        len += (size_t)n;
    }
}

const char *kvf_role_device_names_get(void)
{
    return (kvf_role_device_names[0] != '\0') ? kvf_role_device_names : "cpu";
}

kvf_status_t kvf_role_pools_sync(kvf_engine_h engine)
{
    kvf_tp_runner_h runner = kvf_engine_runner(engine);
    const int tp = kvf_tp_runner_tp_size(runner);
    int err = KVF_KERN_OK;

    for (int r = 0; (r < tp) && (err == KVF_KERN_OK); ++r) {
        const kvf_device_t *d = kvf_page_pool_device(kvf_tp_runner_pool(runner, r));
        if (d->kind == KVF_DEVICE_CPU) {
            return KVF_OK;   /* CPU zeroing is done when it returns */
        }
        err = kvf_device_bind(d);
        if (err == KVF_KERN_OK) {
            err = kvf_device_sync(d);
        }
        if (err != KVF_KERN_OK) {
            kvf_error("waiting for rank %d's block zeroing on cuda:%d failed: %s", r,
                      d->ordinal, kvf_kern_strerror(err));
        }
    }
    if (tp > 1) {   /* the leader is rank 0: its device current again */
        int e = kvf_device_bind(kvf_page_pool_device(kvf_tp_runner_pool(runner, 0)));
        err = (err == KVF_KERN_OK) ? e : err;
    }
    return kvf_status_from_kern(err);
}

/* The digest of the model folder served, advertised at handshake (kvf_fingerprint.h). */
static kvf_status_t kvf_role_model_digest(const char *model, kvf_model_digest_t *digest_p)
{
    kvf_status_t status = kvf_model_digest(model, 0, digest_p);

    if (status == KVF_OK) {
        kvf_info("model digest %s (%s): %d files, %.1f MiB, %s in %.3f s", digest_p->hex,
                 digest_p->path, digest_p->num_files, (double)digest_p->bytes / (1 << 20),
                 digest_p->from_cache ? "from " KVF_MODEL_DIGEST_FILE : "computed",
                 digest_p->seconds);
    }
    return status;
}

kvf_status_t kvf_role_start(const kvf_role_config_t *config, kvf_connector_role_t role,
                            const char *listen_host, int listen_port, kvf_engine_h *engine_p,
                            const kvf_connector_ops_t **ops_p, kvf_connector_h *conn_p)
{
    const kvf_connector_ops_t *ops = kvf_connector_ucx_ops();
    kvf_role_pool_alloc_t alloc;
    kvf_connector_config_t cc;
    kvf_model_config_t mc;
    kvf_model_digest_t digest;
    kvf_connector_h conn;
    kvf_device_t dev;
    bool ucx_pools;
    kvf_status_t status;

    *engine_p = NULL;
    /* the device first: a missing GPU fails at once, naming the value and the CUDA error */
    status = kvf_model_device_open("--device", config->device, &dev);
    if (status != KVF_OK) {
        return status;
    }
    /* a GPU's pools are its memory (kvf_device_alloc), registered with UCX as CUDA memory;
     * --pool-alloc chooses between host memories only */
    ucx_pools = (dev.kind == KVF_DEVICE_CPU) && (strcmp(config->pool_alloc, "ucx") == 0);
    status = kvf_model_config_load(config->model, &mc);
    if (status == KVF_OK) {
        status = kvf_role_cache_params(config, &mc, &alloc.cache);
    }
    if (status == KVF_OK) {
        status = kvf_role_model_digest(config->model, &digest);
    }
    if (status == KVF_OK) {
        kvf_role_digest = digest;
        if (kvf_tokenizer_digest_of_model(config->model, kvf_role_tok_hex) == KVF_OK) {
            kvf_info("tokenizer digest %s (the proxy checks its own against it)",
                     kvf_role_tok_hex);
        } else {
            kvf_role_tok_hex[0] = '\0';
            kvf_warn("no tokenizer digest: the model's tokenizer did not load (a proxy cannot "
                     "check its own against it)");
        }
    }
    if (status == KVF_OK) {
        status = kvf_connector_ops_check(ops);
    }
    if (status != KVF_OK) {
        return status;
    }
    /* The connector first: with POOL_ALLOC ucx the engine's pools are its memory. */
    memset(&cc, 0, sizeof(cc));
    cc.field_mask = KVF_CONNECTOR_CONFIG_FIELD_TIMEOUT_MS;
    cc.engine_id = config->engine_id;
    cc.role = role;
    cc.timeout_ms = (uint32_t)config->xfer_timeout_ms;
    cc.cfg = &mc;
    cc.tp_size = config->tp;
    cc.field_mask |= KVF_CONNECTOR_CONFIG_FIELD_MODEL_DIGEST;
    cc.model_digest = &digest;   /* a pair with other weights or tokenizer is refused */
    if (role == KVF_CONNECTOR_ROLE_PREFILL) {
        cc.field_mask |= KVF_CONNECTOR_CONFIG_FIELD_PROGRESS;
        cc.progress_thread = true;   /* GETs progress while the engine computes */
    }
    if (listen_host != NULL) {
        cc.field_mask |= KVF_CONNECTOR_CONFIG_FIELD_LISTEN;
        cc.listen_host = listen_host;
        cc.listen_port = listen_port;
    }
    status = ops->create(&cc, &conn);
    if (status != KVF_OK) {
        return status;
    }
    alloc.ops = ops;
    alloc.conn = conn;
    status = kvf_role_engine_create(config, &alloc.cache, &dev, ucx_pools ? &alloc : NULL,
                                    engine_p);
    if ((status == KVF_OK) && !ucx_pools) {
        status = kvf_role_register_pools(*engine_p, &alloc.cache, ops, conn);
    }
    if (status != KVF_OK) {
        /* as the servers do: the connector first (it deregisters heap pools before the
         * engine frees them; engine destroy never touches connector-allocated pools) */
        ops->destroy(conn);
        kvf_engine_destroy(*engine_p);
        *engine_p = NULL;
        return status;
    }
    kvf_role_name_devices(*engine_p, kvf_role_device_names, sizeof(kvf_role_device_names));
    kvf_info("page pools: %s (%d rank%s, device %s)", ucx_pools ?
             "allocated by UCX (System V or POSIX shared memory where UCX can map it)" :
             (dev.kind != KVF_DEVICE_CPU) ? "GPU memory, registered with UCX as CUDA memory" :
             "heap, registered with UCX", config->tp, (config->tp == 1) ? "" : "s",
             kvf_role_device_names);
    *ops_p = ops;
    *conn_p = conn;
    return KVF_OK;
}

int kvf_role_max_prompt_tokens(kvf_engine_h engine)
{
    kvf_block_manager_h bm = kvf_engine_block_manager(engine);
    kvf_req_blocks_t none;
    int lo = 0, hi = 1 << 24;

    memset(&none, 0, sizeof(none));
    /* blocks_needed() grows with the token count: the largest count that fits */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (kvf_block_manager_blocks_needed(bm, &none, mid) <= kvf_block_manager_num_blocks(bm)) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

void kvf_role_health_fill(kvf_engine_h engine, const char *role,
                          const kvf_role_config_t *config, Kvf__HealthReply *h)
{
    kvf_block_manager_h bm = kvf_engine_block_manager(engine);
    kvf_tp_runner_h runner = kvf_engine_runner(engine);
    uint64_t pages_per_block = (uint64_t)kvf_tp_runner_layout(runner)->slots *
                               (uint64_t)kvf_tp_runner_tp_size(runner);

    kvf__health_reply__init(h);
    h->role = (char *)role;
    h->engine_id = (char *)config->engine_id;
    h->cannot_serve = (char *)kvf_role_cannot_serve(engine);   /* NULL: not sent */
    h->model_path = kvf_role_digest.path[0] ? kvf_role_digest.path : NULL;
    h->model_digest = kvf_role_digest.hex[0] ? kvf_role_digest.hex : NULL;
    h->tokenizer_digest = kvf_role_tok_hex[0] ? kvf_role_tok_hex : NULL;
    {
        kvf_engine_stats_t st;
        kvf_engine_get_stats(engine, &st);
        /* a rate from a few tokens says little: report it once 256 were timed */
        h->has_prefill_tokens_per_s = 1;
        h->prefill_tokens_per_s = ((st.prefill_tokens >= 256) && (st.prefill_seconds > 0)) ?
                                  (double)st.prefill_tokens / st.prefill_seconds : 0.0;
    }
    h->has_max_prompt_tokens = 1;
    h->max_prompt_tokens = (uint32_t)kvf_role_max_prompt_tokens(engine);
    h->has_xfer_timeout_ms = 1;
    h->xfer_timeout_ms = (uint64_t)config->xfer_timeout_ms;
    h->has_tp_size = h->has_free_pages = h->has_total_pages = h->has_block_size = 1;
    h->tp_size = (uint32_t)kvf_tp_runner_tp_size(runner);
    h->free_pages = (uint64_t)kvf_block_manager_num_free(bm) * pages_per_block;
    h->total_pages = (uint64_t)kvf_block_manager_num_blocks(bm) * pages_per_block;
    h->block_size = (uint32_t)kvf_block_manager_block_size(bm);
    h->has_auth_refusals_serve = h->has_auth_refusals_side = 1;
    h->auth_refusals_serve = kvf_zmq_auth_refusals("serve");
    h->auth_refusals_side = kvf_zmq_auth_refusals("side");
    h->device = (char *)kvf_role_device_names_get();
    {
        kvf_engine_prefix_stats_t ps;
        kvf_engine_get_prefix_stats(engine, &ps);
        h->has_prefix_caching = h->has_prefix_queries_total = h->has_prefix_hits_total = 1;
        h->has_prefix_hit_attention_tokens_total = h->has_prefix_hit_state_tokens_total = 1;
        h->has_prefix_blocks_evicted_total = h->has_prefix_states_evicted_total = 1;
        h->has_prefix_cached_blocks = h->has_prefix_states = 1;
        h->prefix_caching = config->prefix_caching;
        h->prefix_queries_total = ps.queries;
        h->prefix_hits_total = ps.hits;
        h->prefix_hit_attention_tokens_total = ps.hit_attn_tokens;
        h->prefix_hit_state_tokens_total = ps.hit_state_tokens;
        h->prefix_blocks_evicted_total = ps.blocks_evicted;
        h->prefix_states_evicted_total = ps.states_evicted;
        h->prefix_cached_blocks = (uint32_t)ps.cached_blocks;
        h->prefix_states = (uint32_t)ps.states;
        h->has_prefix_pulled_tokens_total = h->has_prefix_unknown_source_total = 1;
        h->prefix_pulled_tokens_total = ps.pulled_tokens;
        h->prefix_unknown_source_total = ps.import_unknown_source;
        if (kvf_role_events != NULL) {
            const char *pub = kvf_kv_events_endpoint(kvf_role_events);
            const char *rep = kvf_kv_events_replay_endpoint(kvf_role_events);
            h->kv_events_endpoint = pub[0] ? (char *)pub : NULL;   /* NULL: not sent */
            h->kv_events_replay_endpoint = rep[0] ? (char *)rep : NULL;
            kvf_kv_events_stats_t es;
            kvf_kv_events_get_stats(kvf_role_events, &es);
            h->has_prefix_hash_unit = 1;
            h->prefix_hash_unit = (uint32_t)ps.hash_unit;
            h->has_kv_events_batches_total = h->has_kv_events_dropped_total = 1;
            h->has_kv_events_replays_total = 1;
            h->kv_events_batches_total = es.batches;
            h->kv_events_dropped_total = es.dropped;
            h->kv_events_replays_total = es.replays;
        }
    }
}

const char *kvf_role_cannot_serve(kvf_engine_h engine)
{
    return kvf_tp_runner_world_error(kvf_engine_runner(engine));
}

bool kvf_role_broken_exit(kvf_engine_h engine, uint64_t *broken_ms_p)
{
    const char *why = kvf_role_cannot_serve(engine);
    uint64_t now = kvf_time_now_ms();

    if (why == NULL) {
        return false;
    }
    if (*broken_ms_p == 0) {
        *broken_ms_p = now;
        kvf_error("this instance cannot serve any more: %s; health says so (cannot_serve) and "
                  "new work is refused; exiting in %d ms with status 1 so a supervisor "
                  "restarts it", why, KVF_ROLE_BROKEN_EXIT_MS);
        return false;
    }
    if (now - *broken_ms_p < KVF_ROLE_BROKEN_EXIT_MS) {
        return false;
    }
    kvf_error("exiting: the TP world broke %llu ms ago (%s)",
              (unsigned long long)(now - *broken_ms_p), why);
    return true;
}

void kvf_role_reply_health(kvf_serve_server_h serve, const kvf_serve_peer_t *peer,
                           Kvf__HealthReply *health)
{
    Kvf__ServeReply reply = KVF__SERVE_REPLY__INIT;

    reply.request_id = (char *)"health";   /* proto: health replies carry this id */
    reply.health = health;
    reply.has_done = 1;
    reply.done = 1;
    kvf_serve_server_reply(serve, peer, &reply);
}

/* --keys/--key-id/--insecure -> kvf_zmq_auth_init (the key id defaults to the engine id) */
static kvf_status_t kvf_role_auth_init(const kvf_role_config_t *c)
{
    kvf_zmq_auth_config_t auth = {
        .keys_dir = c->keys,
        .key_id = (c->key_id[0] != '\0') ? c->key_id : c->engine_id,
        .insecure = c->insecure,
    };
    return kvf_zmq_auth_init(NULL, &auth);   /* logs what is missing: --keys or --insecure */
}

/* --metrics-port: up before the model loads, so a startup probe sees "starting" (503) */
static kvf_status_t kvf_role_http_start(const kvf_role_daemon_t *d)
{
    const kvf_role_config_t *c = (const kvf_role_config_t *)d->config;
    kvf_daemon_http_params_t hp = {
        .field_mask = KVF_DAEMON_HTTP_PARAM_FIELD_PORT | KVF_DAEMON_HTTP_PARAM_FIELD_ROLE |
                      KVF_DAEMON_HTTP_PARAM_FIELD_ENGINE_ID |
                      KVF_DAEMON_HTTP_PARAM_FIELD_MODEL_NAME,
        .port = c->metrics_port,
        .role = d->role,
        .engine_id = c->engine_id,
        .model_name = (c->served_model_name[0] != '\0') ? c->served_model_name : c->model,
    };

    return kvf_daemon_http_start(&hp);
}

static volatile sig_atomic_t kvf_role_stop;

/* first signal: drain; second: stop now */
static void kvf_role_on_signal(int sig)
{
    (void)sig;
    if (kvf_role_stop < KVF_ROLE_STOP_NOW) {
        kvf_role_stop = kvf_role_stop + 1;
    }
}

int kvf_role_main(const kvf_role_daemon_t *d, int argc, char **argv)
{
    struct sigaction sa;
    void *server;
    bool done;
    kvf_status_t status;

    kvf_log_init(d->role);
    if (kvf_fault_refuse_test_switches(argc, argv) != KVF_OK) {   /* release builds: by name */
        return 2;
    }
    if (kvf_config_parse(d->table, d->name, argc - 1, argv + 1, d->config, &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    /* every line names the instance: "[kvf prefill prefill-0] ..." */
    kvf_log_set_name(d->role, ((const kvf_role_config_t *)d->config)->engine_id);
    kvf_config_warn_unused();
    if (kvf_fault_init() != KVF_OK) {   /* a malformed KVF_FAULT is refused, by name */
        return 2;
    }
    if (kvf_role_auth_init((const kvf_role_config_t *)d->config) != KVF_OK) {
        return 2;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = kvf_role_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    status = kvf_role_http_start(d);
    if (status != KVF_OK) {
        return (status == KVF_ERR_INVALID_PARAM) ? 2 : 1;   /* a bad --metrics-port: 2 */
    }
    if (d->create(d->config, &server) != KVF_OK) {
        kvf_daemon_http_stop();
        return 1;
    }
    status = d->run(server, &kvf_role_stop);
    d->destroy(server);
    kvf_daemon_http_stop();
    kvf_zmq_auth_cleanup();
    return (status == KVF_OK) ? 0 : 1;
}
