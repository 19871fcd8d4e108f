/*
 * Freeing blocks that leave a sliding window (internal to common/engine; docs/ARCHITECTURE.md
 * §7): a running request's blocks wholly before the window of its next query are given back
 * through the block manager's reference counts (kvf_block_manager_release_before()).
 */
#ifndef KVF_ENGINE_WINDOW_H
#define KVF_ENGINE_WINDOW_H

#include "kvf_block_manager.h"
#include "kvf_model_config.h"
#include "kvf_scheduler.h"

/**
 * @a win_p[g] for each group of @a layout: the window of an attention group whose every layer
 * slides (cfg->layer_window, the largest), else 0 (a full-attention layer keeps every block
 * live, and a Mamba group's one block always). @return true when some group has one.
 */
bool kvf_engine_window_groups(const kvf_model_config_t *cfg, const kvf_cache_layout_t *layout,
                              int *win_p);

/**
 * For each RUNNING request of @a reqs[n] past its prompt (decode steps: its next query sits
 * at position num_computed and attends to keys from num_computed - W + 1 on), give back its
 * blocks below floor(max(0, num_computed - W) / block_size) in every group with a window
 * (@a win, @a num_groups); its prefix cache entries keep those sliding blocks as -1 (the
 * index serves a hit whose window starts after them, docs/PREFIX_CACHE.md §1). @return
 * blocks given back; errors are logged and leave the request holding its blocks.
 */
int kvf_engine_window_release(kvf_block_manager_h bm, const int *win, int num_groups,
                              kvf_request_t **reqs, int n);

#endif
