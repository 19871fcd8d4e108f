/*
 * Paged causal GQA attention on the CPU, written the way GPU paged-attention
 * kernels work so that it has their failure modes.
 *
 * Design: for each query token and KV head, walk the request's kernel blocks
 * in order, load one whole kernel block of K and V (all kernel_block_size
 * slots, written or not) into fp32 tiles, and fold it into an online softmax
 * (FlashAttention style: running max m, denominator l, accumulator acc,
 * rescaled by exp(m_old - m_new) per tile). Slots past the query's causal
 * limit get probability 0, selected as a GPU kernel selects -inf for a
 * masked score, and still enter the value sum: acc += 0 * v. A GPU kernel
 * does the same (the whole V tile goes through the P.V product), which is
 * why a stale NaN/Inf in an unwritten slot of a recycled block poisons the
 * output. This must stay: tests use it to prove that kvf_blocks_zero is
 * what fixes it. The running max only looks at unmasked scores (as
 * -inf-masked max does). The probability is selected, not multiplied by 0
 * after the exp: a masked slot's score (0 for a zeroed slot) can exceed the
 * running max by more than exp's range when every real score is very
 * negative, and 0 * inf would be NaN on correct data.
 *
 * Each tile is loaded once per KV head for all queries of the call and all
 * query heads of the GQA group. Calls with ascending positions (every chunk
 * the model runs) take the blocked path, kvf_attn_paged_blocked below: the
 * same fold (kvf_attn_tile_probs) over tiles of several kernel blocks, with
 * vectorised loops; other calls the per-query fold of kvf_attn_fold_tile.
 * Rejected alternative: materialising dense K/V per request, which would
 * hide the NaN hazard and cost a copy per step.
 */
#include "kvf_attention.h"
#include "kvf_attention_math.h"
#include "kvf_kern_internal.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

size_t kvf_paged_kv_kernel_block_bytes(const kvf_paged_kv_t *kv)
{
    return 2u * (size_t)kv->kv_heads * (size_t)kv->kernel_block_size * (size_t)kv->head_dim *
           kvf_dtype_size(kv->dtype);
}

int kvf_paged_kv_check(const kvf_paged_kv_t *kv)
{
    if ((kv == NULL) || (kv->base == NULL) || (kv->page_size == 0) || (kv->slots <= 0) ||
        (kv->slot < 0) || (kv->slot >= kv->slots) || !kvf_kern_cache_dtype_ok(kv->dtype) ||
        (kv->kv_heads <= 0) || (kv->head_dim <= 0) || (kv->block_size <= 0) ||
        (kv->kernel_block_size <= 0) || ((kv->block_size % kv->kernel_block_size) != 0) ||
        (kv->num_blocks < 0) || ((kv->num_blocks > 0) && (kv->block_table == NULL))) {
        return KVF_KERN_EINVAL;
    }
    size_t ppl = (size_t)(kv->block_size / kv->kernel_block_size);
    if (ppl * kvf_paged_kv_kernel_block_bytes(kv) > kv->page_size) {
        return KVF_KERN_EINVAL;
    }
    return KVF_KERN_OK;
}

/* Start of the kernel block holding token position @a pos (validated). */
static inline char *kvf_attn_kblock(const kvf_paged_kv_t *kv, size_t kbb, int pos)
{
    return (char *)kv->base + kvf_attn_kblock_offset(kv->block_table, kv->block_size,
                                                     kv->kernel_block_size, kv->slots, kv->slot,
                                                     kv->page_size, kbb, pos);
}

static int kvf_attn_check_positions(const kvf_paged_kv_t *kv, const int32_t *positions, int n)
{
    long limit = (long)kv->num_blocks * (long)kv->block_size;
    for (int t = 0; t < n; ++t) {
        if ((positions[t] < 0) || ((long)positions[t] >= limit)) {
            return KVF_KERN_EINVAL;
        }
    }
    /* every block a query may touch: [0, max position] */
    for (int t = 0; t < n; ++t) {
        for (int b = 0; b <= positions[t] / kv->block_size; ++b) {
            if (kv->block_table[b] < 0) {
                return KVF_KERN_EINVAL;
            }
        }
    }
    return KVF_KERN_OK;
}

int kvf_attn_cache_write(const kvf_device_t *dev, const kvf_paged_kv_t *kv, const float *k,
                         const float *v, int ld, const int32_t *positions, int num_tokens)
{
    int err = kvf_paged_kv_check(kv);
    size_t kbb, hd, kbs, elt_heads;

    if ((err != KVF_KERN_OK) || (num_tokens < 0) || (ld < kv->kv_heads * kv->head_dim)) {
        return KVF_KERN_EINVAL;
    }
    if (num_tokens == 0) {
        return KVF_KERN_OK;
    }
    if ((k == NULL) || (v == NULL) || (positions == NULL)) {
        return KVF_KERN_EINVAL;
    }
    err = kvf_attn_check_positions(kv, positions, num_tokens);
    if (err != KVF_KERN_OK) {
        return err;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_attn_cache_write(dev, kv, k, v, ld, positions, num_tokens);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    kbb = kvf_paged_kv_kernel_block_bytes(kv);
    hd = (size_t)kv->head_dim;
    kbs = (size_t)kv->kernel_block_size;
    elt_heads = (size_t)kv->kv_heads;
    for (int t = 0; t < num_tokens; ++t) {
        char *kblock = kvf_attn_kblock(kv, kbb, positions[t]);
        size_t row = (size_t)(positions[t] % kv->kernel_block_size);
        for (size_t h = 0; h < elt_heads; ++h) {
            size_t k_first = kvf_attn_row_first(elt_heads, kbs, hd, h, row, 0);
            size_t v_first = kvf_attn_row_first(elt_heads, kbs, hd, h, row, 1);
            kvf_kern_store(kblock, kv->dtype, k_first, hd, k + (size_t)t * (size_t)ld + h * hd);
            kvf_kern_store(kblock, kv->dtype, v_first, hd, v + (size_t)t * (size_t)ld + h * hd);
        }
    }
    return KVF_KERN_OK;
}

/* Tokens of one CPU tile of the blocked path: as many whole kernel blocks as
 * fit (at least one), so the score scratch stays about 128 floats per query. */
#define KVF_ATTN_CPU_TILE 128

/*
 * Blocked CPU attention for ascending positions (every chunk the model runs):
 * per KV head, the queries of its GQA group packed as rows Q[nq][hd]; per
 * tile of the kernel blocks that fit KVF_ATTN_CPU_TILE tokens (each loaded
 * whole, written slots or not; tile bounds depend on the kernel block size
 * alone, never on the call), the scores of every query row that
 * reaches the tile, kvf_attn_tile_probs (the shared fold) per row, then
 * acc += P V. The loops run over tile slots (scores, K transposed) and head
 * dims (P V) innermost so they vectorise, while each element keeps the
 * scalar fold's summation order (over dims for a score, over slots for the
 * output): a row's result does not depend on the other rows of the call, so
 * a chunk and the same tokens one by one agree bit for bit. A row reads the
 * tile only up to the end of its own kernel block (rows whose limit is below
 * the tile start not at all), exactly the slots the per-query path reads, so
 * stale bytes poison the same rows (tests/common/cache/test_page_pool_nan.c).
 */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static int kvf_attn_paged_blocked(const kvf_paged_kv_t *kv, const float *q, int ldq,
                                  const int32_t *positions, int num_tokens, int q_heads,
                                  float scale, float *out)
{
    const size_t hd = (size_t)kv->head_dim, kbs = (size_t)kv->kernel_block_size;
    const size_t nkv = (size_t)kv->kv_heads, group = (size_t)q_heads / nkv;
    const int kpt = (kv->kernel_block_size < KVF_ATTN_CPU_TILE) ?
                    KVF_ATTN_CPU_TILE / kv->kernel_block_size : 1;   /* kernel blocks a tile */
    const size_t nq = (size_t)num_tokens * group, tw = (size_t)kpt * kbs;
    const size_t kbb = kvf_paged_kv_kernel_block_bytes(kv);
    const int nkb = positions[num_tokens - 1] / kv->kernel_block_size + 1;
    float *scratch, *ktile, *kt, *vtile, *S, *Q, *acc, *m, *l;

    scratch = malloc((3 * tw * hd + nq * tw + 2 * nq * hd + 2 * nq) * sizeof(float));
    if (scratch == NULL) {
        return KVF_KERN_ENOMEM;
    }
    ktile = scratch;
    kt = ktile + tw * hd;       /* K transposed: [hd][tw] */
    vtile = kt + tw * hd;
    S = vtile + tw * hd;
    Q = S + nq * tw;
    acc = Q + nq * hd;
    m = acc + nq * hd;
    l = m + nq;
    for (size_t kh = 0; kh < nkv; ++kh) {
        int t_first = 0;
        for (int t = 0; t < num_tokens; ++t) {
            for (size_t g = 0; g < group; ++g) {
                memcpy(Q + ((size_t)t * group + g) * hd,
                       q + (size_t)t * (size_t)ldq + (kh * group + g) * hd, hd * sizeof(float));
            }
        }
        for (size_t i = 0; i < nq; ++i) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        memset(acc, 0, nq * hd * sizeof(float));
        for (int kb0 = 0; kb0 < nkb; kb0 += kpt) {
            const int nb = (nkb - kb0 < kpt) ? (nkb - kb0) : kpt;
            const int token0 = kb0 * kv->kernel_block_size;
            const size_t tile_w = (size_t)nb * kbs;
            for (int b = 0; b < nb; ++b) {
                const char *kblock = kvf_attn_kblock(kv, kbb, token0 + b * kv->kernel_block_size);
                kvf_kern_load(kblock, kv->dtype, kh * kbs * hd, kbs * hd, ktile + b * kbs * hd);
                kvf_kern_load(kblock, kv->dtype, (nkv + kh) * kbs * hd, kbs * hd,
                              vtile + b * kbs * hd);
            }
            for (size_t j = 0; j < tile_w; ++j) {
                for (size_t d = 0; d < hd; ++d) {
                    kt[d * tile_w + j] = ktile[j * hd + d];
                }
            }
            while ((t_first < num_tokens) && (positions[t_first] < token0)) {
                ++t_first;   /* tile entirely in this query's future: not read */
            }
            for (size_t i = (size_t)t_first * group; i < nq; ++i) {
                float *srow = S + i * tw, *arow = acc + i * hd;
                const float *qrow = Q + i * hd;
                /* up to the end of the query's own kernel block, as the per-query fold
                 * reads: later kernel blocks of the tile are its future, not read */
                const int limit = positions[i / group];
                const size_t own = (size_t)(limit / kv->kernel_block_size + 1) * kbs -
                                   (size_t)token0;
                const size_t width = (own < tile_w) ? own : tile_w;
                float alpha;
                for (size_t j = 0; j < width; ++j) {
                    srow[j] = 0.0f;
                }
                for (size_t d = 0; d < hd; ++d) {
                    const float qd = qrow[d];
                    const float *krow = kt + d * tile_w;
                    for (size_t j = 0; j < width; ++j) {
                        srow[j] += qd * krow[j];
                    }
                }
                for (size_t j = 0; j < width; ++j) {
                    srow[j] *= scale;
                }
                alpha = kvf_attn_tile_probs(srow, width, token0, limit, &m[i], &l[i]);
                for (size_t d = 0; d < hd; ++d) {
                    arow[d] *= alpha;
                }
                for (size_t j = 0; j < width; ++j) {
                    const float p = srow[j];          /* masked: 0, still 0 * v */
                    const float *vrow = vtile + j * hd;
                    for (size_t d = 0; d < hd; ++d) {
                        arow[d] += p * vrow[d];
                    }
                }
            }
        }
        for (size_t i = 0; i < nq; ++i) {
            size_t t = i / group, g = i % group;
            kvf_attn_finish(acc + i * hd, l[i], hd,
                            out + t * (size_t)q_heads * hd + (kh * group + g) * hd);
        }
    }
    free(scratch);
    return KVF_KERN_OK;
}

int kvf_attn_paged(const kvf_device_t *dev, const kvf_paged_kv_t *kv, const float *q, int ldq,
                   const int32_t *positions, int num_tokens, int q_heads, float scale,
                   float *out)
{
    int err = kvf_paged_kv_check(kv);
    size_t kbb, hd, kbs, nkv, group, nq, nstate;
    float *scratch, *ktile, *vtile, *s, *acc, *m, *l;
    int max_pos = 0;

    if ((err != KVF_KERN_OK) || (num_tokens < 0) || (q_heads <= 0) ||
        ((q_heads % kv->kv_heads) != 0) || (ldq < q_heads * kv->head_dim)) {
        return KVF_KERN_EINVAL;
    }
    if (num_tokens == 0) {
        return KVF_KERN_OK;
    }
    if ((q == NULL) || (positions == NULL) || (out == NULL)) {
        return KVF_KERN_EINVAL;
    }
    err = kvf_attn_check_positions(kv, positions, num_tokens);
    if (err != KVF_KERN_OK) {
        return err;
    }
    if (!(scale > 0.0f)) {
        scale = 1.0f / sqrtf((float)kv->head_dim);
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_attn_paged(dev, kv, q, ldq, positions, num_tokens, q_heads, scale, out);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    {
        bool ascending = true;
        for (int t = 1; t < num_tokens; ++t) {
            ascending = ascending && (positions[t] >= positions[t - 1]);
        }
        if (ascending) {
            return kvf_attn_paged_blocked(kv, q, ldq, positions, num_tokens, q_heads, scale, out);
        }
    }
    for (int t = 0; t < num_tokens; ++t) {
        max_pos = (positions[t] > max_pos) ? positions[t] : max_pos;
    }
    kbb = kvf_paged_kv_kernel_block_bytes(kv);
    hd = (size_t)kv->head_dim;
    kbs = (size_t)kv->kernel_block_size;
    nkv = (size_t)kv->kv_heads;
    group = (size_t)q_heads / nkv;
    nq = (size_t)num_tokens * group;   /* (query, head of the GQA group) pairs */
    nstate = nq * (hd + 2);

    scratch = malloc((2 * kbs * hd + kbs + nstate) * sizeof(float));
    if (scratch == NULL) {
        return KVF_KERN_ENOMEM;
    }
    ktile = scratch;
    vtile = ktile + kbs * hd;
    s = vtile + kbs * hd;
    acc = s + kbs;
    m = acc + nq * hd;
    l = m + nq;

    /* Tiles in the outer loop: each kernel block is loaded (and converted)
     * once per KV head for all queries of the call, as a GPU kernel streams
     * K/V tiles past a tile of queries. Per query the tiles still arrive in
     * ascending order, so the result does not depend on the chunking. */
    for (size_t kh = 0; kh < nkv; ++kh) {
        for (size_t i = 0; i < nq; ++i) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        memset(acc, 0, nq * hd * sizeof(float));
        for (int kb = 0; kb <= max_pos / kv->kernel_block_size; ++kb) {
            int token0 = kb * kv->kernel_block_size;
            const char *kblock = kvf_attn_kblock(kv, kbb, token0);
            /* the whole tile, written slots or not, as a GPU kernel loads it */
            kvf_kern_load(kblock, kv->dtype, kh * kbs * hd, kbs * hd, ktile);
            kvf_kern_load(kblock, kv->dtype, (nkv + kh) * kbs * hd, kbs * hd, vtile);
            for (int t = 0; t < num_tokens; ++t) {
                int limit = positions[t];
                if (limit < token0) {
                    continue;   /* tile entirely in this query's future: not read */
                }
                for (size_t g = 0; g < group; ++g) {
                    const float *qv = q + (size_t)t * (size_t)ldq + (kh * group + g) * hd;
                    size_t qi = (size_t)t * group + g;
                    kvf_attn_fold_tile(qv, ktile, vtile, KVF_HD_FP32, kbs, hd, token0, limit,
                                       scale, &m[qi], &l[qi], acc + qi * hd, s);
                }
            }
        }
        for (int t = 0; t < num_tokens; ++t) {
            for (size_t g = 0; g < group; ++g) {
                size_t qi = (size_t)t * group + g;
                float *o = out + (size_t)t * (size_t)q_heads * hd + (kh * group + g) * hd;
                kvf_attn_finish(acc + qi * hd, l[qi], hd, o);
            }
        }
    }
    free(scratch);
    return KVF_KERN_OK;
}
