/*
 * Roofline estimates (see kvf_estimate.h). The parameter count follows the
 * Hugging Face module shapes of each architecture; the per-rank cache
 * figures come from the same geometry the daemons allocate with, so the
 * capacity is in the pool's own pages, and the transfer bytes are the
 * planner's. Rejected: a per-kernel model (attention kernels, scan kernels,
 * GEMM shapes) — too many unknowns to be more right than a roofline, and
 * an operator comparing layouts needs the ratios more than the absolutes.
 */
#include "kvf_estimate.h"
#include "kvf_log.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const kvf_hw_t kvf_hw_table[] = {
    /* name    HBM        HBM B/s    bf16 dense FLOP/s  P->D link B/s (per-GPU NIC) */
    {"h100", 80e9,  3.35e12, 989e12,  50e9},    /* H100 SXM, HBM3, 400 Gb/s NDR */
    {"h200", 141e9, 4.8e12,  989e12,  50e9},    /* H200 SXM, HBM3e, 400 Gb/s NDR */
    {"b200", 180e9, 8.0e12,  2250e12, 100e9},   /* B200 (HGX), HBM3e, 800 Gb/s XDR */
};

kvf_status_t kvf_hw_lookup(const char *name, kvf_hw_t *hw)
{
    for (size_t i = 0; i < sizeof(kvf_hw_table) / sizeof(kvf_hw_table[0]); ++i) {
        if (strcmp(kvf_hw_table[i].name, name) == 0) {
            *hw = kvf_hw_table[i];
            return KVF_OK;
        }
    }
    return KVF_ERR_NOT_FOUND;
}

kvf_status_t kvf_model_cost(const kvf_model_config_t *cfg, kvf_model_cost_t *cost_p)
{
    kvf_model_cost_t c;
    double h = cfg->hidden_size, hd = cfg->head_dim;
    double embed = (double)cfg->vocab_size * h;
    double inner = (double)kvf_model_mamba_inner(cfg);
    double gs = (double)cfg->n_groups * cfg->ssm_state_size;
    double conv_dim = inner + 2 * gs;
    double mamba = h * (2 * inner + 2 * gs + cfg->mamba_num_heads) +   /* in_proj */
                   conv_dim * cfg->conv_kernel + (cfg->use_conv_bias ? conv_dim : 0) +
                   3.0 * cfg->mamba_num_heads +                        /* A_log, D, dt_bias */
                   inner +                                             /* gated norm */
                   inner * h + h;                                      /* out_proj, layer norm */
    double attn = h * hd * (2.0 * cfg->num_attention_heads + 2.0 * cfg->num_key_value_heads) +
                  h;
    double mlp_mats = (cfg->arch == KVF_ARCH_NEMOTRON_H) ? 2.0 : 3.0;
    double mlp = mlp_mats * h * cfg->intermediate_size + h;
    double body = 0, routed_unused = 0;

    memset(&c, 0, sizeof(c));
    for (int i = 0; i < cfg->num_layers; ++i) {
        switch (cfg->layer_kinds[i]) {
        case KVF_LAYER_MAMBA:
            body += mamba;
            break;
        case KVF_LAYER_ATTENTION:
            body += attn;
            break;
        case KVF_LAYER_MLP:
            body += mlp;
            break;
        case KVF_LAYER_MOE:
            c.moe_layers++;
            break;
        default:
            break;
        }
        if (cfg->dense_mlp_in_layer && (cfg->moe_in_layer || cfg->layer_sparse[i])) {
            /* granitemoehybrid's FFN, qwen3_next's sparse layers */
            c.moe_layers++;
        } else if (cfg->dense_mlp_in_layer) {   /* dense archs, bamba: the layer's MLP */
            body += mlp;
        }
    }
    if (c.moe_layers > 0) {
        if ((cfg->moe_num_experts <= 0) || (cfg->moe_top_k <= 0) ||
            (cfg->moe_intermediate_size <= 0)) {
            kvf_error("config.json: MoE layers need 'n_routed_experts', 'num_experts_per_tok' "
                      "and 'moe_intermediate_size' for an estimate (have %d, %d, %d)",
                      cfg->moe_num_experts, cfg->moe_top_k, cfg->moe_intermediate_size);
            return KVF_ERR_INVALID_PARAM;
        }
        const double mats = cfg->moe_gated ? 3.0 : 2.0;   /* gated: gate, up, down */
        c.expert_params = mats * h * cfg->moe_intermediate_size;
        body += c.moe_layers * (h * cfg->moe_num_experts +                  /* router */
                                cfg->moe_num_experts * c.expert_params +
                                mats * h * cfg->moe_shared_intermediate_size + h);
        routed_unused = (double)c.moe_layers * (cfg->moe_num_experts - cfg->moe_top_k) *
                        c.expert_params;
    }
    c.total_params = body + embed * (cfg->tie_word_embeddings ? 1 : 2) + h;
    c.active_params = body - routed_unused + embed;     /* lm_head; the lookup is free */
    *cost_p = c;
    return KVF_OK;
}

/* Weight elements a step touches when @a routings token-expert choices spread uniformly. */
static double kvf_est_touched(const kvf_model_config_t *cfg, const kvf_model_cost_t *cost,
                              double routings)
{
    double e = cfg->moe_num_experts, unique;

    if (cost->moe_layers == 0) {
        return cost->total_params;
    }
    unique = e * (1.0 - pow(1.0 - (double)cfg->moe_top_k / e, routings / cfg->moe_top_k));
    return cost->total_params - cost->moe_layers * (e - unique) * cost->expert_params;
}

static double kvf_est_step_ms(double flops, double bytes_per_rank, int tp,
                              const kvf_estimate_params_t *ep)
{
    double t_c = flops / ((double)tp * ep->hw.flops * ep->mfu);
    double t_m = bytes_per_rank / (ep->hw.hbm_bw * ep->mbu);

    return 1000.0 * ((t_c > t_m) ? t_c : t_m);
}

static void kvf_est_side(const kvf_model_config_t *cfg, const kvf_model_cost_t *cost,
                         const kvf_rank_geometry_t *g, int tp, const kvf_estimate_params_t *ep,
                         kvf_side_estimate_t *s)
{
    double bs = g->block_size;
    double prompt_blocks = ceil(ep->prompt_tokens / bs) * bs;

    memset(s, 0, sizeof(*s));
    s->tp = tp;
    s->weights_per_rank = cost->total_params * ep->weight_bytes / tp;
    s->cache_per_rank = ep->hw.hbm_bytes * ep->mem_util - ep->reserve_bytes - s->weights_per_rank;
    s->attn_bytes_per_token = (double)g->attn_bytes_per_token * cfg->num_attention_layers;
    s->mamba_bytes_per_seq = (cfg->num_mamba_layers > 0) ?
                             (double)g->page_size * cfg->num_mamba_layers : 0;
    if (s->cache_per_rank > 0) {
        double left = s->cache_per_rank - ep->batch * s->mamba_bytes_per_seq;
        double tok = (left > 0) ? floor(left / s->attn_bytes_per_token / bs) * bs : 0;
        s->capacity_tokens = (long long)tok;
        s->max_seqs = (long long)floor(s->cache_per_rank /
                                       (prompt_blocks * s->attn_bytes_per_token +
                                        s->mamba_bytes_per_seq));
    }
}

kvf_status_t kvf_layout_estimate(const kvf_model_config_t *cfg, const kvf_model_cost_t *cost,
                                 const kvf_layout_plan_t *plan, const kvf_estimate_params_t *ep,
                                 kvf_layout_estimate_t *est_p)
{
    kvf_layout_estimate_t e;
    double L = ep->prompt_tokens, C = ep->context_tokens, B = ep->batch;
    double heads = cfg->num_attention_heads, hd = cfg->head_dim;
    double lm_head = (double)cfg->vocab_size * cfg->hidden_size;
    double inner_heads = cfg->mamba_num_heads;
    double flops, bytes, state_bytes;
    int P = plan->layout.prefill_tp, D = plan->layout.decode_tp;

    if (plan->verdict == KVF_VERDICT_REFUSED) {
        kvf_error("layout %dp%dd is refused; nothing to estimate", P, D);
        return KVF_ERR_INVALID_PARAM;
    }
    if ((ep->mem_util <= 0) || (ep->mem_util > 1) || (ep->mfu <= 0) || (ep->mfu > 1) ||
        (ep->mbu <= 0) || (ep->mbu > 1) || (ep->batch < 1) || (ep->prompt_tokens < 1) ||
        (ep->context_tokens < 1) || (ep->hw.hbm_bytes <= 0) || (ep->hw.hbm_bw <= 0) ||
        (ep->hw.flops <= 0) || (ep->hw.link_bw <= 0) || (ep->weight_bytes <= 0)) {
        kvf_error("estimate figures out of range: mem-util %g, mfu %g, mbu %g in (0, 1]; "
                  "batch %d, prompt %d and context %d tokens >= 1; HBM %g B, %g B/s, "
                  "%g FLOP/s, link %g B/s, weight bytes %g > 0", ep->mem_util, ep->mfu,
                  ep->mbu, ep->batch, ep->prompt_tokens, ep->context_tokens, ep->hw.hbm_bytes,
                  ep->hw.hbm_bw, ep->hw.flops, ep->hw.link_bw, ep->weight_bytes);
        return KVF_ERR_INVALID_PARAM;
    }
    memset(&e, 0, sizeof(e));
    kvf_est_side(cfg, cost, &plan->prefill, P, ep, &e.prefill);
    kvf_est_side(cfg, cost, &plan->decode, D, ep, &e.decode);

    /* Prefill: every linear layer on L tokens (lm_head on the last one), causal
     * attention, the chunked Mamba scan; weights read once. */
    flops = 2.0 * (cost->active_params - lm_head) * L + 2.0 * lm_head +
            cfg->num_attention_layers * heads * 2.0 * hd * L * L +
            cfg->num_mamba_layers * L * inner_heads *
                (6.0 * cfg->mamba_head_dim * cfg->ssm_state_size +
                 2.0 * cfg->chunk_size * (cfg->mamba_head_dim + cfg->ssm_state_size));
    bytes = kvf_est_touched(cfg, cost, L * cfg->moe_top_k) * ep->weight_bytes / P +
            L * e.prefill.attn_bytes_per_token;
    e.prefill_ms = kvf_est_step_ms(flops, bytes, P, ep);

    /* Decode step: B tokens through every layer, attention over C tokens each;
     * weights touched once, KV read, Mamba state read and written. */
    state_bytes = (double)plan->decode.mamba_bytes * cfg->num_mamba_layers;
    flops = 2.0 * cost->active_params * B + cfg->num_attention_layers * heads * 4.0 * hd * C * B;
    bytes = kvf_est_touched(cfg, cost, B * cfg->moe_top_k) * ep->weight_bytes / D +
            B * C * e.decode.attn_bytes_per_token + 2.0 * B * state_bytes;
    e.decode_step_ms = kvf_est_step_ms(flops, bytes, D, ep);

    /* Transfer: the planner's bytes; the busiest link carries them. */
    e.transfer_bytes = (double)plan->pull_bytes_per_decode_rank * D;
    if (ep->link_shared) {
        e.transfer_link_bytes = e.transfer_bytes;
    } else {
        double per_prefill = e.transfer_bytes / P;
        e.transfer_link_bytes = fmax((double)plan->pull_bytes_per_decode_rank, per_prefill);
    }
    e.transfer_ms = 1000.0 * e.transfer_link_bytes / ep->hw.link_bw;
    *est_p = e;
    return KVF_OK;
}
