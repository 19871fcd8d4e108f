/*
 * Tensor-parallel sharding math (Megatron-style, as vLLM shards Llama and
 * NemotronH): which heads, groups, channels and MLP columns one rank holds.
 *
 * Rules:
 * - Query heads, Mamba heads and MLP columns split evenly: tp must divide them.
 * - KV heads: tp <= kv_heads -> kv_heads/tp each; tp > kv_heads -> one head
 *   each, replicated on tp/kv_heads consecutive ranks (tp must be a multiple).
 * - Mamba B/C groups: the same rule against n_groups (vLLM's
 *   MambaMixer2 "extra_groups_for_head_shards"): tp > n_groups replicates.
 * - MoE ('E' layers): experts split whole over the ranks (expert parallel:
 *   rank r holds experts [r * E/tp, (r+1) * E/tp), tp must divide
 *   n_routed_experts); the shared expert's columns split like an MLP's.
 * - Conv state channels are x (this rank's heads * head_dim), then B (this
 *   rank's groups * state), then C (same), dimension-first.
 */
#ifndef KVF_SHARD_H
#define KVF_SHARD_H

#include "kvf_model_config.h"

typedef struct kvf_shard {
    int tp_size;
    int tp_rank;

    int attn_heads;          /* query heads held */
    int attn_head_start;     /* first global query head */
    int kv_heads;            /* KV heads held (>= 1) */
    int kv_head_start;       /* first global KV head */
    int kv_replication;      /* ranks holding each KV head (1 = not replicated) */

    int mamba_heads;         /* 0 for dense models */
    int mamba_head_start;
    int groups;              /* B/C groups held */
    int group_start;         /* first global group */
    int group_replication;   /* ranks holding each group (1 = not replicated) */

    int conv_x_channels;     /* mamba_heads * mamba_head_dim */
    int conv_x_start;        /* first global x channel */
    int conv_bc_channels;    /* groups * ssm_state_size, for B and again for C */
    int conv_dim;            /* conv_x_channels + 2 * conv_bc_channels */

    int mlp_cols;            /* intermediate_size / tp */
    int mlp_col_start;

    int moe_experts;         /* routed experts held (0 without MoE layers) */
    int moe_expert_start;    /* first global expert */
    int moe_shared_cols;     /* moe_shared_expert_intermediate_size / tp */
    int moe_shared_col_start;
} kvf_shard_t;

/**
 * Check that @a cfg can be sharded @a tp_size ways.
 * @return KVF_OK, or KVF_ERR_INVALID_PARAM with one logged line naming the
 *         field and both values, e.g. "tp_size 3 does not divide
 *         num_attention_heads 32".
 */
kvf_status_t kvf_shard_check(const kvf_model_config_t *cfg, int tp_size);

/** Like kvf_shard_check() but silent: true when @a tp_size can shard @a cfg. */
bool kvf_shard_probe(const kvf_model_config_t *cfg, int tp_size);

/**
 * What rank @a tp_rank of a TP-@a tp_size instance holds.
 * @return KVF_OK and *shard_p filled; errors as kvf_shard_check(), or
 *         KVF_ERR_INVALID_PARAM for tp_rank outside [0, tp_size).
 */
kvf_status_t kvf_shard_compute(const kvf_model_config_t *cfg, int tp_size, int tp_rank,
                               kvf_shard_t *shard_p);

/**
 * Rank-local conv-state channel index of global channel @a global of part
 * @a part (0 = x, 1 = B, 2 = C); -1 when this rank does not hold it.
 * Global x channels run over [0, inner); B and C channels over
 * [0, n_groups * ssm_state_size) each.
 */
int kvf_shard_conv_channel(const kvf_model_config_t *cfg, const kvf_shard_t *shard, int part,
                           int global);

#endif
