/*
 * The chunked Gated DeltaNet prompt scan's arithmetic (kvf_gdn.h, kvf_gdn_scan_chunked),
 * written once for the CPU reference (kvf_gdn_chunked.c) and the CUDA kernels
 * (kvf_gdn_chunked_cuda.cu): each function is one element in one fixed order.
 *
 * Within a chunk of L tokens of one value head (k, q l2-normed as the token scan does, q
 * times 1/sqrt(key_dim); a_t = log decay_t = -exp(A_log) softplus(a_t + dt_bias);
 * cs_t = a_0 + ... + a_t summed in order; beta_t = sigmoid(b_t); S0 the state entering):
 * the token recurrence S_t = g_t S_{t-1} + u_t k_t^T with the delta u_t = beta_t (v_t -
 * g_t S_{t-1} k_t) unrolls to S_t = exp(cs_t) S0 + sum_{s<=t} exp(cs_t - cs_s) u_s k_s^T, so
 * the deltas solve the unit lower triangular system
 *   (I + A) U = diag(beta) V - diag(beta exp(cs)) K S0^T,
 *   A[t][s] = beta_t exp(cs_t - cs_s) (k_t . k_s)   (s < t).
 * With Tm = (I + A)^-1 (the UT transform, column by column), W = Tm diag(beta exp(cs)) K and
 * Ut = Tm diag(beta) V depend on the chunk's tokens only (chunks in parallel); the pass
 * over chunks, per state row j, is then
 *   u_t[j] = Ut[t][j] - W_t . S0[j]
 *   y_t[j] = exp(cs_t) (q_t . S0[j]) + sum_{s<=t} M[t][s] u_s[j],
 *            M[t][s] = exp(cs_t - cs_s) (q_t . k_s)
 *   S[j][i] = round(exp(cs_{L-1}) S0[j][i] + sum_s exp(cs_{L-1} - cs_s) u_s[j] k_s[i]).
 * Every exponent is <= 0 (no division by a decay product: no overflow on long chunks).
 */
#ifndef KVF_GDN_CHUNK_MATH_H
#define KVF_GDN_CHUNK_MATH_H

#include "kvf_dtype_math.h"
#include "kvf_gdn_math.h"
#include "kvf_hd.h"

#include <math.h>
#include <stddef.h>

/* A value head's log decay of one token: -exp(A_log) softplus(a + dt_bias). */
static inline KVF_HD float kvf_gdn_logdecay_hd(float A_log, float a, float dt_bias)
{
    return -expf(A_log) * kvf_gdn_softplus_hd(a + dt_bias);
}

/* a . b over n elements, ascending (a at stride 1, b at stride sb). */
static inline KVF_HD float kvf_gdn_dot_hd(const float *a, const float *b, size_t sb, size_t n)
{
    float acc = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        acc += a[i] * b[i * sb];
    }
    return acc;
}

/* A[t][s] (s < t) from kk = k_t . k_s. */
static inline KVF_HD float kvf_gdn_a_hd(float beta_t, float cs_t, float cs_s, float kk)
{
    return beta_t * expf(cs_t - cs_s) * kk;
}

/*
 * Column c of Tm = (I + A)^-1 (A strictly lower, row-major with leading dimension ld):
 * Tm[c][c] = 1, Tm[t][c] = -sum_{s=c}^{t-1} A[t][s] Tm[s][c] for t > c, s ascending. Entries
 * above the diagonal are not written.
 */
static inline KVF_HD void kvf_gdn_tcol_hd(const float *A, float *Tm, size_t ld, size_t L,
                                          size_t c)
{
    Tm[c * ld + c] = 1.0f;
    for (size_t t = c + 1; t < L; ++t) {
        float acc = 0.0f;
        for (size_t s = c; s < t; ++s) {
            acc += A[t * ld + s] * Tm[s * ld + c];
        }
        Tm[t * ld + c] = -acc;
    }
}

/* sum_{s<=t} Tm[t][s] (coef[s] x[s * ldx]), s ascending: W (coef beta exp(cs), x a key
 * column) and Ut (coef beta, x a value column). */
static inline KVF_HD float kvf_gdn_tmul_hd(const float *Trow, const float *coef, size_t t,
                                           const float *x, size_t ldx)
{
    float acc = 0.0f;
    for (size_t s = 0; s <= t; ++s) {
        acc += Trow[s] * (coef[s] * x[s * ldx]);
    }
    return acc;
}

/* M[t][s] (s <= t) from qk = q_t . k_s. */
static inline KVF_HD float kvf_gdn_m_hd(float cs_t, float cs_s, float qk)
{
    return expf(cs_t - cs_s) * qk;
}

/* y_t[j] = yi + sum_{s<=t} M[t][s] u[s * ldu], s ascending (yi: exp(cs_t) q_t . S0[j]). */
static inline KVF_HD float kvf_gdn_yout_hd(float yi, const float *Mrow, size_t t, const float *u,
                                           size_t ldu)
{
    float acc = 0.0f;
    for (size_t s = 0; s <= t; ++s) {
        acc += Mrow[s] * u[s * ldu];
    }
    return yi + acc;
}

/* S[j][i] leaving a chunk of L tokens: round(exp(cs[L-1]) s0 + sum_s exp(cs[L-1] - cs[s])
 * u[s * ldu] k[s * ldk]), s ascending, kept at @a state_dtype. */
static inline KVF_HD float kvf_gdn_snew_hd(const float *cs, size_t L, float s0, const float *u,
                                           size_t ldu, const float *k, size_t ldk,
                                           int state_dtype)
{
    float acc = 0.0f;
    for (size_t s = 0; s < L; ++s) {
        acc += expf(cs[L - 1] - cs[s]) * u[s * ldu] * k[s * ldk];
    }
    return kvf_hd_round(expf(cs[L - 1]) * s0 + acc, state_dtype);
}

#endif
