/*
 * Shared (CPU and CUDA) body of greedy sampling (kvf_argmax.h): which of two
 * candidates a row's argmax keeps, so a parallel reduction picks exactly the
 * index of the serial scan
 *
 *     best = 0; for i in 1..n-1: if x[i] > x[best]: best = i
 *
 * (common/engine's greedy kvf_sample_token): the lowest index of the
 * largest non-NaN value, and 0 when x[0] is NaN (nothing compares greater
 * than NaN) or every value is NaN. -0 and +0 are equal (lowest index).
 */
#ifndef KVF_ARGMAX_MATH_H
#define KVF_ARGMAX_MATH_H

#include "kvf_hd.h"

#include <stdint.h>

/** A candidate: value and index; idx < 0 means none yet. */
typedef struct {
    float   v;
    int32_t idx;
} kvf_argmax_cand_t;

/** Candidate @a c with element (v, i) folded in (NaN never enters). */
static inline KVF_HD kvf_argmax_cand_t kvf_argmax_take(kvf_argmax_cand_t c, float v, int32_t i)
{
    if ((v == v) && ((c.idx < 0) || (v > c.v) || ((v == c.v) && (i < c.idx)))) {
        c.v = v;
        c.idx = i;
    }
    return c;
}

/** The better of two candidates (order-independent: larger value, then lower index). */
static inline KVF_HD kvf_argmax_cand_t kvf_argmax_merge(kvf_argmax_cand_t a, kvf_argmax_cand_t b)
{
    return (b.idx < 0) ? a : kvf_argmax_take(a, b.v, b.idx);
}

/** The row's answer from the merged candidate and its first element. */
static inline KVF_HD int32_t kvf_argmax_result(kvf_argmax_cand_t c, float x0)
{
    return ((x0 != x0) || (c.idx < 0)) ? 0 : c.idx;
}

#endif
