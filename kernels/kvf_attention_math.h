/*
 * Shared (CPU and CUDA) arithmetic of paged attention (kvf_attention.h):
 * where a token's row lives in the page pool, and the online-softmax fold of
 * one kernel-block tile into one (query, head) accumulator.
 *
 * The fold is the whole numerical contract of the kernel: scores of every
 * slot of the tile (written or not), the running max over unmasked slots
 * only, probability SELECTED as 0 for a slot past the causal limit (never
 * exp(s - m) * 0, which would be 0 * inf = NaN on correct data when every
 * real score is far below a zeroed slot's 0), and the masked slot still
 * entering the value sum as 0 * v, so a stale NaN/Inf byte in an unwritten
 * slot of a recycled block poisons the output (the fix is kvf_blocks_zero,
 * never this function). The CPU passes tiles it converted to fp32
 * (dtype KVF_HD_FP32); a GPU thread passes the cache bytes with their dtype.
 * Conversion is exact, so both read the same values.
 */
#ifndef KVF_ATTENTION_MATH_H
#define KVF_ATTENTION_MATH_H

#include "kvf_dtype_math.h"
#include "kvf_hd.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* GPU limits (the CPU has none): head_dim (the query in shared memory) and kernel block
 * size (the tile's scores in shared memory: 32 KiB; hybrid models' kernel blocks are whole
 * logical blocks of 1312 tokens and more, e.g. Nemotron-Nano-9B-v2 at TP 1) */
#define KVF_ATTN_HD_MAX  256
#define KVF_ATTN_KBS_MAX 8192

/**
 * Byte offset from the pool base of the kernel block holding token @a pos:
 * page (block_table[pos / block_size] * slots + slot), kernel block
 * (pos % block_size) / kbs, each kbb bytes. @a pos validated by the caller.
 */
static inline KVF_HD size_t kvf_attn_kblock_offset(const int32_t *block_table, int block_size,
                                                   int kbs, int slots, int slot,
                                                   size_t page_size, size_t kbb, int pos)
{
    int32_t b = block_table[pos / block_size];
    size_t kb = (size_t)((pos % block_size) / kbs);
    size_t page = (size_t)b * (size_t)slots + (size_t)slot;
    return page * page_size + kb * kbb;
}

/** Element index in a kernel block of K (is_v 0) or V (is_v 1), head h, row, dim 0. */
static inline KVF_HD size_t kvf_attn_row_first(size_t kv_heads, size_t kbs, size_t hd, size_t h,
                                               size_t row, int is_v)
{
    return (((is_v ? kv_heads : 0u) + h) * kbs + row) * hd;
}

/**
 * Fold one tile into one (query, head): K rows kt[j * hd + d] and V rows
 * vt[j * hd + d] (typed @a dtype), j < kbs, tile tokens token0 + j, causal
 * limit @a limit (tokens <= limit are unmasked). State: running max *m
 * (-inf before the first tile), denominator *l, accumulator acc[hd];
 * s[kbs] is scratch.
 */
/**
 * The online-softmax step of one tile, from its scaled scores s[j] (j < n,
 * tile tokens token0 + j, causal limit @a limit): the running max *m moves
 * to the max over unmasked scores, s[j] becomes the probability
 * exp(s[j] - m) (SELECTED as 0 for a masked slot), *l = *l * alpha + sum(s).
 * The tile must hold at least one unmasked token (lo <= token0 + n - 1,
 * token0 <= limit; lo > 0 only under a sliding window).
 * @return alpha = exp(m_old - m_new), the factor the accumulator is scaled
 *         by before the tile's p * V is added (0 on the first tile).
 */
/**
 * The probability of tile slot @a j (token token0 + j) with score @a s
 * under the tile's new running max @a m_new: exp(s - m_new), SELECTED as 0
 * past the causal limit. Each slot is independent of the others (a GPU
 * block computes them in parallel; only the sum *l below has an order).
 */
static inline KVF_HD float kvf_attn_prob(float s, int token0, size_t j, int lo, int limit,
                                         float m_new)
{
    const int tok = token0 + (int)j;
    return ((tok >= lo) && (tok <= limit)) ? expf(s - m_new) : 0.0f;   /* masked: 0 */
}

/**
 * First token a query at position @a limit attends to under a sliding
 * window of @a window tokens (transformers: key k is kept when k > q -
 * window, so the window counts the query itself): max(0, limit - window +
 * 1); 0 for no window (@a window <= 0).
 */
static inline KVF_HD int kvf_attn_window_lo(int limit, int window)
{
    const int lo = limit - window + 1;
    return ((window > 0) && (lo > 0)) ? lo : 0;
}

/** True when tile token @a tok is attended by a query with range [lo, limit]. */
static inline KVF_HD int kvf_attn_unmasked(int tok, int lo, int limit)
{
    return (tok >= lo) && (tok <= limit);
}

/**
 * Score softcapping (transformers' Gemma2 attn_logit_softcapping): s -> cap * tanh(s / cap)
 * for @a cap > 0, @a s unchanged for cap <= 0. One rounding order on every path (division,
 * tanhf, product), so the CPU, the GPU kernels and any batch give one score.
 */
static inline KVF_HD float kvf_attn_softcap(float s, float cap)
{
    return (cap > 0.0f) ? cap * tanhf(s / cap) : s;
}

static inline KVF_HD float kvf_attn_tile_probs(float *s, size_t n, int token0, int lo,
                                               int limit, float cap, float *m, float *l)
{
    float m_new = *m;
    for (size_t j = 0; (cap > 0.0f) && (j < n); ++j) {
        s[j] = kvf_attn_softcap(s[j], cap);
    }
    for (size_t j = 0; j < n; ++j) {
        if (kvf_attn_unmasked(token0 + (int)j, lo, limit) && (s[j] > m_new)) {
            m_new = s[j];
        }
    }
    float alpha = expf(*m - m_new);   /* 0 on the first tile */
    float lsum = 0.0f;
    for (size_t j = 0; j < n; ++j) {
        s[j] = kvf_attn_prob(s[j], token0, j, lo, limit, m_new);
        lsum += s[j];
    }
    *l = *l * alpha + lsum;
    *m = m_new;
    return alpha;
}

static inline KVF_HD void kvf_attn_fold_tile(const float *qv, const void *kt, const void *vt,
                                             int dtype, size_t kbs, size_t hd, int token0,
                                             int lo, int limit, float scale, float cap, float *m,
                                             float *l, float *acc, float *s)
{
    for (size_t j = 0; j < kbs; ++j) {
        float dot = 0.0f;
        for (size_t d = 0; d < hd; ++d) {
            dot += qv[d] * kvf_hd_load(kt, dtype, j * hd + d);
        }
        s[j] = dot * scale;
    }
    float alpha = kvf_attn_tile_probs(s, kbs, token0, lo, limit, cap, m, l);
    for (size_t d = 0; d < hd; ++d) {
        acc[d] *= alpha;
    }
    for (size_t j = 0; j < kbs; ++j) {
        for (size_t d = 0; d < hd; ++d) {
            acc[d] += s[j] * kvf_hd_load(vt, dtype, j * hd + d);   /* masked: 0 * v */
        }
    }
}

/* Split-K ranges: at least this many tokens of kernel blocks each, at most this many. */
#define KVF_ATTN_SPLIT_TOKENS 2048
#define KVF_ATTN_SPLITS_MAX   64

/**
 * Kernel blocks per split-K range of a query whose causal range spans @a nkb
 * kernel blocks of @a kbs tokens: max(ceil(KVF_ATTN_SPLIT_TOKENS / kbs),
 * ceil(nkb / KVF_ATTN_SPLITS_MAX)); its ranges are [y * per, (y + 1) * per)
 * clipped to nkb. A function of the query's own length alone, never of how
 * many queries share the launch: a request's attention sums are then the
 * same in any batch (issue 33's batch invariance), as they are on the CPU.
 */
static inline KVF_HD int kvf_attn_split_per(int nkb, int kbs)
{
    int min_per = (KVF_ATTN_SPLIT_TOKENS + kbs - 1) / kbs;
    int by_max = (nkb + KVF_ATTN_SPLITS_MAX - 1) / KVF_ATTN_SPLITS_MAX;
    return (by_max > min_per) ? by_max : min_per;
}

/**
 * Ranges to launch for queries whose longest causal range spans @a max_nkb
 * kernel blocks: min(KVF_ATTN_SPLITS_MAX, ceil(max_nkb / min_per)), at least
 * every query's own count ceil(nkb / kvf_attn_split_per(nkb)); a query's
 * ranges past its own count are empty (m = -inf, l = 0), and adding them in
 * kvf_attn_merge changes no bit (weight 0).
 */
static inline KVF_HD int kvf_attn_split_count(int max_nkb, int kbs)
{
    int min_per = (KVF_ATTN_SPLIT_TOKENS + kbs - 1) / kbs;
    int n = (max_nkb + min_per - 1) / min_per;
    return (n < 1) ? 1 : (n > KVF_ATTN_SPLITS_MAX) ? KVF_ATTN_SPLITS_MAX : n;
}

/**
 * Merge of split-K partials of one (query, head), one output dim @a d: a
 * decode query's kernel blocks split into n ranges, each folded from
 * m = -inf, l = 0 as above into m[i], l[i], acc_i (at acc + i * ld). With
 * M = max m_i and w_i = exp(m_i - M) (0 for an empty range, m_i = -inf):
 * returns (sum w_i acc_i[d]) / (sum w_i l_i), sums in range order (with @a sink, M
 * takes it too and the denominator starts at exp(sink - M)). That is
 * the one-range fold's result up to fp32 rounding (exp(a - b) factors in
 * place of the running rescales). Used by the CUDA decode attention when it
 * splits a long context over blocks (FlashDecoding's split-K).
 */
static inline KVF_HD float kvf_attn_merge(const float *m, const float *l, const float *acc,
                                          size_t ld, int n, size_t d, float sink)
{
    float mx = -INFINITY, lsum = 0.0f, a = 0.0f;
    for (int i = 0; i < n; ++i) {
        mx = (m[i] > mx) ? m[i] : mx;
    }
    /* an attention sink (-INFINITY: none, which changes no bit: exp(-inf) = 0) joins the
     * max and the denominator (kvf_attn_sink_factor) */
    mx = (sink > mx) ? sink : mx;
    lsum = expf(sink - mx);
    for (int i = 0; i < n; ++i) {
        float w = (m[i] == -INFINITY) ? 0.0f : expf(m[i] - mx);
        lsum += w * l[i];
        a += w * acc[(size_t)i * ld + d];
    }
    return a / lsum;
}

/**
 * The factor f of one (query, head)'s output o[d] = acc[d] * f under an attention sink
 * @a sink (gpt-oss; transformers' eager attention: the sink's logit is one more column of
 * the softmax, dropped after it): with M = max(m, sink) and a = exp(m - M),
 * f = a / (l * a + exp(sink - M)). Without a sink the output stays acc[d] / l
 * (kvf_attn_finish).
 */
static inline KVF_HD float kvf_attn_sink_factor(float m, float l, float sink)
{
    const float mx = (sink > m) ? sink : m;
    const float a = expf(m - mx);
    return a / fmaf(l, a, expf(sink - mx));   /* one rounding: the same on CPU and GPU */
}

/** Output of one (query, head): o[d] = acc[d] / l. */
static inline KVF_HD void kvf_attn_finish(const float *acc, float l, size_t hd, float *o)
{
    for (size_t d = 0; d < hd; ++d) {
        o[d] = acc[d] / l;
    }
}

/**
 * The split-K range @a y of a query with causal limit @a limit (its own
 * position) and first attended token @a lo (kvf_attn_window_lo; 0 without a
 * window) over kernel blocks of @a kbs tokens: kernel blocks [*kb0, *kb1)
 * with *kb0 = lo / kbs + y * per, *kb1 = min(*kb0 + per, nkb), nkb =
 * limit / kbs + 1, per = kvf_attn_split_per(nkb - lo / kbs, kbs); empty
 * (*kb0 >= *kb1) past the query's own count. Kernel blocks wholly before
 * the window are never read. The one rule both CUDA attention kernels
 * (per token and tiled) fold by, so a query gets the same ranges in either.
 */
static inline KVF_HD void kvf_attn_split_range(int limit, int lo, int kbs, int y, int *kb0,
                                              int *kb1)
{
    const int first = lo / kbs, nkb = limit / kbs + 1;
    const int per = kvf_attn_split_per(nkb - first, kbs);
    const int b0 = first + y * per;
    *kb0 = b0;
    *kb1 = (b0 + per < nkb) ? b0 + per : nkb;
}

#endif
