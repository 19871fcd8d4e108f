/*
 * The transfer planner's input checks (internal to transfer/plan: kvf_xfer_plan_create runs
 * them before it emits anything; see kvf_xfer_plan.h's Safety note).
 */
#ifndef KVF_XFER_CHECK_H
#define KVF_XFER_CHECK_H

#include "kvf_xfer_plan.h"

#include <stdbool.h>
#include <stdint.h>

/** The params themselves: NULLs, ranges, field_mask bits. KVF_ERR_INVALID_PARAM, logged. */
kvf_status_t kvf_xfer_params_check(const kvf_xfer_plan_params_t *p);

/**
 * Everything else before a walk: both sides' geometries re-derived from the model, dtypes
 * (skipped when @a geoms_checked: pieces that match them were checked when built),
 * the region sizes (bytes, into @a local_region_p and @a remote_region[r] of every rank read)
 * and every block id against them; @a reads[r] set for each prefill rank this decode rank
 * reads. @a remote_region and @a reads have params->remote_tp entries, zeroed by the caller.
 * Errors are logged: KVF_ERR_INVALID_PARAM, KVF_ERR_OUT_OF_RANGE, KVF_ERR_UNSUPPORTED.
 */
kvf_status_t kvf_xfer_plan_check(const kvf_xfer_plan_params_t *p, uint64_t *local_region_p,
                                 uint64_t *remote_region, bool *reads, bool geoms_checked);

/**
 * The geometry half of kvf_xfer_plan_check() alone: the local and every source rank's
 * geometry re-derived from the model, and their dtypes. For kvf_xfer_pieces_create().
 */
kvf_status_t kvf_xfer_geoms_check(const kvf_xfer_plan_params_t *p);

#endif
