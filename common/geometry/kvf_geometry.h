/*
 * Per-rank cache geometry: bytes per token, Mamba state bytes, logical and
 * kernel block size, page size, and the byte layout inside a page.
 *
 * Page pool layout (per rank, one registered region): num_blocks blocks,
 * each block = `slots` consecutive pages of page_size bytes. KV cache group
 * g's j-th layer uses page `slot j` of the group's blocks, as in vLLM's
 * hybrid allocator, so one block id may hold attention K/V in one request and
 * Mamba state in the next:
 *
 *   page(block b, slot j)  = base + (b * slots + j) * page_size
 *   attention page         = ppl kernel blocks, each HND:
 *                            [K|V][kv_heads_rank][kernel_block_size][head_dim]
 *                            (--kv-layout layer-major, the default); with head-major an
 *                            attention block is [kv head][slot][kernel block][K|V][tokens]
 *                            [head_dim] instead (kernels/kvf_kv_layout.h; the block's bytes
 *                            and a Mamba page are unchanged). Every attention address
 *                            goes through kvf_rank_geometry_t.attn (kvf_attn_slot_off +
 *                            kvf_attn_offset).
 *   Mamba page             = [conv state (conv_dim_rank, conv_kernel-1),
 *                             dimension-first, x|B|C channels
 *                            | SSM state (mamba_heads_rank, head_dim, state)
 *                            | padding, never transferred]
 *
 * Block-size rules (docs/ARCHITECTURE.md §1, vLLM's HybridAttentionMambaModelConfig):
 * a Mamba page must fit in an attention page, so block_size is inflated to
 * the smallest multiple of a = max(16, user block) with
 * block_size * A1 >= M. KVF_ALIGN_PER_RANK uses this rank's A1 and M (what
 * upstream engines do; it changes with TP). KVF_ALIGN_TP_STABLE takes the
 * maximum over every TP degree the model can be sharded to, so prefill and
 * decode of one model agree at any TP.
 */
#ifndef KVF_GEOMETRY_H
#define KVF_GEOMETRY_H

#include "kvf_kv_layout.h"
#include "kvf_shard.h"

#include <stddef.h>
#include <stdint.h>

#define KVF_MAX_KV_GROUPS     64
#define KVF_MAX_KERNEL_SIZES   8
#define KVF_MAX_SLOTS          KVF_MAX_LAYERS  /* layers per KV cache group = pages per
                                                 * block; a group never has more layers
                                                 * than the model */
#define KVF_MIN_ALIGN_TOKENS  16

typedef enum {
    KVF_ALIGN_TP_STABLE = 0,  /* default: same block size at every TP */
    KVF_ALIGN_PER_RANK  = 1,  /* upstream behaviour, for comparison */
} kvf_align_mode_t;

/** Block sizes an attention kernel accepts: exact values and/or MultipleOf(n). */
typedef struct kvf_kernel_sizes {
    int num_exact;
    int exact[KVF_MAX_KERNEL_SIZES];
    int multiple_of;          /* 0: none */
} kvf_kernel_sizes_t;

typedef struct kvf_cache_params {
    kvf_dtype_t        kv_dtype;       /* attention cache */
    kvf_dtype_t        conv_dtype;     /* Mamba conv state */
    kvf_dtype_t        ssm_dtype;      /* Mamba SSM state */
    int                user_block_size;/* alignment unit hint; 0 -> 16 */
    int                block_size;     /* explicit logical size; 0 -> derive */
    kvf_align_mode_t   align;
    kvf_kernel_sizes_t kernel_sizes;   /* all zero -> MultipleOf(16) */
    kvf_kv_layout_t    kv_layout;      /* attention block layout; 0: layer-major */
} kvf_cache_params_t;

/**
 * Parse "layer-major" / "head-major" into @a layout_p. KVF_ERR_INVALID_PARAM (logged naming
 * @a what and the value, and the accepted ones) for anything else, NULL included.
 */
kvf_status_t kvf_kv_layout_parse(const char *text, const char *what, kvf_kv_layout_t *layout_p);

/**
 * Defaults: bf16 KV; conv state in the model's dtype (config.json "dtype" or
 * "torch_dtype") and SSM state in mamba_ssm_cache_dtype (as vLLM) -- the one
 * rule every tool and daemon uses for "auto"; TP-stable alignment; user block 16;
 * kernel accepts MultipleOf(16). @a cfg may be NULL (bf16 conv, fp32 SSM).
 */
void kvf_cache_params_default(const kvf_model_config_t *cfg, kvf_cache_params_t *params_p);

typedef enum {
    KVF_GROUP_ATTENTION = 0,   /* full attention layers */
    KVF_GROUP_MAMBA     = 1,   /* Mamba2 / Gated DeltaNet state layers */
    KVF_GROUP_SLIDING   = 2,   /* attention layers with a sliding window (cfg.layer_window) */
} kvf_group_kind_t;

/** True for the kinds that hold K/V per token (full and sliding attention). */
static inline int kvf_group_is_attention(kvf_group_kind_t kind)
{
    return (kind == KVF_GROUP_ATTENTION) || (kind == KVF_GROUP_SLIDING);
}

typedef struct kvf_kv_group {
    kvf_group_kind_t kind;
    int              num_layers;           /* <= slots */
    int              layers[KVF_MAX_SLOTS];  /* model layer index per slot */
    int              window;               /* KVF_GROUP_SLIDING: the largest window of its
                                            * layers, tokens; 0 for the other kinds */
} kvf_kv_group_t;

/**
 * KV cache groups (vLLM hybrid allocator): layers of one kind, chunked into
 * groups of `slots` layers, slots = the smallest per-kind layer count. Kinds:
 * full attention, sliding attention (a layer with cfg.layer_window > 0), Mamba,
 * in that order of group index. Attention and sliding group blocks:
 * ceil(tokens / block_size) per request, a sliding group's blocks wholly before
 * its window given back as they leave it; Mamba group: one block per request.
 */
typedef struct kvf_cache_layout {
    int            slots;
    int            num_groups;
    kvf_kv_group_t groups[KVF_MAX_KV_GROUPS];
    int            layer_group[KVF_MAX_LAYERS];  /* -1 for layers without cache */
    int            layer_slot[KVF_MAX_LAYERS];
} kvf_cache_layout_t;

/** Pages per block of @a cfg (kvf_cache_layout_t.slots): the smallest per-kind layer count. */
int kvf_cache_slots(const kvf_model_config_t *cfg);

/** Build the cache layout of @a cfg. KVF_ERR_INVALID_PARAM if over KVF_MAX_KV_GROUPS. */
kvf_status_t kvf_cache_layout_build(const kvf_model_config_t *cfg, kvf_cache_layout_t *layout_p);

typedef struct kvf_rank_geometry {
    kvf_shard_t  shard;
    kvf_dtype_t  kv_dtype, conv_dtype, ssm_dtype;

    size_t       attn_bytes_per_token;   /* A1: K+V of one layer, this rank */
    size_t       conv_bytes;             /* conv_dim_rank * (conv_kernel-1) * conv elt */
    size_t       ssm_bytes;              /* mamba_heads_rank * head_dim * state * ssm elt */
    size_t       mamba_bytes;            /* M = conv_bytes + ssm_bytes; 0 for dense */

    int          block_size;             /* logical block, tokens */
    int          kernel_block_size;      /* tokens per kernel block */
    int          ppl;                    /* kernel blocks per logical block */
    size_t       page_size;              /* bytes: block_size * A1 */
    size_t       kernel_block_bytes;     /* page_size / ppl */
    size_t       head_run_bytes;         /* one head's tokens in one kernel block */
    kvf_kv_layout_t kv_layout;           /* kvf_cache_params_t.kv_layout */
    int          slots;                  /* pages per block (kvf_cache_layout_t.slots) */
    kvf_kv_strides_t attn;               /* attention block strides (kvf_kv_layout.h) */
    double       mamba_padding_pct;      /* (page - M) / page * 100; 0 for dense */
} kvf_rank_geometry_t;

/**
 * Attention bytes per token per layer for rank holding @a kv_heads_rank:
 * 2 * kv_heads_rank * head_dim * sizeof(kv_dtype).
 */
size_t kvf_attn_bytes_per_token(const kvf_model_config_t *cfg, int kv_heads_rank,
                                kvf_dtype_t kv_dtype);

/** Mamba state bytes (conv + SSM) of one layer on a rank sharded as @a shard. */
size_t kvf_mamba_bytes(const kvf_model_config_t *cfg, const kvf_shard_t *shard,
                       kvf_dtype_t conv_dtype, kvf_dtype_t ssm_dtype);

/**
 * Logical block size for a TP-@a tp_size deployment (tp_size matters only for
 * KVF_ALIGN_PER_RANK). Dense models: params->block_size or user block size.
 * With params->block_size set on a hybrid model, checks it covers every
 * rank's Mamba page; else KVF_ERR_INVALID_PARAM logging "block_size N is too
 * small for rank R of TP T: Mamba state needs M bytes, smallest block size
 * that fits is S".
 */
kvf_status_t kvf_block_size_select(const kvf_model_config_t *cfg,
                                   const kvf_cache_params_t *params, int tp_size,
                                   int *block_size_p);

/**
 * Kernel block size for @a block_size: block_size itself when accepted, else
 * the largest accepted size dividing it. KVF_ERR_UNSUPPORTED (logged with the
 * accepted list) when none divides it.
 */
kvf_status_t kvf_kernel_block_select(const kvf_kernel_sizes_t *sizes, int block_size,
                                     int *kernel_block_size_p);

/** Parse "16,32,MultipleOf(16)" or "multiple_of:16" into @a sizes_p. */
kvf_status_t kvf_kernel_sizes_parse(const char *text, kvf_kernel_sizes_t *sizes_p);

/** Format @a sizes as "16,32,MultipleOf(16)" into buf. */
void kvf_kernel_sizes_format(const kvf_kernel_sizes_t *sizes, char *buf, size_t len);

/**
 * Full geometry of rank @a tp_rank of a TP-@a tp_size instance.
 * @return KVF_OK; sharding errors; block-size errors as above.
 */
kvf_status_t kvf_rank_geometry_compute(const kvf_model_config_t *cfg,
                                       const kvf_cache_params_t *params,
                                       int tp_size, int tp_rank,
                                       kvf_rank_geometry_t *geom_p);

/* ---- byte offsets inside one page (all in bytes from the page start) ---- */

/**
 * Byte offset from the pool base of layer slot @a slot of attention block @a block: the base
 * kvf_attn_offset() is added to ((block * slots + slot) * page_size at layer-major, where it is
 * the page; at head-major head 0's share of that slot).
 */
static inline uint64_t kvf_attn_slot_off(const kvf_rank_geometry_t *g, int64_t block, int slot)
{
    return (uint64_t)block * (uint64_t)g->attn.block + (uint64_t)slot * (uint64_t)g->attn.slot;
}

/** Attention element (token `tok` of the logical block, kv 0=K 1=V, rank-local head, dim d),
 * bytes from kvf_attn_slot_off() of its block and slot. */
static inline size_t kvf_attn_offset(const kvf_rank_geometry_t *g, const kvf_model_config_t *cfg,
                                     int tok, int kv, int head, int d)
{
    size_t kb = (size_t)(tok / g->kernel_block_size);
    size_t t = (size_t)(tok % g->kernel_block_size);
    size_t elt = kvf_dtype_size(g->kv_dtype);
    return kvf_kv_run_off(&g->attn, 0, 0, kb, (size_t)kv, (size_t)head) +
           (t * (size_t)cfg->head_dim + (size_t)d) * elt;
}

/** Conv state element: rank-local channel c (x|B|C order), tap j in [0, conv_kernel-1). */
static inline size_t kvf_conv_offset(const kvf_rank_geometry_t *g, const kvf_model_config_t *cfg,
                                     int c, int j)
{
    return ((size_t)c * (size_t)(cfg->conv_kernel - 1) + (size_t)j) * kvf_dtype_size(g->conv_dtype);
}

/** SSM state element: rank-local head h, head dim p, state n. */
static inline size_t kvf_ssm_offset(const kvf_rank_geometry_t *g, const kvf_model_config_t *cfg,
                                    int h, int p, int n)
{
    return g->conv_bytes +
           (((size_t)h * (size_t)cfg->mamba_head_dim + (size_t)p) * (size_t)cfg->ssm_state_size +
            (size_t)n) * kvf_dtype_size(g->ssm_dtype);
}

#endif
