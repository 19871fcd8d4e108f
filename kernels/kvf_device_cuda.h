/*
 * Internal: the CUDA implementations behind kernels/kvf_device.h and the
 * kernels that have a CUDA version. Built only when CUDA is enabled
 * (KVF_HAVE_CUDA); kvf_device.c calls them only for KVF_DEVICE_CUDA
 * devices. Same contracts as the public functions of the same stem; the
 * public function has already checked the arguments (and HOST arrays such
 * as positions and block tables), so these only launch.
 *
 * Files: kvf_device_cuda.cu (device ops, block zeroing), kvf_device_ws_cuda.cu
 * (per-stream workspaces: scratch arena, pinned staging), kvf_norm_cuda.cu,
 * kvf_attention_cuda.cu, kvf_ssm_cuda.cu (conv1d, Mamba2), kvf_gdn_cuda.cu (Gated DeltaNet),
 * kvf_elem_cuda.cu (activations, dtype conversion, MoE routing),
 * kvf_gemm_cuda.cu (cuBLAS: kvf_gemm.h, kvf_gemm_narrow.h), kvf_argmax_cuda.cu.
 */
#ifndef KVF_DEVICE_CUDA_H
#define KVF_DEVICE_CUDA_H

#include "kvf_attention.h"
#include "kvf_attention_seqs.h"
#include "kvf_device.h"
#include "kvf_device_graph.h"
#include "kvf_gdn.h"
#include "kvf_mamba2.h"
#include "kvf_ssm_seqs.h"
#include "kvf_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

bool kvf_cuda_available(void);
int  kvf_cuda_init(int ordinal);
int  kvf_cuda_bind(const kvf_device_t *dev);
int  kvf_cuda_alloc(const kvf_device_t *dev, size_t bytes, void **ptr_p);
void kvf_cuda_free(const kvf_device_t *dev, void *ptr);
int  kvf_cuda_memset(const kvf_device_t *dev, void *ptr, int value, size_t bytes);
int  kvf_cuda_memcpy(const kvf_device_t *dev, void *dst, const void *src, size_t bytes,
                     kvf_copy_kind_t kind);
int  kvf_cuda_sync(const kvf_device_t *dev);
int  kvf_cuda_stream_create(const kvf_device_t *dev, kvf_device_t *dev_p);
void kvf_cuda_stream_destroy(const kvf_device_t *dev);
bool kvf_cuda_ptr_is_device(const void *ptr);
int  kvf_cuda_blocks_zero(const kvf_device_t *dev, void *base, size_t page_size,
                          const int64_t *page_ids, size_t n);
int  kvf_cuda_zero_ranges(const kvf_device_t *dev, void *base, const size_t *offsets,
                          const size_t *lens, size_t n);
int  kvf_cuda_ws_reserve(const kvf_device_t *dev, size_t device_bytes, size_t staging_bytes);
void kvf_cuda_ws_release(const kvf_device_t *dev);
int  kvf_cuda_ws_stats(const kvf_device_t *dev, kvf_device_ws_stats_t *st);
int  kvf_cuda_graphs_create(const kvf_device_t *dev, size_t arena_bytes, int max_graphs,
                            struct kvf_device_graphs **graphs_p);
void kvf_cuda_graphs_clear(struct kvf_device_graphs *g);
void kvf_cuda_graphs_destroy(struct kvf_device_graphs *g);
int  kvf_cuda_graph_run(struct kvf_device_graphs *g, uint64_t key,
                        int (*body)(const kvf_device_t *dev, void *arg), void *arg,
                        const void *in_host, const void *in_dev, size_t in_bytes,
                        kvf_graph_how_t *how_p);
void kvf_cuda_graphs_stats(const struct kvf_device_graphs *g,
                           struct kvf_graphs_stats *st);
int  kvf_cuda_rmsnorm(const kvf_device_t *dev, const float *x, const float *w, float *y,
                      int rows, int dim, float eps);
int  kvf_cuda_rmsnorm_heads(const kvf_device_t *dev, float *x, int ld, int tokens, int heads,
                            int head_dim, const float *w, float eps);
int  kvf_cuda_add_rmsnorm(const kvf_device_t *dev, float *h, const float *delta,
                          const float *w, float *y, int rows, int dim, float eps);
int  kvf_cuda_gated_rmsnorm_sumsq(const kvf_device_t *dev, const float *x, const float *z,
                                  int ld, int rows, int dim, int group_size, float *g,
                                  float *sumsq);
int  kvf_cuda_gated_rmsnorm_apply(const kvf_device_t *dev, const float *g, const float *sumsq,
                                  const float *w, int rows, int dim, int group_size,
                                  int norm_elems, float eps, float *y);
int  kvf_cuda_gated_rmsnorm(const kvf_device_t *dev, const float *x, const float *z, int ld,
                            const float *w, int rows, int dim, int group_size, float eps,
                            float *y);
int  kvf_cuda_attn_cache_write(const kvf_device_t *dev, const kvf_paged_kv_t *kv, const float *k,
                               const float *v, int ld, const int32_t *positions, int num_tokens);
int  kvf_cuda_attn_paged(const kvf_device_t *dev, const kvf_paged_kv_t *kv, const float *q,
                         int ldq, const int32_t *positions, int num_tokens, int q_heads,
                         float scale, float *out);
int  kvf_cuda_attn_write_paged_seqs(const kvf_device_t *dev, const kvf_paged_kv_t *kv,
                                    const kvf_attn_seqs_t *seqs, const float *k, const float *v,
                                    int ld, const float *q, int ldq, const int32_t *positions,
                                    int num_tokens, int q_heads, float scale, float *out);
int  kvf_cuda_ssm_decode_seqs(const kvf_device_t *dev, const kvf_ssm_seqs_t *seqs,
                              const float *x_in, int ld_in, int channels, int kernel,
                              const float *conv_w, const float *conv_b, kvf_dtype_t conv_dtype,
                              float *xbc, int ld_xbc, const kvf_mamba2_params_t *p,
                              const float *dt, int lddt, kvf_dtype_t ssm_dtype, float *y,
                              int ldy);
int  kvf_cuda_conv1d_chunk(const kvf_device_t *dev, const float *x, int ldx, int T,
                           int channels, int kernel, const float *w, const float *bias,
                           int silu, void *state, kvf_dtype_t state_dtype, int has_state,
                           float *y, int ldy);
int  kvf_cuda_conv1d_step(const kvf_device_t *dev, const float *x, int channels, int kernel,
                          const float *w, const float *bias, int silu, void *state,
                          kvf_dtype_t state_dtype, float *y);
int  kvf_cuda_mamba2_scan(const kvf_device_t *dev, const kvf_mamba2_params_t *p, int T,
                          const float *x, int ldx, const float *dt, int lddt, const float *B,
                          const float *C, int ldbc, void *state, kvf_dtype_t state_dtype,
                          int has_state, float *y, int ldy);
int  kvf_cuda_mamba2_step(const kvf_device_t *dev, const kvf_mamba2_params_t *p, const float *x,
                          const float *dt, const float *B, const float *C, void *state,
                          kvf_dtype_t state_dtype, float *y);
int  kvf_cuda_gdn_scan(const kvf_device_t *dev, const kvf_gdn_params_t *p, int T,
                       const float *xbc, int ldx, const float *ba, int ldba, void *state,
                       kvf_dtype_t state_dtype, int has_state, float *y, int ldy);
int  kvf_cuda_gdn_gated_norm(const kvf_device_t *dev, const float *y, int ldy, const float *z,
                             int ldz, const float *w, int T, int heads, int head_dim, float eps,
                             float *out, int ldo);
int  kvf_cuda_sigmoid_gate(const kvf_device_t *dev, float *x, int ldx, const float *gate,
                           int ldg, int T, int n);
int  kvf_cuda_sigmoid_row_scale(const kvf_device_t *dev, float *x, int ldx, const float *g,
                                int T, int n);
int  kvf_cuda_act(const kvf_device_t *dev, int act, float *x, size_t n);
int  kvf_cuda_convert(const kvf_device_t *dev, void *dst, int dst_dtype, const void *src,
                      int src_dtype, size_t n);
int  kvf_cuda_moe_route(const kvf_device_t *dev, const kvf_moe_route_params_t *p,
                        const float *logits, int T, float *scores, int32_t *idx, float *wt);
int  kvf_cuda_gemm(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                   const float *w, int ldw, const float *bias, float beta, float *y, int ldy);
int  kvf_cuda_gemm_fixed(const kvf_device_t *dev, int M, int N, int K, float alpha,
                         const float *x, int ldx, const void *w, int wbf, int ldw,
                         const float *bias, float beta, int act, float *y, int ldy);
int  kvf_cuda_gemm_act(const kvf_device_t *dev, int M, int N, int K, const float *x, int ldx,
                       const void *w, int wbf, int ldw, const float *bias, int act, float *y,
                       int ldy);
int  kvf_cuda_argmax_rows(const kvf_device_t *dev, const float *x, int rows, int cols,
                          int ldx, int32_t *out);
int  kvf_cuda_gemm_narrow(const kvf_device_t *dev, int M, int N, int K, const float *x,
                          int ldx, const void *w, int wdtype, int ldw, const float *bias,
                          float *y, int ldy, void *xs);
/* kvf_gemm_lt_cuda.cu: y = beta * y + xs W^T on tensor cores, xs and W 16-bit (@a wdtype),
 * xs contiguous [M][K]; one pinned cuBLASLt algorithm per key (kvf_gemm_plan.h) */
/* kvf_ssd_cuda.cu: the chunked (SSD) Mamba2 prompt scan on the state grid (kvf_ssd.h) */
int  kvf_cuda_ssd_scan(const kvf_device_t *dev, const kvf_mamba2_params_t *p, int T,
                       long long pos0, int grid, const float *x, int ldx, const float *dt,
                       int lddt, const float *B, const float *C, int ldbc, void *state,
                       int state_dtype, int has_state, float *y, int ldy);
/* kvf_ssm_seqs_cuda.cu: the Gated DeltaNet decode step of a batch (kvf_ssm_seqs.h) */
int  kvf_cuda_gdn_decode_seqs(const kvf_device_t *dev, const kvf_ssm_seqs_t *seqs,
                              const float *x_in, int ld_in, int channels, int kernel,
                              const float *conv_w, kvf_dtype_t conv_dtype, float *xbc,
                              int ld_xbc, const kvf_gdn_params_t *p, const float *ba, int ldba,
                              kvf_dtype_t ssm_dtype, float *y, int ldy);
/* kvf_gdn_chunked_cuda.cu: the chunked Gated DeltaNet prompt scan on the state grid
 * (kvf_gdn.h, kvf_gdn_scan_chunked) */
int  kvf_cuda_gdn_scan_chunked(const kvf_device_t *dev, const kvf_gdn_params_t *p, int T,
                               long long pos0, int grid, const float *xbc, int ldx,
                               const float *ba, int ldba, void *state, int state_dtype,
                               int has_state, float *y, int ldy);
int  kvf_cuda_gemm_lt(const kvf_device_t *dev, int M, int N, int K, const void *xs,
                      const void *w, int wdtype, int ldw, float beta, float *y, int ldy);

#ifdef __cplusplus
}
#endif

#endif
