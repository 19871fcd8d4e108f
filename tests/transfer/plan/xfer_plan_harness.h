/*
 * Test harness for the transfer planner: fake host pools for every prefill
 * and decode rank, a reference writer that fills prefill pools with a pure
 * function of global coordinates, and a verifier that checks every byte of
 * every decode pool after the plan ran. The harness knows nothing of how the
 * planner works; it uses only the geometry offset helpers and the TP map.
 */
#ifndef XFER_PLAN_HARNESS_H
#define XFER_PLAN_HARNESS_H

#include "kvf_xfer_plan.h"

#include <stdbool.h>
#include <stdint.h>

/* Tiny hybrid (docs/ARCHITECTURE.md §1) and two dense GQA models, as config.json text. */
extern const char *const xp_tiny_hybrid_json;
extern const char *const xp_dense_kv4_json;   /* 4 layers, 8 heads, 4 KV heads */
extern const char *const xp_dense_kv2_json;   /* 6 layers, 8 heads, 2 KV heads (TP4 replicates) */

typedef enum {
    XP_IDS_SHUFFLED    = 0,   /* random distinct block ids on each side */
    XP_IDS_CONSECUTIVE = 1,   /* each group's ids consecutive and ascending */
} xp_id_mode_t;

typedef struct xp_case {
    const char  *model_json;
    int          P, D;              /* prefill / decode TP */
    kvf_dtype_t  kv_dtype;
    int          p_block, p_kernel; /* 0: derive (block) / MultipleOf(16) (kernel) */
    int          d_block, d_kernel;
    int64_t      num_tokens;
    xp_id_mode_t id_mode;
    int          extra_local;       /* extra local blocks per attention group (and a second
                                       Mamba id on both sides when > 0) */
    bool         no_coalesce;
    uint64_t     seed;
    int64_t      skip_tokens;       /* decode's prefix hit: tokens [0, skip) already in its
                                       blocks, which must stay as they were (a multiple of
                                       the decode block; 0: none) */
    kvf_kv_layout_t p_layout, d_layout;  /* attention block layouts (0: layer-major) */
} xp_case_t;

typedef struct xp_totals {
    unsigned long cases;
    unsigned long rank_plans;       /* decode ranks planned and verified */
    unsigned long descs;
    unsigned long long bytes;
    unsigned long long zero_bytes;
    unsigned long long elements;    /* decode elements checked */
    unsigned long tmpl_plans;       /* of rank_plans, also run by the gather's templates
                                       (equal block sizes) and compared byte for byte */
} xp_totals_t;

/**
 * Run one case end to end: geometries, block ids, pools, reference fill, one
 * plan per decode rank, execution (harness memcpy executor and
 * kvf_xfer_plan_apply_local(), compared), and the byte-exact verification.
 * Fails the current cmocka test with a precise message on any mismatch.
 */
void xp_run_case(const xp_case_t *c, xp_totals_t *totals);

/** Effective logical block sizes of a case (after derivation), for choosing lengths. */
void xp_case_block_sizes(const xp_case_t *c, int *p_block_p, int *d_block_p);

/** Run every layout x length x dtype for the block configs given; lengths derived per config. */
typedef struct xp_block_cfg {
    int p_block, p_kernel, d_block, d_kernel;
} xp_block_cfg_t;

void xp_run_matrix(const char *model_json, const xp_block_cfg_t *cfgs, int num_cfgs,
                   xp_totals_t *totals);

/** xp_run_matrix() with the prefill and decode attention block layouts given. */
void xp_run_matrix_kv(const char *model_json, const xp_block_cfg_t *cfgs, int num_cfgs,
                      kvf_kv_layout_t p_layout, kvf_kv_layout_t d_layout, xp_totals_t *totals);

#endif
