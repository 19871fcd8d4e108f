/*
 * TP runner: rank threads driven by a generation counter.
 *
 * Design: the caller publishes a job (batch + fresh list), bumps `gen` and
 * broadcasts; each worker runs the job for its rank and counts itself done;
 * the caller runs rank 0 meanwhile and waits for the count. Rank 0 in the
 * caller's thread saves a context switch per step, which matters on the
 * two-core CI machines where TP4 already oversubscribes. The collectives
 * inside the forward synchronise the ranks, so the job hand-off needs no
 * barrier of its own. Rejected: a work queue per rank (nothing to queue,
 * steps are strictly sequential).
 */
#include "kvf_tp_runner.h"
#include "kvf_fwd_profile.h"
#include "kvf_log.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct kvf_rank_slot {
    struct kvf_tp_runner *runner;
    int                   rank;
    pthread_t             thread;
    bool                  started;
    kvf_rank_geometry_t   geom;
    kvf_page_pool_h       pool;
    struct kvf_model_ws  *ws;
    kvf_rank_ctx_t        ctx;
    kvf_status_t          status;
} kvf_rank_slot_t;

struct kvf_tp_runner {
    kvf_model_h         model;
    int                 tp;
    int                 num_blocks;
    kvf_cache_params_t  cache;
    kvf_step_limits_t   limits;    /* what each rank's workspace is sized for at start */
    kvf_cache_layout_t  layout;
    kvf_comm_world_h    world;
    kvf_rank_slot_t    *ranks;

    pthread_mutex_t     lock;
    pthread_cond_t      cond_job;
    pthread_cond_t      cond_done;
    uint64_t            gen;
    int                 done;
    bool                stop;
    const kvf_fwd_batch_t *batch;
    const int32_t      *fresh;
    int                 n_fresh;
    kvf_rank_func_t     func;      /* non-NULL: the job is func(arg, rank, pool), not a step */
    void               *func_arg;
};

static kvf_status_t kvf_rank_run(kvf_tp_runner_h r, kvf_rank_slot_t *s)
{
    if (r->func != NULL) {
        return r->func(r->func_arg, s->rank, s->pool);
    }
    /* under kvf bench-model --profile, the step's block zeroing is a row of its own */
    const bool prof = kvf_fwd_profile_thread(s->rank, kvf_page_pool_device(s->pool)) &&
                      (r->n_fresh > 0);
    const double t0 = prof ? kvf_fwd_profile_begin() : 0.0;
    kvf_status_t status = kvf_page_pool_zero_blocks(s->pool, r->fresh, r->n_fresh);
    if (prof) {
        kvf_fwd_profile_end(__func__, __LINE__,
                            "kvf_page_pool_zero_blocks(s->pool, r->fresh, r->n_fresh)", t0);
    }
    kvf_status_t fs = kvf_model_forward_rank(r->model, &s->ctx, r->batch);
    return (status != KVF_OK) ? status : fs;
}

static void *kvf_rank_thread(void *arg)
{
    kvf_rank_slot_t *s = arg;
    kvf_tp_runner_h r = s->runner;
    uint64_t seen = 0;

    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (!r->stop && (r->gen == seen)) {
            pthread_cond_wait(&r->cond_job, &r->lock);
        }
        if (r->stop) {
            break;
        }
        seen = r->gen;
        pthread_mutex_unlock(&r->lock);
        s->status = kvf_rank_run(r, s);
        pthread_mutex_lock(&r->lock);
        if (++r->done == r->tp - 1) {
            pthread_cond_signal(&r->cond_done);
        }
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

void kvf_tp_runner_destroy(kvf_tp_runner_h r)
{
    if (r == NULL) {
        return;
    }
    pthread_mutex_lock(&r->lock);
    r->stop = true;
    pthread_cond_broadcast(&r->cond_job);
    pthread_mutex_unlock(&r->lock);
    for (int i = 0; (r->ranks != NULL) && (i < r->tp); ++i) {
        if (r->ranks[i].started) {
            pthread_join(r->ranks[i].thread, NULL);
        }
        kvf_page_pool_destroy(r->ranks[i].pool);
        kvf_model_ws_destroy(r->ranks[i].ws);
    }
    kvf_comm_world_destroy(r->world);
    pthread_cond_destroy(&r->cond_job);
    pthread_cond_destroy(&r->cond_done);
    pthread_mutex_destroy(&r->lock);
    free(r->ranks);
    free(r);
}

/* The params' own checks, before anything is allocated. */
static kvf_status_t kvf_tp_runner_check(const kvf_tp_runner_params_t *params)
{
    const kvf_device_t *dev;

    if ((params->field_mask & ~KVF_TP_RUNNER_PARAM_FIELDS_KNOWN) || (params->model == NULL)) {
        kvf_error("tp runner: unknown params bits 0x%llx or no model",
                  (unsigned long long)(params->field_mask & ~KVF_TP_RUNNER_PARAM_FIELDS_KNOWN));
        return KVF_ERR_INVALID_PARAM;
    }
    if ((params->field_mask & KVF_TP_RUNNER_PARAM_FIELD_POOL_ALLOC) &&
        (params->pool_alloc == NULL)) {
        kvf_error("tp runner: POOL_ALLOC set without a pool_alloc function");
        return KVF_ERR_INVALID_PARAM;
    }
    dev = kvf_model_device(params->model);
    if ((dev->kind != KVF_DEVICE_CPU) &&
        (params->field_mask & KVF_TP_RUNNER_PARAM_FIELD_POOL_ALLOC)) {
        /* pool_alloc hands in host memory (the transfer connector's); a model on a GPU
         * needs its pools in that GPU's memory */
        kvf_error("tp runner: the model is on %s:%d but POOL_ALLOC places the page pools in "
                  "host memory; device pools come from kvf_device_alloc (leave POOL_ALLOC "
                  "unset)", kvf_device_kind_name(dev->kind), dev->ordinal);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

/* Rank job: make this rank's part of its world (kvf_comm_rank_start). */
static kvf_status_t kvf_rank_comm_start(void *arg, int rank, kvf_page_pool_h pool)
{
    kvf_tp_runner_h r = arg;

    (void)pool;
    return kvf_comm_rank_start(kvf_comm_world_rank(r->world, rank));
}

/* Rank job: size this rank's workspace for the step limits (on a GPU: its buffers and its
 * stream's kernel workspace; see kvf_model_ws_prepare). */
static kvf_status_t kvf_rank_ws_prepare(void *arg, int rank, kvf_page_pool_h pool)
{
    kvf_tp_runner_h r = arg;

    (void)pool;
    return kvf_model_ws_prepare(r->model, &r->ranks[rank].ctx, &r->limits);
}

/* The ranks' collectives: the CPU world, or an NCCL world over the ranks' GPUs. */
static kvf_status_t kvf_tp_runner_world(kvf_tp_runner_h r, const kvf_device_t *dev)
{
    kvf_device_t devs[KVF_COMM_MAX_RANKS];

    if ((r->tp == 1) || (dev->kind == KVF_DEVICE_CPU)) {
        return kvf_comm_world_create(KVF_DEVICE_CPU, r->tp, NULL, &r->world);
    }
    if (r->tp > KVF_COMM_MAX_RANKS) {
        kvf_error("tp runner: %d ranks, at most %d", r->tp, KVF_COMM_MAX_RANKS);
        return KVF_ERR_INVALID_PARAM;
    }
    for (int i = 0; i < r->tp; ++i) {
        devs[i] = *kvf_model_rank_device(r->model, i);
    }
    return kvf_comm_world_create(dev->kind, r->tp, devs, &r->world);
}

/* Rank @i's geometry, page pool (on the rank's GPU, or in the caller's memory) and workspace. */
static kvf_status_t kvf_tp_runner_rank_setup(kvf_tp_runner_h r,
                                             const kvf_tp_runner_params_t *params,
                                             const kvf_cache_params_t *cache, int i)
{
    const kvf_model_config_t *cfg = kvf_model_get_config(params->model);
    const kvf_device_t *dev = kvf_model_device(params->model);
    kvf_status_t status;
    kvf_rank_slot_t *s = &r->ranks[i];
    kvf_page_pool_params_t pp;

    s->runner = r;
    s->rank = i;
    status = kvf_rank_geometry_compute(cfg, cache, r->tp, i, &s->geom);
    if (status != KVF_OK) {
        return status;
    }
    kvf_page_pool_params_init(&s->geom, &r->layout, r->num_blocks, &pp);
    if (dev->kind != KVF_DEVICE_CPU) {
        pp.field_mask |= KVF_PAGE_POOL_PARAM_FIELD_DEVICE;   /* where the rank's weights are */
        pp.device = *kvf_model_rank_device(params->model, i);
    }
    if ((params->field_mask & KVF_TP_RUNNER_PARAM_FIELD_NO_ZERO) && params->disable_zeroing) {
        pp.field_mask |= KVF_PAGE_POOL_PARAM_FIELD_NO_ZERO;
        pp.disable_zeroing = true;
    }
    if (params->field_mask & KVF_TP_RUNNER_PARAM_FIELD_POOL_ALLOC) {
        size_t bytes = (size_t)r->num_blocks * (size_t)r->layout.slots * s->geom.page_size;

        status = params->pool_alloc(params->pool_alloc_ctx, i, r->num_blocks, bytes,
                                    &pp.memory);
        if (status != KVF_OK) {
            kvf_error("tp runner: rank %d: page pool memory (%zu bytes) could not be "
                      "allocated: %s", i, bytes, kvf_status_str(status));
            return status;
        }
        pp.field_mask |= KVF_PAGE_POOL_PARAM_FIELD_MEMORY;
    }
    status = kvf_page_pool_create(&pp, &s->pool);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_model_ws_create(&s->ws);
    if (status != KVF_OK) {
        return status;
    }
    s->ctx = (kvf_rank_ctx_t){
        .rank = i, .comm = kvf_comm_world_rank(r->world, i), .pool = s->pool,
        .geom = &s->geom, .layout = &r->layout, .ws = s->ws,
    };
    return KVF_OK;
}

/* The step limits a GPU rank's workspace is sized for: a request reaches at most the model's
 * positions and the pool's tokens; its table holds the blocks of that many tokens; a step zeroes
 * at most every block's pages. */
static void kvf_tp_runner_gpu_limits(kvf_tp_runner_h r, const kvf_model_config_t *cfg)
{
    const kvf_rank_geometry_t *g = &r->ranks[0].geom;
    const long pool_tokens = (long)r->num_blocks * (long)g->block_size;

    r->limits.max_context = (int)(((cfg->max_position_embeddings > 0) &&
                                   (cfg->max_position_embeddings < pool_tokens)) ?
                                  cfg->max_position_embeddings :
                                  ((pool_tokens < INT_MAX) ? pool_tokens : INT_MAX));
    r->limits.max_blocks = (int)(((long)r->limits.max_context + g->block_size - 1) /
                                 g->block_size);
    r->limits.max_fresh_pages = r->num_blocks * r->layout.slots;
    r->limits.kernel_block_size = g->kernel_block_size;
}

kvf_status_t kvf_tp_runner_create(const kvf_tp_runner_params_t *params, kvf_tp_runner_h *runner_p)
{
    const kvf_model_config_t *cfg;
    const kvf_device_t *dev;
    kvf_cache_params_t cache;
    kvf_tp_runner_h r;
    kvf_status_t status = kvf_tp_runner_check(params);

    if (status != KVF_OK) {
        return status;
    }
    dev = kvf_model_device(params->model);
    cfg = kvf_model_get_config(params->model);
    if (params->field_mask & KVF_TP_RUNNER_PARAM_FIELD_CACHE) {
        cache = params->cache;
    } else {
        kvf_cache_params_default(cfg, &cache);
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cond_job, NULL);
    pthread_cond_init(&r->cond_done, NULL);
    r->model = params->model;
    r->cache = cache;
    r->tp = kvf_model_tp_size(params->model);
    r->num_blocks = (params->field_mask & KVF_TP_RUNNER_PARAM_FIELD_NUM_BLOCKS) ?
                    params->num_blocks : 256;
    if (r->num_blocks <= 0) {
        kvf_error("tp runner: num_blocks %d must be positive", r->num_blocks);
        status = KVF_ERR_INVALID_PARAM;
        goto err;
    }
    r->limits.max_tokens = 512;   /* the engine's defaults */
    r->limits.max_seqs = 64;
    if (params->field_mask & KVF_TP_RUNNER_PARAM_FIELD_STEP_LIMITS) {
        r->limits.max_tokens = params->max_batch_tokens;
        r->limits.max_seqs = params->max_seqs;
        if ((params->max_batch_tokens < 1) || (params->max_seqs < 1)) {
            kvf_error("tp runner: step limits of %d tokens and %d requests must be positive",
                      params->max_batch_tokens, params->max_seqs);
            status = KVF_ERR_INVALID_PARAM;
            goto err;
        }
    }
    status = kvf_cache_layout_build(cfg, &r->layout);
    if (status != KVF_OK) {
        goto err;
    }
    /* the collectives by the ranks' device kind (CPU world, or NCCL for GPU ranks, one GPU
     * each: kvf_model_rank_device); a world of one never communicates, so it stays the CPU's
     * and TP 1 on a GPU needs no NCCL */
    status = kvf_tp_runner_world(r, dev);
    if (status != KVF_OK) {
        goto err;
    }
    r->ranks = calloc((size_t)r->tp, sizeof(*r->ranks));
    if (r->ranks == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto err;
    }
    for (int i = 0; i < r->tp; ++i) {
        status = kvf_tp_runner_rank_setup(r, params, &cache, i);
        if (status != KVF_OK) {
            goto err;
        }
    }
    for (int i = 1; i < r->tp; ++i) {
        if (pthread_create(&r->ranks[i].thread, NULL, kvf_rank_thread, &r->ranks[i]) != 0) {
            kvf_error("cannot start the thread of rank %d: %m", i);
            status = KVF_ERR_NO_MEMORY;
            goto err;
        }
        r->ranks[i].started = true;
    }
    if (strcmp(kvf_comm_world_kind(r->world), "cpu") != 0) {
        /* NCCL: every rank makes its communicators now, in its own thread, so an init
         * failure fails the start-up rather than the first step */
        status = kvf_tp_runner_run_on_ranks(r, kvf_rank_comm_start, r);
        if (status != KVF_OK) {
            goto err;
        }
    }
    if (dev->kind != KVF_DEVICE_CPU) {
        kvf_tp_runner_gpu_limits(r, cfg);
        status = kvf_tp_runner_run_on_ranks(r, kvf_rank_ws_prepare, r);
        if (status != KVF_OK) {
            goto err;
        }
    }
    *runner_p = r;
    return KVF_OK;

err:
    kvf_tp_runner_destroy(r);
    return status;
}

/* Publish the job, run rank 0 here, wait for the others. */
static kvf_status_t kvf_tp_runner_dispatch(kvf_tp_runner_h r)
{
    kvf_status_t status;

    pthread_mutex_lock(&r->lock);
    r->done = 0;
    ++r->gen;
    pthread_cond_broadcast(&r->cond_job);
    pthread_mutex_unlock(&r->lock);

    status = kvf_rank_run(r, &r->ranks[0]);

    pthread_mutex_lock(&r->lock);
    while (r->done < r->tp - 1) {
        pthread_cond_wait(&r->cond_done, &r->lock);
    }
    pthread_mutex_unlock(&r->lock);
    for (int i = 1; (status == KVF_OK) && (i < r->tp); ++i) {
        status = r->ranks[i].status;
    }
    return status;
}

kvf_status_t kvf_tp_runner_step(kvf_tp_runner_h r, const kvf_fwd_batch_t *batch,
                                const int32_t *fresh, int n_fresh)
{
    /* job fields are written before dispatch() takes the lock that publishes them */
    r->func = NULL;
    r->batch = batch;
    r->fresh = fresh;
    r->n_fresh = n_fresh;
    return kvf_tp_runner_dispatch(r);
}

kvf_status_t kvf_tp_runner_run_on_ranks(kvf_tp_runner_h r, kvf_rank_func_t func, void *arg)
{
    kvf_status_t status;

    if (func == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    r->func = func;
    r->func_arg = arg;
    status = kvf_tp_runner_dispatch(r);
    r->func = NULL;
    return status;
}

int kvf_tp_runner_tp_size(kvf_tp_runner_h r)
{
    return r->tp;
}

kvf_page_pool_h kvf_tp_runner_pool(kvf_tp_runner_h r, int rank)
{
    return ((rank >= 0) && (rank < r->tp)) ? r->ranks[rank].pool : NULL;
}

const kvf_rank_geometry_t *kvf_tp_runner_geometry(kvf_tp_runner_h r, int rank)
{
    return ((rank >= 0) && (rank < r->tp)) ? &r->ranks[rank].geom : NULL;
}

const kvf_cache_layout_t *kvf_tp_runner_layout(kvf_tp_runner_h r)
{
    return &r->layout;
}

int kvf_tp_runner_num_blocks(kvf_tp_runner_h r)
{
    return r->num_blocks;
}

kvf_model_h kvf_tp_runner_model(kvf_tp_runner_h r)
{
    return r->model;
}

const kvf_cache_params_t *kvf_tp_runner_cache_params(kvf_tp_runner_h r)
{
    return &r->cache;
}

const char *kvf_tp_runner_world_error(kvf_tp_runner_h r)
{
    return kvf_comm_world_error(r->world);
}
