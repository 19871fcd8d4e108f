/*
 * Query tiles of the tiled CUDA paged attention (kvf_attention_tiled_cuda.cu):
 * which queries share one thread block, which kernel blocks the block walks
 * and how many K rows it reads. The kernel, its launcher and the CPU test
 * (tests/kernels/test_kern_attention_tile.c) call these same functions; the
 * test checks on random shapes that every query folds exactly the kernel
 * blocks, split-K ranges, KV head and block table the per-token kernel
 * (kvf_attention_cuda.cu) gives it.
 *
 * Queries of a launch: row t of num_tokens (the requests' rows one after the
 * other) and query head qh = kh * group + g, group = q_heads / kv_heads (the
 * GQA ratio), kh its KV head. Within KV head kh the query index is
 * u = t * group + g. A tile is a run of at most qt consecutive u inside ONE
 * request: some consecutive tokens times the query heads of one KV head, so
 * its queries read the same block table and the same K/V rows. The tile list
 * is the same for every KV head (the kernel's blockIdx.z is kh).
 */
#ifndef KVF_ATTENTION_TILE_H
#define KVF_ATTENTION_TILE_H

#include "kvf_attention_math.h"
#include "kvf_hd.h"

#include <stddef.h>
#include <stdint.h>

#define KVF_ATTN_TILE_THREADS 256    /* threads of a tile's thread block */
#define KVF_ATTN_TILE_Q_MAX   16     /* queries per tile */
#define KVF_ATTN_TILE_ACC     8      /* acc[d] per thread: qt * head_dim <= ACC * THREADS */
#define KVF_ATTN_TILE_SCORES  16384  /* qt * kbs scores in shared memory (64 KiB) */
#define KVF_ATTN_TILE_ROWS    32     /* K or V rows staged in shared memory at once, at most */
/* staged values a thread fetches ahead (PF * THREADS a pass): at 16, CUDA 13.0's ptxas for
 * sm_90 fails register allocation of the tiled kernel (C7600); at 8 it takes 123 registers */
#define KVF_ATTN_TILE_PF      8

/**
 * Queries per tile for @a head_dim and kernel block size @a kbs (both > 0):
 * min(KVF_ATTN_TILE_Q_MAX, ACC * THREADS / head_dim, SCORES / kbs), the
 * accumulators in registers and the tile's scores in shared memory.
 * @return qt >= 2, or 0 when fewer than two queries fit (the per-token
 *         kernel runs: nothing to share), e.g. head_dim > 1024.
 */
static inline KVF_HD int kvf_attn_tile_queries(int head_dim, int kbs)
{
    int q = KVF_ATTN_TILE_Q_MAX;
    const int by_acc = KVF_ATTN_TILE_ACC * KVF_ATTN_TILE_THREADS / head_dim;
    const int by_sc = KVF_ATTN_TILE_SCORES / kbs;
    q = (by_acc < q) ? by_acc : q;
    q = (by_sc < q) ? by_sc : q;
    return (q >= 2) ? q : 0;
}

/**
 * Dynamic shared memory of a tile's thread block, bytes: the queries
 * [qt][head_dim], the scores [qt][kbs] and the staged rows
 * [KVF_ATTN_TILE_ROWS][head_dim + 1] (padded: a warp reading 32 rows at one
 * dim hits 32 banks), all fp32. At most 106,624 for head_dim <= 256 and
 * qt from kvf_attn_tile_queries().
 */
static inline KVF_HD size_t kvf_attn_tile_smem(int qt, int head_dim, int kbs)
{
    return sizeof(float) * ((size_t)qt * (size_t)head_dim + (size_t)qt * (size_t)kbs +
                            (size_t)KVF_ATTN_TILE_ROWS * (size_t)(head_dim + 1));
}

/**
 * Tiles of one KV head for requests of seq_tokens[i] rows each (num_seqs
 * requests, rows >= 0): sum of ceil(seq_tokens[i] * group / qt).
 */
static inline KVF_HD int kvf_attn_tile_count(const int *seq_tokens, int num_seqs, int group,
                                             int qt)
{
    int n = 0;
    for (int i = 0; i < num_seqs; ++i) {
        n += (seq_tokens[i] * group + qt - 1) / qt;
    }
    return n;
}

/**
 * The tile list: tiles[2 * i] = first query index u of tile i,
 * tiles[2 * i + 1] = its query count (1..qt); request by request, each
 * request's u range [o * group, (o + n) * group) cut into runs of qt (the
 * last one shorter). @a tiles holds kvf_attn_tile_count() pairs.
 * @return the number of tiles written.
 */
static inline KVF_HD int kvf_attn_tile_plan(const int *seq_tokens, int num_seqs, int group,
                                            int qt, int32_t *tiles)
{
    int n = 0, first = 0;
    for (int i = 0; i < num_seqs; ++i) {
        const int nu = seq_tokens[i] * group;
        for (int c = 0; c < nu; c += qt) {
            tiles[2 * n] = first + c;
            tiles[2 * n + 1] = (nu - c < qt) ? nu - c : qt;
            ++n;
        }
        first += nu;
    }
    return n;
}

/** Query u of KV head @a kh: row *t = u / group, query head *qh = kh * group + u % group. */
static inline KVF_HD void kvf_attn_tile_query(int u, int group, int kh, int *t, int *qh)
{
    *t = u / group;
    *qh = kh * group + u % group;
}

/** Whether a query with split range [kb0, kb1) folds kernel block @a kb. */
static inline KVF_HD int kvf_attn_tile_folds(int kb, int kb0, int kb1)
{
    return (kb0 <= kb) && (kb < kb1);
}

/**
 * The kernel blocks a tile walks for one split, ascending: [*lo, *hi), the
 * hull of its @a n queries' non-empty ranges [kb0[i], kb1[i]) (empty,
 * *lo >= *hi, when all are). A query skips the blocks of the hull outside
 * its own range (kvf_attn_tile_folds), so it folds exactly its range, in
 * order.
 */
static inline KVF_HD void kvf_attn_tile_span(const int *kb0, const int *kb1, int n, int *lo,
                                             int *hi)
{
    int a = 0x7fffffff, b = 0;
    for (int i = 0; i < n; ++i) {
        if (kb0[i] < kb1[i]) {
            a = (kb0[i] < a) ? kb0[i] : a;
            b = (kb1[i] > b) ? kb1[i] : b;
        }
    }
    *lo = (a < b) ? a : 0;
    *hi = (a < b) ? b : 0;
}

/**
 * The next kernel block after @a kb and below @a hi that some of the @a n
 * queries folds: the tile's walk (from kb = lo - 1) skips gaps between the
 * queries' ranges. @return hi when there is none.
 */
static inline KVF_HD int kvf_attn_tile_next(const int *kb0, const int *kb1, int n, int kb,
                                            int hi)
{
    for (int b = kb + 1; b < hi; ++b) {
        for (int i = 0; i < n; ++i) {
            if (kvf_attn_tile_folds(b, kb0[i], kb1[i])) {
                return b;
            }
        }
    }
    return hi;
}

/**
 * Rows of a staging pass for @a head_dim (> 0): min(KVF_ATTN_TILE_ROWS,
 * KVF_ATTN_TILE_PF * KVF_ATTN_TILE_THREADS / head_dim), so that each thread
 * fetches at most KVF_ATTN_TILE_PF values of the next pass into registers
 * while the block computes on this one: 32 rows up to head_dim 64, 16 at
 * 128, 8 at 256.
 */
static inline KVF_HD int kvf_attn_tile_pass_rows(int head_dim)
{
    const int r = KVF_ATTN_TILE_PF * KVF_ATTN_TILE_THREADS / head_dim;
    return (r < KVF_ATTN_TILE_ROWS) ? ((r > 0) ? r : 1) : KVF_ATTN_TILE_ROWS;
}

/**
 * K rows of kernel block @a kb (tokens kb * kbs ...) a tile reads: through
 * the last slot unmasked for any query folding kb, min(kbs, max limit -
 * kb * kbs + 1); 0 when no query folds kb. A row past every folding query's
 * limit is masked for all of them: its score is never read (the per-token
 * kernel skips its dot too). V rows are read for every slot (a masked slot
 * enters the sum as 0 * v).
 */
static inline KVF_HD int kvf_attn_tile_k_rows(const int *limit, const int *kb0, const int *kb1,
                                              int n, int kb, int kbs)
{
    int rows = 0;
    for (int i = 0; i < n; ++i) {
        if (kvf_attn_tile_folds(kb, kb0[i], kb1[i])) {
            int r = limit[i] - kb * kbs + 1;
            r = (r > kbs) ? kbs : r;
            rows = (r > rows) ? r : rows;
        }
    }
    return rows;
}

#endif
