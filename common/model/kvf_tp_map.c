/*
 * Prefill-rank selection for hetero-TP reads. Pure functions of the model
 * and the two TP degrees, shared by the layout planner (kvf plan) and the
 * transfer planner, so the table an operator reads is what the transfer does.
 */
#include "kvf_tp_map.h"
#include "kvf_log.h"

#include <stdbool.h>

int kvf_tp_ratio(int prefill_tp, int decode_tp)
{
    if ((prefill_tp <= 0) || (decode_tp <= 0)) {
        return 0;
    }
    if ((decode_tp >= prefill_tp) && (decode_tp % prefill_tp == 0)) {
        return decode_tp / prefill_tp;
    }
    if ((prefill_tp > decode_tp) && (prefill_tp % decode_tp == 0)) {
        return -(prefill_tp / decode_tp);
    }
    return 0;
}

/* Choose among holders [first, first+count) the one in d_rank's natural range. */
static int kvf_tp_pick(int first, int count, int prefill_tp, int decode_tp, int d_rank)
{
    int lo, hi;
    if (decode_tp >= prefill_tp) {
        lo = d_rank * prefill_tp / decode_tp;
        hi = lo + 1;
    } else {
        lo = d_rank * (prefill_tp / decode_tp);
        hi = lo + prefill_tp / decode_tp;
    }
    for (int r = first; r < first + count; ++r) {
        if ((r >= lo) && (r < hi)) {
            return r;
        }
    }
    return first;
}

/* Holders of item @a idx of @a n items split over tp ranks: [*first, *first + *count). */
static void kvf_tp_holders(int n, int tp, int idx, int *first, int *count)
{
    if (tp <= n) {
        *first = idx / (n / tp);
        *count = 1;
    } else {
        *first = idx * (tp / n);
        *count = tp / n;
    }
}

int kvf_tp_kv_head_source(const kvf_model_config_t *cfg, int prefill_tp, int decode_tp,
                          int d_rank, int head)
{
    int first, count;
    kvf_tp_holders(cfg->num_key_value_heads, prefill_tp, head, &first, &count);
    return kvf_tp_pick(first, count, prefill_tp, decode_tp, d_rank);
}

int kvf_tp_mamba_head_source(const kvf_model_config_t *cfg, int prefill_tp, int head)
{
    return head / (cfg->mamba_num_heads / prefill_tp);
}

int kvf_tp_group_source(const kvf_model_config_t *cfg, int prefill_tp, int decode_tp,
                        int d_rank, int group)
{
    int first, count;
    kvf_tp_holders(cfg->n_groups, prefill_tp, group, &first, &count);
    return kvf_tp_pick(first, count, prefill_tp, decode_tp, d_rank);
}

kvf_status_t kvf_tp_source_ranks(const kvf_model_config_t *cfg, int prefill_tp, int decode_tp,
                                 int d_rank, int *ranks, int *num_p)
{
    bool used[1024] = {false};
    kvf_shard_t d;
    kvf_status_t status;
    int n = 0;

    if (kvf_tp_ratio(prefill_tp, decode_tp) == 0) {
        kvf_error("tp_size prefill=%d decode=%d: neither divides the other", prefill_tp,
                  decode_tp);
        return KVF_ERR_INVALID_PARAM;
    }
    if (prefill_tp > 1024) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_shard_check(cfg, prefill_tp);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_shard_compute(cfg, decode_tp, d_rank, &d);
    if (status != KVF_OK) {
        return status;
    }
    for (int h = d.kv_head_start; h < d.kv_head_start + d.kv_heads; ++h) {
        used[kvf_tp_kv_head_source(cfg, prefill_tp, decode_tp, d_rank, h)] = true;
    }
    for (int h = d.mamba_head_start; h < d.mamba_head_start + d.mamba_heads; ++h) {
        used[kvf_tp_mamba_head_source(cfg, prefill_tp, h)] = true;
    }
    for (int g = d.group_start; (d.mamba_heads > 0) && (g < d.group_start + d.groups); ++g) {
        used[kvf_tp_group_source(cfg, prefill_tp, decode_tp, d_rank, g)] = true;
    }
    for (int r = 0; r < prefill_tp; ++r) {
        if (used[r]) {
            ranks[n++] = r;
        }
    }
    *num_p = n;
    return KVF_OK;
}
