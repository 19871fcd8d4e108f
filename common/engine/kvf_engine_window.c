/*
 * Freeing blocks that leave a sliding window (kvf_engine_window.h).
 *
 * Design: only for a group whose every layer slides (KVF_GROUP_SLIDING: a model mixing full
 * and sliding layers keeps them in groups of their own, so its sliding groups free too), and
 * only for a request past its prompt (a prompt chunk, an import in flight and a recompute
 * after preemption keep everything). The prefix cache goes on indexing the request: a freed
 * entry is indexed as -1, and its hit rule asks a sliding group only for the window's
 * blocks. The table keeps its length with the manager's zero block in the freed entries, so
 * nothing that walks a block table changes. Rejected: holes
 * (-1) in the table (every kernel, FlashInfer's page list and the CUDA graph inputs would have
 * to skip them) and shrinking the table from the front (every position -> block arithmetic
 * would take an offset).
 */
#include "kvf_engine_window.h"

#include "kvf_log.h"

bool kvf_engine_window_groups(const kvf_model_config_t *cfg, const kvf_cache_layout_t *layout,
                              int *win_p)
{
    bool any = false;

    for (int g = 0; g < layout->num_groups; ++g) {
        const kvf_kv_group_t *grp = &layout->groups[g];
        int w = 0;
        for (int j = 0; kvf_group_is_attention(grp->kind) && (j < grp->num_layers); ++j) {
            const int lw = cfg->layer_window[grp->layers[j]];
            if (lw <= 0) {
                w = 0;
                break;
            }
            w = (lw > w) ? lw : w;
        }
        win_p[g] = w;
        any = any || (w > 0);
    }
    return any;
}

int kvf_engine_window_release(kvf_block_manager_h bm, const int *win, int num_groups,
                              kvf_request_t **reqs, int n)
{
    const int B = kvf_block_manager_block_size(bm);
    int total = 0;

    for (int i = 0; i < n; ++i) {
        kvf_request_t *r = reqs[i];
        if ((r->state != KVF_REQ_RUNNING) || (r->num_computed < r->prompt_len) ||
            (r->blocks.num_groups != num_groups)) {
            continue;
        }
        for (int g = 0; g < num_groups; ++g) {
            int freed = 0;
            if ((win[g] <= 0) || (r->num_computed <= win[g])) {
                continue;
            }
            const int first = (r->num_computed - win[g]) / B;
            if (first <= r->blocks.released[g]) {
                continue;
            }
            if (kvf_block_manager_release_before(bm, &r->blocks, g, first, &freed) != KVF_OK) {
                kvf_error("request %llu: giving back blocks before the window failed",
                          (unsigned long long)r->id);
                continue;
            }
            total += freed;
        }
    }
    return total;
}
