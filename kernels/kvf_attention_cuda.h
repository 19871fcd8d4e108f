/*
 * Internal: the two CUDA paged attention kernels and the choice between them
 * (the functions exist only with KVF_HAVE_CUDA). kvf_cuda_attn_paged() and
 * kvf_cuda_attn_write_paged_seqs() (kvf_device_cuda.h) run the one that
 * KVF_GPU_ATTN names, read once per process:
 *   unset, empty or "pertoken": one thread block per (query token, query
 *     head) (kvf_attention_cuda.cu; the default);
 *   "tiled": one thread block per tile of queries sharing K/V
 *     (kvf_attention_tiled_cuda.cu, kvf_attention_tile.h), each query's
 *     arithmetic that of the per-token kernel;
 *   anything else: every call fails with KVF_KERN_EINVAL, reported with the
 *     variable's name and value.
 * The *_as functions below take the kernel explicitly (tests/gpu compares
 * the two bit for bit); then the geometry both kernels read (plain C too) and
 * the tiled launcher (C++).
 */
#ifndef KVF_ATTENTION_CUDA_H
#define KVF_ATTENTION_CUDA_H

#include "kvf_attention.h"
#include "kvf_attention_math.h"
#include "kvf_attention_seqs.h"
#include "kvf_device.h"
#include "kvf_hd.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The CUDA attention kernels. */
typedef enum kvf_attn_gpu_impl {
    KVF_ATTN_GPU_PERTOKEN = 0,   /* one thread block per (query token, query head) */
    KVF_ATTN_GPU_TILED    = 1    /* one thread block per query tile (kvf_attention_tile.h) */
} kvf_attn_gpu_impl_t;

/**
 * kvf_cuda_attn_paged() with the kernel @a impl: the arguments as that
 * function gets them from kvf_attn_paged(), already checked (positions in
 * range, num_tokens >= 1, scale > 0). The tiled kernel falls back
 * to the per-token one for shapes with no tile (kvf_attn_tile_queries() 0)
 * or whose tile needs more shared memory than the device allows a block.
 * @param [out] ran_p  NULL, or the kernel that ran (set on KVF_KERN_OK).
 * @return as kvf_attn_paged(); KVF_KERN_EINVAL for an unknown @a impl.
 */
int kvf_cuda_attn_paged_as(kvf_attn_gpu_impl_t impl, const kvf_device_t *dev,
                           const kvf_paged_kv_t *kv, const float *q, int ldq,
                           const int32_t *positions, int num_tokens, int q_heads, float scale,
                           float *out, kvf_attn_gpu_impl_t *ran_p);

/** kvf_cuda_attn_write_paged_seqs() with the kernel @a impl; @a ran_p as above. */
int kvf_cuda_attn_write_paged_seqs_as(kvf_attn_gpu_impl_t impl, const kvf_device_t *dev,
                                      const kvf_paged_kv_t *kv, const kvf_attn_seqs_t *seqs,
                                      const float *k, const float *v, int ld, const float *q,
                                      int ldq, const int32_t *positions, int num_tokens,
                                      int q_heads, float scale, float *out,
                                      kvf_attn_gpu_impl_t *ran_p);

#ifdef __cplusplus
}
#endif

/* The geometry a thread needs (kvf_paged_kv_t with the device block table); C as well as
 * CUDA, for the tiled kernel's body (kvf_attention_tiled_kernel.h). */
typedef struct kvf_cuda_kv {
    char          *base;
    kvf_kv_strides_t st;          /* kvf_paged_kv_strides(): every address below */
    size_t         elt;
    int            slots, slot, dtype, kv_heads, head_dim, block_size, kbs;
    int            window;        /* kvf_paged_kv_t.window (0: full causal) */
    const int32_t *block_table;   /* device */
    const float   *sinks;         /* kvf_paged_kv_t.sinks (device), or NULL */
    float          softcap;       /* kvf_paged_kv_t.softcap (0: none) */
} kvf_cuda_kv;

static inline kvf_cuda_kv kvf_cuda_kv_of(const kvf_paged_kv_t *kv, const int32_t *d_table)
{
    kvf_cuda_kv g;
    g.base = (char *)kv->base;
    g.st = kvf_paged_kv_strides(kv);
    g.elt = kvf_dtype_size(kv->dtype);
    g.slots = kv->slots;
    g.slot = kv->slot;
    g.dtype = (int)kv->dtype;
    g.kv_heads = kv->kv_heads;
    g.head_dim = kv->head_dim;
    g.block_size = kv->block_size;
    g.kbs = kv->kernel_block_size;
    g.window = kv->window;
    g.block_table = d_table;
    g.sinks = kv->sinks;
    g.softcap = kv->softcap;
    return g;
}

/* the run (K/V @a is_v, head @a h: kbs rows of head_dim) of the kernel block holding token
 * pos of a request with block table @a table */
static inline KVF_HD char *kvf_cuda_run(const kvf_cuda_kv *g, const int32_t *table, int pos,
                                        int is_v, int h)
{
    return g->base + kvf_kv_pos_run_off(&g->st, table, g->block_size, g->kbs, g->slot, pos,
                                        is_v, h);
}

/* Row t's block table: the one table, or its request's row of the packed tables
 * [num_seqs][maxb] (tok_seq[t]: row t's request; kvf_attention_seqs.h). */
static inline KVF_HD const int32_t *kvf_cuda_table(const kvf_cuda_kv *g, const int32_t *tok_seq,
                                                   int maxb, size_t t)
{
    return (tok_seq == NULL) ? g->block_table : g->block_table + (size_t)tok_seq[t] * maxb;
}

#ifdef __CUDACC__
#include <cuda_runtime.h>

/*
 * Launch the tiled kernel (kvf_attention_tiled_cuda.cu) over num_tokens rows
 * of num_seqs requests (seq_tokens: HOST, rows of each; d_pos and tok_seq
 * device, tok_seq NULL for one request) with @a splits split-K ranges:
 * splits == 1 writes out, else the partials pm/pl [rows * q_heads][splits]
 * and pacc [rows * q_heads][splits][head_dim] for kvf_attn_merge.
 * *ran_p = false (nothing launched, KVF_KERN_OK) when the shape has no tile
 * or the tile's shared memory exceeds the device's: the caller runs the
 * per-token kernel.
 */
int kvf_attn_tiled_launch(cudaStream_t stream, const kvf_cuda_kv &g, const float *q, int ldq,
                          const int32_t *d_pos, const int *seq_tokens, int num_seqs,
                          int q_heads, int splits, float scale, float *out, float *pm,
                          float *pl, float *pacc, const int32_t *tok_seq, int maxb,
                          bool *ran_p);
#endif

#endif
