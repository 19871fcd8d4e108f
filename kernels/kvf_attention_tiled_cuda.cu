/*
 * CUDA paged attention, tiled: one thread block per tile of queries that
 * share K/V (kvf_attention_tile.h: some consecutive tokens of one request
 * times the query heads of one KV head; blockIdx.x tile, .y split-K range,
 * .z KV head), selected by KVF_GPU_ATTN=tiled (kvf_attention_cuda.h).
 *
 * Design: the per-token kernel (kvf_attention_cuda.cu) gives each
 * (token, query head) its own block, so in a prefill chunk of T tokens every
 * block re-reads the K/V tiles of its causal range from global memory, and
 * the q_heads / kv_heads query heads of one KV head read the same rows again.
 * Here each kernel block's K rows, then its V rows, are staged in shared
 * memory (32 rows at a time, as fp32) ONCE per tile and every query of the
 * tile reads them there. Per query the arithmetic is the per-token kernel's,
 * operation for operation, so the outputs are the same bits by
 * construction (issue 33's batch invariance: a query's bits do not depend on
 * which queries share its launch or its tile):
 *   - each score is one thread's dot in dim order from 0 (fma), times scale;
 *     slots past the query's limit are not computed (never read);
 *   - the new running max is the max of the old one and the unmasked scores,
 *     taken as `s > max` from the old max (warp shuffles instead of the
 *     per-token kernel's shared-memory tree: a max does not depend on the
 *     order, but for +0 against -0, which give the same exp(s - m) and the
 *     same merge weights, so no output bit);
 *   - alpha = expf(m - m_new), each slot's probability kvf_attn_prob, the
 *     denominator summed by one thread in slot order from 0 over every slot,
 *     l = fma(l, alpha, lsum), acc[d] *= alpha then acc[d] = fma(p_j, v_j[d],
 *     acc[d]) over every slot in order (a masked slot as 0 * v: stale NaN/Inf
 *     still poisons, as the contract of kvf_attention.h says);
 *   - each query's split-K ranges come from its own limit
 *     (kvf_attn_split_range, the per-token kernel's rule), the tile walks the
 *     hull of its queries' ranges in ascending order and a query skips the
 *     kernel blocks outside its own; out = acc / l, or partials merged by the
 *     same kvf_attn_merge_kernel.
 * The products and sums are written as __fmaf_rn / __fmul_rn / __fadd_rn,
 * which nvcc never contracts or reorders: they are the instructions nvcc
 * emits for the per-token kernel's expressions (its PTX: fma.rn for the dot,
 * the acc update and l; a rounded multiply for the score and the alpha
 * rescale; adds for the denominator), so neither contraction choice can
 * differ between the two kernels.
 * Sizes (kvf_attn_tile_queries): up to 16 queries per tile, fewer when
 * qt * head_dim > 2048 (the accumulators: 8 registers per thread of 256) or
 * qt * kbs > 16384 (the scores, 64 KiB of shared memory); about 104 KiB of
 * dynamic shared memory at most (head_dim 256, kbs 2048: 8 queries). Falls back to the
 * per-token kernel when fewer than two queries fit or the device allows a
 * block less shared memory than the tile needs.
 * Status: compiled with -Werror for sm_80 and sm_90, never run on a GPU when
 * written (no GPU in that session): the default stays the per-token kernel
 * until tests/gpu/attn_tiled_vs_pertoken has shown the two equal bit for bit
 * on a GPU (it also prints the time of each).
 *
 * Rejected: a tensor-core tile (QK^T and PV as MMA): its sums are not the
 * shared fold's, so neither the CPU twin's nor the per-token kernel's bits.
 * Rejected: whole kernel blocks of K and V in shared memory: a hybrid
 * model's kernel block is 1312 tokens and more (Nemotron-Nano-9B-v2 at
 * TP 1: 1312 x 128 fp32 is 656 KiB per K tile); rows are staged 32 at a
 * time, and only the scores ([qt][kbs]) stay for the whole kernel block.
 * Rejected: skipping the V rows past every query's limit: 0 * v must still
 * meet a stale NaN there, as in the per-token kernel.
 */
#include "kvf_attention_cuda.h"
#include "kvf_attention_math.h"
#include "kvf_attention_tile.h"
#include "kvf_cuda_util.h"

#include <stdlib.h>

#define KVF_TW (KVF_ATTN_TILE_THREADS / 32)   /* warps per tile block */

/*
 * Tile blockIdx.x (tiles[2 * x]: first query u, tiles[2 * x + 1]: count) of KV
 * head blockIdx.z, split blockIdx.y of gridDim.y. Dynamic shared memory:
 * kvf_attn_tile_smem(qt, head_dim, kbs).
 */
__global__ void __launch_bounds__(KVF_ATTN_TILE_THREADS)
kvf_attn_tiled_kernel(kvf_cuda_kv g, const float *q, int ldq, const int32_t *positions,
                      int q_heads, float scale, float *out, float *part_m, float *part_l,
                      float *part_acc, const int32_t *tok_seq, int maxb, const int32_t *tiles,
                      int qt)
{
    extern __shared__ float sh[];
    __shared__ int lim[KVF_ATTN_TILE_Q_MAX], kb0[KVF_ATTN_TILE_Q_MAX], kb1[KVF_ATTN_TILE_Q_MAX];
    __shared__ float m_sh[KVF_ATTN_TILE_Q_MAX], l_sh[KVF_ATTN_TILE_Q_MAX];
    __shared__ float mnew_sh[KVF_ATTN_TILE_Q_MAX], alpha_sh[KVF_ATTN_TILE_Q_MAX];
    const int hd = g.head_dim, kbs = g.kbs, nkv = g.kv_heads, group = q_heads / nkv;
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, ldr = hd + 1;
    const int y = (int)blockIdx.y, splits = (int)gridDim.y, kh = (int)blockIdx.z;
    const int u0 = tiles[2 * blockIdx.x], nq = tiles[2 * blockIdx.x + 1];
    float *qs = sh, *sc = sh + (size_t)qt * hd, *rows = sc + (size_t)qt * kbs;
    float acc[KVF_ATTN_TILE_ACC];
    int t0, qh0, lo, hi;

    kvf_attn_tile_query(u0, group, kh, &t0, &qh0);
    const int32_t *table = kvf_cuda_table(g, tok_seq, maxb, (size_t)t0);   /* one request */
    if (tid < nq) {
        int t, qh;
        kvf_attn_tile_query(u0 + tid, group, kh, &t, &qh);
        lim[tid] = positions[t];
        kvf_attn_split_range(lim[tid], kbs, y, &kb0[tid], &kb1[tid]);
        m_sh[tid] = -INFINITY;
        l_sh[tid] = 0.0f;
    }
    for (int i = tid; i < nq * hd; i += KVF_ATTN_TILE_THREADS) {
        int t, qh;
        kvf_attn_tile_query(u0 + i / hd, group, kh, &t, &qh);
        qs[i] = q[(size_t)t * (size_t)ldq + (size_t)qh * hd + (size_t)(i % hd)];
    }
#pragma unroll
    for (int k = 0; k < KVF_ATTN_TILE_ACC; ++k) {
        acc[k] = 0.0f;
    }
    __syncthreads();
    kvf_attn_tile_span(kb0, kb1, nq, &lo, &hi);
    for (int kb = lo; kb < hi; ++kb) {
        const int krows = kvf_attn_tile_k_rows(lim, kb0, kb1, nq, kb, kbs);
        if (krows == 0) {
            continue;   /* no query folds kb (a gap between ranges): uniform over the block */
        }
        const int token0 = kb * kbs;
        const char *kblock = kvf_cuda_kblock(g, table, token0);
        const char *kt = kblock + (size_t)kh * kbs * hd * g.elt;
        const char *vt = kblock + (size_t)(nkv + kh) * kbs * hd * g.elt;

        /* scores: K rows staged 32 at a time; thread (qi, row) dots in dim order */
        for (int r0 = 0; r0 < krows; r0 += KVF_ATTN_TILE_ROWS) {
            const int nr = (krows - r0 < KVF_ATTN_TILE_ROWS) ? krows - r0 : KVF_ATTN_TILE_ROWS;
            for (int i = tid; i < nr * hd; i += KVF_ATTN_TILE_THREADS) {
                rows[(i / hd) * ldr + i % hd] =
                    kvf_hd_load(kt, g.dtype, (size_t)r0 * hd + (size_t)i);
            }
            __syncthreads();
            for (int p = tid; p < nq * KVF_ATTN_TILE_ROWS; p += KVF_ATTN_TILE_THREADS) {
                const int qi = p / KVF_ATTN_TILE_ROWS, jr = p % KVF_ATTN_TILE_ROWS;
                if ((jr < nr) && kvf_attn_tile_folds(kb, kb0[qi], kb1[qi]) &&
                    (token0 + r0 + jr <= lim[qi])) {
                    const float *qv = qs + (size_t)qi * hd, *kr = rows + jr * ldr;
                    float dot = 0.0f;
                    for (int d = 0; d < hd; ++d) {
                        dot = __fmaf_rn(qv[d], kr[d], dot);
                    }
                    sc[(size_t)qi * kbs + r0 + jr] = __fmul_rn(dot, scale);
                }
            }
            __syncthreads();   /* rows is restaged; the last pass's scores are complete */
        }
        /* running max over the unmasked scores, and alpha: one warp per query */
        for (int qi = warp; qi < nq; qi += KVF_TW) {
            if (!kvf_attn_tile_folds(kb, kb0[qi], kb1[qi])) {
                continue;   /* uniform over the warp */
            }
            const int n = (lim[qi] - token0 + 1 < kbs) ? lim[qi] - token0 + 1 : kbs;
            float mt = m_sh[qi];
            for (int j = lane; j < n; j += 32) {
                const float s = sc[(size_t)qi * kbs + j];
                mt = (s > mt) ? s : mt;
            }
            for (int o = 16; o > 0; o /= 2) {
                const float other = __shfl_down_sync(0xffffffffu, mt, o);
                mt = (other > mt) ? other : mt;
            }
            if (lane == 0) {
                mnew_sh[qi] = mt;
                alpha_sh[qi] = expf(m_sh[qi] - mt);   /* 0 on the first kernel block */
            }
        }
        __syncthreads();
        for (int p = tid; p < nq * kbs; p += KVF_ATTN_TILE_THREADS) {
            const int qi = p / kbs, j = p % kbs;
            if (kvf_attn_tile_folds(kb, kb0[qi], kb1[qi])) {
                sc[p] = kvf_attn_prob(sc[p], token0, (size_t)j, lim[qi], mnew_sh[qi]);
            }
        }
#pragma unroll
        for (int k = 0; k < KVF_ATTN_TILE_ACC; ++k) {
            const int i = tid + k * KVF_ATTN_TILE_THREADS, qi = i / hd;
            if ((i < nq * hd) && kvf_attn_tile_folds(kb, kb0[qi], kb1[qi])) {
                acc[k] = __fmul_rn(acc[k], alpha_sh[qi]);
            }
        }
        __syncthreads();
        /* p * V over every slot in order, V rows staged 32 at a time; thread qi < nq adds
         * its query's denominator in slot order alongside */
        float lsum = 0.0f;
        for (int r0 = 0; r0 < kbs; r0 += KVF_ATTN_TILE_ROWS) {
            const int nr = (kbs - r0 < KVF_ATTN_TILE_ROWS) ? kbs - r0 : KVF_ATTN_TILE_ROWS;
            for (int i = tid; i < nr * hd; i += KVF_ATTN_TILE_THREADS) {
                rows[(i / hd) * ldr + i % hd] =
                    kvf_hd_load(vt, g.dtype, (size_t)r0 * hd + (size_t)i);
            }
            __syncthreads();
            if (tid < nq) {
                const float *p = sc + (size_t)tid * kbs + r0;
                for (int jr = 0; jr < nr; ++jr) {
                    lsum = __fadd_rn(lsum, p[jr]);
                }
            }
#pragma unroll
            for (int k = 0; k < KVF_ATTN_TILE_ACC; ++k) {
                const int i = tid + k * KVF_ATTN_TILE_THREADS, qi = i / hd, d = i % hd;
                if ((i < nq * hd) && kvf_attn_tile_folds(kb, kb0[qi], kb1[qi])) {
                    const float *p = sc + (size_t)qi * kbs + r0;
                    float a = acc[k];
                    for (int jr = 0; jr < nr; ++jr) {
                        a = __fmaf_rn(p[jr], rows[jr * ldr + d], a);
                    }
                    acc[k] = a;
                }
            }
            __syncthreads();   /* rows is restaged */
        }
        if ((tid < nq) && kvf_attn_tile_folds(kb, kb0[tid], kb1[tid])) {
            l_sh[tid] = __fmaf_rn(l_sh[tid], alpha_sh[tid], lsum);
            m_sh[tid] = mnew_sh[tid];
        }
        __syncthreads();   /* m_sh, l_sh read by the next kernel block's max */
    }
#pragma unroll
    for (int k = 0; k < KVF_ATTN_TILE_ACC; ++k) {
        const int i = tid + k * KVF_ATTN_TILE_THREADS, qi = i / hd, d = i % hd;
        if (i < nq * hd) {
            int t, qh;
            kvf_attn_tile_query(u0 + qi, group, kh, &t, &qh);
            const size_t row = (size_t)t * (size_t)q_heads + (size_t)qh;
            if (splits == 1) {
                out[row * hd + d] = __fdiv_rn(acc[k], l_sh[qi]);   /* kvf_attn_finish */
            } else {
                part_acc[(row * splits + y) * hd + d] = acc[k];
            }
        }
    }
    if ((splits > 1) && (tid < nq)) {
        int t, qh;
        kvf_attn_tile_query(u0 + tid, group, kh, &t, &qh);
        const size_t pi = ((size_t)t * (size_t)q_heads + (size_t)qh) * splits + y;
        part_m[pi] = m_sh[tid];
        part_l[pi] = l_sh[tid];
    }
}

int kvf_attn_tiled_launch(cudaStream_t stream, const kvf_cuda_kv &g, const float *q, int ldq,
                          const int32_t *d_pos, const int *seq_tokens, int num_seqs,
                          int q_heads, int splits, float scale, float *out, float *pm,
                          float *pl, float *pacc, const int32_t *tok_seq, int maxb,
                          bool *ran_p)
{
    const int group = q_heads / g.kv_heads, qt = kvf_attn_tile_queries(g.head_dim, g.kbs);
    int dev = 0, optin = 0, ntiles, rc;
    void *dtiles = NULL;

    *ran_p = false;
    if (qt == 0) {
        return KVF_KERN_OK;
    }
    const size_t smem = kvf_attn_tile_smem(qt, g.head_dim, g.kbs);
    cudaFuncAttributes attr;
    KVF_CUDA_CHECK(cudaGetDevice(&dev));
    KVF_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    KVF_CUDA_CHECK(cudaFuncGetAttributes(&attr, kvf_attn_tiled_kernel));
    if (smem + attr.sharedSizeBytes > (size_t)optin) {
        return KVF_KERN_OK;   /* the per-token kernel runs */
    }
    ntiles = kvf_attn_tile_count(seq_tokens, num_seqs, group, qt);
    if (ntiles == 0) {
        *ran_p = true;   /* no rows: nothing to launch */
        return KVF_KERN_OK;
    }
    int32_t *h = (int32_t *)malloc((size_t)ntiles * 2 * sizeof(int32_t));
    if (h == NULL) {
        return KVF_KERN_ENOMEM;
    }
    (void)kvf_attn_tile_plan(seq_tokens, num_seqs, group, qt, h);
    rc = kvf_cuda_scratch(stream, (size_t)ntiles * 2 * sizeof(int32_t), h, &dtiles);
    free(h);   /* staged by the copy */
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    if (smem > 48u * 1024u) {
        KVF_CUDA_CHECK_GOTO(cudaFuncSetAttribute(kvf_attn_tiled_kernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem), rc, out_free);
    }
    {
        dim3 grid((unsigned)ntiles, (unsigned)splits, (unsigned)g.kv_heads);
        kvf_attn_tiled_kernel<<<grid, KVF_ATTN_TILE_THREADS, smem, stream>>>(
            g, q, ldq, d_pos, q_heads, scale, out, pm, pl, pacc, tok_seq, maxb,
            (const int32_t *)dtiles, qt);
        rc = kvf_cuda_launched("kvf_attn_tiled_kernel");
    }
    if (rc == KVF_KERN_OK) {
        *ran_p = true;
    }
out_free:
    kvf_cuda_scratch_free(stream, dtiles);
    return rc;
}
