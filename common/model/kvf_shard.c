/*
 * TP sharding math. Kept free of memory sizes (see kvf_geometry.c) so the
 * model runner and the transfer planner share one definition of "who holds
 * what".
 */
#include "kvf_shard.h"
#include "kvf_log.h"

/* Split @a n items over tp ranks, replicating when tp > n. */
/* Log only when not probing: kvf_shard_probe() asks "can it?" without noise. */
#define kvf_shard_fail(_quiet, _fmt, ...)     \
    do {                                      \
        if (!(_quiet)) {                      \
            kvf_error(_fmt, ##__VA_ARGS__);   \
        }                                     \
    } while (0)

static kvf_status_t kvf_shard_split(bool quiet, const char *field, int n, int tp, int rank,
                                    int *count_p, int *start_p, int *repl_p)
{
    if (tp <= n) {
        if (n % tp != 0) {
            kvf_shard_fail(quiet, "tp_size %d does not divide %s %d", tp, field, n);
            return KVF_ERR_INVALID_PARAM;
        }
        *count_p = n / tp;
        *start_p = rank * (n / tp);
        *repl_p = 1;
    } else {
        if (tp % n != 0) {
            kvf_shard_fail(quiet, "tp_size %d is larger than %s %d and not a multiple of it", tp, field, n);
            return KVF_ERR_INVALID_PARAM;
        }
        *count_p = 1;
        *start_p = rank / (tp / n);
        *repl_p = tp / n;
    }
    return KVF_OK;
}

static kvf_status_t kvf_shard_even(bool quiet, const char *field, int n, int tp)
{
    if (n % tp != 0) {
        kvf_shard_fail(quiet, "tp_size %d does not divide %s %d", tp, field, n);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

static kvf_status_t kvf_shard_compute_ex(const kvf_model_config_t *cfg, int tp_size,
                                         int tp_rank, bool quiet, kvf_shard_t *shard_p)
{
    kvf_shard_t s = {0};
    kvf_status_t status;

    if (tp_size <= 0) {
        kvf_shard_fail(quiet, "tp_size %d must be positive", tp_size);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((tp_rank < 0) || (tp_rank >= tp_size)) {
        kvf_shard_fail(quiet, "tp_rank %d is outside [0, %d)", tp_rank, tp_size);
        return KVF_ERR_INVALID_PARAM;
    }
    s.tp_size = tp_size;
    s.tp_rank = tp_rank;

    status = kvf_shard_even(quiet, "num_attention_heads", cfg->num_attention_heads, tp_size);
    if (status != KVF_OK) {
        return status;
    }
    s.attn_heads = cfg->num_attention_heads / tp_size;
    s.attn_head_start = tp_rank * s.attn_heads;
    status = kvf_shard_split(quiet, "num_key_value_heads", cfg->num_key_value_heads, tp_size, tp_rank,
                             &s.kv_heads, &s.kv_head_start, &s.kv_replication);
    if (status != KVF_OK) {
        return status;
    }

    if (cfg->num_mamba_layers > 0) {
        /* Gated DeltaNet: value heads are the state's heads, key heads its groups */
        const bool gdn = (cfg->state_kind == KVF_STATE_GDN);
        status = kvf_shard_even(quiet, gdn ? "linear_num_value_heads" : "mamba_num_heads",
                                cfg->mamba_num_heads, tp_size);
        if (status != KVF_OK) {
            return status;
        }
        s.mamba_heads = cfg->mamba_num_heads / tp_size;
        s.mamba_head_start = tp_rank * s.mamba_heads;
        status = kvf_shard_split(quiet, gdn ? "linear_num_key_heads" : "n_groups",
                                 cfg->n_groups, tp_size, tp_rank, &s.groups,
                                 &s.group_start, &s.group_replication);
        if (status != KVF_OK) {
            return status;
        }
        s.conv_x_channels = s.mamba_heads * cfg->mamba_head_dim;
        s.conv_x_start = s.mamba_head_start * cfg->mamba_head_dim;
        s.conv_bc_channels = s.groups * cfg->ssm_state_size;
        s.conv_dim = s.conv_x_channels + 2 * s.conv_bc_channels;
    }

    /* granitemoehybrid spells them shared_intermediate_size and num_local_experts */
    const bool granite = (cfg->arch == KVF_ARCH_GRANITE_MOE_HYBRID);
    const bool qn = (cfg->arch == KVF_ARCH_QWEN3_NEXT);   /* num_experts, shared_expert_... */
    if (cfg->intermediate_size > 0) {
        status = kvf_shard_even(quiet, granite ? "shared_intermediate_size" : "intermediate_size",
                                cfg->intermediate_size, tp_size);
        if (status != KVF_OK) {
            return status;
        }
        s.mlp_cols = cfg->intermediate_size / tp_size;
        s.mlp_col_start = tp_rank * s.mlp_cols;
    }
    if (cfg->num_moe_layers > 0) {
        /* gpt_oss spells them num_local_experts too */
        status = kvf_shard_even(quiet, (granite || (cfg->arch == KVF_ARCH_GPT_OSS)) ?
                                "num_local_experts" : qn ? "num_experts" : "n_routed_experts",
                                cfg->moe_num_experts, tp_size);
        if (status == KVF_OK) {
            status = kvf_shard_even(quiet, granite ? "shared_intermediate_size" :
                                    qn ? "shared_expert_intermediate_size" :
                                    "moe_shared_expert_intermediate_size",
                                    cfg->moe_shared_intermediate_size, tp_size);
        }
        if (status != KVF_OK) {
            return status;
        }
        s.moe_experts = cfg->moe_num_experts / tp_size;
        s.moe_expert_start = tp_rank * s.moe_experts;
        s.moe_shared_cols = cfg->moe_shared_intermediate_size / tp_size;
        s.moe_shared_col_start = tp_rank * s.moe_shared_cols;
    }
    *shard_p = s;
    return KVF_OK;
}

kvf_status_t kvf_shard_compute(const kvf_model_config_t *cfg, int tp_size, int tp_rank,
                               kvf_shard_t *shard_p)
{
    return kvf_shard_compute_ex(cfg, tp_size, tp_rank, false, shard_p);
}

bool kvf_shard_probe(const kvf_model_config_t *cfg, int tp_size)
{
    kvf_shard_t s;
    return kvf_shard_compute_ex(cfg, tp_size, 0, true, &s) == KVF_OK;
}

kvf_status_t kvf_shard_check(const kvf_model_config_t *cfg, int tp_size)
{
    kvf_shard_t s;
    return kvf_shard_compute(cfg, tp_size, 0, &s);
}

int kvf_shard_conv_channel(const kvf_model_config_t *cfg, const kvf_shard_t *shard, int part,
                           int global)
{
    if (part == 0) {
        int local = global - shard->conv_x_start;
        return ((local >= 0) && (local < shard->conv_x_channels)) ? local : -1;
    }
    int local = global - shard->group_start * cfg->ssm_state_size;
    if ((local < 0) || (local >= shard->conv_bc_channels)) {
        return -1;
    }
    return shard->conv_x_channels + ((part == 2) ? shard->conv_bc_channels : 0) + local;
}
