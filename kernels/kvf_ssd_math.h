/*
 * The chunked (SSD) Mamba2 prompt scan's arithmetic, written once for the CPU reference
 * (kvf_ssd.c) and the CUDA kernels (kvf_ssd_cuda.cu): each function is one output element
 * in one fixed order. kvf_ssd.h has the algorithm and the boundary rule.
 *
 * Within a chunk of L tokens of one head (dt_t clamped, a_t = dt_t * A, cs_t = a_0 + ... +
 * a_t summed in order, S0 the state entering the chunk):
 *   y_t[p]    = (sum_{s<=t} (C_t . B_s) exp(cs_t - cs_s) dt_s x_s[p])     intra
 *             + exp(cs_t) (C_t . S0[p])                                   inter
 *             + D x_t[p]
 *   S_end[p][n] = round(exp(cs_{L-1}) S0[p][n] + local[p][n]),
 *   local[p][n] = sum_s exp(cs_{L-1} - cs_s) dt_s x_s[p] B_s[n]
 * which is the recurrence S_t = exp(a_t) S_{t-1} + dt_t x_t B_t unrolled over the chunk.
 */
#ifndef KVF_SSD_MATH_H
#define KVF_SSD_MATH_H

#include "kvf_hd.h"
#include "kvf_dtype_math.h"
#include "kvf_ssm_math.h"

#include <stddef.h>

/**
 * The end (exclusive) of the chunk that starts at absolute position @a pos, for a call
 * whose tokens end at @a end (exclusive): the next multiple of @a grid after @a pos, or
 * @a end if sooner. Chunks are cut at absolute multiples of the grid, whatever position
 * the call starts at.
 */
static inline KVF_HD long long kvf_ssd_chunk_end_hd(long long pos, long long end, int grid)
{
    long long next = (pos / grid + 1) * (long long)grid;
    return (next < end) ? next : end;
}

/**
 * Chunk @a k (0-based) of a call of @a T tokens from absolute position @a pos0 on the
 * grid: its first token relative to the call and its length (0 past the last chunk). The
 * CUDA kernels find their chunk with it; kvf_ssd_chunks() lists the same chunks.
 */
static inline KVF_HD void kvf_ssd_chunk_at_hd(long long pos0, int T, int grid, int k,
                                              int *start, int *len)
{
    int first = (int)(kvf_ssd_chunk_end_hd(pos0, pos0 + T, grid) - pos0);
    int s = (k == 0) ? 0 : first + (k - 1) * grid;
    int e = (k == 0) ? first : s + grid;

    s = (s > T) ? T : s;
    e = (e > T) ? T : e;
    *start = s;
    *len = e - s;
}

/** C_t . B_s of one group: the sum over the state index n in ascending order. */
static inline KVF_HD float kvf_ssd_dot_hd(const float *Ct, const float *Bs, size_t ns)
{
    float acc = 0.0f;
    for (size_t n = 0; n < ns; ++n) {
        acc += Ct[n] * Bs[n];
    }
    return acc;
}

/**
 * The intra-chunk part of y_t[p]: sum over s = 0..t ascending of cb[s] * exp(cs[t] - cs[s])
 * * dts[s] * x[s * ldx], with cb[s] = C_t . B_s (row t of the chunk's CB matrix).
 */
static inline KVF_HD float kvf_ssd_intra_hd(const float *cb, const float *cs, const float *dts,
                                            size_t t, const float *x, size_t ldx)
{
    float acc = 0.0f;
    for (size_t s = 0; s <= t; ++s) {
        acc += cb[s] * expf(cs[t] - cs[s]) * dts[s] * x[s * ldx];
    }
    return acc;
}

/**
 * local[p][n] of a chunk of L tokens: sum over s ascending of exp(cs[L-1] - cs[s]) * dts[s]
 * * x[s * ldx] * B[s * ldbc] (x at head dim p, B at state index n).
 */
static inline KVF_HD float kvf_ssd_local_hd(const float *cs, const float *dts, size_t L,
                                            const float *x, size_t ldx, const float *B,
                                            size_t ldbc)
{
    float acc = 0.0f;
    for (size_t s = 0; s < L; ++s) {
        acc += expf(cs[L - 1] - cs[s]) * dts[s] * x[s * ldx] * B[s * ldbc];
    }
    return acc;
}

/** The state leaving a chunk: exp(cs_last) * s0 + local, kept at @a state_dtype. */
static inline KVF_HD float kvf_ssd_pass_hd(float cs_last, float s0, float local, int state_dtype)
{
    return kvf_hd_round(expf(cs_last) * s0 + local, state_dtype);
}

/** y_t[p] = (intra + exp(cs_t) * (C_t . S0[p])) + D * x_t[p]. */
static inline KVF_HD float kvf_ssd_out_hd(float intra, float cs_t, float cs0, float D, float x)
{
    return kvf_mamba2_out_hd(intra + expf(cs_t) * cs0, D, x);
}

#endif
