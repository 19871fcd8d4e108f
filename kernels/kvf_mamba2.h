/*
 * Mamba2 selective state-space update (SSD), per HF NemotronH / Mamba2
 * torch_forward semantics, computed as a sequential recurrence in fp32:
 *
 *   dt_h  = clamp(softplus(dt_raw[h] + dt_bias[h]), dt_min, dt_max)
 *           softplus(v) = v > 20 ? v : log1p(exp(v))   (torch threshold 20)
 *   A_h   = -exp(A_log[h])
 *   g     = h / (heads / groups)          (B/C group of head h, rank-local)
 *   S[h][p][n] = exp(dt_h * A_h) * S[h][p][n] + dt_h * x[h][p] * B[g][n]
 *   y[h][p]    = sum_n S[h][p][n] * C[g][n] + D[h] * x[h][p]
 *
 * SSM state S (one request, one layer): [heads][head_dim][state_size] of the
 * SSM dtype (fp32 or bf16/fp16), updated in place. For a chunk it is loaded
 * to fp32 once, advanced T steps and stored once; a bf16/fp16 state is
 * rounded to its dtype after every token in between (kvf_hd_round), as the
 * decode step stores it, on the CPU and on CUDA alike, so a request's bits
 * do not depend on where its prompt is cut into chunks (batch invariance:
 * the scheduler cuts by what the other requests leave). A fresh request
 * (has_state = 0) starts from S = 0 and does NOT read the stored bytes
 * (Mamba pages are not zeroed).
 *
 * The gated norm (kernels/kvf_norm.h) and out_proj follow outside.
 * CUDA (kvf_ssm_cuda.cu): the same dt clamp and recurrence (kvf_ssm_math.h),
 * one thread per (head, head-dim) row over all tokens; every array and the
 * params' dt_bias / A_log / D are device memory; the fp32 rows live in
 * stream-ordered scratch (heads * head_dim * state_size floats).
 */
#ifndef KVF_MAMBA2_H
#define KVF_MAMBA2_H

#include "kvf_device.h"
#include "kvf_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Per-layer constants of a rank's Mamba2 mixer (values; pointers not owned). */
typedef struct kvf_mamba2_params {
    int          heads;       /* Mamba heads on this rank, > 0 */
    int          head_dim;    /* > 0 */
    int          groups;      /* B/C groups on this rank, divides heads */
    int          state_size;  /* ssm_state_size, > 0 */
    const float *dt_bias;     /* fp32 [heads] (NULL = zeros) */
    const float *A_log;       /* fp32 [heads]; A = -exp(A_log) */
    const float *D;           /* fp32 [heads] (NULL = no skip) */
    float        dt_min;      /* clamp after softplus; HF time_step_limit[0], usually 0 */
    float        dt_max;      /* usually INFINITY; must be >= dt_min */
} kvf_mamba2_params_t;

/**
 * Scan T tokens of one request.
 *
 * @param [in]     p        Layer constants.
 * @param [in]     T        Tokens, >= 0 (0 is a no-op, state untouched).
 * @param [in]     x        fp32 [T][ldx]: head h dim d of token t at
 *                          x[t * ldx + h * head_dim + d] (the conv output's x part).
 * @param [in]     dt       fp32 [T][lddt]: RAW dt of head h at dt[t * lddt + h]
 *                          (softplus and dt_bias are applied here).
 * @param [in]     B, C     fp32 [T][ldbc]: group g state n at [t * ldbc + g * state_size + n].
 * @param [in]     ldx, lddt, ldbc  Row strides, elements (>= heads*head_dim,
 *                          heads, groups*state_size). With the conv output
 *                          xBC[T][conv_dim]: x = xBC, B = xBC + heads*head_dim,
 *                          C = B + groups*state_size, ldx = ldbc = conv_dim.
 * @param [in,out] state    [heads][head_dim][state_size] of @a state_dtype.
 * @param [in]     state_dtype fp32, bf16 or fp16.
 * @param [in]     has_state 0: start from zeros (stored bytes not read); 1: continue.
 * @param [out]    y        fp32 [T][ldy], ldy >= heads*head_dim; must not overlap inputs.
 * CPU: with T >= 64 the heads are dealt out over kvf_gemm_set_threads()
 * threads (same bits as one thread).
 * @return KVF_KERN_OK; KVF_KERN_EINVAL; KVF_KERN_ENOMEM (2 * head_dim *
 *         state_size + T floats of scratch a thread); KVF_KERN_EUNSUPPORTED.
 */
int kvf_mamba2_scan(const kvf_device_t *dev, const kvf_mamba2_params_t *p, int T,
                    const float *x, int ldx, const float *dt, int lddt, const float *B,
                    const float *C, int ldbc, void *state, kvf_dtype_t state_dtype,
                    int has_state, float *y, int ldy);

/**
 * Decode step for one token: kvf_mamba2_scan() with T = 1, has_state = 1,
 * updating the stored state element by element (no scratch; state_size <=
 * 1024, else KVF_KERN_EINVAL).
 * x: [heads*head_dim], dt: [heads] raw, B, C: [groups*state_size], y:
 * [heads*head_dim] (must not overlap inputs). Errors as kvf_mamba2_scan()
 * (never KVF_KERN_ENOMEM).
 */
int kvf_mamba2_step(const kvf_device_t *dev, const kvf_mamba2_params_t *p, const float *x,
                    const float *dt, const float *B, const float *C, void *state,
                    kvf_dtype_t state_dtype, float *y);

#ifdef __cplusplus
}
#endif

#endif
