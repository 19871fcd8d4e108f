/*
 * The sliding-window pull's arithmetic (kvf_xfer_window.h).
 *
 * Design: a sliding layer's group (KVF_GROUP_SLIDING: kvf_cache_layout_build() puts sliding
 * layers in groups of their own, as vLLM's hybrid allocator) is read from its window's first
 * block on and zeroed before it; a full group is read whole. The per-slot test stays general
 * (a slot slides when its layer does), so a group is never read half. Rejected: one group
 * mixing full and sliding layers, its sliding slots zeroed inside blocks whose full slots are
 * read (the earlier design); see docs/ARCHITECTURE.md §7.
 */
#include "kvf_xfer_window.h"
#include "kvf_xfer_plan.h"

int64_t kvf_xfer_group_window_first(const kvf_model_config_t *cfg, const kvf_kv_group_t *grp,
                                    int64_t num_tokens, int block_size)
{
    int w = 0;

    if (!kvf_group_is_attention(grp->kind) || (block_size <= 0)) {
        return 0;
    }
    for (int j = 0; j < grp->num_layers; ++j) {
        const int lw = cfg->layer_window[grp->layers[j]];
        w = (lw > w) ? lw : w;
    }
    if (w <= 0) {
        return 0;   /* no sliding layer: every block is read whole */
    }
    return (num_tokens > w) ? (num_tokens - w) / block_size : 0;
}

bool kvf_xfer_slot_slides(const kvf_model_config_t *cfg, const kvf_kv_group_t *grp, int j)
{
    return (j < grp->num_layers) && (cfg->layer_window[grp->layers[j]] > 0);
}

int64_t kvf_xfer_window_first_block(const kvf_model_config_t *cfg,
                                    const kvf_cache_layout_t *layout, int64_t num_tokens,
                                    int block_size)
{
    int64_t first = 0;

    for (int g = 0; g < layout->num_groups; ++g) {
        int64_t f = kvf_xfer_group_window_first(cfg, &layout->groups[g], num_tokens, block_size);
        first = (f > first) ? f : first;
    }
    return first;
}
