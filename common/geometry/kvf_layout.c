/*
 * Layout planning for operators. Everything here is derived from the same
 * functions the workers use (kvf_rank_geometry_compute, kvf_tp_map), so the
 * table cannot disagree with what a deployment does.
 */
#include "kvf_layout.h"
#include "kvf_log.h"
#include "kvf_tp_map.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_layout_parse(const char *text, kvf_layout_t *layout_p)
{
    const char *p = text;
    char *end;
    long x, y;

    x = strtol(p, &end, 10);
    if ((end == p) || (tolower((unsigned char)*end) != 'p')) {
        goto bad;
    }
    p = end + 1;
    y = strtol(p, &end, 10);
    if ((end == p) || (tolower((unsigned char)*end) != 'd') || (end[1] != '\0')) {
        goto bad;
    }
    if ((x <= 0) || (y <= 0) || (x > 1024) || (y > 1024)) {
        goto bad;
    }
    layout_p->prefill_tp = (int)x;
    layout_p->decode_tp = (int)y;
    return KVF_OK;

bad:
    kvf_error("bad layout '%s' (expected XpYd with positive TP degrees, e.g. 4p2d)", text);
    return KVF_ERR_INVALID_PARAM;
}

const char *kvf_verdict_str(kvf_verdict_t verdict)
{
    switch (verdict) {
    case KVF_VERDICT_COMPATIBLE: return "compatible";
    case KVF_VERDICT_TRANSLATED: return "translated";
    default:                     return "refused";
    }
}

static void kvf_plan_mark(kvf_layout_plan_t *plan, kvf_verdict_t verdict, const char *field,
                          long pv, long dv, const char *why)
{
    plan->verdict = verdict;
    snprintf(plan->field, sizeof(plan->field), "%s", field);
    snprintf(plan->prefill_value, sizeof(plan->prefill_value), "%ld", pv);
    snprintf(plan->decode_value, sizeof(plan->decode_value), "%ld", dv);
    snprintf(plan->why, sizeof(plan->why), "%s", why);
}

kvf_status_t kvf_layout_plan(const kvf_model_config_t *cfg, const kvf_cache_params_t *params,
                             kvf_layout_t layout, int prompt_tokens, bool block_translation,
                             kvf_layout_plan_t *plan_p)
{
    kvf_layout_plan_t plan;
    int ranks[1024];
    int saved = kvf_log_level_cur;
    kvf_status_t sp, sd;

    if (prompt_tokens <= 0) {
        kvf_error("prompt length %d must be positive", prompt_tokens);
        return KVF_ERR_INVALID_PARAM;
    }
    memset(&plan, 0, sizeof(plan));
    plan.layout = layout;
    plan.tp_ratio = kvf_tp_ratio(layout.prefill_tp, layout.decode_tp);

    kvf_log_level_cur = -1;   /* a layout that cannot shard is a verdict, not a log line */
    sp = kvf_rank_geometry_compute(cfg, params, layout.prefill_tp, 0, &plan.prefill);
    sd = kvf_rank_geometry_compute(cfg, params, layout.decode_tp, 0, &plan.decode);
    kvf_log_level_cur = saved;
    if ((sp != KVF_OK) || (sd != KVF_OK)) {
        int bad = (sp != KVF_OK) ? layout.prefill_tp : layout.decode_tp;
        char why[160];
        if (!kvf_shard_probe(cfg, bad)) {
            snprintf(why, sizeof(why), "the model cannot be sharded %d ways (heads, KV heads,"
                     " Mamba heads, groups or MLP columns do not divide)", bad);
            kvf_plan_mark(&plan, KVF_VERDICT_REFUSED, "tp_size", layout.prefill_tp,
                          layout.decode_tp, why);
        } else {
            snprintf(why, sizeof(why), "block size %d is too small for the Mamba state at TP %d",
                     params->block_size, bad);
            kvf_plan_mark(&plan, KVF_VERDICT_REFUSED, "block_size", params->block_size,
                          params->block_size, why);
        }
        memset(&plan.prefill, 0, sizeof(plan.prefill));
        memset(&plan.decode, 0, sizeof(plan.decode));
        *plan_p = plan;
        return KVF_OK;
    }
    if (plan.tp_ratio == 0) {
        kvf_plan_mark(&plan, KVF_VERDICT_REFUSED, "tp_size", layout.prefill_tp,
                      layout.decode_tp, "neither TP degree divides the other");
        *plan_p = plan;
        return KVF_OK;
    }

    plan.pull_bytes_per_decode_rank =
        (size_t)prompt_tokens * plan.decode.attn_bytes_per_token *
            (size_t)cfg->num_attention_layers +
        plan.decode.mamba_bytes * (size_t)cfg->num_mamba_layers;
    for (int r = 0; r < layout.decode_tp; ++r) {
        int n = 0;
        if (kvf_tp_source_ranks(cfg, layout.prefill_tp, layout.decode_tp, r, ranks, &n) !=
            KVF_OK) {
            return KVF_ERR_INVALID_PARAM;
        }
        plan.reads += n;
        if (n > plan.max_reads_per_decode_rank) {
            plan.max_reads_per_decode_rank = n;
        }
    }

    if (plan.prefill.kernel_block_size != plan.decode.kernel_block_size) {
        char why[160];
        int a = plan.prefill.kernel_block_size, b = plan.decode.kernel_block_size;
        int hi = (a > b) ? a : b, lo = (a > b) ? b : a;
        snprintf(why, sizeof(why), "kernel block sizes differ; ratio %d/%d = %.3f is %san integer",
                 hi, lo, (double)hi / lo, (hi % lo == 0) ? "" : "not ");
        kvf_plan_mark(&plan, block_translation ? KVF_VERDICT_TRANSLATED : KVF_VERDICT_REFUSED,
                      "kernel_block_size", a, b, why);
    } else if (plan.prefill.block_size != plan.decode.block_size) {
        kvf_plan_mark(&plan, block_translation ? KVF_VERDICT_TRANSLATED : KVF_VERDICT_REFUSED,
                      "block_size", plan.prefill.block_size, plan.decode.block_size,
                      "logical block sizes differ");
    } else {
        plan.verdict = KVF_VERDICT_COMPATIBLE;
    }
    *plan_p = plan;
    return KVF_OK;
}
