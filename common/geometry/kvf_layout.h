/*
 * P/D layouts ("4p2d": prefill TP 4, decode TP 2) and the per-layout plan an
 * operator reads before deploying: both sides' geometry, what a decode rank
 * pulls, how many (prefill rank -> decode rank) reads, and a verdict.
 */
#ifndef KVF_LAYOUT_H
#define KVF_LAYOUT_H

#include "kvf_geometry.h"

typedef struct kvf_layout {
    int prefill_tp;
    int decode_tp;
} kvf_layout_t;

/**
 * Parse "XpYd" (case-insensitive, X and Y positive, at most 1024).
 * @return KVF_OK; KVF_ERR_INVALID_PARAM (logged, quoting the text).
 */
kvf_status_t kvf_layout_parse(const char *text, kvf_layout_t *layout_p);

typedef enum {
    KVF_VERDICT_COMPATIBLE = 0,  /* same logical and kernel block size */
    KVF_VERDICT_TRANSLATED = 1,  /* block sizes differ; the planner copies runs into place */
    KVF_VERDICT_REFUSED    = 2,  /* cannot be served; field/local/remote/why say why */
} kvf_verdict_t;

typedef struct kvf_layout_plan {
    kvf_layout_t        layout;
    int                 tp_ratio;          /* kvf_tp_ratio() */
    kvf_rank_geometry_t prefill;           /* rank 0 (all ranks have equal sizes) */
    kvf_rank_geometry_t decode;
    size_t              pull_bytes_per_decode_rank; /* for prompt_tokens */
    int                 reads;             /* (prefill rank -> decode rank) pairs, all decode ranks */
    int                 max_reads_per_decode_rank;
    kvf_verdict_t       verdict;
    char                field[48];         /* first differing/refused field */
    char                prefill_value[48];
    char                decode_value[48];
    char                why[160];
} kvf_layout_plan_t;

/**
 * Plan one layout. Sharding failures of either side are a REFUSED verdict
 * (field "tp_size"), not an error: the table shows every layout.
 *
 * @param [in] prompt_tokens   Prompt length used for pull_bytes (> 0).
 * @param [in] block_translation  true when the transfer planner translates
 *             different block sizes (then such a layout is TRANSLATED),
 *             false to report it REFUSED as upstream engines do.
 * @return KVF_OK; KVF_ERR_INVALID_PARAM for bad params (e.g. block size 0
 *         given explicitly is caught by the caller).
 */
kvf_status_t kvf_layout_plan(const kvf_model_config_t *cfg, const kvf_cache_params_t *params,
                             kvf_layout_t layout, int prompt_tokens, bool block_translation,
                             kvf_layout_plan_t *plan_p);

/** "compatible", "translated", "refused". */
const char *kvf_verdict_str(kvf_verdict_t verdict);

#endif
