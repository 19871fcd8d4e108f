/*
 * Which prefill rank a decode rank reads each piece of state from, for a
 * prefill TP P and decode TP D (docs/ARCHITECTURE.md §7, NIXL connector's tp_ratio):
 *
 *   tp_ratio = D/P when D >= P, -P/D when P > D.
 *   D >= P: decode rank r reads prefill rank r*P/D.
 *   P >  D: decode rank r reads prefill ranks r*(P/D) ... r*(P/D)+P/D-1.
 *
 * A head or group that several prefill ranks hold (replicated KV heads when
 * P > num_key_value_heads, replicated B/C groups when P > n_groups) is read
 * once: from the holder inside decode rank r's range above, else from the
 * lowest-numbered holder.
 */
#ifndef KVF_TP_MAP_H
#define KVF_TP_MAP_H

#include "kvf_shard.h"

/** D/P when D >= P, else -(P/D). 0 when neither divides the other. */
int kvf_tp_ratio(int prefill_tp, int decode_tp);

/** Prefill rank to read global KV head @a head from, for decode rank @a d_rank. */
int kvf_tp_kv_head_source(const kvf_model_config_t *cfg, int prefill_tp, int decode_tp,
                          int d_rank, int head);

/** Prefill rank holding global Mamba head @a head (never replicated). */
int kvf_tp_mamba_head_source(const kvf_model_config_t *cfg, int prefill_tp, int head);

/** Prefill rank to read global B/C group @a group from, for decode rank @a d_rank. */
int kvf_tp_group_source(const kvf_model_config_t *cfg, int prefill_tp, int decode_tp,
                        int d_rank, int group);

/**
 * The distinct prefill ranks decode rank @a d_rank reads, ascending.
 * @param [out] ranks    At least @a prefill_tp entries.
 * @param [out] num_p    Number written.
 * @return KVF_OK; sharding errors for either side; KVF_ERR_INVALID_PARAM
 *         when neither TP divides the other (logged with both values).
 */
kvf_status_t kvf_tp_source_ranks(const kvf_model_config_t *cfg, int prefill_tp, int decode_tp,
                                 int d_rank, int *ranks, int *num_p);

#endif
