/*
 * CUDA paged attention: the K/V cache write (one thread per element) and
 * the causal GQA attention with the shared fold of kvf_attention_math.h.
 *
 * Attention: one thread block per (query token, query head), 128 threads
 * sharing each kernel-block tile: thread j computes score j (its dot in
 * dim order), the block reduces the tile max, each slot's probability is
 * computed in parallel, thread 0 adds the denominator in slot order, and
 * thread d updates acc[d] over the slots in order. Per (query, head) that is
 * exactly the serial fold's arithmetic (kvf_attn_fold_tile), so the result
 * is the one-thread-per-query kernel's it replaces, bit for bit, while a
 * tile's loads are spread over the block (V rows coalesced).
 * Long contexts: the kernel blocks of each query are split into ranges
 * (split-K, as FlashDecoding), each folded by its own thread block into
 * (m, l, acc) partials, then merged by kvf_attn_merge (fp32 rounding of the
 * one-range fold, within the CPU tolerance of gpu_vs_cpu). A query's ranges
 * follow from its own length alone (kvf_attn_split_per: 2048 tokens or more
 * each, at most 64), never from how many queries share the launch, so its
 * bits do not depend on the batch (issue 33).
 * Rejected: splitting by how many (token, head) blocks fill the GPU: a
 * decode query alone got more ranges than the same query beside 15 others,
 * so its sums, and then its tokens, followed the batch.
 * The HOST block table and positions are copied into stream-ordered scratch.
 * KVF_GPU_ATTN=tiled (kvf_attention_cuda.h) launches kvf_attention_tiled_cuda.cu's
 * kernel instead, one thread block per tile of queries sharing K/V, with this
 * kernel's arithmetic per query; both write the same partials for the same merge.
 *
 * Rejected: a tensor-core FlashAttention tile (QK^T and PV as MMA over a
 * query tile): its sums would not be the shared fold's, which is the
 * definition the CPU twin and the tests check.
 */
#include "kvf_attention_cuda.h"
#include "kvf_attention_math.h"
#include "kvf_cuda_util.h"
#include "kvf_device_cuda.h"

#include <stdio.h>

#include <stdlib.h>
#include <string.h>

__global__ void kvf_attn_write_kernel(kvf_cuda_kv g, const float *k, const float *v, int ld,
                                      const int32_t *positions, size_t n,
                                      const int32_t *tok_seq, int maxb)
{
    const size_t hd = (size_t)g.head_dim, nkv = (size_t)g.kv_heads;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t d = i % hd, h = (i / hd) % nkv, t = i / (hd * nkv);
        int pos = positions[t];
        const int32_t *table = kvf_cuda_table(&g, tok_seq, maxb, t);
        size_t first = (size_t)(pos % g.kbs) * hd + d;
        size_t src = t * (size_t)ld + h * hd + d;
        kvf_hd_store(kvf_cuda_run(&g, table, pos, 0, (int)h), g.dtype, first, k[src]);
        kvf_hd_store(kvf_cuda_run(&g, table, pos, 1, (int)h), g.dtype, first, v[src]);
    }
}

#define KVF_ATTN_THREADS 128

/*
 * Block (blockIdx.x = t * q_heads + qh, blockIdx.y = split of gridDim.y):
 * fold the kernel blocks [kb0, kb1) of that query's causal range. One split:
 * out = acc / l. More: the partials part_m/part_l [T * q_heads][splits] and
 * part_acc [T * q_heads][splits][hd] for kvf_attn_merge_kernel.
 */
__global__ void __launch_bounds__(KVF_ATTN_THREADS)
kvf_attn_paged_kernel(kvf_cuda_kv g, const float *q, int ldq, const int32_t *positions,
                      int q_heads, float scale, float *out, float *part_m, float *part_l,
                      float *part_acc, const int32_t *tok_seq, int maxb)
{
    __shared__ float qs[KVF_ATTN_HD_MAX], red[KVF_ATTN_THREADS];
    extern __shared__ float sc[];   /* [kbs]: the tile's scores, then probabilities */
    __shared__ float l_sh;
    const int hd = g.head_dim, kbs = g.kbs, nkv = g.kv_heads, tid = (int)threadIdx.x;
    const int t = (int)blockIdx.x / q_heads, qh = (int)blockIdx.x % q_heads;
    const int kh = qh / (q_heads / nkv), splits = (int)gridDim.y, y = (int)blockIdx.y;
    const int limit = positions[t], lo = kvf_attn_window_lo(limit, g.window);
    int kb0, kb1;
    kvf_attn_split_range(limit, lo, kbs, y, &kb0, &kb1);
    const float *qv = q + (size_t)t * (size_t)ldq + (size_t)qh * (size_t)hd;
    const int32_t *table = kvf_cuda_table(&g, tok_seq, maxb, (size_t)t);
    float m = -INFINITY, l = 0.0f, acc0 = 0.0f, acc1 = 0.0f;   /* dims tid, tid + 128 */

    for (int d = tid; d < hd; d += KVF_ATTN_THREADS) {
        qs[d] = qv[d];
    }
    __syncthreads();
    for (int kb = kb0; kb < kb1; ++kb) {
        const int token0 = kb * kbs;
        const char *kt = kvf_cuda_run(&g, table, token0, 0, kh);
        const char *vt = kvf_cuda_run(&g, table, token0, 1, kh);
        float mt = m;
        for (int j = tid; j < kbs; j += KVF_ATTN_THREADS) {
            /* a masked slot's score is never read (the max skips it, its probability is
             * selected 0), so its dot is not computed: the same bits, and a prefill query
             * early in a long kernel block skips most of the tile's K reads */
            float dot = 0.0f;
            if (kvf_attn_unmasked(token0 + j, lo, limit)) {
                for (int d = 0; d < hd; ++d) {
                    dot += qs[d] * kvf_hd_load(kt, g.dtype, (size_t)j * hd + d);
                }
            }
            sc[j] = kvf_attn_softcap(dot * scale, g.softcap);
            if (kvf_attn_unmasked(token0 + j, lo, limit) && (sc[j] > mt)) {
                mt = sc[j];
            }
        }
        red[tid] = mt;
        __syncthreads();
        for (int stride = KVF_ATTN_THREADS / 2; stride > 0; stride /= 2) {
            if ((tid < stride) && (red[tid + stride] > red[tid])) {
                red[tid] = red[tid + stride];
            }
            __syncthreads();
        }
        const float m_new = red[0];
        const float alpha = expf(m - m_new);   /* 0 on the first tile */
        for (int j = tid; j < kbs; j += KVF_ATTN_THREADS) {
            sc[j] = kvf_attn_prob(sc[j], token0, (size_t)j, lo, limit, m_new);
        }
        __syncthreads();
        if (tid == 0) {
            float lsum = 0.0f;
            for (int j = 0; j < kbs; ++j) {
                lsum += sc[j];
            }
            l = l * alpha + lsum;
        }
        if (tid < hd) {
            acc0 *= alpha;
            for (int j = 0; j < kbs; ++j) {
                acc0 += sc[j] * kvf_hd_load(vt, g.dtype, (size_t)j * hd + tid);
            }
        }
        if (tid + KVF_ATTN_THREADS < hd) {
            acc1 *= alpha;
            for (int j = 0; j < kbs; ++j) {
                acc1 += sc[j] * kvf_hd_load(vt, g.dtype, (size_t)j * hd + tid + KVF_ATTN_THREADS);
            }
        }
        m = m_new;
        __syncthreads();   /* sc and red are rewritten by the next tile */
    }
    if (tid == 0) {
        l_sh = l;
    }
    __syncthreads();
    const size_t qi = blockIdx.x;
    if (splits == 1) {
        float *o = out + (size_t)t * (size_t)q_heads * hd + (size_t)qh * hd;
        if (g.sinks != NULL) {   /* an attention sink (gpt-oss): kvf_attn_sink_factor */
            const float f = kvf_attn_sink_factor(m, l_sh, g.sinks[qh]);
            if (tid < hd) {
                o[tid] = acc0 * f;
            }
            if (tid + KVF_ATTN_THREADS < hd) {
                o[tid + KVF_ATTN_THREADS] = acc1 * f;
            }
            return;
        }
        if (tid < hd) {
            o[tid] = acc0 / l_sh;   /* kvf_attn_finish */
        }
        if (tid + KVF_ATTN_THREADS < hd) {
            o[tid + KVF_ATTN_THREADS] = acc1 / l_sh;
        }
        return;
    }
    const size_t pi = qi * (size_t)splits + (size_t)y;
    if (tid == 0) {
        part_m[pi] = m;
        part_l[pi] = l_sh;
    }
    if (tid < hd) {
        part_acc[pi * hd + tid] = acc0;
    }
    if (tid + KVF_ATTN_THREADS < hd) {
        part_acc[pi * hd + tid + KVF_ATTN_THREADS] = acc1;
    }
}

/* one thread per (query row, head, dim): the split-K partials merged (kvf_attn_merge), with
 * head qi % q_heads's attention sink when @a sinks is set */
__global__ void kvf_attn_merge_kernel(const float *part_m, const float *part_l,
                                      const float *part_acc, size_t rows, int splits, int hd,
                                      const float *sinks, int q_heads, float *out)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * (size_t)hd;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t qi = i / (size_t)hd, d = i % (size_t)hd;
        const float sink = (sinks != NULL) ? sinks[qi % (size_t)q_heads] : -INFINITY;
        out[i] = kvf_attn_merge(part_m + qi * splits, part_l + qi * splits,
                                part_acc + qi * splits * hd, (size_t)hd, splits, d, sink);
    }
}

/*
 * The attention (and the merge when split) with kernel @a impl over num_tokens rows of
 * num_seqs requests (seq_tokens: HOST, the rows of each): part holds the partials, m and
 * l [queries][splits] then acc [queries][splits][hd]; NULL when splits == 1.
 */
static int kvf_attn_launch(cudaStream_t stream, kvf_attn_gpu_impl_t impl, const kvf_cuda_kv &g,
                           const float *q, int ldq, const int32_t *d_pos, int num_tokens,
                           const int *seq_tokens, int num_seqs, int q_heads, int splits,
                           float scale, float *out, void *part, const int32_t *tok_seq,
                           int maxb, kvf_attn_gpu_impl_t *ran_p)
{
    const size_t hd = (size_t)g.head_dim, queries = (size_t)num_tokens * (size_t)q_heads;
    float *pm = (float *)part, *pl = (pm != NULL) ? pm + queries * (size_t)splits : NULL;
    float *pacc = (pl != NULL) ? pl + queries * (size_t)splits : NULL;
    bool tiled = false;
    int rc = KVF_KERN_OK;

    if (impl == KVF_ATTN_GPU_TILED) {
        rc = kvf_attn_tiled_launch(stream, g, q, ldq, d_pos, seq_tokens, num_seqs, q_heads,
                                   splits, scale, out, pm, pl, pacc, tok_seq, maxb, &tiled);
    }
    if ((rc == KVF_KERN_OK) && !tiled) {
        dim3 grid((unsigned)queries, (unsigned)splits);
        kvf_attn_paged_kernel<<<grid, KVF_ATTN_THREADS, (size_t)g.kbs * sizeof(float),
                                stream>>>(g, q, ldq, d_pos, q_heads, scale, out, pm, pl, pacc,
                                          tok_seq, maxb);
        rc = kvf_cuda_launched("kvf_attn_paged_kernel");
    }
    if ((rc == KVF_KERN_OK) && (splits > 1)) {
        kvf_attn_merge_kernel<<<kvf_cuda_blocks(queries * hd), KVF_CUDA_THREADS, 0, stream>>>(
            pm, pl, pacc, queries, splits, (int)hd, g.sinks, q_heads, out);
        rc = kvf_cuda_launched("kvf_attn_merge_kernel");
    }
    if ((rc == KVF_KERN_OK) && (ran_p != NULL)) {
        *ran_p = tiled ? KVF_ATTN_GPU_TILED : KVF_ATTN_GPU_PERTOKEN;
    }
    return rc;
}

/* KVF_GPU_ATTN, read once: 0 pertoken (unset, empty, "pertoken", or "flashinfer", whose
 * decode steps the forward hands to FlashInfer: common/runtime/kvf_model_fi.c; its prompt
 * steps come here), 1 tiled, -1 anything else (refused by name at every call, so the first
 * attention fails and says why) */
static int kvf_gpu_attn_mode_v = -2;

static int kvf_gpu_attn_mode(void)
{
    /* rank threads may race to the first read: each computes the same value */
    int mode = __atomic_load_n(&kvf_gpu_attn_mode_v, __ATOMIC_RELAXED);
    if (mode == -2) {
        const char *env = getenv("KVF_GPU_ATTN");
        mode = ((env == NULL) || (env[0] == '\0') || (strcmp(env, "pertoken") == 0) ||
                (strcmp(env, "flashinfer") == 0)) ? 0
               : (strcmp(env, "tiled") == 0)                                      ? 1
                                                                                  : -1;
        __atomic_store_n(&kvf_gpu_attn_mode_v, mode, __ATOMIC_RELAXED);
    }
    if (mode < 0) {
        const char *env = getenv("KVF_GPU_ATTN");
        char msg[160];
        snprintf(msg, sizeof(msg), "bad value '%.40s': pertoken (the default), tiled or "
                 "flashinfer",
                 (env != NULL) ? env : "");
        kvf_kern_report("KVF_GPU_ATTN", msg);
    }
    return mode;
}

/* device copies of the block table and positions, one scratch buffer */
static int kvf_cuda_attn_tables(cudaStream_t stream, const kvf_paged_kv_t *kv,
                                const int32_t *positions, int num_tokens, int32_t **buf_p)
{
    size_t nb = (size_t)kv->num_blocks, nt = (size_t)num_tokens;
    void *buf = NULL;
    int rc = kvf_cuda_scratch(stream, (nb + nt) * sizeof(int32_t), NULL, &buf);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    int32_t *d = (int32_t *)buf;
    KVF_CUDA_CHECK_GOTO(cudaMemcpyAsync(d, kv->block_table, nb * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, stream), rc, out_free);
    KVF_CUDA_CHECK_GOTO(cudaMemcpyAsync(d + nb, positions, nt * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, stream), rc, out_free);
    *buf_p = d;
    return KVF_KERN_OK;
out_free:
    kvf_cuda_scratch_free(stream, buf);
    return rc;
}

extern "C" int kvf_cuda_attn_cache_write(const kvf_device_t *dev, const kvf_paged_kv_t *kv,
                                         const float *k, const float *v, int ld,
                                         const int32_t *positions, int num_tokens)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    int32_t *tables = NULL;
    size_t n = (size_t)num_tokens * (size_t)kv->kv_heads * (size_t)kv->head_dim;
    int rc = kvf_cuda_attn_tables(stream, kv, positions, num_tokens, &tables);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    kvf_attn_write_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, stream>>>(
        kvf_cuda_kv_of(kv, tables), k, v, ld, tables + kv->num_blocks, n, NULL, 0);
    rc = kvf_cuda_launched("kvf_attn_write_kernel");
    kvf_cuda_scratch_free(stream, tables);
    return rc;
}

extern "C" int kvf_cuda_attn_paged_as(kvf_attn_gpu_impl_t impl, const kvf_device_t *dev,
                                      const kvf_paged_kv_t *kv, const float *q, int ldq,
                                      const int32_t *positions, int num_tokens, int q_heads,
                                      float scale, float *out, kvf_attn_gpu_impl_t *ran_p)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    int32_t *tables = NULL;
    size_t queries = (size_t)num_tokens * (size_t)q_heads, hd = (size_t)kv->head_dim;
    int rc, max_pos = 0, splits;
    void *part = NULL;

    if ((kv->head_dim > KVF_ATTN_HD_MAX) || (kv->kernel_block_size > KVF_ATTN_KBS_MAX) ||
        (queries > 0x7fffffffu) ||
        ((impl != KVF_ATTN_GPU_PERTOKEN) && (impl != KVF_ATTN_GPU_TILED))) {
        return KVF_KERN_EINVAL;   /* the shared q and score tile; the grid's x */
    }
    for (int t = 0; t < num_tokens; ++t) {
        max_pos = (positions[t] > max_pos) ? positions[t] : max_pos;
    }
    splits = kvf_attn_split_count(max_pos / kv->kernel_block_size + 1, kv->kernel_block_size);
    rc = kvf_cuda_attn_tables(stream, kv, positions, num_tokens, &tables);
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    if (splits > 1) {
        rc = kvf_cuda_scratch(stream, queries * (size_t)splits * (hd + 2) * sizeof(float), NULL,
                              &part);
        if (rc != KVF_KERN_OK) {
            kvf_cuda_scratch_free(stream, tables);
            return rc;
        }
    }
    rc = kvf_attn_launch(stream, impl, kvf_cuda_kv_of(kv, tables), q, ldq,
                         tables + kv->num_blocks, num_tokens, &num_tokens, 1, q_heads, splits,
                         scale, out, part, NULL, 0, ran_p);
    kvf_cuda_scratch_free(stream, part);
    kvf_cuda_scratch_free(stream, tables);
    return rc;
}

extern "C" int kvf_cuda_attn_paged(const kvf_device_t *dev, const kvf_paged_kv_t *kv,
                                   const float *q, int ldq, const int32_t *positions,
                                   int num_tokens, int q_heads, float scale, float *out)
{
    int mode = kvf_gpu_attn_mode();
    if (mode < 0) {
        return KVF_KERN_EINVAL;
    }
    return kvf_cuda_attn_paged_as((kvf_attn_gpu_impl_t)mode, dev, kv, q, ldq, positions,
                                  num_tokens, q_heads, scale, out, NULL);
}

extern "C" int kvf_cuda_attn_write_paged_seqs_as(kvf_attn_gpu_impl_t impl,
                                                 const kvf_device_t *dev,
                                                 const kvf_paged_kv_t *kv,
                                                 const kvf_attn_seqs_t *seqs, const float *k,
                                                 const float *v, int ld, const float *q,
                                                 int ldq, const int32_t *positions,
                                                 int num_tokens, int q_heads, float scale,
                                                 float *out, kvf_attn_gpu_impl_t *ran_p)
{
    cudaStream_t stream = kvf_cuda_stream_of(dev);
    const size_t T = (size_t)num_tokens, hd = (size_t)kv->head_dim;
    const size_t queries = T * (size_t)q_heads;
    int maxb = 1, max_pos = 0, rc, splits;
    void *dbuf = NULL, *part = NULL;

    if ((kv->head_dim > KVF_ATTN_HD_MAX) || (kv->kernel_block_size > KVF_ATTN_KBS_MAX) ||
        (queries > 0x7fffffffu) ||
        ((impl != KVF_ATTN_GPU_PERTOKEN) && (impl != KVF_ATTN_GPU_TILED))) {
        return KVF_KERN_EINVAL;
    }
    if (seqs->packed != NULL) {
        maxb = seqs->packed_maxb;   /* laid out by the caller (a graphed decode step) */
        /* the tiled kernel packs a tile plan per call, which a recording would replay
         * stale: the per-token kernel, whose bits the tiled one gives anyway */
        impl = KVF_ATTN_GPU_PERTOKEN;
    } else {
        for (int i = 0; i < seqs->num_seqs; ++i) {
            maxb = (seqs->num_blocks[i] > maxb) ? seqs->num_blocks[i] : maxb;
        }
    }
    if (seqs->split_blocks <= 0) {
        for (size_t t = 0; t < T; ++t) {
            max_pos = (positions[t] > max_pos) ? positions[t] : max_pos;
        }
    }
    /* one upload: [T] request of each row, [T] positions, [num_seqs][maxb] block tables */
    size_t words = kvf_attn_seqs_packed_words(num_tokens, seqs->num_seqs, maxb);
    if (seqs->packed != NULL) {
        rc = kvf_cuda_scratch(stream, words * sizeof(int32_t), seqs->packed, &dbuf);
    } else {
        int32_t *h = (int32_t *)malloc(words * sizeof(int32_t));
        if (h == NULL) {
            return KVF_KERN_ENOMEM;
        }
        kvf_attn_seqs_pack(seqs, positions, num_tokens, maxb, h);
        rc = kvf_cuda_scratch(stream, words * sizeof(int32_t), h, &dbuf);
        free(h);   /* staged by the copy */
    }
    if (rc != KVF_KERN_OK) {
        return rc;
    }
    const int32_t *d_seq = (const int32_t *)dbuf, *d_pos = d_seq + T, *d_tab = d_seq + 2 * T;
    kvf_cuda_kv g = kvf_cuda_kv_of(kv, d_tab);
    size_t n = T * (size_t)kv->kv_heads * hd;
    kvf_attn_write_kernel<<<kvf_cuda_blocks(n), KVF_CUDA_THREADS, 0, stream>>>(
        g, k, v, ld, d_pos, n, d_seq, maxb);
    rc = kvf_cuda_launched("kvf_attn_write_kernel");
    if ((q == NULL) && (out == NULL)) {   /* the write alone (kvf_attention_seqs.h) */
        kvf_cuda_scratch_free(stream, dbuf);
        return rc;
    }
    splits = kvf_attn_split_count((seqs->split_blocks > 0) ? seqs->split_blocks :
                                  max_pos / kv->kernel_block_size + 1, kv->kernel_block_size);
    if ((rc == KVF_KERN_OK) && (splits > 1)) {
        rc = kvf_cuda_scratch(stream, queries * (size_t)splits * (hd + 2) * sizeof(float), NULL,
                              &part);
    }
    if (rc == KVF_KERN_OK) {
        rc = kvf_attn_launch(stream, impl, g, q, ldq, d_pos, num_tokens, seqs->num_tokens,
                             seqs->num_seqs, q_heads, splits, scale, out, part, d_seq, maxb,
                             ran_p);
    }
    kvf_cuda_scratch_free(stream, part);
    kvf_cuda_scratch_free(stream, dbuf);
    return rc;
}

extern "C" int kvf_cuda_attn_write_paged_seqs(const kvf_device_t *dev, const kvf_paged_kv_t *kv,
                                              const kvf_attn_seqs_t *seqs, const float *k,
                                              const float *v, int ld, const float *q, int ldq,
                                              const int32_t *positions, int num_tokens,
                                              int q_heads, float scale, float *out)
{
    int mode = kvf_gpu_attn_mode();
    if (mode < 0) {
        return KVF_KERN_EINVAL;
    }
    return kvf_cuda_attn_write_paged_seqs_as((kvf_attn_gpu_impl_t)mode, dev, kv, seqs, k, v,
                                             ld, q, ldq, positions, num_tokens, q_heads, scale,
                                             out, NULL);
}
