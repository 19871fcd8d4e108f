/*
 * Gated DeltaNet (Qwen3-Next's linear attention), per transformers 5.25's
 * Qwen3NextGatedDeltaNet, computed as the sequential recurrence in fp32:
 *
 *   per token, per value head h (key head g = h / (heads / groups), rank-local):
 *   q = q_g / sqrt(|q_g|^2 + 1e-6) / sqrt(key_dim)     k = k_g / sqrt(|k_g|^2 + 1e-6)
 *   decay = exp(-exp(A_log[h]) * softplus(a[h] + dt_bias[h]))   (softplus threshold 20)
 *   beta  = sigmoid(b[h])
 *   S[h][j][i] *= decay                                  (S: [head_dim][key_dim])
 *   delta[j]    = (v[h][j] - sum_i S[h][j][i] k[i]) * beta
 *   S[h][j][i] += k[i] * delta[j]
 *   y[h][j]     = sum_i S[h][j][i] q[i]
 *
 * transformers stores the state as [key_dim][head_dim] per head; kvferry stores its
 * transpose [head_dim][key_dim], the Mamba2 state's [head_dim][state_size] shape, so
 * the state moves through the planner and the transfer as a Mamba2 state does.
 * transformers' prompt forward uses the chunked form of the same recurrence (equal up
 * to rounding). A bf16 / fp16 state is rounded to its dtype after every token, as a
 * decode step stores it, so a request's bits do not depend on where its prompt is cut
 * into chunks. A fresh request (has_state 0) starts from S = 0 without reading the
 * stored bytes. CUDA (kvf_gdn_cuda.cu): the same bodies (kvf_gdn_math.h), one thread per
 * (value head, value dim) state row over all tokens, the fp32 rows interleaved in
 * stream-ordered scratch (heads * head_dim * key_dim floats);
 * every array and the params' dt_bias / A_log are device memory. GPU and CPU differ by FMA
 * contraction and libm ulps.
 */
#ifndef KVF_GDN_H
#define KVF_GDN_H

#include "kvf_device.h"
#include "kvf_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Per-layer constants of a rank's Gated DeltaNet (values; pointers not owned). */
typedef struct kvf_gdn_params {
    int          heads;      /* value heads on this rank, > 0 */
    int          head_dim;   /* value head dim, > 0 */
    int          groups;     /* key heads on this rank, divides heads */
    int          key_dim;    /* key head dim, > 0, <= 1024 */
    const float *dt_bias;    /* fp32 [heads] */
    const float *A_log;      /* fp32 [heads] */
} kvf_gdn_params_t;

/**
 * Run T tokens of one request through the recurrence.
 *
 * @param [in]     p      Layer constants.
 * @param [in]     T      Tokens, >= 0 (0: no-op).
 * @param [in]     xbc    fp32 [T][ldx], the conv output: v [heads * head_dim], then k
 *                        [groups * key_dim], then q [groups * key_dim].
 * @param [in]     ba     fp32 [T][ldba]: b [heads] (beta logits), then a [heads].
 * @param [in,out] state  [heads][head_dim][key_dim] of @a state_dtype.
 * @param [in]     state_dtype fp32, bf16 or fp16.
 * @param [in]     has_state 0: start from zeros (stored bytes not read); 1: continue.
 * @param [out]    y      fp32 [T][ldy], heads * head_dim values a row; must not overlap.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (bad sizes, NULL); KVF_KERN_ENOMEM (head_dim *
 *         key_dim floats of scratch); KVF_KERN_EUNSUPPORTED on a device without
 *         CUDA.
 */
int kvf_gdn_scan(const kvf_device_t *dev, const kvf_gdn_params_t *p, int T, const float *xbc,
                 int ldx, const float *ba, int ldba, void *state, kvf_dtype_t state_dtype,
                 int has_state, float *y, int ldy);

/** Largest state grid (chunk length) the chunked scan takes (kvf_gdn_scan_chunked). */
#define KVF_GDN_MAX_GRID 256

/** Tokens one CUDA window of the chunked scan covers at most (bounds its scratch; at least
 *  one chunk a window). */
#define KVF_GDN_WINDOW_TOKENS 1024

/**
 * Device scratch, in bytes, that kvf_gdn_scan_chunked() takes on a GPU (from the stream's
 * arena) for a call of at most @a T tokens at any position on @a grid, W = min(chunks,
 * max(1, KVF_GDN_WINDOW_TOKENS / grid)) chunks a window, Lw = W * grid:
 * 4 * (heads * head_dim * key_dim + Lw * (2 * groups * key_dim + 3 * heads) +
 * W * heads * (2 * grid^2 + grid * (key_dim + head_dim))).
 * @return the bytes; 0 for T <= 0, grid < 1 or a NULL @a p.
 */
size_t kvf_gdn_scratch_bytes(const kvf_gdn_params_t *p, int T, int grid);

/**
 * kvf_gdn_scan() in the chunked (WY / UT transform) form on the state grid, arguments as
 * there, plus @a pos0 (absolute position of the call's first token within the request,
 * >= 0) and @a grid (1..KVF_GDN_MAX_GRID). Chunks are cut at absolute multiples of @a grid
 * (the Mamba2 chunked scan's grid: kvf_ssd.h, kvf_ssd_chunk_end_hd); a bf16 / fp16 state is
 * rounded at chunk ends only, so a prompt scanned whole or cut into calls at grid multiples
 * gives the same y and state, bit for bit. Against kvf_gdn_scan(): equal within fp32
 * rounding for an fp32 state (another order of sums; kvf_gdn_chunk_math.h has the
 * algebra). The arithmetic: kvf_gdn_chunk_math.h; the CPU runs it as a plain reference
 * loop (tests, KVF_MAMBA_SCAN=chunked on the CPU), CUDA in kvf_gdn_chunked_cuda.cu.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL (as kvf_gdn_scan(), or pos0 / grid out of range);
 *         KVF_KERN_ENOMEM; KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED for a CUDA device in a
 *         build without CUDA.
 */
int kvf_gdn_scan_chunked(const kvf_device_t *dev, const kvf_gdn_params_t *p, int T,
                         long long pos0, int grid, const float *xbc, int ldx, const float *ba,
                         int ldba, void *state, kvf_dtype_t state_dtype, int has_state,
                         float *y, int ldy);

/**
 * Qwen3NextRMSNormGated over each head: out = y * rsqrt(mean_head(y^2) + eps) * w * silu(z).
 * y: fp32 [T][ldy], z: fp32 [T][ldz] (heads * head_dim each), w: fp32 [head_dim] (the
 * plain weight, shared by the heads), out: fp32 [T][ldo] (may be y).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL; KVF_KERN_EUNSUPPORTED on a device without CUDA.
 */
int kvf_gdn_gated_norm(const kvf_device_t *dev, const float *y, int ldy, const float *z,
                       int ldz, const float *w, int T, int heads, int head_dim, float eps,
                       float *out, int ldo);

/**
 * Qwen3-Next's gated attention output: x[t][i] *= sigmoid(gate[t][i]) for i < n.
 * x: fp32 [T][ldx], gate: fp32 [T][ldg].
 * @return KVF_KERN_OK; KVF_KERN_EINVAL; KVF_KERN_EUNSUPPORTED on a device without CUDA.
 */
int kvf_sigmoid_gate(const kvf_device_t *dev, float *x, int ldx, const float *gate, int ldg,
                     int T, int n);

/**
 * Qwen3-Next's gated shared expert: x[t][i] *= sigmoid(g[t]) for i < n (one gate a row).
 * x: fp32 [T][ldx], g: fp32 [T].
 * @return KVF_KERN_OK; KVF_KERN_EINVAL; KVF_KERN_EUNSUPPORTED on a device without CUDA.
 */
int kvf_sigmoid_row_scale(const kvf_device_t *dev, float *x, int ldx, const float *g, int T,
                          int n);

#ifdef __cplusplus
}
#endif

#endif
