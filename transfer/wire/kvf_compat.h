/*
 * Handshake compatibility check (docs/ARCHITECTURE.md §1 failure 3, §8): decide before
 * any byte moves whether a remote instance's caches can be pulled into ours.
 *
 * Translatable differences are accepted: logical and kernel block sizes,
 * TP degrees that divide each other, alignment mode. Refused, with the field
 * and both values: protocol version, model fingerprint (geometry config),
 * model digest (weights and tokenizer: "handshake refused: model_digest
 * prefill=<d> (<folder>) decode=<d> (<folder>): weights or tokenizer differ";
 * also when only one side advertises one), the sliding window
 * ("sliding_window prefill=40 decode=4096", or "sliding_layers prefill=0,2
 * decode=1,2": the layers that slide), KV/conv/SSM dtypes
 * (conv/SSM for hybrid models only), layout tag, TP sizes that do not divide
 * each other or cannot shard the model, and any advertised geometry that is
 * not what kvf_rank_geometry_compute() gives for the advertised parameters
 * (block/kernel block size, page size, slots, region count and length =
 * num_blocks * slots * page_size). The last one is what keeps a peer from
 * making us read past its region.
 */
#ifndef KVF_COMPAT_H
#define KVF_COMPAT_H

#include "kvf_handshake.h"

/**
 * Check every remote rank against the local instance.
 *
 * @param [in]  cfg          Our model config (the remote's fingerprint must match it).
 * @param [in]  local        Our published metadata (any rank; rank-independent
 *                           fields are compared).
 * @param [in]  remote       [num_remote] remote ranks, remote[i].tp_rank == i
 *                           (as kvf_handshake_reply_unpack() guarantees).
 * @param [in]  num_remote   >= 1.
 * @param [out] remote_geoms NULL or [num_remote]: each remote rank's geometry,
 *                           recomputed; valid only on KVF_OK.
 * @param [out] refusals     [max_refusals] reasons, first found first.
 * @param [out] num_refusals_p Number written (0 on KVF_OK).
 *
 * @return KVF_OK (compatible); KVF_ERR_REFUSED (>= 1 refusal written; the
 *         first is logged as "handshake refused: <field> prefill=<v>
 *         decode=<v>: <why>", @a local being decode's); KVF_ERR_INVALID_PARAM for bad
 *         arguments.
 */
kvf_status_t kvf_compat_check(const kvf_model_config_t *cfg, const kvf_rank_meta_t *local,
                              const kvf_rank_meta_t *remote, int num_remote,
                              kvf_rank_geometry_t *remote_geoms, kvf_refusal_t *refusals,
                              int max_refusals, int *num_refusals_p);

/**
 * Fill @a meta's sliding_window and sliding_layers from @a cfg (cfg->layer_window): the
 * largest layer window and the bitmap of the layers that slide; both 0 / empty for a model
 * without a sliding layer (what a peer that predates the fields advertises too).
 */
void kvf_rank_meta_set_window(kvf_rank_meta_t *meta, const kvf_model_config_t *cfg);

/**
 * Cache params that reproduce an advertised geometry: the advertised dtypes,
 * user block size, alignment, block_size explicit and kernel_block_size as
 * the only accepted kernel size.
 */
void kvf_compat_params_from_meta(const kvf_model_config_t *cfg, const kvf_rank_meta_t *meta,
                                 kvf_cache_params_t *params_p);

#endif
