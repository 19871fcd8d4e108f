/*
 * The transfer planner's list sorts (internal to transfer/plan: kvf_xfer_plan.c's final pass).
 */
#ifndef KVF_XFER_SORT_H
#define KVF_XFER_SORT_H

#include "kvf_xfer_plan.h"

#include <stdbool.h>
#include <stddef.h>

/**
 * Sort @a v[n] by local_off (local offsets distinct: no two descriptors overlap) and, when
 * @a merge, join each descriptor into the previous one where both sides continue it.
 * In place; returns the new count (n without merging). Never fails (qsort when no scratch
 * memory can be had).
 */
size_t kvf_xfer_desc_sort_merge(kvf_xfer_desc_t *v, size_t n, bool merge);

/**
 * Sort @a v[n] by offset and merge touching or overlapping ranges into disjoint ones.
 * In place; returns the new count.
 */
size_t kvf_xfer_range_sort_merge(kvf_xfer_range_t *v, size_t n);

#endif
