/*
 * The engine's side of the prefix cache (docs/PREFIX_CACHE.md): per-request
 * hash chains, the lookup that gives a waiting request its cached prefix,
 * the captures after a step (full blocks indexed, Mamba state checkpoints
 * copied into each rank's checkpoint memory), and the counters. The index
 * is common/cache/kvf_prefix_cache.h; the bytes move here, on each rank's
 * own thread (kvf_tp_runner_run_on_ranks), page by page, on the pool's
 * device.
 *
 * Thread safety: the engine's leader thread only, between steps.
 */
#ifndef KVF_ENGINE_PREFIX_H
#define KVF_ENGINE_PREFIX_H

#include "kvf_engine.h"

typedef struct kvf_engine_prefix *kvf_engine_prefix_h;

/**
 * Create the cache for an engine's runner and block manager. @a digest: 16
 * bytes of the weights digest. Sets sched->state_grid for a model with Mamba
 * layers. @return KVF_OK; KVF_ERR_INVALID_PARAM when the state budget holds
 * no checkpoint (both values named) or the grid is bad; KVF_ERR_NO_MEMORY;
 * device allocation errors.
 */
kvf_status_t kvf_engine_prefix_create(const kvf_engine_prefix_params_t *params,
                                      const uint8_t digest[16], kvf_tp_runner_h runner,
                                      kvf_block_manager_h bm, kvf_engine_prefix_h *ep_p);

/** Free the checkpoint memory and the index (before the runner). NULL: no-op. */
void kvf_engine_prefix_destroy(kvf_engine_prefix_h ep);

/**
 * Give a WAITING request without blocks its cached prefix: share the
 * blocks, allocate the rest up to the hit, restore the checkpoint on every
 * rank, num_computed = hit. A miss or a pool too full for the hit's own
 * blocks leaves the request as it was. Sets r->chunk_cut for a checkpoint
 * the cache lacks. @return KVF_OK; copy errors (the request keeps no blocks).
 */
kvf_status_t kvf_engine_prefix_admit(kvf_engine_prefix_h ep, kvf_request_t *r);

/**
 * After a successful forward of @a np plan entries (before sampling, which
 * may free a finished request's blocks): index the blocks the step
 * completed and checkpoint the states it ended on the grid.
 * @return KVF_OK; copy errors.
 */
kvf_status_t kvf_engine_prefix_after_step(kvf_engine_prefix_h ep, const kvf_sched_entry_t *plan,
                                          int np);

/** A request leaves the engine: free its chain. */
void kvf_engine_prefix_forget(kvf_request_t *r);

/**
 * The numerics class of an engine on @a runner (kvf_engine_numerics_class()):
 * XXH3-64 of its TP size, device kind, Mamba state grid (@a state_grid
 * tokens, 0 without Mamba layers) and the environment switches that change a
 * GPU forward's bits; never 0.
 */
uint64_t kvf_engine_prefix_numerics(kvf_tp_runner_h runner, int state_grid);

/**
 * Decode: @a r (just created, holding no blocks) is an import of KV that an
 * engine of numerics class @a source computed (0: unknown). Share the
 * longest run of full attention blocks this cache holds for r's prompt from
 * that source (r->prefix_hit tokens, a multiple of the block size, at most
 * the prompt); the caller allocates the rest and pulls tokens from
 * r->prefix_hit on. Counts the query, the hit and the tokens to pull. Marks r
 * not to be looked up again, and not indexed unless @a source is this
 * engine's class. @return KVF_OK (a failure to share is a miss).
 */
kvf_status_t kvf_engine_prefix_import(kvf_engine_prefix_h ep, kvf_request_t *r, uint64_t source);

/**
 * Decode: the pull of @a r landed and was verified: index its full prompt
 * blocks (those past its hit) under their source, for the next request.
 */
void kvf_engine_prefix_imported(kvf_engine_prefix_h ep, kvf_request_t *r);

/** Counters (kvf_engine_prefix_stats_t). */
void kvf_engine_prefix_get_stats(kvf_engine_prefix_h ep, kvf_engine_prefix_stats_t *stats_p);

#endif
