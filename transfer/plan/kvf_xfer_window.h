/*
 * The sliding-window pull's arithmetic (internal to transfer/plan; KVF_XFER_PLAN_FLAG_WINDOW in
 * kvf_xfer_plan.h, docs/ARCHITECTURE.md §7): which logical blocks of an attention group lie
 * wholly before the window of decode's first query, and which of a group's layer slots those
 * blocks skip.
 */
#ifndef KVF_XFER_WINDOW_H
#define KVF_XFER_WINDOW_H

#include "kvf_geometry.h"

#include <stdbool.h>
#include <stdint.h>

/**
 * The first logical block (of @a block_size tokens) of attention group @a grp that a windowed
 * pull of @a num_tokens prompt tokens reads in every layer slot: floor(max(0, N - W) /
 * block_size) with W the largest window of the group's sliding layers; 0 for a group with no
 * sliding layer, a Mamba group, or block_size <= 0. Blocks below it are read in the group's
 * full-attention slots only (kvf_xfer_slot_slides() false) and zeroed in the others.
 */
int64_t kvf_xfer_group_window_first(const kvf_model_config_t *cfg, const kvf_kv_group_t *grp,
                                    int64_t num_tokens, int block_size);

/** True when layer slot @a j of @a grp holds a sliding layer (cfg->layer_window > 0). */
bool kvf_xfer_slot_slides(const kvf_model_config_t *cfg, const kvf_kv_group_t *grp, int j);

#endif
