/*
 * The tiled attention kernel (kvf_attention_tiled_cuda.cu has its design and
 * launcher), kept in a header whose body is also C: under nvcc it is the
 * __global__ kernel; the CPU test tests/kernels/test_kern_attention_tiled_emu.c
 * defines the few CUDA names below itself and runs the same code with one host
 * thread per CUDA thread and barriers for __syncthreads, against the
 * per-token kernel's arithmetic written serially.
 *
 * Outside nvcc the includer defines: KVF_TILE_KERNEL (the return type and
 * qualifiers), KVF_TILE_SHARED (storage of the block's shared arrays: one
 * block runs at a time there), KVF_TILE_DYN_SHARED(name) (declares float
 * *name, the dynamic shared memory), KVF_TILE_UNROLL, KVF_TILE_FN (a device
 * helper's qualifiers), threadIdx, blockIdx,
 * gridDim, __syncthreads(), __shfl_down_sync(), __fmaf_rn, __fmul_rn,
 * __fadd_rn and __fdiv_rn (correctly rounded, never contracted).
 */
#ifndef KVF_ATTENTION_TILED_KERNEL_H
#define KVF_ATTENTION_TILED_KERNEL_H

#include "kvf_attention_cuda.h"
#include "kvf_attention_math.h"
#include "kvf_attention_tile.h"
#include "kvf_hd.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
/* at least 2 blocks per SM: ptxas then takes the registers it needs (95, no spill)
 * instead of spilling at 48-64 */
#define KVF_TILE_KERNEL             __global__ void __launch_bounds__(KVF_ATTN_TILE_THREADS, 2)
#define KVF_TILE_SHARED             __shared__
#define KVF_TILE_DYN_SHARED(_name)  extern __shared__ float _name[]
#define KVF_TILE_UNROLL             _Pragma("unroll")
#define KVF_TILE_FN                 static __device__ __forceinline__
#endif

/* this thread's share of rows [r0, r0 + nr) of a K or V tile (elements typed @a dtype) into
 * pf: element tid + k * THREADS of the pass in pf[k] (nr * hd <= PF * THREADS) */
KVF_TILE_FN void kvf_attn_tile_fetch(float *pf, const char *tile, int dtype, int r0, int nr,
                                     int hd, int tid)
{
    KVF_TILE_UNROLL
    for (int k = 0; k < KVF_ATTN_TILE_PF; ++k) {
        const int i = tid + k * KVF_ATTN_TILE_THREADS;
        if (i < nr * hd) {
            pf[k] = kvf_hd_load(tile, dtype, (size_t)r0 * hd + (size_t)i);
        }
    }
}

/* the fetched pass into the staged rows [nr][ldr] */
KVF_TILE_FN void kvf_attn_tile_put(const float *pf, float *rows, int nr, int hd, int ldr,
                                   int tid)
{
    KVF_TILE_UNROLL
    for (int k = 0; k < KVF_ATTN_TILE_PF; ++k) {
        const int i = tid + k * KVF_ATTN_TILE_THREADS;
        if (i < nr * hd) {
            rows[(i / hd) * ldr + i % hd] = pf[k];
        }
    }
}

/* the scores of kernel block @kb (first token token0): thread (qi, row) dots in dim order over
 * a pass of nr staged K rows, krows in all; meanwhile pf fetches the next pass (after the last
 * K pass, the first V pass of @vt) */
KVF_TILE_FN void kvf_attn_tile_scores(float *pf, float *rows, float *sc, const float *qs,
                                      const char *kt, const char *vt, int dtype,
                                      const int *lim, const int *wlo, const int *kb0,
                                      const int *kb1, int nq, int kb, int token0, int krows,
                                      int kbs, int hd, int pr, float scale, float cap,
                                      int tid)
{
    const int ldr = hd + 1;

    for (int r0 = 0; r0 < krows; r0 += pr) {
        const int nr = (krows - r0 < pr) ? krows - r0 : pr;
        kvf_attn_tile_put(pf, rows, nr, hd, ldr, tid);
        __syncthreads();
        if (r0 + pr < krows) {
            const int nn = (krows - r0 - pr < pr) ? krows - r0 - pr : pr;
            kvf_attn_tile_fetch(pf, kt, dtype, r0 + pr, nn, hd, tid);
        } else {
            kvf_attn_tile_fetch(pf, vt, dtype, 0, (kbs < pr) ? kbs : pr, hd, tid);
        }
        for (int p = tid; p < nq * nr; p += KVF_ATTN_TILE_THREADS) {
            const int qi = p / nr, jr = p % nr;
            if (kvf_attn_tile_folds(kb, kb0[qi], kb1[qi]) &&
                kvf_attn_unmasked(token0 + r0 + jr, wlo[qi], lim[qi])) {
                const float *qv = qs + (size_t)qi * hd, *kr = rows + jr * ldr;
                float dot = 0.0f;
                for (int d = 0; d < hd; ++d) {
                    dot = __fmaf_rn(qv[d], kr[d], dot);
                }
                sc[(size_t)qi * kbs + r0 + jr] = kvf_attn_softcap(__fmul_rn(dot, scale), cap);
            }
        }
        __syncthreads();   /* rows is restaged; the last pass's scores are complete */
    }
}

/* kernel block @kb's running max over the unmasked scores and alpha (one warp per query),
 * its scores made probabilities and this thread's accumulators rescaled by alpha */
KVF_TILE_FN void kvf_attn_tile_rescale(float *acc, float *sc, const float *m_sh, float *mnew_sh,
                                       float *alpha_sh, const int *lim, const int *wlo,
                                       const int *kb0, const int *kb1, int nq, int kb,
                                       int token0, int kbs, int hd, int tid)
{
    const int lane = tid % 32, warp = tid / 32;

    /* running max over the unmasked scores, and alpha: one warp per query */
    for (int qi = warp; qi < nq; qi += KVF_ATTN_TILE_THREADS / 32) {
        if (!kvf_attn_tile_folds(kb, kb0[qi], kb1[qi])) {
            continue;   /* uniform over the warp */
        }
        const int n = (lim[qi] - token0 + 1 < kbs) ? lim[qi] - token0 + 1 : kbs;
        const int j0 = (wlo[qi] > token0) ? wlo[qi] - token0 : 0;   /* window's first slot */
        float mt = m_sh[qi];
        for (int j = j0 + lane; j < n; j += 32) {
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
            sc[p] = kvf_attn_prob(sc[p], token0, (size_t)j, wlo[qi], lim[qi], mnew_sh[qi]);
        }
    }
    KVF_TILE_UNROLL
    for (int k = 0; k < KVF_ATTN_TILE_ACC; ++k) {
        const int i = tid + k * KVF_ATTN_TILE_THREADS, qi = i / hd;
        if ((i < nq * hd) && kvf_attn_tile_folds(kb, kb0[qi], kb1[qi])) {
            acc[k] = __fmul_rn(acc[k], alpha_sh[qi]);
        }
    }
    __syncthreads();
}

/* one pass of @nr staged V rows (slots r0 ...) into this thread's accumulators that @fold
 * (bit k: accumulator k takes this kernel block), each taking the slots in order */
KVF_TILE_FN void kvf_attn_tile_pv(float *acc, unsigned fold, const float *sc, const float *rows,
                                  int r0, int nr, int kbs, int hd, int ldr, int tid)
{
    if (KVF_ATTN_TILE_THREADS % hd == 0) {
        /* head_dim divides the block: all of a thread's accumulators are dim
         * tid % hd, so each V value is loaded once for all of them (each
         * accumulator still takes the slots in order) */
        const float *vd = rows + tid % hd;
        for (int jr = 0; jr < nr; ++jr) {
            const float v = vd[jr * ldr];
            KVF_TILE_UNROLL
            for (int k = 0; k < KVF_ATTN_TILE_ACC; ++k) {
                if (fold & (1u << k)) {
                    const int qi = (tid + k * KVF_ATTN_TILE_THREADS) / hd;
                    acc[k] = __fmaf_rn(sc[(size_t)qi * kbs + r0 + jr], v, acc[k]);
                }
            }
        }
    } else {
        KVF_TILE_UNROLL
        for (int k = 0; k < KVF_ATTN_TILE_ACC; ++k) {
            const int i = tid + k * KVF_ATTN_TILE_THREADS, qi = i / hd, d = i % hd;
            if (fold & (1u << k)) {
                const float *p = sc + (size_t)qi * kbs + r0;
                float a = acc[k];
                for (int jr = 0; jr < nr; ++jr) {
                    a = __fmaf_rn(p[jr], rows[jr * ldr + d], a);
                }
                acc[k] = a;
            }
        }
    }
}

/* the tile's results: out[t][qh] (one split), or the split's partial accumulators and its
 * running max and denominator for kvf_attn_merge */
KVF_TILE_FN void kvf_attn_tile_store(const float *acc, const float *m_sh, const float *l_sh,
                                     int u0, int nq, int group, int kh, int q_heads, int hd,
                                     int y, int splits, const float *sinks, float *out,
                                     float *part_m, float *part_l, float *part_acc, int tid)
{
    KVF_TILE_UNROLL
    for (int k = 0; k < KVF_ATTN_TILE_ACC; ++k) {
        const int i = tid + k * KVF_ATTN_TILE_THREADS, qi = i / hd, d = i % hd;
        if (i < nq * hd) {
            int t, qh;
            kvf_attn_tile_query(u0 + qi, group, kh, &t, &qh);
            const size_t row = (size_t)t * (size_t)q_heads + (size_t)qh;
            if ((splits == 1) && (sinks != NULL)) {   /* gpt-oss: kvf_attn_sink_factor */
                out[row * hd + d] = __fmul_rn(acc[k],
                                              kvf_attn_sink_factor(m_sh[qi], l_sh[qi], sinks[qh]));
            } else if (splits == 1) {
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

/*
 * Tile blockIdx.x (tiles[2 * x]: first query u, tiles[2 * x + 1]: count) of KV
 * head blockIdx.z, split blockIdx.y of gridDim.y. Dynamic shared memory:
 * kvf_attn_tile_smem(qt, head_dim, kbs).
 */
KVF_TILE_KERNEL kvf_attn_tiled_kernel(kvf_cuda_kv g, const float *q, int ldq,
                                      const int32_t *positions, int q_heads, float scale,
                                      float *out, float *part_m, float *part_l, float *part_acc,
                                      const int32_t *tok_seq, int maxb, const int32_t *tiles,
                                      int qt)
{
    KVF_TILE_DYN_SHARED(sh);
    KVF_TILE_SHARED int lim[KVF_ATTN_TILE_Q_MAX], kb0[KVF_ATTN_TILE_Q_MAX];
    KVF_TILE_SHARED int kb1[KVF_ATTN_TILE_Q_MAX], wlo[KVF_ATTN_TILE_Q_MAX];
    KVF_TILE_SHARED float m_sh[KVF_ATTN_TILE_Q_MAX], l_sh[KVF_ATTN_TILE_Q_MAX];
    KVF_TILE_SHARED float mnew_sh[KVF_ATTN_TILE_Q_MAX], alpha_sh[KVF_ATTN_TILE_Q_MAX];
    const int hd = g.head_dim, kbs = g.kbs, nkv = g.kv_heads, group = q_heads / nkv;
    const int tid = (int)threadIdx.x, ldr = hd + 1;
    const int y = (int)blockIdx.y, splits = (int)gridDim.y, kh = (int)blockIdx.z;
    const int u0 = tiles[2 * blockIdx.x], nq = tiles[2 * blockIdx.x + 1];
    float *qs = sh, *sc = sh + (size_t)qt * hd, *rows = sc + (size_t)qt * kbs;
    float acc[KVF_ATTN_TILE_ACC];
    int t0, qh0, lo, hi;

    kvf_attn_tile_query(u0, group, kh, &t0, &qh0);
    const int32_t *table = kvf_cuda_table(&g, tok_seq, maxb, (size_t)t0);   /* one request */
    if (tid < nq) {
        int t, qh;
        kvf_attn_tile_query(u0 + tid, group, kh, &t, &qh);
        lim[tid] = positions[t];
        wlo[tid] = kvf_attn_window_lo(lim[tid], g.window);
        kvf_attn_split_range(lim[tid], wlo[tid], kbs, y, &kb0[tid], &kb1[tid]);
        m_sh[tid] = -INFINITY;
        l_sh[tid] = 0.0f;
    }
    for (int i = tid; i < nq * hd; i += KVF_ATTN_TILE_THREADS) {
        int t, qh;
        kvf_attn_tile_query(u0 + i / hd, group, kh, &t, &qh);
        qs[i] = q[(size_t)t * (size_t)ldq + (size_t)qh * hd + (size_t)(i % hd)];
    }
    KVF_TILE_UNROLL
    for (int k = 0; k < KVF_ATTN_TILE_ACC; ++k) {
        acc[k] = 0.0f;
    }
    __syncthreads();
    /* The walk: the folded kernel blocks of the span, ascending. Each pass of staged rows
     * (K rows of a kernel block, then its V rows, then the next one's K rows) is fetched
     * into registers (pf) while the block computes on the previous pass, so the global
     * loads' latency overlaps the dots and the p * V sums. */
    const int pr = kvf_attn_tile_pass_rows(hd);
    float pf[KVF_ATTN_TILE_PF];
    kvf_attn_tile_span(kb0, kb1, nq, &lo, &hi);
    int kb = kvf_attn_tile_next(kb0, kb1, nq, lo - 1, hi);
    if (kb < hi) {
        const int kr = kvf_attn_tile_k_rows(lim, kb0, kb1, nq, kb, kbs);
        const char *kt = kvf_cuda_run(&g, table, kb * kbs, 0, kh);
        kvf_attn_tile_fetch(pf, kt, g.dtype, 0, (kr < pr) ? kr : pr, hd, tid);
    }
    while (kb < hi) {
        const int krows = kvf_attn_tile_k_rows(lim, kb0, kb1, nq, kb, kbs);   /* > 0 */
        const int kbn = kvf_attn_tile_next(kb0, kb1, nq, kb, hi);
        const int token0 = kb * kbs;
        const char *kt = kvf_cuda_run(&g, table, token0, 0, kh);
        const char *vt = kvf_cuda_run(&g, table, token0, 1, kh);

        kvf_attn_tile_scores(pf, rows, sc, qs, kt, vt, g.dtype, lim, wlo, kb0, kb1, nq, kb,
                             token0, krows, kbs, hd, pr, scale, g.softcap, tid);
        kvf_attn_tile_rescale(acc, sc, m_sh, mnew_sh, alpha_sh, lim, wlo, kb0, kb1, nq, kb,
                              token0, kbs, hd, tid);
        /* p * V over every slot in order, V rows staged a pass at a time; thread qi < nq adds
         * its query's denominator in slot order alongside. fold: which of this thread's
         * accumulators (query i / hd, dim i % hd) take this kernel block. */
        unsigned fold = 0;
        KVF_TILE_UNROLL
        for (int k = 0; k < KVF_ATTN_TILE_ACC; ++k) {
            const int i = tid + k * KVF_ATTN_TILE_THREADS, qi = i / hd;
            if ((i < nq * hd) && kvf_attn_tile_folds(kb, kb0[qi], kb1[qi])) {
                fold |= 1u << k;
            }
        }
        float lsum = 0.0f;
        for (int r0 = 0; r0 < kbs; r0 += pr) {
            const int nr = (kbs - r0 < pr) ? kbs - r0 : pr;
            kvf_attn_tile_put(pf, rows, nr, hd, ldr, tid);
            __syncthreads();
            if (r0 + pr < kbs) {
                const int nn = (kbs - r0 - pr < pr) ? kbs - r0 - pr : pr;
                kvf_attn_tile_fetch(pf, vt, g.dtype, r0 + pr, nn, hd, tid);
            } else if (kbn < hi) {   /* the next kernel block's first K pass */
                const int kr = kvf_attn_tile_k_rows(lim, kb0, kb1, nq, kbn, kbs);
                const char *ktn = kvf_cuda_run(&g, table, kbn * kbs, 0, kh);
                kvf_attn_tile_fetch(pf, ktn, g.dtype, 0, (kr < pr) ? kr : pr, hd, tid);
            }
            if (tid < nq) {
                const float *p = sc + (size_t)tid * kbs + r0;
                for (int jr = 0; jr < nr; ++jr) {
                    lsum = __fadd_rn(lsum, p[jr]);
                }
            }
            kvf_attn_tile_pv(acc, fold, sc, rows, r0, nr, kbs, hd, ldr, tid);
            __syncthreads();   /* rows is restaged */
        }
        if ((tid < nq) && kvf_attn_tile_folds(kb, kb0[tid], kb1[tid])) {
            l_sh[tid] = __fmaf_rn(l_sh[tid], alpha_sh[tid], lsum);
            m_sh[tid] = mnew_sh[tid];
        }
        __syncthreads();   /* m_sh, l_sh read by the next kernel block's max */
        kb = kbn;
    }
    kvf_attn_tile_store(acc, m_sh, l_sh, u0, nq, group, kh, q_heads, hd, y, splits, g.sinks,
                        out, part_m, part_l, part_acc, tid);
}

#endif
