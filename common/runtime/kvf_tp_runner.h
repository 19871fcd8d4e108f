/*
 * Tensor-parallel model runner of one instance: one thread per TP rank in
 * this process (docs/ARCHITECTURE.md §5), each owning its page pool, its workspace and
 * its communicator handle; the caller's thread is rank 0.
 *
 * A step ships one batch (kvf_fwd_batch_t) and the list of freshly
 * allocated attention blocks to every rank; each rank zeroes those blocks
 * in its own pool (one kvf_blocks_zero call), then runs the forward. The
 * call returns when every rank is done.
 */
#ifndef KVF_TP_RUNNER_H
#define KVF_TP_RUNNER_H

#include "kvf_model.h"

typedef struct kvf_tp_runner *kvf_tp_runner_h;

enum kvf_tp_runner_params_field {          /* append only, never renumber */
    KVF_TP_RUNNER_PARAM_FIELD_NUM_BLOCKS   = KVF_BIT(0),  /* default 256 */
    KVF_TP_RUNNER_PARAM_FIELD_CACHE        = KVF_BIT(1),  /* default kvf_cache_params_default() */
    KVF_TP_RUNNER_PARAM_FIELD_NO_ZERO      = KVF_BIT(2),  /* TEST ONLY; default zeroing on */
    KVF_TP_RUNNER_PARAM_FIELD_POOL_ALLOC   = KVF_BIT(3),  /* default: pools allocate on the CPU */
    KVF_TP_RUNNER_PARAM_FIELD_STEP_LIMITS  = KVF_BIT(4),  /* default 512 tokens, 64 requests */
};
#define KVF_TP_RUNNER_PARAM_FIELDS_KNOWN (KVF_BIT(5) - 1)

/**
 * Allocator of one rank's page-pool memory (called once per rank, in rank
 * order, on the creating thread): put in *base_p @a bytes (= @a num_blocks
 * blocks of the rank's geometry) of page-aligned host memory that stays
 * valid while the runner computes (destroy never touches it, so its owner
 * may free it before or after kvf_tp_runner_destroy()). Used by
 * the daemons to place the pools in the transfer connector's shared memory
 * (transfer/ucx/kvf_connector.h, alloc_pool). @return KVF_OK, or an error
 * that fails kvf_tp_runner_create().
 */
typedef kvf_status_t (*kvf_pool_alloc_fn_t)(void *ctx, int rank, int num_blocks, size_t bytes,
                                            void **base_p);

typedef struct kvf_tp_runner_params {
    uint64_t            field_mask;       /* first */
    kvf_model_h         model;            /* required; not owned, must outlive the runner */
    int                 num_blocks;       /* blocks per rank pool */
    kvf_cache_params_t  cache;            /* dtypes, block size rule, kernel sizes */
    bool                disable_zeroing;  /* TEST ONLY: fresh blocks are not zeroed */
    kvf_pool_alloc_fn_t pool_alloc;       /* POOL_ALLOC: where each rank's pool lives */
    void               *pool_alloc_ctx;   /* passed to pool_alloc */
    int                 max_batch_tokens; /* STEP_LIMITS: tokens of one step, >= 1 */
    int                 max_seqs;         /* STEP_LIMITS: requests of one step, >= 1 */
} kvf_tp_runner_params_t;

/**
 * Compute every rank's geometry, allocate the pools and start tp-1 threads.
 * Each rank's pool is allocated on that rank's device (kvf_model_rank_device():
 * host memory for a CPU model, the rank's GPU for a CUDA one), and the ranks'
 * world is the CPU's or, for a CUDA model with tp > 1, NCCL's over the ranks'
 * GPUs, every rank's communicators made here (kvf_comm_rank_start on each
 * rank thread). On a GPU each rank's workspace is sized here, on its own
 * thread, for the step limits (kvf_model_ws_prepare(): the forward's
 * buffers and the stream's kernel workspace), so steps within them neither
 * allocate device memory nor block the host on an upload.
 * @return KVF_OK; geometry errors (e.g. explicit block size too small for
 *         the Mamba state); KVF_ERR_NO_MEMORY; KVF_ERR_INVALID_PARAM;
 *         KVF_ERR_UNSUPPORTED for POOL_ALLOC with a model on a GPU (the
 *         allocator gives host memory); KVF_ERR_CUDA when a device pool
 *         cannot be allocated; the NCCL world's errors (kvf_comm_world_create,
 *         kvf_comm_rank_start: KVF_ERR_UNSUPPORTED without NCCL, KVF_ERR_NCCL);
 *         KVF_ERR_INVALID_PARAM for STEP_LIMITS below 1; the workspace's
 *         errors (kvf_model_ws_prepare()).
 */
kvf_status_t kvf_tp_runner_create(const kvf_tp_runner_params_t *params, kvf_tp_runner_h *runner_p);

/** Stop the rank threads and free the pools; NULL is a no-op. */
void kvf_tp_runner_destroy(kvf_tp_runner_h runner);

/**
 * Run one step on all ranks: zero @a fresh (n_fresh block ids) in every
 * rank's pool, then kvf_model_forward_rank(). @return the first rank error.
 */
kvf_status_t kvf_tp_runner_step(kvf_tp_runner_h runner, const kvf_fwd_batch_t *batch,
                                const int32_t *fresh, int n_fresh);

/**
 * Work run on a rank's own thread (rank 0: the caller's thread), e.g. UCX
 * calls of a worker that belongs to that rank (register the rank's pool,
 * post and poll its transfers). @a pool is the rank's page pool.
 */
typedef kvf_status_t (*kvf_rank_func_t)(void *arg, int rank, kvf_page_pool_h pool);

/**
 * Run @a func on every rank thread at once (rank 0 in the caller's thread)
 * and wait for all. Must not be called from inside a rank function or a
 * step. @return the first non-OK status by rank order, else KVF_OK.
 */
kvf_status_t kvf_tp_runner_run_on_ranks(kvf_tp_runner_h runner, kvf_rank_func_t func, void *arg);

int                        kvf_tp_runner_tp_size(kvf_tp_runner_h runner);
kvf_page_pool_h            kvf_tp_runner_pool(kvf_tp_runner_h runner, int rank);
const kvf_rank_geometry_t *kvf_tp_runner_geometry(kvf_tp_runner_h runner, int rank);
const kvf_cache_layout_t  *kvf_tp_runner_layout(kvf_tp_runner_h runner);
int                        kvf_tp_runner_num_blocks(kvf_tp_runner_h runner);
/** The model the runner steps (kvf_tp_runner_params_t.model; not owned). */
kvf_model_h                kvf_tp_runner_model(kvf_tp_runner_h runner);
/** The cache params the geometry was derived from (dtypes, block size rule, kernel sizes). */
const kvf_cache_params_t  *kvf_tp_runner_cache_params(kvf_tp_runner_h runner);
/**
 * Why the ranks' world broke for good (a TP barrier timed out, see
 * kvf_comm_world_error()), or NULL while every collective can still run.
 * Any thread; the text is stable once set and lives as long as the runner.
 */
const char                *kvf_tp_runner_world_error(kvf_tp_runner_h runner);

#endif
