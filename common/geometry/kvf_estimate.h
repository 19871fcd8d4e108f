/*
 * Roofline estimates for one P/D layout on real hardware (kvf plan
 * --hardware): what fits in memory after the weights, how long a prefill
 * and a decode step take, and how long the KV pull takes over the P->D
 * link. Pure arithmetic over the model config, the per-rank geometry and a
 * few hardware figures; no I/O.
 *
 * Model: a step takes max(FLOPs / (ranks x peak x mfu), bytes / (HBM
 * bandwidth x mbu)) per rank; TP collectives, kernel launch gaps and
 * scheduling are not modelled. The transfer takes the planner's bytes over
 * the link: with one link per rank (a NIC per GPU) the busiest rank's
 * bytes, with one shared link (one NIC per node, or shared memory on one
 * host) all bytes.
 */
#ifndef KVF_ESTIMATE_H
#define KVF_ESTIMATE_H

#include "kvf_layout.h"

#include <stdbool.h>

/** Per-device figures. Bytes, bytes/s and FLOP/s. */
typedef struct kvf_hw {
    char   name[16];
    double hbm_bytes;      /* device memory */
    double hbm_bw;         /* device memory bandwidth */
    double flops;          /* dense bf16 tensor FLOP/s */
    double link_bw;        /* P->D link, bytes/s per rank (or shared: see link_shared) */
} kvf_hw_t;

/**
 * Fill @a hw from the built-in table: "h100" (SXM, 80 GB), "h200" (141 GB),
 * "b200" (180 GB). The link is the per-GPU RDMA NIC of such nodes (400 Gb/s
 * for H100/H200, 800 Gb/s for B200).
 * @return KVF_OK; KVF_ERR_NOT_FOUND for another name.
 */
kvf_status_t kvf_hw_lookup(const char *name, kvf_hw_t *hw);

/** Parameter counts of a model (elements, not bytes). */
typedef struct kvf_model_cost {
    double total_params;        /* every weight, embeddings included */
    double active_params;       /* touched per token: routed experts top-k, lm_head once */
    double expert_params;       /* one routed expert of one layer */
    int    moe_layers;
} kvf_model_cost_t;

/**
 * Count parameters from the config. Nemotron-H MLP and expert layers are
 * up/down (squared ReLU, no gate); dense llama-style models gate (three
 * matrices).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (logged, naming the missing
 *         config field) when MoE layers have no moe_intermediate_size.
 */
kvf_status_t kvf_model_cost(const kvf_model_config_t *cfg, kvf_model_cost_t *cost_p);

typedef struct kvf_estimate_params {
    kvf_hw_t hw;
    double   weight_bytes;      /* bytes per weight element (bf16: 2) */
    double   mem_util;          /* share of device memory the instance may use, (0, 1] */
    double   reserve_bytes;     /* per rank: activations, workspace, runtime */
    double   mfu;               /* achieved / peak FLOP/s, (0, 1] */
    double   mbu;               /* achieved / peak memory bandwidth, (0, 1] */
    int      prompt_tokens;     /* the prefill's length, and the decode's context */
    int      batch;             /* sequences in one decode step */
    int      context_tokens;    /* tokens each decode sequence attends to */
    bool     link_shared;       /* one link for all ranks of the instance */
} kvf_estimate_params_t;

/** One side (prefill or decode instance) of a layout. */
typedef struct kvf_side_estimate {
    int    tp;
    double weights_per_rank;    /* bytes */
    double cache_per_rank;      /* bytes left for KV + Mamba pages; <= 0: does not fit */
    double attn_bytes_per_token;/* per rank, all attention layers */
    double mamba_bytes_per_seq; /* per rank, all Mamba layers, padded pages */
    long long capacity_tokens;  /* per instance, with `batch` sequences' Mamba state held */
    long long max_seqs;         /* per instance, each holding prompt_tokens */
} kvf_side_estimate_t;

typedef struct kvf_layout_estimate {
    kvf_side_estimate_t prefill, decode;
    double prefill_ms;          /* one prompt of prompt_tokens on the prefill instance */
    double decode_step_ms;      /* one step of `batch` sequences on the decode instance */
    double transfer_bytes;      /* all decode ranks, the planner's pull bytes */
    double transfer_link_bytes; /* the bytes the busiest link carries */
    double transfer_ms;
} kvf_layout_estimate_t;

/**
 * Estimate @a plan (a layout kvf_layout_plan() did not refuse) under @a ep.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for a refused plan or a figure out
 *         of range (logged, naming it).
 */
kvf_status_t kvf_layout_estimate(const kvf_model_config_t *cfg, const kvf_model_cost_t *cost,
                                 const kvf_layout_plan_t *plan, const kvf_estimate_params_t *ep,
                                 kvf_layout_estimate_t *est_p);

#endif
