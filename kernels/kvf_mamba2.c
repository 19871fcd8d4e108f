/*
 * Mamba2 selective scan (SSD) as a sequential recurrence, fp32.
 *
 * Design: HF's torch_forward evaluates a prompt with the chunked SSD
 * algorithm and a decode token with the one-step recurrence; both compute
 * the same linear recurrence, so the CPU version runs the recurrence token
 * by token (O(T * heads * head_dim * state)), which is exact up to fp32
 * rounding order and trivially matches the decode step. Each head's state
 * is loaded to fp32 once per chunk (transposed, head dims innermost, so the
 * loops vectorise across head dims with each element's operations in the
 * scalar order), advanced T tokens, stored once; the decode step updates the
 * stored state element by element. A narrow (bf16/fp16) state is rounded to
 * its dtype after every token in the scan too, as the step stores it, so a
 * bf16 state rounds once per token in both paths and the bits do not depend
 * on where a prompt is cut into chunks (batch invariance). A fresh request
 * starts from zero and never reads the stored bytes (Mamba pages are
 * recycled without zeroing).
 *
 * Rejected alternative: the chunked SSD form as matrix products (C B^T
 * masked by the decay segment sums, times X, plus inter-chunk states). For
 * the shapes served here (head_dim 16-64, state 16-128, chunk 128) it costs
 * 2-3x the recurrence's multiply-adds and an exp per (token, token, head)
 * pair; its gain is parallel work for GPUs. The vectorised recurrence is a
 * few percent of a prefill (issue 25 figures), and it keeps scan and step
 * bit for bit equal.
 */
#include "kvf_mamba2.h"
#include "kvf_kern_internal.h"
#include "kvf_ssm_math.h"
#ifdef KVF_HAVE_CUDA
#include "kvf_device_cuda.h"
#endif

#include <math.h>
#include <stdlib.h>

static int kvf_mamba2_check(const kvf_mamba2_params_t *p, const void *state,
                            kvf_dtype_t state_dtype)
{
    if ((p == NULL) || (p->heads <= 0) || (p->head_dim <= 0) || (p->groups <= 0) ||
        (p->state_size <= 0) || ((p->heads % p->groups) != 0) || (p->A_log == NULL) ||
        !(p->dt_max >= p->dt_min) || (state == NULL) || !kvf_kern_cache_dtype_ok(state_dtype)) {
        return KVF_KERN_EINVAL;
    }
    return KVF_KERN_OK;
}

/* clamp(softplus(raw + bias)) of head @a h (kvf_ssm_math.h) */
static inline float kvf_mamba2_dt(const kvf_mamba2_params_t *p, int h, float raw)
{
    return kvf_mamba2_dt_hd(raw, (p->dt_bias != NULL) ? p->dt_bias[h] : 0.0f, p->dt_min,
                            p->dt_max);
}

/* The scan's inner loops, vectorised over head dims: with GCC on x86-64 they
 * are compiled three times, for AVX-512F, AVX2 and the baseline, with
 * contraction off (AVX-512F has FMA instructions; no FMA keeps every element
 * rounding as the scalar step does), and kvf_mamba2_head_scan_any picks one
 * per call from the CPU's features (not an ifunc: a resolver runs before a
 * sanitizer's runtime is up and crashed the TSan build). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KVF_MAMBA2_X86 1
#define KVF_MAMBA2_OPT optimize("O3", "fp-contract=off")
#endif

/*
 * Head dims [d0, d0 + DB) of one token (DB a constant after inlining): the
 * dtx and acc of the block live in registers across the state loop, so the
 * only chain from one state index to the next is acc's add.
 */
static inline __attribute__((always_inline)) void
kvf_mamba2_dblock(float *restrict St, size_t hd, size_t ns, size_t d0, size_t DB, float dth,
                  float dA, float Dh, const float *restrict xh, const float *restrict Bg,
                  const float *restrict Cg, float *restrict yh)
{
    float dtx[32], acc[32];

    for (size_t k = 0; k < DB; ++k) {
        dtx[k] = dth * xh[d0 + k];
        acc[k] = 0.0f;
    }
    for (size_t n = 0; n < ns; ++n) {
        const float b = Bg[n], c = Cg[n];
        float *restrict row = St + n * hd + d0;
        for (size_t k = 0; k < DB; ++k) {
            const float v = dA * row[k] + dtx[k] * b;
            row[k] = v;
            acc[k] += v * c;
        }
    }
    for (size_t k = 0; k < DB; ++k) {
        yh[d0 + k] = kvf_mamba2_out_hd(acc[k], Dh, xh[d0 + k]);
    }
}

/*
 * One head over T tokens on its fp32 state held TRANSPOSED, St[n][d] (state
 * index outer, head dim inner), so the loops over head dims are contiguous
 * and independent: per token and state index n, St[n][d] = dA * St[n][d] +
 * dtx[d] * B[n] and acc[d] += St[n][d] * C[n], in blocks of 32, 8 and 1
 * head dims. Each element sees exactly the operations of kvf_mamba2_row_hd
 * in the same order (acc summed over n ascending), so the scan and the
 * decode step agree bit for bit. dts[t]: the clamped dt of each token.
 */
static inline __attribute__((always_inline)) void
kvf_mamba2_head_scan(float *restrict St, size_t hd, size_t ns, size_t T,
                                 const float *restrict dts, float A, float Dh,
                                 const float *restrict x, size_t ldx, const float *restrict B,
                                 const float *restrict C, size_t ldbc, float *restrict y,
                                 size_t ldy, kvf_dtype_t sdt)
{
    for (size_t t = 0; t < T; ++t) {
        const float dth = dts[t], dA = kvf_mamba2_dA_hd(dth, A);
        const float *restrict xh = x + t * ldx;
        const float *restrict Bg = B + t * ldbc;
        const float *restrict Cg = C + t * ldbc;
        float *restrict yh = y + t * ldy;
        size_t d0 = 0;
        for (; d0 + 32 <= hd; d0 += 32) {
            kvf_mamba2_dblock(St, hd, ns, d0, 32, dth, dA, Dh, xh, Bg, Cg, yh);
        }
        for (; d0 + 8 <= hd; d0 += 8) {
            kvf_mamba2_dblock(St, hd, ns, d0, 8, dth, dA, Dh, xh, Bg, Cg, yh);
        }
        for (; d0 < hd; ++d0) {
            kvf_mamba2_dblock(St, hd, ns, d0, 1, dth, dA, Dh, xh, Bg, Cg, yh);
        }
        /* a narrow state: what the next token reads is the stored value, as in the step */
        kvf_kern_round(St, ns * hd, sdt);
    }
}

#define KVF_MAMBA2_SCAN_ARGS                                                             \
    float *restrict St, size_t hd, size_t ns, size_t T, const float *restrict dts, float A, \
        float Dh, const float *restrict x, size_t ldx, const float *restrict B,           \
        const float *restrict C, size_t ldbc, float *restrict y, size_t ldy, kvf_dtype_t sdt
#define KVF_MAMBA2_SCAN_PASS St, hd, ns, T, dts, A, Dh, x, ldx, B, C, ldbc, y, ldy, sdt
#ifdef KVF_MAMBA2_X86
__attribute__((target("avx512f"), KVF_MAMBA2_OPT)) static void
kvf_mamba2_head_scan_avx512(KVF_MAMBA2_SCAN_ARGS)
{
    kvf_mamba2_head_scan(KVF_MAMBA2_SCAN_PASS);
}

__attribute__((target("avx2"), KVF_MAMBA2_OPT)) static void
kvf_mamba2_head_scan_avx2(KVF_MAMBA2_SCAN_ARGS)
{
    kvf_mamba2_head_scan(KVF_MAMBA2_SCAN_PASS);
}

__attribute__((KVF_MAMBA2_OPT)) static void kvf_mamba2_head_scan_base(KVF_MAMBA2_SCAN_ARGS)
{
    kvf_mamba2_head_scan(KVF_MAMBA2_SCAN_PASS);
}
#endif

static void kvf_mamba2_head_scan_any(KVF_MAMBA2_SCAN_ARGS)
{
#ifdef KVF_MAMBA2_X86
    if (__builtin_cpu_supports("avx512f")) {
        kvf_mamba2_head_scan_avx512(KVF_MAMBA2_SCAN_PASS);
    } else if (__builtin_cpu_supports("avx2")) {
        kvf_mamba2_head_scan_avx2(KVF_MAMBA2_SCAN_PASS);
    } else {
        kvf_mamba2_head_scan_base(KVF_MAMBA2_SCAN_PASS);
    }
#else
    kvf_mamba2_head_scan(KVF_MAMBA2_SCAN_PASS);
#endif
}

/* One kvf_kern_parallel() part of a chunk scan: heads part, part + parts, ... */
typedef struct kvf_mamba2_job {
    const kvf_mamba2_params_t *p;
    size_t       T, ldx, lddt, ldbc, ldy;
    const float *x, *dt, *B, *C;
    void        *state;
    kvf_dtype_t  state_dtype;
    int          has_state;
    float       *y;
} kvf_mamba2_job_t;

static int kvf_mamba2_scan_part(void *ctx, int part, int parts)
{
    const kvf_mamba2_job_t *j = ctx;
    const kvf_mamba2_params_t *p = j->p;
    const size_t hd = (size_t)p->head_dim, ns = (size_t)p->state_size, per_head = hd * ns;
    float *S = malloc((2 * per_head + j->T) * sizeof(float)), *St, *dts;

    if (S == NULL) {
        return KVF_KERN_ENOMEM;
    }
    St = S + per_head;
    dts = St + per_head;
    for (int h = part; h < p->heads; h += parts) {
        size_t g = (size_t)(h / (p->heads / p->groups));
        float A = kvf_mamba2_A_hd(p->A_log[h]);
        float Dh = (p->D != NULL) ? p->D[h] : 0.0f;
        if (j->has_state) {
            kvf_kern_load(j->state, j->state_dtype, (size_t)h * per_head, per_head, S);
        } else {
            memset(S, 0, per_head * sizeof(float));
        }
        for (size_t d = 0; d < hd; ++d) {
            for (size_t n = 0; n < ns; ++n) {
                St[n * hd + d] = S[d * ns + n];
            }
        }
        for (size_t t = 0; t < j->T; ++t) {
            dts[t] = kvf_mamba2_dt(p, h, j->dt[t * j->lddt + (size_t)h]);
        }
        kvf_mamba2_head_scan_any(St, hd, ns, j->T, dts, A, Dh, j->x + (size_t)h * hd,
                                 j->ldx, j->B + g * ns, j->C + g * ns, j->ldbc,
                                 j->y + (size_t)h * hd, j->ldy, j->state_dtype);
        for (size_t d = 0; d < hd; ++d) {
            for (size_t n = 0; n < ns; ++n) {
                S[d * ns + n] = St[n * hd + d];
            }
        }
        kvf_kern_store(j->state, j->state_dtype, (size_t)h * per_head, per_head, S);
    }
    free(S);
    return KVF_KERN_OK;
}

int kvf_mamba2_scan(const kvf_device_t *dev, const kvf_mamba2_params_t *p, int T,
                    const float *x, int ldx, const float *dt, int lddt, const float *B,
                    const float *C, int ldbc, void *state, kvf_dtype_t state_dtype,
                    int has_state, float *y, int ldy)
{
    kvf_mamba2_job_t j;
    int parts;

    if ((T < 0) || (kvf_mamba2_check(p, state, state_dtype) != KVF_KERN_OK)) {
        return KVF_KERN_EINVAL;
    }
    if ((ldx < p->heads * p->head_dim) || (lddt < p->heads) ||
        (ldbc < p->groups * p->state_size) || (ldy < p->heads * p->head_dim)) {
        return KVF_KERN_EINVAL;
    }
    if (T == 0) {
        return KVF_KERN_OK;
    }
    if ((x == NULL) || (dt == NULL) || (B == NULL) || (C == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_mamba2_scan(dev, p, T, x, ldx, dt, lddt, B, C, ldbc, state, state_dtype,
                                    has_state, y, ldy);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    j = (kvf_mamba2_job_t){.p = p, .T = (size_t)T, .ldx = (size_t)ldx, .lddt = (size_t)lddt,
                           .ldbc = (size_t)ldbc, .ldy = (size_t)ldy, .x = x, .dt = dt, .B = B,
                           .C = C, .state = state, .state_dtype = state_dtype,
                           .has_state = has_state, .y = y};
    /* heads over the instance's CPU threads for a chunk worth a thread start */
    parts = (T >= 64) ? kvf_kern_cpu_threads() : 1;
    parts = (parts > p->heads) ? p->heads : parts;
    return (parts > 1) ? kvf_kern_parallel(parts, kvf_mamba2_scan_part, &j)
                       : kvf_mamba2_scan_part(&j, 0, 1);
}

int kvf_mamba2_step(const kvf_device_t *dev, const kvf_mamba2_params_t *p, const float *x,
                    const float *dt, const float *B, const float *C, void *state,
                    kvf_dtype_t state_dtype, float *y)
{
    size_t hd, ns;
    float row[1024];

    if ((kvf_mamba2_check(p, state, state_dtype) != KVF_KERN_OK) || (x == NULL) ||
        (dt == NULL) || (B == NULL) || (C == NULL) || (y == NULL)) {
        return KVF_KERN_EINVAL;
    }
    if (!kvf_kern_on_cpu(dev)) {
#ifdef KVF_HAVE_CUDA
        return kvf_cuda_mamba2_step(dev, p, x, dt, B, C, state, state_dtype, y);
#else
        return KVF_KERN_EUNSUPPORTED;
#endif
    }
    hd = (size_t)p->head_dim;
    ns = (size_t)p->state_size;
    if (ns > sizeof(row) / sizeof(row[0])) {
        return KVF_KERN_EINVAL;
    }
    for (int h = 0; h < p->heads; ++h) {
        size_t g = (size_t)(h / (p->heads / p->groups));
        float A = kvf_mamba2_A_hd(p->A_log[h]);
        float Dh = (p->D != NULL) ? p->D[h] : 0.0f;
        float dth = kvf_mamba2_dt(p, h, dt[h]);
        float dA = kvf_mamba2_dA_hd(dth, A);
        const float *Bg = B + g * ns;
        const float *Cg = C + g * ns;
        for (size_t d = 0; d < hd; ++d) {
            size_t first = ((size_t)h * hd + d) * ns;
            float xv = x[(size_t)h * hd + d];
            kvf_kern_load(state, state_dtype, first, ns, row);
            float acc = kvf_mamba2_row_hd(row, ns, dA, dth * xv, Bg, Cg);
            kvf_kern_store(state, state_dtype, first, ns, row);
            y[(size_t)h * hd + d] = kvf_mamba2_out_hd(acc, Dh, xv);
        }
    }
    return KVF_KERN_OK;
}
