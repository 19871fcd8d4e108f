/*
 * Causal depthwise conv1d + bias + SiLU of a Mamba2 layer, with the conv
 * state kept in a cache page.
 *
 * Conv state (one request, one layer): channels x (kernel - 1) taps,
 * dimension-first (channel c's taps are contiguous), stored in the conv
 * dtype (fp32/bf16/fp16): state[c][j] is the input of channel c at relative
 * time j - (kernel - 1), i.e. oldest first, tap kernel-2 the most recent
 * token (vLLM's conv_state layout). On a rank the channels are that rank's
 * x | B | C channels, in that order (common/model/kvf_shard.h).
 *
 * For a chunk of T tokens, with xin(t) = x[t] for t >= 0 and the state for
 * t < 0:
 *     y[t][c] = silu(bias[c] + sum_{i=0}^{kernel-1} w[c][i] * xin(t - (kernel-1) + i))
 * which is HF's nn.Conv1d(groups=channels, padding=kernel-1)[..., :T] followed
 * by SiLU, where a history tap (i < kernel - 1) reads xin at the state's
 * precision (a bf16/fp16 state: the input rounded by kvf_hd_round, inside a
 * chunk as across chunks and in the step; the token's own tap is exact), on
 * the CPU and on CUDA alike: the bits do not depend on the chunking (batch
 * invariance). A fresh request (has_state = 0) starts from an all-zero history
 * and the stored state is NOT read (Mamba pages are never zeroed, so it may
 * hold stale bytes). Afterwards the state holds the last kernel-1 inputs
 * (shifted through the old state when T < kernel - 1).
 *
 * CUDA (kvf_ssm_cuda.cu): the same tap sum (kvf_ssm_math.h), one thread per
 * channel with a rolling window; every array is device memory; kernel <= 64.
 */
#ifndef KVF_CONV1D_H
#define KVF_CONV1D_H

#include "kvf_device.h"
#include "kvf_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Prefill (or chunked continuation) over T tokens.
 *
 * @param [in]     x          fp32 [T][ldx]: channel c of token t at x[t * ldx + c].
 * @param [in]     ldx        Row stride of x (>= channels), elements.
 * @param [in]     T          Tokens, >= 0 (0 is a no-op, state untouched).
 * @param [in]     channels   > 0.
 * @param [in]     kernel     Conv width, >= 2 (NemotronH: 4).
 * @param [in]     w          fp32 [channels][kernel] (HF weight [C][1][K] squeezed).
 * @param [in]     bias       fp32 [channels] or NULL.
 * @param [in]     silu       Non-zero applies SiLU (NemotronH/Mamba2: 1).
 * @param [in,out] state      [channels][kernel-1] of @a state_dtype.
 * @param [in]     state_dtype fp32, bf16 or fp16.
 * @param [in]     has_state  0: fresh request (state treated as zeros, not
 *                            read); 1: continue from the stored state.
 * @param [out]    y          fp32 [T][ldy], ldy >= channels; may equal x
 *                            when ldy == ldx (in place).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL; KVF_KERN_ENOMEM (a
 *         channels * (kernel-1 + T) float scratch); KVF_KERN_EUNSUPPORTED.
 */
int kvf_conv1d_chunk(const kvf_device_t *dev, const float *x, int ldx, int T, int channels,
                     int kernel, const float *w, const float *bias, int silu, void *state,
                     kvf_dtype_t state_dtype, int has_state, float *y, int ldy);

/**
 * Decode step for one token: the same as kvf_conv1d_chunk() with T = 1 and
 * has_state = 1, without scratch allocation (kernel <= 64, else
 * KVF_KERN_EINVAL).
 * x, y: fp32 [channels] (may be equal). Errors as kvf_conv1d_chunk() (never
 * KVF_KERN_ENOMEM).
 */
int kvf_conv1d_step(const kvf_device_t *dev, const float *x, int channels, int kernel,
                    const float *w, const float *bias, int silu, void *state,
                    kvf_dtype_t state_dtype, float *y);

#ifdef __cplusplus
}
#endif

#endif
