/*
 * The Mamba2 decode step of a whole batch of requests in one call: for each
 * request, one token through the causal conv1d (SiLU) and the selective
 * state update, each request with its own conv and SSM state pages. On the
 * CPU it is exactly kvf_conv1d_step() then kvf_mamba2_step() per request
 * (the same bits). On CUDA the requests' rows, state pointers and dt clamps
 * go to the device in one copy and two launches cover them all (instead of
 * two scratch allocations and launches per request), so a decode step of B
 * requests costs two launches per Mamba layer, with fp32 SSM states
 * (NemotronH's mamba_ssm_cache_dtype) and 16-bit ones alike (a 16-bit state
 * element rounded as it is stored, the one-request kernel's bits:
 * kvf_mamba2_row_state_hd, kernels/kvf_ssm_math.h).
 */
#ifndef KVF_SSM_SEQS_H
#define KVF_SSM_SEQS_H

#include "kvf_device.h"
#include "kvf_dtype.h"
#include "kvf_gdn.h"
#include "kvf_mamba2.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The requests of one call (all HOST arrays, not retained). */
typedef struct kvf_ssm_seqs {
    int          num_seqs;     /* >= 0 */
    const int   *rows;         /* [num_seqs] each request's row in the row arrays, distinct */
    void *const *conv_states;  /* [num_seqs] [channels][kernel - 1] of conv_dtype (device) */
    void *const *ssm_states;   /* [num_seqs] [heads][head_dim][state_size] of ssm_dtype */
    const float *dt_min;       /* [num_seqs] each request's dt clamp (kvf_mamba2_params_t): */
    const float *dt_max;       /* [num_seqs] low and high; a prompt token's is the scan's */
    /* Optional (NULL: unused), read by the CUDA path only: the same five arrays already laid
     * out as one HOST block, [num_seqs] conv_states, [num_seqs] ssm_states, [num_seqs] rows
     * (int), [num_seqs] dt_min, [num_seqs] dt_max (float), uploaded as is (no copy when it
     * lies in the stream's published step inputs, kernels/kvf_device_graph.h) instead of
     * being packed per call. Must hold the same values as the five arrays. */
    const void  *packed;
} kvf_ssm_seqs_t;

/** Bytes of a packed block (kvf_ssm_seqs_t.packed) of @a num_seqs requests. */
size_t kvf_ssm_seqs_packed_bytes(int num_seqs);

/**
 * Lay out @a seqs's five arrays as the CUDA path reads them (the one definition of
 * kvf_ssm_seqs_t.packed): [num_seqs] conv_states, [num_seqs] ssm_states, [num_seqs] rows
 * (int), [num_seqs] dt_min, [num_seqs] dt_max (float). @a out:
 * kvf_ssm_seqs_packed_bytes(), 8-byte aligned.
 */
void kvf_ssm_seqs_pack(const kvf_ssm_seqs_t *seqs, void *out);

/**
 * For request i with row r = rows[i]: kvf_conv1d_step(x_in + r * ld_in ->
 * xbc + r * ld_xbc, SiLU, conv_states[i]), then kvf_mamba2_step() of @a p
 * with dt_min = dt_min[i], dt_max = dt_max[i] on x = that xbc row, B = x + heads * head_dim,
 * C = B + groups * state_size, dt = dt + r * lddt, ssm_states[i], into
 * y + r * ldy.
 *
 * @param [in]  x_in, ld_in     fp32 conv inputs, @a channels per row.
 * @param [in]  kernel, conv_w, conv_b, conv_dtype  As kvf_conv1d_step().
 * @param [out] xbc, ld_xbc     fp32 conv outputs (x | B | C); must not overlap x_in.
 * @param [in]  p               Mamba2 parameters (its dt_min and dt_max are not read).
 * @param [in]  dt, lddt        fp32 raw dt, heads per row.
 * @param [out] y, ldy          fp32, heads * head_dim per row.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL as the per-request calls (all
 *         checked before anything runs on CUDA); KVF_KERN_ENOMEM;
 *         KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED.
 */
int kvf_ssm_decode_seqs(const kvf_device_t *dev, const kvf_ssm_seqs_t *seqs, const float *x_in,
                        int ld_in, int channels, int kernel, const float *conv_w,
                        const float *conv_b, kvf_dtype_t conv_dtype, float *xbc, int ld_xbc,
                        const kvf_mamba2_params_t *p, const float *dt, int lddt,
                        kvf_dtype_t ssm_dtype, float *y, int ldy);

/**
 * The Gated DeltaNet decode step of a batch (the state layers of qwen3_next / qwen3_5_text,
 * kvf_gdn.h), in one call: for request i with row r = rows[i], kvf_conv1d_step(x_in + r *
 * ld_in -> xbc + r * ld_xbc, SiLU, no bias, conv_states[i]), then kvf_gdn_scan() of one
 * token (has_state 1) on that xbc row (v | k | q) with b | a at ba + r * ldba, on
 * ssm_states[i] [heads][head_dim][key_dim], into y + r * ldy. The dt clamps of @a seqs are
 * not read. CPU: exactly those per-request calls. CUDA: one upload of the packed block (or
 * none: a graphed step's published inputs), the batched conv launch and one launch of
 * one thread per (request, state row), a row updated in place (kvf_gdn_row_hd on an fp32
 * state, kvf_gdn_row_state_hd on a 16-bit one: the token kernel's bits either way), so the
 * step has fixed launches and pointers for a CUDA graph.
 * @return KVF_KERN_OK; KVF_KERN_EINVAL as the per-request calls (all checked before anything
 *         runs on CUDA); KVF_KERN_ENOMEM; KVF_KERN_ECUDA; KVF_KERN_EUNSUPPORTED.
 */
int kvf_gdn_decode_seqs(const kvf_device_t *dev, const kvf_ssm_seqs_t *seqs, const float *x_in,
                        int ld_in, int channels, int kernel, const float *conv_w,
                        kvf_dtype_t conv_dtype, float *xbc, int ld_xbc,
                        const kvf_gdn_params_t *p, const float *ba, int ldba,
                        kvf_dtype_t ssm_dtype, float *y, int ldy);

#ifdef __cplusplus
}
#endif

#endif
