/*
 * kvf plan: the layout planner. For a model config and a list of P/D
 * layouts, prints what each side's ranks hold, the block sizes each side
 * would pick, what a decode rank pulls, and whether the pair can be served.
 * Run it before deploying; run it with --align per-rank to see why an
 * upstream deployment of the same model breaks.
 */
#include "kvf_cmds.h"
#include "kvf_config.h"
#include "kvf_engine_opts.h"
#include "kvf_estimate.h"
#include "kvf_layout.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char model[KVF_CONFIG_STR_MAX];
    char layouts[KVF_CONFIG_STR_MAX];
    int  block_size;
    int  exact_block_size;
    char kv_dtype[KVF_CONFIG_STR_MAX];
    char ssm_dtype[KVF_CONFIG_STR_MAX];
    char conv_dtype[KVF_CONFIG_STR_MAX];
    char align[KVF_CONFIG_STR_MAX];
    char kernel_block_sizes[KVF_CONFIG_STR_MAX];
    char kv_layout[KVF_CONFIG_STR_MAX];
    int  prompt_tokens;
    bool block_translation;
    bool json;
    /* --hardware estimates */
    char   hardware[KVF_CONFIG_STR_MAX];
    double hbm_gb, hbm_gbs, tflops, link_gbs;
    bool   link_shared;
    double mem_util, reserve_gb, mfu, mbu, weight_bytes;
    int    batch, context_tokens, output_tokens;
} kvf_plan_opts_t;

static const kvf_config_field_t kvf_plan_table[] = {
    {"MODEL", "", "model config.json, or a folder holding one",
     offsetof(kvf_plan_opts_t, model), KVF_CONFIG_TYPE_STRING, 0},
    {"LAYOUTS", "1p1d,1p2d,2p1d,2p2d,4p2d,2p4d,1p4d,4p1d,4p4d", "comma list of XpYd layouts",
     offsetof(kvf_plan_opts_t, layouts), KVF_CONFIG_TYPE_STRING, 0},
    KVF_ENGINE_OPT(BLOCK_SIZE, kvf_plan_opts_t, ),
    KVF_ENGINE_OPT(EXACT_BLOCK_SIZE, kvf_plan_opts_t, ),
    KVF_ENGINE_OPT(KV_DTYPE, kvf_plan_opts_t, ),
    KVF_ENGINE_OPT(SSM_DTYPE, kvf_plan_opts_t, ),
    KVF_ENGINE_OPT(CONV_DTYPE, kvf_plan_opts_t, ),
    KVF_ENGINE_OPT(KV_LAYOUT, kvf_plan_opts_t, ),
    {"ALIGN", "tp-stable", "block size alignment: tp-stable (kvferry) or per-rank (upstream)",
     offsetof(kvf_plan_opts_t, align), KVF_CONFIG_TYPE_STRING, 0},
    {"KERNEL_BLOCK_SIZES", "MultipleOf(16)", "block sizes the attention kernel accepts",
     offsetof(kvf_plan_opts_t, kernel_block_sizes), KVF_CONFIG_TYPE_STRING, 0},
    {"PROMPT_TOKENS", "8192", "prompt length for the bytes-to-pull column",
     offsetof(kvf_plan_opts_t, prompt_tokens), KVF_CONFIG_TYPE_INT, 0},
    {"BLOCK_TRANSLATION", "yes", "translate differing block sizes (no: refuse, as upstream)",
     offsetof(kvf_plan_opts_t, block_translation), KVF_CONFIG_TYPE_BOOL, 0},
    {"JSON", "no", "print JSON instead of tables",
     offsetof(kvf_plan_opts_t, json), KVF_CONFIG_TYPE_BOOL, 0},
    {"HARDWARE", "", "add estimates for this device: h100, h200, b200, or custom (give "
     "--hbm-gb, --hbm-gbs, --tflops and --link-gbs); empty: the summary estimates on h100, "
     "the per-layout sections carry none",
     offsetof(kvf_plan_opts_t, hardware), KVF_CONFIG_TYPE_STRING, 0},
    {"HBM_GB", "0", "device memory per GPU, GB (0: the --hardware figure)",
     offsetof(kvf_plan_opts_t, hbm_gb), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"HBM_GBS", "0", "device memory bandwidth, GB/s (0: the --hardware figure)",
     offsetof(kvf_plan_opts_t, hbm_gbs), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"TFLOPS", "0", "dense bf16 TFLOP/s per GPU (0: the --hardware figure)",
     offsetof(kvf_plan_opts_t, tflops), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"LINK_GBS", "0", "P->D link bandwidth per GPU (or shared: --link-shared), GB/s "
     "(0: the --hardware figure)", offsetof(kvf_plan_opts_t, link_gbs), KVF_CONFIG_TYPE_DOUBLE,
     0},
    {"LINK_SHARED", "no", "all ranks share one link (one NIC per node, or one host)",
     offsetof(kvf_plan_opts_t, link_shared), KVF_CONFIG_TYPE_BOOL, 0},
    {"MEM_UTIL", "0.9", "share of device memory an instance may use",
     offsetof(kvf_plan_opts_t, mem_util), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"RESERVE_GB", "4", "per GPU: activations, workspace and runtime, GB",
     offsetof(kvf_plan_opts_t, reserve_gb), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"MFU", "0.5", "achieved share of peak FLOP/s",
     offsetof(kvf_plan_opts_t, mfu), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"MBU", "0.8", "achieved share of peak memory bandwidth",
     offsetof(kvf_plan_opts_t, mbu), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"WEIGHT_BYTES", "0", "bytes per weight (0: the model's torch_dtype; 1 for fp8)",
     offsetof(kvf_plan_opts_t, weight_bytes), KVF_CONFIG_TYPE_DOUBLE, 0},
    {"BATCH", "64", "sequences per decode step (and whose Mamba state the capacity holds)",
     offsetof(kvf_plan_opts_t, batch), KVF_CONFIG_TYPE_INT, 0},
    {"CONTEXT_TOKENS", "0", "tokens each decode sequence attends to (0: --prompt-tokens)",
     offsetof(kvf_plan_opts_t, context_tokens), KVF_CONFIG_TYPE_INT, 0},
    {"OUTPUT_TOKENS", "256", "tokens generated per request, for the summary's throughput",
     offsetof(kvf_plan_opts_t, output_tokens), KVF_CONFIG_TYPE_INT, 0},
    {NULL, NULL, NULL, 0, 0, 0},
};

static int kvf_plan_params(const kvf_plan_opts_t *o, const kvf_model_config_t *cfg,
                           kvf_cache_params_t *p)
{
    kvf_cache_params_default(cfg, p);
    if (kvf_engine_opts_block_sizes(o->block_size, o->exact_block_size) != KVF_OK) {
        return -1;
    }
    if (o->prompt_tokens <= 0) {
        kvf_error("bad value %d for --prompt-tokens: must be positive", o->prompt_tokens);
        return -1;
    }
    if (o->output_tokens < 1) {
        kvf_error("bad value %d for --output-tokens: must be >= 1", o->output_tokens);
        return -1;
    }
    p->user_block_size = o->block_size;
    p->block_size = o->exact_block_size;
    /* planning only: fp8 is taken (nothing computes here) */
    if ((kvf_engine_opts_dtype("kv-dtype", o->kv_dtype, KVF_DTYPE_BF16, false,
                               &p->kv_dtype) != KVF_OK) ||
        (kvf_engine_opts_dtype("ssm-dtype", o->ssm_dtype, p->ssm_dtype, false,
                               &p->ssm_dtype) != KVF_OK) ||
        (kvf_engine_opts_dtype("conv-dtype", o->conv_dtype, p->conv_dtype, false,
                               &p->conv_dtype) != KVF_OK)) {
        return -1;
    }
    if (kvf_engine_opts_kv_layout(o->kv_layout, &p->kv_layout) != KVF_OK) {
        return -1;
    }
    if (strcmp(o->align, "tp-stable") == 0) {
        p->align = KVF_ALIGN_TP_STABLE;
    } else if (strcmp(o->align, "per-rank") == 0) {
        p->align = KVF_ALIGN_PER_RANK;
    } else {
        kvf_error("bad value '%s' for --align (tp-stable or per-rank)", o->align);
        return -1;
    }
    return (kvf_kernel_sizes_parse(o->kernel_block_sizes, &p->kernel_sizes) == KVF_OK) ? 0 : -1;
}

static void kvf_plan_heads(const kvf_shard_t *s, char *buf, size_t len)
{
    if (s->kv_replication > 1) {
        snprintf(buf, len, "%d (head %d, x%d replicated)", s->kv_heads, s->kv_head_start,
                 s->kv_replication);
    } else if (s->kv_heads == 1) {
        snprintf(buf, len, "1 (head %d)", s->kv_head_start);
    } else {
        snprintf(buf, len, "%d (heads %d-%d)", s->kv_heads, s->kv_head_start,
                 s->kv_head_start + s->kv_heads - 1);
    }
}

static const char *kvf_plan_groups(const kvf_shard_t *s, char *buf, size_t len)
{
    if (s->group_replication > 1) {
        snprintf(buf, len, "%d (x%d replicated)", s->groups, s->group_replication);
    } else {
        snprintf(buf, len, "%d", s->groups);
    }
    return buf;
}

/*
 * A sliding-window model: the bytes a window-bounded pull (KVF_XFER_PLAN_FLAG_WINDOW) reads
 * per decode rank: ceil(W / B) + 1 blocks of every sliding layer whatever the prompt, and the
 * full-attention layers' whole prompt (bytes a token) where the model mixes the two.
 */
static void kvf_plan_window_line(const kvf_model_config_t *cfg, const kvf_rank_geometry_t *dg)
{
    int sliding = 0;

    if (cfg->sliding_window <= 0) {
        return;
    }
    for (int l = 0; l < cfg->num_layers; ++l) {
        sliding += (cfg->layer_window[l] > 0);
    }
    const size_t blocks = (size_t)((cfg->sliding_window + dg->block_size - 1) /
                                   dg->block_size) + 1;
    const size_t bytes = blocks * (size_t)dg->block_size * dg->attn_bytes_per_token *
                         (size_t)sliding;
    if (sliding < cfg->num_attention_layers) {
        const int full = cfg->num_attention_layers - sliding;
        printf("  sliding window %d on %d of %d attention layers: a window-bounded pull reads"
               " the %d full layers' whole prompt (%zu bytes a token) and at most %zu blocks ="
               " %zu bytes of the sliding layers per decode rank\n", cfg->sliding_window,
               sliding, cfg->num_attention_layers, full,
               dg->attn_bytes_per_token * (size_t)full, blocks, bytes);
        return;
    }
    printf("  sliding window %d: a window-bounded pull reads at most %zu blocks = %zu bytes"
           " per decode rank, any prompt length\n", cfg->sliding_window, blocks, bytes);
}

/*
 * The KV cache groups (kvf_cache_layout_build): the full attention groups hold the whole
 * sequence; a sliding group's blocks before the window are given back as decode goes, so a
 * running request holds at most ceil(W / B) + 2 blocks of it (the window, the block being
 * written, the zero block standing for the freed ones), whatever its length.
 */
static void kvf_plan_groups_line(const kvf_model_config_t *cfg, const kvf_rank_geometry_t *dg)
{
    kvf_cache_layout_t *lay = malloc(sizeof(*lay));
    int full = 0, sliding = 0, mamba = 0, w = 0;

    if ((lay == NULL) || (kvf_cache_layout_build(cfg, lay) != KVF_OK)) {
        free(lay);
        return;
    }
    for (int g = 0; g < lay->num_groups; ++g) {
        full += (lay->groups[g].kind == KVF_GROUP_ATTENTION);
        mamba += (lay->groups[g].kind == KVF_GROUP_MAMBA);
        sliding += (lay->groups[g].kind == KVF_GROUP_SLIDING);
        w = (lay->groups[g].window > w) ? lay->groups[g].window : w;
    }
    const size_t block_bytes = (size_t)lay->slots * dg->page_size;
    printf("  kv cache groups: %d full attention, %d sliding, %d state; %d layer slots a block"
           " (%zu bytes per decode rank)\n", full, sliding, mamba, lay->slots, block_bytes);
    if (sliding > 0) {
        const size_t held = (size_t)((w + dg->block_size - 1) / dg->block_size + 2);
        printf("  sliding group: window %d, decode holds at most %zu blocks = %zu bytes of"
               " each of the %d sliding groups per request and decode rank, any length; each"
               " full group ceil(N / %d) blocks\n", w, held, held * block_bytes, sliding,
               dg->block_size);
    }
    free(lay);
}

static void kvf_plan_print_text(const kvf_model_config_t *cfg, const kvf_cache_params_t *p,
                                const kvf_layout_plan_t *pl, int prompt_tokens)
{
    const kvf_rank_geometry_t *g[2] = {&pl->prefill, &pl->decode};
    char h[2][128];  /* [0,64): KV heads text, [64,128): groups text */

    printf("layout %dp%dd  tp_ratio %d  verdict %s\n", pl->layout.prefill_tp,
           pl->layout.decode_tp, pl->tp_ratio, kvf_verdict_str(pl->verdict));
    if ((pl->verdict == KVF_VERDICT_REFUSED) && (pl->prefill.block_size == 0)) {
        printf("  refused: %s prefill=%s decode=%s: %s\n\n", pl->field, pl->prefill_value,
               pl->decode_value, pl->why);
        return;
    }
    kvf_plan_heads(&g[0]->shard, h[0], 64);
    kvf_plan_heads(&g[1]->shard, h[1], 64);
    printf("  %-34s %24s %24s\n", "", "prefill", "decode");
    printf("  %-34s %24d %24d\n", "tp_size", g[0]->shard.tp_size, g[1]->shard.tp_size);
    printf("  %-34s %24s %24s\n", "kv heads per rank", h[0], h[1]);
    if (kvf_model_is_hybrid(cfg) && (cfg->state_kind == KVF_STATE_GDN)) {
        /* the state group of Gated DeltaNet layers: value heads, key heads (B/C's place) */
        printf("  %-34s %24d %24d\n", "gdn value heads per rank", g[0]->shard.mamba_heads,
               g[1]->shard.mamba_heads);
        printf("  %-34s %24s %24s\n", "gdn key heads per rank",
               kvf_plan_groups(&g[0]->shard, h[0] + 64, 64),
               kvf_plan_groups(&g[1]->shard, h[1] + 64, 64));
    } else if (kvf_model_is_hybrid(cfg)) {
        printf("  %-34s %24d %24d\n", "mamba heads per rank", g[0]->shard.mamba_heads,
               g[1]->shard.mamba_heads);
        printf("  %-34s %24s %24s\n", "B/C groups per rank",
               kvf_plan_groups(&g[0]->shard, h[0] + 64, 64),
               kvf_plan_groups(&g[1]->shard, h[1] + 64, 64));
    }
    printf("  %-34s %24zu %24zu\n", "A1 attention bytes/token/layer", g[0]->attn_bytes_per_token,
           g[1]->attn_bytes_per_token);
    printf("  %-34s %24zu %24zu\n", (cfg->state_kind == KVF_STATE_GDN) ?
           "M gdn state bytes/layer" : "M mamba state bytes/layer", g[0]->mamba_bytes,
           g[1]->mamba_bytes);
    printf("  %-34s %24d %24d\n", "logical block_size (tokens)", g[0]->block_size,
           g[1]->block_size);
    printf("  %-34s %24d %24d\n", "kernel_block_size (tokens)", g[0]->kernel_block_size,
           g[1]->kernel_block_size);
    printf("  %-34s %24d %24d\n", "ppl (kernel blocks per block)", g[0]->ppl, g[1]->ppl);
    printf("  %-34s %24zu %24zu\n", "page_size (bytes)", g[0]->page_size, g[1]->page_size);
    printf("  %-34s %24s %24s\n", "kv layout (attention block)",
           kvf_kv_layout_name((int)g[0]->kv_layout), kvf_kv_layout_name((int)g[1]->kv_layout));
    printf("  %-34s %23.2f%% %23.2f%%\n", "mamba page padding", g[0]->mamba_padding_pct,
           g[1]->mamba_padding_pct);
    printf("  %-34s %24zu %24zu\n", "KV bytes/token/rank (all layers)",
           g[0]->attn_bytes_per_token * (size_t)cfg->num_attention_layers,
           g[1]->attn_bytes_per_token * (size_t)cfg->num_attention_layers);
    printf("  pull per decode rank for %d tokens: %zu bytes (%.2f MiB)\n", prompt_tokens,
           pl->pull_bytes_per_decode_rank, (double)pl->pull_bytes_per_decode_rank / 1048576.0);
    printf("  reads (prefill rank -> decode rank): %d in all, at most %d per decode rank\n",
           pl->reads, pl->max_reads_per_decode_rank);
    kvf_plan_window_line(cfg, g[1]);
    kvf_plan_groups_line(cfg, g[1]);
    if (pl->verdict != KVF_VERDICT_COMPATIBLE) {
        printf("  %s: %s prefill=%s decode=%s: %s\n", kvf_verdict_str(pl->verdict), pl->field,
               pl->prefill_value, pl->decode_value, pl->why);
    }
    (void)p;
    printf("\n");
}

static cJSON *kvf_plan_side_json(const kvf_model_config_t *cfg, const kvf_rank_geometry_t *g)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tp_size", g->shard.tp_size);
    cJSON_AddNumberToObject(o, "kv_heads_per_rank", g->shard.kv_heads);
    cJSON_AddNumberToObject(o, "kv_replication", g->shard.kv_replication);
    cJSON_AddNumberToObject(o, "mamba_heads_per_rank", g->shard.mamba_heads);
    cJSON_AddNumberToObject(o, "groups_per_rank", g->shard.groups);
    cJSON_AddNumberToObject(o, "group_replication", g->shard.group_replication);
    cJSON_AddNumberToObject(o, "attn_bytes_per_token", (double)g->attn_bytes_per_token);
    cJSON_AddNumberToObject(o, "mamba_bytes", (double)g->mamba_bytes);
    cJSON_AddNumberToObject(o, "block_size", g->block_size);
    cJSON_AddNumberToObject(o, "kernel_block_size", g->kernel_block_size);
    cJSON_AddNumberToObject(o, "ppl", g->ppl);
    cJSON_AddNumberToObject(o, "page_size", (double)g->page_size);
    cJSON_AddStringToObject(o, "kv_layout", kvf_kv_layout_name((int)g->kv_layout));
    cJSON_AddNumberToObject(o, "padding_pct", g->mamba_padding_pct);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token_rank",
                            (double)(g->attn_bytes_per_token * (size_t)cfg->num_attention_layers));
    return o;
}

static cJSON *kvf_plan_json(const kvf_model_config_t *cfg, const kvf_layout_plan_t *pl)
{
    cJSON *o = cJSON_CreateObject();
    char name[32];

    snprintf(name, sizeof(name), "%dp%dd", pl->layout.prefill_tp, pl->layout.decode_tp);
    cJSON_AddStringToObject(o, "layout", name);
    cJSON_AddNumberToObject(o, "tp_ratio", pl->tp_ratio);
    cJSON_AddStringToObject(o, "verdict", kvf_verdict_str(pl->verdict));
    if (pl->verdict != KVF_VERDICT_COMPATIBLE) {
        cJSON_AddStringToObject(o, "field", pl->field);
        cJSON_AddStringToObject(o, "prefill_value", pl->prefill_value);
        cJSON_AddStringToObject(o, "decode_value", pl->decode_value);
        cJSON_AddStringToObject(o, "why", pl->why);
    }
    if (pl->prefill.block_size > 0) {
        cJSON_AddItemToObject(o, "prefill", kvf_plan_side_json(cfg, &pl->prefill));
        cJSON_AddItemToObject(o, "decode", kvf_plan_side_json(cfg, &pl->decode));
        cJSON_AddNumberToObject(o, "pull_bytes_per_decode_rank",
                                (double)pl->pull_bytes_per_decode_rank);
        cJSON_AddNumberToObject(o, "reads", pl->reads);
        cJSON_AddNumberToObject(o, "max_reads_per_decode_rank", pl->max_reads_per_decode_rank);
    }
    return o;
}

/* The --hardware figures with the overrides applied; 0, 1 (no estimates asked), -1 bad. */
static int kvf_plan_estimate_params(const kvf_plan_opts_t *o, const kvf_model_config_t *cfg,
                                    kvf_estimate_params_t *ep)
{
    const struct {
        const char *flag;
        double      value;
        double     *dst;
        double      scale;
    } ov[] = {
        {"hbm-gb", o->hbm_gb, &ep->hw.hbm_bytes, 1e9},
        {"hbm-gbs", o->hbm_gbs, &ep->hw.hbm_bw, 1e9},
        {"tflops", o->tflops, &ep->hw.flops, 1e12},
        {"link-gbs", o->link_gbs, &ep->hw.link_bw, 1e9},
    };

    memset(ep, 0, sizeof(*ep));
    if (o->hardware[0] == '\0') {
        return 1;
    }
    if (strcmp(o->hardware, "custom") == 0) {
        snprintf(ep->hw.name, sizeof(ep->hw.name), "custom");
    } else if (kvf_hw_lookup(o->hardware, &ep->hw) != KVF_OK) {
        kvf_error("bad value '%s' for --hardware (h100, h200, b200, custom)", o->hardware);
        return -1;
    }
    for (size_t i = 0; i < sizeof(ov) / sizeof(ov[0]); ++i) {
        if (ov[i].value < 0) {
            kvf_error("bad value %g for --%s: must be positive (0: the --hardware figure)",
                      ov[i].value, ov[i].flag);
            return -1;
        }
        if (ov[i].value > 0) {
            *ov[i].dst = ov[i].value * ov[i].scale;
        } else if (*ov[i].dst <= 0) {
            kvf_error("--hardware custom needs --%s", ov[i].flag);
            return -1;
        }
    }
    ep->weight_bytes = (o->weight_bytes > 0) ? o->weight_bytes :
                       (double)kvf_dtype_size(cfg->torch_dtype);
    ep->mem_util = o->mem_util;
    ep->reserve_bytes = o->reserve_gb * 1e9;
    ep->mfu = o->mfu;
    ep->mbu = o->mbu;
    ep->batch = o->batch;
    ep->prompt_tokens = o->prompt_tokens;
    ep->context_tokens = (o->context_tokens > 0) ? o->context_tokens : o->prompt_tokens;
    ep->link_shared = o->link_shared;
    {
        const struct {
            const char *flag;
            double      v;
        } share[] = {{"mem-util", o->mem_util}, {"mfu", o->mfu}, {"mbu", o->mbu}};
        for (size_t i = 0; i < sizeof(share) / sizeof(share[0]); ++i) {
            if (!(share[i].v > 0) || (share[i].v > 1)) {
                kvf_error("bad value %g for --%s: must be in (0, 1]", share[i].v, share[i].flag);
                return -1;
            }
        }
    }
    if (o->batch < 1) {
        kvf_error("bad value %d for --batch: must be >= 1", o->batch);
        return -1;
    }
    if ((o->weight_bytes < 0) || (o->reserve_gb < 0) || (o->context_tokens < 0)) {
        kvf_error("bad value for --weight-bytes %g, --reserve-gb %g or --context-tokens %d: "
                  "must not be negative", o->weight_bytes, o->reserve_gb, o->context_tokens);
        return -1;
    }
    return 0;
}

static void kvf_plan_print_estimate(const kvf_estimate_params_t *ep, const kvf_model_cost_t *cost,
                                    const kvf_layout_estimate_t *e)
{
    const kvf_side_estimate_t *sd[2] = {&e->prefill, &e->decode};
    const char *names[2] = {"prefill", "decode"};

    printf("  estimates on %s (%.0f GB, %.0f GB/s HBM, %.0f TFLOP/s, link %.0f GB/s%s; "
           "mfu %.2f, mbu %.2f):\n", ep->hw.name, ep->hw.hbm_bytes / 1e9, ep->hw.hbm_bw / 1e9,
           ep->hw.flops / 1e12, ep->hw.link_bw / 1e9, ep->link_shared ? " shared" : " per GPU",
           ep->mfu, ep->mbu);
    printf("    weights %.2f B params (%.2f B active per token)\n", cost->total_params / 1e9,
           cost->active_params / 1e9);
    for (int i = 0; i < 2; ++i) {
        const kvf_side_estimate_t *s = sd[i];
        if (s->cache_per_rank <= 0) {
            printf("    %-7s TP%d: weights %.1f GB/GPU do not fit in %.1f GB\n", names[i], s->tp,
                   s->weights_per_rank / 1e9, ep->hw.hbm_bytes * ep->mem_util / 1e9);
            continue;
        }
        printf("    %-7s TP%d: weights %.1f GB/GPU, KV+Mamba %.1f GB/GPU: %lld tokens per "
               "instance with %d sequences' Mamba state, %lld sequences of %d tokens\n",
               names[i], s->tp, s->weights_per_rank / 1e9, s->cache_per_rank / 1e9,
               s->capacity_tokens, ep->batch, s->max_seqs, ep->prompt_tokens);
    }
    printf("    prefill of %d tokens: %.1f ms;  decode step, batch %d at %d tokens: %.2f ms\n",
           ep->prompt_tokens, e->prefill_ms, ep->batch, ep->context_tokens, e->decode_step_ms);
    printf("    KV transfer: %.1f MB in all, %.1f MB on the busiest link: %.2f ms\n",
           e->transfer_bytes / 1e6, e->transfer_link_bytes / 1e6, e->transfer_ms);
}

static cJSON *kvf_plan_estimate_json(const kvf_estimate_params_t *ep, const kvf_model_cost_t *cost,
                                     const kvf_layout_estimate_t *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *hw = cJSON_AddObjectToObject(o, "hardware");
    const kvf_side_estimate_t *sd[2] = {&e->prefill, &e->decode};
    const char *names[2] = {"prefill", "decode"};

    cJSON_AddStringToObject(hw, "name", ep->hw.name);
    cJSON_AddNumberToObject(hw, "hbm_bytes", ep->hw.hbm_bytes);
    cJSON_AddNumberToObject(hw, "hbm_bytes_per_s", ep->hw.hbm_bw);
    cJSON_AddNumberToObject(hw, "flops", ep->hw.flops);
    cJSON_AddNumberToObject(hw, "link_bytes_per_s", ep->hw.link_bw);
    cJSON_AddBoolToObject(hw, "link_shared", ep->link_shared);
    cJSON_AddNumberToObject(o, "total_params", cost->total_params);
    cJSON_AddNumberToObject(o, "active_params", cost->active_params);
    for (int i = 0; i < 2; ++i) {
        cJSON *s = cJSON_AddObjectToObject(o, names[i]);
        cJSON_AddNumberToObject(s, "weights_bytes_per_rank", sd[i]->weights_per_rank);
        cJSON_AddNumberToObject(s, "cache_bytes_per_rank", sd[i]->cache_per_rank);
        cJSON_AddBoolToObject(s, "fits", sd[i]->cache_per_rank > 0);
        cJSON_AddNumberToObject(s, "capacity_tokens", (double)sd[i]->capacity_tokens);
        cJSON_AddNumberToObject(s, "max_seqs", (double)sd[i]->max_seqs);
    }
    cJSON_AddNumberToObject(o, "prompt_tokens", ep->prompt_tokens);
    cJSON_AddNumberToObject(o, "batch", ep->batch);
    cJSON_AddNumberToObject(o, "context_tokens", ep->context_tokens);
    cJSON_AddNumberToObject(o, "prefill_ms", e->prefill_ms);
    cJSON_AddNumberToObject(o, "decode_step_ms", e->decode_step_ms);
    cJSON_AddNumberToObject(o, "transfer_bytes", e->transfer_bytes);
    cJSON_AddNumberToObject(o, "transfer_link_bytes", e->transfer_link_bytes);
    cJSON_AddNumberToObject(o, "transfer_ms", e->transfer_ms);
    return o;
}

/* One layout's line of the closing summary. */
typedef struct {
    char                  name[16];
    kvf_verdict_t         verdict;
    char                  why[320];       /* a refusal's field and reason */
    bool                  est_ok;
    kvf_layout_estimate_t est;
} kvf_plan_row_t;

#define KVF_PLAN_MAX_ROWS 64

/* Bytes one rank of a side holds: weights, and KV + Mamba state for @a seqs sequences of
 * @a tokens each. */
static double kvf_plan_rank_bytes(const kvf_side_estimate_t *s, int seqs, int tokens)
{
    return s->weights_per_rank + (double)seqs * (s->attn_bytes_per_token * (double)tokens +
                                                 s->mamba_bytes_per_seq);
}

/* Requests/s per GPU of one prefill and one decode instance: the slowest of the prefill rate,
 * the decode rate (batch sequences of @a out tokens) and the link; @a bound names it. */
static double kvf_plan_rate(const kvf_estimate_params_t *ep, int out,
                            const kvf_layout_estimate_t *e, const char **bound)
{
    double pre = 1000.0 / e->prefill_ms;
    double dec = (double)ep->batch * 1000.0 / (e->decode_step_ms * (double)out);
    double link = (e->transfer_ms > 0) ? 1000.0 / e->transfer_ms : pre;
    double r = pre;

    *bound = "prefill-bound";
    if (dec < r) {
        r = dec;
        *bound = "decode-bound";
    }
    if (link < r) {
        r = link;
        *bound = "link-bound";
    }
    return r / (double)(e->prefill.tp + e->decode.tp);
}

static void kvf_plan_print_terms(void)
{
    static const char *const terms[] = {
        "XpYd: a prefill instance of TP X ranks (GPUs) and a decode instance of TP Y",
        "tp_ratio: Y/X when decode has more ranks, -X/Y when prefill has (-2: two prefill "
        "ranks feed each decode rank)",
        "A1: attention KV bytes per token per layer on one rank",
        "M: Mamba2 (or Gated DeltaNet) conv + SSM (recurrent) state bytes per layer per"
        " sequence on one rank",
        "logical block: the tokens one block-table entry covers; kernel block: the tokens the "
        "attention kernel reads as one page; ppl: kernel blocks per logical block",
        "page_size: one logical block's bytes on one rank (a Mamba layer's state fills one)",
        "reads: prefill->decode rank pairs of one request's pull",
        "translated: the two sides' block sizes differ; the pull copies runs into place",
    };

    printf("terms:\n");
    for (size_t i = 0; i < sizeof(terms) / sizeof(terms[0]); ++i) {
        printf("  %s\n", terms[i]);
    }
}

/* The closing table: every layout side by side, estimates on @a ep, and a recommendation. */
static void kvf_plan_print_summary(const kvf_plan_opts_t *o, const kvf_estimate_params_t *ep,
                                   bool have_est, const kvf_plan_row_t *rows, int n)
{
    int best = -1, second = -1;
    double rate[KVF_PLAN_MAX_ROWS];

    printf("summary: one prefill and one decode instance per layout; %d-token prompts, %d-token"
           " outputs, decode batch %d", ep->prompt_tokens, o->output_tokens, ep->batch);
    if (have_est) {
        printf("; estimates on %s%s (roofline: mfu %.2f, mbu %.2f)\n", ep->hw.name,
               (o->hardware[0] == '\0') ? " (the default; --hardware to choose)" : "",
               ep->mfu, ep->mbu);
    } else {
        printf("; no estimates (the model's parameters could not be counted)\n");
    }
    printf("%-8s %-23s %10s %15s %11s %13s  %s\n", "layout", "memory/rank GB (P | D)",
           "prefill ms", "decode step ms", "transfer ms", "req/s per GPU", "verdict");
    for (int i = 0; i < n; ++i) {
        const kvf_plan_row_t *r = &rows[i];
        const kvf_layout_estimate_t *e = &r->est;
        const char *bound = "";
        char mem[64];
        bool fits;

        rate[i] = -1;
        if (!r->est_ok) {
            printf("%-8s %-23s %10s %15s %11s %13s  %s%s%s\n", r->name, "-", "-", "-", "-", "-",
                   kvf_verdict_str(r->verdict), r->why[0] ? ": " : "", r->why);
            continue;
        }
        fits = (e->prefill.cache_per_rank >= kvf_plan_rank_bytes(&e->prefill, 1,
                                                                 ep->prompt_tokens) -
                e->prefill.weights_per_rank) &&
               (e->decode.cache_per_rank >= kvf_plan_rank_bytes(&e->decode, ep->batch,
                                                                ep->context_tokens) -
                e->decode.weights_per_rank) &&
               (e->prefill.cache_per_rank > 0) && (e->decode.cache_per_rank > 0);
        snprintf(mem, sizeof(mem), "%.1f | %.1f",
                 kvf_plan_rank_bytes(&e->prefill, 1, ep->prompt_tokens) / 1e9,
                 kvf_plan_rank_bytes(&e->decode, ep->batch, ep->context_tokens) / 1e9);
        if (fits) {
            rate[i] = kvf_plan_rate(ep, o->output_tokens, e, &bound);
            if ((best < 0) || (rate[i] > rate[best])) {
                second = best;
                best = i;
            } else if ((second < 0) || (rate[i] > rate[second])) {
                second = i;
            }
        }
        printf("%-8s %-23s %10.2f %15.2f %11.3f %13.3f  %s, %s\n", r->name, mem, e->prefill_ms,
               e->decode_step_ms, e->transfer_ms, fits ? rate[i] : 0.0,
               kvf_verdict_str(r->verdict), fits ? bound : "does not fit in memory");
    }
    if (best >= 0) {
        printf("recommended: %s, %.3f req/s per GPU", rows[best].name, rate[best]);
        if (second >= 0) {
            printf(", %.0f %% ahead of %s (%.3f)", 100.0 * (rate[best] / rate[second] - 1.0),
                   rows[second].name, rate[second]);
        }
        printf("\n");
    }
    printf("memory/rank: weights + KV and Mamba state (prefill: one prompt; decode: the batch at "
           "its context); req/s per GPU: the pair's rate (the slowest of prefill, decode and "
           "the link) over its GPUs; estimates, not measurements\n");
    kvf_plan_print_terms();
}

/* The summary's estimate figures: --hardware's, else h100's (@a cost counted if not yet).
 * true when the table can carry estimates. */
static bool kvf_plan_table_params(const kvf_plan_opts_t *o, const kvf_model_config_t *cfg,
                                  int want_est, const kvf_estimate_params_t *ep,
                                  kvf_estimate_params_t *ep_tab, kvf_model_cost_t *cost)
{
    kvf_plan_opts_t o2 = *o;

    *ep_tab = *ep;
    if (want_est == 0) {
        return true;
    }
    if (o->json) {
        return false;
    }
    snprintf(o2.hardware, sizeof(o2.hardware), "h100");
    return (kvf_plan_estimate_params(&o2, cfg, ep_tab) == 0) &&
           (kvf_model_cost(cfg, cost) == KVF_OK);
}

/* One layout's summary row; @a cost NULL: no estimates. */
static void kvf_plan_row(const kvf_model_config_t *cfg, const kvf_model_cost_t *cost,
                         const kvf_estimate_params_t *ep, const kvf_layout_plan_t *pl,
                         kvf_plan_row_t *r)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%dp%dd", pl->layout.prefill_tp, pl->layout.decode_tp);
    r->verdict = pl->verdict;
    if (pl->verdict == KVF_VERDICT_REFUSED) {
        snprintf(r->why, sizeof(r->why), "%s", pl->why);
    }
    r->est_ok = (cost != NULL) && (pl->verdict != KVF_VERDICT_REFUSED) &&
                (kvf_layout_estimate(cfg, cost, pl, ep, &r->est) == KVF_OK);
}

/* The text output's first line: the model and the options every layout is planned with. */
static void kvf_plan_print_header(const kvf_plan_opts_t *o, const kvf_model_config_t *cfg,
                                  const kvf_cache_params_t *params)
{
    char ks[64];

    kvf_kernel_sizes_format(&params->kernel_sizes, ks, sizeof(ks));
    printf("model %s (%s): %d layers, %d attention, %d %s; kv %s, conv %s, ssm %s;"
           " align %s, user block %d, kernel accepts %s\n\n", o->model, cfg->model_type,
           cfg->num_layers, cfg->num_attention_layers, cfg->num_mamba_layers,
           (cfg->state_kind == KVF_STATE_GDN) ? "gated deltanet" : "mamba",
           kvf_dtype_name(params->kv_dtype), kvf_dtype_name(params->conv_dtype),
           kvf_dtype_name(params->ssm_dtype), o->align, o->block_size, ks);
}

int kvf_cmd_plan(int argc, char **argv)
{
    kvf_estimate_params_t ep;
    kvf_model_cost_t cost;
    int want_est;
    kvf_plan_opts_t o;
    kvf_model_config_t cfg;
    kvf_cache_params_t params;
    char layouts[KVF_CONFIG_STR_MAX];
    cJSON *arr = NULL;
    bool done;
    int refused = 0;
    int nlayouts = 0;
    kvf_estimate_params_t ep_tab;
    bool have_tab;
    static kvf_plan_row_t rows[KVF_PLAN_MAX_ROWS];
    int nrows = 0;

    memset(&o, 0, sizeof(o));
    if (kvf_config_parse(kvf_plan_table, "kvf plan", argc, argv, &o, &done) != KVF_OK) {
        return 2;
    }
    if (done) {
        return 0;
    }
    if (o.model[0] == '\0') {
        kvf_error("kvf plan: --model is required (a config.json or a model folder)");
        return 2;
    }
    if (kvf_model_config_load(o.model, &cfg) != KVF_OK) {
        return 1;
    }
    if (kvf_plan_params(&o, &cfg, &params) != 0) {
        return 2;
    }
    want_est = kvf_plan_estimate_params(&o, &cfg, &ep);
    if (want_est < 0) {
        return 2;
    }
    if ((want_est == 0) && (kvf_model_cost(&cfg, &cost) != KVF_OK)) {
        return 1;
    }
    have_tab = kvf_plan_table_params(&o, &cfg, want_est, &ep, &ep_tab, &cost);
    if (o.json) {
        arr = cJSON_CreateArray();
    } else {
        kvf_plan_print_header(&o, &cfg, &params);
    }

    snprintf(layouts, sizeof(layouts), "%s", o.layouts);
    for (char *save = NULL, *tok = strtok_r(layouts, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        kvf_layout_t layout;
        kvf_layout_plan_t pl;

        ++nlayouts;
        if (kvf_layout_parse(tok, &layout) != KVF_OK) {
            cJSON_Delete(arr);
            return 2;
        }
        if (kvf_layout_plan(&cfg, &params, layout, o.prompt_tokens, o.block_translation, &pl) !=
            KVF_OK) {
            cJSON_Delete(arr);
            return 1;
        }
        if ((pl.verdict == KVF_VERDICT_REFUSED) && (strcmp(pl.field, "tp_size") == 0)) {
            /* one-line error on stderr too: a layout the model cannot shard is bad input */
            kvf_error("layout %s: %s", tok, pl.why);
        } else if ((pl.verdict == KVF_VERDICT_REFUSED) && (strcmp(pl.field, "block_size") == 0)) {
            int bs;   /* logs the smallest block size that fits the failing side */
            (void)kvf_block_size_select(&cfg, &params, layout.prefill_tp, &bs);
            if (layout.decode_tp != layout.prefill_tp) {
                (void)kvf_block_size_select(&cfg, &params, layout.decode_tp, &bs);
            }
        }
        refused += (pl.verdict == KVF_VERDICT_REFUSED);
        if (nrows < KVF_PLAN_MAX_ROWS) {
            kvf_plan_row(&cfg, have_tab ? &cost : NULL, &ep_tab, &pl, &rows[nrows++]);
        }
        if ((want_est == 0) && (pl.verdict != KVF_VERDICT_REFUSED)) {
            kvf_layout_estimate_t est;
            if (kvf_layout_estimate(&cfg, &cost, &pl, &ep, &est) != KVF_OK) {
                cJSON_Delete(arr);
                return 2;
            }
            if (o.json) {
                cJSON *j = kvf_plan_json(&cfg, &pl);
                cJSON_AddItemToObject(j, "estimate", kvf_plan_estimate_json(&ep, &cost, &est));
                cJSON_AddItemToArray(arr, j);
            } else {
                kvf_plan_print_text(&cfg, &params, &pl, o.prompt_tokens);
                kvf_plan_print_estimate(&ep, &cost, &est);
                printf("\n");
            }
        } else if (o.json) {
            cJSON_AddItemToArray(arr, kvf_plan_json(&cfg, &pl));
        } else {
            kvf_plan_print_text(&cfg, &params, &pl, o.prompt_tokens);
        }
    }
    if (nlayouts == 0) {
        kvf_error("kvf plan: --layouts '%s' names no layout (e.g. 1p1d,4p2d)", o.layouts);
        cJSON_Delete(arr);
        return 2;
    }
    if (o.json) {
        char *text = cJSON_Print(arr);
        printf("%s\n", text);
        free(text);
        cJSON_Delete(arr);
    } else {
        kvf_plan_print_summary(&o, &ep_tab, have_tab, rows, nrows);
    }
    return (refused > 0) ? 1 : 0;
}
