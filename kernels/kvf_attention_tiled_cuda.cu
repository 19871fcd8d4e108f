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
 * memory (as fp32, in passes of kvf_attn_tile_pass_rows: 32 rows up to
 * head_dim 64, 16 at 128, 8 at 256) ONCE per tile and every query of the
 * tile reads them there. Each thread fetches its share of the next pass
 * (the next K or V rows, or the next kernel block's first K rows) into 8
 * registers while the block computes on the current one, so the global
 * loads' latency overlaps the dots and the p * V sums; when head_dim
 * divides 256 a thread's accumulators share one dim and load each V value
 * once. Per query the arithmetic is the per-token kernel's,
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
 * dynamic shared memory at most (head_dim 256, kbs 2048: 8 queries); 123
 * registers on sm_90 (at least 2 blocks per SM, no spill). Falls back to the
 * per-token kernel when fewer than two queries fit or the device allows a
 * block less shared memory than the tile needs.
 * The kernel's body is kvf_attention_tiled_kernel.h, plain C but for a few
 * CUDA names, so that test_kern_attention_tiled_emu runs this very code on
 * the CPU (a host thread per CUDA thread, barriers for __syncthreads) and
 * checks it bit for bit against the per-token kernel's arithmetic written
 * serially; test_kern_attention_tile checks the tile partition on random
 * shapes.
 * Status: compiled with -Werror for sm_80 and sm_90, never run on a GPU when
 * written (no GPU in that session): the default stays the per-token kernel
 * until tests/gpu/attn_tiled_vs_pertoken has shown the two equal bit for bit
 * on a GPU (it also prints the time of each).
 *
 * Rejected: a tensor-core tile (QK^T and PV as MMA): its sums are not the
 * shared fold's, so neither the CPU twin's nor the per-token kernel's bits.
 * Rejected: whole kernel blocks of K and V in shared memory: a hybrid
 * model's kernel block is 1312 tokens and more (Nemotron-Nano-9B-v2 at
 * TP 1: 1312 x 128 fp32 is 656 KiB per K tile); rows are staged a pass at
 * a time, and only the scores ([qt][kbs]) stay for the whole kernel block.
 * Rejected: skipping the V rows past every query's limit: 0 * v must still
 * meet a stale NaN there, as in the per-token kernel.
 */
#include "kvf_attention_cuda.h"
#include "kvf_attention_tile.h"
#include "kvf_attention_tiled_kernel.h"
#include "kvf_cuda_util.h"

#include <stdlib.h>

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
